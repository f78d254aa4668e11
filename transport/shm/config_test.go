package shm

import (
	"runtime"
	"strconv"
	"testing"
	"time"

	"github.com/kolo-dl/kolo/internal/spin"
)

// The default spin follows the rule the engine follows (internal/spin): poll where every local rank
// has a CPU, yield instead where they outnumber the CPUs. An explicit Spin, or Yields, is kept.
func TestNormalizeSpinDefaults(t *testing.T) {
	cpus := runtime.NumCPU()
	t.Setenv("KOLO_HOST_CPUS", strconv.Itoa(cpus)) // as kolo run may have set it otherwise
	if cpus+1 > maxRanks {
		t.Skipf("%d CPUs: cannot oversubscribe within %d ranks", cpus, maxRanks)
	}
	for _, tc := range []struct {
		name       string
		size       int
		spin       time.Duration
		yields     int
		wantSpin   time.Duration
		wantYields int
	}{
		{"a CPU per rank", cpus, 0, 0, spin.DefaultSpin, 0},
		{"oversubscribed", cpus + 1, 0, 0, -1, spin.DefaultYields},
		{"oversubscribed, yields given", cpus + 1, 0, 3, -1, 3},
		{"never spin", cpus + 1, -1, 0, -1, 0},
		{"spin given", cpus + 1, 20 * time.Microsecond, 0, 20 * time.Microsecond, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := Config{Name: "kolo-test", Rank: 0, Size: tc.size, Spin: tc.spin, Yields: tc.yields}.normalize()
			if err != nil {
				t.Fatal(err)
			}
			if got.Spin != tc.wantSpin || got.Yields != tc.wantYields {
				t.Errorf("size %d on %d CPUs: Spin %v, Yields %d; want %v, %d", tc.size, cpus, got.Spin, got.Yields, tc.wantSpin, tc.wantYields)
			}
		})
	}
}
