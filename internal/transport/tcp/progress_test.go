package tcp

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kolo-dl/kolo/internal/transport"
)

// connectWith is connectAll with every rank's config adjusted by adjust.
func connectWith(t testing.TB, n, streams, chunk int, adjust func(*Config)) *world {
	t.Helper()
	w := newListeners(t, n)
	w.ms = make([]*Mesh, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for r := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			cfg := w.cfg(r, streams, chunk)
			adjust(&cfg)
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
	return w
}

func withProgress(d time.Duration) func(*Config) { return func(c *Config) { c.ProgressTimeout = d } }

// checkStall checks that err is a stall naming rank peer on its host, reported between limit and
// the watchdog's latest (limit plus two ticks) plus a margin.
func checkStall(t *testing.T, err error, peer int, op, detail string, waited, limit time.Duration) {
	t.Helper()
	var se *transport.StallError
	if !errors.As(err, &se) || !errors.Is(err, transport.ErrStalled) {
		t.Fatalf("err = %v, want a *transport.StallError", err)
	}
	host := []string{"node0", "node1", "node2"}[peer]
	if se.Rank != peer || se.Host != host || se.Op != op || se.For != limit || !strings.Contains(se.Detail, detail) {
		t.Errorf("stall %+v, want rank %d on %s, op %s, for %v, detail with %q", *se, peer, host, op, limit, detail)
	}
	// Not before the limit; after it, within the watchdog's ticks plus what a loaded machine
	// adds: a run beside other jobs on 2 CPUs took 1.1 s for a 400 ms limit, and a send under
	// `make test` 3.05 s, the sockets' buffers filling slowly and each byte they took restarting
	// the clock, as it should.
	if most := limit + 2*progressTick(limit) + 4*time.Second; waited < limit || waited > most {
		t.Errorf("failed after %v, want between %v and %v", waited, limit, most)
	}
}

// The watchdog's look at one direction, with a scripted clock: a call that moves restarts the
// clock, as does a new call or a tick that shows this process did not run; only limit without any
// of them interrupts the call.
func TestProgressTick(t *testing.T) {
	const limit = time.Second
	t0 := time.Unix(1000, 0)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	var d dir // no connections: setDeadline does nothing
	d.active, d.calls = true, 1
	d.tick(at(0), false, limit)
	d.tick(at(900), false, limit)
	if d.stalled {
		t.Fatal("stalled before the limit")
	}
	d.moved.Add(1) // a read returned bytes
	d.tick(at(1100), false, limit)
	d.tick(at(2000), false, limit)
	if d.stalled {
		t.Fatal("stalled although the call moved at 1.1 s")
	}
	d.tick(at(5000), true, limit) // this process was stopped from 2 s to 5 s
	d.tick(at(5900), false, limit)
	if d.stalled {
		t.Fatal("stalled for time this process did not run")
	}
	d.tick(at(6000), false, limit)
	if !d.stalled {
		t.Fatal("not stalled after 1 s without progress")
	}
	if why := d.end(); !why.stalled || d.active || d.stalled {
		t.Errorf("end = %+v, active %v, stalled %v", why, d.active, d.stalled)
	}
	d.tick(at(9000), false, limit) // no call running: nothing to interrupt
	if d.stalled {
		t.Error("an idle direction stalled")
	}
	for _, c := range []struct {
		gap, period time.Duration
		not         bool
	}{{time.Second, time.Second, false}, {5 * time.Second, time.Second, true}, {300 * time.Millisecond, 25 * time.Millisecond, false}, {time.Second, 25 * time.Millisecond, true}} {
		if got := transport.NotRunning(c.gap, c.period); got != c.not {
			t.Errorf("NotRunning(%v, %v) = %v", c.gap, c.period, got)
		}
	}
}

// A peer that stops sending midway through a message fails the receive after the timeout, naming
// it and its host; one that stops receiving fails a send once the sockets' buffers are full. The
// connections stay open (the control lane still carries messages) while the data lane refuses
// further calls.
func TestStalledPeer(t *testing.T) {
	const limit = 400 * time.Millisecond
	for _, streams := range []int{1, 3} {
		w := connectWith(t, 3, streams, 1024, withProgress(limit))
		ctx := context.Background()
		t.Run(map[int]string{1: "one stream", 3: "three streams"}[streams], func(t *testing.T) {
			if err := w.ms[1].Comm().Send(ctx, 0, make([]byte, 5000)); err != nil {
				t.Fatal(err)
			}
			start := time.Now()
			err := w.ms[0].Comm().Recv(ctx, 1, make([]byte, 20000))
			checkStall(t, err, 1, "recv", "5000 of 20000 bytes received", time.Since(start), limit)

			start = time.Now()
			err = w.ms[0].Comm().Send(ctx, 2, make([]byte, 256<<20)) // far beyond any socket buffer
			checkStall(t, err, 2, "send", "of 268435456 bytes sent", time.Since(start), limit)

			start = time.Now() // rank 2's send to rank 0 fits the buffers; rank 1 sends nothing
			err = w.ms[2].Comm().SendRecv(ctx, 0, make([]byte, 100), 1, make([]byte, 100))
			checkStall(t, err, 1, "recv", "0 of 100 bytes received", time.Since(start), limit)

			if err := w.ms[0].Comm().Recv(ctx, 1, make([]byte, 1)); err == nil || !strings.Contains(err.Error(), "out of step") {
				t.Errorf("a data lane left midway took another call: %v", err)
			}
			if err := w.ms[0].Messenger().SendMsg(ctx, 1, []byte("why")); err != nil {
				t.Errorf("control lane after a stall: %v", err)
			}
			if m := <-w.ms[1].Messenger().Inbox(); m.From != 0 || string(m.Body) != "why" {
				t.Errorf("got %+v", m)
			}
		})
	}
}

// A peer that pauses for most of the timeout, again and again, costs nothing: the transfer, which
// takes three times the timeout, completes intact, on both ends.
func TestPeerResumingBeforeDeadline(t *testing.T) {
	const limit = 400 * time.Millisecond
	w := connectWith(t, 2, 2, 1024, withProgress(limit))
	ctx := context.Background()
	msg := bytes.Repeat([]byte("kolo"), 4096)
	sent := make(chan error, 1)
	go func() {
		for i := range 4 {
			if i > 0 {
				time.Sleep(limit * 3 / 4)
			}
			if err := w.ms[1].Comm().Send(ctx, 0, msg[i*4096:(i+1)*4096]); err != nil {
				sent <- err
				return
			}
		}
		sent <- nil
	}()
	got := make([]byte, len(msg))
	start := time.Now()
	if err := w.ms[0].Comm().Recv(ctx, 1, got); err != nil {
		t.Fatalf("after %v: %v", time.Since(start), err)
	}
	if err := <-sent; err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, msg) {
		t.Error("received bytes differ")
	}
	if time.Since(start) < 2*limit {
		t.Errorf("the transfer took %v: the test did not outlast the timeout", time.Since(start))
	}
	// The streams are still in step: a round trip after it works.
	w.each(t, func(r int, c transport.Comm) error {
		b := []byte{0}
		if err := c.SendRecv(ctx, 1-r, []byte{byte(r)}, 1-r, b); err != nil {
			return err
		}
		if b[0] != byte(1-r) {
			return errors.New("wrong byte")
		}
		return nil
	})
}

// A negative ProgressTimeout turns the deadline off, and the watchdog with it.
func TestNoProgressTimeout(t *testing.T) {
	w := connectWith(t, 2, 2, ChunkSize, withProgress(-1))
	if w.ms[0].progress != 0 {
		t.Fatalf("progress %v", w.ms[0].progress)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	err := w.ms[0].Comm().Recv(ctx, 1, make([]byte, 10))
	if !errors.Is(err, context.DeadlineExceeded) || errors.Is(err, transport.ErrStalled) {
		t.Errorf("err = %v, want only the context's deadline", err)
	}
}
