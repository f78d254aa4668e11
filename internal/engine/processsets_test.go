//go:build linux

package engine

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/kolo-dl/kolo/internal/dtype"
	"github.com/kolo-dl/kolo/internal/engine/negotiate"
	"github.com/kolo-dl/kolo/internal/reduce"
)

// every runs f on each rank of c concurrently (collective calls) and reports the errors.
func every(t *testing.T, c *cluster, f func(r int, e *Engine) error) {
	t.Helper()
	errs := make([]error, len(c.engines))
	var wg sync.WaitGroup
	for r, e := range c.engines {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[r] = f(r, e)
		}()
	}
	wg.Wait()
	for r, err := range errs {
		if err != nil {
			t.Fatalf("rank %d: %v", r, err)
		}
	}
}

// addSets registers each list of ranks, in order, on every rank and returns the ids.
func addSets(t *testing.T, c *cluster, lists ...[]int) []int {
	t.Helper()
	ids := make([][]int, len(c.engines))
	every(t, c, func(r int, e *Engine) error {
		for _, l := range lists {
			id, err := e.AddProcessSet(waitCtx(t), l)
			if err != nil {
				return err
			}
			ids[r] = append(ids[r], id)
		}
		return nil
	})
	for r := range ids {
		if !slices.Equal(ids[r], ids[0]) {
			t.Fatalf("rank %d got set ids %v, rank 0 got %v", r, ids[r], ids[0])
		}
	}
	return ids[0]
}

func inSetReq(req negotiate.Request, set int) negotiate.Request {
	req.Set = set
	return req
}

