package launch

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"os"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kolo-dl/kolo/internal/jobenv"
	"github.com/kolo-dl/kolo/internal/launch/flags"
	"github.com/kolo-dl/kolo/internal/launch/layout"
	"github.com/kolo-dl/kolo/internal/launch/proc"
	"github.com/kolo-dl/kolo/internal/rendezvous"
	"github.com/kolo-dl/kolo/testbed/proctest"
)

func freePort(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	_, port, _ := net.SplitHostPort(ln.Addr().String())
	return port
}

type nodeRun struct {
	code           int
	err            error
	stdout, stderr proctest.Buffer
	elapsed        time.Duration
}

// output is what the node's kolo run shows: its stderr, then the error it ends with.
func (r *nodeRun) output() string {
	if r.err == nil {
		return r.stderr.String()
	}
	return r.stderr.String() + "kolo run: " + r.err.Error() + "\n"
}

// runNodes runs `kolo run --rendezvous` for each of n nodes in this process (all on loopback, so
// they share a host name and are told apart as NAME, NAME-node2, ...) and returns how each ended.
// Node 0 is started first and serves the rendezvous; the others join it.
func runNodes(t *testing.T, ctxs []context.Context, mod func(i int, o *flags.Options), script string) []*nodeRun {
	t.Helper()
	return runNodesWith(t, elasticSettings{}, ctxs, mod, script)
}

// runNodesWith is runNodes with the nodes' timings set (zero fields: the defaults).
func runNodesWith(t *testing.T, set elasticSettings, ctxs []context.Context, mod func(i int, o *flags.Options), script string) []*nodeRun {
	t.Helper()
	t.Setenv("KOLO_SECRET", "642516251c1d4f9ecedbf40ccf0e4477")
	addr := "127.0.0.1:" + freePort(t)
	runs := make([]*nodeRun, len(ctxs))
	var wg sync.WaitGroup
	for i := range ctxs {
		runs[i] = &nodeRun{}
		o := &flags.Options{Rendezvous: addr, NNodes: len(ctxs), NodeRank: -1, StartTimeout: 10 * time.Second,
			Command: []string{"/bin/sh", "-c", script}, EngineEnv: map[string]string{}}
		if mod != nil {
			mod(i, o)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			start := time.Now()
			runs[i].code, runs[i].err = runNode(ctxs[i], o, set, &runs[i].stdout, &runs[i].stderr)
			runs[i].elapsed = time.Since(start)
		}()
		if i == 0 {
			waitServed(t, addr)
		}
	}
	wg.Wait()
	return runs
}

// waitServed waits until the rendezvous at addr answers (runNodes' secret).
func waitServed(t *testing.T, addr string) {
	t.Helper()
	waitServedWith(t, addr, "642516251c1d4f9ecedbf40ccf0e4477")
}

// waitServedWith waits until the rendezvous at addr answers to secret.
func waitServedWith(t *testing.T, addr, secret string) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		c, err := rendezvous.Dial(ctx, addr, []byte(secret))
		cancel()
		if err == nil {
			c.Close()
			return
		}
	}
	t.Fatalf("nothing serves the rendezvous at %s", addr)
}

func background(n int) []context.Context {
	ctxs := make([]context.Context, n)
	for i := range ctxs {
		ctxs[i] = context.Background()
	}
	return ctxs
}

var rankLine = regexp.MustCompile(`\[(\d+)\]<stdout>:rank=(\d+) size=(\d+) local=(\d+)/(\d+) job=(\w+)`)

