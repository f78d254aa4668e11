package tcp

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"syscall"
	"time"

	"github.com/kolo-dl/kolo/internal/accept"
	"github.com/kolo-dl/kolo/internal/auth"
	"github.com/kolo-dl/kolo/internal/endpoint"
	"github.com/kolo-dl/kolo/internal/transport"
)

const (
	// HandshakeTimeout bounds auth plus hello on an accepted connection.
	HandshakeTimeout = 5 * time.Second
	// earlyTTL is how long an authenticated connection may wait for its Connect to start.
	earlyTTL = 2 * time.Minute
	// maxEarly bounds the connections parked before any Connect claims them.
	maxEarly = 4096
	// ackTimeout bounds writing the few bytes of an ack.
	ackTimeout = 5 * time.Second
)

// Socket tuning, applied to both ends of every connection.
const (
	sockBuf        = 4 << 20
	keepAliveIdle  = 5 * time.Second
	keepAliveIntvl = time.Second
	keepAliveCount = 5
	// DefaultUserTimeout is TCP_USER_TIMEOUT on control connections, unless the progress timeout
	// is shorter (transport.DeadHostTimeout).
	DefaultUserTimeout = transport.DefaultDeadHostTimeout
)

// tune makes a connection fit for bulk transfer and quick to notice a dead peer; all best effort.
//
// Keepalive probes an idle connection. TCP_USER_TIMEOUT (set on control connections only, by
// newMesh) bounds how long sent data may stay unacknowledged, which catches a host that vanished
// while we were sending. It is not set on data connections because Linux also applies it to a
// live peer that is merely not reading (zero window): a rank stalled for longer than the timeout
// would lose its data connections. The control lane is always drained by its reader, and losing
// it marks the whole peer lost, data connections included.
//
// A Unix socket (a job on one host) takes none of it: its peer is a process of this host, whose
// end the kernel closes when it dies.
func tune(c conn) {
	tc, ok := c.(*net.TCPConn)
	if !ok {
		return
	}
	tc.SetNoDelay(true)
	tc.SetReadBuffer(sockBuf)
	tc.SetWriteBuffer(sockBuf)
	tc.SetKeepAliveConfig(net.KeepAliveConfig{Enable: true, Idle: keepAliveIdle, Interval: keepAliveIntvl, Count: keepAliveCount})
}

// conn is a connection between two ranks: TCP, or a Unix socket between ranks of a job on one
// host (endpoint.IsUnix).
type conn interface {
	net.Conn
	syscall.Conn
}

// Listener accepts the connections peers dial to this rank. It authenticates each one and reads its
// hello in the background, then hands it to the mesh it is meant for (or parks it until that mesh's
// Connect starts: peers may dial before this rank gets there). A mesh takes connections for its
// whole life, since a lazy one (Config.Lazy) connects to most peers on first use.
type Listener struct {
	ln               net.Listener
	gate             *accept.Gate // strangers' failed handshakes: logged at a bounded rate, repeat offenders refused
	secret           []byte
	log              *slog.Logger
	handshakeTimeout time.Duration
	done             chan struct{} // closed by Close

	mu      sync.Mutex
	closed  bool
	regs    map[regKey]*registration
	early   []earlyConn
	pending map[net.Conn]struct{} // accepted, not yet routed: closed by Close
	wg      sync.WaitGroup
}

type regKey struct {
	job  string
	rank int
}

// registration is one mesh taking the connections its peers dial, from its Connect until it closes.
type registration struct {
	key     regKey
	size    int
	streams int
	expect  map[int]bool    // ranks that may dial this one
	got     map[connID]bool // claimed by an accepted hello
	active  bool            // false once the mesh stopped listening on ch
	ch      chan arrival
	// decide, called before a claimed connection is acked (never under the Listener's lock),
	// lets the mesh take it (ackTaken) or decline it: ackCrossed when the mesh is dialing that
	// peer itself and its own set is the one both keep, ackRefused with why otherwise.
	decide func(id connID) (status byte, why string)
}

type connID struct {
	peer   int
	lane   lane
	stream int
}

func (id connID) String() string {
	if id.lane == laneData {
		return fmt.Sprintf("data stream %d", id.stream)
	}
	return id.lane.String() + " connection"
}

type arrival struct {
	id   connID
	conn conn
}

type earlyConn struct {
	conn conn
	h    hello
	at   time.Time
}

// Listen opens a Listener on addr (e.g. "0.0.0.0:0", or a Unix socket's path: endpoint.IsUnix)
// that admits only peers knowing secret.
func Listen(addr string, secret []byte) (*Listener, error) {
	return listen(addr, secret, slog.Default(), HandshakeTimeout)
}