// Sets {0,1} and {1,2} at 3 ranks: each runs without the rank outside it doing anything (rank 2
// blocked, then rank 0 blocked: rank 0 must coordinate set {1,2} with nobody waiting on it), both
// run concurrently with the same names, and every collective works within a set.
func TestProcessSetsRunIndependently(t *testing.T) {
	transports(t, 3, DefaultConfig(), func(t *testing.T, c *cluster) {
		ctx := waitCtx(t)
		ids := addSets(t, c, []int{1, 0}, []int{1, 2})
		a, b := ids[0], ids[1]
		if a == 0 || b == 0 || a == b {
			t.Fatalf("set ids %d, %d", a, b)
		}
		if ranks, ok := c.engines[2].ProcessSetRanks(a); !ok || !slices.Equal(ranks, []int{0, 1}) {
			t.Fatalf("set %d has ranks %v, %v", a, ranks, ok)
		}
		allreduce := func(r, set int, name string, v float32) ([]byte, *Handle) {
			buf := f32(v, 2*v)
			return buf, c.engines[r].Enqueue(inSetReq(allreduceReq(name, 2), set), buf, buf)
		}
		check := func(what string, buf []byte, h *Handle, want ...float32) {
			t.Helper()
			if err := h.Wait(ctx); err != nil {
				t.Fatalf("%s: %v", what, err)
			}
			if got := getF32(buf); !slices.Equal(got, want) {
				t.Fatalf("%s: got %v, want %v", what, got, want)
			}
		}
		// Set a while rank 2 does nothing at all.
		for i := range 5 {
			name := fmt.Sprintf("x%d", i)
			b0, h0 := allreduce(0, a, name, 1)
			b1, h1 := allreduce(1, a, name, 10)
			check("set a rank 0", b0, h0, 11, 22)
			check("set a rank 1", b1, h1, 11, 22)
		}
		// Set b while rank 0, its coordinator, waits on nothing.
		for i := range 5 {
			name := fmt.Sprintf("x%d", i)
			b1, h1 := allreduce(1, b, name, 10)
			b2, h2 := allreduce(2, b, name, 100)
			check("set b rank 2", b2, h2, 110, 220)
			check("set b rank 1", b1, h1, 110, 220)
		}
		// Both at once, the same name in flight in each, and the global set too.
		ba0, ha0 := allreduce(0, a, "same", 1)
		bb2, hb2 := allreduce(2, b, "same", 100)
		bg := [3][]byte{}
		hg := [3]*Handle{}
		for r := range 3 {
			bg[r], hg[r] = allreduce(r, 0, "same", float32(r+1))
		}
		ba1, ha1 := allreduce(1, a, "same", 10)
		bb1, hb1 := allreduce(1, b, "same", 10)
		check("a", ba0, ha0, 11, 22)
		check("a", ba1, ha1, 11, 22)
		check("b", bb1, hb1, 110, 220)
		check("b", bb2, hb2, 110, 220)
		for r := range 3 {
			check("global", bg[r], hg[r], 6, 12)
		}

		// Every collective within set b (ranks 1, 2): broadcast from job rank 2, average over 2
		// ranks, allgather, alltoall with a split per member, reducescatter, barrier.
		every(t, c, func(r int, e *Engine) error {
			if r == 0 {
				return nil
			}
			me := r - 1 // rank in set b
			bc := f32(float32(r), float32(r))
			if err := e.Enqueue(negotiate.Request{Name: "bc", Kind: negotiate.Broadcast, DType: dtype.Float32, Shape: []int64{2}, Root: 2, Set: b}, bc, bc).Wait(ctx); err != nil {
				return err
			}
			if got := getF32(bc); got[0] != 2 || got[1] != 2 {
				return fmt.Errorf("broadcast from rank 2: %v", got)
			}
			avg := f32(float32(r))
			req := allreduceReq("avg", 1)
			req.Set, req.Average = b, true
			if err := e.Enqueue(req, avg, avg).Wait(ctx); err != nil {
				return err
			}
			if got := getF32(avg)[0]; got != 1.5 {
				return fmt.Errorf("average over the set: %v, want 1.5", got)
			}
			g := e.Enqueue(negotiate.Request{Name: "ag", Kind: negotiate.Allgather, DType: dtype.Float32, Shape: []int64{int64(r)}, Set: b}, f32(slices.Repeat([]float32{float32(r)}, r)...), nil)
			if err := g.Wait(ctx); err != nil {
				return err
			}
			if got := getF32(g.Output()); !slices.Equal(got, []float32{1, 2, 2}) {
				return fmt.Errorf("allgather: %v", got)
			}
			a2a := e.Enqueue(negotiate.Request{Name: "a2a", Kind: negotiate.Alltoall, DType: dtype.Float32, Shape: []int64{2}, Splits: []int64{1, 1}, Set: b},
				f32(float32(10*r), float32(10*r+1)), nil)
			if err := a2a.Wait(ctx); err != nil {
				return err
			}
			if got, want := getF32(a2a.Output()), []float32{10, 20}; me == 1 {
				want = []float32{11, 21}
				if !slices.Equal(got, want) {
					return fmt.Errorf("alltoall: %v, want %v", got, want)
				}
			} else if !slices.Equal(got, want) {
				return fmt.Errorf("alltoall: %v, want %v", got, want)
			}
			rs := e.Enqueue(negotiate.Request{Name: "rs", Kind: negotiate.ReduceScatter, DType: dtype.Float32, Shape: []int64{3}, ReduceOp: uint8(reduce.Sum), Set: b},
				f32(1, 2, 3), nil)
			if err := rs.Wait(ctx); err != nil {
				return err
			}
			want := [][]float32{{2, 4}, {6}}[me]
			if got := getF32(rs.Output()); !slices.Equal(got, want) {
				return fmt.Errorf("reducescatter: %v, want %v", got, want)
			}
			return e.Enqueue(negotiate.Request{Name: "bar", Kind: negotiate.Barrier, Set: b}, nil, nil).Wait(ctx)
		})

		// Removal is collective too; the sets are gone everywhere afterwards.
		every(t, c, func(r int, e *Engine) error {
			return errors.Join(e.RemoveProcessSet(ctx, a), e.RemoveProcessSet(ctx, b))
		})
		for r := 1; r < 3; r++ {
			buf := f32(1)
			err := c.engines[r].Enqueue(inSetReq(allreduceReq("gone", 1), b), buf, buf).Wait(ctx)
			if err == nil || !strings.Contains(err.Error(), fmt.Sprintf("no process set %d", b)) {
				t.Errorf("rank %d: op in a removed set: %v", r, err)
			}
		}
		if _, ok := c.engines[0].ProcessSetRanks(b); ok {
			t.Error("rank 0 still lists the removed set")
		}
	})
}

