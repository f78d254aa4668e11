package inmem

import (
	"bytes"
	"context"
	"errors"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kolo-dl/kolo/internal/transport"
)

func testCtx(t *testing.T) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func randBytes(rng *rand.Rand, n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(rng.Uint32())
	}
	return b
}

// parallel runs f once per endpoint, each on its own goroutine, and returns their errors.
func parallel(eps []*Endpoint, f func(e *Endpoint) error) []error {
	errs := make([]error, len(eps))
	var wg sync.WaitGroup
	for i, e := range eps {
		wg.Go(func() { errs[i] = f(e) })
	}
	wg.Wait()
	return errs
}

func closeAll(eps []*Endpoint) {
	for _, e := range eps {
		e.Close()
	}
}

// Bytes are a stream: the receiver's Recv sizes need not match the sender's Send sizes, and a
// transfer many times the pipe's buffer completes when the reader keeps up.
func TestStreamIgnoresMessageBoundaries(t *testing.T) {
	ctx := testCtx(t)
	rng := rand.New(rand.NewPCG(1, 2))
	for _, bufBytes := range []int{1, 7, 4096, transport.MinBuffered} {
		eps := New(2, WithBuffer(bufBytes))
		size := 300_001
		if bufBytes < 100 {
			size = 10_007 // byte-at-a-time hand-offs are slow; the point is the boundaries
		}
		data := randBytes(rng, size)
		got := make([]byte, len(data))
		errs := parallel(eps, func(e *Endpoint) error {
			rng := rand.New(rand.NewPCG(uint64(e.Rank()), 9)) // sizes differ per side
			if e.Rank() == 0 {
				for off := 0; off < len(data); {
					k := min(1+rng.IntN(9000), len(data)-off)
					if err := e.Send(ctx, 1, data[off:off+k]); err != nil {
						return err
					}
					off += k
				}
				return nil
			}
			for off := 0; off < len(got); {
				k := min(1+rng.IntN(5000), len(got)-off)
				if err := e.Recv(ctx, 0, got[off:off+k]); err != nil {
					return err
				}
				off += k
			}
			return nil
		})
		for r, err := range errs {
			if err != nil {
				t.Fatalf("buffer %d: rank %d: %v", bufBytes, r, err)
			}
		}
		if !bytes.Equal(got, data) {
			t.Fatalf("buffer %d: received bytes differ from sent", bufBytes)
		}
		closeAll(eps)
	}
}

func TestSendOfMinBufferedNeedsNoReceiver(t *testing.T) {
	eps := New(2)
	defer closeAll(eps)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := eps[0].Send(ctx, 1, make([]byte, transport.MinBuffered)); err != nil {
		t.Fatalf("send of MinBuffered bytes with no receiver: %v", err)
	}
	// One byte more must wait for the receiver: it times out here.
	short, cancel2 := context.WithTimeout(ctx, 20*time.Millisecond)
	defer cancel2()
	if err := eps[0].Send(short, 1, []byte{1}); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("send beyond the buffer with no receiver: got %v, want deadline exceeded", err)
	}
}

// Every rank exchanges a large block with both ring neighbours at once, through tiny pipes: only a
// SendRecv that really sends and receives concurrently survives this.
func TestSendRecvRingDoesNotDeadlock(t *testing.T) {
	ctx := testCtx(t)
	for _, n := range []int{1, 2, 3, 5} {
		eps := New(n, WithBuffer(1000))
		rng := rand.New(rand.NewPCG(uint64(n), 3))
		in := make([][]byte, n)
		for r := range in {
			in[r] = randBytes(rng, 200_003)
		}
		out := make([][]byte, n)
		errs := parallel(eps, func(e *Endpoint) error {
			r := e.Rank()
			out[r] = make([]byte, len(in[r]))
			return e.SendRecv(ctx, (r+1)%n, in[r], (r-1+n)%n, out[r])
		})
		for r, err := range errs {
			if err != nil {
				t.Fatalf("n=%d rank %d: %v", n, r, err)
			}
			if !bytes.Equal(out[r], in[(r-1+n)%n]) {
				t.Fatalf("n=%d rank %d received the wrong bytes", n, r)
			}
		}
		closeAll(eps)
	}
}

func wantPeerLost(t *testing.T, what string, err error, rank int) {
	t.Helper()
	var pe *transport.PeerError
	if !errors.Is(err, transport.ErrPeerLost) || !errors.As(err, &pe) || pe.Rank != rank {
		t.Fatalf("%s: got %v, want a *PeerError naming rank %d", what, err, rank)
	}
}

