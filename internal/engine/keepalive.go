package engine

// The coordinator's keep-alive.
//
// A rank that submitted ops waits for rank 0's answer, and rank 0 may legitimately be silent for
// long: it answers an op only once every member submitted it, and some rank may compute for
// minutes first. Silence alone therefore says nothing; a rank 0 that does not run (stopped by
// SIGSTOP or a debugger, its host suspended) must be told apart from one that waits. So while rank
// 0 holds submissions of a rank unanswered, it sends that rank a two-byte MsgKeepAlive every
// ProgressTimeout/4, and a rank that waits on rank 0 and hears nothing at all from it (no answer,
// no keep-alive) for ProgressTimeout fails its ops and stops the job, telling every rank which rank
// is stuck (a stall notice, as a collective's progress deadline does). A job with nothing pending
// sends nothing; one with ops pending sends one tiny message per waiting rank per interval.
//
// Rank 0's driver sends the keep-alives, since only it may read the Hub: the keepAlive goroutine
// marks a round due and summons the background goroutine, so they go out while rank 0's own caller
// computes outside kolo. While the driver runs a collective (which may outlast the interval), the
// goroutine sends to every rank itself.
//
// The other way round, every other rank's heartbeat goroutine sends rank 0 the same two bytes
// every ProgressTimeout/4, whatever it does: a goroutine runs while the rank's program computes
// (for minutes, holding Python's GIL, or anything else), and stops only when the whole process
// stops (SIGSTOP, a paused VM, a process swapped out). So when ranks wait on an op that rank r has
// not submitted, and rank 0 has heard nothing from r for ProgressTimeout, r is frozen between two
// ops, not computing: rank 0 stops the job naming it (watchMembers), as a collective's progress
// deadline names a rank frozen inside one.

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/kolo-dl/kolo/internal/engine/negotiate"
	"github.com/kolo-dl/kolo/internal/transport"
)

// keepAliveEvery is how often rank 0 tells waiting ranks it runs: a quarter of their deadline.
func keepAliveEvery(timeout time.Duration) time.Duration { return max(timeout/4, time.Millisecond) }

// keepAliveOn reports whether this engine is a coordinator that sends keep-alives.
func (e *Engine) keepAliveOn() bool {
	return e.g.Rank == 0 && e.g.Size > 1 && e.cfg.ProgressTimeout > 0
}

// keepAlive (rank 0) marks a keep-alive round due every keepAliveEvery until the loop ends.
func (e *Engine) keepAlive() {
	t := time.NewTicker(keepAliveEvery(e.cfg.ProgressTimeout))
	defer t.Stop()
	for {
		select {
		case <-e.stopped:
			return
		case <-t.C:
		}
		if e.executing.Load() {
			// The driver is inside a collective and reads nothing meanwhile: every rank that waits
			// on rank 0 hears from here that it runs. Sends are bounded by the interval, so that a
			// peer that does not read cannot pile them up.
			ctx, cancel := context.WithTimeout(context.Background(), keepAliveEvery(e.cfg.ProgressTimeout))
			for r := 1; r < e.g.Size; r++ {
				if e.g.Messenger.Lost(r) == nil {
					_ = e.g.Messenger.SendMsg(ctx, r, e.kaMsg) // a lost peer is the driver's to report
				}
			}
			cancel()
			continue
		}
		e.kaDue.Store(true)
		e.summonBackground() // if nobody drives
		e.wakeDriver()       // if someone sleeps
	}
}

// sendKeepAlives (rank 0's driver) sends a keep-alive to every rank whose submissions the Hub has
// not answered, when a round is due. It returns false when the loop must end.
func (e *Engine) sendKeepAlives() bool {
	if !e.kaDue.Load() || !e.kaDue.CompareAndSwap(true, false) || e.leaving {
		return true
	}
	clear(e.kaWaiting)
	e.hub.Waiting(e.kaWaiting)
	for r, waits := range e.kaWaiting {
		if !waits || r == e.g.Rank {
			continue
		}
		if err := e.g.Messenger.SendMsg(context.Background(), r, e.kaMsg); err != nil {
			e.fail(e.lostError(r, fmt.Errorf("send keep-alive: %w", err)))
			return false
		}
	}
	return true
}

// heartbeat (ranks other than 0) tells rank 0 that this process runs, every keepAliveEvery, until
// the loop ends.
func (e *Engine) heartbeat() {
	every := keepAliveEvery(e.cfg.ProgressTimeout)
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-e.stopped:
			return
		case <-t.C:
		}
		if e.g.Messenger.Lost(0) != nil {
			return // the driver reports it
		}
		ctx, cancel := context.WithTimeout(context.Background(), every)
		_ = e.g.Messenger.SendMsg(ctx, 0, e.kaMsg) // a failed send is the driver's to report
		cancel()
	}
}

// memberClock is rank 0's deadline on the other ranks: when it last heard from each.
type memberClock struct {
	heard   []time.Time // per rank: the step that last read a message from it
	missing []bool      // scratch for Hub.Missing
	last    time.Time   // the previous look
}

