// Command softmax trains a softmax-regression classifier data-parallel with kolo: each rank takes a
// shard of a generated dataset, computes gradients on its mini-batch, and the gradients are averaged
// across ranks with Allreduce before every step, so every rank keeps identical weights.
//
//	kolo run -np 4 go run ./examples/softmax
//
// It prints the loss as it falls and ends by checking that every rank holds the same weights.
// With -elastic it runs under kolo run's elastic mode and goes on when ranks are lost or hosts
// join (kolo.ElasticRun), committing its weights every -commit steps:
//
//	kolo run -np 4 --min-np 2 --max-np 4 -H localhost:2,127.0.0.1:2 bin/softmax -elastic
package main

import (
	"context"
	"flag"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"time"

	"github.com/kolo-dl/kolo"
)

func main() {
	steps := flag.Int("steps", 200, "training steps")
	batch := flag.Int("batch", 64, "mini-batch per rank")
	lr := flag.Float64("lr", 0.5, "learning rate")
	features := flag.Int("features", 32, "input features")
	classes := flag.Int("classes", 4, "classes")
	samples := flag.Int("samples", 8192, "dataset size (all ranks together)")
	elastic := flag.Bool("elastic", false, "survive lost ranks and added hosts under kolo run's elastic mode")
	commit := flag.Int("commit", 10, "with -elastic: steps between commits of the weights")
	pace := flag.Duration("pace", 0, "time every rank waits after each step (slows a demo down to watch, or to kill a rank in)")
	logEvery := flag.Int("log-every", 50, "with -elastic: steps between the loss lines rank 0 prints")
	slowRank := flag.Int("slow-rank", -1, "this rank sleeps -slow in every step (shows a straggler in kolo run's live view and --metrics-addr)")
	slow := flag.Duration("slow", 20*time.Millisecond, "with -slow-rank: the sleep")
	exitRank := flag.Int("exit-rank", -1, "this rank exits with status 3 before step -exit-step (a failed rank, for kolo run's flight-recorder file)")
	exitStep := flag.Int("exit-step", 20, "with -exit-rank: the step (in an elastic job, of its first round)")
	abort := flag.Bool("abort", false, "with -exit-rank: give up through kolo.Abort before exiting, so that kolo run reports the rank's own error")
	flag.Parse()
	f := fault{*slowRank, *slow, *exitRank, *exitStep, *abort}
	train := func(steps, batch, nf, nc, samples int, lr float32) error {
		return run(steps, batch, nf, nc, samples, lr, *pace, f)
	}
	if *elastic {
		train = func(steps, batch, nf, nc, samples int, lr float32) error {
			return runElastic(steps, batch, nf, nc, samples, lr, *commit, max(*logEvery, 1), *pace, f)
		}
	}
	if err := train(*steps, *batch, *features, *classes, *samples, float32(*lr)); err != nil {
		fmt.Fprintf(os.Stderr, "rank %d: %v\n", kolo.Rank(), err)
		os.Exit(1)
	}
}

// fault is what a rank of the non-elastic run does to show the launcher's view of a slow or failed
// rank.
type fault struct {
	slowRank int
	slow     time.Duration
	exitRank int
	exitStep int
	abort    bool
}

// exit ends this rank at step if it is the one to fail there (the process, not an error: a crash).
func (f fault) exit(rank, step int) {
	if rank != f.exitRank || step != f.exitStep {
		return
	}
	fmt.Fprintf(os.Stderr, "rank %d: exiting at step %d (-exit-rank)\n", rank, step)
	if f.abort {
		kolo.Abort(fmt.Errorf("gave up at step %d (-exit-rank -abort)", step))
	}
	os.Exit(3)
}

