// Command softmax trains a softmax-regression classifier data-parallel with kolo: each rank takes a
// shard of a generated dataset, computes gradients on its mini-batch, and the gradients are averaged
// across ranks with Allreduce before every step, so every rank keeps identical weights.
//
//	kolo run -np 4 go run ./examples/softmax
//
// It prints the loss as it falls and ends by checking that every rank holds the same weights.
package main

import (
	"context"
	"flag"
	"fmt"
	"math"
	"math/rand/v2"
	"os"

	"github.com/kolo-dl/kolo"
)

func main() {
	steps := flag.Int("steps", 200, "training steps")
	batch := flag.Int("batch", 64, "mini-batch per rank")
	lr := flag.Float64("lr", 0.5, "learning rate")
	features := flag.Int("features", 32, "input features")
	classes := flag.Int("classes", 4, "classes")
	samples := flag.Int("samples", 8192, "dataset size (all ranks together)")
	flag.Parse()
	if err := run(*steps, *batch, *features, *classes, *samples, float32(*lr)); err != nil {
		fmt.Fprintf(os.Stderr, "rank %d: %v\n", kolo.Rank(), err)
		os.Exit(1)
	}
}

func run(steps, batch, nf, nc, samples int, lr float32) error {
	if err := kolo.Init(); err != nil {
		return err
	}
	defer kolo.Shutdown()
	ctx := context.Background()
	rank, size := kolo.Rank(), kolo.Size()

	// The dataset is generated from a fixed seed, so every rank sees the same one and takes its shard.
	x, y := dataset(samples, nf, nc)
	lo, hi := rank*samples/size, (rank+1)*samples/size

	// Weights start random on rank 0 and are broadcast, as a training script does with its model.
	w := make([]float32, nf*nc)
	r := rand.New(rand.NewPCG(uint64(rank)+1, 99))
	for i := range w {
		w[i] = float32(r.NormFloat64() * 0.01)
	}
	if err := kolo.Broadcast(ctx, "weights.init", kolo.Of(w), 0); err != nil {
		return err
	}

	grad := make([]float32, nf*nc)
	lossBuf := make([]float32, 1)
	pick := rand.New(rand.NewPCG(uint64(rank)+7, 3))
	for step := 0; step < steps; step++ {
		clear(grad)
		var loss float32
		for b := 0; b < batch; b++ {
			i := lo + pick.IntN(hi-lo)
			loss += accumulate(grad, w, x[i*nf:(i+1)*nf], y[i], nc)
		}
		for i := range grad {
			grad[i] /= float32(batch)
		}
		lossBuf[0] = loss / float32(batch)
		// Two named ops per step, submitted together: the engine fuses them into one allreduce.
		hg := kolo.AllreduceAsync("grad", kolo.Of(grad), kolo.Of(grad), kolo.Average)
		hl := kolo.AllreduceAsync("loss", kolo.Of(lossBuf), kolo.Of(lossBuf), kolo.Average)
		if err := hg.Wait(ctx); err != nil {
			return err
		}
		if err := hl.Wait(ctx); err != nil {
			return err
		}
		for i := range w {
			w[i] -= lr * grad[i]
		}
		kolo.MarkStep() // kolo run --autotune times the job by these marks
		if rank == 0 && (step%50 == 0 || step == steps-1) {
			fmt.Printf("step %4d  loss %.4f\n", step, lossBuf[0])
		}
	}

	// Every rank must hold the same weights: compare with rank 0's.
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
	if rank == 0 {
		fmt.Printf("trained on %d ranks: every rank holds identical weights; training accuracy %.1f%%\n", size, 100*acc)
	}
	return nil
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
