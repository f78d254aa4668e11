package tcp

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/kolo-dl/kolo/internal/transport"
)

var testSecret = []byte("mesh-secret")

// logSink records what the package logs so tests can check rejections were reported.
type logSink struct {
	mu   sync.Mutex
	recs []slog.Record
}

func (s *logSink) Enabled(context.Context, slog.Level) bool { return true }
func (s *logSink) Handle(_ context.Context, r slog.Record) error {
	s.mu.Lock()
	s.recs = append(s.recs, r.Clone())
	s.mu.Unlock()
	return nil
}
func (s *logSink) WithAttrs([]slog.Attr) slog.Handler { return s }
func (s *logSink) WithGroup(string) slog.Handler      { return s }

// warnings returns the "remote" attribute of every warning with message msg.
func (s *logSink) warnings(msg string) []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []string
	for _, r := range s.recs {
		if r.Level == slog.LevelWarn && r.Message == msg {
			remote := ""
			r.Attrs(func(a slog.Attr) bool {
				if a.Key == "remote" {
					remote = a.Value.String()
				}
				return true
			})
			out = append(out, remote)
		}
	}
	return out
}

type world struct {
	ls     []*Listener
	ms     []*Mesh
	sink   *logSink
	addrs  []string
	hosts  []string
	config func(r int) Config
}

func newListeners(t testing.TB, n int) *world {
	t.Helper()
	return newListenersWith(t, n, 500*time.Millisecond)
}

// newListenersWith is newListeners whose listeners wait handshakeTimeout for a handshake and hello.
func newListenersWith(t testing.TB, n int, handshakeTimeout time.Duration) *world {
	t.Helper()
	w := &world{sink: &logSink{}}
	for r := range n {
		l, err := listen("127.0.0.1:0", testSecret, slog.New(w.sink), handshakeTimeout)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { l.Close() })
		w.ls = append(w.ls, l)
		w.addrs = append(w.addrs, l.Addr().String())
		w.hosts = append(w.hosts, fmt.Sprintf("node%d", r))
	}
	return w
}

// lazyMode runs the package's tests with lazy meshes (KOLO_TCP_TEST_LAZY=1, as make test does
// in a second pass): every connection is then made by the calls that need it, so every test of
// data, messages and failures exercises that path too. Tests of Connect's own waiting skip.
var lazyMode = os.Getenv("KOLO_TCP_TEST_LAZY") == "1"

func skipIfLazy(t *testing.T, why string) {
	t.Helper()
	if lazyMode {
		t.Skip("lazy mode: " + why)
	}
}

func (w *world) cfg(r, streams, chunk int) Config {
	var peers []int
	for p := range w.ls {
		if p != r {
			peers = append(peers, p)
		}
	}
	return Config{Rank: r, Size: len(w.ls), Peers: peers, Addrs: w.addrs, Hosts: w.hosts, Secret: testSecret,
		JobID: "job-1", Streams: streams, ConnectTimeout: 10 * time.Second, chunk: chunk, log: slog.New(w.sink),
		Lazy: lazyMode}
}

// connectAll forms the full mesh among n ranks, connecting them concurrently.
func connectAll(t testing.TB, n, streams, chunk int) *world {
	t.Helper()
	return connectAllWith(t, n, streams, chunk, nil)
}

// connectAllWith is connectAll with each rank's Config changed by edit first.
func connectAllWith(t testing.TB, n, streams, chunk int, edit func(cfg *Config)) *world {
	t.Helper()
	w := newListeners(t, n)
	w.connect(t, streams, chunk, edit)
	return w
}

// connect forms the full mesh among w's listeners, as connectAllWith does.
func (w *world) connect(t testing.TB, streams, chunk int, edit func(cfg *Config)) {
	t.Helper()
	n := len(w.ls)
	w.ms = make([]*Mesh, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for r := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			cfg := w.cfg(r, streams, chunk)
			if edit != nil {
				edit(&cfg)
			}
			w.ms[r], errs[r] = Connect(context.Background(), w.ls[r], cfg)
		}()
	}
	wg.Wait()
	for r, err := range errs {
		if err != nil {
			t.Fatalf("rank %d: %v", r, err)
		}
	}
	t.Cleanup(func() {
		for _, m := range w.ms {
			m.Close()
		}
	})
}

