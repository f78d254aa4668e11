package engine

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kolo-dl/kolo/internal/engine/negotiate"
	"github.com/kolo-dl/kolo/internal/transport"
	"github.com/kolo-dl/kolo/internal/transport/inmem"
	"github.com/kolo-dl/kolo/testbed/proctest"
)

// captureLog collects what the engine logs through slog while the test runs.
func captureLog(t *testing.T) *proctest.Buffer {
	l := &proctest.Buffer{}
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

// spyMessenger is a rank's Messenger that counts the abort notices the rank sends (before they go:
// one that never leaves counts too) and, if sent is not nil, reports on it the peer of every
// other message once it has been sent (without blocking: reports that do not fit are dropped).
type spyMessenger struct {
	transport.Messenger
	aborts *atomic.Int32
	sent   chan<- int
}

func (m spyMessenger) SendMsg(ctx context.Context, peer int, body []byte) error {
	if k, err := negotiate.PeekKind(body); err == nil && k == negotiate.MsgAbort {
		m.aborts.Add(1)
		return m.Messenger.SendMsg(ctx, peer, body)
	}
	err := m.Messenger.SendMsg(ctx, peer, body)
	if err == nil && m.sent != nil {
		select {
		case m.sent <- peer:
		default:
		}
	}
	return err
}

// spy puts a spyMessenger in front of g's Messenger and returns its abort count.
func spy(g *Group, sent chan<- int) *atomic.Int32 {
	aborts := &atomic.Int32{}
	g.Messenger = spyMessenger{g.Messenger, aborts, sent}
	return aborts
}

// awaitSent waits until the ranks whose spyMessengers report on sent have sent want messages, for
// at most 5 s.
func awaitSent(t *testing.T, sent <-chan int, want int, what string) {
	t.Helper()
	for i := range want {
		select {
		case <-sent:
		case <-time.After(5 * time.Second):
			t.Fatalf("%s: %d of %d messages sent after 5 s", what, i, want)
		}
	}
}

// A rank that receives an abort notice stops without passing it on: the aborting rank tells every
// rank itself, so relaying would only cost each rank n-1 more notices (n² in all), and a second
// wait for peers that do not read.
func TestAbortNoticeIsNotPassedOn(t *testing.T) {
	const n = 3
	captureLog(t)
	aborts := make([]*atomic.Int32, n)
	sent := make(chan int, n)
	c := newClusterWith(t, n, DefaultConfig(), nil, func(r int, ep *inmem.Endpoint, g *Group) {
		aborts[r] = spy(g, sent)
	})
	ctx := waitCtx(t)
	reason := "rank 0 raised ValueError: bad batch"
	errs := make(chan error, n)
	for r := 1; r < n; r++ {
		go func() {
			buf := f32(1)
			errs <- c.engines[r].Enqueue(allreduceReq("g", 1), buf, buf).Wait(ctx) // rank 0 never submits it
		}()
	}
	awaitSent(t, sent, n-1, "ranks 1 and 2 submitting to the coordinator")
	c.engines[0].Abort(errors.New(reason))
	for r := 1; r < n; r++ {
		select {
		case err := <-errs:
			if err == nil || !strings.Contains(err.Error(), reason) {
				t.Errorf("op: err = %v, want one carrying %q", err, reason)
			}
		case <-time.After(2 * time.Second):
			t.Fatalf("%d of %d ops still wait 2 s after the abort", n-r, n-1)
		}
	}
	// A rank tells its peers before its handles complete: the counts are final.
	if got := aborts[0].Load(); got != n-1 {
		t.Errorf("rank 0 sent %d abort notices, want %d: one to each peer", got, n-1)
	}
	for r := 1; r < n; r++ {
		if got := aborts[r].Load(); got != 0 {
			t.Errorf("rank %d passed the abort notice on %d times, want 0", r, got)
		}
	}
}

// Abort with a peer that never takes the notice: Abort returns within its bound, the other peers
// are told all the same (one stuck peer must not use up the others' time), and the log names the
// peer it could not tell and how long it waited.
func TestAbortWithAPeerThatNeverReads(t *testing.T) {
	const n = 3
	logs := captureLog(t)
	stuck := &atomic.Bool{}
	aborts := make([]*atomic.Int32, n)
	sent := make(chan int, n)
	c := newClusterWith(t, n, DefaultConfig(), nil, func(r int, ep *inmem.Endpoint, g *Group) {
		if r == 0 {
			g.Messenger = unreadMessenger{ep, 1, stuck}
			aborts[r] = spy(g, nil)
		} else {
			aborts[r] = spy(g, sent)
		}
	})
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
	awaitSent(t, sent, n-1, "ranks 1 and 2 submitting to the coordinator") // they block in negotiation
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
	if got := aborts[0].Load(); got != n-1 {
		t.Errorf("rank 0 sent %d abort notices, want %d: one round", got, n-1)
	}
	if got := aborts[2].Load(); got != 0 {
		t.Errorf("rank 2 passed the abort notice on %d times", got)
	}
	// Rank 1 never heard; it learns that rank 0 is gone when its process ends.
	c.eps[0].Kill(errors.New("rank 0 exited"))
	if err := <-errs[1]; err == nil {
		t.Error("rank 1's op succeeded")
	}
}

// hostAbort stands for a host's shared-memory segment: aborting it makes every rank's pending and
// later data transfer fail with the reason (internal/transport/shm's Group.Abort).
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
// ctx ends or the host's shared memory is aborted. Each call reports on entered that it started
// (without blocking: reports that do not fit are dropped).
type hungComm struct {
	transport.Comm
	host    *hostAbort
	entered chan<- struct{}
	lostTo  int // >= 0: the abort ends the collective as a closed TCP connection to this rank would
}

func (c hungComm) wait(ctx context.Context) error {
	select {
	case c.entered <- struct{}{}:
	default:
	}
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-c.host.done:
		if c.lostTo >= 0 {
			return &transport.PeerError{Rank: c.lostTo, Op: "recv", Err: io.EOF}
		}
		return fmt.Errorf("%w by local rank 0: %s", transport.ErrAborted, c.host.reason) // as shm's
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
	host := &hostAbort{done: make(chan struct{})}
	entered := make(chan struct{}, 16)
	aborts := make([]*atomic.Int32, n)
	c := newClusterWith(t, n, DefaultConfig(), []inmem.Option{inmem.WithoutShared()}, func(r int, ep *inmem.Endpoint, g *Group) {
		comm := hungComm{ep.Comm(), host, entered, -1}
		g.Comm, g.Local, g.Abort = comm, comm, host.abort
		aborts[r] = spy(g, nil)
	})
	ctx := waitCtx(t)
	reason := "rank 0 gave up: loss is NaN"
	errs := allreduceInside(ctx, t, c, entered)
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
	// Abort told the peers; the driver's collective, ended by the shared-memory abort, and its
	// next step stop the engine without telling them again.
	if got := aborts[0].Load(); got != n-1 {
		t.Errorf("rank 0 sent %d abort notices, want %d: one round", got, n-1)
	}
	// Rank 1's collective ended by the host's abort: it stops without telling anyone again.
	if got := aborts[1].Load(); got != 0 {
		t.Errorf("rank 1 sent %d abort notices after the host's abort, want 0", got)
	}
}

// allreduceInside has every rank of c submit and wait for one allreduce, over hungComms that report
// on entered, and returns once every driver is inside it; each rank's result arrives on the
// channel returned.
func allreduceInside(ctx context.Context, t *testing.T, c *cluster, entered <-chan struct{}) <-chan error {
	t.Helper()
	n := len(c.engines)
	errs := make(chan error, n)
	for r := range n {
		go func() {
			buf := f32(1, 2, 3)
			errs <- c.engines[r].Enqueue(allreduceReq("g", 3), buf, buf).Wait(ctx)
		}()
	}
	for r := range n {
		select {
		case <-entered:
		case <-time.After(5 * time.Second):
			t.Fatalf("%d of %d ranks entered the allreduce within 5 s", r, n)
		}
	}
	return errs
}

// Abort while every driver is inside a collective, over a transport where the aborting rank's leaving
// shows its peers only as a lost connection (TCP): they find its notice among their control
// messages and fail with its reason, not with "rank 0 lost".
func TestAbortNoticeExplainsAPeerLostMidCollective(t *testing.T) {
	const n = 3
	host := &hostAbort{done: make(chan struct{})}
	entered := make(chan struct{}, 16)
	c := newClusterWith(t, n, DefaultConfig(), []inmem.Option{inmem.WithoutShared()}, func(r int, ep *inmem.Endpoint, g *Group) {
		comm := hungComm{ep.Comm(), host, entered, 0}
		g.Comm, g.Local, g.Abort = comm, comm, host.abort
	})
	reason := "rank 0 failed: ValueError: loss is nan"
	errs := allreduceInside(waitCtx(t), t, c, entered)
	c.engines[0].Abort(errors.New(reason))
	for r := range n {
		select {
		case err := <-errs:
			if err == nil || !strings.Contains(err.Error(), reason) {
				t.Errorf("op: err = %v, want one carrying %q", err, reason)
			}
		case <-time.After(3 * time.Second):
			t.Fatalf("%d of %d ops still wait 3 s after the abort", n-r, n)
		}
	}
}

// Abort while a caller drives, waiting for an op no peer submits: the caller does not give way
// (it drives until its own op ends), so Abort tells the peers without it after abortWait, and the
// caller's op fails with the reason at its next step, without waiting for a peer to echo the
// notice back (rank 1's messages to rank 0 never arrive here, once it has submitted).
func TestAbortWhileACallerDrives(t *testing.T) {
	const n = 2
	captureLog(t)
	stuck := &atomic.Bool{}
	aborts := make([]*atomic.Int32, n)
	sent := make(chan int, 1)
	c := newClusterWith(t, n, DefaultConfig(), nil, func(r int, ep *inmem.Endpoint, g *Group) {
		if r == 1 {
			g.Messenger = unreadMessenger{ep, 0, stuck}
			aborts[r] = spy(g, sent)
		} else {
			aborts[r] = spy(g, nil)
		}
	})
	ctx := waitCtx(t)
	reason := "rank 0: KeyboardInterrupt in the data loader thread"
	mine, peer := make(chan error, 1), make(chan error, 1)
	driving := make(chan struct{})
	go func() {
		buf := f32(1)
		mine <- c.engines[0].Enqueue(allreduceReq("only.rank.0", 1), buf, buf).Wait(drivingCtx{ctx, &sync.Once{}, driving})
	}()
	go func() {
		buf := f32(1)
		peer <- c.engines[1].Enqueue(allreduceReq("only.rank.1", 1), buf, buf).Wait(ctx)
	}()
	awaitSent(t, sent, 1, "rank 1 submitting to the coordinator")
	select {
	case <-driving:
	case <-time.After(5 * time.Second):
		t.Fatal("rank 0's caller does not drive after 5 s")
	}
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
	// Abort told rank 1 once; the driver's next step stops the engine without a second round, and
	// rank 1 does not pass the notice back.
	if got := aborts[0].Load(); got != 1 {
		t.Errorf("rank 0 sent %d abort notices, want 1", got)
	}
	if got := aborts[1].Load(); got != 0 {
		t.Errorf("rank 1 passed the abort notice on %d times", got)
	}
}

// drivingCtx is a caller's context that closes driving the first time Err is called: of a waiting
// caller's calls, only those of the loop it drives (serve, sleep) ask for Err, so the test learns
// that the caller holds the drive token.
type drivingCtx struct {
	context.Context
	once    *sync.Once
	driving chan struct{}
}

func (c drivingCtx) Err() error {
	c.once.Do(func() { close(c.driving) })
	return c.Context.Err()
}

// heldNoticeMessenger holds a rank's abort notice to one peer until release is closed.
type heldNoticeMessenger struct {
	transport.Messenger
	peer    int
	release <-chan struct{}
}

func (m heldNoticeMessenger) SendMsg(ctx context.Context, peer int, body []byte) error {
	if k, err := negotiate.PeekKind(body); err == nil && k == negotiate.MsgAbort && peer == m.peer {
		select {
		case <-m.release:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return m.Messenger.SendMsg(ctx, peer, body)
}

// A rank aborts and its notice reaches rank 2 before rank 0; rank 2 stops and its connections
// close. Rank 0 sees rank 2's control connection close first, then rank 1's notice: it fails with
// rank 1's reason, the root cause, not with "rank 2 lost" (a flake of the Python re-init test).
func TestAbortNoticeExplainsAPeerThatClosedFirst(t *testing.T) {
	const n = 3
	captureLog(t)
	release := make(chan struct{})
	c := newClusterWith(t, n, DefaultConfig(), nil, func(r int, ep *inmem.Endpoint, g *Group) {
		if r == 1 {
			g.Messenger = heldNoticeMessenger{g.Messenger, 0, release}
		}
	})
	ctx := waitCtx(t)
	errs := make(chan error, 2)
	for _, r := range []int{0, 2} {
		go func() {
			buf := f32(1)
			errs <- c.engines[r].Enqueue(allreduceReq("g", 1), buf, buf).Wait(ctx) // rank 1 never submits it
		}()
	}
	reason := "rank 1 failed: ValueError: loss is nan"
	go c.engines[1].Abort(errors.New(reason))
	// Rank 2 hears first and stops; its process then exits, which rank 0 sees as a lost peer.
	select {
	case err := <-errs:
		if err == nil || !strings.Contains(err.Error(), reason) {
			t.Fatalf("rank 2's op: err = %v, want one carrying %q", err, reason)
		}
	case <-time.After(3 * time.Second):
		t.Fatal("rank 2's op still waits 3 s after the abort")
	}
	c.eps[2].Kill(nil)
	time.Sleep(20 * time.Millisecond) // rank 0 reads the lost connection before the notice
	close(release)
	select {
	case err := <-errs:
		if err == nil || !strings.Contains(err.Error(), reason) {
			t.Errorf("rank 0's op: err = %v, want one carrying %q (the root cause, not the closed peer)", err, reason)
		}
	case <-time.After(3 * time.Second):
		t.Fatal("rank 0's op still waits 3 s after the abort")
	}
}
