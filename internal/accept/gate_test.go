package accept

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/kolo-dl/kolo/testbed/proctest"
)

// peerAt is a connection from tcpAddr(ip).
func peerAt(ip string) net.Conn { return connFrom{nil, tcpAddr(ip)} }

// tcpAddr is a TCP peer at ip, or, for "unix", a Unix socket's peer (which has no address).
func tcpAddr(ip string) net.Addr {
	if ip == "unix" {
		return &net.UnixAddr{Name: "@", Net: "unix"}
	}
	return &net.TCPAddr{IP: net.ParseIP(ip), Port: 40000}
}

func TestGateRefusesAnAddressThatKeepsFailing(t *testing.T) {
	var log proctest.Buffer
	p := GatePolicy{FailLimit: 3, Window: time.Second, RefuseFor: 200 * time.Millisecond, LogBurst: 100, LogEvery: time.Hour}
	for _, tc := range []struct {
		name       string
		ip         string
		fails      int
		wantRefuse bool
	}{
		{"below the limit", "10.9.0.1", 2, false},
		{"at the limit", "10.9.0.2", 3, true},
		{"loopback never", "127.0.0.1", 10, false},
		{"ipv6 loopback never", "::1", 10, false},
		{"a Unix socket's peer never", "unix", 10, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := NewGate("test", slog.New(slog.NewTextHandler(&log, nil)), p)
			defer g.Close()
			for range tc.fails {
				g.Rejected(peerAt(tc.ip), "authentication", errors.New("denied"))
			}
			if got := !g.admit(tcpAddr(tc.ip)); got != tc.wantRefuse {
				t.Fatalf("refused = %v, want %v", got, tc.wantRefuse)
			}
			if !g.admit(tcpAddr("10.9.9.9")) {
				t.Error("another address was refused")
			}
			if tc.wantRefuse {
				time.Sleep(p.RefuseFor + 50*time.Millisecond)
				if !g.admit(tcpAddr(tc.ip)) {
					t.Error("still refused after RefuseFor")
				}
			}
		})
	}
}

// A stranger on one of the job's hosts cannot close the door on that host's ranks: an address a
// peer authenticated from, and this host's own addresses, are never refused, however many
// handshakes fail from them.
func TestGateNeverRefusesTheJobsHosts(t *testing.T) {
	p := GatePolicy{FailLimit: 3, Window: time.Minute, RefuseFor: time.Minute, LogBurst: 100, LogEvery: time.Hour}
	g := NewGate("test", slog.New(slog.DiscardHandler), p)
	defer g.Close()
	// Failures before the peer authenticates are forgiven too: a start-up raced by a stranger.
	g.Rejected(peerAt("10.9.0.3"), "authentication", errors.New("denied"))
	g.Authenticated(peerAt("10.9.0.3"))
	for range 10 {
		g.Rejected(peerAt("10.9.0.3"), "authentication", errors.New("denied"))
		g.Rejected(peerAt("10.9.0.4"), "authentication", errors.New("denied"))
	}
	if !g.admit(tcpAddr("10.9.0.3")) {
		t.Error("an address a peer authenticated from was refused")
	}
	if g.admit(tcpAddr("10.9.0.4")) {
		t.Error("a stranger's address was not refused: the test's policy does not refuse")
	}
	var own string
	if addrs, err := net.InterfaceAddrs(); err == nil {
		for _, a := range addrs {
			if n, ok := a.(*net.IPNet); ok && !n.IP.IsLoopback() {
				own = n.IP.String()
				break
			}
		}
	}
	if own == "" {
		t.Log("no address but loopback here: this host's own addresses not checked")
		return
	}
	for range 10 {
		g.Rejected(peerAt(own), "authentication", errors.New("denied"))
	}
	if !g.admit(tcpAddr(own)) {
		t.Errorf("this host's own address %s was refused", own)
	}
}

// A flood of rejections logs the burst and then one line with the count per interval.
func TestGateBoundsItsLog(t *testing.T) {
	var log proctest.Buffer
	p := GatePolicy{FailLimit: 1 << 30, LogBurst: 3, LogEvery: 100 * time.Millisecond}
	g := NewGate("test", slog.New(slog.NewTextHandler(&log, nil)), p)
	defer g.Close()
	for i := range 1000 {
		g.Rejected(peerAt(fmt.Sprintf("10.9.0.%d", 1+i%5)), "authentication", errors.New("denied"))
	}
	deadline := time.Now().Add(2 * time.Second)
	for !strings.Contains(log.String(), "more connections rejected") && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	out := log.String()
	if n := strings.Count(out, "rejected connection"); n != 3 {
		t.Errorf("%d rejections logged one by one, want 3:\n%s", n, out)
	}
	if !strings.Contains(out, "count=997") || !strings.Contains(out, "addresses=5") {
		t.Errorf("no summary of the other 997 from 5 addresses:\n%s", out)
	}
	if len(out) > 2000 {
		t.Errorf("%d bytes of log for 1000 rejections", len(out))
	}
	// The next interval logs one by one again.
	g.Rejected(peerAt("10.9.0.1"), "hello", errors.New("bad"))
	if n := strings.Count(log.String(), "rejected connection"); n != 4 {
		t.Errorf("after the interval: %d lines one by one, want 4", n)
	}
}

// Through Wrap, a refused address's connections are closed at accept and never reach the owner.
func TestGateWrapClosesRefusedConnections(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	g := NewGate("test", slog.New(slog.DiscardHandler), GatePolicy{FailLimit: 1})
	defer g.Close()
	// Loopback is never refused, so refuse by the accepted address's own form: a gated listener
	// whose Accept sees a non-loopback remote.
	wl := g.Wrap(remoteAs{ln, tcpAddr("10.9.0.7")})
	defer wl.Close()
	g.Rejected(peerAt("10.9.0.7"), "authentication", errors.New("denied"))
	got := make(chan error, 1)
	go func() {
		_, err := wl.Accept() // refuses the first, returns when the listener closes
		got <- err
	}()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	c.SetReadDeadline(time.Now().Add(2 * time.Second))
	var ne net.Error
	if _, err := c.Read(make([]byte, 1)); err == nil || errors.As(err, &ne) && ne.Timeout() {
		t.Errorf("refused connection was not closed at once: %v", err)
	}
	c.Close()
	wl.Close()
	if err := <-got; !errors.Is(err, net.ErrClosed) {
		t.Errorf("Accept returned %v, want the listener's close", err)
	}
}

// remoteAs makes every accepted connection report addr as its remote address.
type remoteAs struct {
	net.Listener
	addr net.Addr
}

func (l remoteAs) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return connFrom{c, l.addr}, nil
}

type connFrom struct {
	net.Conn
	addr net.Addr
}

func (c connFrom) RemoteAddr() net.Addr { return c.addr }
