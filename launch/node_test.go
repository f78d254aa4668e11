package launch

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kolo-dl/kolo/launch/flags"
	"github.com/kolo-dl/kolo/launch/layout"
	"github.com/kolo-dl/kolo/observe/report"
	"github.com/kolo-dl/kolo/rendezvous"
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
	stdout, stderr syncBuffer
	elapsed        time.Duration
}

// runNodes runs `kolo run --rendezvous` for each of n nodes in this process (all on loopback, so
// they share a host name and are told apart as NAME-nodeI) and returns how each ended.
func runNodes(t *testing.T, ctxs []context.Context, mod func(i int, o *flags.Options), script string) []*nodeRun {
	t.Helper()
	t.Setenv("KOLO_SECRET", "642516251c1d4f9ecedbf40ccf0e4477")
	port := freePort(t)
	runs := make([]*nodeRun, len(ctxs))
	var wg sync.WaitGroup
	for i := range ctxs {
		runs[i] = &nodeRun{}
		o := &flags.Options{Rendezvous: "127.0.0.1:" + port, NNodes: len(ctxs), NodeRank: -1, StartTimeout: 10 * time.Second,
			Command: []string{"/bin/sh", "-c", script}, EngineEnv: map[string]string{}}
		if mod != nil {
			mod(i, o)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			start := time.Now()
			runs[i].code, runs[i].err = RunNode(ctxs[i], o, &runs[i].stdout, &runs[i].stderr)
			runs[i].elapsed = time.Since(start)
		}()
	}
	wg.Wait()
	return runs
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
		if r.elapsed > 6*time.Second {
			t.Errorf("node %d took %s", i, r.elapsed)
		}
		pids = append(pids, childPids(r.stdout.String())...)
	}
	if len(pids) != 5 {
		t.Errorf("want 5 child pids, got %v", pids)
	}
	pidsGone(t, pids)
}

func TestRunNodeInterruptStopsEveryNode(t *testing.T) {
	ctxs := background(2)
	ctx, cancel := context.WithCancel(context.Background())
	ctxs[1] = ctx
	time.AfterFunc(time.Second, cancel)
	runs := runNodes(t, ctxs, func(i int, o *flags.Options) { o.NprocPerNode = 1 }, `sleep 30 & echo child=$!; wait`)
	for i, r := range runs {
		if r.code != ExitInterrupted || r.err == nil || !strings.Contains(r.err.Error(), "interrupted on node") {
			t.Errorf("node %d: code %d, %v; want %d and who was interrupted", i, r.code, r.err, ExitInterrupted)
		}
		pidsGone(t, childPids(r.stdout.String()))
	}
}

func TestRunNodeMissingNode(t *testing.T) {
	runs := runNodes(t, background(2), func(i int, o *flags.Options) {
		o.NNodes = 3
		o.NprocPerNode = 1
		o.StartTimeout = 1500 * time.Millisecond
	}, `true`)
	for i, r := range runs {
		if r.code == 0 || r.err == nil || !strings.Contains(r.err.Error(), "for 3 nodes: 2 arrived") || !strings.Contains(r.err.Error(), "no sign of node 2") {
			t.Errorf("node %d: code %d, %v", i, r.code, r.err)
		}
		if r.elapsed > 5*time.Second {
			t.Errorf("node %d gave up after %s", i, r.elapsed)
		}
	}
}

