package autotune

import (
	"fmt"
	"math"

	"github.com/kolo-dl/kolo/internal/autotune/decide"
)

// Result is the tuner's decision, or before it what is known.
type Result struct {
	// Decided says the tuner is done; the other fields are final.
	Decided bool
	// Chosen is the settings to run with: of the candidates found faster than the defaults (95%
	// confidence over the run), the one with the highest estimated speed-up; or the defaults
	// (KeptDefaults).
	Chosen       Settings
	KeptDefaults bool
	// Best is the candidate behind Speedup, Low and High: the chosen one, or, when the defaults
	// are kept, the one measured fastest (HaveBest false if none was measured).
	Best     Settings
	HaveBest bool
	// Speedup is Best's steps/s over the defaults' (geometric mean over its pairs), and Low-High its
	// 95% confidence interval; NaN when unknown. Pairs is the number of pairs behind them.
	Speedup, Low, High float64
	Pairs              int
	// DecidedAt is the step whose sample settled it; the switch, if any, applies Lag steps later.
	DecidedAt int64
	// Samples is the number of samples measured after warm-up; Candidates the number of
	// candidates measured.
	Samples    int
	Candidates int
}

// String reads like "autotune: fusion 32 MiB, cycle 0 ms: 1.07x the defaults' steps/s (95% CI
// 1.04-1.10), decided at step 240", or, when the defaults are kept, "autotune: kept the defaults
// (fusion 128 MiB, cycle 0 ms): no candidate was faster with 95% confidence (best: fusion 8 MiB,
// cycle 1 ms at 1.01x, 95% CI 0.98-1.04), decided at step 300".
func (r Result) String() string {
	if !r.Decided {
		s := fmt.Sprintf("autotune: no decision yet after %d samples", r.Samples)
		if r.HaveBest {
			s += fmt.Sprintf(" (best so far: %v at %s)", r.Best, r.speedup())
		}
		return s
	}
	if !r.KeptDefaults {
		return fmt.Sprintf("autotune: %v: %.2fx the defaults' steps/s%s, decided at step %d",
			r.Chosen, r.Speedup, r.interval(" (", ")"), r.DecidedAt)
	}
	s := fmt.Sprintf("autotune: kept the defaults (%v): no candidate was faster with 95%% confidence", r.Chosen)
	if r.HaveBest {
		s += fmt.Sprintf(" (best: %v at %s)", r.Best, r.speedup())
	}
	return s + fmt.Sprintf(", decided at step %d", r.DecidedAt)
}

func (r Result) speedup() string {
	return fmt.Sprintf("%.2fx%s", r.Speedup, r.interval(", ", ""))
}

// interval is ", 95% CI Low-High" (between open and close), or why there is none: an interval from
// fewer pairs than a verdict needs estimates the noise from one or two differences, and is as wide
// as it is meaningless, so it is not printed.
func (r Result) interval(open, close string) string {
	switch {
	case r.Pairs < decide.MinPairs:
		return fmt.Sprintf(" from %d pair%s, too few for an interval", r.Pairs, map[bool]string{true: "", false: "s"}[r.Pairs == 1])
	case math.IsNaN(r.Low) || math.IsNaN(r.High) || r.Low <= 0 || math.IsInf(r.High, 0):
		return open + "95% CI not yet known" + close
	}
	return fmt.Sprintf("%s95%% CI %.2f-%.2f%s", open, r.Low, r.High, close)
}
