package engine

// Who runs the loop.
//
// The loop (take queued ops, handle control messages, decide, execute) may run in any goroutine
// that holds the drive token, one at a time. A caller blocked in Handle.Wait takes the token and
// drives until its op is done, MPI-style: the goroutine that needs the result makes the progress,
// so a small op crosses no goroutine boundary at all, and with a transport.Poller it reads the
// control messages straight from shared memory. On a 2-core host every hand-off between
// goroutines or processes that had gone to sleep cost 10-50 µs, several times the whole op
// (`go test -bench PingPong ./internal/transport/shm` beside `kolo bench allreduce -np 2 --sizes 4`); this
// way a 4-byte allreduce between two ranks that spin needs none.
//
// The background goroutine drives when nobody waits: for async ops (it picks up an op that no
// caller took within kickDelay), for work a departing driver leaves behind, for the coordinator's
// stall inspector and keep-alives (keepalive.go) and to end the loop at Shutdown. It stays parked
// otherwise, so a job that submits and waits pays no wake-up for it, and it gives way as soon as a
// caller is ready to drive.
//
// Waits spin for at most Config.Spin after the last progress (0 when ranks outnumber cores), then
// sleep: on the Poller's doorbell, which peers ring when they send, or on the inbox channel.

import (
	"context"
	"fmt"
	"time"

	"github.com/kolo-dl/kolo/internal/spin"
	"github.com/kolo-dl/kolo/internal/transport"
)

const (
	// kickDelay is how long a queued op waits for a caller to drive before the background
	// goroutine does. Callers usually Wait at once; async ops start within this (rounded up to
	// the runtime's timer resolution, about a millisecond when the process is idle).
	kickDelay = 200 * time.Microsecond
	// checkEvery bounds a driver's sleep, so that it looks at its peers' health (through the
	// Messenger) and its context even when nothing wakes it.
	checkEvery = 100 * time.Millisecond
)

// background is the goroutine that drives when no caller does; it exits when the loop has ended.
func (e *Engine) background() {
	defer close(e.stopped)
	var tickC <-chan time.Time
	if d := tickEvery(e.cfg); e.hub != nil && d > 0 {
		t := time.NewTicker(d)
		defer t.Stop()
		tickC = t.C
	}
	for {
		select {
		case <-e.summon:
		case <-e.kick.C:
			e.mu.Lock()
			e.kicking = false
			e.mu.Unlock()
		case <-tickC:
		}
		// Someone else driving will summon us again if they leave work behind.
		if !e.tryAcquire() {
			continue
		}
		e.bgDriving.Store(true)
		if !e.ended {
			e.serve(context.Background(), nil)
		}
		e.bgDriving.Store(false)
		ended := e.ended
		e.release()
		if ended {
			return
		}
	}
}

// await is Handle.Wait's part: take the token and drive until h completes or ctx ends; while
// another goroutine drives, wait for h or for the token.
func (e *Engine) await(ctx context.Context, h *Handle) {
	if !e.takeToken(ctx, h) {
		return
	}
	if !e.ended {
		e.serve(ctx, h)
	}
	e.release()
}

// takeToken takes the drive token for a goroutine other than the background one: a caller waiting
// for h, or Abort (h == nil). It gives up when h completes or ctx ends, and reports whether it
// took the token. While it tries it counts among the waiting callers, so that the background
// goroutine gives way; leaving without the token, it takes care of work a departing driver may
// have handed to the waiting callers (abandon).
func (e *Engine) takeToken(ctx context.Context, h *Handle) bool {
	e.waiting.Add(1)
	if e.bgDriving.Load() {
		e.wakeDriver() // it gives way once it sees a caller waiting; it may be asleep
	}
	got := e.awaitToken(ctx, h)
	e.waiting.Add(-1)
	if !got {
		e.abandon()
	}
	return got
}

