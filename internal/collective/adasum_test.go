package collective

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/kolo-dl/kolo/internal/dtype"
	"github.com/kolo-dl/kolo/internal/reduce"
	"github.com/kolo-dl/kolo/internal/transport"
	"github.com/kolo-dl/kolo/internal/transport/inmem"
)

// The reference: each rank's tensor decoded to float64, combined in the tree AdasumAllreduce
// documents (fold rank p+i into rank i, then pairs of neighbours, level by level), in float64.

// refVec is a vector of the reference and a bound on the 2-norm of the error an implementation
// that rounds to the tensor's type after every combine may have made getting there.
type refVec struct {
	v   []float64
	err float64
}

func norm2(v []float64) float64 {
	s := 0.0
	for _, x := range v {
		s += x * x
	}
	return math.Sqrt(s)
}

// refCombine is adasum(a, b), and its error bound: the errors of a and b scaled by the
// coefficients, the coefficients' errors (from a's and b's errors and from float64 accumulation of
// n products), and the final rounding to t (u). Halves are combined in float32, whose coefficient
// and arithmetic roundings add a little.
func refCombine(t dtype.DType, a, b refVec) refVec {
	const eps = 0x1p-53
	var dot, aa, bb float64
	for i := range a.v {
		dot += a.v[i] * b.v[i]
		aa += a.v[i] * a.v[i]
		bb += b.v[i] * b.v[i]
	}
	na, nb := math.Sqrt(aa), math.Sqrt(bb)
	acc := 2 * float64(len(a.v)+2) * eps // relative error of a float64 sum of products
	ac, bc, dac, dbc := 1.0, 1.0, 0.0, 0.0
	dDot := a.err*nb + na*b.err + acc*na*nb
	if aa >= 0x1p-511 {
		ac = 1 - dot/aa*0.5
		dac = dDot/(2*aa) + math.Abs(dot)*(2*na*a.err+acc*aa)/(2*aa*aa)
	}
	if bb >= 0x1p-511 {
		bc = 1 - dot/bb*0.5
		dbc = dDot/(2*bb) + math.Abs(dot)*(2*nb*b.err+acc*bb)/(2*bb*bb)
	}
	r := make([]float64, len(a.v))
	for i := range r {
		r[i] = ac*a.v[i] + bc*b.v[i]
	}
	e := math.Abs(ac)*a.err + math.Abs(bc)*b.err + dac*na + dbc*nb + unitRoundoff(t)*norm2(r)
	if t == dtype.Float16 || t == dtype.BFloat16 {
		e += 4 * 0x1p-24 * (math.Abs(ac)*na + math.Abs(bc)*nb)
	}
	return refVec{r, e}
}

// refAdasum combines the ranks' vectors in AdasumAllreduce's tree.
func refAdasum(t dtype.DType, vs []refVec) refVec {
	n := len(vs)
	p := 1
	for p*2 <= n {
		p *= 2
	}
	w := slices.Clone(vs[:p])
	for i := range n - p {
		w[i] = refCombine(t, vs[i], vs[p+i])
	}
	for len(w) > 1 {
		next := make([]refVec, len(w)/2)
		for i := range next {
			next[i] = refCombine(t, w[2*i], w[2*i+1])
		}
		w = next
	}
	return w[0]
}

// checkAdasum compares got with the reference for each tensor (2-norm of the difference within
// 4 times the error bound), and describes the first mismatch.
func checkAdasum(t dtype.DType, counts []int, got []byte, inputs [][]byte) string {
	start := 0
	for ti, k := range counts {
		vs := make([]refVec, len(inputs))
		for r, in := range inputs {
			vs[r].v = make([]float64, k)
			for i := range k {
				vs[r].v[i] = floatAt(t, in, start+i)
			}
		}
		want := refAdasum(t, vs)
		g := make([]float64, k)
		diff := make([]float64, k)
		for i := range k {
			g[i] = floatAt(t, got, start+i)
			diff[i] = g[i] - want.v[i]
		}
		if d := norm2(diff); !(d <= 4*want.err) {
			worst := 0
			for i := range diff {
				if math.Abs(diff[i]) > math.Abs(diff[worst]) || math.IsNaN(diff[i]) {
					worst = i
				}
			}
			return fmt.Sprintf("tensor %d of %d elements: |got - want| = %g, bound %g; element %d: got %g, want %g",
				ti, k, d, 4*want.err, worst, g[worst], want.v[worst])
		}
		start += k
	}
	return ""
}

type adasumCase struct {
	name   string
	t      dtype.DType
	counts []int
	inputs [][]byte // per rank
	want   []byte   // exact result, when known; else the reference decides
}

