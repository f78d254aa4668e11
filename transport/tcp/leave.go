package tcp

import (
	"encoding/binary"
	"errors"
	"net"
	"time"

	"github.com/kolo-dl/kolo/transport"
)

// A rank that leaves a mesh on purpose while its process goes on (Mesh.Leave) tells its peers so
// before it closes its connections: a call of theirs waiting on it then fails with
// transport.ErrPeerLeft, not with a closed connection that would blame it for a failure it only
// saw first.

// leaveNotice is the length prefix that stands for "this rank left": larger than any message.
const leaveNotice = 0xFFFFFFFF

// errLeftNotice is readMsg's report of a leave notice.
var errLeftNotice = errors.New("leave notice")

// noticeTimeout bounds writing a leave notice: a peer that does not take four bytes in that time
// learns of the leave from the closed connection.
const noticeTimeout = time.Second

// Leave ends the mesh as Close does, but first tells each peer still healthy that this rank
// left (a notice on the control lane), so that a call of the peer's waiting on this rank fails at
// once with transport.ErrPeerLeft. A peer whose control lane is busy only sees the connections
// close.
func (m *Mesh) Leave() {
	m.once.Do(func() {
		m.begin(true)
		for _, p := range m.peers {
			if p == nil || !p.closeLink(true) {
				continue // never connected: nothing to tell
			}
			if p.lost.Load() == nil && p.ctrlMu.TryLock() {
				// A SendMsg holding the lock would be writing a frame the notice must not cut.
				writeLeaveNotice(p.ctrl)
				p.ctrlMu.Unlock()
			}
			p.closeConns()
		}
		m.stop()
	})
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

// leave marks p lost because it left: its calls fail at once with transport.ErrPeerLeft.
func (p *peer) leave() {
	pe := &transport.PeerError{Rank: p.rank, Host: p.host, Op: "recv message", Err: transport.ErrPeerLeft}
	if p.lost.CompareAndSwap(nil, pe) {
		p.m.log.Debug("tcp transport: peer left the world", "rank", p.m.rank, "peer", p.rank, "host", p.host)
		p.closeConns()
	}
}