func TestRunNodeDisagreement(t *testing.T) {
	runs := runNodes(t, background(2), func(i int, o *flags.Options) { o.NP = 2 + 2*i }, `true`)
	for i, r := range runs {
		if r.code == 0 || r.err == nil || !strings.Contains(r.err.Error(), "started with -np") {
			t.Errorf("node %d: code %d, %v: want an error naming the -np that differ", i, r.code, r.err)
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
		code, _ := RunNode(context.Background(), o(), &syncBuffer{}, &syncBuffer{})
		done <- code
	}()
	time.Sleep(300 * time.Millisecond)
	t.Setenv("KOLO_SECRET", "29425f96d0686b7a732cbf8d5a05597f")
	code, err := RunNode(context.Background(), o(), &syncBuffer{}, &syncBuffer{})
	if code == 0 || err == nil || !strings.Contains(err.Error(), "authentication failed") {
		t.Errorf("stranger: code %d, %v", code, err)
	}
	if c := <-done; c == 0 {
		t.Error("the real node completed a 2-node job alone")
	}
}

func TestOutcome(t *testing.T) {
	at := func(ms int) int64 { return time.Unix(100, int64(ms)*1e6).UnixNano() }
	slot := func(r int) layout.Slot { return layout.Slot{Rank: r, Host: fmt.Sprintf("h%d", r/2)} }
	names := []string{"h0", "h1"}
	tests := []struct {
		name      string
		dones     []*doneRecord
		stop      *stopRecord
		records   map[int]report.Failure
		wantCode  int
		wantFirst int // -1: none
		wantNote  string
	}{
		{"all succeed", []*doneRecord{
			{Ranks: []rankRecord{{Slot: slot(0)}, {Slot: slot(1)}}}, {Ranks: []rankRecord{{Slot: slot(2)}, {Slot: slot(3)}}},
		}, nil, nil, 0, -1, ""},
		{"earliest failure wins across nodes", []*doneRecord{
			{Ranks: []rankRecord{{Slot: slot(0), Code: 1, Ended: at(30)}, {Slot: slot(1), Code: -1, Signal: 15, Stopped: true, Ended: at(40)}}},
			{Ranks: []rankRecord{{Slot: slot(2), Code: 7, Ended: at(10)}, {Slot: slot(3)}}},
		}, &stopRecord{Reason: stopFailed, Node: 0}, nil, 7, 2, ""},
		{"a record on another node traces the failure to a stuck rank", []*doneRecord{
			{Ranks: []rankRecord{{Slot: slot(0), Code: 1, Ended: at(10)}, {Slot: slot(1), Code: -1, Signal: 9, Stopped: true, Ended: at(40)}}},
			{Ranks: []rankRecord{{Slot: slot(2), Code: 1, Ended: at(12)}, {Slot: slot(3), Code: 1, Ended: at(13)}}},
		}, &stopRecord{Reason: stopFailed, Node: 0}, map[int]report.Failure{
			0: {Rank: 0, Kind: report.KindStalled, Blames: 1}, 2: {Rank: 2, Kind: report.KindStalled, Blames: 1},
		}, 137, 1, ""},
		{"a rank that ended early: the code is the first failure's", []*doneRecord{
			{Ranks: []rankRecord{{Slot: slot(0), Code: 3, Ended: at(10)}, {Slot: slot(1), Ended: at(40)}}}, {},
		}, &stopRecord{Reason: stopFailed, Node: 0}, map[int]report.Failure{0: {Rank: 0, Kind: report.KindEnded, Blames: 1}}, 3, 1, ""},
		{"signal", []*doneRecord{
			{Ranks: []rankRecord{{Slot: slot(0), Code: -1, Signal: 9, Ended: at(1)}}}, {},
		}, nil, nil, 137, 0, ""},
		{"interrupted", []*doneRecord{
			{Ranks: []rankRecord{{Slot: slot(0), Code: -1, Signal: 15, Stopped: true}}}, {},
		}, &stopRecord{Reason: stopInterrupted, Node: 1, Host: "h1"}, nil, ExitInterrupted, -1, "interrupted on node 1 (h1)"},
		{"lost node", []*doneRecord{
			{Ranks: []rankRecord{{Slot: slot(0), Code: -1, Signal: 15, Stopped: true}}}, {Lost: "node 1 on h1 stopped answering"},
		}, &stopRecord{Reason: stopLost, Node: 1}, nil, 1, -1, "node 1 on h1 stopped answering"},
		{"silent node whose rank failed", []*doneRecord{
			{Ranks: []rankRecord{{Slot: slot(0), Code: -1, Signal: 15, Stopped: true}}}, nil,
		}, &stopRecord{Reason: stopFailed, Node: 1, Rank: &rankRecord{Slot: slot(2), Code: 3, Ended: at(5), Tail: []string{"boom"}}}, nil, 3, 2, "no report from node 1 (h1)"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			results, first, code, note := outcome(tc.dones, tc.stop, names, tc.records)
			if code != tc.wantCode {
				t.Errorf("code %d, want %d", code, tc.wantCode)
			}
			switch {
			case tc.wantFirst < 0 && first != nil:
				t.Errorf("first = rank %d, want none", first.Slot.Rank)
			case tc.wantFirst >= 0 && (first == nil || first.Slot.Rank != tc.wantFirst):
				t.Errorf("first = %+v, want rank %d", first, tc.wantFirst)
			}
			if !strings.Contains(note, tc.wantNote) || (tc.wantNote == "" && note != "") {
				t.Errorf("note %q, want %q", note, tc.wantNote)
			}
			for i := 1; i < len(results); i++ {
				if results[i].Slot.Rank < results[i-1].Slot.Rank {
					t.Errorf("results not in rank order")
				}
			}
		})
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
func shortNodeTimings(t *testing.T) {
	t.Helper()
	oldBeat, oldSilence, oldStopping := beatInterval, nodeSilence, stoppingSilence
	beatInterval, nodeSilence, stoppingSilence = 20*time.Millisecond, 300*time.Millisecond, 300*time.Millisecond
	t.Cleanup(func() { beatInterval, nodeSilence, stoppingSilence = oldBeat, oldSilence, oldStopping })
}

// servingNode is node 0 of nnodes, serving a rendezvous on loopback, as it is once the nodes have
// met; the other nodes are only names.
func servingNode(t *testing.T, nnodes int) *node {
	t.Helper()
	secret := []byte("watch-test-secret")
	srv := rendezvous.NewServer(secret)
	addr, err := srv.Listen("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	rv, err := rendezvous.Dial(ctx, addr.String(), secret)
	if err != nil {
		srv.Close()
		t.Fatal(err)
	}
	n := &node{opts: &flags.Options{Rendezvous: addr.String(), NNodes: nnodes}, secret: secret, srv: srv, rv: rv,
		infos: make([]nodeInfo, nnodes), stopped: make(chan struct{}), lost: make(chan struct{})}
	for i := range nnodes {
		n.infos[i] = nodeInfo{Index: i, Hostname: fmt.Sprintf("host%d", i), Slots: 1, NNodes: nnodes}
		n.names = append(n.names, n.infos[i].Hostname)
	}
	t.Cleanup(n.close)
	return n
}

// watch runs n.watchNodes on st until the returned stop is called.
func watch(n *node, st servedStore) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); n.watchNodes(ctx, st) }()
	return func() { cancel(); <-done }
}

