//go:build linux

package engine

import (
	"errors"
	"fmt"
	"math"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kolo-dl/kolo/engine/negotiate"
	"github.com/kolo-dl/kolo/reduce"
)

// The tests here run engines over one shared-memory segment, where cached small allreduces
// negotiate on the board (board.go).

func boardRan(c *cluster) (ran, fell int64) {
	for _, e := range c.engines {
		if e.brd == nil {
			continue
		}
		ran += e.brd.ran.Load()
		fell += e.brd.fellOps.Load()
	}
	return ran, fell
}

func fallbacks(c *cluster) int64 { return c.engines[0].brd.b.BoardFallbacks(0) }

// boardCluster is n engines over one segment whose ops wait wait on the board, with edits applied
// to their config.
func boardCluster(t *testing.T, n int, wait time.Duration, edits ...func(*Config)) *cluster {
	return boardClusterEach(t, n, wait, nil, func(_ int, c *Config) {
		for _, f := range edits {
			f(c)
		}
	})
}

// boardClusterEach is boardCluster with a Config edit per rank (cfg, may be nil) and a Group edit
// per rank (group, may be nil) before the engines start.
func boardClusterEach(t *testing.T, n int, wait time.Duration, group func(r int, g *Group), cfg func(r int, c *Config)) *cluster {
	cfgs := make([]Config, n)
	for r := range cfgs {
		cfgs[r] = DefaultConfig()
		cfgs[r].BoardWait = wait
		if cfg != nil {
			cfg(r, &cfgs[r])
		}
	}
	return newShmClusterEdit(t, cfgs, group)
}

// settled logs how many ops ran on the board and fell back, checks that no fallback is still
// counted once every op completed, and returns the counts.
func settled(t *testing.T, c *cluster) (ran, fell int64) {
	t.Helper()
	ran, fell = boardRan(c)
	t.Logf("%d ops ran on the board, %d fell back", ran, fell)
	if f := fallbacks(c); f != 0 {
		t.Errorf("the shared fallback count is %d after every op completed", f)
	}
	return ran, fell
}

// onEachRank runs f for every rank at once and returns when all have.
func onEachRank(n int, f func(r int)) {
	var wg sync.WaitGroup
	for r := range n {
		wg.Add(1)
		go func() { defer wg.Done(); f(r) }()
	}
	wg.Wait()
}

// boardOp is one op of the tests' mix.
type boardOp struct {
	name  string
	elems int
	op    reduce.Op
	pre   float64
	post  float64
	avg   bool
}

func (o boardOp) req() negotiate.Request {
	r := allreduceReq(o.name, o.elems)
	r.ReduceOp, r.PreScale, r.PostScale, r.Average = uint8(o.op), o.pre, o.post, o.avg
	if o.avg {
		r.PostScale = 0 // Average's division is postScale's, as the API layer sets it
	}
	return r
}

// want is the result every rank must get, computed in float64 from each rank's input.
func (o boardOp) want(n int) []float64 {
	out := make([]float64, o.elems)
	for r := range n {
		for i, v := range input(o.name, r, o.elems) {
			x := float64(v)
			if o.pre != 0 {
				x *= o.pre
			}
			switch {
			case r == 0:
				out[i] = x
			case o.op == reduce.Sum:
				out[i] += x
			case o.op == reduce.Min:
				out[i] = math.Min(out[i], x)
			case o.op == reduce.Max:
				out[i] = math.Max(out[i], x)
			case o.op == reduce.Prod:
				out[i] *= x
			}
		}
	}
	for i := range out {
		if o.post != 0 {
			out[i] *= o.post
		}
		if o.avg {
			out[i] /= float64(n)
		}
	}
	return out
}

func boardMix() []boardOp {
	return []boardOp{
		{name: "bias", elems: 1, op: reduce.Sum},
		{name: "odd", elems: 3, op: reduce.Sum, pre: 0.5, post: 2},
		{name: "avg", elems: 100, op: reduce.Sum, avg: true},
		{name: "min", elems: 7, op: reduce.Min},
		{name: "max", elems: 9, op: reduce.Max},
		{name: "prod", elems: 2, op: reduce.Prod, pre: 0.001},
		{name: "full", elems: boardMaxBytes / 4, op: reduce.Sum},   // the largest that goes on the board
		{name: "over", elems: boardMaxBytes/4 + 1, op: reduce.Sum}, // the coordinator's way always
	}
}

