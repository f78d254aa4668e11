//go:build linux

package shm

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/kolo-dl/kolo/internal/transport"
)

var segCounter atomic.Int64

// testConfig returns a small segment in a fresh directory: 64 KiB rings so that "larger than the
// ring" cases stay cheap.
func testConfig(t testing.TB, size int) Config {
	return Config{
		Name:         fmt.Sprintf("kolo-test-%d-%d", os.Getpid(), segCounter.Add(1)),
		Size:         size,
		SlotBytes:    64 << 10,
		RingBytes:    64 << 10,
		MsgRingBytes: 4 << 10,
		Timeout:      10 * time.Second,
		Dir:          t.TempDir(),
	}
}

// openAll opens every rank of cfg concurrently in this process (each rank maps the file itself, as
// separate processes would) and closes them at the end of the test.
func openAll(t testing.TB, cfg Config) []*Group {
	t.Helper()
	gs := make([]*Group, cfg.Size)
	errs := make([]error, cfg.Size)
	var wg sync.WaitGroup
	for r := range cfg.Size {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c := cfg
			c.Rank = r
			gs[r], errs[r] = Open(context.Background(), c)
		}()
	}
	wg.Wait()
	for r, err := range errs {
		if err != nil {
			t.Fatalf("open rank %d: %v", r, err)
		}
	}
	t.Cleanup(func() {
		for _, g := range gs {
			g.Close()
		}
	})
	return gs
}

// runAll runs f for every rank concurrently and fails the test with every rank's error.
func runAll(t testing.TB, gs []*Group, f func(r int, g *Group) error) {
	t.Helper()
	errs := make([]error, len(gs))
	var wg sync.WaitGroup
	for r, g := range gs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[r] = f(r, g)
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
}

// payload is the reference data rank src sends to dst in step k: deterministic, so the receiver
// can recompute what it must get.
func payload(src, dst, k, n int) []byte {
	rng := rand.New(rand.NewPCG(uint64(src)<<32|uint64(dst), uint64(k)<<20|uint64(n)))
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(rng.Uint32())
	}
	return b
}

// awkward sizes: empty, tiny, odd, prime, one byte over MinBuffered, several times the ring.
var awkwardSizes = []int{0, 1, 7, 4093, 64<<10 + 1, 3*(64<<10) + 17}

func TestSegmentFileUnlinkedAndSized(t *testing.T) {
	cfg := testConfig(t, 3)
	want := SegmentBytes(cfg)
	n, _ := cfg.normalize()
	l := newLayout(n)
	if want != l.total || want <= int64(3*cfg.SlotBytes+6*cfg.RingBytes+6*cfg.MsgRingBytes) {
		t.Fatalf("SegmentBytes = %d, layout total %d", want, l.total)
	}
	gs := openAll(t, cfg)
	if _, err := os.Stat(filepath.Join(cfg.Dir, cfg.Name)); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("segment file still exists after every rank attached: %v", err)
	}
	for r, g := range gs {
		sh := g.Comm().(transport.Shared)
		for p := range 3 {
			if s := sh.Slot(p); len(s) != cfg.SlotBytes || cap(s) != cfg.SlotBytes {
				t.Fatalf("rank %d: slot %d has len %d cap %d, want %d", r, p, len(s), cap(s), cfg.SlotBytes)
			}
		}
	}
	if SegmentBytes(Config{Name: "x", Size: 0}) != 0 {
		t.Fatal("SegmentBytes of an invalid config should be 0")
	}
	// Defaults: 8 ranks need 8 slots of 8 MiB plus 56 rings of 1 MiB plus 56 of 64 KiB.
	got := SegmentBytes(Config{Name: "x", Size: 8})
	if lo := int64(64<<20 + 56<<20 + 56*64<<10); got < lo || got > lo+1<<20 {
		t.Fatalf("SegmentBytes(8 ranks, defaults) = %d, want about %d", got, lo)
	}
}

