package tcp

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/kolo-dl/kolo/internal/transport"
)

// A lazy mesh's first calls to a rank whose world closed (its mesh, then its listener, as
// world.Close does), before or while they dial it, fail at once with a PeerError naming it (the
// refused dials of Config.Listening), not at the connect timeout, and the inbox says the peer is
// lost.
func TestLazyDialToAClosedRank(t *testing.T) {
	for _, tc := range []struct {
		name   string
		during bool // close the rank while the dials are under way, not before
	}{
		{"closed before", false},
		{"closed during", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := connectAllWith(t, 3, 2, ChunkSize, func(cfg *Config) {
				cfg.Lazy, cfg.Eager, cfg.Listening = true, nil, true
				cfg.ConnectTimeout = 20 * time.Second
			})
			end := func() {
				w.ms[2].Close()
				w.ls[2].Close()
			}
			if !tc.during {
				end()
			}
			errc := make(chan error, 2)
			go func() { errc <- w.ms[0].Comm().Send(context.Background(), 2, make([]byte, 8<<20)) }()
			go func() { errc <- w.ms[1].Messenger().SendMsg(context.Background(), 2, []byte("x")) }()
			if tc.during {
				time.Sleep(time.Millisecond)
				end()
			}
			for range 2 {
				select {
				case err := <-errc:
					var pe *transport.PeerError
					if tc.during && err == nil {
						continue // the whole set was up before the rank closed, and the bytes went out
					}
					if !errors.As(err, &pe) || pe.Rank != 2 || pe.Host != "node2" {
						t.Fatalf("%v, want a PeerError for rank 2", err)
					}
				case <-time.After(5 * time.Second):
					t.Fatal("a call to the closed rank still blocked after 5 s")
				}
			}
			if !tc.during {
				for _, r := range []int{0, 1} {
					select {
					case msg := <-w.ms[r].Messenger().Inbox():
						if msg.From != 2 || msg.Body != nil {
							t.Fatalf("rank %d inbox: %+v, want the nil-body loss notice from rank 2", r, msg)
						}
					case <-time.After(time.Second):
						t.Fatalf("rank %d: no loss notice in the inbox", r)
					}
				}
			}
		})
	}
}

// A rank whose mesh closes while the set it dials is only partly taken by the peer (the rest
// never comes) is known to the peer at once: the peer's call waiting on the set fails within 2 s
// with a PeerError naming it, not at the connect timeout (20 s here), whether the control
// connection is among those the peer has or not. A proxy in front of the peer's listener holds
// the hello of the connections the peer is not to get.
func TestSetAbandonedWhileArriving(t *testing.T) {
	const streams = 2
	for _, tc := range []struct {
		name string
		held func(h hello) bool
		have []connID // what the peer (rank 1) has of the set when rank 0 closes
	}{
		{"control connection and data stream 0 here",
			func(h hello) bool { return h.lane == laneData && h.stream == 1 },
			[]connID{{peer: 0, lane: laneControl}, {peer: 0, lane: laneData, stream: 0}}},
		{"data stream 0 alone here",
			func(h hello) bool { return h.lane == laneControl || h.stream == 1 },
			[]connID{{peer: 0, lane: laneData, stream: 0}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := newListenersWith(t, 2, 20*time.Second) // the hello the proxy holds is not late
			px := newHelloProxy(t, w.addrs[1], tc.held)
			defer px.drop()
			w.connect(t, streams, ChunkSize, func(cfg *Config) {
				cfg.Lazy, cfg.Eager = true, nil
				cfg.ConnectTimeout = 20 * time.Second
				if cfg.Rank == 0 {
					cfg.Addrs = []string{w.addrs[0], px.addr}
				}
			})
			m0, m1 := w.ms[0], w.ms[1]
			p1 := m1.peers[0]
			go m0.Comm().Send(context.Background(), 1, nil) // dials; fails as rank 0 closes
			waitUntil(t, "rank 1 took its part of the set", func() bool {
				p1.linkMu.Lock()
				defer p1.linkMu.Unlock()
				for _, id := range tc.have {
					if p1.partial[id] == nil {
						return false
					}
				}
				return len(p1.partial) == len(tc.have) && px.holding() == 1+streams-len(tc.have)
			})
			errc := make(chan error, 1)
			go func() { errc <- m1.Comm().Recv(context.Background(), 0, make([]byte, 1<<20)) }()

			m0.Close()
			start := time.Now()
			select {
			case err := <-errc:
				var pe *transport.PeerError
				if !errors.As(err, &pe) || pe.Rank != 0 || pe.Host != "node0" {
					t.Fatalf("after %v: %v, want a PeerError for rank 0", time.Since(start), err)
				}
			case <-time.After(2 * time.Second):
				t.Fatal("a call on rank 0 still blocked 2 s after it closed")
			}
			select {
			case msg := <-m1.Messenger().Inbox():
				if msg.From != 0 || msg.Body != nil {
					t.Fatalf("inbox: %+v, want the nil-body loss notice from rank 0", msg)
				}
			case <-time.After(time.Second):
				t.Fatal("no loss notice from rank 0 in the inbox")
			}
			if err := m1.Messenger().Lost(0); err == nil {
				t.Fatal("Lost(0) = nil after rank 0 abandoned its set")
			}
		})
	}
}

