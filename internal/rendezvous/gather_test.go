package rendezvous

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"
)

// gatherAll runs members [from, to) of an n-member Gather on key, each on its own client, and
// returns each member's table (nil where it failed) and error.
func gatherAll(ctx context.Context, clients []*Client, key string, n int, value func(i int) string) ([][][]byte, []error) {
	tables := make([][][]byte, len(clients))
	errs := make([]error, len(clients))
	var wg sync.WaitGroup
	for i, c := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			tables[i], errs[i] = c.Gather(ctx, key, n, i, []byte(value(i)))
		}()
	}
	wg.Wait()
	return tables, errs
}

func addrOf(i int) string { return fmt.Sprintf("10.0.%d.%d:4000|host%d", i/256, i%256, i) }

// Every member gets every member's value in member order from one request; the members' records
// and the whole table stay readable by key; a retry with the same value is answered again.
func TestGatherAcrossClients(t *testing.T) {
	s, addr, _ := startServer(t)
	const n = 5
	clients := make([]*Client, n)
	for i := range clients {
		clients[i] = dial(t, addr)
	}
	ctx := ctxT(t, 5*time.Second)
	before := s.Requests()
	tables, errs := gatherAll(ctx, clients, "world/j/rank", n, addrOf)
	for i := range n {
		if errs[i] != nil {
			t.Fatalf("member %d: %v", i, errs[i])
		}
		for j, v := range tables[i] {
			if string(v) != addrOf(j) {
				t.Fatalf("member %d's table[%d] = %q, want %q", i, j, v, addrOf(j))
			}
		}
	}
	if got := s.Requests() - before; got != n {
		t.Errorf("the gather cost %d requests, want %d (one per member)", got, n)
	}
	if v, err := clients[0].Get(ctx, "world/j/rank/3"); err != nil || string(v) != addrOf(3) {
		t.Errorf("Get of member 3's record = %q, %v", v, err)
	}
	raw, err := clients[0].Get(ctx, "world/j/rank")
	if err != nil {
		t.Fatal(err)
	}
	if vals, err := DecodeTable(raw, n); err != nil || string(vals[4]) != addrOf(4) {
		t.Errorf("the table under the gather key: %q, %v", vals, err)
	}
	again, err := clients[2].Gather(ctx, "world/j/rank", n, 2, []byte(addrOf(2)))
	if err != nil || len(again) != n || string(again[0]) != addrOf(0) {
		t.Errorf("a retried gather: %q, %v", again, err)
	}
	// The in-process Store answers the same way (the launcher's side).
	vals, err := s.Gather(ctx, "world/j/rank", n, 1, []byte(addrOf(1)))
	if err != nil || string(vals[1]) != addrOf(1) {
		t.Errorf("Store.Gather after the fact: %q, %v", vals, err)
	}
}

// The ways a careless or confused caller can get a gather wrong are errors naming the gather, and
// the members that did it right are not disturbed.
func TestGatherRefusesWhatCannotBeRight(t *testing.T) {
	s, addr, _ := startServer(t)
	c := dial(t, addr)
	ctx := ctxT(t, 5*time.Second)
	// Member 0 of 2 arrives and waits.
	first := make(chan error, 1)
	go func() {
		_, err := c.Gather(ctx, "g", 2, 0, []byte("a"))
		first <- err
	}()
	waitFor(t, func() bool { _, ok, _ := s.TryGet("g/0"); return ok })
	for _, tc := range []struct {
		name  string
		n, i  int
		value string
		want  string
	}{
		{"another member count", 3, 1, "b", "says 3 members, an earlier one said 2"},
		{"the same member with another value", 2, 0, "z", "arrived twice with different values"},
		{"index past the end", 2, 2, "b", "out of range"},
		{"negative index", 2, -1, "b", "out of range"},
		{"no members", 0, 0, "b", "out of range"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := c.Gather(ctx, "g", tc.n, tc.i, []byte(tc.value))
			if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), `"g"`) {
				t.Fatalf("err = %v, want one naming the gather and saying %q", err, tc.want)
			}
			// The server says the same to a raw request that skips the client's own checks.
			if tc.n >= 1 && tc.i >= 0 && tc.i < tc.n {
				return
			}
			_, _, _, _, err = s.gather("g", tc.n, tc.i, []byte(tc.value), func([]byte, error) {})
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("store: err = %v, want %q", err, tc.want)
			}
		})
	}
	vals, err := c.Gather(ctx, "g", 2, 1, []byte("b"))
	if err != nil || string(vals[0]) != "a" || string(vals[1]) != "b" {
		t.Fatalf("the last member: %q, %v", vals, err)
	}
	if err := <-first; err != nil {
		t.Fatalf("the first member: %v", err)
	}
}

