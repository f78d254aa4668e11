package engine

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kolo-dl/kolo/internal/dtype"
	"github.com/kolo-dl/kolo/internal/engine/negotiate"
	"github.com/kolo-dl/kolo/internal/reduce"
	"github.com/kolo-dl/kolo/internal/transport"
	"github.com/kolo-dl/kolo/internal/transport/inmem"
)

// Who is stuck, from the stall notices the ranks sent: the end of the chain of waits that starts
// at the rank this one blamed, and in a cycle the rank most notices name.
func TestStallReason(t *testing.T) {
	note := func(from, on int) negotiate.Abort {
		return negotiate.Abort{Rank: from, Reason: fmt.Sprintf("%d waited on %d", from, on), Stalled: true, StalledOn: on}
	}
	tests := []struct {
		name  string
		first negotiate.Abort
		more  []negotiate.Abort
		want  string
	}{
		{"alone", note(0, 1), nil, "0 waited on 1"},
		{"blamed the stuck rank", note(2, 1), []negotiate.Abort{note(0, 2), note(3, 2)}, "2 waited on 1"},
		{"blamed a rank that waits", note(0, 2), []negotiate.Abort{note(2, 1)}, "2 waited on 1"},
		{"long chain", note(0, 3), []negotiate.Abort{note(3, 2), note(2, 1), note(4, 1)}, "2 waited on 1"},
		{"lowest of several naming it", note(5, 4), []negotiate.Abort{note(4, 1), note(3, 1), note(2, 1)}, "2 waited on 1"},
		{"learned from a notice", note(3, 2), []negotiate.Abort{note(2, 1)}, "2 waited on 1"},
		{"stuck rank resumed and blamed back", note(1, 0), []negotiate.Abort{note(0, 1), note(2, 1), note(3, 2)}, "0 waited on 1"},
		{"mutual wait", note(1, 0), []negotiate.Abort{note(0, 1)}, "1 waited on 0"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			notes := map[int]negotiate.Abort{tc.first.Rank: tc.first}
			for _, n := range tc.more {
				notes[n.Rank] = n
			}
			got, stuck := stallReason(notes, tc.first)
			if got != tc.want {
				t.Errorf("got %q, want %q", got, tc.want)
			}
			// The reason is the notice of a rank that waited on the stuck one.
			if want := tc.want[strings.LastIndexByte(tc.want, ' ')+1:]; strconv.Itoa(stuck) != want {
				t.Errorf("stuck rank %d, want %s", stuck, want)
			}
		})
	}
}

// stallCluster is n engines over inmem with a progress timeout of limit on both.
func stallCluster(t *testing.T, n int, limit time.Duration, opts ...inmem.Option) *cluster {
	captureLog(t)
	cfg := DefaultConfig()
	cfg.ProgressTimeout = limit
	c := newClusterWith(t, n, cfg, append(opts, inmem.WithProgressTimeout(limit)), nil)
	t.Cleanup(func() {
		for _, ep := range c.eps {
			ep.Resume()
		}
	})
	return c
}

// allreduceAll submits one allreduce of a size-byte tensor of ones on every rank and returns each
// rank's result, and its buffer, on the channel.
type ranked struct {
	rank int
	err  error
	buf  []byte
	took time.Duration
}

func allreduceAll(ctx context.Context, c *cluster, name string, floats int) <-chan ranked {
	out := make(chan ranked, len(c.engines))
	for r, e := range c.engines {
		go func() {
			vals := make([]float32, floats)
			for i := range vals {
				vals[i] = float32(r + 1)
			}
			buf := f32(vals...)
			start := time.Now()
			err := e.Enqueue(allreduceReq(name, floats), buf, buf).Wait(ctx)
			out <- ranked{r, err, buf, time.Since(start)}
		}()
	}
	return out
}

