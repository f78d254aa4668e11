//go:build cgo && linux

package kolo_test

import (
	"fmt"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kolo-dl/kolo/internal/e2e"
	"github.com/kolo-dl/kolo/internal/ncclstandin"
)

// standinEnv builds the stand-in NCCL and CUDA runtime and returns the environment that points
// ranks at it, as a user points kolo at an NCCL (LD_LIBRARY_PATH), and the file it reports
// misuse to.
func standinEnv(t *testing.T) (map[string]string, string) {
	t.Helper()
	libs, err := ncclstandin.Build(t.TempDir(), ncclstandin.Variant{})
	if err != nil {
		t.Fatal(err)
	}
	report := filepath.Join(t.TempDir(), "report")
	return map[string]string{"LD_LIBRARY_PATH": libs.Dir, "STANDIN_NCCL_DIR": t.TempDir(), "STANDIN_REPORT": report,
		"STANDIN_DEADLINE_S": "60"}, report
}

// Ranks in separate processes run ops on device memory on the device path, through gpu/nccl's C
// layer and the stand-in NCCL.
func TestDeviceOpsThroughStandin(t *testing.T) {
	for _, np := range []int{2, 3} {
		t.Run(fmt.Sprintf("np=%d", np), func(t *testing.T) {
			env, report := standinEnv(t)
			job := e2e.Launch(t, "device", e2e.LocalHosts(np), np, e2e.Options{Env: env})
			requireSuccess(t, job)
			if r := ncclstandin.Reports(report); r != "" {
				t.Errorf("the stand-in reported misuse:\n%s", r)
			}
		})
	}
}

// kill -9 one rank while the others are in a device allreduce: every other rank fails within 5 s
// naming it, its communicator aborted (the stand-in's collective would wait for the dead rank for
// ever otherwise).
func TestKilledRankFailsOthersOnDevice(t *testing.T) {
	for _, np := range []int{2, 3} {
		t.Run(fmt.Sprintf("np=%d", np), func(t *testing.T) {
			env, _ := standinEnv(t)
			job := e2e.Launch(t, "device-kill", e2e.LocalHosts(np), np, e2e.Options{Env: env, Grace: 15 * time.Second})
			if job.First == nil || job.First.Slot.Rank != 1 {
				t.Fatalf("first failure %+v, want rank 1 killed\n%s", job.First, job.Stderr)
			}
			seen := map[string]bool{}
			for _, m := range killResult.FindAllStringSubmatch(job.Stderr.String(), -1) {
				seen[m[1]] = true
				if ms, _ := strconv.Atoi(m[2]); ms > 5000 {
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