// A member whose context ends while others are missing gets an error that says what it waited
// for; its parked request is withdrawn on the server, which goes on serving the gather.
func TestGatherTimesOutNamingTheWait(t *testing.T) {
	s, addr, _ := startServer(t)
	c := dial(t, addr)
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	_, err := c.Gather(ctx, "world/x/rank", 3, 0, []byte("a"))
	if !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), `for the 3 members of gather "world/x/rank"`) {
		t.Fatalf("err = %v", err)
	}
	waitFor(t, func() bool {
		s.Store.mu.Lock()
		defer s.Store.mu.Unlock()
		return len(s.Store.waiters["world/x/rank"]) == 0
	})
	ctx = ctxT(t, 5*time.Second)
	for i := 1; i < 3; i++ {
		go s.Gather(ctx, "world/x/rank", 3, i, []byte{byte('a' + i)})
	}
	vals, err := c.Gather(ctx, "world/x/rank", 3, 0, []byte("a"))
	if err != nil || string(vals[2]) != "c" {
		t.Fatalf("after the timeout: %q, %v", vals, err)
	}
	// Closing the store fails a parked gather with ErrClosed rather than leaving it parked.
	done := make(chan error, 1)
	go func() { _, err := c.Gather(ctx, "world/y/rank", 2, 0, []byte("a")); done <- err }()
	waitFor(t, func() bool { _, ok, _ := s.TryGet("world/y/rank/0"); return ok })
	s.Close()
	select {
	case err := <-done:
		if err == nil {
			t.Fatal("a gather parked on a closed server succeeded")
		}
	case <-time.After(5 * time.Second):
		t.Fatal("a gather parked on a closed server still waits after 5 s")
	}
}

// 1,024 ranks of one job join at once, each with its own authenticated connection, and each sends
// one request for the whole address table: the server answers them all, without errors, in
// bounded time (the scaling table in docs/benchmarks.md gives the time measured here). Under the
// race detector, which slows every goroutine tenfold, 256 ranks check the same code for races.
func TestGatherOf1024RanksAtOnce(t *testing.T) {
	if testing.Short() {
		t.Skip("1,024 connections")
	}
	n := 1024
	if raceEnabled {
		n = 256
	}
	// The production handshake deadline, not the tests' short one: with a thousand handshakes
	// at once on a loaded machine some take longer than 300 ms.
	sink := &logSink{}
	s := newServer(secret, slog.New(sink), HandshakeTimeout)
	la, err := s.Listen("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	addr := la.String()
	start := time.Now()
	ctx := ctxT(t, 60*time.Second)
	clients := make([]*Client, n)
	errs := make([]error, n)
	tables := make([][][]byte, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c, err := Dial(ctx, addr, secret)
			if err != nil {
				errs[i] = err
				return
			}
			clients[i] = c
			tables[i], errs[i] = c.Gather(ctx, "world/big/rank", n, i, []byte(addrOf(i)))
		}()
	}
	wg.Wait()
	took := time.Since(start)
	for _, c := range clients {
		if c != nil {
			c.Close()
		}
	}
	// Every rank's failure, not only the first: rank 0 waiting for the members is what the
	// others' failures look like from rank 0.
	var failed []string
	for i, err := range errs {
		if err != nil {
			failed = append(failed, fmt.Sprintf("rank %d: %v", i, err))
		}
	}
	if len(failed) > 0 {
		t.Fatalf("%d of %d ranks failed (requests %d, connections rejected %d):\n%s", len(failed), n, s.Requests(),
			len(sink.warnings("rendezvous: rejected connection")), strings.Join(failed[:min(len(failed), 12)], "\n"))
	}
	for i := range errs {
		if len(tables[i]) != n || string(tables[i][n-1]) != addrOf(n-1) || string(tables[i][i]) != addrOf(i) {
			t.Fatalf("rank %d got a wrong table", i)
		}
	}
	if got := s.Requests(); got != int64(n) {
		t.Errorf("%d requests for %d ranks, want one each", got, n)
	}
	// A handshake the server timed out is dialled again (TestDialWaitsForTheServersAcceptance):
	// it costs time, not a rank, so it is counted, not failed.
	rejected := len(sink.warnings("rendezvous: rejected connection"))
	t.Logf("%d ranks: dial, authenticate and gather the address table in %v (%d requests, %d handshakes timed out and redialled)",
		n, took.Round(time.Millisecond), s.Requests(), rejected)
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not met within 5 s")
		}
		time.Sleep(5 * time.Millisecond)
	}
}