func TestRunNodeSuccess(t *testing.T) {
	runs := runNodes(t, background(3), func(i int, o *flags.Options) { o.NP = 6 },
		`echo "rank=$KOLO_RANK size=$KOLO_SIZE local=$KOLO_LOCAL_RANK/$KOLO_LOCAL_SIZE job=$KOLO_JOB_ID"`)
	seen := map[string]bool{}
	jobs := map[string]bool{}
	for i, r := range runs {
		if r.code != 0 || r.err != nil {
			t.Fatalf("node %d: code %d, %v\n%s", i, r.code, r.err, r.stderr.String())
		}
		for _, m := range rankLine.FindAllStringSubmatch(r.stdout.String(), -1) {
			if m[1] != m[2] || m[3] != "6" || m[5] != "2" {
				t.Errorf("node %d: bad rank line %q", i, m[0])
			}
			if seen[m[2]] {
				t.Errorf("rank %s ran twice", m[2])
			}
			seen[m[2]] = true
			jobs[m[6]] = true
		}
	}
	if len(seen) != 6 || len(jobs) != 1 {
		t.Errorf("ranks %v, job ids %v: want 6 ranks of one job", seen, jobs)
	}
}

// A rank failing on one node stops every node's ranks; every node exits with its code and names it.
func TestRunNodeFailureStopsEveryNode(t *testing.T) {
	runs := runNodes(t, background(3), func(i int, o *flags.Options) { o.NprocPerNode = 2; o.NodeRank = i },
		`if [ "$KOLO_RANK" = 3 ]; then sleep 0.5; echo "rank 3 breaks" >&2; exit 7; fi; sleep 30 & echo child=$!; wait`)
	var pids []int
	for i, r := range runs {
		if r.code != 7 {
			t.Errorf("node %d: code %d (%v), want 7\n%s", i, r.code, r.err, r.stderr.String())
		}
		if !strings.Contains(r.stderr.String(), "rank 3 on ") || !strings.Contains(r.stderr.String(), "exited with code 7 (the first rank to fail)") ||
			!strings.Contains(r.stderr.String(), "    rank 3 breaks") {
			t.Errorf("node %d's summary does not show rank 3's failure:\n%s", i, r.stderr.String())
		}
		if strings.Count(r.stderr.String(), "(the first rank to fail)") != 1 {
			t.Errorf("node %d prints the summary %d times:\n%s", i, strings.Count(r.stderr.String(), "(the first rank to fail)"), r.stderr.String())
		}
		if r.elapsed > 6*time.Second {
			t.Errorf("node %d took %s", i, r.elapsed)
		}
		pids = append(pids, proctest.ChildPids(r.stdout.String())...)
	}
	if len(pids) != 5 {
		t.Errorf("want 5 child pids, got %v", pids)
	}
	proctest.AwaitGone(t, pids)
}

// Ctrl-C on one node (the serving one, or one that joined) stops every node's ranks; every node
// exits with 130, the others naming the node interrupted.
func TestRunNodeInterruptStopsEveryNode(t *testing.T) {
	for _, tc := range []struct {
		name        string
		interrupted int
	}{{"serving node", 0}, {"joined node", 1}} {
		t.Run(tc.name, func(t *testing.T) {
			ctxs := background(3)
			ctx, cancel := context.WithCancel(context.Background())
			ctxs[tc.interrupted] = ctx
			time.AfterFunc(time.Second, cancel)
			runs := runNodes(t, ctxs, func(i int, o *flags.Options) { o.NprocPerNode = 1; o.NodeRank = i }, `sleep 30 & echo child=$!; wait`)
			for i, r := range runs {
				want := fmt.Sprintf("interrupted on node %d (", tc.interrupted)
				if i == tc.interrupted {
					want = "interrupted"
				}
				if r.code != ExitInterrupted || !strings.Contains(r.output(), want) {
					t.Errorf("node %d: code %d, output:\n%s\nwant %d and %q", i, r.code, r.output(), ExitInterrupted, want)
				}
				if r.elapsed > 8*time.Second {
					t.Errorf("node %d took %s", i, r.elapsed)
				}
				if len(proctest.ChildPids(r.stdout.String())) != 1 {
					t.Errorf("node %d: want its rank's child pid, got %q", i, r.stdout.String())
				}
				proctest.AwaitGone(t, proctest.ChildPids(r.stdout.String()))
			}
		})
	}
}

