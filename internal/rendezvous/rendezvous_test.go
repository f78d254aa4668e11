package rendezvous

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/kolo-dl/kolo/internal/auth"
	"github.com/kolo-dl/kolo/internal/sockopt"
)

var secret = []byte("test-secret")

// logSink records what the server logs so tests can check a rejection was reported once.
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

// warnings returns the "remote" attribute of every warning that says msg.
func (s *logSink) warnings(msg string) []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []string
	for _, r := range s.recs {
		if r.Level != slog.LevelWarn || r.Message != msg {
			continue
		}
		r.Attrs(func(a slog.Attr) bool {
			if a.Key == "remote" {
				out = append(out, a.Value.String())
			}
			return true
		})
	}
	return out
}

func startServer(t *testing.T) (*Server, string, *logSink) {
	t.Helper()
	sink := &logSink{}
	s := newServer(secret, slog.New(sink), 300*time.Millisecond)
	addr, err := s.Listen("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s, addr.String(), sink
}

func dial(t *testing.T, addr string) *Client {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, err := Dial(ctx, addr, secret)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func ctxT(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

func TestSetGetAddAcrossClients(t *testing.T) {
	s, addr, _ := startServer(t)
	a, b, c := dial(t, addr), dial(t, addr), dial(t, addr)
	ctx := ctxT(t, 10*time.Second)

	// A Get parked before the Set is answered by it.
	got := make(chan []byte, 1)
	errc := make(chan error, 1)
	go func() {
		v, err := a.Get(ctx, "job/addr/1")
		got <- v
		errc <- err
	}()
	time.Sleep(50 * time.Millisecond)
	if err := b.Set(ctx, "job/addr/1", []byte("10.0.0.2:4000")); err != nil {
		t.Fatal(err)
	}
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	if v := <-got; string(v) != "10.0.0.2:4000" {
		t.Fatalf("Get = %q", v)
	}

	// TryGet, and the in-process view of the same store.
	if _, ok, err := c.TryGet(ctx, "nope"); ok || err != nil {
		t.Fatalf("TryGet missing = %v, %v", ok, err)
	}
	if v, ok, err := c.TryGet(ctx, "job/addr/1"); !ok || err != nil || string(v) != "10.0.0.2:4000" {
		t.Fatalf("TryGet = %q %v %v", v, ok, err)
	}
	if v, err := s.Get(ctx, "job/addr/1"); err != nil || string(v) != "10.0.0.2:4000" {
		t.Fatalf("server Get = %q %v", v, err)
	}
	if err := s.Set("from/launcher", []byte{0, 1, 2}); err != nil {
		t.Fatal(err)
	}
	if v, err := c.Get(ctx, "from/launcher"); err != nil || !bytes.Equal(v, []byte{0, 1, 2}) {
		t.Fatalf("client Get of launcher key = %v %v", v, err)
	}

	// Empty and large values survive the trip unchanged.
	big := make([]byte, 5<<20+3)
	rand.Read(big)
	for _, v := range [][]byte{{}, {7}, big} {
		if err := a.Set(ctx, "v", v); err != nil {
			t.Fatal(err)
		}
		if w, err := b.Get(ctx, "v"); err != nil || !bytes.Equal(w, v) {
			t.Fatalf("value of %d bytes came back as %d bytes (err %v)", len(v), len(w), err)
		}
	}

	// Concurrent Adds from several clients: every new value handed out exactly once.
	const per = 50
	clients := []*Client{a, b, c}
	seen := make(chan int64, per*len(clients)+1)
	var wg sync.WaitGroup
	for _, cl := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range per {
				n, err := cl.Add(ctx, "counter", 1)
				if err != nil {
					t.Error(err)
					return
				}
				seen <- n
			}
		}()
	}
	n, err := s.Add("counter", 1) // the launcher counts too
	if err != nil {
		t.Fatal(err)
	}
	seen <- n
	wg.Wait()
	close(seen)
	uniq := map[int64]bool{}
	for n := range seen {
		if uniq[n] || n < 1 || n > per*3+1 {
			t.Fatalf("Add returned %d twice or out of range", n)
		}
		uniq[n] = true
	}
	if v, err := a.Get(ctx, "counter"); err != nil || string(v) != fmt.Sprint(per*3+1) {
		t.Fatalf("counter = %q %v", v, err)
	}
	if n, err := a.Add(ctx, "counter", -10); err != nil || n != per*3+1-10 {
		t.Fatalf("Add -10 = %d %v", n, err)
	}
	if _, err := a.Add(ctx, "job/addr/1", 1); err == nil || !strings.Contains(err.Error(), "not a counter") {
		t.Fatalf("Add on a non-counter: %v", err)
	}
	// An Add wakes a Get parked on the counter.
	go func() { time.Sleep(20 * time.Millisecond); b.Add(ctx, "late", 5) }()
	if v, err := a.Get(ctx, "late"); err != nil || string(v) != "5" {
		t.Fatalf("Get of added key = %q %v", v, err)
	}
}

func TestLimits(t *testing.T) {
	_, addr, _ := startServer(t)
	c := dial(t, addr)
	ctx := ctxT(t, 5*time.Second)
	if err := c.Set(ctx, strings.Repeat("k", MaxKey+1), nil); err == nil {
		t.Fatal("Set accepted a key over MaxKey")
	}
	if err := c.Set(ctx, "k", make([]byte, MaxValue+1)); err == nil || !strings.Contains(err.Error(), "larger") {
		t.Fatalf("Set accepted a value over MaxValue: %v", err)
	}
	// The client still works after refusing locally.
	if err := c.Set(ctx, strings.Repeat("k", MaxKey), []byte("x")); err != nil {
		t.Fatal(err)
	}
}

func TestConcurrentGetsOnOneClient(t *testing.T) {
	_, addr, _ := startServer(t)
	c, setter := dial(t, addr), dial(t, addr)
	ctx := ctxT(t, 10*time.Second)
	const n = 20
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			k := fmt.Sprintf("k%d", i)
			v, err := c.Get(ctx, k)
			if err != nil || string(v) != "v"+k {
				t.Errorf("Get %s = %q %v", k, v, err)
			}
		}()
	}
	// Answer them in reverse order: responses must reach the right callers.
	for i := n - 1; i >= 0; i-- {
		k := fmt.Sprintf("k%d", i)
		if err := setter.Set(ctx, k, []byte("v"+k)); err != nil {
			t.Fatal(err)
		}
	}
	wg.Wait()
}

