package launch

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/kolo-dl/kolo/internal/jobenv"
	"github.com/kolo-dl/kolo/internal/launch/flags"
	"github.com/kolo-dl/kolo/internal/launch/proc"
	"github.com/kolo-dl/kolo/internal/rendezvous"
	"github.com/kolo-dl/kolo/testbed/proctest"
)

// fakeWorker is a process the test ends: exit(code), or a signal the launcher sends (SIGTERM
// unless it ignores it, SIGKILL always). Its stdout and stderr are pipes the test writes to.
type fakeWorker struct {
	place string
	env   map[string]string

	outR, errR *io.PipeReader
	outW, errW *io.PipeWriter
	exitc      chan proc.Exit

	ended       atomic.Bool
	prevRunning bool // started while the worker before it at its place had not ended

	mu         sync.Mutex
	signals    []syscall.Signal
	ignoreTerm bool
	// killTakes is how long a SIGKILL takes to end it: a worker behind a cut link, whose ssh
	// client the starter kills only after a while.
	killTakes time.Duration
}

func (p *fakeWorker) Stdout() io.Reader { return p.outR }
func (p *fakeWorker) Stderr() io.Reader { return p.errR }

func (p *fakeWorker) Wait() proc.Exit {
	e := <-p.exitc
	p.outW.Close()
	p.errW.Close()
	return e
}

func (p *fakeWorker) Signal(sig syscall.Signal) error {
	p.mu.Lock()
	p.signals = append(p.signals, sig)
	ignore := p.ignoreTerm && sig == syscall.SIGTERM
	takes := p.killTakes
	p.mu.Unlock()
	if sig == syscall.SIGKILL && takes > 0 {
		time.AfterFunc(takes, func() { p.end(proc.Exit{Code: -1, Signal: sig}) })
		return nil
	}
	if !ignore {
		p.end(proc.Exit{Code: -1, Signal: sig})
	}
	return nil
}

// end makes the process exit; the first end wins. ended is set before the exit is delivered: a
// launcher that has collected the exit (and a test that then looks) must see it set.
func (p *fakeWorker) end(e proc.Exit) {
	if p.ended.CompareAndSwap(false, true) {
		p.exitc <- e // buffered for the one exit
	}
}

func (p *fakeWorker) exit(code int) { p.end(proc.Exit{Code: code}) }

func (p *fakeWorker) signalled() []syscall.Signal {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]syscall.Signal(nil), p.signals...)
}

func (p *fakeWorker) ignoreSIGTERM() {
	p.mu.Lock()
	p.ignoreTerm = true
	p.mu.Unlock()
}

// fakeElasticStarter starts fakeWorkers and keeps them by place ("host[slot]"), in start order.
type fakeElasticStarter struct {
	mu    sync.Mutex
	procs map[string][]*fakeWorker
}

func (f *fakeElasticStarter) Start(_ context.Context, w proc.Worker) (proc.Process, error) {
	env := jobenv.FromEnviron(w.Env)
	place := env[jobenv.ElasticHost] + "[" + env[jobenv.ElasticSlot] + "]"
	if env[jobenv.Elastic] != "1" {
		place = "rank." + env[jobenv.Rank] // a static job's worker
	}
	p := &fakeWorker{place: place, env: env, exitc: make(chan proc.Exit, 1)}
	p.outR, p.outW = io.Pipe()
	p.errR, p.errW = io.Pipe()
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.procs == nil {
		f.procs = map[string][]*fakeWorker{}
	}
	if prev := f.procs[p.place]; len(prev) > 0 {
		p.prevRunning = !prev[len(prev)-1].ended.Load()
	}
	f.procs[p.place] = append(f.procs[p.place], p)
	return p, nil
}

func (f *fakeElasticStarter) starts(place string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.procs[place])
}

func (f *fakeElasticStarter) total() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	n := 0
	for _, ps := range f.procs {
		n += len(ps)
	}
	return n
}

// elasticHarness runs runElastic with a fake starter and reads what it publishes.
type elasticHarness struct {
	t      *testing.T
	fake   *fakeElasticStarter
	cancel context.CancelFunc
	stdout proctest.Buffer
	stderr proctest.Buffer
	done   chan struct{}
	code   int
	err    error

	rvOnce sync.Once
	rv     *rendezvous.Client
}

// testElasticSettings are timings short enough for tests that still leave the loop room.
func testElasticSettings() elasticSettings {
	return elasticSettings{
		discoverEvery: 20 * time.Millisecond,
		tick:          10 * time.Millisecond,
		batch:         30 * time.Millisecond,
		reinitGrace:   300 * time.Millisecond,
		stopGrace:     300 * time.Millisecond,
		streamWait:    500 * time.Millisecond,
	}
}

