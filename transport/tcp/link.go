package tcp

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"time"

	"github.com/kolo-dl/kolo/transport"
)

// A peer's link is whether its set of connections (one control connection and Config.Streams
// data connections) exists yet. A full mesh among n ranks is n(n-1)/2 sets opened at start-up,
// though a rank's collectives talk to a few of them: its ring neighbours, the same local rank on
// other hosts, the coordinator. A lazy mesh (Config.Lazy) opens the sets of Config.Eager in
// Connect and every other one when a call first needs it, so a job of hundreds of hosts neither
// waits at start-up for connections it never uses nor holds thousands of sockets per rank.
//
// Either end may need a set first, and both may need it at once (a Send on one end, the matching
// Recv on the other). Either end dials then, and when two dials cross, the set the lower rank
// dialed is the one both keep: the lower rank declines the higher's connections with ackCrossed
// while it dials itself, and the higher rank takes the lower's connections even while it dials.
// A rank takes a connection only after deciding for the whole set under the peer's lock, so the
// higher rank's connections are either all taken (the lower rank then never dials) or all
// declined: a set never mixes the two ends' dials.
type linkState uint8

const (
	linkIdle      linkState = iota // no set; the first call that needs one dials
	linkDialing                    // this rank dials the set
	linkAccepting                  // the peer dials the set; its connections are arriving
	linkUp                         // the set is installed
	linkFailed                     // the set could not be made: p.lost says why
	linkClosed                     // the mesh is closing
)

// settle ends a transition (dialing, accepting) in state s and wakes whoever waits on
// it. Called under linkMu.
func (p *peer) settle(s linkState) {
	p.link = s
	if p.expiry != nil {
		p.expiry.Stop()
		p.expiry = nil
	}
	if p.ready != nil {
		close(p.ready)
		p.ready = nil
	}
}

// transition moves an idle or settled link into transition s. Called under linkMu.
func (p *peer) transition(s linkState) {
	p.link = s
	if p.ready == nil {
		p.ready = make(chan struct{})
	}
}

// ensure connects p for a call that needs it, within ctx: it dials unless a set is already on
// its way, and waits until the link settles.
func (m *Mesh) ensure(ctx context.Context, p *peer, op string) error {
	for {
		p.linkMu.Lock()
		if p.link == linkIdle && !m.closed.Load() {
			m.dialLocked(p, m.life, m.cfg.ConnectTimeout)
		}
		st, ready := p.link, p.ready
		p.linkMu.Unlock()
		switch st {
		case linkUp:
			return nil
		case linkFailed:
			pe := p.lost.Load()
			return &transport.PeerError{Rank: p.rank, Host: p.host, Op: op, Err: pe.Err}
		case linkClosed:
			return fmt.Errorf("rank %d: %s rank %d: %w", m.rank, op, p.rank, transport.ErrClosed)
		}
		select {
		case <-ready:
		case <-m.quit:
			return fmt.Errorf("rank %d: %s rank %d: %w", m.rank, op, p.rank, transport.ErrClosed)
		case <-ctx.Done():
			return fmt.Errorf("rank %d: %s rank %d: waiting for its connections: %w", m.rank, op, p.rank, ctx.Err())
		}
	}
}

// dialLocked starts dialing p's set within parent and, if timeout is not 0, within timeout.
// Called under p.linkMu with the link idle (or being set up by Connect). The dial is not the
// caller's: a call that gives up waiting leaves it to finish for the next one.
func (m *Mesh) dialLocked(p *peer, parent context.Context, timeout time.Duration) {
	p.transition(linkDialing)
	m.wg.Add(1)
	go func() {
		defer m.wg.Done()
		ctx, cancel := context.WithCancel(parent)
		if timeout > 0 {
			ctx, cancel = context.WithTimeout(parent, timeout)
		}
		defer cancel()
		m.dialSet(ctx, p)
	}()
}