// linkAll connects every pair of a lazy mesh (an empty Send connects and moves nothing), for
// tests that look at the connections themselves.
func (w *world) linkAll(t *testing.T) {
	t.Helper()
	w.each(t, func(r int, c transport.Comm) error {
		for p := range w.ms {
			if p != r {
				if err := c.Send(context.Background(), p, nil); err != nil {
					return err
				}
			}
		}
		return nil
	})
}

// each runs f for every rank concurrently and fails the test with every rank's error.
func (w *world) each(t *testing.T, f func(r int, c transport.Comm) error) {
	t.Helper()
	errs := make([]error, len(w.ms))
	var wg sync.WaitGroup
	for r, m := range w.ms {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[r] = f(r, m.Comm())
		}()
	}
	wg.Wait()
	for r, err := range errs {
		if err != nil {
			t.Errorf("rank %d: %v", r, err)
		}
	}
	if t.Failed() {
		t.FailNow()
	}
}

// pool is random bytes that payloads are cut from: generating several MiB per call per rank is too
// slow under the race detector.
var pool = func() []byte {
	b := make([]byte, 12<<20)
	rng := rand.New(rand.NewPCG(1, 2))
	for i := 0; i < len(b); i += 8 {
		binary.LittleEndian.PutUint64(b[i:], rng.Uint64())
	}
	return b
}()

// payload is the reference: the bytes `from` sends `to` in round `round`, computable by both ends,
// and different for every (from, to, round, n).
func payload(from, to, round, n int) []byte {
	if n > len(pool)/2 {
		panic("payload larger than the pool")
	}
	h := rand.New(rand.NewPCG(uint64(from)<<32|uint64(to), uint64(round)<<32|uint64(n))).Uint64()
	off := int(h % uint64(len(pool)-n))
	return append([]byte(nil), pool[off:off+n]...)
}

func check(got []byte, from, to, round int) error {
	want := payload(from, to, round, len(got))
	if !bytes.Equal(got, want) {
		i := 0
		for i < len(got) && got[i] == want[i] {
			i++
		}
		return fmt.Errorf("round %d: %d bytes from rank %d differ from byte %d on", round, len(got), from, i)
	}
	return nil
}

var sizes = []int{0, 1, 7, 4099, 65536 + 13, 5<<20 + 3}