func (c *adasumCase) String() string {
	return fmt.Sprintf("%s %v %v", c.name, c.t, c.counts)
}

func sumInts(xs []int) int {
	s := 0
	for _, x := range xs {
		s += x
	}
	return s
}

// adasumCases builds random and exact cases for n ranks.
func adasumCases(rng *rand.Rand, n int) []*adasumCase {
	layouts := [][]int{{0}, {1}, {7}, {13}, {5*n + 3}, {1009}, {3, 0, 17, 1, 5*n + 3, 0, 2}, {0, 0}}
	if n > 2 {
		layouts = append(layouts, []int{n - 1})
	}
	floatsT := []dtype.DType{dtype.Float16, dtype.BFloat16, dtype.Float32, dtype.Float64}
	var cases []*adasumCase
	for _, t := range floatsT {
		for _, counts := range layouts {
			c := &adasumCase{name: "random", t: t, counts: counts}
			for range n {
				c.inputs = append(c.inputs, genInput(rng, t, reduce.Sum, sumInts(counts)))
			}
			cases = append(cases, c)
		}
		counts := []int{9, 6}
		total := sumInts(counts)

		// A zero tensor on one rank: the others' tensors combine as if it were not there.
		c := &adasumCase{name: "zero tensor on one rank", t: t, counts: counts}
		for r := range n {
			in := genInput(rng, t, reduce.Sum, total)
			if r == n/2 {
				clear(in[:9*t.Size()])
			}
			c.inputs = append(c.inputs, in)
		}
		cases = append(cases, c)

		// adasum(a, a) = a, exactly.
		same := genInput(rng, t, reduce.Sum, total)
		c = &adasumCase{name: "identical", t: t, counts: counts, want: same}
		for range n {
			c.inputs = append(c.inputs, same)
		}
		cases = append(cases, c)

		// Orthogonal (disjoint supports): adasum = a + b, exactly.
		all := genInput(rng, t, reduce.Sum, total)
		c = &adasumCase{name: "orthogonal", t: t, counts: counts, want: all}
		es := t.Size()
		for r := range n {
			in := make([]byte, len(all))
			for i := r; i < total; i += n {
				copy(in[i*es:(i+1)*es], all[i*es:(i+1)*es])
			}
			c.inputs = append(c.inputs, in)
		}
		cases = append(cases, c)
	}
	return cases
}

// runAdasumCases runs every case, in order, on one group of n ranks, then checks each rank's result
// against the reference (or the exact result) and against the other ranks' bits.
func runAdasumCases(t *testing.T, n int, opts []inmem.Option, cases []*adasumCase) {
	t.Helper()
	outs := make([][][]byte, len(cases))
	for i := range outs {
		outs[i] = make([][]byte, n)
	}
	mustRanks(t, n, opts, plainComm, func(ctx context.Context, r int, c transport.Comm) error {
		for i, tc := range cases {
			buf := slices.Clone(tc.inputs[r])
			if err := AdasumAllreduce(ctx, c, buf, tc.t, tc.counts); err != nil {
				return fmt.Errorf("%v: %w", tc, err)
			}
			outs[i][r] = buf
		}
		return nil
	})
	for i, tc := range cases {
		if tc.want != nil {
			if !bytes.Equal(outs[i][0], tc.want) {
				t.Errorf("%v, rank 0: got %v, want exactly %v", tc, outs[i][0], tc.want)
			}
		} else if msg := checkAdasum(tc.t, tc.counts, outs[i][0], tc.inputs); msg != "" {
			t.Errorf("%v, rank 0: %s", tc, msg)
		}
		if msg := sameOnAllRanks(outs[i]); msg != "" {
			t.Errorf("%v: %s", tc, msg)
		}
	}
}

func TestAdasumAllreduce(t *testing.T) {
	for _, n := range rankCounts {
		t.Run(fmt.Sprintf("n=%d", n), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(uint64(n), 11))
			runAdasumCases(t, n, []inmem.Option{inmem.WithoutShared()}, adasumCases(rng, n))
		})
	}
}

// Pipes of 3 bytes: nothing may rely on a Send completing before its peer receives.
func TestAdasumAllreduceTinyPipes(t *testing.T) {
	for _, n := range []int{2, 3, 5} {
		t.Run(fmt.Sprintf("n=%d", n), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(uint64(n), 12))
			cases := adasumCases(rng, n)
			cases = slices.DeleteFunc(cases, func(c *adasumCase) bool { return c.t != dtype.Float32 })
			runAdasumCases(t, n, []inmem.Option{inmem.WithoutShared(), inmem.WithBuffer(3)}, cases)
		})
	}
}

