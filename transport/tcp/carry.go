package tcp

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"time"

	"github.com/kolo-dl/kolo/transport"
)

// A mesh's connections can outlive it. An elastic job re-forms its world among the surviving
// processes after a failure, with new ranks: the connections between two survivors are still
// good, so Mesh.Detach leaves them open and the next mesh adopts them (Config.Adopt) instead of
// dialing, authenticating and striping anew. Only the connections to processes new to each other
// are made.
//
// The old world ended in the middle of something: a collective cut short leaves bytes in flight
// on the data connections, a message half read on the control connection. Adopting a connection
// therefore starts with a resync: each end writes a token (an HMAC under the job's secret of the
// new job id, the two ranks and the connection) and reads the other end's stream up to the
// other's token, dropping whatever the old world left before it. Nothing of the old world can
// pass for the token, and each end reads exactly up to its last byte (the socket is peeked before
// it is read), so the new mesh's first byte is the first byte the peer sent after its token.

// Carried is one peer's connections that Mesh.Detach left open, for the next mesh among the same
// two processes to adopt.
type Carried struct {
	ctrl *net.TCPConn
	data []*net.TCPConn
	rest []byte // control bytes this end had read past the last message, unexamined
}

// Streams is the number of data connections in the set.
func (c *Carried) Streams() int { return len(c.data) }

// Close closes the connections: the set will not be adopted.
func (c *Carried) Close() {
	c.ctrl.Close()
	for _, d := range c.data {
		d.Close()
	}
}

// leaveNotice is the length prefix that stands for "this rank left": larger than any message.
const leaveNotice = 0xFFFFFFFF

// errLeftNotice is readMsg's report of a leave notice.
var errLeftNotice = errors.New("leave notice")

// noticeTimeout bounds writing a leave notice; a peer that does not take four bytes in that time
// is not worth keeping.
const noticeTimeout = time.Second

// Detach ends the mesh as Close does, but leaves open the connections of every peer still healthy
// and returns them by rank, for the next mesh among the same processes to adopt (Config.Adopt).
// It first tells each such peer that this rank left (a notice on the control lane), so that a call
// of the peer's waiting on this rank fails at once with transport.ErrPeerLeft, as a closed connection would
// make it fail. A peer lost otherwise, or one whose control lane is busy, is closed as by Close.
func (m *Mesh) Detach() map[int]*Carried {
	out := map[int]*Carried{}
	m.once.Do(func() {
		m.begin(true)
		keep := make([]bool, len(m.peers))
		for r, p := range m.peers {
			if p == nil || !p.closeLink(true) {
				continue // never connected: nothing to carry or close
			}
			switch {
			case p.left.Load():
				keep[r] = true // it already left us: nothing to tell it
			case p.lost.Load() == nil && p.ctrlMu.TryLock():
				// A SendMsg holding the lock would be writing a frame the notice must not cut.
				err := writeLeaveNotice(p.ctrl)
				p.ctrlMu.Unlock()
				keep[r] = err == nil
			}
			// The peer's own leave notice may have crossed ours: its reader marks it lost (and
			// interrupts the connections, which can fail our notice's write) while we look. A peer
			// that left is still carried: the resync skips whatever either side wrote before it.
			keep[r] = keep[r] || p.left.Load()
			if keep[r] {
				p.interrupt()
			} else {
				p.closeConns()
			}
		}
		m.stop()
		for r, p := range m.peers {
			if p == nil || !keep[r] {
				continue
			}
			p.ctrl.SetDeadline(time.Time{})
			for _, c := range p.out.conns {
				c.SetDeadline(time.Time{})
			}
			out[r] = &Carried{ctrl: p.ctrl, data: p.out.conns, rest: p.ctrlRest}
		}
	})
	return out
}

// writeLeaveNotice tells the peer at the other end of control connection c that this rank left.
func writeLeaveNotice(c *net.TCPConn) error {
	c.SetWriteDeadline(time.Now().Add(noticeTimeout))
	var notice [4]byte
	binary.BigEndian.PutUint32(notice[:], leaveNotice)
	_, err := c.Write(notice[:])
	return err
}

// closeUnused closes connection id of a set this rank will not use. When the rank leaves (left),
// a control connection first carries the leave notice: the peer acked or dialed every connection
// of the set and may have taken it, and its calls are then to fail with transport.ErrPeerLeft, not
// with a closed connection that blames this rank. A rank that closes (Close) writes none.
func closeUnused(id connID, c *net.TCPConn, left bool) {
	if left && id.lane == laneControl {
		writeLeaveNotice(c)
	}
	c.Close()
}

// verdictWait bounds how long a call that found a connection closed by the peer waits for the
// control lane to say why (awaitVerdict).
const verdictWait = time.Second

// awaitVerdict waits, when err says that the peer closed a connection, until p's control reader
// has found its own connection's end (within verdictWait). A peer that left says so there, and may have closed this
// connection first (a set it acked and never took: see closeLink): the call is then to fail with
// transport.ErrPeerLeft, not blame the peer.
func (p *peer) awaitVerdict(err error) {
	if p.lost.Load() != nil || !isHangUp(err) {
		return
	}
	t := time.NewTimer(verdictWait)
	defer t.Stop()
	select {
	case <-p.ctrlDone:
	case <-p.m.quit:
	case <-t.C:
	}
}

