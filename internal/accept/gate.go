package accept

import (
	"log/slog"
	"net"
	"strconv"
	"sync"
	"time"

	"github.com/kolo-dl/kolo/internal/endpoint"
)

// Gate stands at a listener's door against strangers: it reports connections its owner rejected
// (a failed handshake, a bad hello) at a bounded rate, so that a flood of them cannot fill the
// job's logs, and refuses at accept, for a while, an address that keeps failing, so that its
// connections cost the job no handshake. A Gate is safe for concurrent use.
//
// Loopback addresses, this host's own addresses and Unix sockets are never refused by address:
// every process of the host shares them, the job's own ranks included, so refusing one would let
// any local user cut the job off. Nor is an address a peer has authenticated from (Authenticated):
// a stranger on one of the job's hosts must not close the door on that host's ranks. A Unix
// socket's peer of another user is refused instead, by its user id, before any byte.
type Gate struct {
	what string
	log  *slog.Logger
	p    GatePolicy

	own map[string]bool // this host's addresses, fixed at NewGate

	mu      sync.Mutex
	peers   map[string]*failures // by IP
	trusted map[string]bool      // addresses a peer authenticated from: never refused
	logged  int                  // rejections logged one by one in the current interval
	quiet   int                  // rejections and refusals since, not logged one by one
	from    map[string]bool      // the addresses of those
	flushAt *time.Timer          // logs the count of quiet ones at the interval's end
}

// GatePolicy bounds a Gate. Zero fields take DefaultGatePolicy's.
type GatePolicy struct {
	FailLimit int           // failures within Window that close the door on an address
	Window    time.Duration // how far back failures count
	RefuseFor time.Duration // how long the door stays closed
	LogBurst  int           // rejections logged one by one per LogEvery; the rest are counted
	LogEvery  time.Duration
}

// DefaultGatePolicy: a kolo peer never fails a handshake (it has the secret), so ten failures in
// ten seconds are a stranger's; a stranger's churn then costs the job one accept and one close per
// connection for thirty seconds at a time, and the log a few lines a minute.
var DefaultGatePolicy = GatePolicy{FailLimit: 10, Window: 10 * time.Second, RefuseFor: 30 * time.Second, LogBurst: 5, LogEvery: time.Minute}

type failures struct {
	times        []time.Time // within Window, oldest first
	refusedUntil time.Time
}

// NewGate returns a Gate for the listener named what, logging to log.
func NewGate(what string, log *slog.Logger, p GatePolicy) *Gate {
	d := DefaultGatePolicy
	if p.FailLimit <= 0 {
		p.FailLimit = d.FailLimit
	}
	if p.Window <= 0 {
		p.Window = d.Window
	}
	if p.RefuseFor <= 0 {
		p.RefuseFor = d.RefuseFor
	}
	if p.LogBurst <= 0 {
		p.LogBurst = d.LogBurst
	}
	if p.LogEvery <= 0 {
		p.LogEvery = d.LogEvery
	}
	return &Gate{what: what, log: log, p: p, own: hostAddrs(), peers: map[string]*failures{},
		trusted: map[string]bool{}, from: map[string]bool{}}
}

// hostAddrs is the set of this host's interface addresses (empty if they cannot be listed: then
// only loopback counts as shared).
func hostAddrs() map[string]bool {
	own := map[string]bool{}
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		return own
	}
	for _, a := range addrs {
		if n, ok := a.(*net.IPNet); ok {
			own[n.IP.String()] = true
		}
	}
	return own
}

// Authenticated records that a peer proved it knows the secret on c: its address is a job host's,
// and is never refused, nor its earlier failures held against it. Only peers with the secret add
// to the set, so it is as large as the job's hosts.
func (g *Gate) Authenticated(c net.Conn) {
	addr := c.RemoteAddr()
	if g.shared(addr) {
		return
	}
	ip := hostOf(addr)
	g.mu.Lock()
	defer g.mu.Unlock()
	if !g.trusted[ip] {
		g.trusted[ip] = true
		delete(g.peers, ip)
	}
}

// Wrap returns ln with g at its door: its Accept closes, uncounted by the caller, the connections
// of addresses g refuses.
func (g *Gate) Wrap(ln net.Listener) net.Listener { return gated{ln, g} }

type gated struct {
	net.Listener
	g *Gate
}

func (l gated) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil || !l.g.otherUser(c) && l.g.admit(c.RemoteAddr()) {
			return c, err
		}
		c.Close()
	}
}

