// Package tcp is the transport between ranks on different hosts: a full mesh of authenticated TCP
// connections among a given set of peers, exposing a data lane (transport.Comm, each peer's byte
// stream striped over several connections so one big message uses several TCP streams) and a
// control lane (transport.Messenger, one more connection per peer carrying framed messages). The
// ranks of a job on one host that do not share memory mesh the same way over Unix sockets
// (endpoint.IsUnix addresses).
//
// Every connection runs auth.Handshake before any other byte, then a hello naming the job and the
// ranks; a connection that fails either is logged and closed while the Listener keeps serving. A
// broken connection makes its peer lost: every call on that peer fails at once with a
// *transport.PeerError naming the rank and host. A peer that stays connected but moves nothing for
// the progress timeout (Config.ProgressTimeout) fails the call waiting on it with a
// *transport.StallError. This package must not know about tensors, ops or the engine, and must
// not pick routes: the caller decides which peers go over TCP.
package tcp

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/kolo-dl/kolo/internal/auth"
	"github.com/kolo-dl/kolo/internal/endpoint"
	"github.com/kolo-dl/kolo/internal/sockopt"
	"github.com/kolo-dl/kolo/internal/transport"
)

const (
	// DefaultStreams is the number of data connections per peer when Config.Streams is 0.
	DefaultStreams = 2
	// DefaultConnectTimeout bounds Connect when Config.ConnectTimeout is 0.
	DefaultConnectTimeout = 30 * time.Second
	// ChunkSize is the striping unit: byte k of a peer's stream travels on data connection
	// (k / ChunkSize) % Streams. Big enough that a chunk costs few syscalls, small enough that a
	// message of a few MiB spreads over every stream.
	ChunkSize = 512 << 10
	inboxCap  = 1024
)

// Config describes this rank's place in the mesh.
type Config struct {
	Rank, Size int
	// Peers are the ranks to connect to; every other rank is unreachable through this mesh.
	Peers []int
	// Addrs[r] is "host:port" of rank r's Listener. Needed for the peers this rank dials: the
	// ones with a higher rank, and with Lazy every peer.
	Addrs []string
	// Hosts[r], optional, names rank r's host in errors ("rank 3 on node2 lost ...").
	Hosts  []string
	Secret []byte
	// JobID is sent in the hello; connections of another job are refused, so a stale job's ranks
	// cannot join.
	JobID string
	// Streams is the number of data connections per peer (0 means DefaultStreams). Both ends must
	// agree. Large messages are striped across them in ChunkSize pieces.
	Streams int
	// ConnectTimeout bounds Connect (0 means DefaultConnectTimeout); dials are retried with backoff
	// until then since a peer may not be listening yet.
	ConnectTimeout time.Duration
	// ProgressTimeout fails a Comm call that waited this long on a peer that moved no byte with a
	// *transport.StallError (0 means transport.DefaultProgressTimeout, negative never). A
	// watchdog goroutine looks at the calls running every ProgressTimeout/8 (at most every
	// second), so a stall is reported between 1 and 1.25 timeouts after the last byte moved; time
	// in which this process did not run does not count.
	ProgressTimeout time.Duration

	// Lazy connects a peer only when a call first needs it (a Send, Recv or SendMsg to it) or
	// when the peer connects first, except for the peers in Eager, which Connect connects before
	// it returns. Without Lazy, Connect connects every peer. Eager must agree at both ends of a
	// pair (the lower rank dials, the higher waits for it); the others may be dialed by either.
	Lazy  bool
	Eager []int

	// Listening says that every address in Addrs was listening before this Connect began, as a
	// world's are (a rank publishes its address once its Listener is up): a dial refused outright
	// then means that nothing listens there any more (the rank's process ended, or closed its
	// world), and fails after maxRefused tries in a row instead of being retried until
	// ConnectTimeout. Without it refused dials are retried, for a peer that may not listen yet.
	Listening bool

	chunk       int           // tests shrink it to exercise striping with small buffers
	userTimeout time.Duration // tests shrink it; DefaultUserTimeout otherwise
	log         *slog.Logger
}

