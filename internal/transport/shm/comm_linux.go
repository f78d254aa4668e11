//go:build linux

package shm

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/kolo-dl/kolo/internal/transport"
)

// comm is the Group's transport.Comm and transport.Shared. Like every Comm it is used by one
// goroutine at a time, which is what lets each ring end keep its counter in process memory.
type comm struct {
	g        *Group
	send     []ringEnd // send[p]: ring to p (unused for p == rank)
	recv     []ringEnd // recv[p]: ring from p
	self     []byte    // bytes sent to this rank itself and not yet received
	barriers uint64    // Barriers entered so far
	memo     atomic.Uint32
}

var (
	_ transport.Comm    = (*comm)(nil)
	_ transport.Shared  = (*comm)(nil)
	_ transport.Spinner = (*comm)(nil)
)

func newComm(g *Group) *comm {
	c := &comm{g: g, send: make([]ringEnd, g.size), recv: make([]ringEnd, g.size)}
	l, me := g.lay, g.rank
	for p := range g.size {
		if p == me {
			continue
		}
		c.send[p] = newRingEnd(g.mem, l.ringCtl(me, p), l.ring(me, p), l.ringBytes, true, g.bell(p, rCommBell))
		c.recv[p] = newRingEnd(g.mem, l.ringCtl(p, me), l.ring(p, me), l.ringBytes, false, g.bell(p, rCommBell))
	}
	c.barriers = atomic.LoadUint64(g.u64(l.rankBlock(me) + rBarArrived))
	return c
}

func (c *comm) Rank() int { return c.g.rank }
func (c *comm) Size() int { return c.g.size }

// Abort is Group.Abort, for callers that hold only the Comm.
func (c *comm) Abort(err error) { c.g.Abort(err) }

func (c *comm) checkPeer(op string, peer int) error {
	if peer < 0 || peer >= c.g.size {
		return fmt.Errorf("shm: rank %d: %s peer %d out of range [0, %d)", c.g.rank, op, peer, c.g.size)
	}
	return nil
}

// begin takes the mapping for one operation; the caller must call c.g.mu.RUnlock when it ends.
// An abort is not checked here but by the waits: a call that need not wait (its bytes are in the
// ring, or there is room for them) completes after an abort as before it, as bytes a TCP peer sent
// before it closed are still read. A rank may finish an op, and have sent everything the others
// need of it, and then abort: their copies of that op must still complete.
func (c *comm) begin() error {
	c.g.mu.RLock()
	if c.g.commClosed.Load() {
		c.g.mu.RUnlock()
		return transport.ErrClosed
	}
	return nil
}

func (c *comm) waiter(ctx context.Context) waiter {
	w := c.g.newWaiter(ctx, c.g.bell(c.g.rank, rCommBell), &c.g.commClosed, true)
	w.clock.limit = c.g.cfg.ProgressTimeout
	return w
}

// stalled turns a wait's errNoProgress into a *transport.StallError naming peer (local rank) by its
// job rank; other errors pass unchanged. detail is formatted only then: the hot path pays nothing.
func (c *comm) stalled(err error, peer int, op string, detail func() string) error {
	if err != errNoProgress {
		return err
	}
	g := c.g
	rank := peer
	if g.cfg.Ranks != nil {
		rank = g.cfg.Ranks[peer]
	}
	return &transport.StallError{Rank: rank, Host: g.cfg.Host, Op: op, For: g.cfg.ProgressTimeout, Detail: detail()}
}

// Send copies b into the ring to peer, waiting for room as the peer drains it.
func (c *comm) Send(ctx context.Context, peer int, b []byte) error {
	if err := c.checkPeer("send to", peer); err != nil {
		return err
	}
	if peer == c.g.rank {
		c.self = append(c.self, b...)
		return nil
	}
	if len(b) == 0 {
		return nil
	}
	if err := c.begin(); err != nil {
		return fmt.Errorf("shm: rank %d: send %d bytes to rank %d: %w", c.g.rank, len(b), peer, err)
	}
	defer c.g.mu.RUnlock()
	r := &c.send[peer]
	if err := c.g.reserveRing(r, "data", peer); err != nil {
		return fmt.Errorf("shm: rank %d: send %d bytes to rank %d: %w", c.g.rank, len(b), peer, err)
	}
	w := c.waiter(ctx)
	defer w.done()
	gone := func(procs bool) error { return c.g.peerGone(peer, "send", stateCommClosed, procs) }
	for off := 0; off < len(b); {
		if n := r.put(b[off:]); n > 0 {
			off += n
			w.progressed()
			continue
		}
		if err := w.wait(r.writable, gone); err != nil {
			err = c.stalled(err, peer, "send", func() string { return fmt.Sprintf("%d of %d bytes sent", off, len(b)) })
			return fmt.Errorf("shm: rank %d: send %d bytes to rank %d, %d sent: %w", c.g.rank, len(b), peer, off, err)
		}
	}
	return nil
}

