package worker

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kolo-dl/kolo/internal/engine"
	"github.com/kolo-dl/kolo/internal/jobenv"
	"github.com/kolo-dl/kolo/internal/rendezvous"
	"github.com/kolo-dl/kolo/internal/transport"
)

// elasticBed is a launcher's rendezvous with a client that publishes rounds, as kolo run's
// elastic mode does.
type elasticBed struct {
	t      *testing.T
	addr   string
	secret []byte
	pub    *rendezvous.Client
	mem    *Memory // the worker process's: every join of a test is the same process's
}

func newElasticBed(t *testing.T) *elasticBed {
	t.Helper()
	secret := []byte("elastic-test-secret")
	srv := rendezvous.NewServer(secret)
	addr, err := srv.Listen("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Close() })
	c, err := rendezvous.Dial(context.Background(), addr.String(), secret)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	mem := &Memory{}
	t.Cleanup(func() { mem.linger(nil) })
	return &elasticBed{t: t, addr: addr.String(), secret: secret, pub: c, mem: mem}
}

func (b *elasticBed) publish(r jobenv.Round) {
	b.t.Helper()
	ctx := context.Background()
	if err := b.pub.Set(ctx, jobenv.RoundKey(r.Number), r.Encode()); err != nil {
		b.t.Fatal(err)
	}
	if err := b.pub.Set(ctx, jobenv.LatestRoundKey, []byte(strconv.Itoa(r.Number))); err != nil {
		b.t.Fatal(err)
	}
}

func (b *elasticBed) env(host string, slot, round int) map[string]string {
	return map[string]string{jobenv.Elastic: "1", jobenv.ElasticHost: host, jobenv.ElasticSlot: strconv.Itoa(slot),
		jobenv.ElasticRound: strconv.Itoa(round), jobenv.ElasticTimeout: "5"}
}

func (b *elasticBed) base() jobenv.Job { return jobenv.Job{Rendezvous: b.addr, JobID: "job"} }

// roundOf lays out places one host after another, as the launcher's planner would.
func roundOf(n, gen int, places ...jobenv.Place) jobenv.Round {
	r := jobenv.Round{Number: n, Generation: gen}
	local := map[string]int{}
	for _, p := range places {
		local[p.Host]++
	}
	hosts := map[string]int{}
	seen := map[string]int{}
	for _, p := range places {
		if _, ok := hosts[p.Host]; !ok {
			hosts[p.Host] = len(hosts)
		}
	}
	for _, p := range places {
		r.Ranks = append(r.Ranks, jobenv.RoundRank{Place: p, LocalRank: seen[p.Host], LocalSize: local[p.Host],
			CrossRank: hosts[p.Host], CrossSize: len(hosts)})
		seen[p.Host]++
	}
	return r
}

func noConnect(context.Context, jobenv.Job) error { return nil }

func TestJoinElasticFindsItsPlace(t *testing.T) {
	b := newElasticBed(t)
	a0, a1, c0 := jobenv.Place{Host: "a", Slot: 0}, jobenv.Place{Host: "a", Slot: 1}, jobenv.Place{Host: "c", Slot: 0}
	b.publish(roundOf(1, 1, a0, a1, c0))
	var got jobenv.Job
	w, job, err := joinElastic(b.mem, b.env("a", 1, 1), b.base(), b.secret, func(_ context.Context, j jobenv.Job) error {
		got = j
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	defer w.close()
	want := jobenv.Job{Rank: 1, Size: 3, LocalRank: 1, LocalSize: 2, CrossRank: 0, CrossSize: 2, Hostname: "a", Rendezvous: b.addr, JobID: "job.r1"}
	if job != want || got != want {
		t.Fatalf("joined as %+v (connected %+v), want %+v", job, got, want)
	}
	if _, _, ok := w.update(); ok {
		t.Fatal("an update before any new round")
	}

	// The watcher reports a round that only removes workers, then one with a newcomer.
	b.publish(roundOf(2, 2, a0, a1))
	waitUpdate(t, w, 2, true)
	b.publish(roundOf(3, 3, a0, a1, jobenv.Place{Host: "d", Slot: 0}))
	waitUpdate(t, w, 3, false)
}

func waitUpdate(t *testing.T, w *elasticRound, newest int, removal bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		n, r, ok := w.update()
		if ok && n == newest {
			if r != removal {
				t.Fatalf("round %d: removal only %v, want %v", n, r, removal)
			}
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("no update to round %d within 5 s (have %d, %v)", newest, n, ok)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func TestJoinElasticRefusals(t *testing.T) {
	b := newElasticBed(t)
	b.publish(roundOf(1, 1, jobenv.Place{Host: "a", Slot: 0}))
	_, _, err := joinElastic(b.mem, b.env("b", 0, 1), b.base(), b.secret, noConnect)
	if err == nil || !strings.Contains(err.Error(), "round 1 has no rank for this worker") {
		t.Fatalf("a worker the round does not have: %v", err)
	}
	// A connection that fails for its own reasons is that error, not a wait for another round.
	_, _, err = joinElastic(b.mem, b.env("a", 0, 1), b.base(), b.secret, func(context.Context, jobenv.Job) error {
		return errors.New("shm: no space")
	})
	if err == nil || !strings.Contains(err.Error(), "join round 1 as rank 0 of 1: shm: no space") {
		t.Fatalf("a failed connect: %v", err)
	}
	b.publish(jobenv.Round{Number: 2, End: "below min-np: 1 slot available, --min-np 2; waited 5 s"})
	_, _, err = joinElastic(b.mem, b.env("a", 0, 2), b.base(), b.secret, noConnect)
	if !errors.Is(err, ErrElasticEnded) || !strings.Contains(err.Error(), "below min-np") {
		t.Fatalf("the job ended: %v", err)
	}

	// Nothing published for the round wanted: the elastic timeout, with what it waited for.
	env := b.env("a", 0, 7)
	env[jobenv.ElasticTimeout] = "0.2"
	start := time.Now()
	_, _, err = joinElastic(b.mem, env, b.base(), b.secret, noConnect)
	if err == nil || !strings.Contains(err.Error(), "for round 7") || time.Since(start) > 3*time.Second {
		t.Fatalf("after %v: %v", time.Since(start), err)
	}
}

// A round whose member died before joining never completes: the launcher publishes the next one,
// and the worker leaves the first and joins the second.
func TestJoinElasticMovesToANewerRound(t *testing.T) {
	b := newElasticBed(t)
	a0, b0 := jobenv.Place{Host: "a", Slot: 0}, jobenv.Place{Host: "b", Slot: 0}
	b.publish(roundOf(1, 1, a0, b0))
	var tried []string
	published := make(chan error, 1)
	go func() {
		time.Sleep(100 * time.Millisecond)
		r := roundOf(2, 2, a0)
		err := b.pub.Set(context.Background(), jobenv.RoundKey(2), r.Encode())
		if err == nil {
			err = b.pub.Set(context.Background(), jobenv.LatestRoundKey, []byte("2"))
		}
		published <- err
	}()
	defer func() {
		if err := <-published; err != nil {
			t.Errorf("publish round 2: %v", err)
		}
	}()
	w, job, err := joinElastic(b.mem, b.env("a", 0, 1), b.base(), b.secret, func(ctx context.Context, j jobenv.Job) error {
		tried = append(tried, j.JobID)
		if j.Size > 1 {
			<-ctx.Done() // b never comes
			return ctx.Err()
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	defer w.close()
	if job.Size != 1 || job.JobID != "job.r2" || strings.Join(tried, ",") != "job.r1,job.r2" {
		t.Fatalf("joined %+v after trying %v", job, tried)
	}
}

// A worker that leaves a round on an error asks for the next one, and joins it once published.
func TestJoinElasticAgainAsksForTheNextRound(t *testing.T) {
	b := newElasticBed(t)
	a0 := jobenv.Place{Host: "a", Slot: 0}
	b.publish(roundOf(1, 1, a0))
	w, _, err := joinElastic(b.mem, b.env("a", 0, 1), b.base(), b.secret, noConnect)
	if err != nil {
		t.Fatal(err)
	}
	w.close()
	joined := make(chan error, 1)
	var job jobenv.Job
	go func() {
		w, j, err := joinElastic(b.mem, b.env("a", 0, 1), b.base(), b.secret, noConnect)
		if err == nil {
			job = j
			w.close()
		}
		joined <- err
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := b.pub.Get(ctx, jobenv.ReinitKey(1, a0)); err != nil {
		t.Fatalf("the worker did not ask for a new round: %v", err)
	}
	select {
	case err := <-joined:
		t.Fatalf("joined before round 2 was published: %v", err)
	case <-time.After(50 * time.Millisecond):
	}
	b.publish(roundOf(2, 1, a0))
	if err := <-joined; err != nil || job.JobID != "job.r2" {
		t.Fatalf("second join: %+v, %v", job, err)
	}
}

// A worker whose engine stopped on a stuck peer names that peer's place when it asks for the
// next round; one that left for any other reason names nobody.
func TestJoinElasticNamesTheStuckPeer(t *testing.T) {
	b := newElasticBed(t)
	a0, c0 := jobenv.Place{Host: "a", Slot: 0}, jobenv.Place{Host: "c", Slot: 0}
	b.publish(roundOf(1, 1, a0, c0))
	w, _, err := joinElastic(b.mem, b.env("a", 0, 1), b.base(), b.secret, noConnect)
	if err != nil {
		t.Fatal(err)
	}
	w.leaving(fmt.Errorf("allreduce: %w", &engine.StuckError{Rank: 1, Reason: "rank 1 (c) made no progress for 1m0s"}))
	w.close()
	// The rejoin takes the suspects when it starts, so it must have finished before
	// the checks below set them again: under load it may start late.
	rejoined := make(chan struct{})
	go func() {
		defer close(rejoined)
		if w, _, err := joinElastic(b.mem, b.env("a", 0, 1), b.base(), b.secret, noConnect); err == nil {
			w.close()
		}
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	v, err := b.pub.Get(ctx, jobenv.ReinitKey(1, a0))
	if err != nil {
		t.Fatal(err)
	}
	if got, err := jobenv.DecodeReinit(v); err != nil || len(got) != 1 || got[0] != c0 {
		t.Fatalf("reinit record %q names %v (%v), want %v", v, got, err, c0)
	}
	b.publish(roundOf(2, 2, a0))
	select {
	case <-rejoined:
	case <-ctx.Done():
		t.Fatal("the rejoin did not finish after its round was published")
	}

	// A lost peer is named when its host agrees with the round's.
	w.leaving(fmt.Errorf("rank 0: %w", &transport.PeerError{Rank: 1, Host: "c", Op: "recv", Err: errors.New("timed out")}))
	b.mem.mu.Lock()
	named := b.mem.suspects
	b.mem.mu.Unlock()
	if len(named) != 1 || named[0] != c0 {
		t.Errorf("a lost peer on its host: named %v, want %v", named, c0)
	}
	for _, err := range []error{nil, errors.New("rank 1 on c lost during recv"), &engine.StuckError{Rank: 0, Reason: "itself"},
		&transport.PeerError{Rank: 1, Host: "a", Op: "recv", Err: errors.New("a host's own numbering")}} {
		w.leaving(err)
		b.mem.mu.Lock()
		named := b.mem.suspects
		b.mem.mu.Unlock()
		if named != nil {
			t.Errorf("leaving with %v names %v, want nobody", err, named)
		}
	}
}

// A worker leaving its round says so at the launcher's rendezvous (it does before it closes its
// connections, so that a peer naming it does not get it stopped as stuck): without an error as
// one that left, after an error as one that asks for the next round.
func TestLeavingTellsTheLauncher(t *testing.T) {
	for _, tc := range []struct {
		name string
		err  error
		key  func(n int, p jobenv.Place) string
		not  func(n int, p jobenv.Place) string
	}{
		{"no error", nil, jobenv.LeftKey, jobenv.ReinitKey},
		{"error", errors.New("rank 1 on c lost during recv"), jobenv.ReinitKey, jobenv.LeftKey},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := newElasticBed(t)
			a0, c0 := jobenv.Place{Host: "a", Slot: 0}, jobenv.Place{Host: "c", Slot: 0}
			b.publish(roundOf(1, 1, a0, c0))
			w, _, err := joinElastic(b.mem, b.env("a", 0, 1), b.base(), b.secret, noConnect)
			if err != nil {
				t.Fatal(err)
			}
			w.leaving(tc.err)
			w.close()
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			if _, ok, err := b.pub.TryGet(ctx, tc.key(1, a0)); err != nil || !ok {
				t.Errorf("no %s record (%v)", tc.key(1, a0), err)
			}
			if _, ok, err := b.pub.TryGet(ctx, tc.not(1, a0)); err != nil || ok {
				t.Errorf("a %s record (%v)", tc.not(1, a0), err)
			}
		})
	}
}

// A peer lost while a round forms fails this worker's connect before any newer round exists: the
// worker survives, asks for the next round naming nobody, and joins it once published.
func TestJoinElasticSurvivesAPeerLostWhileConnecting(t *testing.T) {
	b := newElasticBed(t)
	a0, b0 := jobenv.Place{Host: "a", Slot: 0}, jobenv.Place{Host: "b", Slot: 0}
	b.publish(roundOf(1, 1, a0, b0))
	type result struct {
		job jobenv.Job
		err error
	}
	joined := make(chan result, 1)
	go func() {
		w, j, err := joinElastic(b.mem, b.env("a", 0, 1), b.base(), b.secret, func(_ context.Context, j jobenv.Job) error {
			if j.Size > 1 {
				return &transport.PeerError{Rank: 1, Host: "b", Op: "connect", Err: errors.New("connection refused")}
			}
			return nil
		})
		if err == nil {
			w.close()
		}
		joined <- result{j, err}
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	v, err := b.pub.Get(ctx, jobenv.ReinitKey(1, a0))
	if err != nil {
		t.Fatalf("the worker did not ask for a new round: %v", err)
	}
	if names, err := jobenv.DecodeReinit(v); err != nil || len(names) != 0 {
		t.Fatalf("it named %v (%v); a peer lost while connecting is no suspect", names, err)
	}
	select {
	case r := <-joined:
		t.Fatalf("returned before round 2 was published: %+v", r)
	case <-time.After(50 * time.Millisecond):
	}
	b.publish(roundOf(2, 1, a0))
	if r := <-joined; r.err != nil || r.job.JobID != "job.r2" || r.job.Size != 1 {
		t.Fatalf("joined %+v, %v", r.job, r.err)
	}
}

// A worker whose round failed on a lost peer and whose next round never comes fails at the
// elastic timeout, saying both what it waited for and why it left the round before.
func TestJoinElasticGivesUpOnTheNextRoundSayingWhy(t *testing.T) {
	b := newElasticBed(t)
	a0, b0 := jobenv.Place{Host: "a", Slot: 0}, jobenv.Place{Host: "b", Slot: 0}
	b.publish(roundOf(1, 1, a0, b0))
	env := b.env("a", 0, 1)
	env[jobenv.ElasticTimeout] = "0.3"
	start := time.Now()
	_, _, err := joinElastic(b.mem, env, b.base(), b.secret, func(context.Context, jobenv.Job) error {
		return &transport.PeerError{Rank: 1, Host: "b", Op: "connect", Err: errors.New("connection refused")}
	})
	if err == nil || !strings.Contains(err.Error(), "for round 2") ||
		!strings.Contains(err.Error(), "join round 1 as rank 0 of 2: rank 1 on b lost during connect") || time.Since(start) > 3*time.Second {
		t.Fatalf("after %v: %v", time.Since(start), err)
	}
}
