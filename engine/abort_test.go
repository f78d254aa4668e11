package engine

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kolo-dl/kolo/transport"
	"github.com/kolo-dl/kolo/transport/inmem"
)

// logCapture collects what the engine logs through slog while a test runs.
type logCapture struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (l *logCapture) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.Write(p)
}

func (l *logCapture) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.String()
}

func captureLog(t *testing.T) *logCapture {
	l := &logCapture{}
	old := slog.Default()
	slog.SetDefault(slog.New(slog.NewTextHandler(l, nil)))
	t.Cleanup(func() { slog.SetDefault(old) })
	return l
}

// unreadMessenger is a Messenger whose messages to one peer, once stuck is set, never leave: that
// peer does not read its control connection (its process hangs, the connection is full), so a
// send to it blocks until its context ends, as the TCP and shared-memory Messengers do.
type unreadMessenger struct {
	transport.Messenger
	peer  int
	stuck *atomic.Bool
}

func (m unreadMessenger) SendMsg(ctx context.Context, peer int, body []byte) error {
	if peer == m.peer && m.stuck.Load() {
		<-ctx.Done()
		return fmt.Errorf("send message to rank %d: %w", peer, ctx.Err())
	}
	return m.Messenger.SendMsg(ctx, peer, body)
}

// Abort with a peer that never takes the notice: Abort returns within its bound, the other peers
// are told all the same (one stuck peer must not use up the others' time), and the log names the
// peer it could not tell and how long it waited.
func TestAbortWithAPeerThatNeverReads(t *testing.T) {
	const n = 3
	logs := captureLog(t)
	eps := inmem.New(n)
	stuck := &atomic.Bool{}
	groups := make([]Group, n)
	for r, ep := range eps {
		groups[r] = Group{Comm: ep, Messenger: ep, Local: ep}
	}
	groups[0].Messenger = unreadMessenger{eps[0], 1, stuck}
	c := startCluster(t, DefaultConfig(), "memhost", groups, func() {
		for _, ep := range eps {
			ep.Close()
		}
	})
	c.eps = eps
	ctx := waitCtx(t)
	reason := "rank 0 raised RuntimeError: out of memory"
	mine := c.engines[0].Enqueue(allreduceReq("other", 1), f32(1), f32(0)) // nobody else submits it
	errs := make([]chan error, n)
	for r := 1; r < n; r++ {
		errs[r] = make(chan error, 1)
		go func() {
			buf := f32(1)
			errs[r] <- c.engines[r].Enqueue(allreduceReq("g", 1), buf, buf).Wait(ctx)
		}()
	}
	time.Sleep(50 * time.Millisecond) // let ranks 1 and 2 block in negotiation
	stuck.Store(true)
	start := time.Now()
	c.engines[0].Abort(errors.New(reason))
	took := time.Since(start)
	if took < tellWait || took > abortWait+tellWait+500*time.Millisecond {
		t.Errorf("Abort returned after %v; want at least tellWait (%v, the wait for rank 1) and at most abortWait+tellWait", took, tellWait)
	}
	select {
	case err := <-errs[2]:
		if err == nil || !strings.Contains(err.Error(), reason) {
			t.Errorf("rank 2: err = %v, want one carrying %q", err, reason)
		}
	case <-time.After(2 * time.Second):
		t.Error("rank 2 was not told: its op still waits 2 s after the abort")
	}
	log := logs.String()
	if !strings.Contains(log, "rank 1: the abort notice was not sent within "+tellWait.String()) {
		t.Errorf("the log does not say that rank 1 could not be told within %v:\n%s", tellWait, log)
	}
	if strings.Contains(log, "rank 2: ") {
		t.Errorf("the log says rank 2 was not told, but it was:\n%s", log)
	}
	if err := mine.Wait(ctx); err == nil || !strings.Contains(err.Error(), reason) {
		t.Errorf("aborting rank's pending op: err = %v", err)
	}
	// Rank 1 never heard; it learns that rank 0 is gone when its process ends.
	eps[0].Kill(errors.New("rank 0 exited"))
	if err := <-errs[1]; err == nil {
		t.Error("rank 1's op succeeded")
	}
}

// hostAbort stands for a host's shared-memory segment: aborting it makes every rank's pending and
// later data transfer fail with the reason (transport/shm's Group.Abort).
type hostAbort struct {
	once   sync.Once
	done   chan struct{}
	reason string
}

func (h *hostAbort) abort(err error) {
	h.once.Do(func() {
		h.reason = err.Error()
		close(h.done)
	})
}

// hungComm is a Comm whose collectives never progress (a peer stuck in the middle of one) until
// ctx ends or the host's shared memory is aborted.
type hungComm struct {
	transport.Comm
	host *hostAbort
}

func (c hungComm) wait(ctx context.Context) error {
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-c.host.done:
		return fmt.Errorf("shared memory aborted: %s", c.host.reason)
	}
}