// dialSet makes every connection of p's set, and installs the set unless the peer's own dial
// crossed it.
func (m *Mesh) dialSet(ctx context.Context, p *peer) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	ids := setIDs(p.rank, m.cfg.Streams)
	type dialed struct {
		id   connID
		conn *net.TCPConn
		err  error
	}
	results := make(chan dialed, len(ids))
	for _, id := range ids {
		go func() {
			c, err := dialPeer(ctx, &m.cfg, id, &m.leaving)
			results <- dialed{id, c, err}
		}()
	}
	conns := map[connID]*net.TCPConn{}
	var err error
	for range ids {
		d := <-results
		if m.l.hold != nil {
			m.l.hold(holdReturned, d.id)
		}
		if d.err != nil {
			if err == nil || errors.Is(d.err, errCrossed) {
				err = d.err
			}
			if !errors.Is(d.err, errCrossed) && !errors.Is(d.err, transport.ErrPeerLeft) {
				// The set fails: stop the others. Not on a crossing, or a peer that left,
				// where each of them is declined in turn: cut short mid-handshake, they
				// would look like intruders.
				cancel()
			}
			continue
		}
		conns[d.id] = d.conn
	}
	if m.l.hold != nil {
		m.l.hold(holdDialed, connID{peer: p.rank, lane: laneControl})
	}
	p.linkMu.Lock()
	defer p.linkMu.Unlock()
	if err != nil || p.link != linkDialing {
		// A Leave may have ended this dial once the peer had acked and taken the whole set:
		// the leave notice then keeps the peer from blaming this rank.
		for id, c := range conns {
			closeUnused(id, c, m.leaving.Load())
		}
	}
	switch {
	case p.link != linkDialing:
		// The lower rank's dial crossed ours and its set is arriving (or the mesh closes).
	case errors.Is(err, errCrossed):
		// Declined: the peer dials us. Wait for its set as for any that began arriving.
		m.acceptLocked(p)
	case err != nil:
		m.failLocked(p, &transport.PeerError{Rank: p.rank, Host: p.host, Op: "connect", Err: err})
	default:
		m.install(p, conns)
	}
}

// setIDs names the connections of a set to peer: the control connection, then each data stream.
func setIDs(peer, streams int) []connID {
	ids := []connID{{peer: peer, lane: laneControl}}
	for s := range streams {
		ids = append(ids, connID{peer: peer, lane: laneData, stream: s})
	}
	return ids
}

// acceptLocked waits for the peer's set: the link is accepting, and fails if the set is not
// complete within the connect timeout. Called under p.linkMu.
func (m *Mesh) acceptLocked(p *peer) {
	p.transition(linkAccepting)
	if p.expiry == nil {
		p.expiry = time.AfterFunc(m.cfg.ConnectTimeout, func() { m.expire(p) })
	}
}

// expire fails a set the peer began (or was expected to begin) and did not finish in time.
func (m *Mesh) expire(p *peer) {
	p.linkMu.Lock()
	defer p.linkMu.Unlock()
	if p.link != linkAccepting {
		return
	}
	m.failLocked(p, &transport.PeerError{Rank: p.rank, Host: p.host, Op: "connect",
		Err: fmt.Errorf("it dialed %d of the %d connections of its set to rank %d, then no more within %v",
			len(p.partial), 1+m.cfg.Streams, m.rank, m.cfg.ConnectTimeout)})
}

// failLocked settles p's link as failed: every call that needs it fails with pe, and the inbox
// says the peer is lost, as it would for a set that was up. Called under p.linkMu.
func (m *Mesh) failLocked(p *peer, pe *transport.PeerError) {
	for _, c := range p.partial {
		c.Close()
	}
	p.partial = nil
	if p.lost.CompareAndSwap(nil, pe) {
		level := slog.LevelWarn
		if errors.Is(pe.Err, transport.ErrPeerLeft) || m.leaving.Load() || m.closed.Load() {
			// Its world ended, or this mesh's own Close or Leave cut the link: no fault of it.
			level = slog.LevelDebug
		}
		m.log.Log(context.Background(), level, "tcp transport: could not connect to peer", "rank", m.rank, "peer", p.rank, "host", p.host, "err", pe.Err)
		// Counted under linkMu, as install's goroutines are: Close waits for the group only
		// after it has taken every peer's lock.
		m.wg.Add(1)
		go func() {
			defer m.wg.Done()
			select {
			case m.inbox <- transport.Msg{From: p.rank}:
			case <-m.quit:
			}
		}()
	}
	p.settle(linkFailed)
}