func TestPatterns(t *testing.T) {
	type tc struct {
		ranks, streams, chunk int
	}
	var cases []tc
	for _, n := range []int{2, 3, 4} {
		cases = append(cases, tc{n, 1, ChunkSize}, tc{n, 2, ChunkSize}, tc{n, 3, 1000})
	}
	if testing.Short() {
		cases = []tc{{3, 3, 1000}, {2, 2, ChunkSize}}
	}
	for _, c := range cases {
		t.Run(fmt.Sprintf("ranks=%d/streams=%d/chunk=%d", c.ranks, c.streams, c.chunk), func(t *testing.T) {
			w := connectAll(t, c.ranks, c.streams, c.chunk)
			n := c.ranks
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			round := 0
			t.Run("ring", func(t *testing.T) {
				for _, size := range sizes {
					round++
					w.each(t, func(r int, cm transport.Comm) error {
						to, from := (r+1)%n, (r+n-1)%n
						rb := make([]byte, size)
						if err := cm.SendRecv(ctx, to, payload(r, to, round, size), from, rb); err != nil {
							return err
						}
						return check(rb, from, r, round)
					})
				}
			})
			t.Run("all-to-all", func(t *testing.T) {
				for _, size := range sizes {
					round++
					w.each(t, func(r int, cm transport.Comm) error {
						for k := 1; k < n; k++ {
							to, from := (r+k)%n, (r+n-k)%n
							rb := make([]byte, size)
							if err := cm.SendRecv(ctx, to, payload(r, to, round, size), from, rb); err != nil {
								return err
							}
							if err := check(rb, from, r, round); err != nil {
								return err
							}
						}
						return nil
					})
				}
			})
			t.Run("exchange with one peer", func(t *testing.T) {
				round++
				w.each(t, func(r int, cm transport.Comm) error {
					if r > 1 {
						return nil
					}
					rb := make([]byte, 300001)
					if err := cm.SendRecv(ctx, 1-r, payload(r, 1-r, round, len(rb)), 1-r, rb); err != nil {
						return err
					}
					return check(rb, 1-r, r, round)
				})
			})
			// Stream semantics: the sender's and receiver's message boundaries differ, so every
			// chunk boundary falls inside some Send and some Recv.
			t.Run("root to all, mismatched splits", func(t *testing.T) {
				round++
				const total = 3<<20 + 11
				w.each(t, func(r int, cm transport.Comm) error {
					if r == 0 {
						// Send may buffer only MinBuffered, so it runs beside the receivers.
						for to := 1; to < n; to++ {
							b := payload(0, to, round, total)
							rng := rand.New(rand.NewPCG(uint64(to), 1))
							for off := 0; off < total; {
								k := min(total-off, 1+rng.IntN(400000))
								if err := cm.Send(ctx, to, b[off:off+k]); err != nil {
									return err
								}
								off += k
							}
						}
						return nil
					}
					got := make([]byte, total)
					rng := rand.New(rand.NewPCG(uint64(r), 2))
					for off := 0; off < total; {
						k := min(total-off, rng.IntN(700000)) // 0-byte Recvs included
						if err := cm.Recv(ctx, 0, got[off:off+k]); err != nil {
							return err
						}
						off += k
					}
					return check(got, 0, r, round)
				})
			})
			t.Run("small sends buffered", func(t *testing.T) {
				// transport.MinBuffered: a Send of that much completes with the peer not receiving.
				round++
				w.each(t, func(r int, cm transport.Comm) error {
					for p := range n {
						if p != r {
							if err := cm.Send(ctx, p, payload(r, p, round, transport.MinBuffered)); err != nil {
								return err
							}
						}
					}
					for p := range n {
						if p != r {
							got := make([]byte, transport.MinBuffered)
							if err := cm.Recv(ctx, p, got); err != nil {
								return err
							}
							if err := check(got, p, r, round); err != nil {
								return err
							}
						}
					}
					return nil
				})
			})
		})
	}
}

func TestStagedConnect(t *testing.T) {
	// One rank starts long after the other: its peer's dials are refused and retried (rank 1 late),
	// or they arrive before its Connect registers and are parked (rank 0 late).
	for _, late := range []int{0, 1} {
		t.Run(fmt.Sprintf("rank %d late", late), func(t *testing.T) {
			w := newListeners(t, 2)
			if late == 1 {
				w.ls[1].Close()
			}
			ms := make([]*Mesh, 2)
			errs := make([]error, 2)
			var wg sync.WaitGroup
			wg.Add(1)
			go func() {
				defer wg.Done()
				ms[1-late], errs[1-late] = Connect(context.Background(), w.ls[1-late], w.cfg(1-late, 2, ChunkSize))
			}()
			time.Sleep(300 * time.Millisecond)
			if late == 1 {
				l, err := listen(w.addrs[1], testSecret, slog.New(w.sink), time.Second)
				if err != nil {
					t.Skipf("port %s taken meanwhile: %v", w.addrs[1], err)
				}
				t.Cleanup(func() { l.Close() })
				w.ls[1] = l
			}
			ms[late], errs[late] = Connect(context.Background(), w.ls[late], w.cfg(late, 2, ChunkSize))
			wg.Wait()
			for r, err := range errs {
				if err != nil {
					t.Fatalf("rank %d: %v", r, err)
				}
			}
			defer ms[0].Close()
			defer ms[1].Close()
			w.ms = ms
			w.each(t, func(r int, cm transport.Comm) error {
				rb := make([]byte, 1<<20)
				if err := cm.SendRecv(context.Background(), 1-r, payload(r, 1-r, 0, len(rb)), 1-r, rb); err != nil {
					return err
				}
				return check(rb, 1-r, r, 0)
			})
		})
	}
}