// watchMembers (rank 0, at each tick) stops the job, naming the rank, when ranks wait on an op that
// rank has not submitted and rank 0 has heard nothing from it, not even its heartbeat, for
// ProgressTimeout: its process is frozen. It returns false when the loop must end.
func (e *Engine) watchMembers(now time.Time) bool {
	m := &e.members
	if m.heard == nil {
		return true
	}
	gap := now.Sub(m.last)
	first := m.last.IsZero()
	m.last = now
	if first || transport.NotRunning(gap, checkEvery) {
		// Rank 0 itself did not run meanwhile: what it did not hear says nothing of the others.
		for r := range m.heard {
			m.heard[r] = now
		}
		return true
	}
	clear(m.missing)
	e.hub.Missing(m.missing)
	for r, miss := range m.missing {
		if !miss || r == e.g.Rank || now.Sub(m.heard[r]) < e.cfg.ProgressTimeout {
			continue
		}
		reason := fmt.Sprintf("rank %d", r)
		if h := e.host(r); h != "" {
			reason += fmt.Sprintf(" (%s)", h)
		}
		reason += fmt.Sprintf(" made no progress for %v: other ranks wait for it to submit its next op, and it has sent nothing for %v, not even its heartbeat: its process is stopped (SIGSTOP, a paused machine, swapped out), not merely computing",
			e.cfg.ProgressTimeout, roundAge(now.Sub(m.heard[r])))
		e.resolveStall(negotiate.Abort{Rank: e.g.Rank, Reason: reason, Stalled: true, StalledOn: r}, true, e.cfg.ProgressTimeout)
		return false
	}
	return true
}

// coordClock is a rank's deadline on its coordinator: how long it has waited on rank 0 without
// hearing from it.
type coordClock struct {
	since time.Time // the start of the silence; zero while this rank waits on nothing
	last  time.Time // the previous look
}

// heard records a message from rank 0.
func (c *coordClock) heard(now time.Time) { c.since = now }

// expired looks at the clock at now: waiting says whether this rank has submissions rank 0 has
// not answered. The silence starts when the rank starts waiting, or last heard from rank 0; a look
// that comes much later than the driver's sleeps allow means this process did not run meanwhile
// (stopped itself, or a long collective kept the driver away), and the silence starts again.
func (c *coordClock) expired(now time.Time, waiting bool, limit time.Duration) bool {
	gap := now.Sub(c.last)
	first := c.last.IsZero()
	c.last = now
	switch {
	case !waiting:
		c.since = time.Time{}
		return false
	case c.since.IsZero() || (!first && transport.NotRunning(gap, checkEvery)):
		c.since = now
		return false
	}
	return now.Sub(c.since) >= limit
}

// watchCoordinator (ranks other than 0, each step) fails this rank's ops and stops the job when it
// has waited on rank 0 for ProgressTimeout without hearing from it. It returns false when the loop
// must end.
func (e *Engine) watchCoordinator(now time.Time) bool {
	if e.hub != nil || e.cfg.ProgressTimeout <= 0 {
		return true
	}
	waiting := e.inflight > 0 || e.joining != nil
	if !e.coord.expired(now, waiting, e.cfg.ProgressTimeout) {
		return true
	}
	reason := e.coordinatorStalled(now)
	e.resolveStall(negotiate.Abort{Rank: e.g.Rank, Reason: reason, Stalled: true, StalledOn: 0}, true, e.cfg.ProgressTimeout)
	return false
}

// coordinatorStalled words the deadline on rank 0, naming the op this rank has waited on longest:
// `rank 1: rank 0 (node0) made no progress for 1m0s: it coordinates process set 0 and has not
// answered allreduce "grad.w" submitted 1m0s ago`.
func (e *Engine) coordinatorStalled(now time.Time) string {
	var oldest *entry
	for _, ps := range e.sets {
		for _, en := range ps.pending {
			if oldest == nil || en.submitted.Before(oldest.submitted) {
				oldest = en
			}
		}
	}
	if e.joining != nil && (oldest == nil || e.joining.submitted.Before(oldest.submitted)) {
		oldest = e.joining
	}
	var b strings.Builder
	fmt.Fprintf(&b, "rank %d: rank 0", e.g.Rank)
	if h := e.host(0); h != "" {
		fmt.Fprintf(&b, " (%s)", h)
	}
	fmt.Fprintf(&b, " made no progress for %v: it coordinates", e.cfg.ProgressTimeout)
	if oldest == nil {
		b.WriteString(" this rank's ops and has not answered them")
		return b.String()
	}
	set := 0
	if oldest.set != nil {
		set = oldest.set.id
	}
	fmt.Fprintf(&b, " process set %d and has not answered %s %q submitted %v ago", set, oldest.req.Kind, oldest.req.Name, roundAge(now.Sub(oldest.submitted)))
	if n := e.inflight; n > 1 {
		fmt.Fprintf(&b, " (nor %d more ops)", n-1)
	}
	return b.String()
}

// roundAge rounds d for a message: to the millisecond under a second, else to the second.
func roundAge(d time.Duration) time.Duration {
	if d < time.Second {
		return d.Round(time.Millisecond)
	}
	return d.Round(time.Second)
}