// decide is the listener's question before it acks a connection from id.peer: take it, or
// decline it because this rank dials that peer itself and, being the lower rank, keeps its own
// set.
func (m *Mesh) decide(id connID) (byte, string) {
	p := m.peers[id.peer] // the listener admits only the mesh's peers
	p.linkMu.Lock()
	defer p.linkMu.Unlock()
	switch {
	case (m.closed.Load() || p.link == linkClosed) && m.leaving.Load():
		return ackLeft, fmt.Sprintf("rank %d is leaving this world", m.rank)
	case m.closed.Load() || p.link == linkClosed:
		return ackRefused, fmt.Sprintf("rank %d's mesh is closing", m.rank)
	case p.link == linkIdle:
		m.acceptLocked(p)
	case (p.link == linkDialing || p.link == linkUp) && id.peer > m.rank:
		// Up: our set completed before the peer's crossing dial got here.
		return ackCrossed, fmt.Sprintf("rank %d is dialing rank %d itself", m.rank, id.peer)
	case p.link == linkDialing:
		m.acceptLocked(p) // the lower rank's set wins; ours will be declined
	case p.link == linkUp:
		return ackRefused, fmt.Sprintf("rank %d is already connected to rank %d", m.rank, id.peer)
	case p.link == linkFailed && errors.Is(p.lost.Load().Err, transport.ErrPeerLeft):
		// A connection of the set it gave up when it left (watchPartial), late: no intruder.
		return ackLeft, fmt.Sprintf("rank %d left rank %d's world", id.peer, m.rank)
	case p.link == linkFailed:
		return ackRefused, fmt.Sprintf("rank %d gave up connecting to rank %d: %v", m.rank, id.peer, p.lost.Load().Err)
	}
	return ackTaken, ""
}

// arrivals takes the connections the listener acked and adds each to its peer's set.
func (m *Mesh) arrivals() {
	defer m.wg.Done()
	for {
		select {
		case a := <-m.reg.ch:
			if m.l.hold != nil {
				m.l.hold(holdReceived, a.id)
			}
			m.arrive(a)
		case <-m.quit:
			return
		}
	}
}

func (m *Mesh) arrive(a arrival) {
	p := m.peers[a.id.peer]
	p.linkMu.Lock()
	defer p.linkMu.Unlock()
	if m.closed.Load() || p.link != linkAccepting {
		closeUnused(a.id, a.conn, m.closed.Load() && m.leaving.Load()) // acked: the dialer may take the set
		return
	}
	if p.partial == nil {
		p.partial = map[connID]*net.TCPConn{}
	}
	p.partial[a.id] = a.conn
	if len(p.partial) < 1+m.cfg.Streams {
		if peekable {
			m.wg.Add(1) // under linkMu, as install's goroutines are
			if a.id.lane == laneControl {
				go m.watchPartial(p, a.conn)
			} else {
				go m.watchPartialData(p, a.id, a.conn)
			}
		}
		return
	}
	conns := p.partial
	p.partial = nil
	m.install(p, conns)
}

// watchPartial watches the control connection c of p's set while the rest of the set is still
// arriving. Nothing is read from a set before it is installed, so a dialer that gave the set up
// (it ended, or one of the set's connections failed) would be noticed only at the connect
// timeout, and blamed. Its first bytes are peeked, not consumed: a dialer with every ack installs
// the set and may send messages before this end has it all, and the watch ends then (the set
// will be complete here too). The leave notice (closeUnused, dialOnce: the dialer left) fails
// the link with transport.ErrPeerLeft; the connection's end (the dialer closed, or died) fails it
// as a connection error, since the set can no longer be complete.
func (m *Mesh) watchPartial(p *peer, c *net.TCPConn) {
	defer m.wg.Done()
	var b [4]byte
	n, err := peek(c, b[:])
	// A message's length begins with a byte below 0xFF (MaxMsg): bytes 0xFF may be the first
	// of the notice.
	for wait := time.Now().Add(noticeTimeout); err == nil && n < len(b) && bytes.Count(b[:n], []byte{0xFF}) == n && time.Now().Before(wait); {
		time.Sleep(time.Millisecond)
		n, err = peek(c, b[:])
	}
	p.linkMu.Lock()
	defer p.linkMu.Unlock()
	if m.closed.Load() || p.link != linkAccepting || p.partial[connID{peer: p.rank, lane: laneControl}] != c {
		return // installed, settled otherwise, or closed by this mesh
	}
	switch {
	case err != nil:
		m.failLocked(p, &transport.PeerError{Rank: p.rank, Host: p.host, Op: "connect",
			Err: fmt.Errorf("it closed its set to rank %d with %d of the %d connections here: %w",
				m.rank, len(p.partial), 1+m.cfg.Streams, err)})
	case n == len(b) && binary.BigEndian.Uint32(b[:]) == leaveNotice:
		m.failLocked(p, &transport.PeerError{Rank: p.rank, Host: p.host, Op: "connect", Err: transport.ErrPeerLeft})
	}
}