func TestRunNodeMissingNode(t *testing.T) {
	runs := runNodes(t, background(2), func(i int, o *flags.Options) {
		o.NNodes = 3
		o.NprocPerNode = 1
		o.StartTimeout = 1500 * time.Millisecond
	}, `true`)
	for i, r := range runs {
		if r.code == 0 || !strings.Contains(r.output(), "for 3 nodes: 2 arrived") || !strings.Contains(r.output(), "no sign of node 2") {
			t.Errorf("node %d: code %d, output:\n%s", i, r.code, r.output())
		}
		if r.elapsed > 5*time.Second {
			t.Errorf("node %d gave up after %s", i, r.elapsed)
		}
	}
}

func TestRunNodeDisagreement(t *testing.T) {
	runs := runNodes(t, background(2), func(i int, o *flags.Options) { o.NP = 2 + 2*i }, `true`)
	for i, r := range runs {
		if r.code != ExitUsage || !strings.Contains(r.output(), "started with -np") {
			t.Errorf("node %d: code %d, output:\n%s\nwant an error naming the -np that differ", i, r.code, r.output())
		}
	}
}

func TestRunNodeWrongSecret(t *testing.T) {
	t.Setenv("KOLO_SECRET", "34b8257c0a2e2821ff307abc3141a1d0")
	port := freePort(t)
	o := func() *flags.Options {
		return &flags.Options{Rendezvous: "127.0.0.1:" + port, NNodes: 2, NodeRank: -1, NprocPerNode: 1,
			StartTimeout: 1500 * time.Millisecond, Command: []string{"true"}}
	}
	done := make(chan int, 1)
	go func() {
		code, _ := RunNode(context.Background(), o(), &proctest.Buffer{}, &proctest.Buffer{})
		done <- code
	}()
	// The stranger must meet the real node's rendezvous, not host one itself: wait until it
	// serves (the real node read its secret before that, so the variable may change now).
	waitServedWith(t, "127.0.0.1:"+port, "34b8257c0a2e2821ff307abc3141a1d0")
	t.Setenv("KOLO_SECRET", "29425f96d0686b7a732cbf8d5a05597f")
	code, err := RunNode(context.Background(), o(), &proctest.Buffer{}, &proctest.Buffer{})
	if code == 0 || err == nil || !strings.Contains(err.Error(), "authentication failed") {
		t.Errorf("stranger: code %d, %v", code, err)
	}
	if c := <-done; c == 0 {
		t.Error("the real node completed a 2-node job alone")
	}
}

// The first rank to fail is the earliest to end among those that failed on their own: not one
// the job stopped, nor one whose node left, nor one Ctrl-C came before it started.
func TestFirstFailure(t *testing.T) {
	at := func(ms int) time.Time { return time.Unix(100, int64(ms)*1e6) }
	res := func(rank, code int, ms int, stopped bool, err error) proc.Result {
		return proc.Result{Slot: layout.Slot{Rank: rank}, Exit: proc.Exit{Code: code, Err: err}, Ended: at(ms), Stopped: stopped}
	}
	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	left := fmt.Errorf("%w (node 1, host h1: it left)", errNodeLeft)
	for _, tc := range []struct {
		name    string
		ctx     context.Context
		results []proc.Result
		want    int // -1: none
	}{
		{"all succeed", context.Background(), []proc.Result{res(0, 0, 5, false, nil), res(1, 0, 6, false, nil)}, -1},
		{"earliest failure wins", context.Background(), []proc.Result{res(0, 1, 30, false, nil), res(1, 7, 10, false, nil), res(2, 3, 20, false, nil)}, 1},
		{"stopped ranks did not fail", context.Background(), []proc.Result{res(0, -1, 5, true, nil), res(1, 7, 10, false, nil)}, 1},
		{"a rank whose node left did not fail", context.Background(), []proc.Result{res(0, -1, 5, false, left), res(1, 3, 10, false, nil)}, 1},
		{"only a node left", context.Background(), []proc.Result{res(0, -1, 5, false, left), res(1, -1, 6, true, nil)}, -1},
		{"not started before Ctrl-C", cancelled, []proc.Result{res(0, -1, 5, false, fmt.Errorf("start rank 0: %w", context.Canceled))}, -1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			first := firstFailure(tc.ctx, tc.results)
			switch {
			case tc.want < 0 && first != nil:
				t.Errorf("first = rank %d, want none", first.Slot.Rank)
			case tc.want >= 0 && (first == nil || first.Slot.Rank != tc.want):
				t.Errorf("first = %+v, want rank %d", first, tc.want)
			}
		})
	}
}

