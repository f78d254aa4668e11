package tcp

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/kolo-dl/kolo/internal/accept"
	"github.com/kolo-dl/kolo/internal/auth"
	"github.com/kolo-dl/kolo/internal/transport"
)

// badDial connects to addr with secret and sends h; it returns what the listener answered.
func badDial(addr string, secret []byte, h hello) error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, err := dialOnce(ctx, addr, secret, h)
	if err == nil {
		c.Close()
	}
	return err
}

func TestRejectsIntrudersWhileMeshForms(t *testing.T) {
	w := newListeners(t, 2)
	target := w.addrs[1] // rank 1 accepts rank 0's connections
	good := hello{lane: laneControl, streams: 2, from: 0, to: 1, size: 2, job: "job-1"}
	stale := good
	stale.job = "job-0"
	type outcome struct {
		name string
		err  error
	}
	results := make(chan outcome, 16)
	var bad sync.WaitGroup
	intrude := func(name string, f func() error) {
		bad.Add(1)
		go func() {
			defer bad.Done()
			results <- outcome{name, f()}
		}()
	}
	raw := func(data []byte) func() error {
		return func() error {
			c, err := net.Dial("tcp", target)
			if err != nil {
				return err
			}
			defer c.Close()
			c.Write(data)
			c.SetReadDeadline(time.Now().Add(5 * time.Second))
			_, err = io.Copy(io.Discard, c)
			if errors.Is(err, os.ErrDeadlineExceeded) {
				return fmt.Errorf("listener kept the connection open")
			}
			return nil // closed (EOF or reset): rejected
		}
	}
	junk := make([]byte, 500)
	rand.Read(junk)

	// Before rank 1's Connect starts: the stale-job connection is parked, then refused.
	intrude("stale job before", func() error { return badDial(target, testSecret, stale) })
	intrude("wrong secret", func() error { return badDial(target, []byte("not the secret"), good) })
	intrude("random bytes", raw(junk))
	intrude("silence", raw(nil))
	time.Sleep(100 * time.Millisecond)

	w.ms = make([]*Mesh, 2)
	errs := make([]error, 2)
	var wg sync.WaitGroup
	connect := func(r int) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			w.ms[r], errs[r] = Connect(context.Background(), w.ls[r], w.cfg(r, 2, ChunkSize))
		}()
	}
	connect(1)
	for registered := false; !registered; time.Sleep(5 * time.Millisecond) {
		w.ls[1].mu.Lock()
		registered = len(w.ls[1].regs) > 0
		w.ls[1].mu.Unlock()
	}
	// While rank 1's Connect waits: refused at once.
	intrude("stale job during", func() error { return badDial(target, testSecret, stale) })
	wrongRank := good
	wrongRank.from, wrongRank.to, wrongRank.size = 2, 1, 3
	intrude("wrong size", func() error { return badDial(target, testSecret, wrongRank) })
	bad.Wait()
	connect(0)
	wg.Wait()
	for r, err := range errs {
		if err != nil {
			t.Fatalf("rank %d: mesh did not form beside intruders: %v", r, err)
		}
		defer w.ms[r].Close()
	}
	close(results)
	for o := range results {
		var want string
		switch {
		case strings.HasPrefix(o.name, "stale job"):
			want = "job id mismatch"
		case o.name == "wrong size":
			want = "mismatch"
		case o.name == "wrong secret":
			if !errors.Is(o.err, auth.ErrDenied) && !errors.Is(o.err, errHungUp) {
				t.Errorf("%s: %v, want auth.ErrDenied", o.name, o.err)
			}
			continue
		default:
			if o.err != nil {
				t.Errorf("%s: %v", o.name, o.err)
			}
			continue
		}
		if !errors.Is(o.err, errRejected) || !strings.Contains(o.err.Error(), want) {
			t.Errorf("%s: %v, want a rejection saying %q", o.name, o.err, want)
		}
	}
	// The mesh works.
	w.each(t, func(r int, cm transport.Comm) error {
		rb := make([]byte, 100000)
		if err := cm.SendRecv(context.Background(), 1-r, payload(r, 1-r, 9, len(rb)), 1-r, rb); err != nil {
			return err
		}
		return check(rb, 1-r, r, 9)
	})
	// The intruders were logged one by one, with their addresses, up to the gate's burst (the
	// rest are counted in a line at the end of its interval).
	rejected := w.sink.warnings("tcp transport: rejected connection")
	if want := min(6, accept.DefaultGatePolicy.LogBurst); len(rejected) != want {
		t.Fatalf("%d rejections logged (%v), want %d", len(rejected), rejected, want)
	}
	for _, r := range rejected {
		if !strings.HasPrefix(r, "127.0.0.1:") {
			t.Errorf("rejection logged with remote %q", r)
		}
	}
}