// awaitToken spins for the token (or h, if not nil) for up to Config.Spin, then blocks. It reports
// whether it took the token.
func (e *Engine) awaitToken(ctx context.Context, h *Handle) bool {
	var done <-chan struct{} // nil, which never delivers, without a handle
	if h != nil {
		done = h.done
	}
	for start := time.Now(); ; spin.Pause() {
		if e.tryAcquire() {
			return true
		}
		if h != nil && h.Poll() {
			return false
		}
		if d := e.spinTime(); d <= 0 || time.Since(start) >= d {
			break
		}
	}
	select {
	case e.drive <- struct{}{}:
		e.acquired()
		return true
	case <-done:
	case <-ctx.Done():
	}
	return false
}

func (e *Engine) tryAcquire() bool {
	select {
	case e.drive <- struct{}{}:
		e.acquired()
		return true
	default:
		return false
	}
}

func (e *Engine) acquired() {
	e.mu.Lock()
	e.driving = true
	e.handoff = false
	e.mu.Unlock()
}

// release gives the token back. Work left (ops queued or in flight, or a loop to end after
// Shutdown) goes to the callers waiting to drive if there are any, else to the background
// goroutine. Enqueue and release both decide under mu, so an op queued meanwhile is either seen
// here or arms the kick.
func (e *Engine) release() {
	e.mu.Lock()
	e.driving = false
	more := e.ended || e.closed || len(e.queue) > 0 || e.inflight > 0 || e.joining != nil || e.foreign > 0
	toWaiters := more && !e.ended && !e.closed && e.waiting.Load() > 0
	if toWaiters {
		e.handoff = true
	}
	if !more && e.kicking {
		e.kick.Stop()
		e.kicking = false
	}
	e.mu.Unlock()
	<-e.drive
	if more && !toWaiters {
		e.summonBackground()
	}
}

// abandon is called by a caller that leaves Wait without having driven. If work was handed to the
// waiting callers and none took the token, the background goroutine must.
func (e *Engine) abandon() {
	e.mu.Lock()
	orphaned := e.handoff && !e.driving && e.waiting.Load() == 0
	if orphaned {
		e.handoff = false
	}
	e.mu.Unlock()
	if orphaned {
		e.summonBackground()
	}
}

func (e *Engine) summonBackground() {
	select {
	case e.summon <- struct{}{}:
	default:
	}
}

// wakeDriver wakes the driver if it sleeps, so that it takes newly queued ops (or sees Shutdown).
func (e *Engine) wakeDriver() {
	if e.poller != nil {
		e.poller.Wake()
		return
	}
	select {
	case e.nudge <- struct{}{}:
	default:
	}
}

// serve runs the loop as the driver: for a caller until h completes or ctx ends; for the background
// goroutine (h == nil) while work is left and no caller is ready to take over.
func (e *Engine) serve(ctx context.Context, h *Handle) {
	var stopWake func() bool
	defer func() {
		if stopWake != nil {
			stopWake()
		}
	}()
	last := time.Now() // the last progress: spinning is worth it only shortly after
	yields := 0        // sched_yields since the last progress, when not spinning
	for {
		now := time.Now()
		progressed := e.step(now)
		switch {
		case e.ended:
			return
		case h != nil:
			if h.Poll() || ctx.Err() != nil {
				return
			}
		case e.waiting.Load() > 0 || !e.busy():
			return
		}
		if progressed {
			last, yields = now, 0
			continue
		}
		if now.Sub(last) < e.spinTime() {
			spin.Pause() // a busy beat, never runtime.Gosched (see spin.Pause)
			continue
		}
		if yields < e.cfg.Yields {
			yields++
			spin.Yield()
			continue
		}
		yields = 0
		if stopWake == nil && e.poller != nil && ctx.Done() != nil {
			stopWake = context.AfterFunc(ctx, e.poller.Wake)
		}
		e.sleep(ctx, h, now)
		last = time.Now()
	}
}