func TestSendRecvPatterns(t *testing.T) {
	for _, size := range []int{2, 3, 4, 8} {
		t.Run(fmt.Sprintf("ranks=%d", size), func(t *testing.T) {
			gs := openAll(t, testConfig(t, size))
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()

			// Ring: every rank sends to the next and receives from the previous at once.
			runAll(t, gs, func(r int, g *Group) error {
				c := g.Comm()
				to, from := (r+1)%size, (r+size-1)%size
				for k, n := range awkwardSizes {
					got := make([]byte, n)
					if err := c.SendRecv(ctx, to, payload(r, to, k, n), from, got); err != nil {
						return err
					}
					if !bytes.Equal(got, payload(from, r, k, n)) {
						return fmt.Errorf("ring: rank %d got wrong %d bytes from %d", r, n, from)
					}
				}
				return nil
			})

			// All-to-all by SendRecv, with a different awkward size for every ordered pair.
			pairSize := func(src, dst int) int { return awkwardSizes[(src*7+dst*3)%len(awkwardSizes)] + src }
			runAll(t, gs, func(r int, g *Group) error {
				c := g.Comm()
				for s := range size {
					to, from := (r+s)%size, (r+size-s)%size
					got := make([]byte, pairSize(from, r))
					if err := c.SendRecv(ctx, to, payload(r, to, 100+s, pairSize(r, to)), from, got); err != nil {
						return err
					}
					if !bytes.Equal(got, payload(from, r, 100+s, len(got))) {
						return fmt.Errorf("all-to-all step %d: rank %d got wrong %d bytes from %d", s, r, len(got), from)
					}
				}
				return nil
			})

			// All pairs by blocking Send then Recv, pairs in one global order (no deadlock even when
			// messages exceed the ring, since the lowest pending pair always progresses).
			runAll(t, gs, func(r int, g *Group) error {
				c := g.Comm()
				for a := range size {
					for b := a + 1; b < size; b++ {
						if r != a && r != b {
							continue
						}
						peer := a + b - r
						n := pairSize(a, b)
						got := make([]byte, n)
						first, second := func() error { return c.Send(ctx, peer, payload(r, peer, 200, n)) },
							func() error { return c.Recv(ctx, peer, got) }
						if r == b {
							first, second = second, first
						}
						if err := first(); err != nil {
							return err
						}
						if err := second(); err != nil {
							return err
						}
						if !bytes.Equal(got, payload(peer, r, 200, n)) {
							return fmt.Errorf("pairs: rank %d got wrong %d bytes from %d", r, n, peer)
						}
					}
				}
				return nil
			})
		})
	}
}

// Sends that the receiver reads in differently sized pieces: stream semantics, boundaries not kept.
func TestStreamBoundaries(t *testing.T) {
	gs := openAll(t, testConfig(t, 2))
	ctx := context.Background()
	data := payload(0, 1, 0, 300001)
	runAll(t, gs, func(r int, g *Group) error {
		c := g.Comm()
		if r == 0 {
			for off, step := 0, 1; off < len(data); off, step = off+step, step*3+1 {
				if err := c.Send(ctx, 1, data[off:min(off+step, len(data))]); err != nil {
					return err
				}
			}
			return nil
		}
		got := make([]byte, len(data))
		for off, step := 0, 5; off < len(got); off, step = off+step, step*2+3 {
			if err := c.Recv(ctx, 0, got[off:min(off+step, len(got))]); err != nil {
				return err
			}
		}
		if !bytes.Equal(got, data) {
			return errors.New("stream reassembled wrongly")
		}
		return nil
	})
}

func TestMinBufferedWithoutReceiver(t *testing.T) {
	gs := openAll(t, testConfig(t, 2))
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	b := payload(0, 1, 0, transport.MinBuffered)
	if err := gs[0].Comm().Send(ctx, 1, b); err != nil {
		t.Fatalf("send of MinBuffered bytes with no receiver: %v", err)
	}
	got := make([]byte, len(b))
	if err := gs[1].Comm().Recv(ctx, 0, got); err != nil || !bytes.Equal(got, b) {
		t.Fatalf("recv: %v (equal %v)", err, bytes.Equal(got, b))
	}
}

func TestSendToSelf(t *testing.T) {
	gs := openAll(t, testConfig(t, 2))
	ctx := context.Background()
	c := gs[0].Comm()
	a, b := payload(0, 0, 1, 100), payload(0, 0, 2, 50)
	if err := c.Send(ctx, 0, a); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, 150)
	if err := c.SendRecv(ctx, 0, b, 0, got); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, append(append([]byte{}, a...), b...)) {
		t.Fatal("self stream reordered")
	}
	if err := c.Recv(ctx, 0, make([]byte, 1)); err == nil || !strings.Contains(err.Error(), "itself") {
		t.Fatalf("recv from self with nothing sent: got %v, want an error", err)
	}
	if err := c.Send(ctx, 2, a); err == nil {
		t.Fatal("send to an out-of-range rank succeeded")
	}
}

