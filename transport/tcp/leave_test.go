package tcp

import (
	"context"
	"errors"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/kolo-dl/kolo/auth"
	"github.com/kolo-dl/kolo/transport"
)

// A rank that leaves is lost to its peers at once, with transport.ErrPeerLeft, as a closed connection would
// be; the rest of the mesh goes on.
func TestLeftPeerFailsWaitingCalls(t *testing.T) {
	w := connectAll(t, 3, 2, ChunkSize)
	w.linkAll(t) // a lazy mesh's sets up too: the calls below wait on a connected peer
	errc := make(chan error, 2)
	go func() { errc <- w.ms[1].Comm().Recv(context.Background(), 2, make([]byte, 3<<20)) }()
	go func() { errc <- w.ms[0].Comm().Send(context.Background(), 2, make([]byte, 64<<20)) }()
	time.Sleep(100 * time.Millisecond)
	start := time.Now()
	w.ms[2].Leave()
	for range 2 {
		select {
		case err := <-errc:
			var pe *transport.PeerError
			if !errors.As(err, &pe) || pe.Rank != 2 || !errors.Is(err, transport.ErrPeerLeft) {
				t.Fatalf("after %s: %v, want a PeerError for rank 2 that left", time.Since(start), err)
			}
		case <-time.After(2 * time.Second):
			t.Fatal("a call on the left peer still blocked after 2 s")
		}
	}
	for _, r := range []int{0, 1} {
		ms := w.ms[r].Messenger()
		select {
		case msg := <-ms.Inbox():
			if msg.From != 2 || msg.Body != nil {
				t.Fatalf("rank %d inbox: %+v, want the nil-body loss notice from rank 2", r, msg)
			}
		case <-time.After(time.Second):
			t.Fatalf("rank %d: no loss notice in the inbox", r)
		}
		if err := ms.SendMsg(context.Background(), 2, []byte("x")); !errors.Is(err, transport.ErrPeerLeft) {
			t.Fatalf("rank %d: SendMsg to the left rank: %v", r, err)
		}
	}
	sub := &world{ms: w.ms[:2]}
	sub.each(t, func(r int, c transport.Comm) error {
		rb := make([]byte, 1000)
		if err := c.SendRecv(context.Background(), 1-r, payload(r, 1-r, 5, len(rb)), 1-r, rb); err != nil {
			return err
		}
		return check(rb, 1-r, r, 5)
	})
}

// A lazy mesh's first call to a rank that already left, or leaves while the set is being
// dialed, fails at once with transport.ErrPeerLeft (not after the connect timeout, and not as a
// refusal that would blame the rank), and the inbox says the peer is lost; a closed rank's
// refusal also comes at once.
func TestLazyDialToARankThatLeft(t *testing.T) {
	for _, tc := range []struct {
		name   string
		end    func(m *Mesh)
		left   bool
		during bool // end the rank while the dial is under way, not before
	}{
		{"left before", func(m *Mesh) { m.Leave() }, true, false},
		{"left during", func(m *Mesh) { m.Leave() }, true, true},
		{"closed before", func(m *Mesh) { m.Close() }, false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := connectAllWith(t, 3, 2, ChunkSize, func(cfg *Config) {
				cfg.Lazy, cfg.Eager = true, nil
				cfg.ConnectTimeout = 20 * time.Second
			})
			if !tc.during {
				tc.end(w.ms[2])
			}
			errc := make(chan error, 2)
			go func() { errc <- w.ms[0].Comm().Send(context.Background(), 2, make([]byte, 8<<20)) }()
			go func() { errc <- w.ms[1].Messenger().SendMsg(context.Background(), 2, []byte("x")) }()
			if tc.during {
				time.Sleep(time.Millisecond)
				tc.end(w.ms[2])
			}
			start := time.Now()
			for range 2 {
				select {
				case err := <-errc:
					var pe *transport.PeerError
					if tc.during && err == nil {
						continue // the whole set was up before the rank left, and the bytes went out
					}
					if !errors.As(err, &pe) || pe.Rank != 2 || errors.Is(err, transport.ErrPeerLeft) != tc.left {
						t.Fatalf("%v, want a PeerError for rank 2 (left: %v)", err, tc.left)
					}
				case <-time.After(5 * time.Second):
					t.Fatal("a call to the rank that ended still blocked after 5 s")
				}
			}
			if d := time.Since(start); d > 5*time.Second {
				t.Fatalf("the calls failed after %v", d)
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
			if rej := w.sink.warnings("tcp transport: rejected connection"); tc.left && len(rej) > 0 {
				t.Fatalf("dials to a rank that left logged as rejected: %v", rej)
			}
		})
	}
}

