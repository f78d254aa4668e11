package tcp

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kolo-dl/kolo/internal/transport"
)

// dir is one direction of one peer's byte stream, striped over the peer's data connections: byte k
// of the stream (counting from the mesh's start) travels on connection (k / chunk) % streams. Both
// ends count bytes the same way, so message boundaries need not match (transport.Comm's stream
// semantics) and no header is sent.
//
// Only the calling goroutine and the workers it hands jobs to touch a dir, one call at a time; the
// hot path allocates nothing: jobs and results are values on channels created once.
type dir struct {
	p     *peer
	send  bool
	conns []conn
	off   uint64 // stream offset of the next byte; advanced only by whole successful calls

	jobs []chan job  // per connection: work for its worker
	done chan result // results of posted jobs, sized for one per connection

	// The watcher turns ctx's end into a past deadline on this direction's connections, the only
	// way to interrupt a blocked read or write. It waits on the Done channel of the last ctx a
	// call used, so calls that share one ctx (the usual case) cost it no wake-up at all.
	wmu       sync.Mutex
	watchDone <-chan struct{} // what the watcher should wait on
	active    bool            // a call is running (begin .. end)
	watched   bool            // the running call's ctx can end
	fired     bool            // the watcher interrupted the running call
	kick      chan struct{}   // watchDone changed

	// The progress watchdog (Mesh.watchProgress) interrupts the running call the same way, setting
	// stalled, when it moved no byte for the mesh's progress timeout. The call side counts calls
	// (under wmu) and moved bytes (one atomic add per read or write); the watchdog alone reads the
	// clock.
	moved     atomic.Uint64 // reads and writes that moved bytes, while the watchdog runs
	calls     uint64        // calls begun (under wmu): a new call restarts the clock
	stalled   bool          // the watchdog interrupted the running call (under wmu)
	abandoned bool          // the call's other half failed, and cut this one short (under wmu)
	seenCalls uint64        // watchdog-owned (under wmu): what it saw at since
	seenMoved uint64
	since     time.Time
}

type job struct {
	b   []byte
	off uint64
}

type result struct {
	n   int64
	err error
}

func (d *dir) init(p *peer, send bool, conns []conn) {
	d.p = p
	d.send = send
	d.conns = conns
	d.jobs = make([]chan job, len(conns))
	for s := range d.jobs {
		d.jobs[s] = make(chan job, 1)
	}
	d.done = make(chan result, len(conns))
	d.kick = make(chan struct{}, 1)
}

func (d *dir) startWorkers(wg *sync.WaitGroup) {
	for s := range d.jobs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := range d.jobs[s] {
				n, err := d.run(s, j.b, j.off)
				d.done <- result{n, err}
			}
		}()
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		d.watch(d.p.m.quit)
	}()
}

// stopWorkers ends the workers; called by Close once no call can post any more. The watcher
// leaves on quit by itself.
func (d *dir) stopWorkers() {
	for _, ch := range d.jobs {
		close(ch)
	}
}

func (d *dir) watch(quit <-chan struct{}) {
	var done <-chan struct{} // nil blocks forever
	for {
		select {
		case <-done:
			d.wmu.Lock()
			if d.active && d.watched && d.watchDone == done {
				d.fired = true
				d.setDeadline(aLongTimeAgo)
			}
			if d.watchDone == done {
				d.watchDone = nil // closed for good: the next call must kick again
			}
			d.wmu.Unlock()
			done = nil
		case <-d.kick:
			d.wmu.Lock()
			done = d.watchDone
			d.wmu.Unlock()
		case <-quit:
			return
		}
	}
}

func (d *dir) setDeadline(t time.Time) {
	for _, c := range d.conns {
		if d.send {
			c.SetWriteDeadline(t)
		} else {
			c.SetReadDeadline(t)
		}
	}
}

