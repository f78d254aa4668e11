package spin

import (
	"runtime"
	"testing"
	"time"
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