// A rank that ends while a set it acked, or dialed and had acked, is still on its way to its mesh
// closes the set, and the peer, which acked or had every ack and took the set, learns at once why:
// with the leave notice on the set's control connection if the rank left (whichever path that
// set takes closes it), as a connection closed by the rank if it closed. A connection the rank had
// not yet acked is declined, as a dial to a rank that left (not logged as rejected) or to a closed
// one. Listener.hold stops one connection of the set, or the whole set, at each path's point while
// the rank ends.
func TestLeaveNoticeOnAnAckedSet(t *testing.T) {
	const streams = 2
	type place struct {
		name string
		at   holdPoint
		lane lane // the set's first connection of that lane is held
		// queued: the control connection reaches the registration only once the mesh is held
		// (on a data connection), so that it waits in the queue when the rank ends.
		queued bool
		// dials: the rank that ends (1) dials the set, not rank 0.
		dials bool
	}
	places := []place{
		{"control connection taken, a data connection not yet (closeLink)", holdAcked, laneData, false, false},
		{"control connection in the queue (unregister)", holdReceived, laneData, true, false},
		{"control connection acked, not yet delivered (deliver)", holdAcked, laneControl, false, false},
		{"control connection off the queue, not yet in the set (arrive)", holdReceived, laneControl, false, false},
		{"control connection claimed, not yet acked (deliver's decide)", holdClaimed, laneControl, false, false},
		{"whole set arrived, mesh closing as install looks (install from arrive)", holdInstall, laneControl, false, false},
		{"set dialed, mesh closing as install looks (install from dialSet)", holdInstall, laneControl, false, true},
		{"set dialed, link closed before dialSet looks (dialSet)", holdDialed, laneControl, false, true},
	}
	ends := []struct {
		name string
		end  func(m *Mesh)
		left bool
	}{
		{"left", func(m *Mesh) { m.Leave() }, true},
		{"closed", func(m *Mesh) { m.Close() }, false},
	}
	for _, e := range ends {
		for _, pl := range places {
			t.Run(e.name+"/"+pl.name, func(t *testing.T) {
				held, release := make(chan struct{}), make(chan struct{})
				var once sync.Once
				w := newListeners(t, 2)
				w.ls[1].hold = func(at holdPoint, id connID) {
					if pl.queued && at == holdAcked && id.lane == laneControl {
						<-held
						return
					}
					if at != pl.at || id.lane != pl.lane {
						return
					}
					first := false
					once.Do(func() { first = true })
					if first {
						close(held)
						<-release
					}
				}
				defer func() { // a failed case must not leave the listener held
					once.Do(func() { close(held) })
					select {
					case <-release:
					default:
						close(release)
					}
				}()
				w.connect(t, streams, ChunkSize, func(cfg *Config) {
					cfg.Lazy, cfg.Eager = true, nil
					cfg.ConnectTimeout = 20 * time.Second
				})
				m0, m1 := w.ms[0], w.ms[1]
				p0, p1 := m0.peers[1], m1.peers[0]
				errc := make(chan error, 1)
				recv := func() { errc <- m0.Comm().Recv(context.Background(), 1, make([]byte, 1<<20)) }
				if pl.dials {
					go m1.Comm().Send(context.Background(), 0, nil) // dials; fails as rank 1 ends
				} else {
					go recv() // dials
				}

				// Rank 0 has every ack (but the held one's, before it is acked) and took the set,
				// or took the set rank 1 dialed; rank 1 holds one connection of it and has the
				// others as far as they go (its set, or the queue while its mesh is held), or holds
				// the whole set.
				if pl.at != holdClaimed {
					waitUntil(t, "rank 0 took the set", func() bool { return p0.up.Load() })
				}
				if pl.dials {
					go recv() // only now: before rank 0 took rank 1's set, its call would dial too
				}
				<-held
				waitUntil(t, "rank 1 has the rest of the set", func() bool {
					if pl.at == holdInstall || pl.at == holdDialed {
						return true
					}
					p1.linkMu.Lock()
					n := len(p1.partial)
					p1.linkMu.Unlock()
					queue := len(m1.reg.ch)
					if pl.at != holdReceived {
						return queue == 0 && n == streams
					}
					return queue+n == streams
				})

				ended := make(chan struct{})
				go func() {
					e.end(m1)
					close(ended)
				}()
				// A held mesh cannot finish ending: release once it has closed the peer's link,
				// which comes after its registration ended, or, while install holds the link,
				// once it began ending.
				waitUntil(t, "rank 1 closed its link to rank 0", func() bool {
					if pl.at == holdInstall {
						return m1.closed.Load()
					}
					p1.linkMu.Lock()
					defer p1.linkMu.Unlock()
					return p1.link == linkClosed
				})
				close(release)
				waitPeerEnded(t, m0, errc, 1, e.left)
				select {
				case <-ended:
				case <-time.After(2 * time.Second):
					t.Fatal("rank 1's end did not return")
				}
				if !e.left {
					return
				}
				w.ls[1].Close() // waits for its goroutines, and what they log
				notBlamed(t, w, "tcp transport: rejected connection", "tcp transport: peer lost")
			})
		}
	}
}

