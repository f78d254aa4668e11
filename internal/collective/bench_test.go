package collective

import (
	"context"
	"fmt"
	"testing"

	"github.com/kolo-dl/kolo/internal/dtype"
	"github.com/kolo-dl/kolo/internal/reduce"
	"github.com/kolo-dl/kolo/internal/transport"
	"github.com/kolo-dl/kolo/internal/transport/inmem"
)

// rankLoop keeps one goroutine per rank alive across runs, so that a run is "every rank does op
// once" with no goroutine start-up in it: what AllocsPerRun and benchmarks need to measure.
type rankLoop struct {
	start []chan struct{}
	done  chan error
	eps   []*inmem.Endpoint
}

func newRankLoop(n int, opts []inmem.Option, op func(ctx context.Context, r int, c transport.Comm) error) *rankLoop {
	eps := inmem.New(n, opts...)
	comms := make([]transport.Comm, n)
	for r, e := range eps {
		comms[r] = e.Comm()
	}
	l := startLoop(comms, op)
	l.eps = eps
	return l
}

// startLoop is newRankLoop over Comms of any transport, which the caller closes.
func startLoop(comms []transport.Comm, op func(ctx context.Context, r int, c transport.Comm) error) *rankLoop {
	l := &rankLoop{done: make(chan error, len(comms))}
	ctx := context.Background()
	for r, c := range comms {
		start := make(chan struct{})
		l.start = append(l.start, start)
		go func() {
			for range start {
				l.done <- op(ctx, r, c)
			}
		}()
	}
	return l
}

// run makes every rank do the op once.
func (l *rankLoop) run() error {
	for _, s := range l.start {
		s <- struct{}{}
	}
	var first error
	for range l.start {
		if err := <-l.done; err != nil && first == nil {
			first = err
		}
	}
	return first
}

// mustNotAllocate fails t unless an op on every rank, in steady state, allocates nothing.
func (l *rankLoop) mustNotAllocate(t *testing.T) {
	t.Helper()
	var err error
	allocs := testing.AllocsPerRun(5, func() {
		if e := l.run(); e != nil {
			err = e
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	if allocs != 0 {
		t.Errorf("%.1f allocations per op on %d ranks", allocs, len(l.start))
	}
}

func (l *rankLoop) stop() {
	for _, s := range l.start {
		close(s)
	}
	for _, e := range l.eps {
		e.Close()
	}
}

var benchAlgos = []struct {
	name string
	opts []inmem.Option
	run  allreduceFunc
}{
	{"ring", []inmem.Option{inmem.WithoutShared()}, RingAllreduce},
	{"recursive-doubling", []inmem.Option{inmem.WithoutShared()}, RecursiveDoublingAllreduce},
	{"shared", []inmem.Option{inmem.WithSlotBytes(4 << 20)}, sharedRun},
}

// Repeating an allreduce of one size allocates nothing once the scratch pool is warm.
func TestAllreduceAllocatesNothingInSteadyState(t *testing.T) {
	for _, algo := range benchAlgos {
		for _, shape := range []struct{ n, bytes int }{{2, 4 << 10}, {3, 100_000}, {4, 3 << 20}, {5, 4 << 10}} {
			t.Run(fmt.Sprintf("%s/n=%d/%d", algo.name, shape.n, shape.bytes), func(t *testing.T) {
				bufs := make([][]byte, shape.n)
				for r := range bufs {
					bufs[r] = make([]byte, shape.bytes)
				}
				l := newRankLoop(shape.n, algo.opts, func(ctx context.Context, r int, c transport.Comm) error {
					return algo.run(ctx, c, bufs[r], dtype.Float32, reduce.Sum)
				})
				defer l.stop()
				l.mustNotAllocate(t)
			})
		}
	}
}

// BenchmarkAllreduce measures the algorithms over inmem with warm buffers. inmem's pipes buffer
// 64 KiB and copy under a mutex, so the numbers compare algorithms' step counts and reduce work
// on one machine, not what a network would give.
func BenchmarkAllreduce(b *testing.B) {
	for _, algo := range benchAlgos {
		for _, n := range []int{2, 4} {
			for _, size := range []int{4 << 10, 16 << 10, 32 << 10, 64 << 10, 256 << 10, 1 << 20, 16 << 20} {
				b.Run(fmt.Sprintf("%s/ranks=%d/bytes=%d", algo.name, n, size), func(b *testing.B) {
					bufs := make([][]byte, n)
					for r := range bufs {
						bufs[r] = make([]byte, size)
					}
					l := newRankLoop(n, algo.opts, func(ctx context.Context, r int, c transport.Comm) error {
						return algo.run(ctx, c, bufs[r], dtype.Float32, reduce.Sum)
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

// BenchmarkAverage compares an average's division folded into the shared-memory allreduce
// (AllreduceScaled) with a pass of reduce.Scale after it, on 2 ranks and a gradient-sized buffer
// that is not in cache.
func BenchmarkAverage(b *testing.B) {
	const size = 23 << 20
	for _, folded := range []bool{false, true} {
		b.Run(fmt.Sprintf("folded=%v", folded), func(b *testing.B) {
			bufs := [][]byte{make([]byte, size), make([]byte, size)}
			tun := &Tuning{}
			l := newRankLoop(2, []inmem.Option{inmem.WithSlotBytes(4 << 20)}, func(ctx context.Context, r int, c transport.Comm) error {
				if folded {
					return AllreduceScaled(ctx, c, bufs[r], dtype.Float32, reduce.Sum, 0.5, tun)
				}
				if err := Allreduce(ctx, c, bufs[r], dtype.Float32, reduce.Sum, tun); err != nil {
					return err
				}
				reduce.Scale(dtype.Float32, bufs[r], 0.5)
				return nil
			})
			defer l.stop()
			if err := l.run(); err != nil {
				b.Fatal(err)
			}
			b.SetBytes(size)
			b.ResetTimer()
			for b.Loop() {
				if err := l.run(); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