func (cfg *Config) check() error {
	if cfg.Size < 1 || cfg.Size > maxRanks {
		return fmt.Errorf("size %d out of range", cfg.Size)
	}
	if cfg.Rank < 0 || cfg.Rank >= cfg.Size {
		return fmt.Errorf("rank %d not in [0, %d)", cfg.Rank, cfg.Size)
	}
	if len(cfg.Secret) == 0 {
		return errors.New("empty job secret")
	}
	if len(cfg.JobID) > maxJobID {
		return fmt.Errorf("job id of %d bytes is longer than %d", len(cfg.JobID), maxJobID)
	}
	if cfg.Streams == 0 {
		cfg.Streams = DefaultStreams
	}
	if cfg.Streams < 1 || cfg.Streams > MaxStreams {
		return fmt.Errorf("streams %d not in [1, %d]", cfg.Streams, MaxStreams)
	}
	if cfg.ConnectTimeout <= 0 {
		cfg.ConnectTimeout = DefaultConnectTimeout
	}
	if cfg.chunk <= 0 {
		cfg.chunk = ChunkSize
	}
	if cfg.ProgressTimeout == 0 {
		cfg.ProgressTimeout = transport.DefaultProgressTimeout
	}
	if cfg.userTimeout <= 0 {
		cfg.userTimeout = transport.DeadHostTimeout(cfg.ProgressTimeout)
	}
	if cfg.log == nil {
		cfg.log = slog.Default()
	}
	seen := map[int]bool{}
	for _, p := range cfg.Peers {
		switch {
		case p < 0 || p >= cfg.Size:
			return fmt.Errorf("peer %d not in [0, %d)", p, cfg.Size)
		case p == cfg.Rank:
			return fmt.Errorf("peer list contains this rank (%d)", p)
		case seen[p]:
			return fmt.Errorf("peer %d listed twice", p)
		case (p > cfg.Rank || cfg.Lazy) && (p >= len(cfg.Addrs) || cfg.Addrs[p] == ""):
			return fmt.Errorf("no address for peer %d (this rank dials it)", p)
		}
		seen[p] = true
	}
	for _, p := range cfg.Eager {
		if !seen[p] {
			return fmt.Errorf("eager peer %d is not in the peer list", p)
		}
	}
	return nil
}

func (cfg *Config) host(r int) string {
	if r < len(cfg.Hosts) {
		return cfg.Hosts[r]
	}
	return ""
}

// Mesh is this rank's connections to its peers.
type Mesh struct {
	cfg        Config // what later dials need (Lazy)
	l          *Listener
	reg        *registration // the mesh's place at l, from Connect to Close
	rank, size int
	chunk      uint64
	progress   time.Duration // the progress timeout; 0: none
	peers      []*peer       // by rank; nil for ranks outside the mesh
	log        *slog.Logger
	inbox      chan transport.Msg
	// life bounds the dials a call starts (Lazy): Close ends it.
	life    context.Context
	endLife context.CancelFunc

	// opMu is held shared by every Comm and Messenger call, and exclusively by Close once it has
	// closed the connections: Close returns only after every call has, and only then stops the
	// goroutines those calls hand work to.
	opMu   sync.RWMutex
	closed atomic.Bool
	quit   chan struct{}
	once   sync.Once
	wg     sync.WaitGroup
}

type peer struct {
	m    *Mesh
	rank int
	host string

	// The link: whether the peer's connections exist yet (link.go). Every field below it is
	// set once, by install under linkMu, before up is stored: a call that sees up (or waited on
	// ready) may use them without the lock.
	linkMu  sync.Mutex
	link    linkState
	ready   chan struct{} // closed when link settles (up, failed, idle or closed)
	partial map[connID]conn
	expiry  *time.Timer // fails a set the peer began and did not finish
	up      atomic.Bool

	ctrl conn
	out  dir // our stream to the peer
	in   dir // the peer's stream to us
	lost atomic.Pointer[transport.PeerError]
	// broken is why the data lane is out of step (a transfer cut short midway, its connections
	// still open); nil while it is usable.
	broken atomic.Pointer[error]

	ctrlMu  sync.Mutex // one message at a time on the control connection
	ctrlBuf []byte
}