func TestGetTimesOutNamingKey(t *testing.T) {
	s, addr, _ := startServer(t)
	c := dial(t, addr)
	ctx, cancel := context.WithTimeout(context.Background(), 150*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err := c.Get(ctx, "job7/rank/3/addr")
	if err == nil {
		t.Fatal("Get of a missing key returned")
	}
	if !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), `"job7/rank/3/addr"`) || !strings.Contains(err.Error(), addr) {
		t.Fatalf("error %q should wrap the deadline and name the key and address", err)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Fatalf("Get took %s to time out", d)
	}
	// The server unparks the abandoned Get.
	deadline := time.Now().Add(2 * time.Second)
	for {
		s.mu.Lock()
		s.Store.mu.Lock()
		n := len(s.Store.waiters)
		s.Store.mu.Unlock()
		s.mu.Unlock()
		if n == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d keys still have parked waiters after the client gave up", n)
		}
		time.Sleep(10 * time.Millisecond)
	}
	// The in-process Get times out the same way.
	ctx2, cancel2 := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel2()
	if _, err := s.Get(ctx2, "other/key"); err == nil || !strings.Contains(err.Error(), `"other/key"`) {
		t.Fatalf("in-process Get: %v", err)
	}
	// And the client is still usable.
	if err := c.Set(ctxT(t, time.Second), "a", []byte("b")); err != nil {
		t.Fatal(err)
	}
}

func TestRejectsBadPeersKeepsServing(t *testing.T) {
	_, addr, sink := startServer(t)
	good := dial(t, addr)
	ctx := ctxT(t, 10*time.Second)

	t.Run("wrong secret", func(t *testing.T) {
		start := time.Now()
		_, err := Dial(ctxT(t, 5*time.Second), addr, []byte("wrong"))
		if !errors.Is(err, auth.ErrDenied) || !strings.Contains(err.Error(), addr) {
			t.Fatalf("wrong-secret Dial: %v", err)
		}
		if time.Since(start) > 2*time.Second {
			t.Fatal("wrong-secret Dial kept retrying")
		}
	})
	t.Run("random bytes", func(t *testing.T) {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		junk := make([]byte, 300)
		rand.Read(junk)
		c.Write(junk)
		c.SetReadDeadline(time.Now().Add(3 * time.Second))
		// EOF or a reset (we left bytes unread there): either way closed, not timed out.
		if _, err := io.Copy(io.Discard, c); errors.Is(err, os.ErrDeadlineExceeded) {
			t.Fatalf("server did not close the junk connection: %v", err)
		}
	})
	t.Run("silence", func(t *testing.T) {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		c.SetReadDeadline(time.Now().Add(3 * time.Second))
		if _, err := io.Copy(io.Discard, c); err != nil {
			t.Fatalf("server did not close a silent connection: %v", err)
		}
	})
	// While all that went on, the good client kept working.
	if err := good.Set(ctx, "k", []byte("v")); err != nil {
		t.Fatal(err)
	}
	if v, err := dial(t, addr).Get(ctx, "k"); err != nil || string(v) != "v" {
		t.Fatalf("Get after rejections = %q %v", v, err)
	}
	// Each bad connection was logged once, with its remote address.
	deadline := time.Now().Add(2 * time.Second)
	for len(sink.warnings("rendezvous: rejected connection")) < 3 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	w := sink.warnings("rendezvous: rejected connection")
	// 3, or up to 2 more when the wrong-secret client saw the server hang up (auth can close
	// before its proof is out) and retried before concluding it was denied.
	if len(w) < 3 || len(w) > 3+maxHangUps-1 {
		t.Fatalf("got %d rejection warnings %v, want 3", len(w), w)
	}
	for _, r := range w {
		if !strings.HasPrefix(r, "127.0.0.1:") {
			t.Errorf("warning names remote %q", r)
		}
	}
}

