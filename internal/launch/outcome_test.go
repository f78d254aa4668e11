package launch

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/kolo-dl/kolo/internal/launch/flags"
	"github.com/kolo-dl/kolo/internal/launch/layout"
	"github.com/kolo-dl/kolo/internal/launch/proc"
	"github.com/kolo-dl/kolo/internal/observe/report"
	"github.com/kolo-dl/kolo/testbed/proctest"
)

// readOutcome reads the outcome file at path.
func readOutcome(t *testing.T, path string) Outcome {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("outcome file: %v", err)
	}
	var o Outcome
	if err := json.Unmarshal(b, &o); err != nil {
		t.Fatalf("outcome file %s: %v", b, err)
	}
	return o
}

// Every way a job of RunHosts ends leaves its outcome in --outcome-file, and nothing else in its
// directory (the temporary file is renamed into place).
func TestRunHostsWritesOutcome(t *testing.T) {
	for _, tc := range []struct {
		name      string
		script    string
		interrupt bool
		check     func(t *testing.T, o Outcome, code int)
	}{
		{"success", `exit 0`, false, func(t *testing.T, o Outcome, code int) {
			if code != 0 || o.ExitCode != 0 || !o.Succeeded || o.Interrupted || o.FirstFailed != nil {
				t.Errorf("code %d, outcome %+v: want a success", code, o)
			}
			for _, r := range o.Ranks {
				if r.ExitCode != 0 || r.Signal != 0 || r.Report != nil {
					t.Errorf("rank %+v: want exit 0", r)
				}
			}
		}},
		{"failing rank", `if [ "$KOLO_RANK" = 1 ]; then exit 7; fi; exec sleep 30`, false, func(t *testing.T, o Outcome, code int) {
			if code != 7 || o.ExitCode != 7 || o.Succeeded || o.Interrupted {
				t.Errorf("code %d, outcome %+v: want a failure with exit code 7", code, o)
			}
			if f := o.FirstFailed; f == nil || f.Rank != 1 || f.Host != "localhost" || f.ExitCode != 7 || f.Stopped {
				t.Errorf("first failed %+v, want rank 1 on localhost, exit code 7", f)
			}
			if r := o.Ranks[0]; !r.Stopped || r.Signal != int(proc.StopSignal) {
				t.Errorf("rank 0 %+v: want stopped by the launcher's signal", r)
			}
		}},
		{"interrupted", `exec sleep 30`, true, func(t *testing.T, o Outcome, code int) {
			if code != ExitInterrupted || o.ExitCode != ExitInterrupted || o.Succeeded || !o.Interrupted || o.FirstFailed != nil || o.Error == "" {
				t.Errorf("code %d, outcome %+v: want an interruption that blames no rank", code, o)
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			path := filepath.Join(dir, "outcome.json")
			o, err := flags.Parse([]string{"-np", "2", "--status", "off", "--outcome-file", path, "/bin/sh", "-c", tc.script}, io.Discard)
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			if tc.interrupt {
				time.AfterFunc(500*time.Millisecond, cancel)
			}
			code, _ := RunHosts(ctx, o, io.Discard, io.Discard)
			got := readOutcome(t, path)
			if len(got.Ranks) != 2 || got.Ranks[0].Rank != 0 || got.Ranks[1].Rank != 1 {
				t.Errorf("ranks %+v: want ranks 0 and 1", got.Ranks)
			}
			tc.check(t, got, code)
			if left, _ := os.ReadDir(dir); len(left) != 1 {
				t.Errorf("%d files left in the outcome file's directory, want 1", len(left))
			}
		})
	}
}

// The first failed rank's report is its own record, or else the record that names it; a job that
// succeeded carries no reports.
func TestStaticOutcome(t *testing.T) {
	res := func(rank int, exit proc.Exit, stopped bool) proc.Result {
		return proc.Result{Slot: layout.Slot{Rank: rank, Host: "h"}, Exit: exit, Stopped: stopped}
	}
	lost := report.Failure{Rank: 0, Host: "h", Kind: report.KindLost, Blames: 1, Message: "rank 1 lost"}
	own := report.Failure{Rank: 1, Host: "h", Kind: report.KindException, Blames: -1, Message: "bad batch"}
	for _, tc := range []struct {
		name       string
		results    []proc.Result
		first      int // -1: none failed
		records    map[int]report.Failure
		wantReport *report.Failure
		wantRanks  []bool // whether each rank's entry carries a report
	}{
		{"killed, named by a peer", []proc.Result{res(0, proc.Exit{Code: 3}, false), res(1, proc.Exit{Code: -1, Signal: syscall.SIGKILL}, false)},
			1, map[int]report.Failure{0: lost}, &lost, []bool{true, false}},
		{"its own record", []proc.Result{res(0, proc.Exit{Code: 3}, false), res(1, proc.Exit{Code: 4}, false)},
			1, map[int]report.Failure{0: lost, 1: own}, &own, []bool{true, true}},
		{"no records", []proc.Result{res(0, proc.Exit{Code: -1, Signal: proc.StopSignal}, true), res(1, proc.Exit{Code: 2}, false)},
			1, nil, nil, []bool{false, false}},
		{"succeeded after a recovered failure", []proc.Result{res(0, proc.Exit{}, false), res(1, proc.Exit{}, false)},
			-1, map[int]report.Failure{0: lost}, nil, []bool{false, false}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var first *proc.Result
			code := 0
			if tc.first >= 0 {
				first = &tc.results[tc.first]
				code = first.Exit.ShellCode()
			}
			o := staticOutcome(code, nil, false, tc.results, first, tc.records)
			if o.Succeeded != (first == nil) || o.ExitCode != code {
				t.Errorf("outcome %+v: exit code %d, succeeded %v", o, code, first == nil)
			}
			switch {
			case first == nil && o.FirstFailed != nil:
				t.Errorf("first failed %+v, want none", o.FirstFailed)
			case first != nil && (o.FirstFailed == nil || o.FirstFailed.Rank != tc.first):
				t.Errorf("first failed %+v, want rank %d", o.FirstFailed, tc.first)
			case first != nil && !sameReport(o.FirstFailed.Report, tc.wantReport):
				t.Errorf("first failed's report %+v, want %+v", o.FirstFailed.Report, tc.wantReport)
			}
			for i, r := range o.Ranks {
				if (r.Report != nil) != tc.wantRanks[i] {
					t.Errorf("rank %d's report %+v, want one: %v", i, r.Report, tc.wantRanks[i])
				}
			}
		})
	}
}