// The serving node declares a node that stops beating lost, in its place, and stops the job; a
// node that keeps beating is left alone.
func TestWatchNodesDeclaresSilentNodeLost(t *testing.T) {
	shortNodeTimings(t)
	n := servingNode(t, 3)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	beating, stopBeating := context.WithCancel(ctx)
	beaten := make(chan struct{})
	defer func() { stopBeating(); <-beaten }()
	go func(interval time.Duration) { // node 2 beats; node 1 is silent
		defer close(beaten)
		for beating.Err() == nil {
			n.srv.Add(keyBeat(2), 1)
			time.Sleep(interval)
		}
	}(beatInterval)
	start := time.Now()
	stop := watch(n, n.srv)
	defer stop()
	v, err := n.rv.Get(ctx, keyStop)
	if err != nil {
		t.Fatalf("no stop record: %v", err)
	}
	if waited := time.Since(start); waited < nodeSilence {
		t.Errorf("node 1 declared lost after %s, before %s of silence", waited, nodeSilence)
	}
	var rec stopRecord
	if err := json.Unmarshal(v, &rec); err != nil || rec.Reason != stopLost || rec.Node != 1 || rec.Host != "host1" ||
		!strings.Contains(rec.Detail, "node 1 on host1 stopped answering") {
		t.Errorf("stop record %s (%v), want node 1 lost", v, err)
	}
	v, ok, _ := n.srv.TryGet(keyDone(1))
	var done doneRecord
	if !ok || json.Unmarshal(v, &done) != nil || done.Node != 1 || !strings.Contains(done.Lost, "stopped answering") {
		t.Errorf("node 1's done record %q, want one saying it was lost", v)
	}
	time.Sleep(2 * nodeSilence) // node 2, beating, stays in the job
	if v, ok, _ := n.srv.TryGet(keyDone(2)); ok {
		t.Errorf("node 2 kept beating but was declared lost: %s", v)
	}
}

