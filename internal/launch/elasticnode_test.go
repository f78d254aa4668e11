package launch

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/kolo-dl/kolo/internal/jobenv"
	"github.com/kolo-dl/kolo/internal/launch/flags"
	"github.com/kolo-dl/kolo/internal/rendezvous"
	"github.com/kolo-dl/kolo/testbed/proctest"
)

// elasticNodeHarness runs several no-ssh elastic nodes (runNode) in this process, every
// worker a fakeWorker of one shared starter. Node 0 is started first and serves the rendezvous;
// every node is this machine, so the hosts are HOSTNAME, HOSTNAME-node2, ...
type elasticNodeHarness struct {
	t     *testing.T
	fake  *fakeElasticStarter
	set   elasticSettings
	addr  string
	args  []string
	host  string
	nodes []*elasticNodeRun
	rv    *rendezvous.Client
}

type elasticNodeRun struct {
	cancel context.CancelFunc
	vanish func() // for a joined node: cut it off the rendezvous, as if its machine died
	stdout proctest.Buffer
	stderr proctest.Buffer
	done   chan struct{}
	code   int
	err    error
}

func testNodeSettings() elasticSettings {
	set := testElasticSettings()
	set.beat = 20 * time.Millisecond
	set.nodeSilence = 500 * time.Millisecond
	return set
}

// startElasticNodes starts node 0 with args and its own extra flags; add starts the others.
func startElasticNodes(t *testing.T, args ...string) *elasticNodeHarness {
	t.Helper()
	return startElasticNodesWith(t, testNodeSettings(), args...)
}

func startElasticNodesWith(t *testing.T, set elasticSettings, args ...string) *elasticNodeHarness {
	t.Helper()
	t.Setenv("KOLO_SECRET", "fb7337591c207f7582ee84159737fc2a")
	t.Setenv("KOLO_ELASTIC_TIMEOUT", "")
	t.Setenv("HOROVOD_ELASTIC_TIMEOUT", "")
	hn, err := os.Hostname()
	if err != nil {
		t.Fatal(err)
	}
	h := &elasticNodeHarness{t: t, fake: &fakeElasticStarter{}, set: set,
		addr: "127.0.0.1:" + freePort(t), args: args, host: hn}
	t.Cleanup(func() {
		for _, n := range h.nodes {
			n.cancel()
		}
		for i, n := range h.nodes {
			select {
			case <-n.done:
			case <-time.After(15 * time.Second):
				t.Errorf("node %d did not return after its context was cancelled", i)
			}
		}
		if h.rv != nil {
			h.rv.Close()
		}
		if t.Failed() {
			for i, n := range h.nodes {
				t.Logf("node %d: code %d, err %v, stderr:\n%s", i, n.code, n.err, n.stderr.String())
			}
		}
	})
	h.add()
	// Node 0 serves: the others start once it answers.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	rv, err := rendezvous.Dial(ctx, h.addr, []byte("fb7337591c207f7582ee84159737fc2a"))
	if err != nil {
		t.Fatal(err)
	}
	h.rv = rv
	return h
}

// add starts one more node, with the harness's flags and extra ones; it returns its index.
func (h *elasticNodeHarness) add(extra ...string) int {
	h.t.Helper()
	return h.addVia(h.addr, &elasticNodeRun{done: make(chan struct{})}, extra...)
}

// addCuttable starts one more node that reaches the rendezvous through a link its vanish cuts:
// then it falls silent, as when its machine dies.
func (h *elasticNodeHarness) addCuttable(extra ...string) int {
	h.t.Helper()
	px := newCutProxy(h.t, h.addr)
	return h.addVia(px.addr, &elasticNodeRun{done: make(chan struct{}), vanish: px.cut}, extra...)
}

func (h *elasticNodeHarness) addVia(addr string, n *elasticNodeRun, extra ...string) int {
	h.t.Helper()
	args := append(append([]string{"--rendezvous", addr}, h.args...), extra...)
	opts, err := flags.Parse(append(args, "prog"), io.Discard)
	if err != nil {
		h.t.Fatal(err)
	}
	set := h.set
	set.starter = h.fake
	ctx, cancel := context.WithCancel(context.Background())
	n.cancel = cancel
	h.nodes = append(h.nodes, n)
	go func() {
		defer close(n.done)
		n.code, n.err = runNode(ctx, opts, set, &n.stdout, &n.stderr)
	}()
	return len(h.nodes) - 1
}