// waitUntil polls cond until it holds, failing the test after 5 s.
func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); !cond(); time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("waited 5 s for: %s", what)
		}
	}
}

// helloProxy forwards connections to a listener, both ways, and holds (never forwards) the hello
// of those that held says so, with whatever follows it, until drop: the listener sees such a
// connection authenticated and silent, as one still in its handshake.
type helloProxy struct {
	ln   net.Listener
	addr string
	to   string
	held func(hello) bool

	mu        sync.Mutex
	heldConns []net.Conn // the dialer's ends of held connections
	conns     []net.Conn
	wg        sync.WaitGroup
}

func newHelloProxy(t *testing.T, to string, held func(hello) bool) *helloProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	px := &helloProxy{ln: ln, addr: ln.Addr().String(), to: to, held: held}
	px.wg.Add(1)
	go px.serve()
	t.Cleanup(px.close)
	return px
}

func (px *helloProxy) serve() {
	defer px.wg.Done()
	for {
		c, err := px.ln.Accept()
		if err != nil {
			return
		}
		up, err := net.Dial("tcp", px.to)
		if err != nil {
			c.Close()
			continue
		}
		px.mu.Lock()
		px.conns = append(px.conns, c, up)
		px.mu.Unlock()
		px.wg.Add(2)
		go func() {
			defer px.wg.Done()
			io.Copy(c, up)
			c.Close()
			up.Close()
		}()
		go func() {
			defer px.wg.Done()
			px.forward(c, up)
			c.Close()
			up.Close()
		}()
	}
}

// forward copies the dialer's bytes to the listener until it finds the hello: a held one stops
// the copy there. Bytes that may begin the hello's magic wait for the next read, or for 20 ms
// (the handshake before the hello waits for its answers).
func (px *helloProxy) forward(c, up net.Conn) {
	var pending []byte
	buf := make([]byte, 64<<10)
	for {
		n, err := c.Read(buf)
		c.SetReadDeadline(time.Time{})
		if errors.Is(err, os.ErrDeadlineExceeded) {
			if _, err := up.Write(pending); err != nil {
				return
			}
			pending = pending[:0]
			continue
		}
		if err != nil {
			return
		}
		pending = append(pending, buf[:n]...)
		i := bytes.Index(pending, []byte(helloMagic))
		if i < 0 {
			keep := 0
			for k := min(len(pending), len(helloMagic)-1); k > 0; k-- {
				if bytes.HasSuffix(pending, []byte(helloMagic[:k])) {
					keep = k
					break
				}
			}
			if _, err := up.Write(pending[:len(pending)-keep]); err != nil {
				return
			}
			pending = append(pending[:0], pending[len(pending)-keep:]...)
			if keep > 0 {
				c.SetReadDeadline(time.Now().Add(20 * time.Millisecond))
			}
			continue
		}
		h, err := readHello(bytes.NewReader(pending[i:]))
		if err != nil {
			continue // not all of it yet
		}
		if px.held(h) {
			px.mu.Lock()
			px.heldConns = append(px.heldConns, c)
			px.mu.Unlock()
			io.Copy(io.Discard, c) // until drop closes it
			return
		}
		if _, err := up.Write(pending); err != nil {
			return
		}
		io.Copy(up, c)
		return
	}
}

// holding is how many connections the proxy holds.
func (px *helloProxy) holding() int {
	px.mu.Lock()
	defer px.mu.Unlock()
	return len(px.heldConns)
}

// drop closes the connections held, at both ends.
func (px *helloProxy) drop() {
	px.mu.Lock()
	defer px.mu.Unlock()
	for _, c := range px.heldConns {
		c.Close()
	}
}

func (px *helloProxy) close() {
	px.ln.Close()
	px.mu.Lock()
	for _, c := range px.conns {
		c.Close()
	}
	px.mu.Unlock()
	px.wg.Wait()
}
