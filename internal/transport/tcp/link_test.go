package tcp

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kolo-dl/kolo/internal/transport"
)

// lazyWorld connects n ranks lazily, each with the eager peers eager(r) gives.
func lazyWorld(t *testing.T, n int, eager func(r int) []int) *world {
	t.Helper()
	return connectAllWith(t, n, 2, 64<<10, func(cfg *Config) {
		cfg.Lazy = true
		if eager != nil {
			cfg.Eager = eager(cfg.Rank)
		}
	})
}

func connected(w *world) []int {
	var out []int
	for _, m := range w.ms {
		out = append(out, m.ConnectedPeers())
	}
	return out
}

// A lazy mesh opens at Connect only the eager peers' sets, and the others when a call first
// needs them: a ring exchange adds nothing, an exchange at distance 2 adds two peers per rank,
// and messages to rank 0 connect it to everyone.
func TestLazyConnectsOnlyWhatIsUsed(t *testing.T) {
	const n = 6
	w := lazyWorld(t, n, func(r int) []int { return []int{(r + 1) % n, (r + n - 1) % n} })
	if got := connected(w); fmt.Sprint(got) != "[2 2 2 2 2 2]" {
		t.Fatalf("after Connect: connected peers per rank %v, want 2 each (the ring neighbours)", got)
	}
	for _, dist := range []int{1, 2} {
		w.each(t, func(r int, c transport.Comm) error {
			to, from := (r+dist)%n, (r-dist+n)%n
			rb := make([]byte, 300<<10)
			if err := c.SendRecv(context.Background(), to, payload(r, to, dist, len(rb)), from, rb); err != nil {
				return err
			}
			return check(rb, from, r, dist)
		})
	}
	if got := connected(w); fmt.Sprint(got) != "[4 4 4 4 4 4]" {
		t.Fatalf("after exchanges at distance 1 and 2: connected peers per rank %v, want 4 each", got)
	}
	for r := 1; r < n; r++ {
		if err := w.ms[r].Messenger().SendMsg(context.Background(), 0, []byte{byte(r)}); err != nil {
			t.Fatal(err)
		}
	}
	for range n - 1 {
		select {
		case msg := <-w.ms[0].Messenger().Inbox():
			if len(msg.Body) != 1 || int(msg.Body[0]) != msg.From {
				t.Fatalf("rank 0 got %v from rank %d", msg.Body, msg.From)
			}
		case <-time.After(5 * time.Second):
			t.Fatal("rank 0: messages did not arrive")
		}
	}
	if got := w.ms[0].ConnectedPeers(); got != n-1 {
		t.Fatalf("rank 0: %d connected peers after every rank sent it a message, want %d", got, n-1)
	}
	if rej := w.sink.warnings("tcp transport: rejected connection"); len(rej) > 0 {
		t.Fatalf("connections rejected while the mesh connected itself: %v", rej)
	}
}

// Both ends needing a set at once dial each other; the lower rank's set is the one both keep,
// whichever dial gets where first, and the data is intact. Many times, since the order varies.
func TestLazyCrossedDials(t *testing.T) {
	for round := range 25 {
		w := lazyWorld(t, 2, nil)
		w.each(t, func(r int, c transport.Comm) error {
			rb := make([]byte, 200<<10+round)
			if err := c.SendRecv(context.Background(), 1-r, payload(r, 1-r, round, len(rb)), 1-r, rb); err != nil {
				return err
			}
			return check(rb, 1-r, r, round)
		})
		a, b := w.ms[0].peers[1], w.ms[1].peers[0]
		if a.ctrl.LocalAddr().String() != b.ctrl.RemoteAddr().String() {
			t.Fatalf("round %d: the ranks kept different control connections: %v-%v and %v-%v",
				round, a.ctrl.LocalAddr(), a.ctrl.RemoteAddr(), b.ctrl.LocalAddr(), b.ctrl.RemoteAddr())
		}
		for s := range a.out.conns {
			if a.out.conns[s].LocalAddr().String() != b.out.conns[s].RemoteAddr().String() {
				t.Fatalf("round %d: data stream %d differs at the two ends", round, s)
			}
		}
		// A crossing is the normal case of a lazy mesh, not an intrusion to warn about.
		if rej := w.sink.warnings("tcp transport: rejected connection"); len(rej) > 0 {
			t.Fatalf("round %d: connections rejected: %v", round, rej)
		}
		for _, m := range w.ms {
			m.Close()
		}
	}
}