// runMix has every rank submit the mix iters times, in an order of its own each time, without
// waiting in between, and checks every result against the reference and against rank 0's bits.
func runMix(t *testing.T, c *cluster, iters int, pause func(r, it int)) {
	t.Helper()
	ctx := waitCtx(t)
	n := len(c.engines)
	mix := boardMix()
	var wg sync.WaitGroup
	results := make([][][]byte, n) // [rank][op] of the last iteration
	errs := make(chan error, n)
	for r := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for it := range iters {
				if pause != nil {
					pause(r, it)
				}
				bufs := make([][]byte, len(mix))
				hs := make([]*Handle, len(mix))
				for j := range mix {
					k := (j*(r+1) + it) % len(mix) // each rank its own order
					for hs[k] != nil {
						k = (k + 1) % len(mix)
					}
					o := mix[k]
					bufs[k] = f32(input(o.name, r, o.elems)...)
					hs[k] = c.engines[r].Enqueue(o.req(), bufs[k], bufs[k])
				}
				for k, h := range hs {
					if err := h.Wait(ctx); err != nil {
						errs <- fmt.Errorf("rank %d, iteration %d, %s: %w", r, it, mix[k].name, err)
						return
					}
					want := mix[k].want(n)
					for i, got := range getF32(bufs[k]) {
						if d := math.Abs(float64(got) - want[i]); d > 1e-3*math.Max(1, math.Abs(want[i])) {
							errs <- fmt.Errorf("rank %d, iteration %d, %s[%d] = %v, want %v", r, it, mix[k].name, i, got, want[i])
							return
						}
					}
				}
				results[r] = bufs
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	for r := 1; r < n; r++ {
		for k := range mix {
			if string(results[r][k]) != string(results[0][k]) {
				t.Errorf("%s: rank %d's result differs from rank 0's in its bits", mix[k].name, r)
			}
		}
	}
}

// Every kind of small allreduce comes out right, the same on every rank, whatever order each
// rank submits them in; after the first iteration (which caches them) they run on the board.
// With spinning ranks every rank also marks each round seen, and the round's ops complete on no
// rank before every rank has (or the spin time has passed).
func TestBoardAllreduces(t *testing.T) {
	for _, tc := range []struct {
		n    int
		spin time.Duration // spinning ranks linger until every rank has seen a round
	}{{2, 0}, {4, 0}, {2, 30 * time.Microsecond}, {3, 30 * time.Microsecond}} {
		n := tc.n
		t.Run(fmt.Sprintf("ranks=%d/spin=%v", n, tc.spin), func(t *testing.T) {
			cfg := DefaultConfig()
			cfg.Spin = tc.spin
			c := newShmCluster(t, n, cfg)
			const iters = 30
			runMix(t, c, iters, nil)
			ran, fell := settled(t, c)
			// Everything but "over" and the first iteration can go on the board; ops that
			// wait for a rank descheduled past BoardWait go rank 0's way.
			if most := int64(n * (iters - 1) * (len(boardMix()) - 1)); ran < most/2 || ran+fell > most {
				t.Errorf("%d ops ran on the board, %d fell back; want at least %d and at most %d in all", ran, fell, most/2, most)
			}
		})
	}
}

// The board can be turned off, and a rank that turns it off (its own environment under mpirun)
// turns it off for every rank: every op goes rank 0's way at once, none waits BoardWait first.
func TestBoardOff(t *testing.T) {
	for _, off := range []int{0, 1} {
		t.Run(fmt.Sprintf("off on rank %d", off), func(t *testing.T) {
			cfgs := make([]Config, 3)
			for r := range cfgs {
				cfgs[r] = DefaultConfig()
				cfgs[r].BoardWait = time.Hour
			}
			cfgs[off].CoordinatorOnly = true
			c := newShmClusterEach(t, cfgs)
			if c.engines[off].brd != nil {
				t.Fatal("CoordinatorOnly left the board on")
			}
			runMix(t, c, 3, nil) // waitCtx's 10 s, not BoardWait's hour
			if ran, _ := boardRan(c); ran > 0 {
				t.Errorf("%d ops ran on the board", ran)
			}
		})
	}
}

// A rank that comes late (past BoardWait) sends its ops to rank 0 as the others did after they
// waited: the ops complete, and once they have, later ones use the board again.
func TestBoardLateRankFallsBack(t *testing.T) {
	c := boardCluster(t, 3, 5*time.Millisecond)
	runMix(t, c, 6, func(r, it int) {
		if r == 2 && it == 2 {
			time.Sleep(50 * time.Millisecond)
		}
	})
	ran, fell := settled(t, c)
	if fell == 0 {
		t.Error("no op fell back, though rank 2 came 50 ms late and BoardWait is 5 ms")
	}
	before := ran
	runMix(t, c, 4, nil)
	if ran, _ = boardRan(c); ran == before {
		t.Error("the board was not used again after the fallback")
	}
}

// A shape that differs on one rank: the op goes rank 0's way everywhere and fails on every rank
// with the coordinator's mismatch error; the job goes on, on the board.
func TestBoardMismatchFailsEveryRank(t *testing.T) {
	const n = 3
	c := boardCluster(t, n, 5*time.Millisecond)
	ctx := waitCtx(t)
	each := func(size func(r int) int) []error {
		errs := make([]error, n)
		onEachRank(n, func(r int) {
			buf := make([]byte, 4*size(r))
			errs[r] = c.engines[r].Enqueue(allreduceReq("w", size(r)), buf, buf).Wait(ctx)
		})
		return errs
	}
	for range 3 { // cached, and on the board
		if err := errors.Join(each(func(int) int { return 4 })...); err != nil {
			t.Fatal(err)
		}
	}
	for r, err := range each(func(r int) int { return 4 + r/2 }) { // rank 2: 5 elements
		var oe *OpError
		if !errors.As(err, &oe) || !strings.Contains(err.Error(), `"w"`) || !strings.Contains(err.Error(), "rank 2") {
			t.Errorf("rank %d: err = %v, want an OpError naming \"w\" and rank 2", r, err)
		}
	}
	before, _ := boardRan(c)
	for range 3 {
		if err := errors.Join(each(func(int) int { return 4 })...); err != nil {
			t.Fatal(err)
		}
	}
	if ran, _ := boardRan(c); ran == before {
		t.Error("the board was not used again after the mismatch")
	}
}

// A rank that joins sends what it had on the board to rank 0 first, and the other ranks' ops go
// rank 0's way, with the joined rank contributing nothing, until every rank has joined; then the
// board serves again.
func TestBoardJoin(t *testing.T) {
	const n = 3
	c := newShmCluster(t, n, DefaultConfig())
	ctx := waitCtx(t)
	var wg sync.WaitGroup
	for r := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			steps := 5
			if r == 0 {
				steps = 2 // rank 0 runs out of data first
			}
			for it := range steps {
				buf := f32(float32(r + 1))
				if err := c.engines[r].Enqueue(allreduceReq("g", 1), buf, buf).Wait(ctx); err != nil {
					t.Errorf("rank %d step %d: %v", r, it, err)
					return
				}
				want := float32(6)
				if it >= 2 {
					want = 5 // rank 0 has joined
				}
				if got := getF32(buf)[0]; got != want {
					t.Errorf("rank %d step %d: got %v, want %v", r, it, got, want)
				}
			}
			if err := c.engines[r].Enqueue(negotiate.Request{Name: "join", Kind: negotiate.Join}, nil, nil).Wait(ctx); err != nil {
				t.Errorf("rank %d: join: %v", r, err)
			}
		}()
	}
	wg.Wait()
	before, _ := settled(t, c)
	runMix(t, c, 3, nil)
	if ran, _ := boardRan(c); ran == before {
		t.Error("the board was not used after the join")
	}
}

