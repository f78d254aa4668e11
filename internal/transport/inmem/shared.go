package inmem

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kolo-dl/kolo/internal/transport"
)

// errNoShared is what Barrier reports on a group built WithoutShared.
var errNoShared = errors.New("inmem: group built WithoutShared has no shared slots")

// Slot returns rank r's slot. All slots of a group are cut from one allocation made by New and
// live as long as the group. It returns nil for a group built WithoutShared.
func (e *Endpoint) Slot(r int) []byte {
	if !e.g.shared {
		return nil
	}
	return e.g.slots[r]
}

// Oversubscribed reports what WithOversubscribed set: ranks here are goroutines, so CPUs say nothing.
func (e *Endpoint) Oversubscribed() bool { return e.g.oversubscribed }

// Memo is this rank's word for the group's algorithms (transport.Shared).
func (e *Endpoint) Memo() *atomic.Uint32 { return &e.memo }

// barrier is a counting barrier whose last arrival wakes the waiters through their own one-slot
// channels, so that a barrier allocates nothing. The mutex orders memory: every arrival's writes
// happen before the last arrival's unlock, which happens before each waiter's re-lock.
type barrier struct {
	mu      sync.Mutex
	count   int
	gen     uint64
	waiting []int
}

// barrierSpins bounds how often a waiter yields before it blocks: enough to catch a barrier that
// completes within a scheduling quantum when ranks have cores, few enough not to steal CPU from
// the ranks it waits for when they do not.
const barrierSpins = 50

// Barrier returns once every rank of the group has entered the same Barrier. It fails with a
// *transport.PeerError when a rank was killed, or closed without arriving, and with ctx's error.
// After a failed Barrier the group's barrier is out of step and must not be used again.
func (e *Endpoint) Barrier(ctx context.Context) error {
	g := e.g
	if !g.shared {
		return fmt.Errorf("inmem: rank %d: barrier: %w", e.rank, errNoShared)
	}
	e.stayPaused()
	if err := e.selfErr("barrier"); err != nil {
		return err
	}
	b := &g.bar
	b.mu.Lock()
	gen := b.gen
	b.count++
	if b.count == g.size {
		b.count = 0
		b.gen++
		for _, w := range b.waiting {
			signal(g.eps[w].barWake)
		}
		b.waiting = b.waiting[:0]
		b.mu.Unlock()
		return nil
	}
	b.waiting = append(b.waiting, e.rank)
	b.mu.Unlock()

	passed := func() bool {
		b.mu.Lock()
		defer b.mu.Unlock()
		return b.gen != gen
	}
	for i := 0; i < barrierSpins; i++ {
		select {
		case <-e.barWake:
			if passed() {
				return nil
			}
		default:
		}
		runtime.Gosched()
	}
	var clock stallClock
	arrived := -1 // how many ranks had arrived at the last look: an arrival is progress
	for {
		b.mu.Lock()
		n := len(b.waiting)
		b.mu.Unlock()
		if n != arrived {
			arrived, clock.since = n, time.Time{}
		}
		expired, timeout := e.expired(&clock, e.stayPaused())
		if expired && !passed() {
			late := e.notArrived(gen)
			if len(late) > 0 {
				return fmt.Errorf("inmem: rank %d: barrier (generation %d): %w", e.rank, gen,
					e.stall(late[0], "barrier", fmt.Sprintf("ranks %v have not arrived", late)))
			}
		}
		select {
		case <-e.barWake:
			if passed() {
				return nil
			}
			continue
		case <-timeout:
			continue
		case <-g.gone:
		case <-ctx.Done():
			if passed() {
				return nil
			}
			return fmt.Errorf("inmem: rank %d: barrier (generation %d): waiting for the other %d ranks: %w",
				e.rank, gen, g.size-1, ctx.Err())
		}
		// Somebody left the group. Prefer success: the barrier may have completed just before.
		if passed() {
			return nil
		}
		if err := e.selfErr("barrier"); err != nil {
			return err
		}
		for _, p := range g.eps {
			if p.isKilled() {
				return &transport.PeerError{Rank: p.rank, Op: "barrier", Err: p.killErr}
			}
		}
		for _, p := range g.eps {
			if p.isClosed() {
				return &transport.PeerError{Rank: p.rank, Op: "barrier", Err: transport.ErrClosed}
			}
		}
	}
}

// notArrived lists the ranks that have not entered barrier generation gen, which is still open.
func (e *Endpoint) notArrived(gen uint64) []int {
	b := &e.g.bar
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.gen != gen {
		return nil
	}
	in := make([]bool, e.g.size)
	for _, r := range b.waiting {
		in[r] = true
	}
	var late []int
	for r, ok := range in {
		if !ok {
			late = append(late, r)
		}
	}
	return late
}