// A rank that stops inside a ring allreduce (paused: alive, silent) fails the op on every other
// rank after the progress timeout, each naming it and its host, although two of them wait on it
// only through a rank that waits on it (the ring's chain); the stuck rank, once it runs again and
// finds its peers gone, fails too, naming itself.
func TestStalledRankFailsEveryRank(t *testing.T) {
	const n, limit = 4, 300 * time.Millisecond
	c := stallCluster(t, n, limit, inmem.WithoutShared())
	ctx := waitCtx(t)
	c.eps[1].Pause() // it negotiates, then stops at its first transfer
	// 1 MiB: the ring.
	results := allreduceAll(ctx, c, "w", 256<<10)
	want := "rank 1 (memhost) made no progress for 300ms"
	for range n - 1 {
		res := <-results
		if res.rank == 1 {
			t.Fatalf("the paused rank's op returned: %v", res.err)
		}
		if res.err == nil || !strings.Contains(res.err.Error(), want) || !strings.Contains(res.err.Error(), `allreduce "w"`) {
			t.Errorf("rank %d: err = %v, want one with %q", res.rank, res.err, want)
		}
		if !errors.Is(res.err, transport.ErrStalled) && !strings.Contains(res.err.Error(), "made no progress") {
			t.Errorf("rank %d: %v", res.rank, res.err)
		}
		if max := limit + stallListen(limit) + time.Second; res.took > max {
			t.Errorf("rank %d failed after %v, want within %v", res.rank, res.took, max)
		}
		// The engine's own error says which rank is stuck (an elastic worker names it to the
		// launcher), whether this rank waited on it directly or through another.
		var stuck *StuckError
		if !errors.As(c.engines[res.rank].Err(), &stuck) || stuck.Rank != 1 {
			t.Errorf("rank %d: engine error %#v, want a *StuckError naming rank 1", res.rank, c.engines[res.rank].Err())
		}
	}
	// The others' processes exit; the stuck rank runs again.
	for r, ep := range c.eps {
		if r != 1 {
			ep.Close()
		}
	}
	c.eps[1].Resume()
	select {
	case res := <-results:
		if res.err == nil || !strings.Contains(res.err.Error(), want) {
			t.Errorf("resumed rank: err = %v, want one with %q", res.err, want)
		}
	case <-time.After(3 * time.Second):
		t.Fatal("the resumed rank still waits 3 s after its peers left")
	}
}

// The same over shared slots at 2 ranks: the other rank waits at a barrier.
func TestStalledRankAtBarrier(t *testing.T) {
	const n, limit = 2, 300 * time.Millisecond
	c := stallCluster(t, n, limit)
	c.eps[1].Pause()
	res := <-allreduceAll(waitCtx(t), c, "s", 64<<10)
	if want := "rank 1 (memhost) made no progress for 300ms (barrier"; res.rank != 0 || res.err == nil || !strings.Contains(res.err.Error(), want) {
		t.Errorf("rank %d: err = %v, want one with %q", res.rank, res.err, want)
	}
}

// A rank paused for most of the timeout, while the others wait on it inside the collective, costs
// nothing: every rank gets the right sum.
func TestResumeBeforeProgressDeadline(t *testing.T) {
	const n, limit = 3, 400 * time.Millisecond
	for _, shared := range []bool{false, true} {
		t.Run(fmt.Sprintf("shared=%v", shared), func(t *testing.T) {
			var opts []inmem.Option
			if !shared {
				opts = append(opts, inmem.WithoutShared())
			}
			c := stallCluster(t, n, limit, opts...)
			c.eps[2].Pause()
			time.AfterFunc(limit*3/4, c.eps[2].Resume)
			const floats = 100_000
			want := f32(slices.Repeat([]float32{1 + 2 + 3}, floats)...)
			results := allreduceAll(waitCtx(t), c, "r", floats)
			for range n {
				res := <-results
				if res.err != nil {
					t.Fatalf("rank %d: %v", res.rank, res.err)
				}
				if !bytes.Equal(res.buf, want) {
					t.Errorf("rank %d: wrong sum", res.rank)
				}
			}
		})
	}
}