func TestSlotsAndBarrier(t *testing.T) {
	for _, size := range []int{1, 2, 3, 8} {
		t.Run(fmt.Sprintf("ranks=%d", size), func(t *testing.T) {
			gs := openAll(t, testConfig(t, size))
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			runAll(t, gs, func(r int, g *Group) error {
				sh := g.Comm().(transport.Shared)
				for round := range 20 {
					n := 1 + (round*977)%len(sh.Slot(r))
					copy(sh.Slot(r), payload(r, round, 0, n))
					if err := sh.Barrier(ctx); err != nil {
						return err
					}
					for p := range size {
						if !bytes.Equal(sh.Slot(p)[:n], payload(p, round, 0, n)) {
							return fmt.Errorf("round %d: rank %d sees stale slot %d", round, r, p)
						}
					}
					// Nobody overwrites a slot before everyone has read it.
					if err := sh.Barrier(ctx); err != nil {
						return err
					}
				}
				return nil
			})
		})
	}
}

func TestBarrierCancelNamesLateRanks(t *testing.T) {
	gs := openAll(t, testConfig(t, 3))
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	start := time.Now()
	err := gs[0].Comm().(transport.Shared).Barrier(ctx)
	if !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "[1 2]") {
		t.Fatalf("barrier with absent ranks: got %v, want a deadline error naming ranks [1 2]", err)
	}
	if d := time.Since(start); d > time.Second {
		t.Fatalf("barrier took %v to notice its context", d)
	}
}

func TestCancelDuringRecv(t *testing.T) {
	gs := openAll(t, testConfig(t, 2))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- gs[0].Comm().Recv(ctx, 1, make([]byte, 10)) }()
	time.Sleep(20 * time.Millisecond)
	start := time.Now()
	cancel()
	select {
	case err := <-done:
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("recv after cancel: %v", err)
		}
		// The context's AfterFunc rings the doorbell, so this should not wait for the 50 ms poll.
		t.Logf("recv noticed cancel after %v", time.Since(start))
	case <-time.After(2 * time.Second):
		t.Fatal("recv did not return after its context was cancelled")
	}
	// A deadline on a send that cannot progress (ring full, nobody reading).
	dctx, dcancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer dcancel()
	err := gs[0].Comm().Send(dctx, 1, make([]byte, 1<<20))
	if !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "send") {
		t.Fatalf("send into a full ring: got %v, want deadline exceeded", err)
	}
}

func TestPeerCloseFailsWaits(t *testing.T) {
	gs := openAll(t, testConfig(t, 3))
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	done := make(chan error, 1)
	go func() {
		// Data sent before the close is still delivered; only the missing rest fails.
		got := make([]byte, 200)
		err := gs[1].Comm().Recv(ctx, 0, got)
		if err == nil || !bytes.Equal(got[:100], payload(0, 1, 0, 100)) {
			err = fmt.Errorf("recv: got err %v, equal prefix %v", err, bytes.Equal(got[:100], payload(0, 1, 0, 100)))
		}
		done <- err
	}()
	if err := gs[0].Comm().Send(ctx, 1, payload(0, 1, 0, 100)); err != nil {
		t.Fatal(err)
	}
	time.Sleep(10 * time.Millisecond)
	gs[0].Comm().Close()
	err := <-done
	var pe *transport.PeerError
	if !errors.As(err, &pe) || pe.Rank != 0 || pe.Op != "recv" {
		t.Fatalf("recv from a closed peer: got %v, want a PeerError for rank 0", err)
	}
	if err := gs[0].Comm().Send(ctx, 1, []byte{1}); !errors.Is(err, transport.ErrClosed) {
		t.Fatalf("send after close: %v", err)
	}
	// Barrier among the rest fails naming rank 0.
	berr := gs[2].Comm().(transport.Shared).Barrier(ctx)
	if !errors.As(berr, &pe) || pe.Rank != 0 {
		t.Fatalf("barrier with a closed rank: %v", berr)
	}
}