func TestNodeRanks(t *testing.T) {
	for _, tc := range []struct {
		claims, want []int
	}{
		{[]int{-1, -1, -1}, []int{0, 1, 2}},
		{[]int{2, 0, 1}, []int{2, 0, 1}},
		{[]int{1, -1, -1}, []int{1, 0, 2}},
		{[]int{-1, 0, -1}, []int{1, 0, 2}},
	} {
		if got := nodeRanks(tc.claims); fmt.Sprint(got) != fmt.Sprint(tc.want) {
			t.Errorf("nodeRanks(%v) = %v, want %v", tc.claims, got, tc.want)
		}
	}
}

// Two nodes given the same --node-rank: both fail at once (not after --start-timeout), each saying
// which node rank and what to do.
func TestRunNodeRankConflict(t *testing.T) {
	runs := runNodes(t, background(2), func(i int, o *flags.Options) { o.NodeRank = 0; o.NprocPerNode = 1 }, `true`)
	var taken, claimed int
	for i, r := range runs {
		if r.code != ExitUsage || r.err == nil || !strings.Contains(r.err.Error(), "node rank 0") || !strings.Contains(r.err.Error(), "--node-rank") {
			t.Errorf("node %d: code %d, %v; want %d and an error naming node rank 0 and --node-rank", i, r.code, r.err, ExitUsage)
			continue
		}
		if strings.Contains(r.err.Error(), "is taken by another node") {
			taken++
		}
		if strings.Contains(r.err.Error(), "was claimed by two nodes") {
			claimed++
		}
		if r.elapsed > 5*time.Second {
			t.Errorf("node %d gave up after %s (--start-timeout is 10s)", i, r.elapsed)
		}
	}
	if taken != 1 || claimed != 1 {
		t.Errorf("want one node told its rank is taken and one told of the conflict; got %d and %d", taken, claimed)
	}
}

// shortNodeTimings makes nodes beat every 20 ms and be lost after 300 ms of silence.
func shortNodeTimings() elasticSettings {
	return elasticSettings{beat: 20 * time.Millisecond, nodeSilence: 300 * time.Millisecond, stoppingSilence: 300 * time.Millisecond}
}

// A node that joins and then falls silent (its machine died) ends the job on the others: their
// ranks are stopped, and they exit saying which node was lost.
func TestRunNodeLostNode(t *testing.T) {
	t.Setenv("KOLO_SECRET", "642516251c1d4f9ecedbf40ccf0e4477")
	addr := "127.0.0.1:" + freePort(t)
	o := &flags.Options{Rendezvous: addr, NNodes: 2, NodeRank: 0, NprocPerNode: 1, StartTimeout: 10 * time.Second,
		Command: []string{"/bin/sh", "-c", `sleep 30 & echo child=$!; wait`}, EngineEnv: map[string]string{}}
	var run nodeRun
	done := make(chan struct{})
	go func() {
		defer close(done)
		start := time.Now()
		run.code, run.err = runNode(context.Background(), o, shortNodeTimings(), &run.stdout, &run.stderr)
		run.elapsed = time.Since(start)
	}()
	waitServed(t, addr)
	// The ghost: joins as node rank 1 and never beats.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ghost, err := rendezvous.Dial(ctx, addr, []byte("642516251c1d4f9ecedbf40ccf0e4477"))
	if err != nil {
		t.Fatal(err)
	}
	defer ghost.Close()
	num, err := ghost.Add(ctx, NodesKey, 1)
	if err != nil {
		t.Fatal(err)
	}
	join := NodeJoin{Hostname: "ghost", Slots: 1, Static: true, NNodes: 2, NodeRank: 1}
	if err := ghost.Set(ctx, NodeKey(int(num)), join.Encode()); err != nil {
		t.Fatal(err)
	}
	// It is ordered to start its rank, as a node is.
	if v, err := ghost.Get(ctx, NodeOrderKey(int(num), 1)); err != nil {
		t.Fatal(err)
	} else if o, err := DecodeNodeOrder(v); err != nil || o.Kind != OrderStart || o.Rank != 1 || o.Round != 0 {
		t.Errorf("the ghost's first order: %+v, %v; want to start rank 1", o, err)
	}
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("node 0 did not notice that node 1 was lost")
	}
	if run.code != 1 || run.err == nil || !strings.Contains(run.err.Error(), "node 1 on ghost stopped answering the rendezvous") {
		t.Errorf("node 0: code %d, %v; want 1 and node 1 lost\n%s", run.code, run.err, run.stderr.String())
	}
	if strings.Contains(run.stderr.String(), "(the first rank to fail)") {
		t.Errorf("the lost node's rank is blamed as a failure:\n%s", run.stderr.String())
	}
	pids := proctest.ChildPids(run.stdout.String())
	if len(pids) != 1 {
		t.Errorf("want node 0's rank to have started its child, got %v\n%s", pids, run.stdout.String())
	}
	proctest.AwaitGone(t, pids)
}