// begin starts a call on this direction, to be interrupted when ctx ends (by the watcher) or when it
// moves nothing for the progress timeout (by the watchdog). It reports whether the call must end
// with end: not when neither can interrupt it.
func (d *dir) begin(ctx context.Context) bool {
	done := ctx.Done()
	if done == nil && d.p.m.progress == 0 {
		return false
	}
	d.wmu.Lock()
	d.active = true
	d.calls++
	d.watched = done != nil
	changed := false
	if done != nil {
		changed = d.watchDone != done
		d.watchDone = done
	}
	d.wmu.Unlock()
	if changed {
		select {
		case d.kick <- struct{}{}:
		default: // a kick is pending; the watcher reads watchDone when it takes it
		}
	}
	return true
}

// interrupted says why a call's transfer was cut short, if it was.
type interrupted struct {
	cancelled bool // ctx ended
	stalled   bool // no progress for the progress timeout
	abandoned bool // the other half of a SendRecv failed
}

// end ends the call begun by begin and reports what interrupted it, restoring the connections'
// deadlines if anything did.
func (d *dir) end() interrupted {
	d.wmu.Lock()
	defer d.wmu.Unlock()
	d.active = false
	why := interrupted{cancelled: d.fired, stalled: d.stalled, abandoned: d.abandoned}
	if why != (interrupted{}) {
		d.fired, d.stalled, d.abandoned = false, false, false
		d.setDeadline(time.Time{})
	}
	return why
}

// abandon cuts the running call short: its other half failed, so the call fails anyway and its
// stream is out of step.
func (d *dir) abandon() {
	d.wmu.Lock()
	defer d.wmu.Unlock()
	if d.active && !d.abandoned {
		d.abandoned = true
		d.setDeadline(aLongTimeAgo)
	}
}

// tick is the progress watchdog's look at this direction at now: a running call that moved no
// byte since the watchdog last saw it move, for limit, is interrupted. frozen says this process
// did not run for a while: nobody's clock runs then.
func (d *dir) tick(now time.Time, frozen bool, limit time.Duration) {
	d.wmu.Lock()
	defer d.wmu.Unlock()
	if !d.active || d.stalled || d.fired || d.abandoned {
		return
	}
	moved := d.moved.Load()
	if frozen || d.calls != d.seenCalls || moved != d.seenMoved || d.since.IsZero() {
		d.seenCalls, d.seenMoved, d.since = d.calls, moved, now
		return
	}
	if now.Sub(d.since) >= limit {
		d.stalled = true
		d.setDeadline(aLongTimeAgo)
	}
}

// span returns the connection carrying the first byte of a transfer of n bytes at the current
// offset, and how many connections carry some of it.
func (d *dir) span(n int) (first, count int) {
	c := d.p.m.chunk
	k0 := d.off / c
	k1 := (d.off + uint64(n) - 1) / c
	s := uint64(len(d.conns))
	return int(k0 % s), int(min(k1-k0+1, s))
}

// post hands the pieces of b on every involved connection except keep (-1: none) to the workers.
func (d *dir) post(b []byte, first, count, keep int) (posted int) {
	for i := range count {
		s := (first + i) % len(d.conns)
		if s == keep {
			continue
		}
		d.jobs[s] <- job{b, d.off}
		posted++
	}
	return posted
}

func (d *dir) wait(posted int) (n int64, err error) {
	for range posted {
		r := <-d.done
		n += r.n
		if err == nil {
			err = r.err
		}
	}
	return n, err
}

// run moves the pieces of b (which starts at stream offset off) that belong to connection s.
func (d *dir) run(s int, b []byte, off uint64) (int64, error) {
	c := d.conns[s]
	if len(d.conns) == 1 {
		return d.io(c, s, b)
	}
	chunk, streams := d.p.m.chunk, uint64(len(d.conns))
	end := off + uint64(len(b))
	k := off / chunk
	k += (uint64(s) + streams - k%streams) % streams // first chunk at or after off on stream s
	var n int64
	for ; k*chunk < end; k += streams {
		lo, hi := max(k*chunk, off)-off, min((k+1)*chunk, end)-off
		m, err := d.io(c, s, b[lo:hi])
		n += m
		if err != nil {
			return n, err
		}
	}
	return n, nil
}