func TestPartialMesh(t *testing.T) {
	// Ranks 0 and 2 only talk to 1 (as when same-host peers go over shared memory instead).
	w := newListeners(t, 3)
	peers := [][]int{{1}, {0, 2}, {1}}
	w.ms = make([]*Mesh, 3)
	var wg sync.WaitGroup
	errs := make([]error, 3)
	for r := range 3 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			cfg := w.cfg(r, 2, ChunkSize)
			cfg.Peers = peers[r]
			w.ms[r], errs[r] = Connect(context.Background(), w.ls[r], cfg)
		}()
	}
	wg.Wait()
	for r, err := range errs {
		if err != nil {
			t.Fatalf("rank %d: %v", r, err)
		}
		defer w.ms[r].Close()
	}
	ctx := context.Background()
	if err := w.ms[0].Comm().Send(ctx, 2, []byte{1}); err == nil {
		t.Fatal("Send to a rank outside the mesh succeeded")
	}
	if err := w.ms[0].Messenger().SendMsg(ctx, 0, []byte{1}); err == nil {
		t.Fatal("SendMsg to self succeeded")
	}
	w.each(t, func(r int, cm transport.Comm) error {
		if r == 1 {
			b := make([]byte, 2)
			if err := cm.Recv(ctx, 0, b[:1]); err != nil {
				return err
			}
			if err := cm.Recv(ctx, 2, b[1:]); err != nil {
				return err
			}
			if b[0] != 10 || b[1] != 12 {
				return fmt.Errorf("got %v", b)
			}
			return nil
		}
		return cm.Send(ctx, 1, []byte{byte(10 + r)})
	})
}

func TestMessenger(t *testing.T) {
	const n, senders, per = 3, 4, 300
	w := connectAll(t, n, 2, ChunkSize)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	errs := make(chan error, n*(senders+1))
	for r, m := range w.ms {
		ms := m.Messenger()
		// Several goroutines send to every peer at once; each message carries (goroutine, seq).
		for g := range senders {
			wg.Add(1)
			go func() {
				defer wg.Done()
				rng := rand.New(rand.NewPCG(uint64(r), uint64(g)))
				for seq := range per {
					for p := range n {
						if p == r {
							continue
						}
						body := make([]byte, 8+rng.IntN(3000))
						binary.BigEndian.PutUint32(body, uint32(g))
						binary.BigEndian.PutUint32(body[4:], uint32(seq))
						if seq%50 == 0 {
							body = body[:8]
						}
						if err := ms.SendMsg(ctx, p, body); err != nil {
							errs <- err
							return
						}
					}
				}
			}()
		}
		// An empty message arrives as an empty, non-nil body (nil means "peer lost").
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := ms.SendMsg(ctx, (r+1)%n, nil); err != nil {
				errs <- err
			}
		}()
		wg.Add(1)
		go func() {
			defer wg.Done()
			next := map[[2]int]int{}
			empty := 0
			for got := 0; got < (n-1)*senders*per+1; got++ {
				var msg transport.Msg
				select {
				case msg = <-ms.Inbox():
				case <-ctx.Done():
					errs <- fmt.Errorf("rank %d: inbox: %d messages arrived, then %w", r, got, ctx.Err())
					return
				}
				switch {
				case msg.Body == nil:
					errs <- fmt.Errorf("rank %d: nil body from healthy rank %d", r, msg.From)
					return
				case len(msg.Body) == 0:
					if msg.From != (r+n-1)%n {
						errs <- fmt.Errorf("rank %d: empty message from rank %d", r, msg.From)
					}
					empty++
					continue
				}
				g, seq := int(binary.BigEndian.Uint32(msg.Body)), int(binary.BigEndian.Uint32(msg.Body[4:]))
				k := [2]int{msg.From, g}
				if seq != next[k] {
					errs <- fmt.Errorf("rank %d: from rank %d goroutine %d got seq %d, want %d", r, msg.From, g, seq, next[k])
					return
				}
				next[k]++
			}
			if empty != 1 {
				errs <- fmt.Errorf("rank %d: %d empty messages, want 1", r, empty)
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	for _, m := range w.ms {
		for p := range n {
			if p != m.rank {
				if err := m.Messenger().Lost(p); err != nil {
					t.Errorf("rank %d: Lost(%d) = %v on a healthy mesh", m.rank, p, err)
				}
			}
		}
	}
}
