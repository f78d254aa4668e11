package engine

import (
	"encoding/binary"
	"fmt"
	"testing"

	"github.com/kolo-dl/kolo/internal/dtype"
	"github.com/kolo-dl/kolo/internal/engine/negotiate"
	"github.com/kolo-dl/kolo/internal/reduce"
)

func f16(v float32) uint16 { return reduce.Float32ToFloat16Bits(v) }
func h2f(h uint16) float32 { return reduce.Float16BitsToFloat32(h) }

// A float16 tensor from a GPU (Request.GPU) is scaled as Horovod's CUDA kernels scale it, with the
// factor rounded to float16 first; from host memory, by the factor in float32, as Horovod's CPU
// code does. Checked for the fused path, a tensor reduced in place, reducescatter and an average
// (whose 1/n joins the postscale before the rounding), against values computed here element by
// element; the inputs are chosen so that the two roundings differ, which the test checks too.
func TestFloat16ScaleFactorsFollowTheDevice(t *testing.T) {
	const n, pre, post = 2, 0.1, 0.3 // neither is a float16: 0.1 becomes 0.0999755859375
	big := unfusedBytes/2 + 8        // float16 elements: reduced in place, not fused
	for _, tc := range []struct {
		name  string
		kind  negotiate.OpKind
		elems []int // one op each, submitted together
		avg   bool
	}{
		{"fused allreduce", negotiate.Allreduce, []int{40, 24}, false},
		{"allreduce in place", negotiate.Allreduce, []int{big}, false},
		{"average", negotiate.Allreduce, []int{40}, true},
		{"reducescatter", negotiate.ReduceScatter, []int{40}, false},
	} {
		for _, gpu := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/gpu=%v", tc.name, gpu), func(t *testing.T) {
				c := newCluster(t, n, DefaultConfig())
				ctx := waitCtx(t)
				input := func(r, i int) uint16 { return f16(float32((i*7+r*3)%23) + 0.125*float32(r+1)) }
				// What every rank must get, element i of op k, and what the other device's rounding gives.
				want := func(i int, gpu bool) uint16 {
					pf, qf := float32(pre), float32(post)
					if tc.avg {
						qf = float32(post / n)
					}
					if gpu {
						pf, qf = h2f(f16(pf)), h2f(f16(qf))
					}
					var sum float32
					for r := range n {
						sum = h2f(f16(sum + h2f(f16(h2f(input(r, i))*pf))))
					}
					return f16(sum * qf)
				}
				results := make([][][]byte, n)
				onEachRank(n, func(r int) {
					hs := make([]*Handle, len(tc.elems))
					bufs := make([][]byte, len(tc.elems))
					for k, m := range tc.elems {
						bufs[k] = make([]byte, 2*m)
						for i := range m {
							binary.LittleEndian.PutUint16(bufs[k][2*i:], input(r, i))
						}
						req := negotiate.Request{Name: fmt.Sprintf("t%d", k), Kind: tc.kind, DType: dtype.Float16,
							Shape: []int64{int64(m)}, ReduceOp: negotiate.ReduceSum, PreScale: pre, PostScale: post,
							Average: tc.avg, GPU: gpu}
						if tc.avg {
							req.PostScale = post // the API layer's own 1/n is not here: postScale divides
						}
						var out []byte
						if tc.kind == negotiate.Allreduce {
							out = bufs[k]
						}
						hs[k] = c.engines[r].Enqueue(req, bufs[k], out)
					}
					results[r] = make([][]byte, len(tc.elems))
					for k, h := range hs {
						if err := h.Wait(ctx); err != nil {
							t.Errorf("rank %d, op %d: %v", r, k, err)
							return
						}
						results[r][k] = bufs[k]
						if tc.kind == negotiate.ReduceScatter {
							results[r][k] = h.Output()
						}
					}
				})
				if t.Failed() {
					return
				}
				differ := 0
				for r := range n {
					for k, m := range tc.elems {
						first := 0
						if tc.kind == negotiate.ReduceScatter {
							first = r * m / n // rank r's share of an evenly split dim 0
						}
						got := results[r][k]
						for j := range len(got) / 2 {
							i := first + j
							g := binary.LittleEndian.Uint16(got[2*j:])
							if w := want(i, gpu); g != w {
								t.Fatalf("rank %d, op %d, element %d: got %v, want %v (the other device's rounding: %v)",
									r, k, i, h2f(g), h2f(w), h2f(want(i, !gpu)))
							}
							if want(i, true) != want(i, false) {
								differ++
							}
						}
					}
				}
				if differ == 0 {
					t.Fatal("no element where the two roundings differ: the test cannot tell them apart")
				}
			})
		}
	}
}