// connectAndUse is Connect, and with a lazy mesh also the first use of peer that connects it:
// the failure of either.
func connectAndUse(ctx context.Context, l *Listener, cfg Config, peer int) (*Mesh, error) {
	m, err := Connect(ctx, l, cfg)
	if err != nil || !cfg.Lazy {
		return m, err
	}
	if err := m.Comm().Send(ctx, peer, nil); err != nil {
		m.Close()
		return nil, err
	}
	return m, nil
}

// Every way of not reaching a peer fails with a *transport.PeerError naming it: at Connect, or
// (lazy) at the call that first needs the peer.
func TestConnectFailures(t *testing.T) {
	ctx := context.Background()
	t.Run("wrong secret", func(t *testing.T) {
		w := newListeners(t, 2)
		stop := make(chan struct{})
		defer close(stop)
		go func() {
			m, err := Connect(ctx, w.ls[1], w.cfg(1, 2, ChunkSize))
			if err == nil {
				<-stop // a lazy mesh is formed at once, and must be there when rank 0 dials
				m.Close()
			}
		}()
		cfg := w.cfg(0, 2, ChunkSize)
		cfg.Secret = []byte("wrong")
		start := time.Now()
		_, err := connectAndUse(ctx, w.ls[0], cfg, 1)
		var pe *transport.PeerError
		if !errors.Is(err, auth.ErrDenied) || !errors.As(err, &pe) || pe.Rank != 1 || pe.Host != "node1" {
			t.Fatalf("Connect with a wrong secret: %v", err)
		}
		if time.Since(start) > 3*time.Second {
			t.Fatalf("wrong secret took %s to fail: it should not retry", time.Since(start))
		}
	})
	t.Run("job id mismatch", func(t *testing.T) {
		w := newListeners(t, 2)
		stop := make(chan struct{})
		defer close(stop)
		go func() {
			cfg := w.cfg(1, 2, ChunkSize)
			cfg.ConnectTimeout = time.Second
			m, err := Connect(ctx, w.ls[1], cfg)
			if err == nil {
				<-stop
				m.Close()
			}
		}()
		cfg := w.cfg(0, 2, ChunkSize)
		cfg.JobID = "old-job"
		_, err := connectAndUse(ctx, w.ls[0], cfg, 1)
		if !errors.Is(err, errRejected) || !strings.Contains(err.Error(), "job id mismatch") {
			t.Fatalf("Connect into another job: %v", err)
		}
	})
	t.Run("peer never dials in", func(t *testing.T) {
		w := newListeners(t, 3)
		cfg := w.cfg(2, 2, ChunkSize)
		cfg.ConnectTimeout = 300 * time.Millisecond
		_, err := connectAndUse(ctx, w.ls[2], cfg, 0)
		var pe *transport.PeerError
		want := "dial in"
		if lazyMode {
			want = "may not have started" // rank 2 dials, and nobody takes the connection
		}
		if !errors.As(err, &pe) || pe.Rank != 0 || !strings.Contains(err.Error(), want) || !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("Connect with absent peers: %v", err)
		}
	})
	t.Run("peer never listens", func(t *testing.T) {
		w := newListeners(t, 2)
		w.ls[1].Close()
		cfg := w.cfg(0, 2, ChunkSize)
		cfg.ConnectTimeout = 300 * time.Millisecond
		_, err := connectAndUse(ctx, w.ls[0], cfg, 1)
		var pe *transport.PeerError
		if !errors.As(err, &pe) || pe.Rank != 1 || !strings.Contains(err.Error(), w.addrs[1]) || !strings.Contains(err.Error(), "refused") {
			t.Fatalf("Connect to a closed port: %v", err)
		}
	})
	t.Run("peer stopped listening", func(t *testing.T) {
		// Config.Listening: the address did listen, so a refusal is final and fails long before
		// the connect timeout.
		w := newListeners(t, 2)
		w.ls[1].Close()
		cfg := w.cfg(0, 2, ChunkSize)
		cfg.Listening, cfg.ConnectTimeout = true, 20*time.Second
		start := time.Now()
		_, err := connectAndUse(ctx, w.ls[0], cfg, 1)
		took := time.Since(start)
		var pe *transport.PeerError
		if !errors.As(err, &pe) || pe.Rank != 1 || !strings.Contains(err.Error(), w.addrs[1]) ||
			!strings.Contains(err.Error(), "nothing listens there any more") || !errors.Is(err, syscall.ECONNREFUSED) {
			t.Fatalf("Connect to a port closed since it was published: %v", err)
		}
		if took > 2*time.Second {
			t.Fatalf("failed after %v; want well within the 20 s connect timeout", took.Round(time.Millisecond))
		}
	})
	t.Run("bad config", func(t *testing.T) {
		w := newListeners(t, 2)
		for _, mod := range []func(*Config){
			func(c *Config) { c.Rank = 2 },
			func(c *Config) { c.Peers = []int{0} },
			func(c *Config) { c.Peers = []int{1, 1} },
			func(c *Config) { c.Addrs = nil },
			func(c *Config) { c.Secret = nil },
			func(c *Config) { c.Streams = MaxStreams + 1 },
		} {
			cfg := w.cfg(0, 2, ChunkSize)
			mod(&cfg)
			if _, err := Connect(ctx, w.ls[0], cfg); err == nil || !strings.Contains(err.Error(), "bad config") {
				t.Errorf("bad config accepted: %v", err)
			}
		}
	})
}

