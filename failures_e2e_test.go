package kolo_test

import (
	"fmt"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kolo-dl/kolo/internal/observe/report"
	"github.com/kolo-dl/kolo/testbed/e2e"
)

func TestStallReported(t *testing.T) {
	job := e2e.Launch(t, "stall", e2e.LocalHosts(3), 3, e2e.Options{Env: map[string]string{
		"KOLO_STALL_CHECK_TIME_SECONDS":    "1",
		"KOLO_STALL_SHUTDOWN_TIME_SECONDS": "3",
	}})
	requireSuccess(t, job)
	if !strings.Contains(job.Stderr.String(), "stalled") || !strings.Contains(job.Stderr.String(), "missing") {
		t.Errorf("no stall warning naming the missing rank in stderr:\n%s", job.Stderr)
	}
}

var killResult = regexp.MustCompile(`\[(\d+)\]<stderr>:KILL-RESULT elapsed=(\d+) err=(.*)`)

// kill -9 one rank mid-allreduce: every other rank fails within 5 s naming the lost rank. "kill"
// runs 1 MiB allreduces; "kill-small" one 4-byte allreduce under one name, cached after the first:
// the survivors' negotiation at rank 0, or rank 0 itself, finds rank 1 gone.
func TestKilledRankFailsOthers(t *testing.T) {
	for _, tc := range []struct {
		scenario string
		np       int
	}{{"kill", 2}, {"kill", 4}, {"kill-small", 2}, {"kill-small", 4}} {
		np := tc.np
		t.Run(fmt.Sprintf("%s/np=%d", tc.scenario, np), func(t *testing.T) {
			// The survivors ignore the launcher's SIGTERM and the grace is long, so what is measured is
			// the engine's own detection, not the launcher stopping them.
			job := e2e.Launch(t, tc.scenario, e2e.LocalHosts(np), np, e2e.Options{Grace: 15 * time.Second})
			if job.First == nil || job.First.Slot.Rank != 1 {
				t.Fatalf("first failure %+v, want rank 1 killed\n%s", job.First, job.Stderr)
			}
			seen := map[string]bool{}
			for _, m := range killResult.FindAllStringSubmatch(job.Stderr.String(), -1) {
				seen[m[1]] = true
				ms, _ := strconv.Atoi(m[2])
				if ms > 5000 {
					t.Errorf("rank %s took %d ms to fail", m[1], ms)
				}
				if !strings.Contains(m[3], "rank 1") {
					t.Errorf("rank %s error does not name rank 1: %s", m[1], m[3])
				}
			}
			for r := 0; r < np; r++ {
				if r != 1 && !seen[strconv.Itoa(r)] {
					t.Errorf("rank %d did not report the loss of rank 1:\n%s", r, job.Stderr)
				}
				// The survivors exit on their op's error, without kolo.ReportFailure or Shutdown:
				// the engine sent their records as it stopped.
				if f, ok := job.Records[r]; r != 1 && (!ok || f.Own()) {
					t.Errorf("rank %d's failure record %+v (sent: %v), want one blaming a peer", r, f, ok)
				}
			}
		})
	}
}

var abortResult = regexp.MustCompile(`\[(\d+)\]<stderr>:ABORT-RESULT err=(.*)`)

// A rank that calls kolo.Abort and leaves late: every other rank fails at once with its reason, and
// the launcher names it (not the first process to exit) as the rank that failed, with its exit code.
func TestAbortedRankIsBlamed(t *testing.T) {
	t.Parallel()
	for _, np := range []int{2, 3} {
		t.Run(fmt.Sprintf("np=%d", np), func(t *testing.T) {
			t.Parallel()
			job := e2e.Launch(t, "abort", e2e.LocalHosts(np), np, e2e.Options{Grace: 5 * time.Second})
			if job.First == nil || job.First.Slot.Rank != 1 || job.First.Exit.Code != 4 {
				t.Fatalf("first failure %+v, want rank 1 with exit code 4\n%s", job.First, job.Stderr)
			}
			got := abortResult.FindAllStringSubmatch(job.Stderr.String(), -1)
			if len(got) != np-1 {
				t.Errorf("%d ranks reported the abort, want %d:\n%s", len(got), np-1, job.Stderr)
			}
			for _, m := range got {
				if !strings.Contains(m[2], "rank 1 failed: bad batch") {
					t.Errorf("rank %s: %s", m[1], m[2])
				}
			}
		})
	}
}

// A rank whose program finishes while the others still submit ops: their next op fails at once,
// naming it, and the launcher names it as the rank the failure began with, though it exits 0 and
// the others exit first.
func TestEarlyEndIsBlamed(t *testing.T) {
	t.Parallel()
	// "ended-early-unreported": the others exit on their op's error without kolo.ReportFailure or
	// Shutdown; the engine has sent their records as the op failed.
	for _, scenario := range []string{"ended-early", "ended-early-unreported"} {
		t.Run(scenario, func(t *testing.T) {
			t.Parallel()
			job := e2e.Launch(t, scenario, e2e.LocalHosts(3), 3, e2e.Options{})
			if job.First == nil || job.First.Slot.Rank != 1 || job.First.Exit.Failed() {
				t.Fatalf("kolo run blames %+v, want rank 1, which exited 0 (records %+v)\n%s", job.First, job.Records, job.Stderr)
			}
			for _, r := range []int{0, 2} {
				if f, ok := job.Records[r]; !ok || f.Kind != report.KindEnded || f.Blames != 1 {
					t.Errorf("rank %d's failure record %+v (sent: %v), want one of a peer that ended, blaming rank 1", r, f, ok)
				}
			}
			// Rank 1 hears of the failed op too, but it did not fail for a peer that ended.
			if f, ok := job.Records[1]; ok && f.Kind == report.KindEnded {
				t.Errorf("rank 1, which ended, sent a record of a peer that ended: %+v", f)
			}
			if job.Elapsed > 15*time.Second {
				t.Errorf("the job took %v to fail: the others waited for rank 1", job.Elapsed)
			}
		})
	}
}

