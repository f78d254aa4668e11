package e2e

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/kolo-dl/kolo"
)

// coordinatorIdle is how long rank 0 does nothing at all (no kolo call) while set {1,2} runs.
const coordinatorIdle = 3 * time.Second

// processSetsScenario, at 3 ranks: sets {0,1} and {1,2}. Each runs while the rank outside it is
// blocked in an op of its own (or, for rank 0, the coordinator of every set, idle in a sleep); both
// run at once with the same names; every collective works within a set; errors are clear; removal
// is collective.
func processSetsScenario(ctx context.Context) error {
	rank := kolo.Rank()
	if kolo.Size() != 3 {
		return fmt.Errorf("processsets needs 3 ranks, not %d", kolo.Size())
	}
	a, err := kolo.AddProcessSet(ctx, []int{1, 0})
	if err != nil {
		return err
	}
	b, err := kolo.AddProcessSet(ctx, []int{1, 2})
	if err != nil {
		return err
	}
	if !slices.Equal(a.Ranks(), []int{0, 1}) || a.Size() != 2 || a.Included() != (rank != 2) || b.Rank() != rank-1 {
		return fmt.Errorf("sets %v (rank %d, included %v), %v (rank %d)", a, a.Rank(), a.Included(), b, b.Rank())
	}
	sum := func(set kolo.ProcessSet, name string, mine float32, want float32) error {
		v := []float32{mine, 2 * mine}
		if err := kolo.Allreduce(ctx, name, kolo.Of(v), kolo.Sum, kolo.InProcessSet(set)); err != nil {
			return err
		}
		if v[0] != want || v[1] != 2*want {
			return fmt.Errorf("%s in %v: %v, want %v", name, set, v, want)
		}
		return nil
	}
	value := []float32{1, 10, 100}[rank]

	// Set a while rank 2 is blocked in a global broadcast that needs rank 0 first: if set a's ops
	// waited for rank 2, this would deadlock.
	gate := []float32{0}
	if rank == 2 {
		if err := kolo.Broadcast(ctx, "gate.a", kolo.Of(gate), 0); err != nil {
			return err
		}
	} else {
		for i := range 20 {
			if err := sum(a, fmt.Sprintf("x%d", i), value, 11); err != nil {
				return err
			}
		}
		if err := kolo.Broadcast(ctx, "gate.a", kolo.Of(gate), 0); err != nil {
			return err
		}
	}

	// Set b while rank 0, which coordinates it, makes no kolo call at all.
	if rank == 0 {
		time.Sleep(coordinatorIdle)
	} else {
		start := time.Now()
		for i := range 20 {
			if err := sum(b, fmt.Sprintf("x%d", i), value, 110); err != nil {
				return err
			}
		}
		if d := time.Since(start); d > coordinatorIdle*2/3 {
			return fmt.Errorf("set {1,2} took %v while rank 0 was idle for %v: it waited for rank 0", d, coordinatorIdle)
		}
	}

	// Both sets and the global one at once, with the same name in flight in each.
	var hs []*kolo.Handle
	var bufs [][]float32
	var wants []float32
	submit := func(set kolo.ProcessSet, want float32) {
		v := []float32{value}
		hs = append(hs, kolo.AllreduceAsync("same", kolo.Of(v), kolo.Of(v), kolo.Sum, kolo.InProcessSet(set)))
		bufs, wants = append(bufs, v), append(wants, want)
	}
	submit(kolo.GlobalProcessSet, 111)
	if a.Included() {
		submit(a, 11)
	}
	if b.Included() {
		submit(b, 110)
	}
	for i := len(hs) - 1; i >= 0; i-- {
		if err := hs[i].Wait(ctx); err != nil {
			return err
		}
		if bufs[i][0] != wants[i] {
			return fmt.Errorf("concurrent op %d: %v, want %v", i, bufs[i][0], wants[i])
		}
	}

	// Every collective within b (job ranks 1, 2); a broadcast in a.
	if b.Included() {
		me := b.Rank()
		bc := []float32{value}
		if err := kolo.Broadcast(ctx, "bc", kolo.Of(bc), 2, kolo.InProcessSet(b)); err != nil || bc[0] != 100 {
			return fmt.Errorf("broadcast from rank 2 in %v: %v, %v", b, bc, err)
		}
		avg := []float32{value}
		if err := kolo.Allreduce(ctx, "avg", kolo.Of(avg), kolo.Average, kolo.InProcessSet(b)); err != nil || avg[0] != 55 {
			return fmt.Errorf("average in %v: %v, %v", b, avg, err)
		}
		g, err := kolo.Allgather(ctx, "", kolo.Of(slices.Repeat([]float32{value}, me+1)), kolo.InProcessSet(b))
		if err != nil || !slices.Equal(kolo.As[float32](g), []float32{10, 100, 100}) {
			return fmt.Errorf("allgather in %v: %v, %v", b, g, err)
		}
		out, recv, err := kolo.Alltoall(ctx, "a2a", kolo.Of([]float32{value, value + 1, value + 2}), []int64{1, 2}, kolo.InProcessSet(b))
		want := [][]float32{{10, 100}, {11, 12, 101, 102}}[me]
		if err != nil || !slices.Equal(kolo.As[float32](out), want) || len(recv) != 2 {
			return fmt.Errorf("alltoall in %v: %v %v, %v; want %v", b, out, recv, err, want)
		}
		rs, err := kolo.ReduceScatter(ctx, "rs", kolo.Of([]float32{1, 2, 3}), kolo.Sum, kolo.InProcessSet(b))
		if want := [][]float32{{2, 4}, {6}}[me]; err != nil || !slices.Equal(kolo.As[float32](rs), want) {
			return fmt.Errorf("reducescatter in %v: %v, %v; want %v", b, rs, err, want)
		}
		if err := kolo.Barrier(ctx, kolo.InProcessSet(b)); err != nil {
			return err
		}
	}
	if a.Included() {
		bc := []float32{value}
		if err := kolo.Broadcast(ctx, "bc", kolo.Of(bc), 1, kolo.InProcessSet(a)); err != nil || bc[0] != 10 {
			return fmt.Errorf("broadcast from rank 1 in %v: %v, %v", a, bc, err)
		}
	} else {
		err := kolo.Allreduce(ctx, "intruder", kolo.Of([]float32{1}), kolo.Sum, kolo.InProcessSet(a))
		if err == nil || !strings.Contains(err.Error(), fmt.Sprintf("this rank is not in process set %d", a.ID())) {
			return fmt.Errorf("a non-member submitting to %v: %v", a, err)
		}
	}

	// Ranks that disagree all get the same error, saying what each sent.
	ranks := []int{1, 2}
	if rank == 0 {
		ranks = []int{0, 2}
	}
	_, err = kolo.AddProcessSet(ctx, ranks)
	if err == nil || !strings.Contains(err.Error(), "rank 0 sent add process set [0 2]; ranks 1,2 sent add process set [1 2]") {
		return fmt.Errorf("mismatched AddProcessSet: %v", err)
	}

	if err := errors.Join(kolo.RemoveProcessSet(ctx, a), kolo.RemoveProcessSet(ctx, b)); err != nil {
		return err
	}
	if err := kolo.Allreduce(ctx, "late", kolo.Of([]float32{1}), kolo.Sum, kolo.InProcessSet(b)); err == nil || !strings.Contains(err.Error(), "no process set") {
		return fmt.Errorf("an op in a removed set: %v", err)
	}
	return kolo.Barrier(ctx)
}

// timelineScenario runs a few known ops; the test started the job with KOLO_TIMELINE and reads
// the file rank 0 wrote.
func timelineScenario(ctx context.Context) error {
	var hs []*kolo.Handle
	for _, name := range []string{"tl.a", "tl.b"} {
		v := []float32{1, 2, 3}
		hs = append(hs, kolo.AllreduceAsync(name, kolo.Of(v), kolo.Of(v), kolo.Sum))
	}
	for _, h := range hs {
		if err := h.Wait(ctx); err != nil {
			return err
		}
	}
	if _, err := kolo.Allgather(ctx, "tl.g", kolo.Of([]float32{1})); err != nil {
		return err
	}
	return kolo.Barrier(ctx)
}