// hostOf is node i's host name (nodes joined in index order, none left).
func (h *elasticNodeHarness) hostOf(i int) string {
	if i == 0 {
		return h.host
	}
	return fmt.Sprintf("%s-node%d", h.host, i+1)
}

func (h *elasticNodeHarness) place(i, slot int) string {
	return fmt.Sprintf("%s[%d]", h.hostOf(i), slot)
}

func (h *elasticNodeHarness) worker(place string, k int) *fakeWorker {
	return (&elasticHarness{t: h.t, fake: h.fake}).worker(place, k)
}

// round waits for round n.
func (h *elasticNodeHarness) round(n int) jobenv.Round {
	h.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	b, err := h.rv.Get(ctx, jobenv.RoundKey(n))
	if err != nil {
		h.t.Fatalf("round %d: %v", n, err)
	}
	r, err := jobenv.DecodeRound(b)
	if err != nil {
		h.t.Fatal(err)
	}
	return r
}

// wait waits for node i to return.
func (h *elasticNodeHarness) wait(i int) *elasticNodeRun {
	h.t.Helper()
	n := h.nodes[i]
	select {
	case <-n.done:
	case <-time.After(15 * time.Second):
		h.t.Fatalf("node %d did not return within 15 s", i)
	}
	return n
}

func (h *elasticNodeHarness) wantStderr(i int, want ...string) {
	h.t.Helper()
	for _, w := range want {
		if !strings.Contains(h.nodes[i].stderr.String(), w) {
			h.t.Errorf("node %d's stderr lacks %q:\n%s", i, w, h.nodes[i].stderr.String())
		}
	}
}

// Two nodes of two slots: the first round waits for both (--nnodes 2) and has all four; a
// worker of the joined node gets the job's contract from its own kolo run; every worker exiting 0
// ends the job with 0 on both nodes.
func TestElasticNodesStartTogetherAndSucceed(t *testing.T) {
	h := startElasticNodes(t, "--nnodes", "2", "--nproc-per-node", "2", "--min-np", "2", "--elastic-timeout", "42")
	h.add()
	r := h.round(1)
	want := fmt.Sprintf("%s %s %s %s", h.place(0, 0), h.place(0, 1), h.place(1, 0), h.place(1, 1))
	if got := places(r); got != want {
		t.Fatalf("round 1 places %s, want %s", got, want)
	}
	env := h.worker(h.place(1, 1), 0).env
	local := h.worker(h.place(0, 0), 0).env
	for name, v := range map[string]string{
		jobenv.Rank: "3", jobenv.Size: "4", jobenv.LocalRank: "1", jobenv.LocalSize: "2", jobenv.CrossRank: "1",
		jobenv.CrossSize: "2", jobenv.Hostname: h.hostOf(1), jobenv.Rendezvous: h.addr,
		jobenv.JobID: local[jobenv.JobID], jobenv.Secret: "fb7337591c207f7582ee84159737fc2a",
		jobenv.Elastic: "1", jobenv.ElasticHost: h.hostOf(1), jobenv.ElasticSlot: "1",
		jobenv.ElasticRound: "1", jobenv.ElasticTimeout: "42",
	} {
		if env[name] != v {
			t.Errorf("%s: %s=%q, want %q", h.place(1, 1), name, env[name], v)
		}
	}
	if local[jobenv.JobID] == "" || local[jobenv.Rendezvous] != h.addr {
		t.Errorf("serving node's worker: job id %q, rendezvous %q", local[jobenv.JobID], local[jobenv.Rendezvous])
	}
	io.WriteString(h.worker(h.place(1, 0), 0).outW, "hello from node 1\n")
	for i := range 2 {
		for s := range 2 {
			h.worker(h.place(i, s), 0).exit(0)
		}
	}
	for i := range 2 {
		if n := h.wait(i); n.code != 0 || n.err != nil {
			t.Errorf("node %d: exit %d, %v; want 0", i, n.code, n.err)
		}
	}
	if got := h.nodes[1].stdout.String(); !strings.Contains(got, "["+h.place(1, 0)+"]<stdout>:hello from node 1") {
		t.Errorf("node 1's stdout lacks its worker's line: %q", got)
	}
	h.wantStderr(0, "node 1 joined from 127.0.0.1: host "+h.hostOf(1)+" with 2 slots", "round 1: ")
	h.wantStderr(1, "joined the job at "+h.addr+" as host "+h.hostOf(1), "the job is done: every worker of round 1 exited 0")
}