// Buffers whose halves span several exchange segments, with an odd element count so that the
// longer half's last element lands in the spill slot after a segment boundary.
func TestAdasumAllreduceSegments(t *testing.T) {
	elems := 2*segmentBytes/4 + 2*segmentBytes/4/3 + 1 // float32: halves of ~1.3 segments
	for _, n := range []int{2, 3, 4} {
		t.Run(fmt.Sprintf("n=%d", n), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(uint64(n), 13))
			c := &adasumCase{name: "large", t: dtype.Float32, counts: []int{elems - 1001, 1001}}
			for range n {
				c.inputs = append(c.inputs, genInput(rng, dtype.Float32, reduce.Sum, elems))
			}
			runAdasumCases(t, n, []inmem.Option{inmem.WithoutShared()}, []*adasumCase{c})
		})
	}
}

// Two ranks, worked by hand: a = [1 0], b = [1 1]: a·b = 1, |a|² = 1, |b|² = 2, so the result is
// (1 - 1/2) a + (1 - 1/4) b = [1.25 0.75]. Nil counts: one tensor.
func TestAdasumAllreduceByHand(t *testing.T) {
	in := [][]float64{{1, 0}, {1, 1}}
	outs := make([][]float64, 2)
	mustRanks(t, 2, nil, plainComm, func(ctx context.Context, r int, c transport.Comm) error {
		buf := f64Bytes(in[r])
		err := AdasumAllreduce(ctx, c, buf, dtype.Float64, nil)
		for i := range in[r] {
			outs[r] = append(outs[r], floatAt(dtype.Float64, buf, i))
		}
		return err
	})
	for r, got := range outs {
		if !slices.Equal(got, []float64{1.25, 0.75}) {
			t.Errorf("rank %d: got %v, want [1.25 0.75]", r, got)
		}
	}
}

func f64Bytes(f []float64) []byte {
	b := make([]byte, 8*len(f))
	for i, x := range f {
		le.PutUint64(b[8*i:], math.Float64bits(x))
	}
	return b
}

func TestAdasumAllreduceRefusesBadArguments(t *testing.T) {
	for _, tc := range []struct {
		name   string
		t      dtype.DType
		buf    int
		counts []int
		want   string
	}{
		{"integers", dtype.Int32, 16, nil, "not a floating-point type"},
		{"uint8", dtype.Uint8, 4, nil, "not a floating-point type"},
		{"invalid dtype", dtype.DType(200), 4, nil, "invalid dtype"},
		{"counts short", dtype.Float32, 16, []int{1, 2}, "tensors of 3 elements in all, buffer holds 4"},
		{"negative count", dtype.Float32, 16, []int{5, -1}, "tensor 1 has -1 elements"},
		{"ragged buffer", dtype.Float32, 6, nil, "not a whole number"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			errs := ranks(t, 2, nil, plainComm, func(ctx context.Context, r int, c transport.Comm) error {
				return AdasumAllreduce(ctx, c, make([]byte, tc.buf), tc.t, tc.counts)
			})
			for r, err := range errs {
				if err == nil || !strings.Contains(err.Error(), tc.want) {
					t.Errorf("rank %d: got %v, want an error saying %q", r, err, tc.want)
				}
			}
		})
	}
}

// Survivors of a rank killed mid-op fail with an error that wraps ErrPeerLost, names the dead rank
// and says it was the adasum allreduce. With 3 ranks rank 0 talks to both others at every step
// (rank 2 folds into it, rank 1 is its halving partner); with 2 each only has the other.
func TestAdasumRankKilledMidOp(t *testing.T) {
	const elems = 3000
	for _, tc := range []struct {
		n, dead int
		killAt  []int
	}{
		{3, 0, []int{1, 2, 3, 4, 5, 6, 7, 8}},
		{2, 1, []int{1, 2, 3, 4}},
	} {
		for _, killAt := range tc.killAt {
			t.Run(fmt.Sprintf("n=%d/call=%d", tc.n, killAt), func(t *testing.T) {
				ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
				defer cancel()
				eps := inmem.New(tc.n, inmem.WithoutShared())
				defer func() {
					for _, e := range eps {
						e.Close()
					}
				}()
				errs := make([]error, tc.n)
				var wg sync.WaitGroup
				for r, e := range eps {
					var c transport.Comm = e.Comm()
					if r == tc.dead {
						c = &dyingComm{Comm: c, ep: e, killAt: killAt}
					}
					wg.Go(func() {
						buf := make([]byte, 4*elems)
						for i := range elems {
							le.PutUint32(buf[4*i:], math.Float32bits(float32(r+i%7)))
						}
						// Two ops, so kill points beyond the first op's calls land in the second.
						for range 2 {
							if errs[r] = AdasumAllreduce(ctx, c, buf, dtype.Float32, []int{1000, 2000}); errs[r] != nil {
								return
							}
						}
					})
				}
				wg.Wait()
				for r, err := range errs {
					if r == tc.dead {
						if !errors.Is(err, errDied) {
							t.Errorf("the dying rank returned %v", err)
						}
						continue
					}
					wantPeerLost(t, fmt.Sprintf("rank %d", r), err, tc.dead)
					if err != nil && !strings.Contains(err.Error(), "adasum allreduce") {
						t.Errorf("rank %d: error %q does not say it was the adasum allreduce", r, err)
					}
				}
			})
		}
	}
}