// waitPeerEnded checks what mesh m reports once its peer ended (left: it left, else it
// closed): the call blocked on it (errc) fails within 2 s with a PeerError for it, ErrPeerLeft
// exactly when it left; the loss notice reaches the inbox; Lost agrees.
func waitPeerEnded(t *testing.T, m *Mesh, errc <-chan error, peer int, left bool) {
	t.Helper()
	start := time.Now()
	select {
	case err := <-errc:
		var pe *transport.PeerError
		if !errors.As(err, &pe) || pe.Rank != peer || errors.Is(err, transport.ErrPeerLeft) != left {
			t.Fatalf("after %v: %v, want a PeerError for rank %d (left: %v)", time.Since(start), err, peer, left)
		}
	case <-time.After(2 * time.Second):
		t.Fatalf("a call on rank %d still blocked 2 s after it ended", peer)
	}
	select {
	case msg := <-m.Messenger().Inbox():
		if msg.From != peer || msg.Body != nil {
			t.Fatalf("inbox: %+v, want the nil-body loss notice from rank %d", msg, peer)
		}
	case <-time.After(time.Second):
		t.Fatalf("no loss notice from rank %d in the inbox", peer)
	}
	if err := m.Messenger().Lost(peer); errors.Is(err, transport.ErrPeerLeft) != left {
		t.Fatalf("Lost(%d) = %v (left: %v)", peer, err, left)
	}
}