// A worker of the joined node failing: its host is blacklisted, its other worker stopped by an
// order, and the serving node's workers go on in round 2, never signalled or restarted.
func TestElasticNodesWorkerFailureDropsItsHost(t *testing.T) {
	h := startElasticNodes(t, "--nnodes", "2", "--nproc-per-node", "2", "--min-np", "2")
	h.add()
	h.round(1)
	bad := h.worker(h.place(1, 1), 0)
	io.WriteString(bad.errW, "RuntimeError: CUDA error\n")
	bad.exit(3)
	r := h.round(2)
	if got, want := places(r), h.place(0, 0)+" "+h.place(0, 1); got != want || r.Generation != 2 {
		t.Fatalf("round 2: generation %d, places %s; want generation 2 on %s", r.Generation, got, want)
	}
	// Its place is not in round 2, so round 2 does not wait for its stop order to arrive.
	awaitSignals(t, h.worker(h.place(1, 0), 0), syscall.SIGTERM)
	for s := range 2 {
		p := h.worker(h.place(0, s), 0)
		wantSignals(t, p)
		if n := h.fake.starts(h.place(0, s)); n != 1 {
			t.Errorf("%s started %d times, want 1", h.place(0, s), n)
		}
		p.exit(0)
	}
	for i := range 2 {
		if n := h.wait(i); n.code != 0 || n.err != nil {
			t.Errorf("node %d: exit %d, %v; want 0", i, n.code, n.err)
		}
	}
	h.wantStderr(0, fmt.Sprintf("round 2: generation 2 (reset 1): lost %s (host blacklisted), %s (failed)", h.place(1, 0), h.place(1, 1)))
	h.wantStderr(1, h.place(1, 1)+" (started for round 1 as rank 3) exited with code 3")
}

// A node joining later is a host joining: a new round has its workers, and the workers already
// running are not restarted.
func TestElasticNodesJoinLater(t *testing.T) {
	h := startElasticNodes(t, "--nproc-per-node", "2", "--min-np", "2")
	if got, want := places(h.round(1)), h.place(0, 0)+" "+h.place(0, 1); got != want {
		t.Fatalf("round 1 places %s, want %s", got, want)
	}
	h.add()
	r := h.round(2)
	want := fmt.Sprintf("%s %s %s %s", h.place(0, 0), h.place(0, 1), h.place(1, 0), h.place(1, 1))
	if got := places(r); got != want {
		t.Fatalf("round 2 places %s, want %s", got, want)
	}
	if env := h.worker(h.place(1, 0), 0).env; env[jobenv.ElasticRound] != "2" || env[jobenv.Rank] != "2" {
		t.Errorf("newcomer started for round %s as rank %s, want round 2, rank 2", env[jobenv.ElasticRound], env[jobenv.Rank])
	}
	for s := range 2 {
		wantSignals(t, h.worker(h.place(0, s), 0))
		if n := h.fake.starts(h.place(0, s)); n != 1 {
			t.Errorf("%s started %d times, want 1", h.place(0, s), n)
		}
	}
	h.wantStderr(0, "round 2: generation 2 (reset 1): started "+h.hostOf(1)+"[0-1]; 4 ranks on 2 hosts")
}

