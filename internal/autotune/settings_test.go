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
		{Settings{FusionBytes: 32 << 20, CycleTime: 0}, "fusion 32 MiB, cycle 0 ms"},
		{Settings{FusionBytes: 128 << 20, CycleTime: time.Millisecond}, "fusion 128 MiB, cycle 1 ms"},
		{Settings{FusionBytes: 0, CycleTime: 2500 * time.Microsecond}, "fusion off, cycle 2.5 ms"},
		{Settings{FusionBytes: 3 << 19, CycleTime: 1234567 * time.Nanosecond}, "fusion 1.5 MiB, cycle 1.23 ms"},
		{Settings{FusionBytes: 640 << 10, CycleTime: 25 * time.Millisecond}, "fusion 640 KiB, cycle 25 ms"},
		{Settings{FusionBytes: 100, CycleTime: time.Second}, "fusion 100 B, cycle 1000 ms"},
		{Settings{FusionBytes: 1 << 20, SmallAllreduceBytes: 64 << 10, SpinTime: 2500 * time.Nanosecond}, "fusion 1 MiB, cycle 0 ms, small allreduce 64 KiB, spin 2.5 us"},
		{Settings{FusionBytes: 1 << 20, Hierarchical: On, ResponseCache: Off}, "fusion 1 MiB, cycle 0 ms, hierarchical on, response cache off"},
	} {
		if got := tc.s.String(); got != tc.want {
			t.Errorf("%#v: %q, want %q", tc.s, got, tc.want)
		}
	}
}

func TestParseSettings(t *testing.T) {
	for _, s := range []Settings{{}, {FusionBytes: 1 << 20, CycleTime: 20 * time.Millisecond},
		{FusionBytes: 123456789, CycleTime: 1234 * time.Microsecond}, {FusionBytes: 256 << 20, CycleTime: 25 * time.Millisecond},
		{FusionBytes: 64 << 20, SmallAllreduceBytes: 32 << 10, SharedRoundBytes: 1 << 20, Hierarchical: Off},
		{SharedRoundBytes: 3 << 19, Hierarchical: On}, {FusionBytes: 1, SpinTime: 50 * time.Microsecond},
		{SpinTime: 1500 * time.Nanosecond}, {SpinTime: 1}, {ResponseCache: Off}, {FusionBytes: 2, ResponseCache: On, Hierarchical: Off}} {
		got, err := ParseSettings((&Tuner{}).columns(s, PhaseDecided, 0))
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
		{ColumnFusionBytes: "1", ColumnCycleMs: "1", ColumnSpinUs: "0"},
		{ColumnFusionBytes: "1", ColumnCycleMs: "1", ColumnSpinUs: "-5"},
		{ColumnFusionBytes: "1", ColumnCycleMs: "1", ColumnSpinUs: "NaN"},
		{ColumnFusionBytes: "1", ColumnCycleMs: "1", ColumnSpinUs: "1e300"},
		{ColumnFusionBytes: "1", ColumnCycleMs: "1", ColumnSpinUs: "fast"},
		{ColumnFusionBytes: "1", ColumnCycleMs: "1", ColumnResponseCache: "yes"},
		{ColumnFusionBytes: "1", ColumnCycleMs: "1", ColumnHierarchical: "1"},
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
		{Settings{FusionBytes: 1 << 20, CycleTime: 20 * time.Millisecond}, Settings{FusionBytes: MaxFusionBytes, CycleTime: 0}},
		{Settings{FusionBytes: 128 << 20, CycleTime: 0}, Settings{FusionBytes: 0, CycleTime: MaxCycleTime}},
		{Settings{FusionBytes: 0, CycleTime: 0}, Settings{FusionBytes: MaxFusionBytes, CycleTime: MaxCycleTime}},
		// 16 MiB is past the middle of log(bytes + 1 MiB) over [0, 256 MiB].
		{Settings{FusionBytes: 16 << 20, CycleTime: 12 * time.Millisecond}, Settings{FusionBytes: 0, CycleTime: MaxCycleTime}},
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
		{Result{Decided: true, Chosen: Settings{FusionBytes: 32 << 20, CycleTime: 0}, Best: Settings{FusionBytes: 32 << 20, CycleTime: 0}, HaveBest: true,
			Speedup: 1.0712, Low: 1.0351, High: 1.0987, Pairs: 5, DecidedAt: 240},
			"autotune: fusion 32 MiB, cycle 0 ms: 1.07x the defaults' steps/s (95% CI 1.04-1.10), decided at step 240"},
		{Result{Decided: true, Chosen: Settings{FusionBytes: 128 << 20, CycleTime: 0}, KeptDefaults: true, Best: Settings{FusionBytes: 8 << 20, CycleTime: time.Millisecond}, HaveBest: true,
			Speedup: 1.01, Low: 0.98, High: 1.04, Pairs: 5, DecidedAt: 300},
			"autotune: kept the defaults (fusion 128 MiB, cycle 0 ms): no candidate was faster with 95% confidence (best: fusion 8 MiB, cycle 1 ms at 1.01x, 95% CI 0.98-1.04), decided at step 300"},
		{Result{Decided: true, Chosen: Settings{FusionBytes: 128 << 20, CycleTime: 0}, KeptDefaults: true, Speedup: nan, Low: nan, High: nan, DecidedAt: 90},
			"autotune: kept the defaults (fusion 128 MiB, cycle 0 ms): no candidate was faster with 95% confidence, decided at step 90"},
		{Result{Chosen: Settings{FusionBytes: 128 << 20, CycleTime: 0}, KeptDefaults: true, Samples: 4, Best: Settings{FusionBytes: 0, CycleTime: 25 * time.Millisecond}, HaveBest: true,
			Speedup: 0.5, Low: 0, High: math.Inf(1), Pairs: 3},
			"autotune: no decision yet after 4 samples (best so far: fusion off, cycle 25 ms at 0.50x, 95% CI not yet known)"},
		// One pair's interval is finite and meaningless (0.00-1654685463.00 was printed once): not
		// printed.
		{Result{Decided: true, Chosen: Settings{FusionBytes: 1 << 20, CycleTime: 20 * time.Millisecond}, KeptDefaults: true,
			Best: Settings{FusionBytes: 1 << 20, CycleTime: 20 * time.Millisecond, SmallAllreduceBytes: 4 << 20}, HaveBest: true,
			Speedup: 1.09, Low: 1e-9, High: 1654685463, Pairs: 1, DecidedAt: 116},
			"autotune: kept the defaults (fusion 1 MiB, cycle 20 ms): no candidate was faster with 95% confidence (best: fusion 1 MiB, cycle 20 ms, small allreduce 4 MiB at 1.09x from 1 pair, too few for an interval), decided at step 116"},
		{Result{Chosen: Settings{FusionBytes: 128 << 20, CycleTime: 0}, KeptDefaults: true, Speedup: nan, Low: nan, High: nan},
			"autotune: no decision yet after 0 samples"},
	} {
		if got := tc.r.String(); got != tc.want {
			t.Errorf("got  %s\nwant %s", got, tc.want)
		}
	}
}