// Connect forms the mesh. Without Config.Lazy it connects every peer: it dials the peers above
// this rank, waits for those below to dial in through l, and returns once every connection of
// every peer is up, or fails naming the peer it could not reach. With Lazy it connects only the
// peers in Config.Eager that way, and the others when a call first needs them (see link.go).
// Either way l keeps taking the mesh's incoming connections until the mesh is closed.
func Connect(ctx context.Context, l *Listener, cfg Config) (*Mesh, error) {
	if err := cfg.check(); err != nil {
		return nil, fmt.Errorf("tcp transport: rank %d: bad config: %w", cfg.Rank, err)
	}
	start := time.Now()
	ctx, cancel := context.WithTimeout(ctx, cfg.ConnectTimeout)
	defer cancel()

	m := newMesh(&cfg, l)
	reg, err := l.register(regKey{cfg.JobID, cfg.Rank}, cfg.Size, cfg.Streams, cfg.Peers, m.decide)
	if err != nil {
		m.Close()
		return nil, fmt.Errorf("tcp transport: rank %d: %w", cfg.Rank, err)
	}
	m.reg = reg
	m.wg.Add(1)
	go m.arrivals()

	eager := cfg.Peers
	if cfg.Lazy {
		eager = cfg.Eager
	}
	isEager := map[int]bool{}
	for _, p := range eager {
		isEager[p] = true
	}
	// waitFor are the peers Connect returns only once they are settled; below, those of them that
	// dial this rank.
	var waitFor, below []int
	for _, r := range cfg.Peers {
		p := m.peers[r]
		switch {
		case !isEager[r]:
			continue
		case r > cfg.Rank:
			p.linkMu.Lock()
			if p.link == linkIdle { // it may have dialed in already
				m.dialLocked(p, ctx, 0)
			}
			p.linkMu.Unlock()
		default:
			p.linkMu.Lock()
			if p.link == linkIdle { // it may have dialed in already
				p.transition(linkAccepting) // Connect's own deadline bounds the wait
			}
			p.linkMu.Unlock()
		}
		waitFor = append(waitFor, r)
		if r < cfg.Rank {
			below = append(below, r)
		}
	}
	fail := func(err error) (*Mesh, error) {
		cancel()
		m.Close()
		return nil, fmt.Errorf("tcp transport: rank %d: connect: %w", cfg.Rank, err)
	}
	for _, r := range waitFor {
		p := m.peers[r]
		for {
			p.linkMu.Lock()
			st, ready := p.link, p.ready
			p.linkMu.Unlock()
			if st == linkFailed {
				return fail(p.lost.Load())
			}
			if st == linkUp || st == linkIdle {
				break
			}
			select {
			case <-ready:
			case <-l.done:
				return fail(fmt.Errorf("listener %s closed", l.Addr()))
			case <-ctx.Done():
				// A dial that failed says more than the peers still missing. The dials end
				// with ctx: let them settle first.
				settleBy := time.After(time.Second)
				for _, r := range waitFor {
					q := m.peers[r]
					q.linkMu.Lock()
					st, ready := q.link, q.ready
					q.linkMu.Unlock()
					if st == linkDialing {
						select {
						case <-ready:
						case <-settleBy:
						}
					}
				}
				for _, r := range waitFor {
					if pe := m.peers[r].lost.Load(); pe != nil {
						return fail(pe)
					}
				}
				return fail(m.missing(below, time.Since(start), ctx.Err()))
			}
		}
	}
	return m, nil
}

// missing names the first peer of below (those that dial this rank) that never connected.
func (m *Mesh) missing(below []int, waited time.Duration, cause error) error {
	var absent []int
	for _, r := range below {
		if !m.peers[r].up.Load() {
			absent = append(absent, r)
		}
	}
	if len(absent) == 0 {
		return cause
	}
	return &transport.PeerError{Rank: absent[0], Host: m.cfg.host(absent[0]), Op: "connect",
		Err: fmt.Errorf("waited %s for it to dial in (ranks still missing: %v): %w", waited.Round(time.Millisecond), absent, cause)}
}