func sameReport(a, b *report.Failure) bool {
	return (a == nil && b == nil) || (a != nil && b != nil && *a == *b)
}

// A file that cannot be written costs the outcome, said on stderr, not the job.
func TestWriteOutcomeReportsError(t *testing.T) {
	var stderr proctest.Buffer
	writeOutcome(filepath.Join(t.TempDir(), "missing", "outcome.json"), Outcome{}, &stderr)
	if stderr.String() == "" {
		t.Error("no error on stderr for an outcome file in a missing directory")
	}
	path := filepath.Join(t.TempDir(), "outcome.json")
	writeOutcome(path, staticOutcome(1, errors.New("why"), false, nil, nil, nil), &stderr)
	if o := readOutcome(t, path); o.ExitCode != 1 || o.Error != "why" || o.Ranks == nil {
		t.Errorf("outcome %+v: want exit code 1, the error, and an empty list of ranks", o)
	}
}

// Every node of a no-ssh job writes the job's outcome, the same on each.
func TestRunNodeWritesOutcome(t *testing.T) {
	dir := t.TempDir()
	path := func(i int) string { return filepath.Join(dir, "outcome"+strconv.Itoa(i)+".json") }
	runs := runNodes(t, background(2), func(i int, o *flags.Options) { o.NprocPerNode = 2; o.NodeRank = i; o.OutcomeFile = path(i) },
		`if [ "$KOLO_RANK" = 2 ]; then exit 7; fi; exec sleep 30`)
	for i, r := range runs {
		o := readOutcome(t, path(i))
		if r.code != 7 || o.ExitCode != 7 || o.Succeeded || len(o.Ranks) != 4 {
			t.Errorf("node %d: code %d, outcome %+v: want exit code 7 and 4 ranks", i, r.code, o)
		}
		if f := o.FirstFailed; f == nil || f.Rank != 2 || f.ExitCode != 7 {
			t.Errorf("node %d: first failed %+v, want rank 2 with exit code 7", i, f)
		}
	}
}

// An elastic job's outcome: a failure it recovered from blames nobody once the job succeeds, and
// the workers listed are its last round's; a job that fails names a worker of the failures that
// ended it.
func TestElasticWritesOutcome(t *testing.T) {
	t.Run("recovered", func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "outcome.json")
		h := startElastic(t, testElasticSettings(), "-np", "4", "--min-np", "2", "-H", "localhost:2,127.0.0.1:2", "--outcome-file", path)
		h.round("localhost[0]", 1)
		h.worker("localhost[1]", 0).exit(3)
		h.round("localhost[0]", 2)
		h.worker("127.0.0.1[0]", 0).exit(0)
		h.worker("127.0.0.1[1]", 0).exit(0)
		if code := h.wait(); code != 0 {
			t.Fatalf("exit %d, want 0", code)
		}
		o := readOutcome(t, path)
		if !o.Succeeded || o.ExitCode != 0 || o.FirstFailed != nil || len(o.Ranks) != 2 {
			t.Fatalf("outcome %+v: want a success of 2 ranks that blames nobody", o)
		}
		for i, r := range o.Ranks {
			if r.Rank != i || r.Host != "127.0.0.1" || r.ExitCode != 0 || r.Report != nil {
				t.Errorf("rank %d: %+v, want rank %d on 127.0.0.1, exit 0, no report", i, r, i)
			}
		}
	})
	t.Run("failed", func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "outcome.json")
		h := startElastic(t, testElasticSettings(), "-np", "2", "--min-np", "1", "-H", "localhost:1,127.0.0.1:1", "--outcome-file", path)
		h.round("localhost[0]", 1)
		h.worker("localhost[0]", 0).exit(5)
		h.worker("127.0.0.1[0]", 0).exit(5)
		if code := h.wait(); code != 5 {
			t.Fatalf("exit %d, want 5", code)
		}
		o := readOutcome(t, path)
		if o.Succeeded || o.ExitCode != 5 || len(o.Ranks) != 2 {
			t.Errorf("outcome %+v: want a failure with exit code 5 and 2 ranks", o)
		}
		if f := o.FirstFailed; f == nil || f.ExitCode != 5 {
			t.Errorf("first failed %+v, want a worker that exited 5", f)
		}
	})
}
