package kolo_test

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kolo-dl/kolo/testbed/e2e"
)

// Ranks started by mpirun, with no kolo run: rank 0 hosts the rendezvous and the others find it
// through the file in KOLO_RENDEZVOUS_DIR (or through an address and secret given with -x).
func TestMPIRun(t *testing.T) {
	mpirun, err := exec.LookPath("mpirun")
	if err != nil {
		e2e.Unavailable(t, "no mpirun (apt-get install openmpi-bin)")
	}
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name  string
		given bool // KOLO_RENDEZVOUS_ADDR and KOLO_SECRET given with -x: no file
	}{
		{"rendezvous file", false},
		{"address and secret given", true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "rv")
			args := []string{"--allow-run-as-root", "--oversubscribe", "-np", "3",
				"-x", e2e.WorkerEnv + "=launcher", "-x", e2e.ExpectEnv + "=3,3,1", "-x", "KOLO_RENDEZVOUS_DIR=" + dir}
			var extraEnv []string
			if tc.given {
				addr := freeAddr(t)
				// The secret goes through mpirun's environment (-x NAME), never its command line.
				extraEnv = append(extraEnv, "KOLO_SECRET=9e1f0c2b7a6d5e4f3a2b1c0d9e8f7a6b")
				args = append(args, "-x", "KOLO_RENDEZVOUS_ADDR="+addr, "-x", "KOLO_SECRET")
			}
			args = append(args, self, "-test.run=^$")
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			cmd := exec.CommandContext(ctx, mpirun, args...)
			cmd.Env = append(withoutKolo(os.Environ()), extraEnv...)
			cmd.WaitDelay = 5 * time.Second
			out, err := cmd.CombinedOutput()
			if err != nil {
				t.Fatalf("mpirun: %v\n%s", err, out)
			}
			if n := strings.Count(string(out), "LAUNCHER-OK"); n != 3 {
				t.Fatalf("%d of 3 ranks reported success:\n%s", n, out)
			}
			entries, _ := os.ReadDir(dir)
			if tc.given && entries != nil {
				t.Errorf("rendezvous directory written although the address and secret were given: %v", entries)
			}
			if !tc.given && len(entries) != 0 {
				t.Errorf("rank 0 left its rendezvous file behind: %v", entries)
			}
		})
	}
}

// A one-node Slurm cluster (munge, slurmctld, slurmd started by the test): srun -n 4 and an sbatch
// script that calls srun, each running every collective against the reference.
func TestSlurm(t *testing.T) {
	slurm := e2e.StartSlurm(t, 8)
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(t.TempDir(), "rv")
	jobEnv := []string{e2e.WorkerEnv + "=launcher", e2e.ExpectEnv + "=4,4,1", "KOLO_RENDEZVOUS_DIR=" + dir}

	t.Run("srun -n 4", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		cmd := slurm.Command(ctx, jobEnv, "srun", "-n", "4", "--kill-on-bad-exit=1", self, "-test.run=^$")
		cmd.Env = withoutKolo(cmd.Env)
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("srun: %v\n%s", err, out)
		}
		if n := strings.Count(string(out), "LAUNCHER-OK"); n != 4 {
			t.Fatalf("%d of 4 tasks reported success:\n%s", n, out)
		}
	})

	t.Run("sbatch", func(t *testing.T) {
		// The batch script itself sees SLURM_PROCID=0 and SLURM_NTASKS=4 but is no rank: only
		// the srun inside it starts ranks.
		script := fmt.Sprintf("#!/bin/sh\nset -e\nsrun --kill-on-bad-exit=1 %s -test.run='^$'\necho BATCH-DONE\n", self)
		state, output := slurm.Sbatch(t, 2*time.Minute, script, withoutKolo(jobEnv), "-n", "4")
		out, _ := os.ReadFile(output)
		if state != "COMPLETED" || strings.Count(string(out), "LAUNCHER-OK") != 4 || !strings.Contains(string(out), "BATCH-DONE") {
			t.Fatalf("job %s; output:\n%s", state, out)
		}
	})

	t.Run("srun autotune", func(t *testing.T) {
		// Autotuning under Slurm: the settings reach the tasks through the environment srun
		// passes, rank 0 tunes, every rank switches, and the sums stay right throughout.
		log := filepath.Join(t.TempDir(), "autotune.csv")
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		env := []string{e2e.WorkerEnv + "=autotune", "KOLO_RENDEZVOUS_DIR=" + dir, "KOLO_AUTOTUNE=1", "KOLO_AUTOTUNE_LOG=" + log,
			"KOLO_AUTOTUNE_STEPS_PER_SAMPLE=2", "KOLO_AUTOTUNE_WARMUP_SAMPLES=1", "KOLO_AUTOTUNE_BAYES_OPT_MAX_SAMPLES=8"}
		cmd := slurm.Command(ctx, env, "srun", "-n", "2", "--kill-on-bad-exit=1", self, "-test.run=^$")
		cmd.Env = withoutKolo(cmd.Env)
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("srun: %v\n%s", err, out)
		}
		if n := strings.Count(string(out), "AUTOTUNE-OK"); n != 2 || !strings.Contains(string(out), "decided at step") {
			t.Fatalf("%d of 2 tasks finished, or no decision was reported:\n%s", n, out)
		}
		text, err := os.ReadFile(log)
		if err != nil || !strings.Contains(string(text), "lower is better") || !strings.Contains(string(text), ",chosen,") {
			t.Fatalf("the autotune log (%v):\n%s", err, text)
		}
	})
	if entries, _ := os.ReadDir(dir); len(entries) != 0 {
		t.Errorf("rendezvous files left behind: %v", entries)
	}
}

// withoutKolo drops KOLO_* variables a test run may have inherited (a test run under kolo run),
// which would make the ranks think kolo run started them.
func withoutKolo(env []string) []string {
	var out []string
	for _, kv := range env {
		if !strings.HasPrefix(kv, "KOLO_RANK=") && !strings.HasPrefix(kv, "KOLO_RENDEZVOUS_ADDR=") && !strings.HasPrefix(kv, "KOLO_SECRET=") {
			out = append(out, kv)
		}
	}
	return out
}

func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := (&net.ListenConfig{}).Listen(context.Background(), "tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}