// A rank that never arrives leaves the others waiting until their ctx ends.
func TestAdasumContextCancel(t *testing.T) {
	for _, n := range []int{3, 4} {
		t.Run(fmt.Sprintf("n=%d", n), func(t *testing.T) {
			eps := inmem.New(n, inmem.WithoutShared())
			defer func() {
				for _, e := range eps {
					e.Close()
				}
			}()
			ctx, cancel := context.WithCancel(context.Background())
			errs := make([]error, n-1)
			var wg sync.WaitGroup
			for r := range n - 1 { // rank n-1 never calls
				wg.Go(func() {
					errs[r] = AdasumAllreduce(ctx, eps[r].Comm(), make([]byte, 40_000), dtype.Float32, nil)
				})
			}
			cancel()
			wg.Wait()
			for r, err := range errs {
				if !errors.Is(err, context.Canceled) {
					t.Errorf("rank %d: got %v, want an error wrapping context.Canceled", r, err)
				}
			}
		})
	}
}

// Repeating an Adasum allreduce of one size allocates nothing once the scratch pool is warm,
// however large the buffer (the received halves live in the half each rank sent away).
func TestAdasumAllocatesNothingInSteadyState(t *testing.T) {
	for _, shape := range []struct {
		n, bytes int
		t        dtype.DType
	}{{2, 4 << 10, dtype.Float32}, {3, 100_000, dtype.Float16}, {4, 3 << 20, dtype.Float32}, {5, 4 << 10, dtype.BFloat16}} {
		t.Run(fmt.Sprintf("n=%d/%d/%v", shape.n, shape.bytes, shape.t), func(t *testing.T) {
			bufs := make([][]byte, shape.n)
			for r := range bufs {
				bufs[r] = genInput(rand.New(rand.NewPCG(uint64(r), 5)), shape.t, reduce.Sum, shape.bytes/shape.t.Size())
			}
			es := shape.t.Size()
			counts := []int{shape.bytes/es - 100, 100}
			l := newRankLoop(shape.n, []inmem.Option{inmem.WithoutShared()}, func(ctx context.Context, r int, c transport.Comm) error {
				return AdasumAllreduce(ctx, c, bufs[r], shape.t, counts)
			})
			defer l.stop()
			l.mustNotAllocate(t)
		})
	}
}

// BenchmarkAdasum compares the Adasum allreduce with a sum allreduce by message passing (the
// ring, which Allreduce picks at these sizes without shared memory) over inmem, float32, warm
// buffers. Both run with every rank a goroutine of one process on the machine's cores.
func BenchmarkAdasum(b *testing.B) {
	for _, size := range []int{4 << 20, 64 << 20} {
		for _, n := range []int{2, 4} {
			for _, op := range []string{"adasum", "sum"} {
				b.Run(fmt.Sprintf("%s/ranks=%d/bytes=%d", op, n, size), func(b *testing.B) {
					bufs := make([][]byte, n)
					for r := range bufs {
						bufs[r] = genTiled(rand.New(rand.NewPCG(uint64(r), 6)), dtype.Float32, reduce.Sum, size/4)
					}
					l := newRankLoop(n, []inmem.Option{inmem.WithoutShared()}, func(ctx context.Context, r int, c transport.Comm) error {
						if op == "adasum" {
							return AdasumAllreduce(ctx, c, bufs[r], dtype.Float32, nil)
						}
						return Allreduce(ctx, c, bufs[r], dtype.Float32, reduce.Sum, nil)
					})
					defer l.stop()
					if err := l.run(); err != nil { // warm buffers and pool
						b.Fatal(err)
					}
					b.SetBytes(int64(size))
					b.ReportAllocs()
					b.ResetTimer()
					for b.Loop() {
						if err := l.run(); err != nil {
							b.Fatal(err)
						}
					}
				})
			}
		}
	}
}
