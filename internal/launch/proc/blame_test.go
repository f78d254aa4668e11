package proc

import (
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kolo-dl/kolo/internal/launch/layout"
	"github.com/kolo-dl/kolo/internal/observe/report"
)

var t0 = time.Date(2026, 11, 28, 12, 0, 0, 0, time.UTC)

func failed(rank int, at time.Duration) Result {
	return Result{Slot: layout.Slot{Rank: rank, Host: "h"}, Exit: Exit{Code: 3}, Ended: t0.Add(at)}
}

func killed(rank int, sig syscall.Signal, stopped bool) Result {
	return Result{Slot: layout.Slot{Rank: rank, Host: "h"}, Exit: Exit{Code: -1, Signal: sig}, Stopped: stopped, Ended: t0.Add(time.Hour)}
}

func exited0(rank int, at time.Duration) Result {
	return Result{Slot: layout.Slot{Rank: rank, Host: "h"}, Ended: t0.Add(at)}
}

func rec(rank int, kind report.Kind, blames int) report.Failure {
	return report.Failure{Rank: rank, Host: "h", Kind: kind, Blames: blames, Message: "m"}
}

func TestBlame(t *testing.T) {
	recs := func(fs ...report.Failure) map[int]report.Failure {
		m := map[int]report.Failure{}
		for _, f := range fs {
			m[f.Rank] = f
		}
		return m
	}
	cases := []struct {
		name    string
		results []Result
		records map[int]report.Failure
		first   int // index into results
		want    int // rank
	}{
		{"no records", []Result{failed(0, 0), killed(1, syscall.SIGTERM, true)}, nil, 0, 0},
		{"its own exception", []Result{failed(0, 0), killed(1, syscall.SIGTERM, true)},
			recs(rec(0, report.KindException, -1), rec(1, report.KindPeerFailed, 0)), 0, 0},
		{"names a rank killed outside the launcher",
			[]Result{failed(0, 0), killed(1, syscall.SIGKILL, false), failed(2, 0)},
			recs(rec(0, report.KindLost, 1), rec(2, report.KindLost, 1)), 2, 1},
		{"named rank was marked stopped but died of SIGKILL first",
			[]Result{failed(0, 0), killed(1, syscall.SIGKILL, true)}, recs(rec(0, report.KindLost, 1)), 0, 1},
		{"named lost rank ended by the launcher's SIGTERM",
			[]Result{failed(0, 0), killed(1, syscall.SIGTERM, true)}, recs(rec(0, report.KindLost, 1)), 0, 0},
		{"named lost rank exited cleanly after the failure",
			[]Result{failed(0, time.Second), exited0(1, 2*time.Second)}, recs(rec(0, report.KindLost, 1)), 0, 0},
		{"named lost rank exited cleanly before the failure: it ended early",
			[]Result{failed(0, time.Second), exited0(1, 0)}, recs(rec(0, report.KindLost, 1)), 0, 1},
		{"named rank not in the results", []Result{failed(0, 0)}, recs(rec(0, report.KindLost, 7)), 0, 0},
		{"a failing rank the launcher stopped while it wound down", []Result{failed(0, 0), killed(1, syscall.SIGTERM, true)},
			recs(rec(0, report.KindPeerFailed, 1), rec(1, report.KindException, -1)), 0, 1},
		{"a failing rank that then exited cleanly is not the job's failure", []Result{failed(0, 0), exited0(1, 0)},
			recs(rec(0, report.KindPeerFailed, 1), rec(1, report.KindException, -1)), 0, 0},
		{"a stuck rank the launcher stopped", []Result{failed(0, 0), killed(1, syscall.SIGKILL, true), failed(2, 0)},
			recs(rec(0, report.KindStalled, 1), rec(2, report.KindStalled, 1)), 0, 1},
		{"a rank that ended early, exiting 0 afterwards", []Result{failed(0, 0), exited0(1, time.Minute)},
			recs(rec(0, report.KindEnded, 1)), 0, 1},
		{"a stuck rank that ran again and failed, naming itself", []Result{failed(0, 0), failed(1, time.Second)},
			recs(rec(0, report.KindStalled, 1), rec(1, report.KindStalled, 1)), 0, 1},
		{"a chain", []Result{failed(0, 0), killed(1, syscall.SIGSEGV, false), failed(2, time.Second)},
			recs(rec(0, report.KindPeerFailed, 2), rec(2, report.KindLost, 1)), 0, 1},
		{"a chain ends where the named rank is not to blame", []Result{failed(0, 0), exited0(1, time.Hour), failed(2, 0)},
			recs(rec(0, report.KindLost, 2), rec(2, report.KindLost, 1)), 0, 2},
		{"a rank that ended early and then lost the others is not left for them", []Result{failed(0, 0), exited0(1, time.Minute), failed(2, time.Second)},
			recs(rec(0, report.KindEnded, 1), rec(1, report.KindLost, 0), rec(2, report.KindEnded, 1)), 2, 1},
		{"a rank that ended early and then heard of a failure it caused is not left for that rank",
			[]Result{failed(0, 0), exited0(1, time.Minute), failed(2, time.Second)},
			recs(rec(0, report.KindEnded, 1), rec(1, report.KindPeerFailed, 2), rec(2, report.KindEnded, 1)), 0, 1},
		{"a stuck rank that heard of a failure it caused", []Result{failed(0, 0), killed(1, syscall.SIGKILL, true)},
			recs(rec(0, report.KindStalled, 1), rec(1, report.KindPeerFailed, 0)), 0, 1},
		{"two ranks that each say the other failed: the first one's word", []Result{failed(0, 0), failed(1, time.Second)},
			recs(rec(0, report.KindPeerFailed, 1), rec(1, report.KindPeerFailed, 0)), 0, 1},
		{"a cycle stops", []Result{failed(0, 0), failed(1, 0)},
			recs(rec(0, report.KindLost, 1), rec(1, report.KindLost, 0)), 0, 1},
		{"an op error blames nobody", []Result{failed(0, 0), failed(1, 0)},
			recs(rec(0, report.KindOp, -1), rec(1, report.KindOp, -1)), 0, 0},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got := Blame(tc.results, &tc.results[tc.first], tc.records)
			if got == nil || got.Slot.Rank != tc.want {
				t.Fatalf("Blame = %+v, want rank %d", got, tc.want)
			}
		})
	}
	if Blame(nil, nil, nil) != nil {
		t.Error("Blame(nil, nil, nil) != nil")
	}
}

