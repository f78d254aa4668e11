package engine

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kolo-dl/kolo/transport"
	"github.com/kolo-dl/kolo/transport/inmem"
)

// sinkMessenger takes every message and delivers none: a coordinator that never answers.
type sinkMessenger struct {
	transport.Messenger
	sent *atomic.Int32
}

func (m sinkMessenger) SendMsg(ctx context.Context, peer int, body []byte) error {
	m.sent.Add(1)
	return nil
}

// The loop's own bookkeeping allocates nothing per cycle in steady state: taking the queue,
// grouping requests per process set and encoding the Batch reuse the slices of earlier cycles.
// (The ops themselves, their queue entries and handles, are the caller's allocations.)
func TestDrainQueueAllocatesNothing(t *testing.T) {
	captureLog(t) // the Abort that ends the test logs
	eps := inmem.New(2)
	defer eps[0].Close()
	defer eps[1].Close()
	var sent atomic.Int32
	g := Group{Rank: 1, Size: 2, Hosts: []string{"h", "h"}, Comm: eps[1], Messenger: sinkMessenger{eps[1], &sent},
		Local: eps[1], LocalRanks: []int{0, 1}}
	e, err := New(DefaultConfig(), g)
	if err != nil {
		t.Fatal(err)
	}
	defer e.Abort(errors.New("test over"))
	if !e.tryAcquire() { // drive here, as a waiting caller would
		t.Fatal("the drive token is taken")
	}
	defer e.release()
	const perCycle = 3
	entries := make([]*entry, perCycle)
	for i := range entries {
		req := allreduceReq(fmt.Sprintf("grad.%d", i), 4)
		buf := make([]byte, 16)
		entries[i] = &entry{req: req, set: e.global, in: buf, out: buf, h: newHandle(req.Name, e)}
	}
	now := time.Now()
	cycle := func() {
		e.mu.Lock()
		e.queue = append(e.queue, entries...)
		e.queued.Store(int32(len(e.queue)))
		e.mu.Unlock()
		if took, ok := e.drainQueue(now); !took || !ok {
			t.Fatalf("drainQueue = %v, %v", took, ok)
		}
		// The responses would retire the ops; here they are simply forgotten.
		for _, en := range entries {
			delete(e.global.pending, en.req.Name)
		}
		e.inflight -= perCycle
	}
	cycle() // the first cycle sizes the reused slices
	if allocs := testing.AllocsPerRun(100, cycle); allocs != 0 {
		t.Errorf("a steady-state cycle of %d ops allocates %v times, want 0", perCycle, allocs)
	}
	if sent := sent.Load(); sent != 102 {
		t.Errorf("%d batches sent, want 102", sent)
	}
}