func TestAbortFailsEveryWait(t *testing.T) {
	gs := openAll(t, testConfig(t, 3))
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	errs := make(chan error, 2)
	go func() { errs <- gs[0].Comm().Recv(ctx, 1, make([]byte, 8)) }()
	go func() { errs <- gs[1].Comm().(transport.Shared).Barrier(ctx) }()
	time.Sleep(20 * time.Millisecond)
	start := time.Now()
	gs[2].Abort(errors.New("rank 7 on host b lost"))
	for range 2 {
		err := <-errs
		if !errors.Is(err, ErrAborted) || !strings.Contains(err.Error(), "rank 7 on host b lost") ||
			!strings.Contains(err.Error(), "local rank 2") {
			t.Fatalf("wait after abort: %v", err)
		}
	}
	if d := time.Since(start); d > time.Second {
		t.Fatalf("aborted waits took %v to fail", d)
	}
	// A call that has to wait fails; one that need not still completes, as a rank that finished
	// an op and then aborted has sent what the others need to finish theirs.
	if err := gs[1].Comm().Send(ctx, 0, make([]byte, 128<<10)); !errors.Is(err, ErrAborted) {
		t.Fatalf("send larger than the ring after abort: %v", err)
	}
	if err := gs[2].Comm().Send(ctx, 0, payload(2, 0, 0, 100)); err != nil {
		t.Fatalf("send that fits the ring after abort: %v", err)
	}
	got := make([]byte, 100)
	if err := gs[0].Comm().Recv(ctx, 2, got); err != nil || !bytes.Equal(got, payload(2, 0, 0, 100)) {
		t.Fatalf("recv of bytes already sent, after abort: err %v, equal %v", err, bytes.Equal(got, payload(2, 0, 0, 100)))
	}
	if err := gs[0].Comm().Recv(ctx, 2, got); !errors.Is(err, ErrAborted) {
		t.Fatalf("recv of bytes never sent, after abort: %v", err)
	}
	// The Messenger keeps working, so ranks can still tell each other why.
	if err := gs[1].Messenger().SendMsg(ctx, 0, []byte("why")); err != nil {
		t.Fatalf("SendMsg after abort: %v", err)
	}
	if in := <-gs[0].Messenger().Inbox(); in.From != 1 || string(in.Body) != "why" {
		t.Fatalf("message after abort: %+v", in)
	}
}

func TestCloseFailsOwnPendingCall(t *testing.T) {
	gs := openAll(t, testConfig(t, 2))
	done := make(chan error, 1)
	go func() { done <- gs[0].Comm().Recv(context.Background(), 1, make([]byte, 8)) }()
	time.Sleep(20 * time.Millisecond)
	gs[0].Close()
	select {
	case err := <-done:
		if !errors.Is(err, transport.ErrClosed) {
			t.Fatalf("pending recv after close: %v", err)
		}
	case <-time.After(2 * time.Second):
		t.Fatal("close did not end a pending recv")
	}
	if _, ok := <-gs[0].Messenger().Inbox(); ok {
		t.Fatal("inbox not closed by Close")
	}
}

func TestMessengerOrderingManySenders(t *testing.T) {
	const perSender = 120
	cfg := testConfig(t, 4)
	gs := openAll(t, cfg)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	// Message k from s to d: awkward sizes including empty and longer than the 4 KiB ring.
	msg := func(s, d, k int) []byte {
		n := []int{0, 1, 13, 4095, 9000}[k%5]
		b := payload(s, d, 1000+k, n)
		if n >= 4 {
			b[0], b[1] = byte(k), byte(k>>8)
		}
		return b
	}
	runAll(t, gs, func(r int, g *Group) error {
		m := g.Messenger()
		errc := make(chan error, 4)
		// One goroutine per destination (including this rank): SendMsg is safe for concurrent use.
		for d := range 4 {
			go func() {
				for k := range perSender {
					if err := m.SendMsg(ctx, d, msg(r, d, k)); err != nil {
						errc <- err
						return
					}
				}
				errc <- nil
			}()
		}
		next := make([]int, 4)
		for got := 0; got < 4*perSender; got++ {
			select {
			case in := <-m.Inbox():
				if in.Body == nil {
					return fmt.Errorf("rank %d: peer %d reported lost: %v", r, in.From, m.Lost(in.From))
				}
				want := msg(in.From, r, next[in.From])
				if !bytes.Equal(in.Body, want) {
					return fmt.Errorf("rank %d: message %d from %d: got %d bytes, want %d (out of order or corrupt)",
						r, next[in.From], in.From, len(in.Body), len(want))
				}
				next[in.From]++
			case <-ctx.Done():
				return fmt.Errorf("rank %d: received %v of %d from each: %w", r, next, perSender, ctx.Err())
			}
		}
		for range 4 {
			if err := <-errc; err != nil {
				return err
			}
		}
		return nil
	})
}