// The summary names the rank the failure traces to, quotes its record (or the record that named
// it) and gives every other rank's end with its record's kind.
func TestSummary(t *testing.T) {
	stuck := killed(1, syscall.SIGKILL, true)
	results := []Result{failed(0, 0), stuck, failed(2, 0)}
	records := map[int]report.Failure{
		0: {Rank: 0, Kind: report.KindStalled, Blames: 1, Message: "rank 1 (h) made no progress for 2s (recv)"},
		2: {Rank: 2, Kind: report.KindStalled, Blames: 1, Message: "rank 1 (h) made no progress for 2s (send)"},
	}
	sum := Summary(results, &results[1], records)
	for _, want := range []string{
		"kolo run: rank 1 on h failed first (then stopped by the launcher: killed by signal 9 (killed)).\n",
		"Rank 0 reported: stalled (blames rank 1): rank 1 (h) made no progress for 2s (recv)\n",
		"Other ranks: rank 0 on h: exited with code 3 (stalled, blames rank 1); rank 2 on h: exited with code 3 (stalled, blames rank 1)\n",
	} {
		if !strings.Contains(sum, want) {
			t.Errorf("summary lacks %q:\n%s", want, sum)
		}
	}
	early := []Result{failed(0, 0), exited0(1, time.Minute)}
	sum = Summary(early, &early[1], map[int]report.Failure{0: rec(0, report.KindEnded, 1)})
	for _, want := range []string{"kolo run: rank 1 on h ended (exited with code 0) while other ranks still needed it (the first rank to fail).\n",
		"Rank 0 reported: ended (blames rank 1): m\n"} {
		if !strings.Contains(sum, want) {
			t.Errorf("summary lacks %q:\n%s", want, sum)
		}
	}
}