func TestServerClosedMidGet(t *testing.T) {
	s, addr, _ := startServer(t)
	c := dial(t, addr)
	errc := make(chan error, 1)
	go func() {
		_, err := c.Get(context.Background(), "never")
		errc <- err
	}()
	time.Sleep(50 * time.Millisecond)
	s.Close()
	select {
	case err := <-errc:
		if err == nil || !strings.Contains(err.Error(), addr) || !strings.Contains(err.Error(), "lost") {
			t.Fatalf("Get after server close: %v", err)
		}
	case <-time.After(2 * time.Second):
		t.Fatal("Get still blocked 2s after the server closed")
	}
	// Later calls fail at once too.
	if err := c.Set(context.Background(), "k", nil); err == nil || !strings.Contains(err.Error(), addr) {
		t.Fatalf("Set after server close: %v", err)
	}
}

func TestClientCloseFailsPending(t *testing.T) {
	_, addr, _ := startServer(t)
	c := dial(t, addr)
	errc := make(chan error, 1)
	go func() {
		_, err := c.Get(context.Background(), "never")
		errc <- err
	}()
	time.Sleep(50 * time.Millisecond)
	c.Close()
	select {
	case err := <-errc:
		if !errors.Is(err, ErrClosed) {
			t.Fatalf("pending Get after Close: %v", err)
		}
	case <-time.After(2 * time.Second):
		t.Fatal("Get still blocked after Close")
	}
}

func TestDialRetriesUntilServerStarts(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()

	// Nobody listening: gives up at the deadline, naming the address and the last dial error.
	_, err = Dial(ctxT(t, 200*time.Millisecond), addr, secret)
	if err == nil || !strings.Contains(err.Error(), addr) || !strings.Contains(err.Error(), "refused") {
		t.Fatalf("Dial with no server: %v", err)
	}

	done := make(chan error, 1)
	go func() {
		c, err := Dial(ctxT(t, 5*time.Second), addr, secret)
		if err == nil {
			err = c.Set(context.Background(), "k", []byte("v"))
			c.Close()
		}
		done <- err
	}()
	time.Sleep(150 * time.Millisecond)
	s := NewServer(secret)
	if _, err := s.Listen(addr); err != nil {
		t.Skipf("port %s taken meanwhile: %v", addr, err)
	}
	defer s.Close()
	if err := <-done; err != nil {
		t.Fatalf("Dial before the server started: %v", err)
	}
	if v, ok, _ := s.TryGet("k"); !ok || string(v) != "v" {
		t.Fatalf("server has %q %v", v, ok)
	}
}

func TestFrameRoundTrip(t *testing.T) {
	tests := []frame{
		{id: 0, verb: verbSet, key: "", value: []byte{}},
		{id: 1, verb: verbGet, key: "a/b", value: []byte{}},
		{id: 1<<64 - 1, verb: verbValue, key: strings.Repeat("x", MaxKey), value: bytes.Repeat([]byte{9}, 3<<20+1)},
	}
	for _, f := range tests {
		wire := append(appendHeader(nil, f), f.value...)
		g, err := readFrame(bytes.NewReader(wire))
		if err != nil {
			t.Fatalf("readFrame: %v", err)
		}
		if g.id != f.id || g.verb != f.verb || g.key != f.key || !bytes.Equal(g.value, f.value) {
			t.Fatalf("round trip of %v frame changed it", f.verb)
		}
		// Every truncation is an error, never a short frame.
		for _, cut := range []int{0, 1, headerLen, headerLen + fixedLen - 1, len(wire) - 1} {
			if cut >= len(wire) {
				continue
			}
			if _, err := readFrame(bytes.NewReader(wire[:cut])); err == nil {
				t.Fatalf("frame cut to %d of %d bytes decoded", cut, len(wire))
			}
		}
	}
}

