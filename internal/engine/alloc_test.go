package engine

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kolo-dl/kolo/internal/dtype"
	"github.com/kolo-dl/kolo/internal/engine/negotiate"
	"github.com/kolo-dl/kolo/internal/reduce"
	"github.com/kolo-dl/kolo/internal/transport"
	"github.com/kolo-dl/kolo/internal/transport/inmem"
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

// Running a fused allreduce allocates nothing of the executor's own in steady state: the tensors'
// sizes and the list of those that go through the fusion buffer are kept from the last response,
// as is the buffer. (One rank, so that the collective itself does nothing.)
func TestFusedAllreduceAllocatesNothing(t *testing.T) {
	eps := inmem.New(1)
	defer eps[0].Close()
	x := newExecutor(Group{Rank: 0, Size: 1, Hosts: []string{"h"}, Comm: eps[0], Messenger: eps[0], Local: eps[0],
		LocalRanks: []int{0}}, DefaultConfig())
	shapes := [][]int64{{4}, {unfusedBytes / 4}, {2}, {3}} // the second one is reduced on its own
	r := negotiate.Response{Kind: negotiate.Allreduce, DType: dtype.Float32, ReduceOp: uint8(reduce.Sum),
		PreScale: 1, PostScale: 1, Shapes: shapes}
	entries := make([]*entry, len(shapes))
	for i, sh := range shapes {
		in, out := make([]byte, 4*sh[0]), make([]byte, 4*sh[0])
		for j := range in {
			in[j] = byte(i + j)
		}
		r.Names = append(r.Names, fmt.Sprintf("t%d", i))
		entries[i] = &entry{in: in, out: out}
	}
	ctx := context.Background()
	run := func() {
		if err := x.allreduce(ctx, r, entries); err != nil {
			t.Fatal(err)
		}
	}
	run() // the first response sizes what is reused
	for i, en := range entries {
		if !bytes.Equal(en.out, en.in) {
			t.Fatalf("tensor %d: the one-rank sum differs from the input", i)
		}
	}
	if allocs := testing.AllocsPerRun(100, run); allocs != 0 {
		t.Errorf("a fused allreduce of %d tensors allocates %v times, want 0", len(shapes), allocs)
	}
}
