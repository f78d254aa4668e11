//go:build linux

package shm

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kolo-dl/kolo/internal/transport"
)

// pollerOf returns g's Messenger as a transport.Poller.
func pollerOf(t testing.TB, g *Group) (transport.Messenger, transport.Poller) {
	t.Helper()
	m := g.Messenger()
	p, ok := transport.PollerOf(m)
	if !ok {
		t.Fatal("shm messenger is not a transport.Poller")
	}
	return m, p
}

// recvPolled takes the next message the way the engine does: poll, else sleep on the doorbell.
func recvPolled(ctx context.Context, p transport.Poller) (transport.Msg, error) {
	for {
		m, ok, err := p.TryRecv()
		if err != nil || ok {
			return m, err
		}
		if ctx.Err() != nil {
			return transport.Msg{}, ctx.Err()
		}
		p.Sleep(func() bool { return ctx.Err() != nil }, 10*time.Millisecond)
	}
}

// The ordering test of the Inbox path, read through TryRecv and Sleep instead, with every sender
// spinning (so messages land while the receiver polls) or not (so it sleeps).
func TestPollerOrderingManySenders(t *testing.T) {
	for _, spin := range []time.Duration{-1, 20 * time.Microsecond} {
		t.Run(fmt.Sprintf("spin=%v", spin), func(t *testing.T) {
			const perSender = 100
			cfg := testConfig(t, 4)
			cfg.Spin = spin
			gs := openAll(t, cfg)
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			msg := func(s, d, k int) []byte {
				n := []int{0, 1, 13, 4095, 9000}[k%5] // empty, tiny, odd, and longer than the 4 KiB ring
				b := payload(s, d, 2000+k, n)
				if n >= 4 {
					b[0], b[1] = byte(k), byte(k>>8)
				}
				return b
			}
			runAll(t, gs, func(r int, g *Group) error {
				m, p := pollerOf(t, g)
				errc := make(chan error, 4)
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
					in, err := recvPolled(ctx, p)
					if err != nil {
						return fmt.Errorf("rank %d: received %v of %d from each: %w", r, next, perSender, err)
					}
					if in.Body == nil {
						return fmt.Errorf("rank %d: peer %d reported lost: %v", r, in.From, m.Lost(in.From))
					}
					if want := msg(in.From, r, next[in.From]); !bytes.Equal(in.Body, want) {
						return fmt.Errorf("rank %d: message %d from %d: got %d bytes, want %d (out of order or corrupt)",
							r, next[in.From], in.From, len(in.Body), len(want))
					}
					next[in.From]++
				}
				for range 4 {
					if err := <-errc; err != nil {
						return err
					}
				}
				return nil
			})
		})
	}
}

func TestPollerSleepWakes(t *testing.T) {
	gs := openAll(t, testConfig(t, 2))
	_, p := pollerOf(t, gs[0])
	if _, ok, err := p.TryRecv(); ok || err != nil {
		t.Fatalf("TryRecv on an empty messenger: ok=%v err=%v", ok, err)
	}
	p.Wake() // nobody sleeps: must not block or leave a stale wake-up behind that matters

	sleep := func(ready func() bool) time.Duration {
		start := time.Now()
		p.Sleep(ready, 5*time.Second)
		return time.Since(start)
	}
	t.Run("timeout", func(t *testing.T) {
		// The Wake above, with nobody asleep, may make one Sleep return at once (returns may be
		// spurious); after that Sleep must block for its time, not return again and again.
		start := time.Now()
		returns := 0
		for time.Since(start) < 15*time.Millisecond {
			p.Sleep(func() bool { return false }, 20*time.Millisecond)
			returns++
		}
		if d := time.Since(start); returns > 2 || d > 2*time.Second {
			t.Fatalf("Sleep(20ms) returned %d times in %v", returns, d)
		}
	})
	t.Run("ready already", func(t *testing.T) {
		if d := sleep(func() bool { return true }); d > time.Second {
			t.Fatalf("Sleep with ready() true took %v", d)
		}
	})
	t.Run("wake", func(t *testing.T) {
		var flag atomic.Bool
		go func() {
			time.Sleep(20 * time.Millisecond)
			flag.Store(true) // the condition first, then Wake: the Poller's contract
			p.Wake()
		}()
		// Sleep may return for no reason (transport.Poller's contract): sleep again until the
		// flag is set, as a driver does; the Wake must end the wait well within the bound.
		start := time.Now()
		for !flag.Load() && time.Since(start) < 2*time.Second {
			sleep(flag.Load)
		}
		if d := time.Since(start); d > 2*time.Second || !flag.Load() {
			t.Fatalf("Sleep returned after %v with the flag %v", d, flag.Load())
		}
	})
	t.Run("message", func(t *testing.T) {
		go func() {
			time.Sleep(20 * time.Millisecond)
			gs[1].Messenger().SendMsg(context.Background(), 0, []byte("hello"))
		}()
		// As above, a return may be spurious (a Wake of the subtest before can land after its
		// Sleep already saw the flag): sleep again until the message is there.
		start := time.Now()
		for {
			m, ok, err := p.TryRecv()
			if err != nil || (ok && (m.From != 1 || string(m.Body) != "hello")) {
				t.Fatalf("TryRecv after the wake-up: %+v %v %v", m, ok, err)
			}
			if ok {
				break
			}
			if d := time.Since(start); d > 2*time.Second {
				t.Fatalf("no message %v after it was sent", d)
			}
			sleep(func() bool { return false })
		}
		if d := time.Since(start); d > 2*time.Second {
			t.Fatalf("Sleep did not return for a message (%v)", d)
		}
	})
}