func TestProcessSetErrors(t *testing.T) {
	c := newCluster(t, 3, DefaultConfig())
	ctx := waitCtx(t)
	// Ranks that disagree all get the same error, saying what each sent.
	msgs := make([]string, 3)
	every(t, c, func(r int, e *Engine) error {
		ranks := []int{1, 2}
		if r == 0 {
			ranks = []int{0, 1}
		}
		_, err := e.AddProcessSet(ctx, ranks)
		if err == nil {
			return errors.New("mismatched AddProcessSet succeeded")
		}
		msgs[r] = strings.TrimPrefix(err.Error(), fmt.Sprintf("add process set %v: rank %d: ", ranks, r))
		return nil
	})
	want := "process set change: ranks disagree (every rank must make the same call, in the same order): " +
		"rank 0 sent add process set [0 1]; ranks 1,2 sent add process set [1 2]"
	for r, m := range msgs {
		if m != want {
			t.Errorf("rank %d: %q\nwant %q", r, m, want)
		}
	}
	// A valid set, then a duplicate of it, and removing the global set.
	id := addSets(t, c, []int{0, 2})[0]
	every(t, c, func(r int, e *Engine) error {
		if _, err := e.AddProcessSet(ctx, []int{2, 0}); err == nil || !strings.Contains(err.Error(), "already has these ranks") {
			return fmt.Errorf("duplicate set: %v", err)
		}
		if err := e.RemoveProcessSet(ctx, 0); err == nil || !strings.Contains(err.Error(), "global process set cannot be removed") {
			return fmt.Errorf("removing the global set: %v", err)
		}
		return nil
	})
	buf := f32(1)
	for _, tc := range []struct {
		r    int
		req  negotiate.Request
		want string
	}{
		{1, inSetReq(allreduceReq("x", 1), id), fmt.Sprintf("rank 1: allreduce \"x\": this rank is not in process set %d (ranks [0 2])", id)},
		{0, inSetReq(allreduceReq("x", 1), 99), "no process set 99"},
		{0, negotiate.Request{Name: "j", Kind: negotiate.Join, Set: id}, "join works on the global process set only"},
		{0, negotiate.Request{Name: "bc", Kind: negotiate.Broadcast, DType: dtype.Float32, Shape: []int64{1}, Root: 1, Set: id}, "root rank 1 is not in process set"},
		{0, negotiate.Request{Name: "a", Kind: negotiate.Alltoall, DType: dtype.Float32, Shape: []int64{1}, Splits: []int64{1, 0, 0}, Set: id}, "3 splits for 2 ranks"},
		{0, inSetReq(allreduceReq(setChangePrefix+"7", 1), 0), "kolo's own"},
	} {
		if err := c.engines[tc.r].Enqueue(tc.req, buf, buf).Wait(ctx); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("rank %d %+v: %v, want %q", tc.r, tc.req, err, tc.want)
		}
	}
	// A mismatch within a set names job ranks and the set.
	h0 := c.engines[0].Enqueue(inSetReq(allreduceReq("m", 1), id), f32(1), f32(0))
	h2 := c.engines[2].Enqueue(inSetReq(allreduceReq("m", 2), id), f32(1, 2), f32(0, 0))
	for _, h := range []*Handle{h0, h2} {
		err := h.Wait(ctx)
		var oe *OpError
		if !errors.As(err, &oe) || !strings.Contains(err.Error(), fmt.Sprintf("process set %d: allreduce \"m\": mismatched shapes: rank 0 sent [1] float32; rank 2 sent [2] float32", id)) {
			t.Errorf("mismatch in a set: %v", err)
		}
	}
}

