package inmem

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/kolo-dl/kolo/internal/transport"
)

func wantStall(t *testing.T, err error, peer int, op, detail string, waited, limit time.Duration) {
	t.Helper()
	var se *transport.StallError
	if !errors.As(err, &se) || !errors.Is(err, transport.ErrStalled) {
		t.Fatalf("err = %v, want a *transport.StallError", err)
	}
	if se.Rank != peer || se.Op != op || se.For != limit || !strings.Contains(se.Detail, detail) {
		t.Errorf("stall %+v, want rank %d, op %s, for %v, detail with %q", *se, peer, op, limit, detail)
	}
	if waited < limit || waited > limit+time.Second {
		t.Errorf("failed after %v, want about %v", waited, limit)
	}
}

// A paused rank moves nothing: a peer waiting on it fails after the progress timeout, naming it,
// whether it waits for bytes, for room, or at a barrier.
func TestPausedPeerStalls(t *testing.T) {
	const limit = 200 * time.Millisecond
	ctx := context.Background()
	eps := New(3, WithProgressTimeout(limit), WithBuffer(1024))
	defer closeAll(eps)
	eps[1].Pause()
	defer eps[1].Resume()
	blocked := make(chan error, 1)
	go func() { blocked <- eps[1].Send(ctx, 0, make([]byte, 10)) }() // held by the pause

	start := time.Now()
	err := eps[0].Recv(ctx, 1, make([]byte, 10))
	wantStall(t, err, 1, "recv", "0 of 10 bytes received", time.Since(start), limit)

	start = time.Now()
	err = eps[2].SendRecv(ctx, 1, make([]byte, 5000), 0, nil)
	wantStall(t, err, 1, "send", "1024 of 5000 bytes sent", time.Since(start), limit)

	start = time.Now()
	errs := make(chan error, 2)
	for _, r := range []int{0, 2} {
		go func() { errs <- eps[r].Barrier(ctx) }()
	}
	for range 2 {
		wantStall(t, <-errs, 1, "barrier", "ranks [1] have not arrived", time.Since(start), limit)
	}
	select {
	case err := <-blocked:
		t.Fatalf("a paused rank's call returned: %v", err)
	default:
	}
	eps[1].Resume()
	if err := <-blocked; err != nil {
		t.Errorf("the paused rank's call after Resume: %v", err)
	}
}

// A rank paused for most of the timeout, twice, costs nothing, and its own wait does not count
// the paused time against its peers.
func TestResumeBeforeDeadline(t *testing.T) {
	const limit = 300 * time.Millisecond
	ctx := context.Background()
	eps := New(2, WithProgressTimeout(limit))
	defer closeAll(eps)
	msg := []byte("progress, not total time")
	done := make(chan error, 1)
	go func() {
		got := make([]byte, len(msg))
		err := eps[0].SendRecv(ctx, 1, msg, 1, got)
		if err == nil && !bytes.Equal(got, msg) {
			err = errors.New("rank 0 received other bytes")
		}
		done <- err
	}()
	// Rank 1 is paused before it sends, then again while it waits (it waits on nothing: rank 0
	// sent at once), each time for most of the timeout.
	eps[1].Pause()
	time.Sleep(limit * 3 / 4)
	eps[1].Resume()
	got := make([]byte, len(msg))
	if err := eps[1].SendRecv(ctx, 0, msg, 0, got); err != nil || !bytes.Equal(got, msg) {
		t.Fatalf("rank 1: %v, %q", err, got)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	// A rank paused longer than the timeout while it waits does not blame its peer for it.
	go func() {
		time.Sleep(limit / 2)
		eps[0].Pause()
		time.Sleep(2 * limit)
		eps[0].Resume()
	}()
	go func() {
		time.Sleep(3 * limit) // rank 0 has been resumed for limit/2
		done <- eps[1].Send(ctx, 0, msg)
	}()
	if err := eps[0].Recv(ctx, 1, make([]byte, len(msg))); err != nil {
		t.Errorf("a rank that was itself paused blamed its peer: %v", err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}