// dialPeer makes one connection to a higher rank, retrying refused and broken attempts until ctx
// ends (refused ones only maxRefused times with Config.Listening). A wrong secret or a refused
// hello fails at once: retrying cannot fix them.
func dialPeer(ctx context.Context, cfg *Config, id connID) (conn, error) {
	addr := cfg.Addrs[id.peer]
	h := hello{lane: id.lane, stream: id.stream, streams: cfg.Streams, from: cfg.Rank, to: id.peer, size: cfg.Size, job: cfg.JobID}
	backoff := 10 * time.Millisecond
	var lastErr error
	hungUp, refused := 0, 0
	for attempt := 1; ; attempt++ {
		c, err := dialOnce(ctx, addr, cfg.Secret, h)
		if err == nil {
			return c, nil
		}
		if errors.Is(err, auth.ErrDenied) || declined(err) {
			return nil, fmt.Errorf("%v connection to %s: %w", id.lane, addr, err)
		}
		if errors.Is(err, errHungUp) {
			hungUp++
		} else {
			hungUp = 0
		}
		if hungUp == maxHangUps {
			return nil, fmt.Errorf("%v connection to %s: %w (inferred: it hung up during authentication %d times in a row, last: %v)",
				id.lane, addr, auth.ErrDenied, hungUp, err)
		}
		if cfg.Listening && errors.Is(err, syscall.ECONNREFUSED) {
			refused++
		} else {
			refused = 0
		}
		if refused == maxRefused {
			return nil, fmt.Errorf("%v connection to %s: refused %d times in a row: nothing listens there any more, though rank %d listened there when this world formed (its process ended, or it closed its world): %w",
				id.lane, addr, refused, id.peer, err)
		}
		if lastErr == nil || ctx.Err() == nil {
			lastErr = err // an attempt cut short by ctx's end says less than the one before it
		}
		t := time.NewTimer(backoff)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, fmt.Errorf("dial %s: gave up after %d attempts, last error: %v: %w", addr, attempt, lastErr, ctx.Err())
		case <-t.C:
		}
		backoff = min(2*backoff, 500*time.Millisecond)
	}
}

// dialOnce makes one attempt at connection h.
func dialOnce(ctx context.Context, addr string, secret []byte, h hello) (conn, error) {
	nc, err := endpoint.Dial(ctx, addr)
	if err != nil {
		return nil, err
	}
	c := nc.(conn)
	tune(c)
	// Handshake, hello and ack are bounded by ctx: its deadline, or its cancellation when another
	// connection of this Connect failed.
	stop := context.AfterFunc(ctx, func() { c.SetDeadline(aLongTimeAgo) })
	defer stop()
	timeout := HandshakeTimeout
	if dl, ok := ctx.Deadline(); ok {
		timeout = min(timeout, time.Until(dl))
	}
	if err := auth.Handshake(c, secret, auth.Dialer, timeout); err != nil {
		c.Close()
		if isHangUp(err) {
			return nil, fmt.Errorf("%w: %w", errHungUp, err)
		}
		return nil, err
	}
	if dl, ok := ctx.Deadline(); ok {
		c.SetDeadline(dl)
	}
	if err := ctx.Err(); err != nil {
		// ctx ended before the deadline above was set, which then undid the past deadline the
		// AfterFunc set: the ack could be waited for until dl.
		c.Close()
		return nil, err
	}
	if _, err := c.Write(appendHello(nil, h)); err != nil {
		c.Close()
		return nil, fmt.Errorf("send hello: %w", err)
	}
	// The ack comes once the peer's Connect has claimed the connection, which may be a while.
	if err := readAck(c); err != nil {
		c.Close()
		if declined(err) {
			return nil, err
		}
		return nil, fmt.Errorf("waiting for rank %d to take the connection (its Connect may not have started): %w", h.to, err)
	}
	if !stop() {
		c.Close()
		return nil, ctx.Err()
	}
	c.SetDeadline(time.Time{})
	return c, nil
}

