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

// The default sizes keep a few ranks at the full sizes (the 2-rank speed) and share fixed budgets
// past that, so the segment of 64 local ranks fits in 512 MiB; explicit sizes are kept.
func TestDefaultSizesShareBudgets(t *testing.T) {
	for _, tc := range []struct {
		ranks           int
		slot, ring, msg int
		maxMiB          int64
	}{
		{2, 8 << 20, 1 << 20, 64 << 10, 18},
		{8, 8 << 20, 1 << 20, 64 << 10, 124},
		{16, 8 << 20, 272 << 10, 32 << 10, 200},
		{64, 3 << 20, 64 << 10, 8 << 10, 512},
	} {
		cfg, err := Config{Name: "x", Size: tc.ranks}.normalize()
		if err != nil {
			t.Fatal(err)
		}
		if cfg.SlotBytes != tc.slot || cfg.RingBytes != tc.ring || cfg.MsgRingBytes != tc.msg {
			t.Errorf("%d ranks: slot %d, ring %d, msg ring %d; want %d, %d, %d", tc.ranks,
				cfg.SlotBytes, cfg.RingBytes, cfg.MsgRingBytes, tc.slot, tc.ring, tc.msg)
		}
		if got := SegmentBytes(Config{Name: "x", Size: tc.ranks}) >> 20; got > tc.maxMiB {
			t.Errorf("%d ranks: segment of %d MiB, want at most %d", tc.ranks, got, tc.maxMiB)
		}
	}
	cfg, err := Config{Name: "x", Size: 64, SlotBytes: 8 << 20, RingBytes: 1 << 20, MsgRingBytes: 64 << 10}.normalize()
	if err != nil || cfg.SlotBytes != 8<<20 || cfg.RingBytes != 1<<20 || cfg.MsgRingBytes != 64<<10 {
		t.Errorf("explicit sizes not kept: %+v, %v", cfg, err)
	}
}