func startElastic(t *testing.T, set elasticSettings, args ...string) *elasticHarness {
	t.Helper()
	opts, err := flags.Parse(append(args, "prog"), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	h := &elasticHarness{t: t, fake: &fakeElasticStarter{}, done: make(chan struct{})}
	set.starter = h.fake
	ctx, cancel := context.WithCancel(context.Background())
	h.cancel = cancel
	go func() {
		defer close(h.done)
		h.code, h.err = runElastic(ctx, opts, set, &h.stdout, &h.stderr)
	}()
	t.Cleanup(func() {
		cancel()
		select {
		case <-h.done:
		case <-time.After(10 * time.Second):
			t.Error("runElastic did not return after its context was cancelled")
		}
		if h.rv != nil {
			h.rv.Close()
		}
		if t.Failed() {
			t.Logf("launcher stderr:\n%s", h.stderr.String())
		}
	})
	return h
}

// worker returns the i-th worker started at place (0: the first), waiting for it.
func (h *elasticHarness) worker(place string, i int) *fakeWorker {
	h.t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		h.fake.mu.Lock()
		ps := h.fake.procs[place]
		h.fake.mu.Unlock()
		if len(ps) > i {
			return ps[i]
		}
		if time.Now().After(deadline) {
			h.t.Fatalf("no start #%d of %s after 5 s", i+1, place)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// client dials the launcher's rendezvous as the worker at place would.
func (h *elasticHarness) client(place string) *rendezvous.Client {
	h.t.Helper()
	h.rvOnce.Do(func() {
		env := h.worker(place, 0).env
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		rv, err := rendezvous.Dial(ctx, env[jobenv.Rendezvous], []byte(env[jobenv.Secret]))
		if err != nil {
			h.t.Fatal(err)
		}
		h.rv = rv
	})
	return h.rv
}

// round waits for round n.
func (h *elasticHarness) round(place string, n int) jobenv.Round {
	h.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	b, err := h.client(place).Get(ctx, jobenv.RoundKey(n))
	if err != nil {
		h.t.Fatalf("round %d: %v", n, err)
	}
	r, err := jobenv.DecodeRound(b)
	if err != nil {
		h.t.Fatal(err)
	}
	return r
}

func (h *elasticHarness) latest(place string) string {
	h.t.Helper()
	b, _, err := h.client(place).TryGet(context.Background(), jobenv.LatestRoundKey)
	if err != nil {
		h.t.Fatal(err)
	}
	return string(b)
}

// ask sets the reinit request of place for round n, as its worker would.
func (h *elasticHarness) ask(n int, host string, slot int, suspects ...jobenv.Place) {
	h.t.Helper()
	key := jobenv.ReinitKey(n, jobenv.Place{Host: host, Slot: slot})
	value := []byte("1") // what a worker that names nobody set before suspects existed
	if len(suspects) > 0 {
		value = jobenv.EncodeReinit(suspects)
	}
	if err := h.client(host+"["+fmt.Sprint(slot)+"]").Set(context.Background(), key, value); err != nil {
		h.t.Fatal(err)
	}
}

// leave sets the record of place that it left round n without an error, as its worker does
// before it closes its connections.
func (h *elasticHarness) leave(n int, host string, slot int) {
	h.t.Helper()
	key := jobenv.LeftKey(n, jobenv.Place{Host: host, Slot: slot})
	if err := h.client(host+"["+fmt.Sprint(slot)+"]").Set(context.Background(), key, []byte("1")); err != nil {
		h.t.Fatal(err)
	}
}

// logged reports whether the launcher's stderr has want, waiting up to 5 s for it: the launcher
// logs a round after publishing it, so a test that has seen the round may look before the line.
func (h *elasticHarness) logged(want string) bool {
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		if strings.Contains(h.stderr.String(), want) {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
	}
}

func (h *elasticHarness) wait() int {
	h.t.Helper()
	select {
	case <-h.done:
		return h.code
	case <-time.After(10 * time.Second):
		h.t.Fatal("runElastic did not return within 10 s")
	}
	return 0
}

// places lists a round's places in rank order.
func places(r jobenv.Round) string {
	s := make([]string, len(r.Ranks))
	for i, k := range r.Ranks {
		s[i] = k.Place.String()
	}
	return strings.Join(s, " ")
}

func wantSignals(t *testing.T, p *fakeWorker, want ...syscall.Signal) {
	t.Helper()
	got := p.signalled()
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("%s got signals %v, want %v", p.place, got, want)
	}
}

// awaitSignals is wantSignals for a worker stopped without waiting (its order may still be on its
// way to the node that runs it): it waits up to 5 s for the signals to arrive.
func awaitSignals(t *testing.T, p *fakeWorker, want ...syscall.Signal) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for fmt.Sprint(p.signalled()) != fmt.Sprint(want) && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	wantSignals(t, p, want...)
}

func TestElasticFirstRoundAndSuccess(t *testing.T) {
	t.Setenv("KOLO_ELASTIC_TIMEOUT", "")
	t.Setenv("HOROVOD_ELASTIC_TIMEOUT", "")
	outDir := t.TempDir()
	h := startElastic(t, testElasticSettings(), "-np", "3", "--min-np", "2", "--max-np", "3", "-H", "localhost:2,127.0.0.1:2", "--elastic-timeout", "42",
		"--output-filename", outDir)
	r := h.round("localhost[0]", 1)
	want := jobenv.Round{Number: 1, Generation: 1, Ranks: []jobenv.RoundRank{
		{Place: jobenv.Place{Host: "localhost", Slot: 0}, LocalRank: 0, LocalSize: 2, CrossRank: 0, CrossSize: 2},
		{Place: jobenv.Place{Host: "localhost", Slot: 1}, LocalRank: 1, LocalSize: 2, CrossRank: 0, CrossSize: 1},
		{Place: jobenv.Place{Host: "127.0.0.1", Slot: 0}, LocalRank: 0, LocalSize: 1, CrossRank: 1, CrossSize: 2},
	}}
	if fmt.Sprint(r) != fmt.Sprint(want) {
		t.Fatalf("round 1 = %+v\nwant      %+v", r, want)
	}
	if got := h.latest("localhost[0]"); got != "1" {
		t.Errorf("latest round %q, want 1", got)
	}
	var jobID string
	for i, place := range []string{"localhost[0]", "localhost[1]", "127.0.0.1[0]"} {
		env := h.worker(place, 0).env
		k := want.Ranks[i]
		wantEnv := map[string]string{
			jobenv.Rank: fmt.Sprint(i), jobenv.Size: "3", jobenv.LocalRank: fmt.Sprint(k.LocalRank),
			jobenv.LocalSize: fmt.Sprint(k.LocalSize), jobenv.CrossRank: fmt.Sprint(k.CrossRank),
			jobenv.CrossSize: fmt.Sprint(k.CrossSize), jobenv.Hostname: k.Host,
			"HOROVOD_RANK": fmt.Sprint(i), "HOROVOD_SIZE": "3",
			jobenv.Elastic: "1", jobenv.ElasticHost: k.Host, jobenv.ElasticSlot: fmt.Sprint(k.Slot),
			jobenv.ElasticRound: "1", jobenv.ElasticTimeout: "42",
		}
		for name, v := range wantEnv {
			if env[name] != v {
				t.Errorf("%s: %s=%q, want %q", place, name, env[name], v)
			}
		}
		if jobID == "" {
			jobID = env[jobenv.JobID]
		}
		if env[jobenv.JobID] != jobID || jobID == "" || env[jobenv.Secret] == "" {
			t.Errorf("%s: job id %q (first %q), secret set %v", place, env[jobenv.JobID], jobID, env[jobenv.Secret] != "")
		}
		if got, round, ok, err := jobenv.ElasticPlace(env); !ok || err != nil || got != k.Place || round != 1 {
			t.Errorf("%s: jobenv.ElasticPlace = %v, round %d, %v, %v", place, got, round, ok, err)
		}
	}

	p := h.worker("localhost[1]", 0)
	io.WriteString(p.outW, "hello\n")
	io.WriteString(p.errW, "careful\n")
	for _, place := range []string{"localhost[0]", "localhost[1]", "127.0.0.1[0]"} {
		h.worker(place, 0).exit(0)
	}
	if code := h.wait(); code != 0 || h.err != nil {
		t.Fatalf("exit %d, %v; want 0", code, h.err)
	}
	if !strings.Contains(h.stdout.String(), "[localhost[1]]<stdout>:hello\n") || !h.logged("[localhost[1]]<stderr>:careful\n") {
		t.Errorf("output not prefixed by place:\nstdout %q\nstderr %q", h.stdout.String(), h.stderr.String())
	}
	if b, err := os.ReadFile(filepath.Join(outDir, "localhost[1]", "stdout")); err != nil || string(b) != "hello\n" {
		t.Errorf("--output-filename's file of localhost[1]: %q, %v", b, err)
	}
	for _, want := range []string{"kolo run: elastic: round 1: generation 1: 3 ranks on 2 hosts", "every worker of round 1 exited 0"} {
		if !h.logged(want) {
			t.Errorf("stderr lacks %q", want)
		}
	}
	if n := h.fake.total(); n != 3 {
		t.Errorf("%d starts, want 3", n)
	}
}

// A failed worker blacklists its host: the new round does without both of its workers, the other
// one stopped; the survivors are not restarted and only learn their new ranks from the round.
func TestElasticFailureDropsItsHost(t *testing.T) {
	h := startElastic(t, testElasticSettings(), "-np", "4", "--min-np", "2", "-H", "localhost:2,127.0.0.1:2")
	h.round("localhost[0]", 1)
	bad := h.worker("localhost[1]", 0)
	io.WriteString(bad.errW, "RuntimeError: CUDA error\n")
	bad.exit(3)
	r := h.round("localhost[0]", 2)
	if got := places(r); got != "127.0.0.1[0] 127.0.0.1[1]" || r.Generation != 2 {
		t.Fatalf("round 2: generation %d, places %s; want generation 2 on 127.0.0.1[0] 127.0.0.1[1]", r.Generation, got)
	}
	wantSignals(t, h.worker("localhost[0]", 0), syscall.SIGTERM)
	wantSignals(t, bad)
	for _, place := range []string{"127.0.0.1[0]", "127.0.0.1[1]"} {
		wantSignals(t, h.worker(place, 0))
		if n := h.fake.starts(place); n != 1 {
			t.Errorf("%s started %d times, want 1 (survivors are never restarted)", place, n)
		}
	}
	if n := h.fake.total(); n != 4 {
		t.Errorf("%d starts, want 4", n)
	}
	h.worker("127.0.0.1[0]", 0).exit(0)
	h.worker("127.0.0.1[1]", 0).exit(0)
	if code := h.wait(); code != 0 {
		t.Fatalf("exit %d, want 0", code)
	}
	for _, want := range []string{"localhost[1] (started for round 1 as rank 1) exited with code 3",
		"round 2: generation 2 (reset 1): lost localhost[0] (host blacklisted), localhost[1] (failed); 2 ranks on 1 host"} {
		if !h.logged(want) {
			t.Errorf("stderr lacks %q:\n%s", want, h.stderr.String())
		}
	}
}

// Below --min-np the job waits, then fails at the elastic timeout: the end record tells workers
// waiting at the rendezvous why, the survivor is stopped, the summary names the failed worker.
func TestElasticBelowMinNPFailsAtTimeout(t *testing.T) {
	h := startElastic(t, testElasticSettings(), "-np", "2", "--min-np", "2", "-H", "localhost:1,127.0.0.1:1", "--elastic-timeout", "0.3")
	h.round("localhost[0]", 1)
	survivor := h.worker("127.0.0.1[0]", 0)
	survivor.ignoreSIGTERM() // keeps the launcher up the grace period: time to read the end record
	end := make(chan jobenv.Round, 1)
	go func() { end <- h.round("localhost[0]", 2) }()
	bad := h.worker("localhost[0]", 0)
	io.WriteString(bad.errW, "ValueError: bad batch\n")
	start := time.Now()
	bad.exit(3)
	r := <-end
	if r.End == "" || !strings.Contains(r.End, "below min-np") {
		t.Errorf("round 2 = %+v, want an end record saying below min-np", r)
	}
	if code := h.wait(); code != 1 {
		t.Errorf("exit %d, want 1", code)
	}
	if took := time.Since(start); took < 300*time.Millisecond {
		t.Errorf("failed after %v, before the 0.3 s timeout", took)
	}
	wantSignals(t, survivor, syscall.SIGTERM, syscall.SIGKILL)
	for _, want := range []string{"waiting: below min-np: 1 slot available on 1 host, --min-np 2",
		"kolo run: elastic: the job failed: below min-np", "localhost[0] (rank 0 of round 1) exited with code 3",
		"Last lines of localhost[0]'s stderr:\n    ValueError: bad batch", "Other workers: 127.0.0.1[0]: stopped by the launcher (killed by signal 9"} {
		if !h.logged(want) {
			t.Errorf("stderr lacks %q:\n%s", want, h.stderr.String())
		}
	}
}

// When every rank of a generation fails at once, the launcher exits with their code.
func TestElasticAllFailedExitsWithTheirCode(t *testing.T) {
	h := startElastic(t, testElasticSettings(), "-np", "2", "--min-np", "1", "-H", "localhost:1,127.0.0.1:1")
	h.round("localhost[0]", 1)
	h.worker("localhost[0]", 0).exit(5)
	h.worker("127.0.0.1[0]", 0).exit(5)
	if code := h.wait(); code != 5 {
		t.Errorf("exit %d, want 5:\n%s", code, h.stderr.String())
	}
	if !h.logged("all ranks failed") {
		t.Errorf("stderr lacks the reason:\n%s", h.stderr.String())
	}
}

// writeHosts replaces the listing the discovery script prints, atomically.
func writeHosts(t *testing.T, path, hosts string) {
	t.Helper()
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(hosts), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

func TestElasticDiscoveryAddsAndRemovesHosts(t *testing.T) {
	dir := t.TempDir()
	hosts := filepath.Join(dir, "hosts")
	writeHosts(t, hosts, "localhost:1\n")
	script := filepath.Join(dir, "discover.sh")
	if err := os.WriteFile(script, []byte("#!/bin/sh\ncat "+hosts+"\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	h := startElastic(t, testElasticSettings(), "-np", "1", "--min-np", "1", "--max-np", "4", "--host-discovery-script", script)
	if r := h.round("localhost[0]", 1); places(r) != "localhost[0]" {
		t.Fatalf("round 1 on %s", places(r))
	}
	first := h.worker("localhost[0]", 0)

	writeHosts(t, hosts, "localhost:1\n127.0.0.1:2\n")
	r := h.round("localhost[0]", 2)
	if places(r) != "localhost[0] 127.0.0.1[0] 127.0.0.1[1]" || r.Generation != 2 {
		t.Fatalf("round 2: generation %d on %s", r.Generation, places(r))
	}
	newcomer := h.worker("127.0.0.1[1]", 0)
	if newcomer.env[jobenv.ElasticRound] != "2" || newcomer.env[jobenv.Rank] != "2" || newcomer.env[jobenv.Size] != "3" {
		t.Errorf("newcomer's env: round %s rank %s size %s, want 2, 2, 3", newcomer.env[jobenv.ElasticRound], newcomer.env[jobenv.Rank], newcomer.env[jobenv.Size])
	}
	wantSignals(t, first)
	if n := h.fake.starts("localhost[0]"); n != 1 {
		t.Errorf("the survivor started %d times, want 1", n)
	}

	writeHosts(t, hosts, "127.0.0.1:2\n")
	r = h.round("localhost[0]", 3)
	if places(r) != "127.0.0.1[0] 127.0.0.1[1]" || r.Generation != 3 {
		t.Fatalf("round 3: generation %d on %s", r.Generation, places(r))
	}
	wantSignals(t, first, syscall.SIGTERM)
	wantSignals(t, newcomer)
	if n := h.fake.total(); n != 3 {
		t.Errorf("%d starts, want 3", n)
	}
	if !h.logged("lost localhost[0] (host left discovery)") {
		t.Errorf("stderr lacks the removal:\n%s", h.stderr.String())
	}
}

// A host back from its blacklist cooldown gets a new worker at the place whose worker failed.
func TestElasticHostBackFromCooldown(t *testing.T) {
	h := startElastic(t, testElasticSettings(), "-np", "2", "--min-np", "1", "-H", "localhost:1,127.0.0.1:1", "--blacklist-cooldown-range", "1", "1")
	h.round("localhost[0]", 1)
	h.worker("localhost[0]", 0).exit(2)
	if r := h.round("localhost[0]", 2); places(r) != "127.0.0.1[0]" {
		t.Fatalf("round 2 on %s, want 127.0.0.1[0]", places(r))
	}
	r := h.round("localhost[0]", 3) // a second later
	if places(r) != "127.0.0.1[0] localhost[0]" || r.Generation != 3 {
		t.Fatalf("round 3: generation %d on %s, want 3 on 127.0.0.1[0] localhost[0]", r.Generation, places(r))
	}
	again := h.worker("localhost[0]", 1)
	if again.env[jobenv.ElasticRound] != "3" || again.env[jobenv.Rank] != "1" {
		t.Errorf("restarted worker: round %s rank %s, want 3 and 1", again.env[jobenv.ElasticRound], again.env[jobenv.Rank])
	}
	if n := h.fake.starts("127.0.0.1[0]"); n != 1 {
		t.Errorf("the survivor started %d times, want 1", n)
	}
	wantSignals(t, h.worker("127.0.0.1[0]", 0))
}

// A place can be lost and restarted in one reset: the job waits short of slots while the other
// worker of a blacklisted host idles, then the host's cooldown ends. The old worker must have
// ended before the new one starts at its place, or it would join the new round as that place.
func TestElasticStopsBeforeItStartsAtThePlace(t *testing.T) {
	h := startElastic(t, testElasticSettings(), "-np", "3", "--min-np", "3", "-H", "localhost:2,127.0.0.1:1",
		"--blacklist-cooldown-range", "1", "1", "--elastic-timeout", "10")
	h.round("localhost[0]", 1)
	idle := h.worker("localhost[1]", 0)
	idle.ignoreSIGTERM()
	h.worker("localhost[0]", 0).exit(1)
	r := h.round("localhost[0]", 2)
	if places(r) != "127.0.0.1[0] localhost[0] localhost[1]" {
		t.Fatalf("round 2 on %s", places(r))
	}
	if h.worker("localhost[1]", 1).prevRunning {
		t.Error("a new worker started at localhost[1] while the old one still ran")
	}
	wantSignals(t, idle, syscall.SIGTERM, syscall.SIGKILL)
	wantSignals(t, h.worker("127.0.0.1[0]", 0))
	if !h.logged("waiting: below min-np") {
		t.Errorf("stderr lacks the wait:\n%s", h.stderr.String())
	}
}

// A discovery script that fails on its first run fails the job: a misconfiguration.
// The survivors finish training in round 1 while a host that joined waits in round 2, which can
// no longer form: the launcher stops the newcomer (no failure) and the job succeeds.
func TestElasticFinishStopsWorkersOfALaterRound(t *testing.T) {
	dir := t.TempDir()
	hosts := filepath.Join(dir, "hosts")
	writeHosts(t, hosts, "localhost:1\n")
	script := filepath.Join(dir, "discover.sh")
	if err := os.WriteFile(script, []byte("#!/bin/sh\ncat "+hosts+"\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	h := startElastic(t, testElasticSettings(), "-np", "1", "--min-np", "1", "--host-discovery-script", script)
	h.round("localhost[0]", 1)
	survivor := jobenv.Place{Host: "localhost", Slot: 0}
	if err := h.client("localhost[0]").Set(context.Background(), jobenv.JoinedKey(1, survivor), []byte("1")); err != nil {
		t.Fatal(err)
	}
	writeHosts(t, hosts, "localhost:1\n127.0.0.1:1\n")
	h.round("localhost[0]", 2)
	newcomer := h.worker("127.0.0.1[0]", 0)
	h.worker("localhost[0]", 0).exit(0) // finished in round 1, never in round 2
	if code := h.wait(); code != 0 {
		t.Fatalf("exit %d, want 0\n%s", code, h.stderr.String())
	}
	wantSignals(t, newcomer, syscall.SIGTERM)
	if !h.logged("training finished in round 1; 127.0.0.1[0], started for a later round, stopped") {
		t.Errorf("stderr lacks the finish:\n%s", h.stderr.String())
	}
}

func TestElasticDiscoveryFailsFirst(t *testing.T) {
	h := startElastic(t, testElasticSettings(), "--min-np", "1", "--host-discovery-script", "echo no hosts here >&2; exit 4")
	if code := h.wait(); code != 1 {
		t.Errorf("exit %d, want 1", code)
	}
	if !h.logged("host discovery failed on its first run") || !h.logged("no hosts here") {
		t.Errorf("stderr lacks the reason:\n%s", h.stderr.String())
	}
}

func TestRunDiscoveryScript(t *testing.T) {
	ctx := context.Background()
	hosts, err := RunDiscoveryScript(ctx, "printf 'a:2\\nb\\n'", time.Second, 3)
	if err != nil || fmt.Sprint(hosts) != "[a:2 b:3]" {
		t.Errorf("hosts %v, %v", hosts, err)
	}
	start := time.Now()
	_, err = RunDiscoveryScript(ctx, "sleep 30 & sleep 30", 200*time.Millisecond, 1)
	if err == nil || !strings.Contains(err.Error(), "did not finish within 200ms") || time.Since(start) > 3*time.Second {
		t.Errorf("slow script: %v after %v", err, time.Since(start))
	}
	if _, err := RunDiscoveryScript(ctx, "echo 'Traceback (most recent call last):'", time.Second, 1); err == nil || !strings.Contains(err.Error(), "line 1") {
		t.Errorf("garbage: %v", err)
	}
}

// Every worker of the round asks for a re-forming after an error that killed nobody: the same
// workers meet again in a new round, of the same generation; nobody is started or stopped.
func TestElasticReinitReformsTheRound(t *testing.T) {
	h := startElastic(t, testElasticSettings(), "-np", "2", "-H", "localhost:1,127.0.0.1:1", "--min-np", "1")
	r1 := h.round("localhost[0]", 1)
	h.ask(1, "localhost", 0)
	h.ask(1, "127.0.0.1", 0)
	r2 := h.round("localhost[0]", 2)
	if r2.Generation != 1 || fmt.Sprint(r2.Ranks) != fmt.Sprint(r1.Ranks) {
		t.Errorf("round 2 = %+v, want round 1's ranks %+v, generation 1", r2, r1)
	}
	if got := h.latest("localhost[0]"); got != "2" {
		t.Errorf("latest %q, want 2", got)
	}
	for _, place := range []string{"localhost[0]", "127.0.0.1[0]"} {
		wantSignals(t, h.worker(place, 0))
	}
	if n := h.fake.total(); n != 2 {
		t.Errorf("%d starts, want 2", n)
	}
	if !h.logged("round 2: the same 2 workers as round 1") {
		t.Errorf("stderr lacks the re-forming:\n%s", h.stderr.String())
	}
}

// One worker asks for a new round and the other never does: after the grace the laggard is
// killed and counts as failed; the next round does without it.
func TestElasticStuckWorkerIsStopped(t *testing.T) {
	h := startElastic(t, testElasticSettings(), "-np", "2", "-H", "localhost:1,127.0.0.1:1", "--min-np", "1")
	h.round("localhost[0]", 1)
	start := time.Now()
	h.ask(1, "localhost", 0)
	r := h.round("localhost[0]", 2)
	if took := time.Since(start); took < 300*time.Millisecond {
		t.Errorf("the laggard was stopped after %v, within the 300 ms grace", took)
	}
	if places(r) != "localhost[0]" || r.Generation != 2 {
		t.Errorf("round 2: generation %d on %s, want 2 on localhost[0]", r.Generation, places(r))
	}
	wantSignals(t, h.worker("127.0.0.1[0]", 0), syscall.SIGKILL)
	wantSignals(t, h.worker("localhost[0]", 0))
	if !h.logged("127.0.0.1[0] did not ask for a new round within 300ms of the other workers of round 1: stopped as stuck") {
		t.Errorf("stderr lacks the laggard:\n%s", h.stderr.String())
	}
}

// A worker that asks for a new round naming another as stuck (its engine passed the progress
// deadline waiting on it): the suspect is stopped at once, not after the grace.
func TestElasticSuspectIsStoppedAtOnce(t *testing.T) {
	set := testElasticSettings()
	set.reinitGrace = time.Minute
	h := startElastic(t, set, "-np", "3", "-H", "localhost:2,127.0.0.1:1", "--min-np", "1")
	h.round("localhost[0]", 1)
	start := time.Now()
	h.ask(1, "localhost", 0, jobenv.Place{Host: "127.0.0.1", Slot: 0})
	r := h.round("localhost[0]", 2)
	if took := time.Since(start); took > 5*time.Second {
		t.Errorf("the suspect was stopped after %v", took)
	}
	if places(r) != "localhost[0] localhost[1]" || r.Generation != 2 {
		t.Errorf("round 2: generation %d on %s, want 2 on localhost[0] localhost[1]", r.Generation, places(r))
	}
	wantSignals(t, h.worker("127.0.0.1[0]", 0), syscall.SIGKILL)
	// localhost[1] has not asked either, but nobody named it: it is left alone (the grace).
	wantSignals(t, h.worker("localhost[1]", 0))
	if !h.logged("127.0.0.1[0] found stuck by the other workers of round 1") {
		t.Errorf("stderr lacks the suspect:\n%s", h.stderr.String())
	}
}

// A worker named by a peer whose call its closed connections cut, but which said that it left the
// round on purpose (jobenv.LeftKey) before it closed them, is not stopped as stuck: it asks for
// the next round in its own time, and the same workers meet again.
func TestElasticSuspectThatLeftIsNotStopped(t *testing.T) {
	set := testElasticSettings()
	set.reinitGrace = time.Minute
	h := startElastic(t, set, "-np", "3", "-H", "localhost:2,127.0.0.1:1", "--min-np", "1")
	r1 := h.round("localhost[0]", 1)
	h.leave(1, "localhost", 1)
	h.ask(1, "localhost", 0, jobenv.Place{Host: "localhost", Slot: 1})
	h.ask(1, "127.0.0.1", 0, jobenv.Place{Host: "localhost", Slot: 1})
	time.Sleep(300 * time.Millisecond) // many of the launcher's 10 ms ticks
	h.ask(1, "localhost", 1)
	r2 := h.round("localhost[0]", 2)
	if r2.Generation != 1 || places(r2) != places(r1) {
		t.Errorf("round 2: generation %d on %s, want generation 1 on %s", r2.Generation, places(r2), places(r1))
	}
	for _, place := range []string{"localhost[0]", "localhost[1]", "127.0.0.1[0]"} {
		wantSignals(t, h.worker(place, 0))
	}
	if strings.Contains(h.stderr.String(), "stopped as stuck") {
		t.Errorf("a worker was stopped as stuck:\n%s", h.stderr.String())
	}
}

// A named suspect behind a cut link cannot be told to stop (its SIGKILL takes the starter's
// seconds): the next round does not wait for it, since its place is not in that round, and the
// job's end still collects its exit.
func TestElasticUnreachableSuspectDoesNotDelayTheRound(t *testing.T) {
	set := testElasticSettings()
	set.reinitGrace, set.stopGrace = time.Minute, 5*time.Second
	h := startElastic(t, set, "-np", "3", "-H", "localhost:2,127.0.0.1:1", "--min-np", "1")
	h.round("localhost[0]", 1)
	cut := h.worker("127.0.0.1[0]", 0)
	cut.mu.Lock()
	cut.ignoreTerm, cut.killTakes = true, 2*time.Second
	cut.mu.Unlock()
	start := time.Now()
	h.ask(1, "localhost", 0, jobenv.Place{Host: "127.0.0.1", Slot: 0})
	h.ask(1, "localhost", 1, jobenv.Place{Host: "127.0.0.1", Slot: 0})
	r := h.round("localhost[0]", 2)
	if took := time.Since(start); took > time.Second {
		t.Errorf("round 2 came %v after the suspect was named: it waited for the unreachable worker", took)
	}
	if places(r) != "localhost[0] localhost[1]" {
		t.Errorf("round 2 on %s, want localhost[0] localhost[1]", places(r))
	}
	h.worker("localhost[0]", 0).exit(0)
	h.worker("localhost[1]", 0).exit(0)
	if code := h.wait(); code != 0 {
		t.Errorf("exit %d, want 0", code)
	}
	if !cut.ended.Load() {
		t.Error("the job ended before the unreachable worker's exit")
	}
	wantSignals(t, cut, syscall.SIGKILL)
}

// A worker that joined its round and whose connection to the launcher is gone (its presence
// record with it: a host down or cut off) is stopped as soon as the others ask for a new round,
// not after the grace; one whose connection lives is left alone.
func TestElasticUnreachableWorkerIsStoppedAtOnce(t *testing.T) {
	set := testElasticSettings()
	set.reinitGrace = time.Minute
	h := startElastic(t, set, "-np", "3", "-H", "localhost:2,127.0.0.1:1", "--min-np", "1")
	h.round("localhost[0]", 1)
	env := h.worker("127.0.0.1[0]", 0).env
	sessions := map[string]*rendezvous.Client{}
	for _, pl := range []jobenv.Place{{Host: "localhost", Slot: 0}, {Host: "localhost", Slot: 1}, {Host: "127.0.0.1", Slot: 0}} {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		c, err := rendezvous.Dial(ctx, env[jobenv.Rendezvous], []byte(env[jobenv.Secret]))
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		if err := c.SetSession(ctx, jobenv.AliveKey(pl), []byte("round 1")); err != nil {
			t.Fatal(err)
		}
		if err := c.Set(ctx, jobenv.JoinedKey(1, pl), []byte("1")); err != nil {
			t.Fatal(err)
		}
		sessions[pl.String()] = c
	}
	h.ask(1, "localhost", 0)
	time.Sleep(200 * time.Millisecond) // ticks pass: nobody is stopped while every record lives
	wantSignals(t, h.worker("localhost[1]", 0))
	wantSignals(t, h.worker("127.0.0.1[0]", 0))
	start := time.Now()
	sessions["127.0.0.1[0]"].Close() // as the launcher's rendezvous drops a cut host's connection
	h.ask(1, "localhost", 1)
	r := h.round("localhost[0]", 2)
	if took := time.Since(start); took > 5*time.Second {
		t.Errorf("the unreachable worker was stopped after %v", took)
	}
	if places(r) != "localhost[0] localhost[1]" {
		t.Errorf("round 2 on %s, want localhost[0] localhost[1]", places(r))
	}
	wantSignals(t, h.worker("127.0.0.1[0]", 0), syscall.SIGKILL)
	if !h.logged("127.0.0.1[0] joined round 1 but can no longer be reached") {
		t.Errorf("stderr lacks the unreachable worker:\n%s", h.stderr.String())
	}
}

// A reinit record the launcher cannot read (a stranger's, a newer kolo's) still counts as asking,
// names nobody, and is logged: the round re-forms as usual.
func TestElasticBadReinitRecordCountsAsAsking(t *testing.T) {
	h := startElastic(t, testElasticSettings(), "-np", "2", "-H", "localhost:1,127.0.0.1:1", "--min-np", "1")
	h.round("localhost[0]", 1)
	key := jobenv.ReinitKey(1, jobenv.Place{Host: "localhost", Slot: 0})
	if err := h.client("localhost[0]").Set(context.Background(), key, []byte("blame everyone")); err != nil {
		t.Fatal(err)
	}
	h.ask(1, "127.0.0.1", 0)
	if r := h.round("localhost[0]", 2); r.Generation != 1 || places(r) != "localhost[0] 127.0.0.1[0]" {
		t.Errorf("round 2: generation %d on %s, want round 1's workers", r.Generation, places(r))
	}
	wantSignals(t, h.worker("localhost[0]", 0))
	wantSignals(t, h.worker("127.0.0.1[0]", 0))
	if !h.logged(`localhost[0] asked for a new round with a bad record: elastic reinit: bad line "blame everyone"`) {
		t.Errorf("stderr lacks the bad record:\n%s", h.stderr.String())
	}
}

func TestElasticResetLimit(t *testing.T) {
	h := startElastic(t, testElasticSettings(), "-np", "2", "-H", "localhost:1,127.0.0.1:1", "--min-np", "1", "--reset-limit", "0")
	h.round("localhost[0]", 1)
	end := make(chan jobenv.Round, 1)
	h.worker("127.0.0.1[0]", 0).ignoreSIGTERM()
	go func() { end <- h.round("localhost[0]", 2) }()
	h.worker("localhost[0]", 0).exit(1)
	if r := <-end; !strings.Contains(r.End, "reset limit reached") {
		t.Errorf("round 2 = %+v, want the end record of the reset limit", r)
	}
	if code := h.wait(); code != 1 {
		t.Errorf("exit %d, want 1", code)
	}
}

// Ctrl-C stops every worker, and runElastic returns with nothing it started left running.
func TestElasticInterrupt(t *testing.T) {
	before := runtime.NumGoroutine()
	h := startElastic(t, testElasticSettings(), "-np", "2", "-H", "localhost:2", "--min-np", "1")
	h.round("localhost[0]", 1)
	stubborn := h.worker("localhost[1]", 0)
	stubborn.ignoreSIGTERM()
	h.rv.Close()
	h.rv = nil
	h.cancel()
	if code := h.wait(); code != ExitInterrupted || h.err == nil {
		t.Errorf("exit %d, %v; want %d", code, h.err, ExitInterrupted)
	}
	wantSignals(t, h.worker("localhost[0]", 0), syscall.SIGTERM)
	wantSignals(t, stubborn, syscall.SIGTERM, syscall.SIGKILL)
	deadline := time.Now().Add(2 * time.Second)
	for runtime.NumGoroutine() > before && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if n := runtime.NumGoroutine(); n > before {
		buf := make([]byte, 1<<16)
		t.Errorf("%d goroutines before, %d after:\n%s", before, n, buf[:runtime.Stack(buf, true)])
	}
}

// The launcher reads the workers' progress deadline as they do (settings.ProgressTimeout): the
// tuning flag's variable first, then its own environment in either spelling and either form.
func TestProgressTimeoutAsWorkersReadIt(t *testing.T) {
	for _, tc := range []struct {
		name   string
		flag   map[string]string // EngineEnv
		env    map[string]string
		expect time.Duration
	}{
		{"unset", nil, nil, 0},
		{"the flag", map[string]string{"KOLO_PROGRESS_TIMEOUT_SECONDS": "30"}, map[string]string{"KOLO_PROGRESS_TIMEOUT_SECONDS": "90"}, 30 * time.Second},
		{"the environment", nil, map[string]string{"KOLO_PROGRESS_TIMEOUT_SECONDS": "90"}, 90 * time.Second},
		{"Horovod's spelling", nil, map[string]string{"HOROVOD_PROGRESS_TIMEOUT_SECONDS": "45"}, 45 * time.Second},
		{"a Go duration", nil, map[string]string{"KOLO_PROGRESS_TIMEOUT_SECONDS": "2m"}, 2 * time.Minute},
		{"malformed: the default", nil, map[string]string{"KOLO_PROGRESS_TIMEOUT_SECONDS": "soon"}, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv("KOLO_PROGRESS_TIMEOUT_SECONDS", "")
			t.Setenv("HOROVOD_PROGRESS_TIMEOUT_SECONDS", "")
			for k, v := range tc.env {
				t.Setenv(k, v)
			}
			if got := progressTimeout(&flags.Options{EngineEnv: tc.flag}); got != tc.expect {
				t.Errorf("got %v, want %v", got, tc.expect)
			}
		})
	}
}