func FuzzDecodeFrame(f *testing.F) {
	f.Add(append(appendHeader(nil, frame{id: 3, verb: verbSet, key: "k", value: []byte("v")}), 'v'))
	f.Add([]byte{0, 0, 0, 11, 0, 0, 0, 0, 0, 0, 0, 1, 2, 0xff, 0xff})
	f.Add([]byte{0xff, 0xff, 0xff, 0xff})
	f.Fuzz(func(t *testing.T, data []byte) {
		r := bytes.NewReader(data)
		fr, err := readFrame(r)
		if err != nil {
			return
		}
		if len(fr.key) > MaxKey || len(fr.value) > MaxValue {
			t.Fatalf("decoded a frame over the limits: key %d value %d", len(fr.key), len(fr.value))
		}
		consumed := len(data) - r.Len()
		if re := append(appendHeader(nil, fr), fr.value...); !bytes.Equal(re, data[:consumed]) {
			t.Fatalf("re-encoding differs from the %d bytes consumed", consumed)
		}
	})
}

func FuzzDecodeBody(f *testing.F) {
	f.Add([]byte{0, 0, 0, 0, 0, 0, 0, 1, 2, 0, 1, 'k', 'v'})
	f.Add([]byte{0, 0, 0, 0, 0, 0, 0, 1, 2, 0x10, 1})
	f.Fuzz(func(t *testing.T, data []byte) {
		fr, err := decodeBody(data)
		if err != nil {
			return
		}
		if fixedLen+len(fr.key)+len(fr.value) != len(data) {
			t.Fatalf("decoded frame accounts for %d of %d bytes", fixedLen+len(fr.key)+len(fr.value), len(data))
		}
	})
}

// Of clients (and the launcher) racing to SetIfAbsent one key, exactly one wins, every reader sees
// its value, and a Get parked before is woken by it.
func TestSetIfAbsentOneWinner(t *testing.T) {
	s, addr, _ := startServer(t)
	clients := []*Client{dial(t, addr), dial(t, addr), dial(t, addr)}
	ctx := ctxT(t, 10*time.Second)
	for round := range 20 {
		key := fmt.Sprintf("once/%d", round)
		parked := make(chan []byte, 1)
		go func() {
			v, err := clients[0].Get(ctx, key)
			if err != nil {
				t.Error(err)
			}
			parked <- v
		}()
		var wg sync.WaitGroup
		wins := make(chan string, len(clients)+1)
		for i, c := range clients {
			wg.Add(1)
			go func() {
				defer wg.Done()
				val := fmt.Sprintf("client %d", i)
				stored, err := c.SetIfAbsent(ctx, key, []byte(val))
				if err != nil {
					t.Error(err)
				}
				if stored {
					wins <- val
				}
			}()
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			stored, err := s.SetIfAbsent(key, []byte("launcher"))
			if err != nil {
				t.Error(err)
			}
			if stored {
				wins <- "launcher"
			}
		}()
		wg.Wait()
		close(wins)
		var won []string
		for w := range wins {
			won = append(won, w)
		}
		if len(won) != 1 {
			t.Fatalf("round %d: winners %q, want exactly one", round, won)
		}
		if v := <-parked; string(v) != won[0] {
			t.Errorf("round %d: parked Get saw %q, the winner wrote %q", round, v, won[0])
		}
		for i, c := range clients {
			if v, err := c.Get(ctx, key); err != nil || string(v) != won[0] {
				t.Errorf("round %d: client %d reads %q (%v), the winner wrote %q", round, i, v, err, won[0])
			}
		}
	}
	if _, err := clients[1].SetIfAbsent(ctx, strings.Repeat("k", MaxKey+1), nil); err == nil {
		t.Error("SetIfAbsent took an oversized key")
	}
	s.Close()
	if _, err := s.SetIfAbsent("after", nil); !errors.Is(err, ErrClosed) {
		t.Errorf("SetIfAbsent on a closed store: %v", err)
	}
}

