//go:build linux

package engine

import (
	"fmt"
	"math"
	"sync"
	"testing"
	"time"

	"github.com/kolo-dl/kolo/internal/engine/negotiate"
	"github.com/kolo-dl/kolo/internal/reduce"
)

// The tests here run engines over one shared-memory segment and submit small allreduces of every
// kind, in an order of their own on each rank, as a training step's gradients come.

// onEachRank runs f for every rank at once and returns when all have.
func onEachRank(n int, f func(r int)) {
	var wg sync.WaitGroup
	for r := range n {
		wg.Add(1)
		go func() { defer wg.Done(); f(r) }()
	}
	wg.Wait()
}

// mixOp is one op of the tests' mix.
type mixOp struct {
	name  string
	elems int
	op    reduce.Op
	pre   float64
	post  float64
	avg   bool
}

func (o mixOp) req() negotiate.Request {
	r := allreduceReq(o.name, o.elems)
	r.ReduceOp, r.PreScale, r.PostScale, r.Average = uint8(o.op), o.pre, o.post, o.avg
	if o.avg {
		r.PostScale = 0 // Average's division is postScale's, as the API layer sets it
	}
	return r
}

// want is the result every rank must get, computed in float64 from each rank's input.
func (o mixOp) want(n int) []float64 {
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

func smallMix() []mixOp {
	return []mixOp{
		{name: "bias", elems: 1, op: reduce.Sum},
		{name: "odd", elems: 3, op: reduce.Sum, pre: 0.5, post: 2},
		{name: "avg", elems: 100, op: reduce.Sum, avg: true},
		{name: "min", elems: 7, op: reduce.Min},
		{name: "max", elems: 9, op: reduce.Max},
		{name: "prod", elems: 2, op: reduce.Prod, pre: 0.001},
		{name: "full", elems: 512, op: reduce.Sum},
		{name: "over", elems: 513, op: reduce.Sum},
	}
}

// runMix has every rank submit the mix iters times, in an order of its own each time, without
// waiting in between, and checks every result against the reference and against rank 0's bits.
func runMix(t *testing.T, c *cluster, iters int) {
	t.Helper()
	ctx := waitCtx(t)
	n := len(c.engines)
	mix := smallMix()
	var wg sync.WaitGroup
	results := make([][][]byte, n) // [rank][op] of the last iteration
	errs := make(chan error, n)
	for r := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for it := range iters {
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
// rank submits them in, cached (after the first iteration) or not.
func TestSmallAllreducesAnyOrder(t *testing.T) {
	for _, tc := range []struct {
		n    int
		spin time.Duration
	}{{2, 0}, {4, 0}, {2, 30 * time.Microsecond}, {3, 30 * time.Microsecond}} {
		t.Run(fmt.Sprintf("ranks=%d/spin=%v", tc.n, tc.spin), func(t *testing.T) {
			cfg := DefaultConfig()
			cfg.Spin = tc.spin
			runMix(t, newShmCluster(t, tc.n, cfg), 30)
		})
	}
}

// With a cache too small for the ops, ids are evicted and reused all the time, and ranks learn
// that at different moments: ops still reduce the right tensors. Each iteration also runs an op
// under a name of its own (as unnamed ops are), which takes an id and evicts another.
func TestCacheChurn(t *testing.T) {
	cfg := DefaultConfig()
	cfg.CacheCapacity = 3
	const n = 3
	c := newShmCluster(t, n, cfg)
	runMix(t, c, 20)
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
}