func run(steps, batch, nf, nc, samples int, lr float32, pace time.Duration, f fault) error {
	if err := kolo.Init(); err != nil {
		return err
	}
	defer kolo.Shutdown()
	ctx := context.Background()
	rank, size := kolo.Rank(), kolo.Size()

	// The dataset is generated from a fixed seed, so every rank sees the same one and takes its shard.
	x, y := dataset(samples, nf, nc)

	// Weights start random on rank 0 and are broadcast, as a training script does with its model.
	w := make([]float32, nf*nc)
	r := rand.New(rand.NewPCG(uint64(rank)+1, 99))
	for i := range w {
		w[i] = float32(r.NormFloat64() * 0.01)
	}
	if err := kolo.Broadcast(ctx, "weights.init", kolo.Of(w), 0); err != nil {
		return err
	}

	t := newTrainer(x, y, nf, nc, batch, lr, rank, size)
	for step := 0; step < steps; step++ {
		f.exit(rank, step)
		if rank == f.slowRank {
			time.Sleep(f.slow)
		}
		loss, err := t.step(ctx, w)
		if err != nil {
			return err
		}
		// From the end of the step's collective, which every rank leaves at once: a pace kept from
		// each rank's own start of step would keep a rank that was late once late by as much in
		// every later step.
		time.Sleep(pace)
		kolo.MarkStep() // kolo run --autotune times the job by these marks
		if rank == 0 && (step%50 == 0 || step == steps-1) {
			fmt.Printf("step %4d  loss %.4f\n", step, loss)
		}
	}

	return check(ctx, w, x, y, nf, nc)
}

// check ends a run: every rank must hold rank 0's weights.
func check(ctx context.Context, w, x []float32, y []int, nf, nc int) error {
	ref := append([]float32(nil), w...)
	if err := kolo.Broadcast(ctx, "weights.check", kolo.Of(ref), 0); err != nil {
		return err
	}
	for i := range w {
		if w[i] != ref[i] {
			return fmt.Errorf("weights differ from rank 0 at %d: %v vs %v", i, w[i], ref[i])
		}
	}
	acc := accuracy(w, x, y, nf, nc)
	if kolo.Rank() == 0 {
		fmt.Printf("trained on %d ranks: every rank holds identical weights; training accuracy %.1f%%\n", kolo.Size(), 100*acc)
	}
	return nil
}

// trainer takes data-parallel steps: a mini-batch from this rank's shard, gradients averaged
// across ranks.
type trainer struct {
	x             []float32
	y             []int
	nf, nc, batch int
	lr            float32
	lo, hi        int // this rank's shard
	pick          *rand.Rand
	grad, lossBuf []float32
}

func newTrainer(x []float32, y []int, nf, nc, batch int, lr float32, rank, size int) *trainer {
	n := len(y)
	return &trainer{x: x, y: y, nf: nf, nc: nc, batch: batch, lr: lr,
		lo: rank * n / size, hi: (rank + 1) * n / size,
		pick: rand.New(rand.NewPCG(uint64(rank)+7, 3)),
		grad: make([]float32, nf*nc), lossBuf: make([]float32, 1)}
}

// step updates w by one step and returns the mini-batch loss averaged across ranks.
func (t *trainer) step(ctx context.Context, w []float32) (float32, error) {
	clear(t.grad)
	var loss float32
	for b := 0; b < t.batch; b++ {
		i := t.lo + t.pick.IntN(t.hi-t.lo)
		loss += accumulate(t.grad, w, t.x[i*t.nf:(i+1)*t.nf], t.y[i], t.nc)
	}
	for i := range t.grad {
		t.grad[i] /= float32(t.batch)
	}
	t.lossBuf[0] = loss / float32(t.batch)
	// Two named ops per step, submitted together: the engine fuses them into one allreduce.
	hg := kolo.AllreduceAsync("grad", kolo.Of(t.grad), kolo.Of(t.grad), kolo.Average)
	hl := kolo.AllreduceAsync("loss", kolo.Of(t.lossBuf), kolo.Of(t.lossBuf), kolo.Average)
	if err := hg.Wait(ctx); err != nil {
		return 0, err
	}
	if err := hl.Wait(ctx); err != nil {
		return 0, err
	}
	for i := range w {
		w[i] -= t.lr * t.grad[i]
	}
	return t.lossBuf[0], nil
}

// elasticState is what survives a reset: the weights and the step, and their last commit.
type elasticState struct {
	w, savedW       []float32
	step, savedStep int64
}

func (s *elasticState) Save() error    { copy(s.savedW, s.w); s.savedStep = s.step; return nil }
func (s *elasticState) Restore() error { copy(s.w, s.savedW); s.step = s.savedStep; return nil }

// Sync gives every rank rank 0's weights and step: ranks that join a round start from them.
func (s *elasticState) Sync(ctx context.Context) error {
	step := []int64{s.step}
	if err := kolo.Broadcast(ctx, "state.step", kolo.Of(step), 0); err != nil {
		return err
	}
	if err := kolo.Broadcast(ctx, "state.w", kolo.Of(s.w), 0); err != nil {
		return err
	}
	s.step = step[0]
	return s.Save()
}