// staleDoneStore is a served store on which node 1's report lands just after the serving node has
// looked for it (its TryGet of launch/done/1 answers from before the report): the moment the
// serving node is about to declare node 1 lost.
type staleDoneStore struct {
	*rendezvous.Store
	report   []byte
	once     sync.Once
	reported chan bool // node 1's SetIfAbsent: did its report stand?
}

func (s *staleDoneStore) TryGet(key string) ([]byte, bool, error) {
	if key != keyDone(1) {
		return s.Store.TryGet(key)
	}
	s.once.Do(func() {
		stored, _ := s.Store.SetIfAbsent(key, s.report)
		s.reported <- stored
	})
	return nil, false, nil
}

// A node that reports just as the serving node declares it lost: one record stands, the one every
// node reads, and the job is stopped only if it is the lost one. (Writing the lost record over the
// report made nodes disagree on how the job ended.)
func TestWatchNodesKeepsReportRacingLostNode(t *testing.T) {
	shortNodeTimings(t)
	n := servingNode(t, 2)
	report, _ := json.Marshal(doneRecord{Node: 1, Host: "host1", Ranks: []rankRecord{{Slot: layout.Slot{Rank: 1, Host: "host1"}}}})
	st := &staleDoneStore{Store: n.srv.Store, report: report, reported: make(chan bool, 1)}
	stop := watch(n, st)
	if !<-st.reported {
		t.Fatal("node 1's report did not stand, though nothing was written before it")
	}
	time.Sleep(3 * nodeSilence) // node 1 is silent: the serving node tries to declare it lost
	stop()
	if v, _, _ := n.srv.TryGet(keyDone(1)); string(v) != string(report) {
		t.Errorf("node 1's report was replaced by %s", v)
	}
	if v, ok, _ := n.srv.TryGet(keyStop); ok {
		t.Errorf("the job was stopped for a node whose report stands: %s", v)
	}
}

// A node that registers and then falls silent (its machine died) ends the job on the others: their
// ranks are stopped, and they exit saying which node was lost.
func TestRunNodeLostNode(t *testing.T) {
	shortNodeTimings(t)
	t.Setenv("KOLO_SECRET", "642516251c1d4f9ecedbf40ccf0e4477")
	addr := "127.0.0.1:" + freePort(t)
	o := &flags.Options{Rendezvous: addr, NNodes: 2, NodeRank: 0, NprocPerNode: 1, StartTimeout: 10 * time.Second,
		Command: []string{"/bin/sh", "-c", `sleep 30 & echo child=$!; wait`}, EngineEnv: map[string]string{}}
	var run nodeRun
	done := make(chan struct{})
	go func() {
		defer close(done)
		start := time.Now()
		run.code, run.err = RunNode(context.Background(), o, &run.stdout, &run.stderr)
		run.elapsed = time.Since(start)
	}()
	// The ghost: registers as node 1 and never beats.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ghost, err := rendezvous.Dial(ctx, addr, []byte("642516251c1d4f9ecedbf40ccf0e4477"))
	if err != nil {
		t.Fatal(err)
	}
	defer ghost.Close()
	info, _ := json.Marshal(nodeInfo{Index: 1, Hostname: "ghost", Slots: 1, NNodes: 2})
	if _, err := ghost.Add(ctx, keyClaim(1), 1); err != nil {
		t.Fatal(err)
	}
	go ghost.Gather(ctx, keyNodes, 2, 1, info) // registers, as a node does; answered once node 0 has
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("node 0 did not notice that node 1 was lost")
	}
	if run.code != 1 || run.err == nil || !strings.Contains(run.err.Error(), "node 1 on ghost stopped answering the rendezvous") {
		t.Errorf("node 0: code %d, %v; want 1 and node 1 lost\n%s", run.code, run.err, run.stderr.String())
	}
	pids := childPids(run.stdout.String())
	if len(pids) != 1 {
		t.Errorf("want node 0's rank to have started its child, got %v\n%s", pids, run.stdout.String())
	}
	pidsGone(t, pids)
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
		if r.code == 0 || r.err == nil || !strings.Contains(r.err.Error(), "disagree on --nnodes") {
			t.Errorf("node %d: code %d, %v: want an error saying the nodes disagree on --nnodes", i, r.code, r.err)
		}
		if r.elapsed > 10*time.Second {
			t.Errorf("node %d gave up after %s", i, r.elapsed)
		}
	}
}
