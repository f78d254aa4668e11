package kolo_test

import (
	"fmt"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"runtime"
	"sync"
	"testing"

	"github.com/kolo-dl/kolo/testbed/e2e"
)

// The end-to-end tests start real ranks: this test binary re-executed to run a scenario of
// testbed/e2e (scenarios_<family>.go, listed in e2e.Scenarios), or kolo run and the examples
// built from this tree. A feature's end-to-end tests are in <feature>_e2e_test.go; the other
// files test the package's API in this process.
//
// A test calls t.Parallel only if its jobs share nothing with another's: the rendezvous listens on
// port 0, a fresh job id names the shared-memory segments, files lie under t.TempDir, network
// namespaces are named per call, and no environment variable of this process is set. Tests with a
// bound on time (a kill noticed within seconds, a progress deadline, an elastic resume), with a
// port picked and then freed, with a Slurm cluster, or that look at /dev/shm as a whole run one
// after another: on two cores a neighbour's ranks would eat into their bounds.
func TestMain(m *testing.M) {
	e2e.Main() // in a re-executed rank: runs its scenario and exits
	dir, err := os.MkdirTemp("", "kolo-test-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	binDir = dir
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

func requireSuccess(t *testing.T, job *e2e.Job) {
	t.Helper()
	if job.First != nil {
		t.Fatalf("rank %d failed (%s)\nstderr:\n%s\nstdout:\n%s", job.First.Slot.Rank, job.First.Exit, job.Stderr, job.Stdout)
	}
}

// binDir holds the commands the end-to-end tests build; TestMain makes and removes it.
var binDir string

// builds is one build per package path: about twenty tests run kolo and the examples, and a link
// each cost seconds on a small machine. Tests only execute the binaries, never change them.
var builds sync.Map // package path -> *build

type build struct {
	once sync.Once
	bin  string
	err  error
	out  []byte
}

// buildOnce builds the main package pkg (a path relative to the module root) on first use and
// returns its binary.
func buildOnce(t testing.TB, pkg string) string {
	t.Helper()
	v, _ := builds.LoadOrStore(pkg, &build{})
	b := v.(*build)
	b.once.Do(func() {
		gobin, err := exec.LookPath("go")
		if err != nil {
			gobin = filepath.Join(runtime.GOROOT(), "bin", "go")
		}
		dir := binDir
		if dir == "" {
			if dir, b.err = os.MkdirTemp("", "kolo-test-bin-"); b.err != nil {
				return
			}
		}
		b.bin = filepath.Join(dir, path.Base(pkg))
		b.out, b.err = exec.Command(gobin, "build", "-o", b.bin, pkg).CombinedOutput()
	})
	if b.err != nil {
		t.Fatalf("go build %s: %v\n%s", pkg, b.err, b.out)
	}
	return b.bin
}