func TestPeerLoss(t *testing.T) {
	kills := []struct {
		name string
		kill func(m *Mesh)
	}{
		{"mesh closed", func(m *Mesh) { m.Close() }},
		// A process dying closes its sockets without any of our code running.
		{"raw connections closed", func(m *Mesh) {
			for _, p := range m.peers {
				if p != nil {
					p.closeConns()
				}
			}
		}},
	}
	blocked := []struct {
		name string
		op   func(ctx context.Context, c transport.Comm) error
	}{
		{"recv", func(ctx context.Context, c transport.Comm) error { return c.Recv(ctx, 2, make([]byte, 3<<20)) }},
		{"sendrecv", func(ctx context.Context, c transport.Comm) error {
			return c.SendRecv(ctx, 2, make([]byte, 5), 2, make([]byte, 3<<20))
		}},
		// Bigger than the socket buffers: blocks until the dead peer would have read it.
		{"send", func(ctx context.Context, c transport.Comm) error { return c.Send(ctx, 2, make([]byte, 64<<20)) }},
	}
	for _, k := range kills {
		for _, b := range blocked {
			t.Run(k.name+"/"+b.name, func(t *testing.T) {
				w := connectAll(t, 3, 2, ChunkSize)
				// In a lazy mesh the call would first dial rank 2: killed during that dial, it
				// fails at the connect deadline instead, a different path (the Connect tests
				// have it). One exchange first makes the connections, as a job's first op does.
				warm := make(chan error, 1)
				go func() { warm <- w.ms[2].Comm().SendRecv(context.Background(), 1, []byte{2}, 1, make([]byte, 1)) }()
				if err := w.ms[1].Comm().SendRecv(context.Background(), 2, []byte{1}, 2, make([]byte, 1)); err != nil {
					t.Fatal(err)
				}
				if err := <-warm; err != nil {
					t.Fatal(err)
				}
				errc := make(chan error, 1)
				go func() { errc <- b.op(context.Background(), w.ms[1].Comm()) }()
				time.Sleep(100 * time.Millisecond)
				k.kill(w.ms[2])
				start := time.Now()
				var err error
				select {
				case err = <-errc:
				case <-time.After(time.Second):
					t.Fatal("blocked call still running 1s after its peer died")
				}
				var pe *transport.PeerError
				if !errors.As(err, &pe) || pe.Rank != 2 || pe.Host != "node2" || !errors.Is(err, transport.ErrPeerLost) {
					t.Fatalf("after %s: %v, want a PeerError for rank 2", time.Since(start), err)
				}
				ms := w.ms[1].Messenger()
				select {
				case msg := <-ms.Inbox():
					if msg.From != 2 || msg.Body != nil {
						t.Fatalf("inbox: %+v, want the nil-body loss notice from rank 2", msg)
					}
				case <-time.After(time.Second):
					t.Fatal("no loss notice in the inbox")
				}
				if err := ms.Lost(2); err == nil {
					t.Fatal("Lost(2) = nil after rank 2 died")
				}
				// Later calls on the lost peer fail at once; the healthy peer still works.
				if err := w.ms[1].Comm().Recv(context.Background(), 2, make([]byte, 1)); !errors.Is(err, transport.ErrPeerLost) {
					t.Fatalf("Recv from lost peer: %v", err)
				}
				if err := ms.SendMsg(context.Background(), 2, []byte("x")); !errors.Is(err, transport.ErrPeerLost) {
					t.Fatalf("SendMsg to lost peer: %v", err)
				}
				if ms.Lost(0) != nil {
					t.Fatalf("Lost(0) = %v", ms.Lost(0))
				}
				sub := &world{ms: w.ms[:2]}
				sub.each(t, func(r int, cm transport.Comm) error {
					rb := make([]byte, 1000)
					if err := cm.SendRecv(context.Background(), 1-r, payload(r, 1-r, 5, len(rb)), 1-r, rb); err != nil {
						return err
					}
					return check(rb, 1-r, r, 5)
				})
				// Exactly one loss notice.
				select {
				case msg := <-ms.Inbox():
					t.Fatalf("second inbox message %+v", msg)
				case <-time.After(50 * time.Millisecond):
				}
			})
		}
	}
}

