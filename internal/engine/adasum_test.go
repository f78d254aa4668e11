//go:build linux

package engine

import (
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"

	"github.com/kolo-dl/kolo/internal/dtype"
	"github.com/kolo-dl/kolo/internal/engine/negotiate"
)

// refAdasum is Adasum of the ranks' vectors in float64, in the tree collective.AdasumAllreduce
// documents: rank p+i folded into rank i (p the largest power of two not above n), then pairs.
func refAdasum(vs [][]float64) []float64 {
	combine := func(a, b []float64) []float64 {
		var dot, aa, bb float64
		for i := range a {
			dot, aa, bb = dot+a[i]*b[i], aa+a[i]*a[i], bb+b[i]*b[i]
		}
		ac, bc := 1.0, 1.0
		if aa >= 0x1p-511 {
			ac = 1 - dot/aa/2
		}
		if bb >= 0x1p-511 {
			bc = 1 - dot/bb/2
		}
		r := make([]float64, len(a))
		for i := range r {
			r[i] = ac*a[i] + bc*b[i]
		}
		return r
	}
	p := 1
	for p*2 <= len(vs) {
		p *= 2
	}
	w := append([][]float64(nil), vs[:p]...)
	for i := range len(vs) - p {
		w[i] = combine(vs[i], vs[p+i])
	}
	for len(w) > 1 {
		for i := range len(w) / 2 {
			w[i] = combine(w[2*i], w[2*i+1])
		}
		w = w[:len(w)/2]
	}
	return w[0]
}

// An Adasum allreduce of a group of tensors (two fused, one large enough to be reduced in place
// beside them) equals the float64 reference per tensor, prescale and postscale applied outside
// Adasum as Horovod does (adasum(2a, 2b)/4 = adasum(a, b)/2), on every rank and over inmem and
// shared memory.
func TestAdasumAllreduceMatchesReference(t *testing.T) {
	sizes := []int{5, 300_000, 37} // float32 elements; the middle one is over unfusedBytes
	for _, n := range []int{2, 3} {
		t.Run(fmt.Sprintf("n=%d", n), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(uint64(n), 1))
			inputs := make([][][]float32, n) // [rank][tensor]
			for r := range inputs {
				for _, k := range sizes {
					v := make([]float32, k)
					for i := range v {
						v[i] = float32(rng.Float64()*2 - 1)
					}
					inputs[r] = append(inputs[r], v)
				}
			}
			want := make([][]float64, len(sizes))
			for ti := range sizes {
				vs := make([][]float64, n)
				for r := range vs {
					for _, x := range inputs[r][ti] {
						vs[r] = append(vs[r], float64(x))
					}
				}
				want[ti] = refAdasum(vs)
			}
			transports(t, n, DefaultConfig(), func(t *testing.T, c *cluster) {
				ctx := waitCtx(t)
				var wg sync.WaitGroup
				for r, e := range c.engines {
					wg.Go(func() {
						hs := make([]*Handle, len(sizes))
						bufs := make([][]byte, len(sizes))
						for ti, k := range sizes {
							bufs[ti] = f32(inputs[r][ti]...)
							req := negotiate.Request{Name: fmt.Sprintf("t%d", ti), Kind: negotiate.Allreduce, DType: dtype.Float32,
								Shape: []int64{int64(k)}, ReduceOp: negotiate.ReduceAdasum, PreScale: 2, PostScale: 0.25,
								Group: 1, GroupSize: len(sizes)}
							hs[ti] = e.Enqueue(req, bufs[ti], bufs[ti])
						}
						for ti, h := range hs {
							if err := h.Wait(ctx); err != nil {
								t.Errorf("rank %d tensor %d: %v", r, ti, err)
								continue
							}
							var d2, w2 float64
							for i, g := range getF32(bufs[ti]) {
								w := want[ti][i] / 2
								d2 += (float64(g) - w) * (float64(g) - w)
								w2 += w * w
							}
							if d, w := math.Sqrt(d2), math.Sqrt(w2); d > 1e-5*w {
								t.Errorf("rank %d tensor %d of %d elements: |got - want| = %g, |want| = %g", r, ti, sizes[ti], d, w)
							}
						}
					})
				}
				wg.Wait()
			})
		})
	}
}

// Adasum on one rank and sum on the others fails the op on every rank, naming both ops; a rank
// that has joined fails an Adasum allreduce on the others.
func TestAdasumRefusals(t *testing.T) {
	const n = 3
	c := newCluster(t, n, DefaultConfig())
	ctx := waitCtx(t)
	req := func(name string, op uint8) negotiate.Request {
		return negotiate.Request{Name: name, Kind: negotiate.Allreduce, DType: dtype.Float32, Shape: []int64{2}, ReduceOp: op}
	}
	hs := make([]*Handle, n)
	for r := range n {
		op := negotiate.ReduceSum
		if r == 0 {
			op = negotiate.ReduceAdasum
		}
		buf := f32(1, 2)
		hs[r] = c.engines[r].Enqueue(req("mixed", op), buf, buf)
	}
	for r, h := range hs {
		err := h.Wait(ctx)
		if err == nil || !strings.Contains(err.Error(), "rank 0 sent adasum") || !strings.Contains(err.Error(), "ranks 1,2 sent sum") {
			t.Errorf("rank %d: got %v, want a mismatch naming adasum on rank 0 and sum on ranks 1,2", r, err)
		}
	}

	jh := c.engines[2].Enqueue(negotiate.Request{Name: "join", Kind: negotiate.Join}, nil, nil)
	for r := range 2 {
		buf := f32(1, 2)
		hs[r] = c.engines[r].Enqueue(req("joined", negotiate.ReduceAdasum), buf, buf)
	}
	for r, h := range hs[:2] {
		if err := h.Wait(ctx); err == nil || !strings.Contains(err.Error(), "Adasum is not supported with join") {
			t.Errorf("rank %d: got %v, want Adasum refused with a joined rank", r, err)
		}
	}
	for r := range 2 {
		hs[r] = c.engines[r].Enqueue(negotiate.Request{Name: "join", Kind: negotiate.Join}, nil, nil)
	}
	for r, h := range append(hs[:2], jh) {
		if err := h.Wait(ctx); err != nil {
			t.Errorf("rank %d join: %v", r, err)
		}
	}
}