// With a cache too small for the ops, ids are evicted and reused all the time, and ranks learn
// that at different moments: ops still reduce the right tensors. Each iteration also runs an op
// under a name of its own (as unnamed ops are), which takes an id and evicts another.
func TestBoardCacheChurn(t *testing.T) {
	cfg := DefaultConfig()
	cfg.CacheCapacity = 3
	const n = 3
	c := newShmCluster(t, n, cfg)
	runMix(t, c, 20, nil)
	ctx := waitCtx(t)
	var wg sync.WaitGroup
	for r := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for it := range 60 {
				names := []string{"bias", fmt.Sprintf("once.%d", it), "odd"}
				if (r+it)%2 == 1 {
					names[0], names[2] = names[2], names[0]
				}
				bufs := make([][]byte, len(names))
				hs := make([]*Handle, len(names))
				// Every op's data tells it apart: an op reduced with another's data shows.
				val := func(name string, r int) []float32 { return input(fmt.Sprintf("%s.%d", name, it), r, 2) }
				for k, name := range names {
					bufs[k] = f32(val(name, r)...)
					hs[k] = c.engines[r].Enqueue(allreduceReq(name, 2), bufs[k], bufs[k])
				}
				for k, h := range hs {
					if err := h.Wait(ctx); err != nil {
						t.Errorf("rank %d, iteration %d, %s: %v", r, it, names[k], err)
						return
					}
					var want [2]float32
					for q := range n {
						for i, v := range val(names[k], q) {
							want[i] += v
						}
					}
					if got := getF32(bufs[k]); got[0] != want[0] || got[1] != want[1] {
						t.Errorf("rank %d, iteration %d, %s: got %v, want %v", r, it, names[k], got, want)
						return
					}
				}
			}
		}()
	}
	wg.Wait()
	if ran, _ := settled(t, c); ran == 0 {
		t.Error("no op ran on the board")
	}
}

