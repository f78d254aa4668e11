//go:build cgo && linux

package kolo_test

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kolo-dl/kolo/testbed/e2e"
	"github.com/kolo-dl/kolo/testbed/ncclstandin"
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

// Ops on device memory in separate processes, on the device path through internal/gpu/nccl's C
// layer and the stand-in NCCL, which reports any misuse of NCCL's or CUDA's API.
func TestDeviceThroughStandin(t *testing.T) {
	for _, tc := range []struct {
		name, scenario string
		np             int
	}{
		// Every op kind and dtype gives the right results.
		{"ops/np=2", "device", 2},
		{"ops/np=3", "device", 3},
		// Grouped calls (kolo.SubmitDeviceGroup) go to the engine as one group each.
		{"group", "device-group", 2},
		// A device op whose arguments are wrong on rank 1 (an unknown reduction, a NaN scale
		// factor, a scalar to gather, a negative dimension, a negative or another device
		// ordinal; one member of a grouped call) fails at once on every rank, the others with
		// rank 1's reason, not at the stall deadline (the scenario checks each op within 5 s);
		// the job goes on after.
		{"argument error fails every rank at once", "device-refused", 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			env, report := standinEnv(t)
			job := e2e.Launch(t, tc.scenario, e2e.LocalHosts(tc.np), tc.np, e2e.Options{Env: env})
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

// The real libnccl.so.2 and libcudart.so.12 (PyPI's wheels, scripts/nvidia_deps.sh) on a machine
// without a GPU: the ranks load them, decide to stage, and say why; nothing crashes.
func TestRealLibrariesStageWithoutAGPU(t *testing.T) {
	if _, err := exec.LookPath("nvidia-smi"); err == nil {
		t.Skip("a GPU machine")
	}
	wd, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	root := filepath.Join(wd, ".venv", "nvidia", "nvidia")
	nccl, cudart := filepath.Join(root, "nccl", "lib"), filepath.Join(root, "cuda_runtime", "lib")
	for _, lib := range []string{filepath.Join(nccl, "libnccl.so.2"), filepath.Join(cudart, "libcudart.so.12")} {
		if _, err := os.Stat(lib); err != nil {
			why := lib + " missing: PyPI's nvidia wheels are not installed (scripts/deps.sh installs them)"
			if os.Getenv("KOLO_REQUIRE_TESTBEDS") == "1" {
				t.Fatal(why)
			}
			t.Skip(why)
		}
	}
	job := e2e.Launch(t, "device-staged", e2e.LocalHosts(2), 2, e2e.Options{Env: map[string]string{
		"LD_LIBRARY_PATH": nccl + ":" + cudart}})
	requireSuccess(t, job)
	if n := strings.Count(job.Stdout.String(), "STAGED why="); n != 2 {
		t.Fatalf("%d ranks staged, want 2:\n%s", n, job.Stdout)
	}
	if !strings.Contains(job.Stdout.String(), "cudaError") {
		t.Errorf("the reason to stage is not CUDA's error:\n%s", job.Stdout)
	}
	t.Logf("%s", job.Stdout)
}