// partialPoll is how often watchPartialData looks at a data connection of a set still arriving.
const partialPoll = 10 * time.Millisecond

// watchPartialData watches data connection c (id) of p's set while the rest of the set is still
// arriving, for the case watchPartial cannot see: a dialer that gave the set up before its control
// connection got here (it left, or died, while that one was still in its handshake) closes the
// data connections it had and writes nothing: a data connection's bytes are the stream itself,
// so a leave notice there could be taken for data by a set that did get installed. So when one
// ends, this rank asks the dialer's listener whether that rank's mesh is still open (probeMesh):
// a rank that left says so, and the link fails with transport.ErrPeerLeft; a dead one cannot
// answer, and a live one gave the set up, so it fails as a connection error, at once in either
// case rather than at the connect timeout. The socket is polled, not waited on, so that the
// watch never holds the read lock a transfer needs once the set is installed.
func (m *Mesh) watchPartialData(p *peer, id connID, c *net.TCPConn) {
	defer m.wg.Done()
	var b [1]byte
	stillPartial := func() bool {
		return !m.closed.Load() && p.link == linkAccepting && p.partial[id] == c
	}
	var err error
	for {
		var n int
		if n, err = peekNow(c, b[:]); n > 0 || err != nil {
			break
		}
		p.linkMu.Lock()
		still := stillPartial()
		p.linkMu.Unlock()
		if !still || !m.pause(partialPoll) {
			return
		}
	}
	ctrl := connID{peer: p.rank, lane: laneControl}
	p.linkMu.Lock()
	if err == nil || !stillPartial() || p.partial[ctrl] != nil || p.probing {
		// Data flows (the dialer has the whole set: so will this rank), the set is settled, its
		// control connection is here and watched, or another stream's watch asks already.
		p.linkMu.Unlock()
		return
	}
	p.probing = true
	have := len(p.partial)
	p.linkMu.Unlock()

	ctx, cancel := context.WithTimeout(context.Background(), probeTimeout)
	perr := probeMesh(ctx, &m.cfg, p.rank)
	cancel()

	p.linkMu.Lock()
	defer p.linkMu.Unlock()
	p.probing = false
	if !stillPartial() || p.partial[ctrl] != nil {
		return
	}
	if errors.Is(perr, transport.ErrPeerLeft) {
		m.failLocked(p, &transport.PeerError{Rank: p.rank, Host: p.host, Op: "connect", Err: transport.ErrPeerLeft})
		return
	}
	why := "its mesh is still open"
	if perr != nil {
		why = perr.Error()
	}
	m.failLocked(p, &transport.PeerError{Rank: p.rank, Host: p.host, Op: "connect",
		Err: fmt.Errorf("it closed %v stream %d of its set to rank %d with %d of the %d connections here, before its control connection arrived (asked why: %s): %w",
			id.lane, id.stream, m.rank, have, 1+m.cfg.Streams, why, err)})
}

// pause waits d, or less if the mesh closes: then it reports false.
func (m *Mesh) pause(d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-m.quit:
		return false
	case <-t.C:
		return true
	}
}

// probeTimeout bounds watchPartialData's question to the dialer's listener: the listener answers
// at once from memory, so only a dead or unreachable host takes this long.
const probeTimeout = 2 * time.Second

// closeLink settles p's link as closed for Close or Leave (left), and reports whether its set
// was up. A set still arriving is closed; when this rank leaves, its control connection first
// carries the leave notice, since the peer may have all its acks and take the set: its calls
// then fail with transport.ErrPeerLeft, not with a closed connection that blames this rank.
func (p *peer) closeLink(left bool) bool {
	p.linkMu.Lock()
	defer p.linkMu.Unlock()
	for id, c := range p.partial {
		closeUnused(id, c, left)
	}
	p.partial = nil
	p.settle(linkClosed)
	return p.up.Load()
}

// ConnectedPeers is the number of peers whose connections are up: with Lazy, those some call or
// the peer has needed so far.
func (m *Mesh) ConnectedPeers() int {
	n := 0
	for _, p := range m.peers {
		if p != nil && p.up.Load() {
			n++
		}
	}
	return n
}