var stopResult = regexp.MustCompile(`\[(\d+)\]<stderr>:STOP-RESULT rank=(\d+) silent=(\d+) err=(.*)`)

// stopTimeout is the progress deadline the SIGSTOP tests set (KOLO_PROGRESS_TIMEOUT_SECONDS).
const stopTimeout = 2 * time.Second

// testStoppedRank runs the sigstop scenario on hosts: rank 1 is stopped (SIGSTOP) in the middle of
// a stream of allreduces, with a progress deadline of 2 s.
//   - Stopped for 5 s: every other rank fails within the deadline plus a margin, naming rank 1 and
//     its host; rank 1, once continued, fails too rather than hang; kolo run blames rank 1.
//   - With resume, also stopped for 1.5 s (waited on for about 1.2 s): nothing fails and every
//     result is right.
func testStoppedRank(t *testing.T, scenario string, hosts []e2e.Host, np int, opt e2e.Options, resume bool) {
	testStoppedRankFor(t, scenario, hosts, np, opt, map[bool]string{true: "1.5"}[resume])
}

// testStoppedRankFor is testStoppedRank with the resumed case's stop given ("": no such case).
func testStoppedRankFor(t *testing.T, scenario string, hosts []e2e.Host, np int, opt e2e.Options, resumeFor string) {
	host1 := ""
	for i, n := 0, 0; i < len(hosts); i++ {
		if n += hosts[i].Slots; n > 1 {
			host1 = hosts[i].Name
			break
		}
	}
	env := func(t *testing.T, stopFor string) map[string]string {
		m := map[string]string{
			"KOLO_PROGRESS_TIMEOUT_SECONDS": fmt.Sprint(stopTimeout.Seconds()),
			e2e.StopForEnv:                  stopFor,
			e2e.StopMarkEnv:                 filepath.Join(t.TempDir(), "stopped"),
		}
		for k, v := range opt.Env {
			m[k] = v
		}
		return m
	}
	t.Run("stuck", func(t *testing.T) {
		o := opt
		o.Env, o.Grace = env(t, "5"), 15*time.Second // the launcher's SIGKILL must not come before SIGCONT
		job := e2e.Launch(t, scenario, hosts, np, o)
		if job.First == nil || job.First.Slot.Rank != 1 {
			t.Errorf("kolo run blames %+v, want rank 1", job.First)
		}
		want := fmt.Sprintf("rank 1 (%s) made no progress for %v", host1, stopTimeout)
		seen := map[int]bool{}
		for _, m := range stopResult.FindAllStringSubmatch(job.Stderr.String(), -1) {
			r, _ := strconv.Atoi(m[1])
			silent, _ := strconv.Atoi(m[3])
			seen[r] = true
			t.Log(m[0])
			if !strings.Contains(m[4], want) {
				t.Errorf("rank %d: error does not say %q: %s", r, want, m[4])
			}
			if margin := 2 * time.Second; r != 1 && time.Duration(silent)*time.Millisecond > stopTimeout+margin {
				t.Errorf("rank %d failed %d ms after its last op, want within %v", r, silent, stopTimeout+margin)
			}
		}
		for r := range np {
			if !seen[r] {
				t.Errorf("rank %d reported no failure (rank 1 must fail too once continued):\n%s", r, job.Stderr)
			}
		}
	})
	if resumeFor == "" {
		return
	}
	t.Run("resumed in time", func(t *testing.T) {
		o := opt
		o.Env = env(t, resumeFor)
		job := e2e.Launch(t, scenario, hosts, np, o)
		requireSuccess(t, job)
		if n := strings.Count(job.Stderr.String(), "STOP-OK"); n != np {
			t.Errorf("%d ranks finished, want %d:\n%s", n, np, job.Stderr)
		}
	})
}

// SIGSTOP one of 3 ranks of one host in a stream of 4-byte allreduces under one name, each after
// the first negotiated as a cache id: rank 1 stops 200 ms after it submitted op 21, which the
// others submit 500 ms late. Rank 1 sent the op to rank 0 before it stopped, so the others meet it
// there, and the op runs as a collective that waits on rank 1: the same failure, or after SIGCONT
// in time the same success, as the 1 MiB case.
func TestStoppedRankSmallOpsSharedMemory(t *testing.T) {
	testStoppedRank(t, "sigstop-small", e2e.LocalHosts(3), 3, e2e.Options{}, true)
}

// SIGSTOP one of 3 ranks between two ops: the others wait on an op it has not submitted, and
// only its silence tells it from a rank that computes. Stopped 1 s (silent at most 1.5 s with its
// heartbeat every 0.5 s), it is not blamed.
func TestStoppedRankBetweenOps(t *testing.T) {
	testStoppedRankFor(t, "sigstop-between", e2e.LocalHosts(3), 3, e2e.Options{}, "1")
}

// SIGSTOP one of 2 ranks of one host mid-allreduce: shared memory.
func TestStoppedRankSharedMemory(t *testing.T) {
	testStoppedRank(t, "sigstop", e2e.LocalHosts(2), 2, e2e.Options{}, true)
}