// A node whose kolo run is interrupted leaves the job: its host leaves, its workers are stopped
// (no failure, no blacklisting), the others go on in a new round and finish.
func TestElasticNodesNodeLeaves(t *testing.T) {
	h := startElasticNodes(t, "--nnodes", "2", "--nproc-per-node", "2", "--min-np", "2")
	h.add()
	h.round(1)
	h.worker(h.place(1, 0), 0) // both started before the node leaves: it stops both
	h.worker(h.place(1, 1), 0)
	h.nodes[1].cancel()
	r := h.round(2)
	if got, want := places(r), h.place(0, 0)+" "+h.place(0, 1); got != want {
		t.Fatalf("round 2 places %s, want %s", got, want)
	}
	if n := h.wait(1); n.code != ExitInterrupted || n.err == nil || !strings.Contains(n.err.Error(), "left the elastic job") {
		t.Errorf("leaving node: exit %d, %v", n.code, n.err)
	}
	for s := range 2 {
		wantSignals(t, h.worker(h.place(1, s), 0), syscall.SIGTERM)
		p := h.worker(h.place(0, s), 0)
		wantSignals(t, p)
		p.exit(0)
	}
	if n := h.wait(0); n.code != 0 || n.err != nil {
		t.Errorf("serving node: exit %d, %v; want 0", n.code, n.err)
	}
	h.wantStderr(0, "node 1 (host "+h.hostOf(1)+") left the job: it left: its kolo run was interrupted",
		"round 2: generation 2 (reset 1): lost "+h.hostOf(1)+"[0-1] (host left discovery); 2 ranks on 1 host")
}

// A node killed outright (it writes nothing more, its heartbeat stops) is a host leaving once it
// has been silent --nodeSilence; a node that joins later on the same machine gets the free name.
func TestElasticNodesNodeKilled(t *testing.T) {
	h := startElasticNodes(t, "--nnodes", "2", "--nproc-per-node", "1", "--min-np", "1")
	h.addCuttable()
	h.round(1)
	start := time.Now()
	h.nodes[1].vanish()
	r := h.round(2)
	if got := places(r); got != h.place(0, 0) {
		t.Fatalf("round 2 places %s, want %s", got, h.place(0, 0))
	}
	if took := time.Since(start); took < h.set.nodeSilence-2*h.set.beat {
		t.Errorf("round 2 after %s, before the node had been silent %s", took, h.set.nodeSilence)
	}
	h.wantStderr(0, "node 1 (host "+h.hostOf(1)+") left the job: no heartbeat for")
	h.add()
	r = h.round(3)
	if got, want := places(r), h.place(0, 0)+" "+h.hostOf(1)+"[0]"; got != want {
		t.Fatalf("round 3 places %s, want %s (the free name again)", got, want)
	}
	if n := h.fake.starts(h.place(0, 0)); n != 1 {
		t.Errorf("%s started %d times, want 1", h.place(0, 0), n)
	}
}

// A node killed outright whose worker the survivors name (their engines lost it) is not waited
// for until its silence: the named worker is taken as failed at once, and the next round forms
// without it.
func TestElasticNodesKilledNodeNamedBySurvivors(t *testing.T) {
	set := testNodeSettings()
	set.nodeSilence = 4 * time.Second
	h := startElasticNodesWith(t, set, "--nnodes", "2", "--nproc-per-node", "1", "--min-np", "1")
	h.addCuttable()
	h.round(1)
	start := time.Now()
	h.nodes[1].vanish()
	survivor := jobenv.Place{Host: h.hostOf(0), Slot: 0}
	dead := jobenv.Place{Host: h.hostOf(1), Slot: 0}
	if err := h.rv.Set(context.Background(), jobenv.ReinitKey(1, survivor), jobenv.EncodeReinit([]jobenv.Place{dead})); err != nil {
		t.Fatal(err)
	}
	r := h.round(2)
	if got := places(r); got != h.place(0, 0) {
		t.Fatalf("round 2 places %s, want %s", got, h.place(0, 0))
	}
	if took := time.Since(start); took > 2*time.Second {
		t.Errorf("round 2 came %s after the node died: it waited for the dead node's silence (%s)", took, set.nodeSilence)
	}
	h.wantStderr(0, h.place(1, 0)+" found stuck by the other workers of round 1")
}