// Nodes that keep beating stay in the job however long it runs: only silence loses a node.
func TestRunNodeBeatingNodesStay(t *testing.T) {
	set := shortNodeTimings()
	runs := runNodesWith(t, set, background(2), func(i int, o *flags.Options) { o.NprocPerNode = 1 }, `sleep 1`)
	for i, r := range runs {
		if r.code != 0 || r.err != nil {
			t.Errorf("node %d: code %d, %v (nodes are silent after %s)\n%s", i, r.code, r.err, set.nodeSilence, r.stderr.String())
		}
	}
}

// A node's secret comes from auth.JobSecret (its precedence is tested there); with none, the error
// says how to give one.
func TestNodeSecret(t *testing.T) {
	for _, k := range []string{"KOLO_SECRET", "KOLO_SECRET_FILE", "HOROVOD_SECRET_KEY"} {
		t.Setenv(k, "")
	}
	if _, err := NodeSecret(&flags.Options{}); err == nil || !strings.Contains(err.Error(), "KOLO_SECRET") || !strings.Contains(err.Error(), "--secret-file") {
		t.Errorf("no secret: %v", err)
	}
	file := t.TempDir() + "/secret"
	if err := os.WriteFile(file, []byte("f11ef11ef11ef11ef11ef11ef11ef11e\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("KOLO_SECRET_FILE", file)
	if s, err := NodeSecret(&flags.Options{}); err != nil || string(s) != "f11ef11ef11ef11ef11ef11ef11ef11e" {
		t.Errorf("KOLO_SECRET_FILE: %q, %v", s, err)
	}
	t.Setenv("KOLO_SECRET", "43d6d63b060c2e893fe63263b0b7f6fd")
	if s, err := NodeSecret(&flags.Options{}); err != nil || string(s) != "43d6d63b060c2e893fe63263b0b7f6fd" {
		t.Errorf("KOLO_SECRET beside KOLO_SECRET_FILE: %q, %v", s, err)
	}
	if s, err := NodeSecret(&flags.Options{SecretFile: file}); err != nil || string(s) != "f11ef11ef11ef11ef11ef11ef11ef11e" {
		t.Errorf("--secret-file beside KOLO_SECRET: %q, %v", s, err)
	}
	t.Setenv("KOLO_SECRET", "hunter2")
	if _, err := NodeSecret(&flags.Options{}); err == nil || !strings.Contains(err.Error(), "KOLO_SECRET: job secret too short") || !strings.Contains(err.Error(), "kolo secret") {
		t.Errorf("a short KOLO_SECRET: %v, want it refused, saying how to make one", err)
	}
	if _, err := NodeSecret(&flags.Options{SecretFile: file + ".missing"}); err == nil || !strings.Contains(err.Error(), "--secret-file") {
		t.Errorf("missing --secret-file: %v", err)
	}
}

// Nodes started with different --nnodes fail at once with a usage error that says so, on every
// node, rather than waiting out --start-timeout.
func TestRunNodeNNodesDisagree(t *testing.T) {
	runs := runNodes(t, background(2), func(i int, o *flags.Options) {
		o.NNodes = 2 + i
		o.NprocPerNode = 1
		o.StartTimeout = 20 * time.Second
	}, `true`)
	for i, r := range runs {
		if r.code != ExitUsage || !strings.Contains(r.output(), "disagree on --nnodes") {
			t.Errorf("node %d: code %d, output:\n%s\nwant an error saying the nodes disagree on --nnodes", i, r.code, r.output())
		}
		if r.elapsed > 10*time.Second {
			t.Errorf("node %d gave up after %s", i, r.elapsed)
		}
	}
}

// A node that joins a static job says what the plan needs (slots, --nnodes, -np, --node-rank),
// starts each rank it is ordered to with the static contract (no elastic place, no round), prints
// and files its output by rank, reports its exit, and ends with the job's code, printing what
// the serving node sent.
func TestStaticNodeAgent(t *testing.T) {
	const secret = "5f0c8e2d7a9b4c1e8f3a6d2b9c7e1f40"
	t.Setenv("KOLO_SECRET", secret)
	srv := rendezvous.NewServer([]byte(secret))
	addr, err := srv.Listen("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	rec, _ := json.Marshal(jobRecord{ID: "job1"})
	srv.Set(keyJob, rec)
	dir := t.TempDir()
	opts, err := flags.Parse([]string{"--rendezvous", addr.String(), "--nnodes", "2", "--node-rank", "1", "-np", "2",
		"--output-filename", dir, "-x", "EXTRA=1", "prog"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	fake := &fakeElasticStarter{}
	set := testNodeSettings()
	set.starter = fake
	var stdout, stderr proctest.Buffer
	done := make(chan struct{})
	var code int
	go func() {
		defer close(done)
		code, err = runNode(context.Background(), opts, set, &stdout, &stderr)
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
	want := NodeJoin{Hostname: join.Hostname, Slots: 1, Addr: "127.0.0.1", Static: true, NNodes: 2, NP: 2, NodeRank: 1}
	if jerr != nil || join != want {
		t.Fatalf("registration %+v, %v; want %+v", join, jerr, want)
	}
	srv.Set(NodeWelcomeKey(1), NodeWelcome{Host: "h1", JobID: "job1", Static: true}.Encode())
	srv.Set(NodeOrderKey(1, 1), NodeOrder{Kind: OrderStart, Worker: 1, Slot: 0, Round: 0,
		Rank: 1, Size: 2, LocalRank: 0, LocalSize: 1, CrossRank: 1, CrossSize: 2}.Encode())
	h := &elasticHarness{t: t, fake: fake}
	w := h.worker("rank.1", 0)
	for name, v := range map[string]string{jobenv.Rank: "1", jobenv.Size: "2", jobenv.CrossRank: "1", jobenv.Hostname: "h1",
		jobenv.Rendezvous: addr.String(), jobenv.JobID: "job1", jobenv.Secret: secret, "EXTRA": "1",
		jobenv.Elastic: "", jobenv.ElasticRound: ""} {
		if w.env[name] != v {
			t.Errorf("worker: %s=%q, want %q", name, w.env[name], v)
		}
	}
	io.WriteString(w.outW, "hello\n")
	io.WriteString(w.errW, "ValueError: bad batch\n")
	w.exit(3)
	x, xerr := DecodeNodeExit(get(NodeExitKey(1, 1)))
	if xerr != nil || x.Worker != 1 || x.Code != 3 || fmt.Sprint(x.Tail) != "[ValueError: bad batch]" {
		t.Errorf("exit record %+v, %v", x, xerr)
	}
	summary := "kolo run: rank 1 on h1 exited with code 3 (the first rank to fail).\n"
	srv.Set(NodeOrderKey(1, 2), NodeOrder{Kind: OrderEnd, Code: 3, Reason: summary}.Encode())
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("the node did not end at the end order")
	}
	if code != 3 || err != nil {
		t.Errorf("exit %d, %v; want the job's 3", code, err)
	}
	if got := stdout.String(); got != "[1]<stdout>:hello\n" {
		t.Errorf("stdout %q, want the rank's line prefixed with its rank", got)
	}
	if got := stderr.String(); !strings.Contains(got, "[1]<stderr>:ValueError: bad batch\n") || !strings.HasSuffix(got, summary) ||
		strings.Contains(got, "kolo run: elastic") {
		t.Errorf("stderr %q, want the rank's line and the serving node's summary, and no elastic log", got)
	}
	if b, err := os.ReadFile(dir + "/rank.1/stdout"); err != nil || string(b) != "hello\n" {
		t.Errorf("rank.1/stdout: %q, %v", b, err)
	}
	if v, ok, _ := srv.TryGet(NodeDoneKey(1)); !ok {
		t.Errorf("the node did not say it read the end (%q)", v)
	}
}

// The serving node of a static job admits the nodes the plan can have, and fails the job, saying
// why, at the first it cannot: --nnodes or -np that differ, or a node rank claimed twice. A node
// more than --nnodes is refused, but does not end the job.
func TestStaticNodeAdmit(t *testing.T) {
	join := func(host string, nnodes, np, rank int) NodeJoin {
		return NodeJoin{Hostname: host, Slots: 1, Static: true, NNodes: nnodes, NP: np, NodeRank: rank}
	}
	for _, tc := range []struct {
		name     string
		joins    []NodeJoin // the serving node's first
		refused  string     // the last one's refusal
		failure  string     // why the job fails; "" none
		failCode int
	}{
		{"ranks given", []NodeJoin{join("a", 2, 0, 0), join("b", 2, 0, 1)}, "", "", 0},
		{"ranks by arrival", []NodeJoin{join("a", 2, 4, -1), join("b", 2, 0, -1)}, "", "", 0},
		{"nnodes differ", []NodeJoin{join("a", 2, 0, -1), join("b", 3, 0, -1)},
			"disagree on --nnodes: node on b was started with --nnodes 3, the serving node with 2", "disagree on --nnodes", ExitUsage},
		{"np differ", []NodeJoin{join("a", 3, 0, -1), join("b", 3, 4, -1), join("c", 3, 6, -1)},
			"node on c was started with -np 6, another node with -np 4", "started with -np 6", ExitUsage},
		{"rank claimed twice", []NodeJoin{join("a", 2, 0, 0), join("b", 2, 0, 0)},
			"node rank 0 is taken by another node: " + nodeRankAdvice, "node rank 0 was claimed by two nodes (the second on b)", ExitUsage},
		{"one node too many", []NodeJoin{join("a", 2, 0, -1), join("b", 2, 0, -1), join("c", 2, 0, -1)},
			"2 nodes have joined the rendezvous at r:1 already (--nnodes 2): is another job using it?", "", 0},
		{"an elastic node", []NodeJoin{join("a", 2, 0, -1), {Hostname: "b", Slots: 1, Flags: "-np 0 --min-np 1", NodeRank: -1}},
			"node on b was started with elastic flags (-np 0 --min-np 1), the serving node without", "", 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			self := tc.joins[0]
			s := newStaticNode(&node{opts: &flags.Options{Rendezvous: "r:1", NNodes: self.NNodes, NP: self.NP, NodeRank: self.NodeRank}})
			var refused string
			for i, j := range tc.joins {
				refused = s.admit(j)
				if refused != "" && i < len(tc.joins)-1 {
					t.Fatalf("join %d refused: %s", i, refused)
				}
			}
			if !strings.Contains(refused, tc.refused) || (tc.refused == "") != (refused == "") {
				t.Errorf("refused %q, want %q", refused, tc.refused)
			}
			switch {
			case tc.failure == "" && s.failure() != nil:
				t.Errorf("the job failed: %v", *s.failure())
			case tc.failure != "" && (s.failure() == nil || !strings.Contains(s.failure().why, tc.failure) || s.failure().code != tc.failCode):
				t.Errorf("failure %+v, want code %d and %q", s.failure(), tc.failCode, tc.failure)
			}
		})
	}
}