// A peer that closes is reported after everything it sent, as through Inbox; and a closed
// messenger says so.
func TestPollerPeerLostAndClose(t *testing.T) {
	gs := openAll(t, testConfig(t, 2))
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	m0, p0 := pollerOf(t, gs[0])
	m1 := gs[1].Messenger()
	for k := range 3 {
		if err := m1.SendMsg(ctx, 0, []byte{byte(k)}); err != nil {
			t.Fatal(err)
		}
	}
	m1.Close()
	for k := range 3 {
		in, err := recvPolled(ctx, p0)
		if err != nil || in.From != 1 || !bytes.Equal(in.Body, []byte{byte(k)}) {
			t.Fatalf("message %d: got %+v, %v", k, in, err)
		}
	}
	in, err := recvPolled(ctx, p0)
	if err != nil || in.From != 1 || in.Body != nil {
		t.Fatalf("got %+v, %v; want the lost marker from rank 1", in, err)
	}
	var pe *transport.PeerError
	if err := m0.Lost(1); !errors.As(err, &pe) || pe.Rank != 1 {
		t.Fatalf("Lost(1) = %v", err)
	}
	if _, ok, err := p0.TryRecv(); ok || err != nil {
		t.Fatalf("after the lost marker: ok=%v err=%v, want nothing more", ok, err)
	}
	m0.Close()
	if _, _, err := p0.TryRecv(); !errors.Is(err, transport.ErrClosed) {
		t.Fatalf("TryRecv after Close: %v", err)
	}
	p0.Sleep(func() bool { return false }, 5*time.Second) // must return at once: nothing to sleep on
	p0.Wake()
	if _, ok := <-m0.Inbox(); ok {
		t.Fatal("inbox of a polled messenger not closed by Close")
	}
}

// The first of Inbox and TryRecv decides how a messenger is read; the other never sees a message.
func TestPollerAndInboxExclusive(t *testing.T) {
	gs := openAll(t, testConfig(t, 3))
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()

	// Rank 0 reads through Inbox: TryRecv refuses.
	inbox := gs[0].Messenger().Inbox()
	_, p0 := pollerOf(t, gs[0])
	if _, _, err := p0.TryRecv(); err == nil {
		t.Fatal("TryRecv on a messenger read through Inbox succeeded")
	}
	if err := gs[2].Messenger().SendMsg(ctx, 0, []byte("to inbox")); err != nil {
		t.Fatal(err)
	}
	if m := <-inbox; string(m.Body) != "to inbox" {
		t.Fatalf("inbox got %+v", m)
	}

	// Rank 1 is polled: its Inbox stays empty and the message goes to TryRecv.
	_, p1 := pollerOf(t, gs[1])
	if _, _, err := p1.TryRecv(); err != nil {
		t.Fatal(err)
	}
	inbox1 := gs[1].Messenger().Inbox()
	if err := gs[2].Messenger().SendMsg(ctx, 1, []byte("to poller")); err != nil {
		t.Fatal(err)
	}
	m, err := recvPolled(ctx, p1)
	if err != nil || string(m.Body) != "to poller" {
		t.Fatalf("TryRecv got %+v, %v", m, err)
	}
	select {
	case m := <-inbox1:
		t.Fatalf("the Inbox of a polled messenger delivered %+v", m)
	default:
	}
}

// Two polled ranks send each other messages many times longer than the ring at the same time, each
// from the goroutine that also reads (as the engine does): SendMsg drains what arrives while it
// waits for room, so neither waits on the other for ever.
func TestPollerLongMessagesCross(t *testing.T) {
	for _, spin := range []time.Duration{-1, 20 * time.Microsecond} {
		t.Run(fmt.Sprintf("spin=%v", spin), func(t *testing.T) {
			cfg := testConfig(t, 2) // 4 KiB message rings
			cfg.Spin = spin
			gs := openAll(t, cfg)
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			const long = 10*(4<<10) + 17
			runAll(t, gs, func(r int, g *Group) error {
				m, p := pollerOf(t, g)
				if _, _, err := p.TryRecv(); err != nil { // read by polling from now on
					return err
				}
				for k := range 3 {
					if err := m.SendMsg(ctx, 1-r, payload(r, 1-r, k, long)); err != nil {
						return fmt.Errorf("rank %d: send %d: %w", r, k, err)
					}
				}
				for k := range 3 {
					in, err := recvPolled(ctx, p)
					if err != nil {
						return fmt.Errorf("rank %d: receive %d: %w", r, k, err)
					}
					if in.From != 1-r || !bytes.Equal(in.Body, payload(1-r, r, k, long)) {
						return fmt.Errorf("rank %d: message %d: got %d bytes from %d", r, k, len(in.Body), in.From)
					}
				}
				return nil
			})
		})
	}
}

// Without a spin budget a wait yields its CPU up to yields times, polling after each, then gives up
// (to sleep); with none it polls once.
func TestSpinUntilYields(t *testing.T) {
	for _, tc := range []struct {
		yields, readyAt, wantPolls int
		want                       bool
	}{
		{yields: 5, readyAt: 3, wantPolls: 3, want: true},
		{yields: 2, readyAt: 4, wantPolls: 3, want: false},
		{yields: 0, readyAt: 2, wantPolls: 1, want: false},
	} {
		polls := 0
		got := spinUntil(func() bool { polls++; return polls >= tc.readyAt }, 0, tc.yields)
		if got != tc.want || polls != tc.wantPolls {
			t.Errorf("yields %d, ready at poll %d: got %v after %d polls, want %v after %d",
				tc.yields, tc.readyAt, got, polls, tc.want, tc.wantPolls)
		}
	}
}