// A rank that is gone while the others wait on the board: they go rank 0's way after BoardWait,
// and fail there naming it, instead of waiting for a round that cannot complete.
func TestBoardLostRank(t *testing.T) {
	const n = 3
	c := boardCluster(t, n, 5*time.Millisecond)
	runMix(t, c, 2, nil)
	ctx := waitCtx(t)
	c.close(2) // its segment attachment, as if the process were killed: no abort notice
	var wg sync.WaitGroup
	for r := range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			buf := f32(1)
			err := c.engines[r].Enqueue(allreduceReq("bias", 1), buf, buf).Wait(ctx)
			if err == nil || !strings.Contains(err.Error(), "rank 2") {
				t.Errorf("rank %d: err = %v, want one naming rank 2", r, err)
			}
		}()
	}
	wg.Wait()
}

// An id the coordinator reused while a rank had the op of its old entry posted: rank 0 posts
// "bias" under cache id 0 and waits on the board; the others, meanwhile, see "bias" evicted and id
// 0 given to "odd", and post "odd" under id 0 in the same round. The ids match, the entries do
// not (Cache.Born), so nothing may run in that round: every result must be its own op's sum.
func TestBoardReusedIDNeverMatchesAnotherOp(t *testing.T) {
	const n = 3
	c := boardCluster(t, n, time.Hour, func(cfg *Config) { cfg.CacheCapacity = 1 }) // ids 0 and 1
	ctx := waitCtx(t)
	val := func(name string, r int) []float32 { return input(name, r, 2) }
	sum := func(name string) []float32 {
		var s [2]float32
		for q := range n {
			for i, v := range val(name, q) {
				s[i] += v
			}
		}
		return s[:]
	}
	type op struct {
		name string
		buf  []byte
		h    *Handle
	}
	submit := func(r int, name string) *op {
		o := &op{name: name, buf: f32(val(name, r)...)}
		o.h = c.engines[r].Enqueue(allreduceReq(name, 2), o.buf, o.buf)
		return o
	}
	check := func(r int, o *op) {
		t.Helper()
		if err := o.h.Wait(ctx); err != nil {
			t.Fatalf("rank %d, %s: %v", r, o.name, err)
		}
		if got, want := getF32(o.buf), sum(o.name); got[0] != want[0] || got[1] != want[1] {
			t.Errorf("rank %d, %s: got %v, want %v", r, o.name, got, want)
		}
	}
	each := func(f func(r int)) { onEachRank(n, f) }
	each(func(r int) { check(r, submit(r, "bias")); check(r, submit(r, "bias")) }) // id 0, then the board
	bias := submit(0, "bias")                                                      // rank 0 posts it, and its round waits for the others
	each(func(r int) { check(r, submit(r, "x")) })                                 // evicts "bias"; "x" gets id 1
	each(func(r int) { check(r, submit(r, "odd")) })                               // evicts "x"; "odd" gets id 0 again
	req := allreduceReq("odd", 2)
	if id, ok := c.engines[1].global.cache.Lookup(&req); !ok || id != 0 {
		t.Fatalf("the scenario did not happen: \"odd\" has cache id %d (%v), want 0", id, ok)
	}
	var odd [n]*op
	for r := 1; r < n; r++ {
		odd[r] = submit(r, "odd") // on the board under id 0, in rank 0's round
	}
	time.Sleep(20 * time.Millisecond)
	odd[0] = submit(0, "odd")
	for r := range n {
		check(r, odd[r])
	}
	each(func(r int) {
		if r == 0 {
			check(0, bias)
		} else {
			check(r, submit(r, "bias"))
		}
	})
}

// Ranks that spin linger after a round until every rank has read it (boardLinger); a rank that
// does not spin (its own KOLO_SPIN_TIME=0) must still count itself as having read each round, or
// the count would stay short for good and every later op of the spinning ranks would linger its
// whole spin time.
func TestBoardLingerWithARankThatDoesNotSpin(t *testing.T) {
	const n, ops = 3, 20
	const linger = 300 * time.Millisecond
	c := boardClusterEach(t, n, time.Second, nil, func(r int, c *Config) {
		c.Spin = linger
		if r == 0 {
			c.Spin = 0
		}
	})
	ctx := waitCtx(t)
	start := time.Now()
	every(t, c, func(r int, e *Engine) error {
		for i := range ops {
			buf := f32(float32(r + 1))
			if err := e.Enqueue(allreduceReq("x", 1), buf, buf).Wait(ctx); err != nil {
				return fmt.Errorf("op %d: %w", i, err)
			}
			if got := getF32(buf)[0]; got != 6 {
				return fmt.Errorf("op %d: sum %v, want 6", i, got)
			}
		}
		return nil
	})
	took := time.Since(start)
	if ran, _ := settled(t, c); ran == 0 {
		t.Fatal("no op ran on the board")
	}
	// Lingering the whole spin on every board op would take (ops-1) x 300 ms.
	if took > 3*linger {
		t.Errorf("%d ops took %v: the spinning ranks lingered after rounds every rank had read", ops, took)
	}
}
