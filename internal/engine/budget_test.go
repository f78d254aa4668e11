package engine

import (
	"context"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/kolo-dl/kolo/internal/transport"
	"github.com/kolo-dl/kolo/internal/transport/inmem"
)

// The hot path's cost in counts that a change moves deterministically, checked against budgets:
// a change that adds an allocation or a control message to every small allreduce fails here,
// saying what it added, whatever the machine's noise. Raise a budget only with the reason in the
// commit that does.
const (
	// budgetAllocsPerOp is the heap allocations of both ranks together per 4-byte allreduce in
	// steady state (named, cached, 2 ranks, over internal/transport/inmem, whose copies of each message
	// count too): per rank the test's request, the handle and its channel, the queue entry, the
	// response's expansion into names and shapes; on rank 0 the batch decoded and the response
	// emitted; on rank 1 the response decoded.
	budgetAllocsPerOp = 22
	// budgetMsgsPerOp is the control messages per op of the two ranks together: rank 1's
	// submission to rank 0 and rank 0's response to rank 1.
	budgetMsgsPerOp = 2
)

// countingMessenger counts the control messages a rank sends.
type countingMessenger struct {
	transport.Messenger
	n *atomic.Int64
}

func (m countingMessenger) SendMsg(ctx context.Context, peer int, body []byte) error {
	m.n.Add(1)
	return m.Messenger.SendMsg(ctx, peer, body)
}

// hotPathCost runs ops 4-byte allreduces on each of 2 ranks after warm-up and returns the heap
// allocations and the control messages per op, both ranks together.
func hotPathCost(t *testing.T, ops int) (allocs, msgs float64) {
	var sent atomic.Int64
	c := newClusterWith(t, 2, DefaultConfig(), nil, func(r int, ep *inmem.Endpoint, g *Group) {
		g.Messenger = countingMessenger{g.Messenger, &sent}
	})
	ctx := waitCtx(t)
	bufs := [2][]byte{f32(1), f32(2)}
	run := func(n int) {
		var wg sync.WaitGroup
		for r, e := range c.engines {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for range n {
					if err := e.Enqueue(allreduceReq("x", 1), bufs[r], bufs[r]).Wait(ctx); err != nil {
						t.Error(err)
						return
					}
				}
			}()
		}
		wg.Wait()
	}
	run(200) // warm: the name is cached, buffers and pools are grown
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	sent.Store(0)
	run(ops)
	runtime.ReadMemStats(&after)
	return float64(after.Mallocs-before.Mallocs) / float64(ops), float64(sent.Load()) / float64(ops)
}

func TestHotPathWithinBudget(t *testing.T) {
	if testing.Short() || raceEnabled {
		t.Skip("counts thousands of ops, with the allocations of a build without the race detector")
	}
	allocs, msgs := hotPathCost(t, 2000)
	t.Logf("per 4-byte allreduce: %.2f allocations, %.2f control messages", allocs, msgs)
	// Goroutine stacks and timers add a little that is not per op: a whole allocation more per
	// op is what the budget catches.
	if allocs > budgetAllocsPerOp+0.5 {
		t.Errorf("%.2f heap allocations per small allreduce, budget %d: something on the hot path allocates now (go test -run HotPath -memprofile m.out -memprofilerate 1 ./engine; go tool pprof -sample_index=alloc_objects -top m.out)",
			allocs, budgetAllocsPerOp)
	}
	if msgs > budgetMsgsPerOp+0.05 {
		t.Errorf("%.2f control messages per small allreduce, budget %d", msgs, budgetMsgsPerOp)
	}
}