// A rank that stops before an alltoall, allgather or reduce-scatter that goes through the shared
// slots (4 ranks on one host) fails the op on every other rank after the progress timeout, naming
// it, as the allreduce does: the exchanges wait at the same barriers.
func TestStalledRankInSharedExchange(t *testing.T) {
	const n, limit, floats = 4, 300 * time.Millisecond, 40_000
	for _, tc := range []struct {
		name string
		req  negotiate.Request
	}{
		{"alltoall", negotiate.Request{Name: "x", Kind: negotiate.Alltoall, DType: dtype.Float32, Shape: []int64{floats},
			Splits: slices.Repeat([]int64{floats / n}, n)}},
		{"allgather", negotiate.Request{Name: "x", Kind: negotiate.Allgather, DType: dtype.Float32, Shape: []int64{floats}}},
		{"reducescatter", negotiate.Request{Name: "x", Kind: negotiate.ReduceScatter, DType: dtype.Float32, Shape: []int64{floats},
			ReduceOp: uint8(reduce.Sum)}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := stallCluster(t, n, limit, inmem.WithSlotBytes(64<<10))
			ctx := waitCtx(t)
			c.eps[2].Pause()
			type res struct {
				rank int
				err  error
			}
			out := make(chan res, n)
			for r, e := range c.engines {
				go func() {
					out <- res{r, e.Enqueue(tc.req, make([]byte, 4*floats), nil).Wait(ctx)}
				}()
			}
			want := "rank 2 (memhost) made no progress for 300ms"
			for range n - 1 {
				got := <-out
				if got.rank == 2 {
					t.Fatalf("the paused rank's op returned: %v", got.err)
				}
				if got.err == nil || !strings.Contains(got.err.Error(), want) || !strings.Contains(got.err.Error(), tc.name+` "x"`) ||
					!strings.Contains(got.err.Error(), "shared") {
					t.Errorf("rank %d: err = %v, want one with %q, the op and its shared algorithm", got.rank, got.err, want)
				}
			}
		})
	}
}

// A rank paused for most of the timeout before a shared-slot alltoall and allgather costs nothing:
// every rank gets the right blocks.
func TestResumeBeforeProgressDeadlineInSharedExchange(t *testing.T) {
	const n, limit, per = 3, 400 * time.Millisecond, 10_000 // floats each rank sends each rank
	c := stallCluster(t, n, limit, inmem.WithSlotBytes(64<<10))
	c.eps[2].Pause()
	time.AfterFunc(limit*3/4, c.eps[2].Resume)
	ctx := waitCtx(t)
	errs := make(chan error, n)
	for r, e := range c.engines {
		go func() {
			in := make([]float32, n*per)
			for i := range in {
				in[i] = float32(r*1_000_000 + i) // block q of rank r: r*1e6 + q*per + j
			}
			a2a := e.Enqueue(negotiate.Request{Name: "a2a", Kind: negotiate.Alltoall, DType: dtype.Float32, Shape: []int64{n * per},
				Splits: slices.Repeat([]int64{per}, n)}, f32(in...), nil)
			if err := a2a.Wait(ctx); err != nil {
				errs <- fmt.Errorf("rank %d: alltoall: %w", r, err)
				return
			}
			got := getF32(a2a.Output())
			for q := range n {
				for j := range per {
					if want := float32(q*1_000_000 + r*per + j); got[q*per+j] != want {
						errs <- fmt.Errorf("rank %d: alltoall: block from %d, element %d = %v, want %v", r, q, j, got[q*per+j], want)
						return
					}
				}
			}
			ag := e.Enqueue(negotiate.Request{Name: "ag", Kind: negotiate.Allgather, DType: dtype.Float32, Shape: []int64{n * per}}, f32(in...), nil)
			if err := ag.Wait(ctx); err != nil {
				errs <- fmt.Errorf("rank %d: allgather: %w", r, err)
				return
			}
			got = getF32(ag.Output())
			for q := range n {
				if want := float32(q*1_000_000 + n*per - 1); got[(q+1)*n*per-1] != want {
					errs <- fmt.Errorf("rank %d: allgather: rank %d's block ends with %v, want %v", r, q, got[(q+1)*n*per-1], want)
					return
				}
			}
			errs <- nil
		}()
	}
	for range n {
		if err := <-errs; err != nil {
			t.Error(err)
		}
	}
}
