package tcp

import (
	"context"
	"fmt"
	"io"
	"net"
	"sync"
	"time"

	"github.com/kolo-dl/kolo/transport"
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
	conns []*net.TCPConn
	off   uint64 // stream offset of the next byte; advanced only by whole successful calls

	jobs []chan job  // per connection: work for its worker
	done chan result // results of posted jobs, sized for one per connection

	// The watcher turns ctx's end into a past deadline on this direction's connections, the only
	// way to interrupt a blocked read or write. It waits on the Done channel of the last ctx a
	// call used, so calls that share one ctx (the usual case) cost it no wake-up at all.
	wmu       sync.Mutex
	watchDone <-chan struct{} // what the watcher should wait on
	active    bool            // a watched call is running
	fired     bool            // the watcher interrupted the running call
	kick      chan struct{}   // watchDone changed
}

type job struct {
	b   []byte
	off uint64
}

type result struct {
	n   int64
	err error
}

func (d *dir) init(p *peer, send bool, conns []*net.TCPConn) {
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
			if d.active && d.watchDone == done {
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

// watchCtx makes the watcher interrupt this direction when ctx ends; it reports whether ctx can.
func (d *dir) watchCtx(ctx context.Context) bool {
	done := ctx.Done()
	if done == nil {
		return false
	}
	d.wmu.Lock()
	d.active = true
	changed := d.watchDone != done
	d.watchDone = done
	d.wmu.Unlock()
	if changed {
		select {
		case d.kick <- struct{}{}:
		default: // a kick is pending; the watcher reads watchDone when it takes it
		}
	}
	return true
}

// unwatch ends the watched call and reports whether the watcher interrupted it, restoring the
// connections' deadlines if so.
func (d *dir) unwatch() bool {
	d.wmu.Lock()
	defer d.wmu.Unlock()
	d.active = false
	fired := d.fired
	if fired {
		d.fired = false
		d.setDeadline(time.Time{})
	}
	return fired
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

func (d *dir) io(c *net.TCPConn, s int, b []byte) (int64, error) {
	var n int
	var err error
	if d.send {
		n, err = c.Write(b)
	} else {
		n, err = io.ReadFull(c, b)
	}
	if err != nil {
		return int64(n), fmt.Errorf("data stream %d: %w", s, err)
	}
	return int64(n), nil
}

// finish settles a call's outcome for this direction. A call cut short by ctx leaves the stream in
// step only if it moved no byte; otherwise both ends disagree about where the stream is and the
// peer is unusable.
func (d *dir) finish(ctx context.Context, op string, want int, n int64, err error, cancelled bool) error {
	if err == nil {
		d.off += uint64(want)
		return nil
	}
	p := d.p
	if p.m.closed.Load() {
		return fmt.Errorf("rank %d: %s rank %d: %w", p.m.rank, op, p.rank, transport.ErrClosed)
	}
	if cancelled && ctx.Err() != nil {
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
	p, err := m.peerFor(peer, op)
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
	watched := d.watchCtx(ctx)
	first, count := d.span(len(b))
	posted := d.post(b, first, count, first)
	n, err := d.run(first, b, d.off)
	nw, errw := d.wait(posted)
	cancelled := watched && d.unwatch()
	return d.finish(ctx, op, len(b), n+nw, firstErr(err, errw), cancelled)
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
		if po, err = m.peerFor(to, "send"); err != nil {
			return err
		}
	}
	if len(rb) > 0 {
		if pi, err = m.peerFor(from, "recv"); err != nil {
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
	var watchedOut, watchedIn bool
	var postedOut int
	if len(sb) > 0 {
		out = &po.out
		watchedOut = out.watchCtx(ctx)
		first, count := out.span(len(sb))
		postedOut = out.post(sb, first, count, -1)
	}
	var sendErr, recvErr error
	if len(rb) > 0 {
		in = &pi.in
		watchedIn = in.watchCtx(ctx)
		first, count := in.span(len(rb))
		posted := in.post(rb, first, count, first)
		n, err := in.run(first, rb, in.off)
		nw, errw := in.wait(posted)
		cancelled := watchedIn && in.unwatch()
		recvErr = in.finish(ctx, "recv", len(rb), n+nw, firstErr(err, errw), cancelled)
	}
	if out != nil {
		n, err := out.wait(postedOut)
		cancelled := watchedOut && out.unwatch()
		sendErr = out.finish(ctx, "send", len(sb), n, err, cancelled)
	}
	return firstErr(recvErr, sendErr)
}

func firstErr(a, b error) error {
	if a != nil {
		return a
	}
	return b
}
