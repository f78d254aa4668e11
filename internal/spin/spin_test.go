package spin

import (
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kolo-dl/kolo/internal/cpuset"
)

// Pause returns, promptly, however often it is called.
func TestPauseReturns(t *testing.T) {
	const beats = 10000
	start := time.Now()
	for range beats {
		Pause()
	}
	if took := time.Since(start); took > time.Second {
		t.Errorf("%d pauses took %v; a pause should last at most a few microseconds", beats, took)
	}
}

// Polling is the default only where every rank has a CPU; elsewhere yielding replaces it.
func TestDefaultsFollowOversubscription(t *testing.T) {
	cpus := runtime.NumCPU()
	t.Setenv("KOLO_HOST_CPUS", strconv.Itoa(cpus)) // as kolo run may have set it otherwise
	if s, y := Defaults(cpus); s != DefaultSpin || y != 0 {
		t.Errorf("Defaults(%d) on %d CPUs = %v, %d; want %v, 0", cpus, cpus, s, y, DefaultSpin)
	}
	if s, y := Defaults(1); s != DefaultSpin || y != 0 {
		t.Errorf("Defaults(1) = %v, %d; want %v, 0", s, y, DefaultSpin)
	}
	if s, y := Defaults(cpus + 1); s != 0 || y != DefaultYields {
		t.Errorf("Defaults(%d) on %d CPUs = %v, %d; want 0, %d", cpus+1, cpus, s, y, DefaultYields)
	}
}

func TestHostCPUsFollowsTheLauncher(t *testing.T) {
	t.Setenv("KOLO_HOST_CPUS", "")
	if got := HostCPUs(); got != runtime.NumCPU() {
		t.Errorf("unbound: HostCPUs = %d, want NumCPU %d", got, runtime.NumCPU())
	}
	t.Setenv("KOLO_HOST_CPUS", "64")
	if got := HostCPUs(); got != 64 {
		t.Errorf("bound: HostCPUs = %d, want what kolo run said (64)", got)
	}
	// 3 ranks on a 64-CPU machine are not oversubscribed, though a bound rank's mask shows 1 CPU.
	if spin, yields := Defaults(3); spin != DefaultSpin || yields != 0 {
		t.Errorf("Defaults(3) on 64 CPUs = %v, %d; want spinning", spin, yields)
	}
	t.Setenv("KOLO_HOST_CPUS", "junk")
	if got := HostCPUs(); got != runtime.NumCPU() {
		t.Errorf("junk: HostCPUs = %d, want NumCPU", got)
	}
}

// A rank that its launcher bound to one CPU (as mpirun does for 2 ranks) counts the launcher's
// CPUs, not its own one.
func TestHostCPUsOfABoundChildAreItsParents(t *testing.T) {
	if os.Getenv("KOLO_SPIN_TEST_CHILD") != "" {
		t.Skip("the child's half of this test runs in TestHelperPrintCPUs")
	}
	parent, err := cpuset.Current()
	if err != nil || len(parent) < 2 {
		t.Skipf("needs 2 CPUs to bind a child to one of them (have %v, %v)", parent, err)
	}
	taskset, err := exec.LookPath("taskset")
	if err != nil {
		t.Skip("no taskset to bind the child")
	}
	// taskset binds the child and becomes it (exec), so its parent is this unbound process.
	cmd := exec.Command(taskset, "-c", strconv.Itoa(parent[0]), os.Args[0], "-test.run=^TestHelperPrintCPUs$")
	cmd.Env = append(os.Environ(), "KOLO_SPIN_TEST_CHILD=1", "KOLO_HOST_CPUS=")
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("child: %v\n%s", err, out)
	}
	want := fmt.Sprintf("numcpu=1 hostcpus=%d", len(parent))
	if !strings.Contains(string(out), want) {
		t.Errorf("bound child printed %q, want %q", out, want)
	}
}

func TestHelperPrintCPUs(t *testing.T) {
	if os.Getenv("KOLO_SPIN_TEST_CHILD") == "" {
		t.Skip("run by TestHostCPUsOfABoundChildAreItsParents")
	}
	fmt.Printf("numcpu=%d hostcpus=%d\n", runtime.NumCPU(), HostCPUs())
}