func TestKillFailsPendingAndFutureCalls(t *testing.T) {
	ctx := testCtx(t)
	eps := New(3)
	defer closeAll(eps)
	cause := errors.New("oom-killed")

	// Rank 0 has already buffered its bytes for rank 1 and waits on rank 2: the call still
	// involves rank 1, so rank 1's death must end it.
	pending := make(chan error, 1)
	go func() {
		pending <- eps[0].SendRecv(ctx, 1, []byte("abc"), 2, make([]byte, 4))
	}()
	recvPending := make(chan error, 1)
	go func() { recvPending <- eps[2].Recv(ctx, 1, make([]byte, 10)) }()
	time.Sleep(10 * time.Millisecond)
	if err := eps[1].Send(ctx, 2, []byte("12345")); err != nil { // buffered, then lost
		t.Fatal(err)
	}
	eps[1].Kill(cause)

	wantPeerLost(t, "pending SendRecv to the killed rank", <-pending, 1)
	err := <-recvPending
	wantPeerLost(t, "pending Recv from the killed rank", err, 1)
	if !errors.Is(err, cause) {
		t.Errorf("error %v does not carry the cause %v", err, cause)
	}
	wantPeerLost(t, "future Send", eps[0].Send(ctx, 1, []byte{1}), 1)
	wantPeerLost(t, "future Recv", eps[2].Recv(ctx, 1, []byte{1}), 1)
	wantPeerLost(t, "Barrier", eps[0].Barrier(ctx), 1)
	if err := eps[1].Send(ctx, 0, []byte{1}); err == nil {
		t.Error("the killed rank itself can still send")
	}
	// Calls not involving the killed rank still work.
	if err := eps[0].Send(ctx, 2, []byte{7}); err != nil {
		t.Fatalf("send between live ranks: %v", err)
	}
	var b [1]byte
	if err := eps[2].Recv(ctx, 0, b[:]); err != nil || b[0] != 7 {
		t.Fatalf("recv between live ranks: %v %v", b, err)
	}
}

func TestContextCancelEndsWaits(t *testing.T) {
	eps := New(2)
	defer closeAll(eps)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- eps[0].Recv(ctx, 1, make([]byte, 8)) }()
	time.Sleep(5 * time.Millisecond)
	cancel()
	select {
	case err := <-done:
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("got %v, want context.Canceled", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Recv did not end when ctx was cancelled")
	}
	if err := eps[0].Barrier(ctx); !errors.Is(err, context.Canceled) {
		t.Fatalf("barrier on a cancelled ctx: got %v", err)
	}
}

func TestCloseLetsPeersDrain(t *testing.T) {
	ctx := testCtx(t)
	eps := New(2)
	if err := eps[0].Send(ctx, 1, []byte("hello")); err != nil {
		t.Fatal(err)
	}
	eps[0].Close()
	got := make([]byte, 5)
	if err := eps[1].Recv(ctx, 0, got); err != nil || string(got) != "hello" {
		t.Fatalf("draining a closed peer: %q %v", got, err)
	}
	err := eps[1].Recv(ctx, 0, got)
	wantPeerLost(t, "recv past a closed peer's bytes", err, 0)
	if !errors.Is(err, transport.ErrClosed) {
		t.Errorf("got %v, want it to wrap ErrClosed", err)
	}
	if err := eps[0].Send(ctx, 1, got); !errors.Is(err, transport.ErrClosed) {
		t.Errorf("send on a closed endpoint: %v", err)
	}
	if _, ok := <-eps[0].Inbox(); ok {
		t.Error("Inbox of a closed endpoint delivered a message")
	}
	eps[1].Close()
}

func TestCloseEndsPeersBlockedSend(t *testing.T) {
	ctx := testCtx(t)
	eps := New(2)
	defer eps[1].Close()
	done := make(chan error, 1)
	go func() { done <- eps[1].Send(ctx, 0, make([]byte, 2*transport.MinBuffered)) }()
	time.Sleep(10 * time.Millisecond)
	eps[0].Close()
	err := <-done
	wantPeerLost(t, "send blocked on a peer that closed", err, 0)
	if !errors.Is(err, transport.ErrClosed) {
		t.Errorf("got %v, want it to wrap ErrClosed", err)
	}
}