var aLongTimeAgo = time.Unix(1, 0)

// errHungUp marks a handshake the listener ended by closing the connection. auth.Handshake's
// listener side may close before its own proof is out, so a dialer with the wrong secret can see
// EOF instead of auth.ErrDenied; a few of those in a row are taken as a denial rather than retried
// until the timeout.
var errHungUp = errors.New("peer hung up during authentication")

const maxHangUps = 3

// maxRefused refused dials in a row fail a dial to an address known to have listened
// (Config.Listening). One would do on Linux, where only a closed port refuses (a full accept
// queue drops the SYN instead, unless tcp_abort_on_overflow is set); the backoff between three
// costs 30 ms.
const maxRefused = 3

func isHangUp(err error) bool {
	return errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE)
}

// newMesh makes a mesh with every peer unconnected and starts its progress watchdog.
func newMesh(cfg *Config, l *Listener) *Mesh {
	m := &Mesh{
		cfg:   *cfg,
		l:     l,
		rank:  cfg.Rank,
		size:  cfg.Size,
		chunk: uint64(cfg.chunk),
		peers: make([]*peer, cfg.Size),
		log:   cfg.log,
		inbox: make(chan transport.Msg, inboxCap),
		quit:  make(chan struct{}),
	}
	m.life, m.endLife = context.WithCancel(context.Background())
	if cfg.ProgressTimeout > 0 {
		m.progress = cfg.ProgressTimeout
	}
	for _, r := range cfg.Peers {
		m.peers[r] = &peer{m: m, rank: r, host: cfg.host(r)}
	}
	if m.progress > 0 {
		m.wg.Add(1)
		go m.watchProgress()
	}
	return m
}

// install makes conns (a whole set: the control connection and every data stream) p's
// connections and starts their goroutines. It runs under p.linkMu; on a closed mesh (it may have
// closed after its caller looked) it closes them.
func (m *Mesh) install(p *peer, conns map[connID]conn) {
	if m.closed.Load() {
		for _, c := range conns {
			c.Close()
		}
		return
	}
	p.ctrl = conns[connID{peer: p.rank, lane: laneControl}]
	if tc, ok := p.ctrl.(*net.TCPConn); ok {
		sockopt.UserTimeout(tc, m.cfg.userTimeout)
		ka := ctrlKeepAlive(m.cfg.userTimeout)
		tc.SetKeepAliveConfig(net.KeepAliveConfig{Enable: true, Idle: ka, Interval: ka, Count: keepAliveCount})
	}
	data := make([]conn, m.cfg.Streams)
	for s := range data {
		data[s] = conns[connID{peer: p.rank, lane: laneData, stream: s}]
	}
	p.out.init(p, true, data)
	p.in.init(p, false, data)
	// Close sets closed before it takes any peer's linkMu, and waits for the group only after
	// it has taken every one: these goroutines are counted before that wait begins.
	p.out.startWorkers(&m.wg)
	p.in.startWorkers(&m.wg)
	// Up before the control reader starts: whoever reads a message it delivered sees the peer
	// connected.
	p.up.Store(true)
	m.wg.Add(1)
	go p.readControl()
	p.settle(linkUp)
}

// ctrlKeepAlive is the idle time before a control connection's first keepalive probe and between
// probes: several probes fit in the user timeout, so an idle connection to a vanished host is
// noticed within it.
func ctrlKeepAlive(userTimeout time.Duration) time.Duration {
	return min(max(userTimeout/4, 250*time.Millisecond), keepAliveIdle)
}

// progressTick is how often the progress watchdog looks at the running calls.
func progressTick(limit time.Duration) time.Duration {
	return min(max(limit/8, 5*time.Millisecond), time.Second)
}