// Below --min-np the job fails at the elastic timeout, and every node says why and exits 1.
func TestElasticNodesBelowMinNPFailsOnEveryNode(t *testing.T) {
	h := startElasticNodes(t, "--nnodes", "2", "--nproc-per-node", "1", "--min-np", "2", "--elastic-timeout", "0.3")
	h.add()
	h.round(1)
	bad := h.worker(h.place(1, 0), 0)
	io.WriteString(bad.errW, "ValueError: bad batch\n")
	bad.exit(3)
	for i := range 2 {
		n := h.wait(i)
		if n.code != 1 {
			t.Errorf("node %d: exit %d, %v; want 1", i, n.code, n.err)
		}
		h.wantStderr(i, "kolo run: elastic: the job failed: below min-np: 1 slot available on 1 host, --min-np 2",
			h.place(1, 0)+" (rank 1 of round 1) exited with code 3", "Last lines of "+h.place(1, 0)+"'s stderr:\n    ValueError: bad batch")
	}
	wantSignals(t, h.worker(h.place(0, 0), 0), syscall.SIGTERM)
}

// Ctrl-C on the serving node ends the job on every node.
func TestElasticNodesServingNodeInterrupted(t *testing.T) {
	h := startElasticNodes(t, "--nnodes", "2", "--nproc-per-node", "1", "--min-np", "2")
	h.add()
	h.round(1)
	for i := range 2 {
		h.worker(h.place(i, 0), 0) // started: under load the round is published well before
	}
	h.nodes[0].cancel()
	for i := range 2 {
		if n := h.wait(i); n.code != ExitInterrupted {
			t.Errorf("node %d: exit %d, %v; want %d", i, n.code, n.err, ExitInterrupted)
		}
		wantSignals(t, h.worker(h.place(i, 0), 0), syscall.SIGTERM)
	}
	h.wantStderr(1, "the job was interrupted")
}

// A node started with other elastic flags is refused, saying which; a node that is not elastic
// is told the job is.
func TestElasticNodesRefuseOtherFlags(t *testing.T) {
	h := startElasticNodes(t, "--nproc-per-node", "1", "--min-np", "2")
	i := h.add("--max-np", "3")
	if n := h.wait(i); n.code != ExitUsage || n.err == nil || !strings.Contains(n.err.Error(), "refused this node") ||
		!strings.Contains(n.err.Error(), "--max-np 3") {
		t.Errorf("node with --max-np 3: exit %d, %v", n.code, n.err)
	}
	o := &flags.Options{Rendezvous: h.addr, NNodes: 2, NodeRank: -1, NprocPerNode: 1, StartTimeout: 2 * time.Second, Command: []string{"true"}}
	code, err := RunNode(context.Background(), o, io.Discard, io.Discard)
	if code != ExitUsage || err == nil || !strings.Contains(err.Error(), "runs an elastic job") {
		t.Errorf("node without elastic flags: exit %d, %v", code, err)
	}
}