func (c hungComm) Send(ctx context.Context, peer int, p []byte) error { return c.wait(ctx) }
func (c hungComm) Recv(ctx context.Context, peer int, p []byte) error { return c.wait(ctx) }
func (c hungComm) SendRecv(ctx context.Context, to int, sb []byte, from int, rb []byte) error {
	return c.wait(ctx)
}

// Abort while the driver is stuck inside a collective: it does not wait for the driver beyond
// abortWait, says so in the log, tells the peers and aborts the host's shared memory, which ends
// the collective on every rank; every op then fails with the reason, later ones too.
func TestAbortWhileTheDriverIsInACollective(t *testing.T) {
	const n = 2
	logs := captureLog(t)
	eps := inmem.New(n, inmem.WithoutShared())
	host := &hostAbort{done: make(chan struct{})}
	groups := make([]Group, n)
	for r, ep := range eps {
		comm := hungComm{ep.Comm(), host}
		groups[r] = Group{Comm: comm, Messenger: ep, Local: comm, Abort: host.abort}
	}
	c := startCluster(t, DefaultConfig(), "memhost", groups, func() {
		for _, ep := range eps {
			ep.Close()
		}
	})
	ctx := waitCtx(t)
	reason := "rank 0 gave up: loss is NaN"
	errs := make(chan error, n)
	for r := range n {
		go func() {
			buf := f32(1, 2, 3)
			errs <- c.engines[r].Enqueue(allreduceReq("g", 3), buf, buf).Wait(ctx)
		}()
	}
	time.Sleep(100 * time.Millisecond) // negotiated: both drivers are inside the allreduce
	start := time.Now()
	c.engines[0].Abort(errors.New(reason))
	if took := time.Since(start); took < abortWait || took > abortWait+tellWait+500*time.Millisecond {
		t.Errorf("Abort returned after %v; want at least abortWait (%v, the wait for the driver) and at most abortWait+tellWait", took, abortWait)
	}
	for r := range n {
		select {
		case err := <-errs:
			if err == nil || !strings.Contains(err.Error(), reason) {
				t.Errorf("op: err = %v, want one carrying %q", err, reason)
			}
		case <-time.After(2 * time.Second):
			t.Fatalf("%d of %d ops still wait 2 s after the abort", n-r, n)
		}
	}
	if log := logs.String(); !strings.Contains(log, "did not give way within "+abortWait.String()) {
		t.Errorf("the log does not say what Abort waited for:\n%s", log)
	}
	buf := f32(1)
	if err := c.engines[0].Enqueue(allreduceReq("later", 1), buf, buf).Wait(ctx); err == nil || !strings.Contains(err.Error(), reason) {
		t.Errorf("aborting rank's later op: err = %v", err)
	}
}

// Abort while a caller drives, waiting for an op no peer submits: the caller does not give way
// (it drives until its own op ends), so Abort tells the peers without it after abortWait, and the
// caller's op fails with the reason at its next step, without waiting for a peer to echo the
// notice back (rank 1's messages to rank 0 never arrive here, once it has submitted).
func TestAbortWhileACallerDrives(t *testing.T) {
	const n = 2
	captureLog(t)
	eps := inmem.New(n)
	stuck := &atomic.Bool{}
	groups := make([]Group, n)
	for r, ep := range eps {
		groups[r] = Group{Comm: ep, Messenger: ep, Local: ep}
	}
	groups[1].Messenger = unreadMessenger{eps[1], 0, stuck}
	c := startCluster(t, DefaultConfig(), "memhost", groups, func() {
		for _, ep := range eps {
			ep.Close()
		}
	})
	ctx := waitCtx(t)
	reason := "rank 0: KeyboardInterrupt in the data loader thread"
	mine, peer := make(chan error, 1), make(chan error, 1)
	go func() {
		buf := f32(1)
		mine <- c.engines[0].Enqueue(allreduceReq("only.rank.0", 1), buf, buf).Wait(ctx)
	}()
	go func() {
		buf := f32(1)
		peer <- c.engines[1].Enqueue(allreduceReq("only.rank.1", 1), buf, buf).Wait(ctx)
	}()
	time.Sleep(50 * time.Millisecond)
	stuck.Store(true)
	start := time.Now()
	c.engines[0].Abort(errors.New(reason))
	if took := time.Since(start); took > abortWait+tellWait+500*time.Millisecond {
		t.Errorf("Abort returned after %v", took)
	}
	select {
	case err := <-mine:
		if err == nil || !strings.Contains(err.Error(), reason) {
			t.Errorf("the driving caller's op: err = %v, want one carrying %q", err, reason)
		}
	case <-time.After(2 * time.Second):
		t.Fatal("the driving caller's op still waits 2 s after the abort")
	}
	if err := <-peer; err == nil || !strings.Contains(err.Error(), reason) {
		t.Errorf("rank 1's op: err = %v, want one carrying %q", err, reason)
	}
}