// notBlamed fails the test if w logged any of these warnings (once its listeners closed): a rank
// that left is not an intruder, not lost, not unreachable.
func notBlamed(t *testing.T, w *world, warnings ...string) {
	t.Helper()
	for _, msg := range warnings {
		if got := w.sink.warnings(msg); len(got) > 0 {
			t.Fatalf("the rank that left logged as %q: %v", msg, got)
		}
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

// A rank that ends while the set it dials is only partly taken by the peer (the rest will never
// come) is known to the peer at once: as a rank that left if it left (the leave notice on the
// set's control connection, whether the rank had read that connection's ack or not), as a
// connection closed by the rank if it closed. The peer's call then fails within 2 s, not at the
// connect timeout, and a rank that left is not logged as lost or rejected. Listener.hold keeps
// one data connection from the peer's mesh (it never arrives), and in one place the control
// connection until the rank has ended.
func TestLeaveNoticeOnAPartialSet(t *testing.T) {
	const streams = 2
	ctrl := connID{peer: 1, lane: laneControl}
	for _, e := range []struct {
		name string
		end  func(m *Mesh)
		left bool
	}{
		{"left", func(m *Mesh) { m.Leave() }, true},
		{"closed", func(m *Mesh) { m.Close() }, false},
	} {
		for _, pl := range []struct {
			name string
			late bool // the peer acks the control connection only once the rank has ended
		}{
			{"control connection acked and its ack read", false},
			{"control connection acked after the rank ended", true},
		} {
			t.Run(e.name+"/"+pl.name, func(t *testing.T) {
				releaseData, releaseCtrl := make(chan struct{}), make(chan struct{})
				ctrlHeld, ctrlDialed := make(chan struct{}), make(chan struct{})
				var heldOnce, dialedOnce sync.Once
				w := newListeners(t, 2)
				// Rank 1 takes the set rank 0 dials, but for data stream 1 (and, late, the
				// control connection until released).
				w.ls[1].hold = func(at holdPoint, id connID) {
					switch {
					case at == holdClaimed && id.lane == laneData && id.stream == 1:
						<-releaseData
					case at == holdClaimed && id.lane == laneControl && pl.late:
						heldOnce.Do(func() { close(ctrlHeld) })
						<-releaseCtrl
					}
				}
				w.ls[0].hold = func(at holdPoint, id connID) {
					if at == holdReturned && id == ctrl {
						dialedOnce.Do(func() { close(ctrlDialed) })
					}
				}
				release := func(ch chan struct{}) {
					select {
					case <-ch:
					default:
						close(ch)
					}
				}
				defer release(releaseData) // a failed case must not leave the listener held
				defer release(releaseCtrl)
				w.connect(t, streams, ChunkSize, func(cfg *Config) {
					cfg.Lazy, cfg.Eager = true, nil
					cfg.ConnectTimeout = 20 * time.Second
				})
				m0, m1 := w.ms[0], w.ms[1]
				p1 := m1.peers[0]
				go m0.Comm().Send(context.Background(), 1, nil) // dials; fails as rank 0 ends
				waitUntil(t, "rank 1 took part of the set", func() bool {
					p1.linkMu.Lock()
					defer p1.linkMu.Unlock()
					_, hasCtrl := p1.partial[connID{peer: 0, lane: laneControl}]
					return len(p1.partial) == 2 && hasCtrl || len(p1.partial) == 1 && pl.late
				})
				if pl.late {
					<-ctrlHeld
				} else {
					<-ctrlDialed
				}
				errc := make(chan error, 1)
				go func() { errc <- m1.Comm().Recv(context.Background(), 0, make([]byte, 1<<20)) }()

				e.end(m0)
				release(releaseCtrl)
				waitPeerEnded(t, m1, errc, 0, e.left)
				if !e.left {
					return
				}
				release(releaseData) // the held connection, late: declined as one from a rank that left
				w.ls[1].Close()      // waits for its goroutines, and what they log
				notBlamed(t, w, "tcp transport: rejected connection", "tcp transport: peer lost",
					"tcp transport: could not connect to peer")
			})
		}
	}
}

// A dialer that ends while its control connection is still on its way (here held in the peer's
// listener; in life, still in its handshake) leaves the peer a set of data connections only,
// which carry no leave notice: the peer sees them close and asks the dialer's listener why
// (watchPartialData, probeMesh). A rank that left is not blamed; one that closed, or whose
// listener is gone too (a dead process), is a connection error; in every case the peer's calls
// fail at once, not at its connect timeout (20 s here).
func TestEndedBeforeItsControlConnectionArrived(t *testing.T) {
	const streams = 2
	for _, e := range []struct {
		name string
		end  func(w *world)
		left bool
	}{
		{"left", func(w *world) { w.ms[0].Leave() }, true},
		{"closed", func(w *world) { w.ms[0].Close() }, false},
		{"closed with its listener", func(w *world) { w.ms[0].Close(); w.ls[0].Close() }, false},
	} {
		t.Run(e.name, func(t *testing.T) {
			release := make(chan struct{})
			var once sync.Once
			open := func() { once.Do(func() { close(release) }) }
			defer open() // a failed case must not leave the listener held
			w := newListeners(t, 2)
			// Rank 1 takes data stream 0 of the set rank 0 dials, and holds the rest.
			w.ls[1].hold = func(at holdPoint, id connID) {
				if at == holdClaimed && (id.lane == laneControl || id.stream == 1) {
					<-release
				}
			}
			w.connect(t, streams, ChunkSize, func(cfg *Config) {
				cfg.Lazy, cfg.Eager = true, nil
				cfg.ConnectTimeout = 20 * time.Second
			})
			m1 := w.ms[1]
			p1 := m1.peers[0]
			go w.ms[0].Comm().Send(context.Background(), 1, nil) // dials; fails as rank 0 ends
			waitUntil(t, "rank 1 took data stream 0 alone", func() bool {
				p1.linkMu.Lock()
				defer p1.linkMu.Unlock()
				_, ok := p1.partial[connID{peer: 0, lane: laneData, stream: 0}]
				return ok && len(p1.partial) == 1
			})
			errc := make(chan error, 1)
			go func() { errc <- m1.Comm().Recv(context.Background(), 0, make([]byte, 1<<20)) }()

			e.end(w)
			waitPeerEnded(t, m1, errc, 0, e.left)
			if e.left {
				open() // the held connections, late: declined as ones from a rank that left
				w.ls[1].Close()
				notBlamed(t, w, "tcp transport: rejected connection", "tcp transport: peer lost",
					"tcp transport: could not connect to peer")
			}
		})
	}
}

// A probe gets the listener's word on the mesh it names, and is never taken for an intruder.
func TestProbeMesh(t *testing.T) {
	w := connectAll(t, 3, 1, ChunkSize)
	ask := func(from, about int) error {
		cfg := w.cfg(from, 1, ChunkSize)
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		return probeMesh(ctx, &cfg, about)
	}
	if err := ask(0, 1); err != nil {
		t.Fatalf("probe of an open mesh: %v", err)
	}
	w.ms[1].Leave()
	if err := ask(0, 1); !errors.Is(err, transport.ErrPeerLeft) {
		t.Fatalf("probe of a left mesh: %v, want ErrPeerLeft", err)
	}
	w.ms[2].Close()
	if err := ask(0, 2); err == nil || errors.Is(err, transport.ErrPeerLeft) || !errors.Is(err, errRejected) {
		t.Fatalf("probe of a closed mesh: %v, want a refusal", err)
	}
	other := w.cfg(0, 1, ChunkSize)
	other.JobID = "another-job"
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := probeMesh(ctx, &other, 1); err == nil || !errors.Is(err, errRejected) {
		t.Fatalf("probe for a job the listener never had: %v, want a refusal", err)
	}
	w.ls[2].Close()
	if err := ask(0, 2); err == nil {
		t.Fatal("probe of a closed listener succeeded")
	}
	if got := w.sink.warnings("tcp transport: rejected connection"); len(got) > 0 {
		t.Fatalf("probes logged as rejected connections: %v", got)
	}
	bad := w.cfg(0, 1, ChunkSize)
	bad.Secret = []byte("not the job's secret")
	if err := probeMesh(ctx, &bad, 1); !errors.Is(err, auth.ErrDenied) {
		t.Fatalf("probe with the wrong secret: %v, want a denial", err)
	}
	// A port that takes the connection and says nothing (a hung process): the probe gives up at
	// its deadline, with an error.
	silent, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer silent.Close()
	mute := w.cfg(0, 1, ChunkSize)
	mute.Addrs = append([]string(nil), mute.Addrs...)
	mute.Addrs[1] = silent.Addr().String()
	short, cancelShort := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancelShort()
	start := time.Now()
	if err := probeMesh(short, &mute, 1); err == nil || time.Since(start) > 2*time.Second {
		t.Fatalf("probe of a silent port: %v after %v, want an error at the 300 ms deadline", err, time.Since(start))
	}
}