func listen(addr string, secret []byte, log *slog.Logger, handshakeTimeout time.Duration) (*Listener, error) {
	if len(secret) == 0 {
		return nil, errors.New("tcp transport: listen: empty job secret")
	}
	ln, err := endpoint.Listen(addr)
	if err != nil {
		return nil, fmt.Errorf("tcp transport: listen on %s: %w", addr, err)
	}
	l := &Listener{
		ln:               ln,
		gate:             accept.NewGate("tcp transport", log, accept.GatePolicy{}),
		secret:           append([]byte(nil), secret...),
		log:              log,
		handshakeTimeout: handshakeTimeout,
		done:             make(chan struct{}),
		regs:             map[regKey]*registration{},
		pending:          map[net.Conn]struct{}{},
	}
	l.wg.Add(1)
	go l.accept()
	return l, nil
}

// Addr is the address the Listener is bound to.
func (l *Listener) Addr() net.Addr { return l.ln.Addr() }

// Close stops accepting and closes every connection not yet handed to a Connect. Meshes already
// formed are not affected.
func (l *Listener) Close() error {
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return nil
	}
	l.closed = true
	close(l.done)
	err := l.ln.Close()
	for c := range l.pending {
		c.Close()
	}
	for _, e := range l.early {
		e.conn.Close()
	}
	l.early = nil
	l.mu.Unlock()
	l.wg.Wait()
	l.gate.Close()
	return err
}

func (l *Listener) accept() {
	defer l.wg.Done()
	accept.Loop(l.gate.Wrap(l.ln), l.log, "tcp transport", func(c net.Conn) bool {
		l.mu.Lock()
		if l.closed {
			l.mu.Unlock()
			return false
		}
		l.pending[c] = struct{}{}
		l.wg.Add(1)
		l.mu.Unlock()
		// Auth runs beside the accept loop so that a silent peer cannot stall it.
		go l.admit(c.(conn))
		return true
	})
}

func (l *Listener) reject(c conn, why string, err error) {
	l.gate.Rejected(c, why, err)
	c.Close()
}

// unfinished closes c, whose handshake or hello did not finish: rejected (a warning), unless
// nobody failed a check. That is when this listener's Close ended it (Close closes the
// connections still in their handshake), or when the dialer hung up before it had sent all of
// its part: a kolo rank that gave up its dial (its mesh closed, or another connection of the
// set failed). A dialer with the
// wrong secret sends its proof before it reads ours, so its proof is checked and denied here
// first; one that is silent runs into the handshake's timeout; both are still rejections.
func (l *Listener) unfinished(c conn, why string, err error) {
	l.mu.Lock()
	delete(l.pending, c)
	closing := l.closed
	l.mu.Unlock()
	if closing || isHangUp(err) {
		l.log.Debug("tcp transport: connection ended in its handshake", "remote", c.RemoteAddr().String(),
			"why", why, "err", err, "listener closing", closing)
		c.Close()
		return
	}
	l.reject(c, why, err)
}

// admit authenticates c, reads its hello and routes it.
func (l *Listener) admit(c conn) {
	defer l.wg.Done()
	tune(c)
	if err := auth.Handshake(c, l.secret, auth.Listener, l.handshakeTimeout); err != nil {
		l.unfinished(c, "authentication", err)
		return
	}
	l.gate.Authenticated(c)
	c.SetReadDeadline(time.Now().Add(l.handshakeTimeout))
	h, err := readHello(c)
	c.SetReadDeadline(time.Time{})
	if err != nil {
		l.unfinished(c, "hello", err)
		return
	}
	l.route(c, h)
}

// route hands an authenticated connection to its registration, parks it until one appears, or
// rejects it when a different job or rank is connecting here.
func (l *Listener) route(c conn, h hello) {
	l.mu.Lock()
	delete(l.pending, c)
	if l.closed {
		l.mu.Unlock()
		c.Close()
		return
	}
	reg := l.regs[regKey{h.job, h.to}]
	if reg == nil {
		if len(l.regs) > 0 {
			why := l.mismatchLocked(h)
			l.mu.Unlock()
			l.refuse(c, h, why)
			return
		}
		l.purgeLocked(time.Now())
		if len(l.early) >= maxEarly {
			l.mu.Unlock()
			l.refuse(c, h, fmt.Sprintf("%d connections already wait for a Connect", maxEarly))
			return
		}
		l.early = append(l.early, earlyConn{conn: c, h: h, at: time.Now()})
		l.mu.Unlock()
		return
	}
	why := reg.claimLocked(h)
	l.mu.Unlock()
	if why != "" {
		l.refuse(c, h, why)
		return
	}
	l.deliver(reg, c, h)
}

func (l *Listener) mismatchLocked(h hello) string {
	for k := range l.regs {
		if k.job != h.job {
			return fmt.Sprintf("job id mismatch: rank %d here is in job %q, the dialer (rank %d) in job %q", k.rank, k.job, h.from, h.job)
		}
		return fmt.Sprintf("dialer (rank %d) meant rank %d, but rank %d listens here", h.from, h.to, k.rank)
	}
	return "no Connect is waiting"
}

func (l *Listener) purgeLocked(now time.Time) {
	kept := l.early[:0]
	for _, e := range l.early {
		if now.Sub(e.at) > earlyTTL {
			l.wg.Add(1) // under l.mu with l.closed false: Close has not begun waiting
			go func() {
				defer l.wg.Done()
				l.refuse(e.conn, e.h, fmt.Sprintf("no Connect for job %q rank %d claimed it within %s", e.h.job, e.h.to, earlyTTL))
			}()
			continue
		}
		kept = append(kept, e)
	}
	clear(l.early[len(kept):])
	l.early = kept
}

