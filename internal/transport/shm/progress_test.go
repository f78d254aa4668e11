//go:build linux

package shm

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/kolo-dl/kolo/internal/transport"
)

// The progress clock, with a scripted clock: progress restarts it, a check long after the previous
// one (this process did not run) restarts it, and only limit without either expires it.
func TestProgressClock(t *testing.T) {
	t0 := time.Unix(1000, 0)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	type check struct {
		ms      int
		moved   bool
		expired bool
	}
	tests := []struct {
		name   string
		checks []check
	}{
		{"silent peer", []check{{0, false, false}, {50, false, false}, {250, false, false}, {300, false, true}}},
		{"progress restarts", []check{{0, false, false}, {250, true, false}, {500, false, false}, {550, false, true}}},
		{"resumed just in time", []check{{0, false, false}, {290, true, false}, {580, true, false}, {870, false, false}}},
		{"own freeze restarts", []check{{0, false, false}, {50, false, false}, {5000, false, false}, {5250, false, false}, {5300, false, true}}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := progressClock{limit: 300 * time.Millisecond}
			for i, ch := range tc.checks {
				if got := c.expired(at(ch.ms), ch.moved); got != ch.expired {
					t.Fatalf("check %d at %d ms (moved %v): expired %v, want %v", i, ch.ms, ch.moved, got, ch.expired)
				}
			}
		})
	}
	if (&progressClock{}).expired(at(0), false) || (&progressClock{}).expired(at(1e9), false) {
		t.Error("a clock without a limit expired")
	}
}

func progressConfig(t *testing.T, size int, limit time.Duration) Config {
	cfg := testConfig(t, size)
	cfg.ProgressTimeout = limit
	cfg.Host = "hostA"
	cfg.Ranks = make([]int, size)
	for r := range cfg.Ranks {
		cfg.Ranks[r] = 10 + r // job ranks differ from local ones: errors must name the job's
	}
	return cfg
}

// checkStall checks that err is a stall naming local rank peer as job rank 10+peer on hostA, found
// after at least limit and well before twice that.
func checkStall(t *testing.T, err error, peer int, op, detail string, waited, limit time.Duration) {
	t.Helper()
	var se *transport.StallError
	if !errors.As(err, &se) || !errors.Is(err, transport.ErrStalled) {
		t.Fatalf("err = %v, want a *transport.StallError", err)
	}
	if se.Rank != 10+peer || se.Host != "hostA" || se.Op != op || se.For != limit || !strings.Contains(se.Detail, detail) {
		t.Errorf("stall %+v, want rank %d on hostA, op %s, for %v, detail with %q", *se, 10+peer, op, limit, detail)
	}
	if waited < limit || waited > limit+time.Second {
		t.Errorf("failed after %v, want about %v", waited, limit)
	}
	if errors.Is(err, transport.ErrPeerLost) {
		t.Errorf("a stall is not a lost peer: %v", err)
	}
}

// A peer that stops sending midway through a message fails the receive after the timeout, naming
// it; one that stops receiving fails a send that outgrows the ring.
func TestStalledPeer(t *testing.T) {
	const limit = 300 * time.Millisecond
	t.Run("recv", func(t *testing.T) {
		gs := openAll(t, progressConfig(t, 2, limit))
		if err := gs[1].Comm().Send(context.Background(), 0, make([]byte, 1000)); err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		err := gs[0].Comm().Recv(context.Background(), 1, make([]byte, 4096))
		checkStall(t, err, 1, "recv", "1000 of 4096 bytes received", time.Since(start), limit)
	})
	t.Run("send", func(t *testing.T) {
		gs := openAll(t, progressConfig(t, 2, limit))
		start := time.Now()
		err := gs[0].Comm().Send(context.Background(), 1, make([]byte, 256<<10)) // four 64 KiB rings
		checkStall(t, err, 1, "send", "of 262144 bytes sent", time.Since(start), limit)
	})
	t.Run("sendrecv blames the silent sender", func(t *testing.T) {
		gs := openAll(t, progressConfig(t, 3, limit))
		// Rank 0 sends to rank 1 (which takes it) and waits on rank 2, which sends nothing.
		done := make(chan error, 1)
		go func() { done <- gs[1].Comm().Recv(context.Background(), 0, make([]byte, 100)) }()
		start := time.Now()
		err := gs[0].Comm().SendRecv(context.Background(), 1, make([]byte, 100), 2, make([]byte, 100))
		checkStall(t, err, 2, "recv", "0 of 100 bytes received", time.Since(start), limit)
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	})
	t.Run("barrier", func(t *testing.T) {
		gs := openAll(t, progressConfig(t, 3, limit))
		errs := make(chan error, 2)
		start := time.Now()
		for r := range 2 {
			go func() { errs <- gs[r].Comm().(transport.Shared).Barrier(context.Background()) }()
		}
		for range 2 {
			err := <-errs
			checkStall(t, err, 2, "barrier", "", time.Since(start), limit)
			if !strings.Contains(err.Error(), "ranks [2] have not arrived") {
				t.Errorf("err = %v, want one that lists the ranks missing", err)
			}
		}
	})
}

// A peer that pauses for most of the timeout, again and again, costs nothing: the deadline is on
// progress, not on the whole transfer, which here takes three times the timeout.
func TestPeerResumingBeforeDeadline(t *testing.T) {
	const limit = 400 * time.Millisecond
	gs := openAll(t, progressConfig(t, 2, limit))
	msg := bytes.Repeat([]byte("kolo"), 1024)
	sent := make(chan error, 1)
	go func() {
		for i := range 4 {
			if i > 0 {
				time.Sleep(limit * 3 / 4)
			}
			if err := gs[1].Comm().Send(context.Background(), 0, msg[i*1024:(i+1)*1024]); err != nil {
				sent <- err
				return
			}
		}
		sent <- nil
	}()
	got := make([]byte, len(msg))
	start := time.Now()
	if err := gs[0].Comm().Recv(context.Background(), 1, got); err != nil {
		t.Fatalf("after %v: %v", time.Since(start), err)
	}
	if err := <-sent; err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, msg) {
		t.Error("received bytes differ")
	}
	if time.Since(start) < 2*limit {
		t.Errorf("the transfer took %v: the test did not outlast the timeout", time.Since(start))
	}
	// The same for a barrier whose last rank comes just in time.
	late := make(chan error, 1)
	go func() {
		time.Sleep(limit * 3 / 4)
		late <- gs[1].Comm().(transport.Shared).Barrier(context.Background())
	}()
	if err := gs[0].Comm().(transport.Shared).Barrier(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := <-late; err != nil {
		t.Fatal(err)
	}
}

// A negative ProgressTimeout turns the deadline off.
func TestNoProgressTimeout(t *testing.T) {
	gs := openAll(t, progressConfig(t, 2, -1))
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	err := gs[0].Comm().Recv(ctx, 1, make([]byte, 10))
	if !errors.Is(err, context.DeadlineExceeded) || errors.Is(err, transport.ErrStalled) {
		t.Errorf("err = %v, want only the context's deadline", err)
	}
}