// A session record lasts as long as the connection that set it, unless a later write replaced it.
func TestSessionRecordsEndWithTheirConnection(t *testing.T) {
	s, addr, _ := startServer(t)
	a, b, c := dial(t, addr), dial(t, addr), dial(t, addr)
	ctx := ctxT(t, 10*time.Second)
	for _, kv := range [][2]string{{"alive/a", "1"}, {"alive/a", "2"}, {"alive/b", "x"}} {
		if err := a.SetSession(ctx, kv[0], []byte(kv[1])); err != nil {
			t.Fatal(err)
		}
	}
	if err := b.SetSession(ctx, "alive/c", []byte("b's")); err != nil {
		t.Fatal(err)
	}
	if err := c.Set(ctx, "alive/b", []byte("replaced")); err != nil {
		t.Fatal(err)
	}
	if v, ok, _ := s.TryGet("alive/a"); !ok || string(v) != "2" {
		t.Fatalf("alive/a = %q, %v while its session lives", v, ok)
	}
	a.Close()
	deadline := time.Now().Add(5 * time.Second)
	for {
		_, ok, _ := s.TryGet("alive/a")
		if !ok {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("alive/a still set 5 s after its connection closed")
		}
		time.Sleep(5 * time.Millisecond)
	}
	if v, ok, _ := s.TryGet("alive/b"); !ok || string(v) != "replaced" {
		t.Errorf("alive/b = %q, %v: a record another client replaced was deleted with the first's session", v, ok)
	}
	if v, ok, _ := s.TryGet("alive/c"); !ok || string(v) != "b's" {
		t.Errorf("alive/c = %q, %v: another client's session ended with the first's", v, ok)
	}
}

// With a liveness bound, every accepted connection carries it as TCP_USER_TIMEOUT, with keepalive
// probes that fit in it: a client whose host is cut off is dropped, and its sessions end, within
// it (the elastic tests cut a host's link for real).
func TestLivenessSetsTheSocketOptions(t *testing.T) {
	s := newServer(secret, slog.Default(), time.Second)
	s.SetLiveness(3 * time.Second)
	addr, err := s.Listen("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	dial(t, addr.String())
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.conns) != 1 {
		t.Fatalf("%d server connections", len(s.conns))
	}
	for sc := range s.conns {
		raw, err := sc.c.(*net.TCPConn).SyscallConn()
		if err != nil {
			t.Fatal(err)
		}
		var ut, ka int
		raw.Control(func(fd uintptr) {
			ut, _ = syscall.GetsockoptInt(int(fd), syscall.IPPROTO_TCP, sockopt.TCPUserTimeout)
			ka, _ = syscall.GetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_KEEPALIVE)
		})
		if ut != 3000 || ka != 1 {
			t.Errorf("TCP_USER_TIMEOUT %d ms, SO_KEEPALIVE %d; want 3000 and 1", ut, ka)
		}
	}
}

// A client takes a connection only once the server confirmed the handshake: a server that checked
// the client's proof too late (its deadline passed on a loaded host) closes the connection after
// its own proof is out, and the client, whose side of the handshake had succeeded, must dial
// again rather than lose its first request on it. More such closes in a row than the hang-ups
// taken as a denial are still retried: they come after the server's proof checked out, so they
// are never a wrong secret.
func TestDialWaitsForTheServersAcceptance(t *testing.T) {
	ln, err := (&net.ListenConfig{}).Listen(context.Background(), "tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	const drops = maxHangUps + 2
	accepted := make(chan int, 1)
	go func() {
		for i := 0; ; i++ {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			if err := auth.Handshake(c, secret, auth.Listener, 5*time.Second); err != nil {
				c.Close()
				continue
			}
			if i < drops {
				c.Close() // timed out, as far as the client can tell
				continue
			}
			c.Write([]byte{acceptedByte})
			accepted <- i
			io.Copy(io.Discard, c)
			c.Close()
			return
		}
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	c, err := Dial(ctx, ln.Addr().String(), secret)
	if err != nil {
		t.Fatalf("dial: %v", err)
	}
	defer c.Close()
	select {
	case i := <-accepted:
		if i != drops {
			t.Errorf("the client took connection %d, want %d: the ones before were never confirmed", i, drops)
		}
	case <-ctx.Done():
		t.Fatal("the server never accepted")
	}

	// A server that never confirms: the dial gives up at its deadline, saying why.
	ln2, err := (&net.ListenConfig{}).Listen(context.Background(), "tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln2.Close()
	go func() {
		for {
			c, err := ln2.Accept()
			if err != nil {
				return
			}
			auth.Handshake(c, secret, auth.Listener, 5*time.Second)
			c.Close()
		}
	}()
	ctx2, cancel2 := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel2()
	if _, err := Dial(ctx2, ln2.Addr().String(), secret); err == nil || !strings.Contains(err.Error(), "did not confirm") || errors.Is(err, auth.ErrDenied) {
		t.Fatalf("dial to a server that never confirms: %v", err)
	}
}
