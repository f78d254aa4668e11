// Package slurm_test runs deploy/slurm/kolo-mnist.sbatch, the example users copy, on a private
// one-node Slurm cluster: it must train the PyTorch example to the same parameters on every rank,
// with a falling loss, under srun with 2 and with 4 tasks.
package slurm_test

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kolo-dl/kolo/testbed/e2e"
)

const (
	python  = "/usr/bin/python3" // Debian's, with python3-torch
	dataDir = "/usr/share/datasets/fashion-mnist"
)

func TestSbatchTrainsExample(t *testing.T) {
	if testing.Short() {
		t.Skip("trains a model under Slurm (about a minute)")
	}
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(python, "-c", "import torch, numpy").CombinedOutput(); err != nil {
		e2e.Unavailable(t, "%s cannot import torch and numpy (apt-get install python3-torch): %v %s", python, err, out)
	}
	if _, err := os.Stat(dataDir); err != nil {
		e2e.Unavailable(t, "no Fashion-MNIST data (apt-get install dataset-fashion-mnist): %v", err)
	}
	script, err := os.ReadFile(filepath.Join(root, "deploy", "slurm", "kolo-mnist.sbatch"))
	if err != nil {
		t.Fatal(err)
	}
	lib := buildLibrary(t, root)
	slurm := e2e.StartSlurm(t, 8)

	for _, tasks := range []int{2, 4} {
		t.Run(fmt.Sprintf("tasks=%d", tasks), func(t *testing.T) {
			env := append(withoutKolo(os.Environ()),
				"PYTHON="+python,
				"TRAIN="+filepath.Join(root, "deploy", "train_check.py"),
				"TRAIN_ARGS=--epochs 1 --max-steps 16 --log-interval 2 --max-test-samples 500",
				"PYTHONPATH="+filepath.Join(root, "python"),
				"KOLO_LIBRARY="+lib,
				"KOLO_RENDEZVOUS_DIR="+filepath.Join(t.TempDir(), "rendezvous"),
			)
			start := time.Now()
			state, output := slurm.Sbatch(t, 5*time.Minute, string(script), env, "-n", fmt.Sprint(tasks))
			out, _ := os.ReadFile(output)
			t.Logf("job %s in %s", state, time.Since(start).Round(time.Second))
			if state != "COMPLETED" {
				t.Fatalf("job %s; output:\n%s", state, out)
			}
			check := exec.Command(python, filepath.Join(root, "deploy", "check_output.py"),
				"--ranks", fmt.Sprint(tasks), output)
			res, err := check.CombinedOutput()
			t.Logf("%s", strings.TrimSpace(string(res)))
			if err != nil {
				t.Fatalf("check_output: %v; job output:\n%s", err, out)
			}
		})
	}
}

// buildLibrary builds the engine library the Python package loads (KOLO_LIBRARY), from this
// checkout, so that the test never runs a stale python/kolo/lib.
func buildLibrary(t *testing.T, root string) string {
	t.Helper()
	goBin, err := exec.LookPath("go")
	if err != nil {
		goBin = "/usr/local/go/bin/go"
	}
	lib := filepath.Join(t.TempDir(), "libkolo.so")
	cmd := exec.Command(goBin, "build", "-buildmode=c-shared", "-o", lib, "./capi")
	cmd.Dir = root
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build the engine library: %v\n%s", err, out)
	}
	return lib
}

// withoutKolo drops variables of a test run that itself runs under kolo run, which would make
// the tasks think kolo run started them.
func withoutKolo(env []string) []string {
	var out []string
	for _, kv := range env {
		if !strings.HasPrefix(kv, "KOLO_") && !strings.HasPrefix(kv, "HOROVOD_") {
			out = append(out, kv)
		}
	}
	return out
}