func TestBarrierOrdersMemory(t *testing.T) {
	ctx := testCtx(t)
	for _, n := range []int{1, 2, 3, 8} {
		eps := New(n, WithSlotBytes(64))
		var arrived atomic.Int64
		const rounds = 50
		errs := parallel(eps, func(e *Endpoint) error {
			for round := 1; round <= rounds; round++ {
				e.Slot(e.Rank())[0] = byte(round)
				arrived.Add(1)
				if err := e.Barrier(ctx); err != nil {
					return err
				}
				if got := arrived.Load(); got < int64(round*n) {
					t.Errorf("n=%d round %d: rank %d passed the barrier with %d arrivals", n, round, e.Rank(), got)
				}
				for q := range n {
					if got := e.Slot(q)[0]; got != byte(round) {
						t.Errorf("n=%d round %d: rank %d sees slot %d = %d", n, round, e.Rank(), q, got)
					}
				}
				if err := e.Barrier(ctx); err != nil {
					return err
				}
			}
			return nil
		})
		for r, err := range errs {
			if err != nil {
				t.Fatalf("n=%d rank %d: %v", n, r, err)
			}
		}
		closeAll(eps)
	}
}

func TestWithoutShared(t *testing.T) {
	eps := New(2, WithoutShared())
	defer closeAll(eps)
	if eps[0].Slot(0) != nil {
		t.Error("Slot is not nil without shared memory")
	}
	if err := eps[0].Barrier(context.Background()); err == nil {
		t.Error("Barrier succeeded without shared memory")
	}
	if _, ok := eps[0].Comm().(transport.Shared); ok {
		t.Error("Comm() claims Shared on a group built WithoutShared")
	}
	if _, ok := New(1)[0].Comm().(transport.Shared); !ok {
		t.Error("Comm() hides Shared on a shared group")
	}
}

func TestMessenger(t *testing.T) {
	ctx := testCtx(t)
	eps := New(3)
	defer closeAll(eps)
	for i := range 100 {
		if err := eps[1].SendMsg(ctx, 0, []byte{byte(i)}); err != nil {
			t.Fatal(err)
		}
	}
	if err := eps[2].SendMsg(ctx, 0, nil); err != nil {
		t.Fatal(err)
	}
	eps[1].Kill(errors.New("segfault"))
	if err := eps[2].SendMsg(ctx, 1, []byte("x")); err == nil {
		t.Error("SendMsg to a killed rank succeeded")
	}
	next := 0
	sawEmpty, sawLoss := false, false
	for !(sawEmpty && sawLoss) {
		var m transport.Msg
		select {
		case m = <-eps[0].Inbox():
		case <-ctx.Done():
			t.Fatal("inbox stalled")
		}
		switch {
		case m.From == 2:
			if m.Body == nil || len(m.Body) != 0 {
				t.Errorf("empty message arrived as %#v", m.Body)
			}
			sawEmpty = true
		case m.From == 1 && m.Body == nil:
			if next != 100 {
				t.Errorf("loss notice arrived after %d of 100 earlier messages", next)
			}
			sawLoss = true
		case m.From == 1:
			if int(m.Body[0]) != next {
				t.Fatalf("message %d arrived as %d", next, m.Body[0])
			}
			next++
		}
	}
	wantPeerLost(t, "Lost(1)", eps[0].Lost(1), 1)
	if err := eps[0].Lost(2); err != nil {
		t.Errorf("Lost(2) = %v for a live rank", err)
	}
}

func TestSendRecvAllocatesNothing(t *testing.T) {
	t.Run("plain", func(t *testing.T) { testSendRecvAllocatesNothing(t) })
	// The progress deadline's timer is made once and reused.
	t.Run("progress timeout", func(t *testing.T) { testSendRecvAllocatesNothing(t, WithProgressTimeout(time.Minute)) })
}

func testSendRecvAllocatesNothing(t *testing.T, opts ...Option) {
	eps := New(2, opts...)
	defer closeAll(eps)
	ctx := context.Background()
	a, b := make([]byte, 200_000), make([]byte, 200_000)
	start, done := make(chan struct{}), make(chan error)
	go func() {
		for range start {
			done <- eps[1].SendRecv(ctx, 0, b, 0, b)
		}
	}()
	defer close(start)
	allocs := testing.AllocsPerRun(20, func() {
		start <- struct{}{}
		if err := eps[0].SendRecv(ctx, 1, a, 1, a[:len(b)]); err != nil {
			t.Fatal(err)
		}
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	})
	if allocs != 0 {
		t.Errorf("SendRecv allocates %.1f times per exchange", allocs)
	}
}