// writePiece bounds one write while the progress watchdog runs, so that it sees a slow but moving
// link move: a write returns only once all of its bytes are in the kernel's buffer.
const writePiece = 1 << 20

func (d *dir) io(c conn, s int, b []byte) (int64, error) {
	var n int
	var err error
	switch {
	case d.p.m.progress == 0 && d.send:
		n, err = c.Write(b)
	case d.p.m.progress == 0:
		n, err = io.ReadFull(c, b)
	default:
		// As Write and ReadFull, counting every step for the watchdog.
		for n < len(b) && err == nil {
			var k int
			if d.send {
				k, err = c.Write(b[n:min(n+writePiece, len(b))])
			} else {
				k, err = c.Read(b[n:])
			}
			if k > 0 {
				n += k
				d.moved.Add(1)
			}
		}
		if err == io.EOF && n > 0 {
			err = io.ErrUnexpectedEOF
		}
	}
	if err != nil {
		return int64(n), fmt.Errorf("data stream %d: %w", s, err)
	}
	return int64(n), nil
}

// finish settles a call's outcome for this direction. A call cut short by ctx leaves the stream in
// step only if it moved no byte; otherwise both ends disagree about where the stream is and the
// peer is unusable. A call the progress watchdog cut short fails with a *transport.StallError, and
// the peer's data lane with it: its connections stay open, so that the control lane still carries
// the engine's notice of why the job stops, and the stalled peer, once it runs again, finds it.
func (d *dir) finish(ctx context.Context, op string, want int, n int64, err error, why interrupted) error {
	if err == nil {
		d.off += uint64(want)
		return nil
	}
	p := d.p
	if p.m.closed.Load() {
		return fmt.Errorf("rank %d: %s rank %d: %w", p.m.rank, op, p.rank, transport.ErrClosed)
	}
	timedOut := errors.Is(err, os.ErrDeadlineExceeded)
	if why.stalled && timedOut {
		verb := "received"
		if d.send {
			verb = "sent"
		}
		se := &transport.StallError{Rank: p.rank, Host: p.host, Op: op, For: p.m.progress,
			Detail: fmt.Sprintf("%d of %d bytes %s", n, want, verb)}
		p.breakData(se)
		return se
	}
	if why.abandoned && timedOut {
		err := fmt.Errorf("rank %d: %s rank %d: abandoned after %d of %d bytes: the call's other half failed", p.m.rank, op, p.rank, n, want)
		if n > 0 {
			p.breakData(err)
		}
		return err
	}
	if why.cancelled && ctx.Err() != nil {
		if n > 0 {
			p.markLost(op, fmt.Errorf("call cancelled after %d of %d bytes, stream out of step: %w", n, want, ctx.Err()))
		}
		return fmt.Errorf("rank %d: %s %d bytes, rank %d: stopped after %d: %w", p.m.rank, op, want, p.rank, n, ctx.Err())
	}
	return p.markLost(op, err)
}

// meshComm is the Mesh seen as a transport.Comm.
type meshComm Mesh

var _ transport.Comm = (*meshComm)(nil)

func (c *meshComm) Rank() int    { return c.rank }
func (c *meshComm) Size() int    { return c.size }
func (c *meshComm) Close() error { return (*Mesh)(c).Close() }

// Send writes b to peer's stream. Pieces on the first connection go from this goroutine, the rest
// from the connections' workers in parallel.
func (c *meshComm) Send(ctx context.Context, peer int, b []byte) error {
	return c.transfer(ctx, peer, b, "send")
}

// Recv fills b from peer's stream, reading the connections in parallel the same way.
func (c *meshComm) Recv(ctx context.Context, peer int, b []byte) error {
	return c.transfer(ctx, peer, b, "recv")
}