// watchProgress is the progress watchdog: every tick it looks at each direction of each peer with
// a call running, and interrupts one that moved no byte for the progress timeout (dir.tick); the
// call then fails with a *transport.StallError. A tick that comes much later than due means that
// this process itself did not run meanwhile (it was stopped, or its host suspended): its peers are
// not to blame for that time, so every clock starts again.
func (m *Mesh) watchProgress() {
	defer m.wg.Done()
	every := progressTick(m.progress)
	t := time.NewTicker(every)
	defer t.Stop()
	last := time.Now()
	for {
		select {
		case <-m.quit:
			return
		case <-t.C:
		}
		now := time.Now()
		frozen := transport.NotRunning(now.Sub(last), every)
		last = now
		for _, p := range m.peers {
			if p != nil && p.up.Load() {
				p.out.tick(now, frozen, m.progress)
				p.in.tick(now, frozen, m.progress)
			}
		}
	}
}

// Comm returns the data lane. Its Close closes the whole Mesh.
func (m *Mesh) Comm() transport.Comm { return (*meshComm)(m) }

// Messenger returns the control lane. Its Close closes the whole Mesh.
func (m *Mesh) Messenger() transport.Messenger { return (*messenger)(m) }

// Close closes every connection; pending calls fail with transport.ErrClosed, the inbox is closed,
// and the peers see this rank as lost.
func (m *Mesh) Close() error {
	m.once.Do(func() {
		// From here no call, dial or arrival makes a peer's link up, and the listener stops
		// handing the mesh connections.
		m.closed.Store(true)
		close(m.quit)
		m.endLife()
		if m.reg != nil {
			m.l.unregister(m.reg)
		}
		for _, p := range m.peers {
			if p != nil && p.closeLink() {
				p.closeConns()
			}
		}
		m.stop()
	})
	return nil
}

// stop ends the mesh's goroutines once its connections are closed: it waits for every call to
// return, so that no one hands work to the workers any more, stops them and closes the inbox.
func (m *Mesh) stop() {
	m.opMu.Lock()
	for _, p := range m.peers {
		if p != nil && p.up.Load() {
			p.out.stopWorkers()
			p.in.stopWorkers()
		}
	}
	m.opMu.Unlock()
	m.wg.Wait()
	close(m.inbox)
}

func (p *peer) closeConns() {
	if !p.up.Load() {
		return
	}
	p.ctrl.Close()
	for _, c := range p.out.conns {
		c.Close()
	}
}

// peerFor returns the peer for a call, connected (a lazy mesh connects it now, within ctx), or
// why the call cannot use it.
func (m *Mesh) peerFor(ctx context.Context, r int, op string) (*peer, error) {
	if m.closed.Load() {
		return nil, fmt.Errorf("rank %d: %s rank %d: %w", m.rank, op, r, transport.ErrClosed)
	}
	if r < 0 || r >= m.size || m.peers[r] == nil {
		return nil, fmt.Errorf("rank %d: %s rank %d: not a peer in this tcp mesh", m.rank, op, r)
	}
	p := m.peers[r]
	if pe := p.lost.Load(); pe != nil {
		return nil, &transport.PeerError{Rank: p.rank, Host: p.host, Op: op, Err: pe.Err}
	}
	if !p.up.Load() {
		if err := m.ensure(ctx, p, op); err != nil {
			return nil, err
		}
	}
	return p, nil
}

// markLost records the first reason communication with p ended and closes all of p's connections,
// so that every call blocked on p fails at once. It returns the error for the caller's op.
func (p *peer) markLost(op string, err error) error {
	if p.m.closed.Load() {
		return fmt.Errorf("rank %d: %s rank %d: %w", p.m.rank, op, p.rank, transport.ErrClosed)
	}
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
		err = fmt.Errorf("connection closed by peer: %w", err)
	}
	pe := &transport.PeerError{Rank: p.rank, Host: p.host, Op: op, Err: err}
	if p.lost.CompareAndSwap(nil, pe) {
		p.m.log.Warn("tcp transport: peer lost", "rank", p.m.rank, "peer", p.rank, "host", p.host, "op", op, "err", err)
		p.closeConns()
		return pe
	}
	// Someone else saw it first (their closing of the connections may be what failed us).
	return &transport.PeerError{Rank: p.rank, Host: p.host, Op: op, Err: p.lost.Load().Err}
}
