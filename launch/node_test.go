package launch

import (
	"context"
	"fmt"
	"net"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"
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
func runNodes(t *testing.T, ctxs []context.Context, mod func(i int, o *Options), script string) []*nodeRun {
	t.Helper()
	t.Setenv("KOLO_SECRET", "node-test-secret")
	port := freePort(t)
	runs := make([]*nodeRun, len(ctxs))
	var wg sync.WaitGroup
	for i := range ctxs {
		runs[i] = &nodeRun{}
		o := &Options{Rendezvous: "127.0.0.1:" + port, NNodes: len(ctxs), NodeRank: -1, StartTimeout: 10 * time.Second,
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
	runs := runNodes(t, background(3), func(i int, o *Options) { o.NP = 6 },
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
	runs := runNodes(t, background(3), func(i int, o *Options) { o.NprocPerNode = 2; o.NodeRank = i },
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
	runs := runNodes(t, ctxs, func(i int, o *Options) { o.NprocPerNode = 1 }, `sleep 30 & echo child=$!; wait`)
	for i, r := range runs {
		if r.code != ExitInterrupted || r.err == nil || !strings.Contains(r.err.Error(), "interrupted on node") {
			t.Errorf("node %d: code %d, %v; want %d and who was interrupted", i, r.code, r.err, ExitInterrupted)
		}
		pidsGone(t, childPids(r.stdout.String()))
	}
}

func TestRunNodeMissingNode(t *testing.T) {
	runs := runNodes(t, background(2), func(i int, o *Options) {
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
	runs := runNodes(t, background(2), func(i int, o *Options) { o.NP = 2 + 2*i }, `true`)
	for i, r := range runs {
		if r.code == 0 || r.err == nil || !strings.Contains(r.err.Error(), "started with -np") {
			t.Errorf("node %d: code %d, %v: want an error naming the -np that differ", i, r.code, r.err)
		}
	}
}

func TestRunNodeWrongSecret(t *testing.T) {
	t.Setenv("KOLO_SECRET", "the-real-one")
	port := freePort(t)
	o := func() *Options {
		return &Options{Rendezvous: "127.0.0.1:" + port, NNodes: 2, NodeRank: -1, NprocPerNode: 1,
			StartTimeout: 1500 * time.Millisecond, Command: []string{"true"}}
	}
	done := make(chan int, 1)
	go func() {
		code, _ := RunNode(context.Background(), o(), &syncBuffer{}, &syncBuffer{})
		done <- code
	}()
	time.Sleep(300 * time.Millisecond)
	t.Setenv("KOLO_SECRET", "a-guess")
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
	slot := func(r int) Slot { return Slot{Rank: r, Host: fmt.Sprintf("h%d", r/2)} }
	names := []string{"h0", "h1"}
	tests := []struct {
		name      string
		dones     []*doneRecord
		stop      *stopRecord
		wantCode  int
		wantFirst int // -1: none
		wantNote  string
	}{
		{"all succeed", []*doneRecord{
			{Ranks: []rankRecord{{Slot: slot(0)}, {Slot: slot(1)}}}, {Ranks: []rankRecord{{Slot: slot(2)}, {Slot: slot(3)}}},
		}, nil, 0, -1, ""},
		{"earliest failure wins across nodes", []*doneRecord{
			{Ranks: []rankRecord{{Slot: slot(0), Code: 1, Ended: at(30)}, {Slot: slot(1), Code: -1, Signal: 15, Stopped: true, Ended: at(40)}}},
			{Ranks: []rankRecord{{Slot: slot(2), Code: 7, Ended: at(10)}, {Slot: slot(3)}}},
		}, &stopRecord{Reason: stopFailed, Node: 0}, 7, 2, ""},
		{"signal", []*doneRecord{
			{Ranks: []rankRecord{{Slot: slot(0), Code: -1, Signal: 9, Ended: at(1)}}}, {},
		}, nil, 137, 0, ""},
		{"interrupted", []*doneRecord{
			{Ranks: []rankRecord{{Slot: slot(0), Code: -1, Signal: 15, Stopped: true}}}, {},
		}, &stopRecord{Reason: stopInterrupted, Node: 1, Host: "h1"}, ExitInterrupted, -1, "interrupted on node 1 (h1)"},
		{"lost node", []*doneRecord{
			{Ranks: []rankRecord{{Slot: slot(0), Code: -1, Signal: 15, Stopped: true}}}, {Lost: "node 1 on h1 stopped answering"},
		}, &stopRecord{Reason: stopLost, Node: 1}, 1, -1, "node 1 on h1 stopped answering"},
		{"silent node whose rank failed", []*doneRecord{
			{Ranks: []rankRecord{{Slot: slot(0), Code: -1, Signal: 15, Stopped: true}}}, nil,
		}, &stopRecord{Reason: stopFailed, Node: 1, Rank: &rankRecord{Slot: slot(2), Code: 3, Ended: at(5), Tail: []string{"boom"}}}, 3, 2, "no report from node 1 (h1)"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			results, first, code, note := outcome(tc.dones, tc.stop, names)
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