// Recv fills b from the ring from peer.
func (c *comm) Recv(ctx context.Context, peer int, b []byte) error {
	if err := c.checkPeer("recv from", peer); err != nil {
		return err
	}
	if peer == c.g.rank {
		return c.recvSelf(b)
	}
	if len(b) == 0 {
		return nil
	}
	if err := c.begin(); err != nil {
		return fmt.Errorf("shm: rank %d: recv %d bytes from rank %d: %w", c.g.rank, len(b), peer, err)
	}
	defer c.g.mu.RUnlock()
	r := &c.recv[peer]
	w := c.waiter(ctx)
	defer w.done()
	gone := func(procs bool) error { return c.g.peerGone(peer, "recv", stateCommClosed, procs) }
	for off := 0; off < len(b); {
		if n := r.get(b[off:]); n > 0 {
			off += n
			w.progressed()
			continue
		}
		if err := w.wait(r.readable, gone); err != nil {
			err = c.stalled(err, peer, "recv", func() string { return fmt.Sprintf("%d of %d bytes received", off, len(b)) })
			return fmt.Errorf("shm: rank %d: recv %d bytes from rank %d, %d received: %w", c.g.rank, len(b), peer, off, err)
		}
	}
	return nil
}

func (c *comm) recvSelf(b []byte) error {
	if len(c.self) < len(b) {
		return fmt.Errorf("shm: rank %d: recv %d bytes from itself, but only %d were sent: a rank's sends to itself must precede its receives",
			c.g.rank, len(b), len(c.self))
	}
	n := copy(b, c.self)
	c.self = c.self[n:]
	if len(c.self) == 0 {
		c.self = c.self[:0:0] // let the buffer go rather than keep its largest size forever
	}
	return nil
}

// SendRecv alternates between the two rings, moving as much as it can each way before it waits, so
// ranks that all send and receive at once (rings, pairwise exchanges) never wait on each other.
func (c *comm) SendRecv(ctx context.Context, to int, sb []byte, from int, rb []byte) error {
	if err := c.checkPeer("send to", to); err != nil {
		return err
	}
	if err := c.checkPeer("recv from", from); err != nil {
		return err
	}
	me := c.g.rank
	if to == me {
		c.self = append(c.self, sb...)
		sb = nil
	}
	if from == me {
		if err := c.recvSelf(rb); err != nil {
			return err
		}
		rb = nil
	}
	switch {
	case len(rb) == 0:
		return c.Send(ctx, to, sb)
	case len(sb) == 0:
		return c.Recv(ctx, from, rb)
	}
	if err := c.begin(); err != nil {
		return fmt.Errorf("shm: rank %d: sendrecv %d bytes to rank %d, %d from rank %d: %w", me, len(sb), to, len(rb), from, err)
	}
	defer c.g.mu.RUnlock()
	s, r := &c.send[to], &c.recv[from]
	if err := c.g.reserveRing(s, "data", to); err != nil {
		return fmt.Errorf("shm: rank %d: sendrecv %d bytes to rank %d, %d from rank %d: %w", me, len(sb), to, len(rb), from, err)
	}
	var so, ro int
	ready := func() bool {
		return (so < len(sb) && s.writable()) || (ro < len(rb) && r.readable())
	}
	gone := func(procs bool) error {
		if so < len(sb) {
			if err := c.g.peerGone(to, "send", stateCommClosed, procs); err != nil {
				return err
			}
		}
		if ro < len(rb) {
			return c.g.peerGone(from, "recv", stateCommClosed, procs)
		}
		return nil
	}
	w := c.waiter(ctx)
	defer w.done()
	for so < len(sb) || ro < len(rb) {
		moved := false
		if so < len(sb) {
			n := s.put(sb[so:])
			so += n
			moved = n > 0
		}
		if ro < len(rb) {
			n := r.get(rb[ro:])
			ro += n
			moved = moved || n > 0
		}
		if moved {
			w.progressed()
			continue
		}
		if err := w.wait(ready, gone); err != nil {
			// Blame the peer whose data does not arrive, if any: in a ring, a rank's send stalls
			// only once the rank after it stops draining, while its receive stalls at once when
			// the rank before it stops.
			if ro < len(rb) && !r.readable() {
				err = c.stalled(err, from, "recv", func() string { return fmt.Sprintf("%d of %d bytes received", ro, len(rb)) })
			} else {
				err = c.stalled(err, to, "send", func() string { return fmt.Sprintf("%d of %d bytes sent", so, len(sb)) })
			}
			return fmt.Errorf("shm: rank %d: sendrecv %d bytes to rank %d (%d sent), %d from rank %d (%d received): %w",
				me, len(sb), to, so, len(rb), from, ro, err)
		}
	}
	return nil
}