// A peer that cannot be reached fails the call that first needs it, naming the peer, and every
// later call at once; Lost says why, and the rest of the mesh is unaffected.
func TestLazyFirstUseFailure(t *testing.T) {
	w := newListeners(t, 3)
	w.ls[2].Close()
	w.ms = make([]*Mesh, 2)
	for r := range 2 {
		cfg := w.cfg(r, 2, ChunkSize)
		cfg.Lazy, cfg.ConnectTimeout = true, 400*time.Millisecond
		m, err := Connect(context.Background(), w.ls[r], cfg)
		if err != nil {
			t.Fatal(err)
		}
		defer m.Close()
		w.ms[r] = m
	}
	start := time.Now()
	err := w.ms[0].Comm().Send(context.Background(), 2, []byte("x"))
	var pe *transport.PeerError
	if !errors.As(err, &pe) || pe.Rank != 2 || pe.Host != "node2" || !strings.Contains(err.Error(), "refused") {
		t.Fatalf("first use of an unreachable peer: %v", err)
	}
	if took := time.Since(start); took > 3*time.Second {
		t.Fatalf("first use failed after %s, past the connect timeout", took)
	}
	start = time.Now()
	for _, err := range []error{
		w.ms[0].Comm().Recv(context.Background(), 2, make([]byte, 1)),
		w.ms[0].Messenger().SendMsg(context.Background(), 2, []byte("x")),
		w.ms[0].Messenger().Lost(2),
	} {
		if !errors.As(err, &pe) || pe.Rank != 2 {
			t.Errorf("after the failure: %v, want rank 2 named", err)
		}
	}
	if took := time.Since(start); took > 100*time.Millisecond {
		t.Errorf("later calls took %s: they should fail at once", took)
	}
	// Ranks 0 and 1 still talk.
	errc := make(chan error, 1)
	go func() { errc <- w.ms[1].Comm().Send(context.Background(), 0, []byte("ok")) }()
	got := make([]byte, 2)
	if err := w.ms[0].Comm().Recv(context.Background(), 1, got); err != nil || string(got) != "ok" {
		t.Fatalf("ranks 0 and 1 after rank 2 failed: %q %v", got, err)
	}
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
}

// A peer that begins its set and never finishes it (it died between two dials) fails the call
// waiting on it after the connect timeout, saying how far it got.
func TestLazyUnfinishedSetExpires(t *testing.T) {
	w := newListeners(t, 2)
	cfg := w.cfg(0, 2, ChunkSize)
	cfg.Lazy, cfg.ConnectTimeout = true, 400*time.Millisecond
	m, err := Connect(context.Background(), w.ls[0], cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	// Rank 1's control connection, and nothing more.
	c, err := dialOnce(context.Background(), w.addrs[0], testSecret,
		hello{lane: laneControl, streams: 2, from: 1, to: 0, size: 2, job: "job-1"})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	start := time.Now()
	err = m.Comm().Recv(context.Background(), 1, make([]byte, 10))
	var pe *transport.PeerError
	if !errors.As(err, &pe) || pe.Rank != 1 || !strings.Contains(err.Error(), "dialed 1 of the 3 connections") {
		t.Fatalf("waiting on an unfinished set: %v", err)
	}
	if took := time.Since(start); took > 2*time.Second {
		t.Fatalf("failed after %s; the connect timeout is 400ms", took)
	}
}

// Close ends a call waiting for a lazy dial that cannot finish (the peer's listener takes the
// connection but no mesh there claims it), and returns promptly itself.
func TestLazyCloseWhileDialing(t *testing.T) {
	w := newListeners(t, 2)
	cfg := w.cfg(0, 2, ChunkSize)
	cfg.Lazy = true
	m, err := Connect(context.Background(), w.ls[0], cfg)
	if err != nil {
		t.Fatal(err)
	}
	errc := make(chan error, 1)
	go func() { errc <- m.Comm().Send(context.Background(), 1, []byte("x")) }()
	time.Sleep(200 * time.Millisecond)
	start := time.Now()
	m.Close()
	select {
	case err := <-errc:
		if !errors.Is(err, transport.ErrClosed) {
			t.Fatalf("Send cut short by Close: %v, want transport.ErrClosed", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Send still blocked 5 s after Close")
	}
	if took := time.Since(start); took > 2*time.Second {
		t.Fatalf("Close took %s", took)
	}
}

func TestLazyManyFirstUsesAtOnce(t *testing.T) {
	const n = 8
	w := lazyWorld(t, n, nil)
	var wg sync.WaitGroup
	errs := make(chan error, n*n)
	for r := range n {
		for p := range n {
			if p == r {
				continue
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				if err := w.ms[r].Messenger().SendMsg(context.Background(), p, []byte{byte(r)}); err != nil {
					errs <- fmt.Errorf("rank %d to %d: %w", r, p, err)
				}
			}()
		}
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	for r, m := range w.ms {
		for range n - 1 {
			select {
			case msg := <-m.Messenger().Inbox():
				if msg.Body == nil || int(msg.Body[0]) != msg.From {
					t.Fatalf("rank %d: bad message %v from %d (%v)", r, msg.Body, msg.From, m.Messenger().Lost(msg.From))
				}
			case <-time.After(5 * time.Second):
				t.Fatalf("rank %d: messages missing", r)
			}
		}
	}
	if rej := w.sink.warnings("tcp transport: rejected connection"); len(rej) > 0 {
		t.Fatalf("connections rejected: %v", rej)
	}
	for r, m := range w.ms {
		if got := m.ConnectedPeers(); got != n-1 {
			t.Errorf("rank %d: %d connected peers, want %d", r, got, n-1)
		}
	}
}
