package autotune

import (
	"math"
	"testing"
	"time"
)

func TestSettingsString(t *testing.T) {
	for _, tc := range []struct {
		s    Settings
		want string
	}{
		{Settings{32 << 20, 0}, "fusion 32 MiB, cycle 0 ms"},
		{Settings{128 << 20, time.Millisecond}, "fusion 128 MiB, cycle 1 ms"},
		{Settings{0, 2500 * time.Microsecond}, "fusion off, cycle 2.5 ms"},
		{Settings{3 << 19, 1234567 * time.Nanosecond}, "fusion 1.5 MiB, cycle 1.23 ms"},
		{Settings{640 << 10, 25 * time.Millisecond}, "fusion 640 KiB, cycle 25 ms"},
		{Settings{100, time.Second}, "fusion 100 B, cycle 1000 ms"},
	} {
		if got := tc.s.String(); got != tc.want {
			t.Errorf("%#v: %q, want %q", tc.s, got, tc.want)
		}
	}
}

func TestParseSettings(t *testing.T) {
	for _, s := range []Settings{{}, {1 << 20, 20 * time.Millisecond}, {123456789, 1234 * time.Microsecond}, {256 << 20, 25 * time.Millisecond}} {
		got, err := ParseSettings(s.columns(PhaseDecided))
		if err != nil || got != s {
			t.Errorf("%v: read back %v, %v", s, got, err)
		}
	}
	for _, cols := range []map[string]string{
		{},
		{ColumnFusionBytes: "1048576"},
		{ColumnCycleMs: "1"},
		{ColumnFusionBytes: "-1", ColumnCycleMs: "1"},
		{ColumnFusionBytes: "1.5", ColumnCycleMs: "1"},
		{ColumnFusionBytes: "1", ColumnCycleMs: "-1"},
		{ColumnFusionBytes: "1", ColumnCycleMs: "NaN"},
		{ColumnFusionBytes: "1", ColumnCycleMs: "1e300"},
		{ColumnFusionBytes: "1", ColumnCycleMs: ""},
	} {
		if s, err := ParseSettings(cols); err == nil {
			t.Errorf("%v: read %v, want an error", cols, s)
		}
	}
}

// TestFarCorner: the first candidate is the box's corner farthest from the defaults, in the
// model's (log-scaled) coordinates.
func TestFarCorner(t *testing.T) {
	for _, tc := range []struct {
		defaults, want Settings
	}{
		{Settings{1 << 20, 20 * time.Millisecond}, Settings{MaxFusionBytes, 0}},
		{Settings{128 << 20, 0}, Settings{0, MaxCycleTime}},
		{Settings{0, 0}, Settings{MaxFusionBytes, MaxCycleTime}},
		// 16 MiB is past the middle of log(bytes + 1 MiB) over [0, 256 MiB].
		{Settings{16 << 20, 12 * time.Millisecond}, Settings{0, MaxCycleTime}},
	} {
		if got := newSpace(tc.defaults, MaxCycleTime).farCorner(tc.defaults); got != tc.want {
			t.Errorf("defaults %v: corner %v, want %v", tc.defaults, got, tc.want)
		}
	}
}

func TestResultString(t *testing.T) {
	nan := math.NaN()
	for _, tc := range []struct {
		r    Result
		want string
	}{
		{Result{Decided: true, Chosen: Settings{32 << 20, 0}, Best: Settings{32 << 20, 0}, HaveBest: true,
			Speedup: 1.0712, Low: 1.0351, High: 1.0987, DecidedAt: 240},
			"autotune: fusion 32 MiB, cycle 0 ms: 1.07x the defaults' steps/s (95% CI 1.04-1.10), decided at step 240"},
		{Result{Decided: true, Chosen: Settings{128 << 20, 0}, KeptDefaults: true, Best: Settings{8 << 20, time.Millisecond}, HaveBest: true,
			Speedup: 1.01, Low: 0.98, High: 1.04, DecidedAt: 300},
			"autotune: kept the defaults (fusion 128 MiB, cycle 0 ms): no candidate was faster with 95% confidence (best: fusion 8 MiB, cycle 1 ms at 1.01x, 95% CI 0.98-1.04), decided at step 300"},
		{Result{Decided: true, Chosen: Settings{128 << 20, 0}, KeptDefaults: true, Speedup: nan, Low: nan, High: nan, DecidedAt: 90},
			"autotune: kept the defaults (fusion 128 MiB, cycle 0 ms): no candidate was faster with 95% confidence, decided at step 90"},
		{Result{Chosen: Settings{128 << 20, 0}, KeptDefaults: true, Samples: 4, Best: Settings{0, 25 * time.Millisecond}, HaveBest: true,
			Speedup: 0.5, Low: 0, High: math.Inf(1)},
			"autotune: no decision yet after 4 samples (best so far: fusion off, cycle 25 ms at 0.50x, 95% CI not yet known)"},
		{Result{Chosen: Settings{128 << 20, 0}, KeptDefaults: true, Speedup: nan, Low: nan, High: nan},
			"autotune: no decision yet after 0 samples"},
	} {
		if got := tc.r.String(); got != tc.want {
			t.Errorf("got  %s\nwant %s", got, tc.want)
		}
	}
}