// started is when this process began: the elastic step lines carry the time since, so that step
// times can be read from them without the jitter of the pipes they travel through.
var started = time.Now()

// runElastic trains as run does, across the rounds of an elastic job: a lost rank costs at most
// the steps since the last commit.
func runElastic(steps, batch, nf, nc, samples int, lr float32, commit, logEvery int, pace time.Duration, f fault) error {
	// Each worker says which process it is: kolo run prefixes the line with the worker's place,
	// and a process that survives a reset never prints it again.
	fmt.Printf("worker pid %d\n", os.Getpid())
	if err := kolo.Init(); err != nil {
		return err
	}
	defer kolo.Shutdown()
	ctx := context.Background()
	x, y := dataset(samples, nf, nc)
	st := &elasticState{w: make([]float32, nf*nc), savedW: make([]float32, nf*nc)}
	r := rand.New(rand.NewPCG(1, 99)) // rank 0's initial weights; Sync gives them to every rank
	for i := range st.w {
		st.w[i] = float32(r.NormFloat64() * 0.01)
	}
	err := kolo.ElasticRun(ctx, st, func(ctx context.Context) error {
		rank, size := kolo.Rank(), kolo.Size()
		from := st.step
		t := newTrainer(x, y, nf, nc, batch, lr, rank, size)
		for st.step < int64(steps) {
			if kolo.ElasticRound() == 1 {
				f.exit(rank, int(st.step))
			}
			loss, err := t.step(ctx, st.w)
			if err != nil {
				return err
			}
			st.step++
			kolo.MarkStep()
			if rank == 0 && st.step == from+1 {
				// Once its first step is done: the round is up.
				fmt.Printf("round %d: %d ranks from step %d\n", kolo.ElasticRound(), size, from)
			}
			if rank == 0 && (st.step%int64(logEvery) == 0 || st.step == int64(steps)) {
				fmt.Printf("step %4d  loss %.4f  t %.4f\n", st.step, loss, time.Since(started).Seconds())
			}
			if st.step%int64(commit) == 0 {
				if err := kolo.Commit(ctx, st); err != nil {
					return err
				}
			}
			time.Sleep(pace) // after the collective, as in run
		}
		return nil
	})
	if err != nil {
		return err
	}
	return check(ctx, st.w, x, y, nf, nc)
}

// dataset draws nc Gaussian clusters in nf dimensions.
func dataset(n, nf, nc int) ([]float32, []int) {
	r := rand.New(rand.NewPCG(2026, 11))
	centers := make([]float64, nc*nf)
	for i := range centers {
		centers[i] = r.NormFloat64() * 1.5
	}
	x := make([]float32, n*nf)
	y := make([]int, n)
	for i := 0; i < n; i++ {
		c := r.IntN(nc)
		y[i] = c
		for f := 0; f < nf; f++ {
			x[i*nf+f] = float32(centers[c*nf+f] + r.NormFloat64())
		}
	}
	return x, y
}

// accumulate adds the cross-entropy gradient of one sample to grad and returns its loss.
func accumulate(grad, w, xi []float32, yi, nc int) float32 {
	nf := len(xi)
	logits := make([]float64, nc)
	maxv := math.Inf(-1)
	for c := 0; c < nc; c++ {
		var s float64
		for f := 0; f < nf; f++ {
			s += float64(w[f*nc+c] * xi[f])
		}
		logits[c] = s
		maxv = math.Max(maxv, s)
	}
	var z float64
	for c := range logits {
		logits[c] = math.Exp(logits[c] - maxv)
		z += logits[c]
	}
	for c := 0; c < nc; c++ {
		p := logits[c] / z
		t := 0.0
		if c == yi {
			t = 1
		}
		for f := 0; f < nf; f++ {
			grad[f*nc+c] += float32((p - t) * float64(xi[f]))
		}
	}
	return float32(-math.Log(logits[yi]/z + 1e-12))
}

func accuracy(w, x []float32, y []int, nf, nc int) float64 {
	correct := 0
	for i := range y {
		best, bestc := math.Inf(-1), 0
		for c := 0; c < nc; c++ {
			var s float64
			for f := 0; f < nf; f++ {
				s += float64(w[f*nc+c] * x[i*nf+f])
			}
			if s > best {
				best, bestc = s, c
			}
		}
		if bestc == y[i] {
			correct++
		}
	}
	return float64(correct) / float64(len(y))
}