// claimLocked checks a hello against the registration and reserves its slot; it returns why the
// connection is refused, or "".
func (r *registration) claimLocked(h hello) string {
	id := connID{peer: h.from, lane: h.lane, stream: h.stream}
	switch {
	case !r.active:
		return "the mesh it was meant for has closed"
	case h.size != r.size:
		return fmt.Sprintf("group size mismatch: %d here, %d at the dialer (rank %d)", r.size, h.size, h.from)
	case h.streams != r.streams:
		return fmt.Sprintf("streams mismatch: %d here, %d at the dialer (rank %d)", r.streams, h.streams, h.from)
	case !r.expect[h.from]:
		return fmt.Sprintf("rank %d is not expected to dial rank %d", h.from, r.key.rank)
	case r.got[id]:
		return fmt.Sprintf("duplicate %v stream %d from rank %d", h.lane, h.stream, h.from)
	}
	r.got[id] = true
	return ""
}

// refuse tells the dialer why (so its Connect fails with the reason instead of timing out) and logs.
func (l *Listener) refuse(c conn, h hello, why string) {
	c.SetWriteDeadline(time.Now().Add(ackTimeout))
	c.Write(appendAckStatus(nil, ackRefused, why))
	l.reject(c, fmt.Sprintf("rank %d of job %q: %s", h.from, h.job, why), errRejected)
}

// deliver acks a claimed connection and passes it to the registration's mesh, unless the mesh
// declines it.
func (l *Listener) deliver(reg *registration, c conn, h hello) {
	id := connID{peer: h.from, lane: h.lane, stream: h.stream}
	if status, why := reg.decide(id); status != ackTaken {
		l.mu.Lock()
		delete(reg.got, id)
		l.mu.Unlock()
		c.SetWriteDeadline(time.Now().Add(ackTimeout))
		c.Write(appendAckStatus(nil, status, why))
		if status == ackCrossed {
			// The usual outcome of two ranks' first use at once: nothing to warn about.
			c.Close()
			return
		}
		l.reject(c, fmt.Sprintf("rank %d of job %q: %s", h.from, h.job, why), errRejected)
		return
	}
	c.SetWriteDeadline(time.Now().Add(ackTimeout))
	_, err := c.Write(appendAck(nil, ""))
	c.SetWriteDeadline(time.Time{})
	l.mu.Lock()
	defer l.mu.Unlock()
	if err != nil || !reg.active {
		delete(reg.got, id) // the dialer retries this slot
		c.Close()
		return
	}
	reg.ch <- arrival{id: id, conn: c} // sized for every expected connection: never blocks
}

// register announces that the mesh of (job, rank) now takes the connections dialed by the ranks
// in expect, as decide says, and hands it any of them that arrived early. Parked connections of
// another job or rank are refused: they are a stale job's ranks or misaddressed.
func (l *Listener) register(key regKey, size, streams int, expect []int, decide func(connID) (byte, string)) (*registration, error) {
	reg := &registration{
		key:     key,
		size:    size,
		streams: streams,
		expect:  map[int]bool{},
		got:     map[connID]bool{},
		active:  true,
		ch:      make(chan arrival, len(expect)*(1+streams)),
		decide:  decide,
	}
	for _, r := range expect {
		reg.expect[r] = true
	}
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return nil, fmt.Errorf("tcp transport: listener %s: %w", l.ln.Addr(), net.ErrClosed)
	}
	if l.regs[key] != nil {
		l.mu.Unlock()
		return nil, fmt.Errorf("tcp transport: a mesh for job %q rank %d is already open on listener %s", key.job, key.rank, l.ln.Addr())
	}
	l.regs[key] = reg
	l.purgeLocked(time.Now())
	type verdict struct {
		e   earlyConn
		why string
	}
	var vs []verdict
	for _, e := range l.early {
		why := ""
		if (regKey{e.h.job, e.h.to}) != key {
			why = l.mismatchLocked(e.h)
		} else {
			why = reg.claimLocked(e.h)
		}
		vs = append(vs, verdict{e, why})
	}
	l.early = nil
	l.wg.Add(len(vs))
	l.mu.Unlock()
	for _, v := range vs {
		go func() {
			defer l.wg.Done()
			if v.why != "" {
				l.refuse(v.e.conn, v.e.h, v.why)
			} else {
				l.deliver(reg, v.e.conn, v.e.h)
			}
		}()
	}
	return reg, nil
}

// unregister ends a registration and closes whatever reached it that its mesh did not take.
func (l *Listener) unregister(reg *registration) {
	l.mu.Lock()
	reg.active = false
	if l.regs[reg.key] == reg {
		delete(l.regs, reg.key)
	}
	l.mu.Unlock()
	for {
		select {
		case a := <-reg.ch:
			a.conn.Close()
		default:
			return
		}
	}
}