// otherUser reports whether c comes from another user's process (a Unix socket's peer), which
// is refused before it is read: only the job's user can be running its ranks.
func (g *Gate) otherUser(c net.Conn) bool {
	uid, other := endpoint.OtherUser(c)
	if !other {
		return false
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.logged < g.p.LogBurst {
		g.logged++
		g.log.Warn(g.what+": refused a connection from another user", "remote", endpoint.Peer(c), "uid", uid)
		g.armFlush()
		return true
	}
	g.countQuiet("uid " + strconv.Itoa(uid))
	return true
}

// admit reports whether a connection from addr may go on to its handshake.
func (g *Gate) admit(addr net.Addr) bool {
	ip := hostOf(addr)
	now := time.Now()
	g.mu.Lock()
	defer g.mu.Unlock()
	f := g.peers[ip]
	if f == nil || !now.Before(f.refusedUntil) {
		return true
	}
	g.countQuiet(ip)
	return false
}

// Rejected records that the owner rejected the connection c for err (why names the step that
// failed), and logs it unless this interval's burst of lines is spent.
func (g *Gate) Rejected(c net.Conn, why string, err error) {
	addr := c.RemoteAddr()
	ip := hostOf(addr)
	now := time.Now()
	g.mu.Lock()
	defer g.mu.Unlock()
	if !g.shared(addr) && !g.trusted[ip] {
		f := g.peers[ip]
		if f == nil {
			if len(g.peers) >= maxTracked {
				g.forgetOld(now)
			}
			f = &failures{}
			g.peers[ip] = f
		}
		cut := 0
		for cut < len(f.times) && now.Sub(f.times[cut]) > g.p.Window {
			cut++
		}
		f.times = append(f.times[cut:], now)
		if len(f.times) >= g.p.FailLimit {
			f.times = f.times[:0]
			f.refusedUntil = now.Add(g.p.RefuseFor)
			g.log.Warn(g.what+": refusing an address that keeps failing authentication", "remote", ip,
				"failures", g.p.FailLimit, "within", g.p.Window, "for", g.p.RefuseFor)
		}
	}
	if g.logged < g.p.LogBurst {
		g.logged++
		g.log.Warn(g.what+": rejected connection", "remote", endpoint.Peer(c), "why", why, "err", err)
		g.armFlush()
		return
	}
	g.countQuiet(ip)
}

// maxTracked bounds the addresses a Gate remembers, whatever a stranger does.
const maxTracked = 4096

// forgetOld drops the addresses that are neither refused nor failing within the window.
func (g *Gate) forgetOld(now time.Time) {
	for ip, f := range g.peers {
		if !now.Before(f.refusedUntil) && (len(f.times) == 0 || now.Sub(f.times[len(f.times)-1]) > g.p.Window) {
			delete(g.peers, ip)
		}
	}
}

func (g *Gate) countQuiet(ip string) {
	g.quiet++
	if len(g.from) < maxTracked {
		g.from[ip] = true
	}
	g.armFlush()
}

// armFlush starts the interval whose end logs the count of rejections not logged one by one.
func (g *Gate) armFlush() {
	if g.flushAt == nil {
		g.flushAt = time.AfterFunc(g.p.LogEvery, g.flush)
	}
}

func (g *Gate) flush() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.quiet > 0 {
		g.log.Warn(g.what+": more connections rejected or refused", "count", g.quiet, "addresses", len(g.from), "in", g.p.LogEvery)
	}
	g.logged, g.quiet, g.flushAt = 0, 0, nil
	clear(g.from)
}

// Close stops the Gate's timer; a Gate's listener calls it as it closes.
func (g *Gate) Close() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.flushAt != nil {
		g.flushAt.Stop()
		g.flushAt = nil
	}
}

func hostOf(addr net.Addr) string {
	if addr == nil { // a Unix socket's peer may have no address
		return ""
	}
	if a, ok := addr.(*net.TCPAddr); ok {
		return a.IP.String()
	}
	h, _, err := net.SplitHostPort(addr.String())
	if err != nil {
		return addr.String()
	}
	return h
}

// shared reports whether addr may be every local process's: loopback, one of this host's
// addresses, or a Unix socket's peer (which has no address of its own).
func (g *Gate) shared(addr net.Addr) bool {
	if _, ok := addr.(*net.UnixAddr); ok || addr == nil {
		return true
	}
	h := hostOf(addr)
	p := net.ParseIP(h)
	return p != nil && p.IsLoopback() || g.own[h]
}