// In elastic mode -np counts the job's ranks: a node must say how many workers it runs.
func TestElasticNodeNeedsItsSlots(t *testing.T) {
	t.Setenv("KOLO_SECRET", "043a718774c572bd8a25adbeb1bfcd5c")
	opts, err := flags.Parse([]string{"--rendezvous", "127.0.0.1:1", "-np", "4", "--min-np", "2", "prog"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	code, err := RunNode(context.Background(), opts, io.Discard, io.Discard)
	if code != ExitUsage || err == nil || !strings.Contains(err.Error(), "--nproc-per-node N or -H localhost:N") {
		t.Errorf("exit %d, %v", code, err)
	}
}

// A joined node against a rendezvous this test plays the serving node at: it registers, takes
// its welcome and orders, reports an exit with its stderr tail, and when the serving node is
// gone (the rendezvous closes) it stops its workers and ends the job, saying why.
func TestElasticNodeAgentFollowsOrdersUntilTheServingNodeGoes(t *testing.T) {
	t.Setenv("KOLO_SECRET", "68ab7e273251b36c26a9c9b0f7574cd5")
	srv := rendezvous.NewServer([]byte("68ab7e273251b36c26a9c9b0f7574cd5"))
	addr, err := srv.Listen("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	rec, _ := json.Marshal(jobRecord{ID: "job1", Elastic: true})
	srv.Set(keyJob, rec)
	opts, err := flags.Parse([]string{"--rendezvous", addr.String(), "--nproc-per-node", "2", "--min-np", "1", "-x", "EXTRA=1", "prog"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	fake := &fakeElasticStarter{}
	set := testNodeSettings()
	set.starter = fake
	set.fill()
	var stderr proctest.Buffer
	done := make(chan struct{})
	var code int
	go func() {
		defer close(done)
		code, err = runNode(context.Background(), opts, set, io.Discard, &stderr)
	}()
	get := func(key string) []byte {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		v, err := srv.Get(ctx, key)
		if err != nil {
			t.Fatalf("%s: %v", key, err)
		}
		return v
	}
	join, jerr := DecodeNodeJoin(get(NodeKey(1)))
	if jerr != nil || join.Slots != 2 || join.Flags != opts.ElasticNodeFlags() || join.Addr != "127.0.0.1" {
		t.Fatalf("registration %+v, %v", join, jerr)
	}
	srv.Set(NodeWelcomeKey(1), NodeWelcome{Host: "h1", JobID: "job1", Timeout: 7 * time.Second}.Encode())
	srv.Set(NodeOrderKey(1, 1), NodeOrder{Kind: OrderStart, Worker: 1, Slot: 1, Round: 2,
		Rank: 1, Size: 2, LocalRank: 0, LocalSize: 1, CrossRank: 1, CrossSize: 2}.Encode())
	h := &elasticHarness{t: t, fake: fake}
	w := h.worker("h1[1]", 0)
	for name, v := range map[string]string{jobenv.Rank: "1", jobenv.Size: "2", jobenv.CrossRank: "1", jobenv.Hostname: "h1",
		jobenv.Rendezvous: addr.String(), jobenv.JobID: "job1", jobenv.Secret: "68ab7e273251b36c26a9c9b0f7574cd5", jobenv.ElasticRound: "2",
		jobenv.ElasticTimeout: "7", "EXTRA": "1"} {
		if w.env[name] != v {
			t.Errorf("worker: %s=%q, want %q", name, w.env[name], v)
		}
	}
	io.WriteString(w.errW, "ValueError: bad batch\n")
	w.exit(3)
	x, xerr := DecodeNodeExit(get(NodeExitKey(1, 1)))
	if xerr != nil || x.Worker != 1 || x.Code != 3 || fmt.Sprint(x.Tail) != "[ValueError: bad batch]" {
		t.Errorf("exit record %+v, %v", x, xerr)
	}
	srv.Set(NodeOrderKey(1, 2), NodeOrder{Kind: OrderStart, Worker: 2, Slot: 0, Round: 3,
		Rank: 0, Size: 1, LocalRank: 0, LocalSize: 1, CrossRank: 0, CrossSize: 1}.Encode())
	w2 := h.worker("h1[0]", 0)
	if beats, _, _ := srv.TryGet(NodeBeatKey(1)); len(beats) == 0 {
		t.Error("no heartbeat")
	}
	srv.Close()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("the node did not end after the rendezvous closed")
	}
	if code != 1 || err == nil || !strings.Contains(err.Error(), "lost the rendezvous") || !strings.Contains(err.Error(), "the job ended with the serving node") {
		t.Errorf("exit %d, %v", code, err)
	}
	wantSignals(t, w2, syscall.SIGTERM)
}

// cutProxy forwards connections to a rendezvous until cut: then every connection through it
// closes and no new one is taken, as when the machine of the node behind it dies.
type cutProxy struct {
	ln    net.Listener
	addr  string
	mu    sync.Mutex
	conns []net.Conn
	wg    sync.WaitGroup
}

func newCutProxy(t *testing.T, to string) *cutProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	px := &cutProxy{ln: ln, addr: ln.Addr().String()}
	px.wg.Add(1)
	go func() {
		defer px.wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			up, err := net.Dial("tcp", to)
			if err != nil {
				c.Close()
				continue
			}
			px.mu.Lock()
			px.conns = append(px.conns, c, up)
			px.mu.Unlock()
			px.wg.Add(2)
			for _, pair := range [][2]net.Conn{{c, up}, {up, c}} {
				go func() {
					defer px.wg.Done()
					io.Copy(pair[0], pair[1])
					pair[0].Close()
					pair[1].Close()
				}()
			}
		}
	}()
	t.Cleanup(px.cut)
	return px
}

func (px *cutProxy) cut() {
	px.ln.Close()
	px.mu.Lock()
	for _, c := range px.conns {
		c.Close()
	}
	px.mu.Unlock()
	px.wg.Wait()
}
