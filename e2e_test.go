package kolo_test

import (
	"fmt"
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kolo-dl/kolo/internal/e2e"
)

func TestMain(m *testing.M) {
	e2e.Main() // in a re-executed rank: runs its scenario and exits
	os.Exit(m.Run())
}

func requireSuccess(t *testing.T, job *e2e.Job) {
	t.Helper()
	if job.First != nil {
		t.Fatalf("rank %d failed (%s)\nstderr:\n%s\nstdout:\n%s", job.First.Slot.Rank, job.First.Exit, job.Stderr, job.Stdout)
	}
}

// Every op x dtype x reduction against the naive reference, as separate processes.
func TestOpsAcrossProcesses(t *testing.T) {
	for _, np := range []int{1, 2, 3, 4, 5, 8} {
		t.Run(fmt.Sprintf("np=%d", np), func(t *testing.T) {
			requireSuccess(t, e2e.Launch(t, "ops", e2e.LocalHosts(np), np, e2e.Options{}))
		})
	}
}

func TestBigTensors(t *testing.T) {
	for _, np := range []int{2, 3, 8} {
		t.Run(fmt.Sprintf("np=%d", np), func(t *testing.T) {
			requireSuccess(t, e2e.Launch(t, "big", e2e.LocalHosts(np), np, e2e.Options{}))
		})
	}
}

func TestSubmitOrderDiffers(t *testing.T) {
	requireSuccess(t, e2e.Launch(t, "order", e2e.LocalHosts(4), 4, e2e.Options{}))
}

func TestMismatchNamesRanks(t *testing.T) {
	requireSuccess(t, e2e.Launch(t, "mismatch", e2e.LocalHosts(3), 3, e2e.Options{}))
}

func TestJoin(t *testing.T) {
	requireSuccess(t, e2e.Launch(t, "join", e2e.LocalHosts(3), 3, e2e.Options{}))
}

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

// kill -9 one rank mid-allreduce: every other rank fails within 5 s naming the lost rank.
func TestKilledRankFailsOthers(t *testing.T) {
	for _, np := range []int{2, 4} {
		t.Run(fmt.Sprintf("np=%d", np), func(t *testing.T) {
			// The survivors ignore the launcher's SIGTERM and the grace is long, so what is measured is
			// the engine's own detection, not the launcher stopping them.
			job := e2e.Launch(t, "kill", e2e.LocalHosts(np), np, e2e.Options{Grace: 15 * time.Second})
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
			}
		})
	}
}

var abortResult = regexp.MustCompile(`\[(\d+)\]<stderr>:ABORT-RESULT err=(.*)`)

// A rank that calls kolo.Abort and leaves late: every other rank fails at once with its reason, and
// the launcher names it (not the first process to exit) as the rank that failed, with its exit code.
func TestAbortedRankIsBlamed(t *testing.T) {
	for _, np := range []int{2, 3} {
		t.Run(fmt.Sprintf("np=%d", np), func(t *testing.T) {
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

// Strangers connecting to the running job (random bytes, a wrong secret) are turned away while the
// job goes on and finishes correctly.
func TestStrangersRejectedWhileJobRuns(t *testing.T) {
	job := e2e.Launch(t, "steady", e2e.LocalHosts(3), 3, e2e.Options{Intrude: true})
	requireSuccess(t, job)
	if job.Intrusions < 8 { // rendezvous + 3 listeners, 2 kinds each
		t.Errorf("only %d intruding connections were made; the test did not exercise the listeners", job.Intrusions)
	}
}