func TestMessengerPeerLost(t *testing.T) {
	gs := openAll(t, testConfig(t, 2))
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	m0, m1 := gs[0].Messenger(), gs[1].Messenger()
	for k := range 3 {
		if err := m1.SendMsg(ctx, 0, []byte{byte(k)}); err != nil {
			t.Fatal(err)
		}
	}
	m1.Close()
	for k := range 3 {
		in := <-m0.Inbox()
		if in.From != 1 || !bytes.Equal(in.Body, []byte{byte(k)}) {
			t.Fatalf("message %d: got %+v", k, in)
		}
	}
	select {
	case in := <-m0.Inbox():
		if in.From != 1 || in.Body != nil {
			t.Fatalf("got %+v, want the lost marker from rank 1", in)
		}
	case <-ctx.Done():
		t.Fatal("no lost marker after the peer closed its messenger")
	}
	var pe *transport.PeerError
	if err := m0.Lost(1); !errors.As(err, &pe) || pe.Rank != 1 {
		t.Fatalf("Lost(1) = %v", err)
	}
	if m0.Lost(0) != nil {
		t.Fatal("Lost(self) should be nil")
	}
	if err := m0.SendMsg(ctx, 1, []byte("x")); !errors.Is(err, transport.ErrPeerLost) {
		t.Fatalf("SendMsg to a lost peer: %v", err)
	}
	// The Comm half of rank 1 still works: the halves close separately.
	go gs[1].Comm().Send(ctx, 0, []byte("still here"))
	got := make([]byte, 10)
	if err := gs[0].Comm().Recv(ctx, 1, got); err != nil || string(got) != "still here" {
		t.Fatalf("comm after the peer's messenger closed: %v %q", err, got)
	}
}

func TestOpenErrors(t *testing.T) {
	ctx := context.Background()
	t.Run("stale name", func(t *testing.T) {
		cfg := testConfig(t, 2)
		path := filepath.Join(cfg.Dir, cfg.Name)
		if err := os.WriteFile(path, []byte("old"), 0o600); err != nil {
			t.Fatal(err)
		}
		_, err := Open(ctx, cfg)
		t.Log(err)
		if err == nil || !strings.Contains(err.Error(), path) || !strings.Contains(err.Error(), "already exists") {
			t.Fatalf("open over a stale file: %v", err)
		}
	})
	t.Run("stale creator", func(t *testing.T) {
		cfg := testConfig(t, 2)
		n, _ := cfg.normalize()
		mem, fd, err := create(filepath.Join(cfg.Dir, cfg.Name), newLayout(n))
		if err != nil {
			t.Fatal(err)
		}
		defer syscall.Close(fd)
		*u64(mem, offCreatorPid) = uint64(deadPid(t))
		cfg.Rank = 1
		_, err = Open(ctx, cfg)
		t.Log(err)
		if err == nil || !strings.Contains(err.Error(), "stale") {
			t.Fatalf("attach to a segment whose creator died: %v", err)
		}
	})
	t.Run("rank 0 alone", func(t *testing.T) {
		cfg := testConfig(t, 3)
		cfg.Timeout = 100 * time.Millisecond
		_, err := Open(ctx, cfg)
		t.Log(err)
		if err == nil || !strings.Contains(err.Error(), "1 of 3") || !strings.Contains(err.Error(), "[1 2]") {
			t.Fatalf("rank 0 alone: %v", err)
		}
		if _, serr := os.Stat(filepath.Join(cfg.Dir, cfg.Name)); !errors.Is(serr, os.ErrNotExist) {
			t.Fatal("rank 0 left the segment file after a failed open")
		}
	})
	t.Run("no rank 0", func(t *testing.T) {
		cfg := testConfig(t, 2)
		cfg.Rank, cfg.Timeout = 1, 100*time.Millisecond
		_, err := Open(ctx, cfg)
		t.Log(err)
		if err == nil || !strings.Contains(err.Error(), cfg.Name) || !strings.Contains(err.Error(), "does not exist") {
			t.Fatalf("rank 1 without rank 0: %v", err)
		}
	})
	t.Run("config mismatch", func(t *testing.T) {
		cfg := testConfig(t, 2)
		cfg.Timeout = time.Second
		errs := make(chan error, 1)
		go func() { _, err := Open(ctx, cfg); errs <- err }()
		other := cfg
		other.Rank, other.SlotBytes = 1, 2*cfg.SlotBytes
		_, err := Open(ctx, other)
		t.Log(err)
		if err == nil || !strings.Contains(err.Error(), "same config") {
			t.Fatalf("mismatched slot size: %v", err)
		}
		if err := <-errs; err == nil {
			t.Fatal("rank 0 opened although rank 1 never attached")
		}
	})
	t.Run("duplicate rank", func(t *testing.T) {
		cfg := testConfig(t, 3)
		cfg.Timeout = 500 * time.Millisecond
		var wg sync.WaitGroup
		errs := make([]error, 3)
		for i, r := range []int{0, 1, 1} {
			wg.Add(1)
			go func() {
				defer wg.Done()
				c := cfg
				c.Rank = r
				var g *Group
				if g, errs[i] = Open(ctx, c); g != nil {
					g.Close()
				}
			}()
		}
		wg.Wait()
		if err := errors.Join(errs...); err == nil || !strings.Contains(err.Error(), "already attached") {
			t.Fatalf("two ranks 1: %v", err)
		}
	})
	t.Run("bad config", func(t *testing.T) {
		for _, c := range []Config{{Name: "", Size: 1}, {Name: "a/b", Size: 1}, {Name: "x", Size: 2, Rank: 2}, {Name: "x", Size: 0}} {
			if _, err := Open(ctx, c); err == nil {
				t.Fatalf("Open(%+v) succeeded", c)
			}
		}
	})
}