// transfer moves b over peer's outgoing ("send") or incoming ("recv") stripes.
func (c *meshComm) transfer(ctx context.Context, peer int, b []byte, op string) error {
	m := (*Mesh)(c)
	m.opMu.RLock()
	defer m.opMu.RUnlock()
	p, err := m.dataPeer(ctx, peer, op)
	if err != nil || len(b) == 0 {
		return err
	}
	if err := ctx.Err(); err != nil {
		dir := "to"
		if op == "recv" {
			dir = "from"
		}
		return fmt.Errorf("rank %d: %s %s rank %d: %w", m.rank, op, dir, peer, err)
	}
	d := &p.out
	if op == "recv" {
		d = &p.in
	}
	begun := d.begin(ctx)
	first, count := d.span(len(b))
	posted := d.post(b, first, count, first)
	n, err := d.run(first, b, d.off)
	nw, errw := d.wait(posted)
	var why interrupted
	if begun {
		why = d.end()
	}
	return d.finish(ctx, op, len(b), n+nw, firstErr(err, errw), why)
}

// SendRecv hands the whole send to the workers and receives meanwhile, so neither side of a ring
// or a pairwise exchange waits for the other.
func (c *meshComm) SendRecv(ctx context.Context, to int, sb []byte, from int, rb []byte) error {
	m := (*Mesh)(c)
	m.opMu.RLock()
	defer m.opMu.RUnlock()
	var po, pi *peer
	var err error
	if len(sb) > 0 || len(rb) == 0 {
		if po, err = m.dataPeer(ctx, to, "send"); err != nil {
			return err
		}
	}
	if len(rb) > 0 {
		if pi, err = m.dataPeer(ctx, from, "recv"); err != nil {
			return err
		}
	}
	if len(sb) == 0 && len(rb) == 0 {
		return nil
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("rank %d: sendrecv with ranks %d and %d: %w", m.rank, to, from, err)
	}
	var out, in *dir
	var begunOut bool
	var postedOut int
	if len(sb) > 0 {
		out = &po.out
		begunOut = out.begin(ctx)
		first, count := out.span(len(sb))
		postedOut = out.post(sb, first, count, -1)
	}
	var sendErr, recvErr error
	if len(rb) > 0 {
		in = &pi.in
		begunIn := in.begin(ctx)
		first, count := in.span(len(rb))
		posted := in.post(rb, first, count, first)
		n, err := in.run(first, rb, in.off)
		nw, errw := in.wait(posted)
		var why interrupted
		if begunIn {
			why = in.end()
		}
		recvErr = in.finish(ctx, "recv", len(rb), n+nw, firstErr(err, errw), why)
		if why.stalled && out != nil && begunOut {
			// The call fails: do not wait on a send that may never end either.
			out.abandon()
		}
	}
	if out != nil {
		n, err := out.wait(postedOut)
		var why interrupted
		if begunOut {
			why = out.end()
		}
		sendErr = out.finish(ctx, "send", len(sb), n, err, why)
	}
	return firstErr(recvErr, sendErr)
}

func firstErr(a, b error) error {
	if a != nil {
		return a
	}
	return b
}

// dataPeer is peerFor for the data lane, which a transfer cut short midway has left out of step.
func (m *Mesh) dataPeer(ctx context.Context, r int, op string) (*peer, error) {
	p, err := m.peerFor(ctx, r, op)
	if err != nil {
		return nil, err
	}
	if broken := p.broken.Load(); broken != nil {
		return nil, fmt.Errorf("rank %d: %s rank %d: data stream out of step since an earlier transfer failed: %w", m.rank, op, r, *broken)
	}
	return p, nil
}

// breakData marks p's data lane unusable without closing its connections (see finish).
func (p *peer) breakData(err error) { p.broken.CompareAndSwap(nil, &err) }
