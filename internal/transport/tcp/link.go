package tcp

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/kolo-dl/kolo/internal/transport"
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
		conn conn
		err  error
	}
	results := make(chan dialed, len(ids))
	for _, id := range ids {
		go func() {
			c, err := dialPeer(ctx, &m.cfg, id)
			results <- dialed{id, c, err}
		}()
	}
	conns := map[connID]conn{}
	var err error
	for range ids {
		d := <-results
		if d.err != nil {
			if err == nil || errors.Is(d.err, errCrossed) {
				err = d.err
			}
			if !errors.Is(d.err, errCrossed) {
				// The set fails: stop the others. Not on a crossing, where each of them is
				// declined in turn: cut short mid-handshake, they would look like intruders.
				cancel()
			}
			continue
		}
		conns[d.id] = d.conn
	}
	p.linkMu.Lock()
	defer p.linkMu.Unlock()
	if err != nil || p.link != linkDialing {
		for _, c := range conns {
			c.Close()
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
		if m.closed.Load() {
			// This mesh's own Close cut the link: no fault of the peer.
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
		a.conn.Close()
		return
	}
	if p.partial == nil {
		p.partial = map[connID]conn{}
	}
	p.partial[a.id] = a.conn
	if len(p.partial) < 1+m.cfg.Streams {
		if peekable {
			m.wg.Add(1) // under linkMu, as install's goroutines are
			go m.watchPartial(p, a.id, a.conn)
		}
		return
	}
	conns := p.partial
	p.partial = nil
	m.install(p, conns)
}

// partialPoll is how often watchPartial looks at a connection of a set still arriving.
const partialPoll = 10 * time.Millisecond

// watchPartial watches connection c (id) of p's set while the rest of the set is still arriving.
// Nothing is read from a set before it is installed, so a dialer that gave the set up (its mesh
// closed, its process died, or another connection of the set failed) would be noticed only at the
// connect timeout. So when c ends, the link fails at once as a connection error: the set can no
// longer be complete. Bytes on c end the watch: a dialer with every ack installs the set and may
// send before this end has it all, and the set will be complete here too. The socket is peeked
// at, never read, and polled rather than waited on, so that the watch never holds the read lock a
// call needs once the set is installed.
func (m *Mesh) watchPartial(p *peer, id connID, c conn) {
	defer m.wg.Done()
	stillPartial := func() bool {
		return !m.closed.Load() && p.link == linkAccepting && p.partial[id] == c
	}
	var b [1]byte
	for {
		n, err := peekNow(c, b[:])
		if n > 0 {
			return
		}
		p.linkMu.Lock()
		if err != nil {
			if stillPartial() {
				m.failLocked(p, &transport.PeerError{Rank: p.rank, Host: p.host, Op: "connect",
					Err: fmt.Errorf("it closed %s of its set to rank %d with %d of the %d connections here: %w",
						id, m.rank, len(p.partial), 1+m.cfg.Streams, err)})
			}
			p.linkMu.Unlock()
			return
		}
		still := stillPartial()
		p.linkMu.Unlock()
		if !still || !m.pause(partialPoll) {
			return
		}
	}
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

// closeLink settles p's link as closed for Close, closes a set still arriving, and reports
// whether p's set was up.
func (p *peer) closeLink() bool {
	p.linkMu.Lock()
	defer p.linkMu.Unlock()
	for _, c := range p.partial {
		c.Close()
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