// Slot returns rank r's slot in this process's mapping. It is valid until the Group is closed.
func (c *comm) Slot(r int) []byte {
	off, n := c.g.lay.slot(r), int64(c.g.lay.slotBytes)
	return c.g.mem[off : off+n : off+n]
}

// SetSpin changes how long this rank's waits poll before they sleep, from their next wait on
// (transport.Spinner): d <= 0, never; unlike Config.Spin, 0 is not "the default". A wait that does
// not poll yields its CPU Config.Yields times instead, as before.
func (c *comm) SetSpin(d time.Duration) {
	if d <= 0 {
		d = -1
	}
	c.g.spinNs.Store(int64(d))
}

// Oversubscribed reports whether the segment has more ranks than local rank 0 had CPUs to run on
// when it created the segment: one answer for every rank, so algorithms may choose by it.
func (c *comm) Oversubscribed() bool {
	return uint32(c.g.size) > atomic.LoadUint32(c.g.u32(offHostCPUs))
}

// Memo is this rank's word for the group's algorithms (transport.Shared), kept in process memory
// with the Group, not in the segment: it is this rank's own.
func (c *comm) Memo() *atomic.Uint32 { return &c.memo }

// Barrier counts arrivals in one shared counter: the n-th Barrier of every rank completes once the
// counter reaches n*Size, and the arrival that reaches it rings the barrier's doorbell. Because no
// rank can start barrier n+1 before barrier n completed, the counter cannot reach n*Size early.
// After a failed Barrier the counter no longer matches and the group must not be used further.
func (c *comm) Barrier(ctx context.Context) error {
	g := c.g
	if err := c.begin(); err != nil {
		return fmt.Errorf("shm: rank %d: barrier %d: %w", g.rank, c.barriers+1, err)
	}
	defer g.mu.RUnlock()
	c.barriers++
	n := c.barriers
	target := n * uint64(g.size)
	atomic.StoreUint64(g.u64(g.lay.rankBlock(g.rank)+rBarArrived), n)
	arrivals := g.u64(offBarArrivals)
	if atomic.AddUint64(arrivals, 1) == target {
		g.barrierBell().ring()
		return nil
	}
	ready := func() bool { return atomic.LoadUint64(arrivals) >= target }
	w := g.newWaiter(ctx, g.barrierBell(), &g.commClosed, true)
	w.clock.limit = g.cfg.ProgressTimeout
	defer w.done()
	seen := atomic.LoadUint64(arrivals)
	gone := func(procs bool) error {
		// An arrival is the barrier's progress (check asks gone before it reads the clock).
		if a := atomic.LoadUint64(arrivals); a != seen {
			seen, w.moved = a, true
		}
		for _, r := range c.notArrived(n) {
			if err := g.peerGone(r, "barrier", stateCommClosed, procs); err != nil {
				return err
			}
		}
		return nil
	}
	for !ready() {
		if err := w.wait(ready, gone); err != nil {
			late := c.notArrived(n)
			if len(late) > 0 { // the wrapping below lists them all
				err = c.stalled(err, late[0], "barrier", func() string { return "" })
			}
			return fmt.Errorf("shm: rank %d: barrier %d: ranks %v have not arrived: %w", g.rank, n, late, err)
		}
	}
	return nil
}

func (c *comm) notArrived(n uint64) []int {
	var late []int
	for r := range c.g.size {
		if atomic.LoadUint64(c.g.u64(c.g.lay.rankBlock(r)+rBarArrived)) < n {
			late = append(late, r)
		}
	}
	return late
}

// Close closes the Comm half: this rank's pending and later calls fail with transport.ErrClosed,
// and peers waiting on this rank fail with a *transport.PeerError.
func (c *comm) Close() error {
	c.g.closeHalf(stateCommClosed)
	return nil
}