// Removing a set fails what its members still had pending in it, and nothing else.
func TestRemovingSetFailsPending(t *testing.T) {
	transports(t, 3, DefaultConfig(), func(t *testing.T, c *cluster) {
		ctx := waitCtx(t)
		id := addSets(t, c, []int{1, 2})[0]
		buf := f32(1)
		h := c.engines[2].Enqueue(inSetReq(allreduceReq("orphan", 1), id), buf, buf) // rank 1 never submits it
		every(t, c, func(r int, e *Engine) error { return e.RemoveProcessSet(ctx, id) })
		if err := h.Wait(ctx); err == nil || !strings.Contains(err.Error(), fmt.Sprintf("process set %d was removed", id)) {
			t.Fatalf("pending op of a removed set: %v", err)
		}
		// The job goes on, and ids are not reused.
		if id2 := addSets(t, c, []int{1, 2})[0]; id2 <= id {
			t.Fatalf("new set got id %d after %d", id2, id)
		}
		every(t, c, func(r int, e *Engine) error {
			b := f32(float32(r))
			if err := e.Enqueue(allreduceReq("after", 1), b, b).Wait(ctx); err != nil {
				return err
			}
			if got := getF32(b)[0]; got != 3 {
				return fmt.Errorf("got %v", got)
			}
			return nil
		})
	})
}

// Horovod-style training loops in two overlapping sets and the global one at once, many steps,
// async ops waited in reverse: no deadlock, every result right.
func TestOverlappingSetsUnderLoad(t *testing.T) {
	transports(t, 4, DefaultConfig(), func(t *testing.T, c *cluster) {
		ctx := waitCtx(t)
		lists := [][]int{{0, 1, 2}, {1, 2, 3}, {0, 3}}
		ids := addSets(t, c, lists...)
		every(t, c, func(r int, e *Engine) error {
			for step := range 20 {
				type op struct {
					buf  []byte
					h    *Handle
					want float32
				}
				var ops []op
				for k, l := range lists {
					if !slices.Contains(l, r) {
						continue
					}
					var want float32
					for _, m := range l {
						want += float32(m + step)
					}
					buf := f32(float32(r + step))
					ops = append(ops, op{buf, e.Enqueue(inSetReq(allreduceReq(fmt.Sprintf("g%d", step%3), 1), ids[k]), buf, buf), want})
				}
				buf := f32(1)
				ops = append(ops, op{buf, e.Enqueue(allreduceReq(fmt.Sprintf("g%d", step%3), 1), buf, buf), 4})
				for i := len(ops) - 1; i >= 0; i-- {
					if err := ops[i].h.Wait(ctx); err != nil {
						return fmt.Errorf("step %d: %w", step, err)
					}
					if got := getF32(ops[i].buf)[0]; got != ops[i].want {
						return fmt.Errorf("step %d op %d: %v, want %v", step, i, got, ops[i].want)
					}
				}
			}
			return nil
		})
	})
}

// A rank that joined still applies a set change the others make (with the same verdict: it
// proposed nothing), so every rank's table stays the same.
func TestSetChangeWhileJoined(t *testing.T) {
	c := newCluster(t, 3, DefaultConfig())
	ctx := waitCtx(t)
	jh := c.engines[2].Enqueue(negotiate.Request{Name: "join", Kind: negotiate.Join}, nil, nil)
	var wg sync.WaitGroup
	errs := make([]error, 2)
	for r := range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, errs[r] = c.engines[r].AddProcessSet(ctx, []int{0, 1})
		}()
	}
	wg.Wait()
	for r, err := range errs {
		if err == nil || !strings.Contains(err.Error(), "rank 2 proposed none (it had joined)") {
			t.Errorf("rank %d: %v", r, err)
		}
	}
	every(t, c, func(r int, e *Engine) error {
		if r == 2 {
			return jh.Wait(ctx)
		}
		return e.Enqueue(negotiate.Request{Name: "join", Kind: negotiate.Join}, nil, nil).Wait(ctx)
	})
	for r, e := range c.engines {
		if _, ok := e.ProcessSetRanks(1); ok {
			t.Errorf("rank %d registered a set that failed", r)
		}
	}
}