// busy reports whether this rank has work that needs a driver. Rank 0 always has while a process
// set without it exists: it coordinates that set, and no caller of its own waits for those ops.
func (e *Engine) busy() bool {
	return e.queued.Load() > 0 || e.inflight > 0 || e.joining != nil || e.foreign > 0
}

// sleep waits, as the driver, until a control message arrives, an op is queued, ctx ends, the stall
// inspector is due or checkEvery passes.
func (e *Engine) sleep(ctx context.Context, h *Handle, now time.Time) {
	d := checkEvery
	if !e.nextTick.IsZero() {
		d = min(d, e.nextTick.Sub(now))
	}
	if !e.coord.since.IsZero() {
		d = min(d, e.coord.since.Add(e.cfg.ProgressTimeout).Sub(now)) // the deadline on rank 0
	}
	if d <= 0 {
		return
	}
	if e.poller != nil {
		e.poller.Sleep(func() bool {
			return e.queued.Load() > 0 || ctx.Err() != nil || (h != nil && h.Poll()) || (h == nil && e.waiting.Load() > 0)
		}, d)
		return
	}
	e.timer.Reset(d)
	defer e.timer.Stop()
	select {
	case m, ok := <-e.inbox:
		e.held, e.hasHeld, e.heldOK = m, true, ok
	case <-e.nudge:
	case <-ctx.Done():
	case <-e.timer.C:
	}
}

// recv returns the next control message if one has arrived.
func (e *Engine) recv() (transport.Msg, bool, error) {
	if e.hasHeld {
		m, ok := e.held, e.heldOK
		e.held, e.hasHeld = transport.Msg{}, false
		if !ok {
			return transport.Msg{}, false, transport.ErrClosed
		}
		return m, true, nil
	}
	if e.poller != nil {
		return e.poller.TryRecv()
	}
	select {
	case m, ok := <-e.inbox:
		if !ok {
			return transport.Msg{}, false, transport.ErrClosed
		}
		return m, true, nil
	default:
		return transport.Msg{}, false, nil
	}
}

// step does what can be done now without blocking: it takes queued ops, handles every control
// message that has arrived, runs the stall inspector when due and, on the coordinator, publishes
// what became ready (executing it here too). It reports whether anything happened, and sets
// e.ended when the loop must stop.
func (e *Engine) step(now time.Time) bool {
	if err := e.aborted.Load(); err != nil { // Abort ran while this driver was busy, and tells the peers
		e.stop(*err)
		e.ended = true
		return true
	}
	e.applyFusion()
	if cycle := time.Duration(e.tune.cycle.Load()); cycle > 0 && e.queued.Load() > 0 {
		time.Sleep(cycle) // let more ops gather into one negotiation
	}
	e.obs.closeSteps()
	progressed, ok := e.drainQueue(now)
	if !ok {
		e.ended = true
		return true
	}
	for {
		m, got, err := e.recv()
		if err != nil {
			e.fail(fmt.Errorf("rank %d: control messages: %w", e.g.Rank, err))
			e.ended = true
			return true
		}
		if !got {
			break
		}
		progressed = true
		if m.From == 0 && e.hub == nil {
			e.coord.heard(now)
		} else if e.members.heard != nil && m.From >= 0 && m.From < len(e.members.heard) {
			e.members.heard[m.From] = now
		}
		if !e.handleMsg(m) {
			e.ended = true
			return true
		}
	}
	if progressed {
		if tl := e.tl.Load(); tl != nil {
			tl.Cycle()
		}
	}
	if e.hub == nil {
		if !e.watchCoordinator(now) {
			e.ended = true
			return true
		}
		return progressed
	}
	if !e.nextTick.IsZero() {
		if !now.Before(e.nextTick) {
			e.nextTick = now.Add(tickEvery(e.cfg))
			if !e.watchMembers(now) || !e.tick(now) {
				e.ended = true
				return true
			}
		}
	}
	if progressed && !e.decide() {
		e.ended = true
		return progressed
	}
	if !e.sendKeepAlives() {
		e.ended = true
		return true
	}
	return progressed
}