func TestContextCancel(t *testing.T) {
	w := connectAll(t, 2, 2, 1000)
	a, b := w.ms[0].Comm(), w.ms[1].Comm()

	t.Run("cancel unblocks recv, stream intact", func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		time.AfterFunc(50*time.Millisecond, cancel)
		start := time.Now()
		err := a.Recv(ctx, 1, make([]byte, 4096))
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("Recv: %v", err)
		}
		if d := time.Since(start); d > time.Second {
			t.Fatalf("cancel took %s to unblock Recv", d)
		}
		// No byte moved, so the stream goes on.
		sent := make(chan error, 1)
		go func() { sent <- b.Send(context.Background(), 0, payload(1, 0, 1, 5000)) }()
		got := make([]byte, 5000)
		if err := a.Recv(context.Background(), 1, got); err != nil {
			t.Fatal(err)
		}
		if err := <-sent; err != nil {
			t.Fatal(err)
		}
		if err := check(got, 1, 0, 1); err != nil {
			t.Fatal(err)
		}
		if err := w.ms[0].Messenger().Lost(1); err != nil {
			t.Fatalf("peer lost after a clean cancel: %v", err)
		}
	})
	t.Run("shared ctx cancelled during a later call", func(t *testing.T) {
		// The watcher keeps waiting on a ctx that several calls share: it must still fire for the
		// call running when that ctx ends, and not for one that already finished.
		ctx, cancel := context.WithCancel(context.Background())
		for i := range 3 {
			sent := make(chan error, 1)
			go func() { sent <- b.Send(ctx, 0, payload(1, 0, 20+i, 3001)) }()
			got := make([]byte, 3001)
			if err := a.Recv(ctx, 1, got); err != nil {
				t.Fatal(err)
			}
			if err := <-sent; err != nil {
				t.Fatal(err)
			}
			if err := check(got, 1, 0, 20+i); err != nil {
				t.Fatal(err)
			}
		}
		time.AfterFunc(50*time.Millisecond, cancel)
		if err := a.Recv(ctx, 1, make([]byte, 10)); !errors.Is(err, context.Canceled) {
			t.Fatalf("Recv: %v", err)
		}
		// A fresh ctx on the same direction works and is not interrupted by the old one.
		sent := make(chan error, 1)
		go func() { sent <- b.Send(context.Background(), 0, payload(1, 0, 30, 10)) }()
		ctx2, cancel2 := context.WithCancel(context.Background())
		defer cancel2()
		got := make([]byte, 10)
		if err := a.Recv(ctx2, 1, got); err != nil {
			t.Fatal(err)
		}
		if err := <-sent; err != nil {
			t.Fatal(err)
		}
		if err := check(got, 1, 0, 30); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("deadline unblocks sendrecv", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
		defer cancel()
		err := a.SendRecv(ctx, 1, nil, 1, make([]byte, 10))
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("SendRecv: %v", err)
		}
	})
	t.Run("cancel mid-transfer loses the peer", func(t *testing.T) {
		if err := b.Send(context.Background(), 0, make([]byte, 3000)); err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		time.AfterFunc(200*time.Millisecond, cancel)
		err := a.Recv(ctx, 1, make([]byte, 6000))
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("Recv: %v", err)
		}
		lost := w.ms[0].Messenger().Lost(1)
		if lost == nil || !strings.Contains(lost.Error(), "out of step") {
			t.Fatalf("Lost(1) = %v after a half-done Recv was cancelled", lost)
		}
	})
}

func TestClosed(t *testing.T) {
	w := connectAll(t, 2, 1, ChunkSize)
	errc := make(chan error, 1)
	go func() { errc <- w.ms[0].Comm().Recv(context.Background(), 1, make([]byte, 10)) }()
	time.Sleep(50 * time.Millisecond)
	w.ms[0].Close()
	if err := <-errc; !errors.Is(err, transport.ErrClosed) {
		t.Fatalf("pending Recv after Close: %v", err)
	}
	if err := w.ms[0].Comm().Send(context.Background(), 1, []byte{1}); !errors.Is(err, transport.ErrClosed) {
		t.Fatalf("Send after Close: %v", err)
	}
	if _, ok := <-w.ms[0].Messenger().Inbox(); ok {
		t.Fatal("inbox still open after Close")
	}
	if err := w.ms[0].Close(); err != nil {
		t.Fatal(err)
	}
}