// interrupt makes every blocked read and write on p's connections return, leaving them open.
func (p *peer) interrupt() {
	p.ctrl.SetDeadline(aLongTimeAgo)
	for _, c := range p.out.conns {
		c.SetDeadline(aLongTimeAgo)
	}
}

// leave marks p lost because it detached: its calls fail at once with transport.ErrPeerLeft, and its connections
// stay open for Detach to carry.
func (p *peer) leave() {
	pe := &transport.PeerError{Rank: p.rank, Host: p.host, Op: "recv message", Err: transport.ErrPeerLeft}
	if p.lost.Load() != nil {
		return
	}
	// Before lost: a Detach that sees the peer lost must also see that it left, or it would close
	// connections it can carry.
	p.left.Store(true)
	if p.lost.CompareAndSwap(nil, pe) {
		p.m.log.Debug("tcp transport: peer left the world", "rank", p.m.rank, "peer", p.rank, "host", p.host)
		p.interrupt()
	}
}

// adoptResult is one carried set's resync, made this mesh's connections to peer or failed.
type adoptResult struct {
	peer  int
	conns map[connID]*net.TCPConn
	rest  []byte // control bytes after the peer's token: the first of this mesh
	err   error
}

// adopt resyncs peer's carried connections for this mesh: on each, it writes this end's token and
// reads up to the peer's. It closes the set on failure (the peer gave it up, or never came).
func adopt(ctx context.Context, cfg *Config, peer int, c *Carried) adoptResult {
	res := adoptResult{peer: peer}
	if len(c.data) != cfg.Streams {
		c.Close()
		res.err = fmt.Errorf("carried %d data connections, this mesh uses %d", len(c.data), cfg.Streams)
		return res
	}
	ids := setIDs(peer, len(c.data))
	conns := append([]*net.TCPConn{c.ctrl}, c.data...)
	if dl, ok := ctx.Deadline(); ok {
		for _, cn := range conns {
			cn.SetDeadline(dl)
		}
	}
	stop := context.AfterFunc(ctx, func() {
		for _, cn := range conns {
			cn.SetDeadline(aLongTimeAgo)
		}
	})
	type one struct {
		i    int
		rest []byte
		err  error
	}
	done := make(chan one, 2*len(conns))
	for i, cn := range conns {
		go func() {
			_, err := cn.Write(resyncToken(cfg, cfg.Rank, peer, ids[i]))
			done <- one{i: -1, err: err}
		}()
		go func() {
			var pre []byte
			if i == 0 {
				pre = c.rest
			}
			rest, err := skipTo(cn, pre, resyncToken(cfg, peer, cfg.Rank, ids[i]))
			done <- one{i: i, rest: rest, err: err}
		}()
	}
	for range 2 * len(conns) {
		o := <-done
		if o.err != nil && res.err == nil {
			what := "write its token"
			if o.i >= 0 {
				what = "read to the peer's token"
			}
			res.err = fmt.Errorf("%s: %w", what, o.err)
			stop()
			for _, cn := range conns {
				cn.SetDeadline(aLongTimeAgo) // end the others at once
			}
		}
		if o.i == 0 {
			res.rest = o.rest
		}
	}
	if !stop() && res.err == nil {
		res.err = ctx.Err()
	}
	if res.err != nil {
		c.Close()
		return res
	}
	res.conns = map[connID]*net.TCPConn{}
	for i, cn := range conns {
		cn.SetDeadline(time.Time{})
		res.conns[ids[i]] = cn
	}
	return res
}

// resyncToken is what rank from writes to rank to on connection id when a mesh of job cfg.JobID
// adopts it: only holders of the job's secret can make it, and it differs per world, direction
// and connection, so no token of an earlier world matches.
func resyncToken(cfg *Config, from, to int, id connID) []byte {
	h := hmac.New(sha256.New, cfg.Secret)
	fmt.Fprintf(h, "kolo tcp resync\x00%s\x00%d\x00%d\x00%d\x00%d", cfg.JobID, from, to, id.lane, id.stream)
	return h.Sum(nil)
}

// skipTo drops c's incoming bytes up to and including tok, looking first in pre (bytes already
// read from c). It returns what followed tok in pre; bytes of c after tok stay unread.
func skipTo(c *net.TCPConn, pre, tok []byte) ([]byte, error) {
	if i := bytes.Index(pre, tok); i >= 0 {
		return pre[i+len(tok):], nil
	}
	keep := len(tok) - 1 // bytes already consumed that may begin the token
	tail := append([]byte(nil), pre[max(0, len(pre)-keep):]...)
	buf := make([]byte, 64<<10)
	for {
		n, err := peek(c, buf)
		if err != nil {
			return nil, err
		}
		win := append(tail, buf[:n]...)
		if i := bytes.Index(win, tok); i >= 0 {
			_, err := io.ReadFull(c, buf[:i+len(tok)-len(tail)])
			return nil, err
		}
		if _, err := io.ReadFull(c, buf[:n]); err != nil {
			return nil, err
		}
		tail = append(tail[:0], win[max(0, len(win)-keep):]...)
	}
}

// Adopted is the number of peers whose connections this mesh took over from an earlier one.
func (m *Mesh) Adopted() int { return int(m.nAdopted.Load()) }