// deadPid returns the pid of a process that has exited and been reaped.
func deadPid(t *testing.T) int {
	p, err := os.StartProcess("/bin/true", []string{"true"}, &os.ProcAttr{})
	if err != nil {
		t.Skipf("cannot start /bin/true: %v", err)
	}
	pid := p.Pid
	p.Wait()
	return pid
}

// Every rank reports the oversubscription local rank 0 saw when it created the segment, whatever
// CPUs the others may run on.
func TestOversubscribedIsRankZerosView(t *testing.T) {
	cpus := runtime.NumCPU()
	t.Setenv("KOLO_HOST_CPUS", strconv.Itoa(cpus)) // as kolo run may have set it otherwise
	for _, size := range []int{1, cpus, cpus + 1} {
		t.Run(fmt.Sprintf("ranks=%d", size), func(t *testing.T) {
			gs := openAll(t, testConfig(t, size))
			for r, g := range gs {
				if got, want := g.Comm().(transport.Shared).Oversubscribed(), size > cpus; got != want {
					t.Errorf("rank %d: Oversubscribed() = %v with %d ranks on %d CPUs", r, got, size, cpus)
				}
			}
			// Rank 0 saw one CPU: every rank must say so, not judge by its own CPUs.
			*gs[0].u32(offHostCPUs) = 1
			for r, g := range gs {
				if got := g.Comm().(transport.Shared).Oversubscribed(); got != (size > 1) {
					t.Errorf("rank %d: Oversubscribed() = %v after rank 0 recorded 1 CPU for %d ranks", r, got, size)
				}
			}
		})
	}
}

// SetSpin changes how long this rank's waits poll, 0 meaning never (not the default, as in
// Config), and traffic keeps flowing whether a wait polls for long or not at all.
func TestSetSpin(t *testing.T) {
	cfg := testConfig(t, 2)
	cfg.Spin = 20 * time.Microsecond
	gs := openAll(t, cfg)
	for _, tc := range []struct {
		set, want time.Duration
	}{{0, -1}, {-5, -1}, {300 * time.Millisecond, 300 * time.Millisecond}, {time.Microsecond, time.Microsecond}} {
		runAll(t, gs, func(r int, g *Group) error {
			sp, ok := g.Comm().(transport.Spinner)
			if !ok {
				return fmt.Errorf("the shm Comm is not a transport.Spinner")
			}
			sp.SetSpin(tc.set)
			if got := g.spin(); got != tc.want {
				return fmt.Errorf("SetSpin(%v): spin %v, want %v", tc.set, got, tc.want)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			// Rank 1 sends late, so rank 0's Recv waits past a short spin and sleeps.
			b := make([]byte, 1000)
			if r == 1 {
				time.Sleep(2 * time.Millisecond)
				b[999] = 7
				return g.Comm().Send(ctx, 0, b)
			}
			if err := g.Comm().Recv(ctx, 1, b); err != nil {
				return fmt.Errorf("SetSpin(%v): %w", tc.set, err)
			}
			if b[999] != 7 {
				return fmt.Errorf("SetSpin(%v): received %d, want 7", tc.set, b[999])
			}
			return nil
		})
	}
}
