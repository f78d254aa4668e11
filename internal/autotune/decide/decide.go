// Package decide is the autotuner's last word: given step times of the defaults and of a candidate,
// measured interleaved in time (defaults, candidate, defaults, candidate, ..., defaults), it says
// whether the candidate is faster with 95% confidence, surely not worth switching to, or not yet
// known, and gives the speed-up with its confidence interval for the user to read.
//
// The rule is built so that tuning never makes a job slower by chance:
//
//   - Each candidate sample is compared with the two defaults samples either side of it (their
//     geometric mean), so anything that changes the machine's speed slowly (other jobs, thermal
//     throttling, a linear warm-up) moves both sides of the ratio and cancels.
//   - The interval is a Student t interval on the log ratios: log because speed-ups multiply and a
//     ratio's log is close to symmetric; t because there are few pairs (a handful to a few dozen)
//     and their spread is estimated from the same pairs. A bootstrap would need more pairs than a
//     tuning run can afford to be trustworthy. Adjacent ratios share a defaults sample, so they are
//     positively correlated; the variance adds that covariance (estimated from successive defaults
//     samples) instead of pretending the ratios are independent, which would make the interval too
//     narrow. A caller that measures several candidates against the same defaults may pass the
//     run's pooled spread (Rule.Pooled), which with more degrees of freedom narrows the t
//     quantile; it is used only when the candidate's own pairs spread no wider, so a noisier
//     candidate is judged by its own noise.
//   - The caller looks after every pair and stops at the first verdict, which with a fixed 95%
//     interval would crown a no-better candidate far more often than 5% of the time. So the interval
//     at each look is at level 1-(1-Confidence)/looks (Bonferroni over the MaxPairs-MinPairs+1
//     possible looks): the intervals hold simultaneously, and the chance of ever crowning a
//     candidate that is not faster stays under (1-Confidence)/2 however often the caller looks.
//   - Reaching MaxPairs undecided keeps the defaults.
//
// The package does arithmetic only: the caller measures, and decides what a sample is (the median of
// a few steps, say).
package decide

import (
	"errors"
	"fmt"
	"math"

	"gonum.org/v1/gonum/stat/distuv"
)

// Verdict is what the samples so far say about the candidate.
type Verdict int

const (
	// Undecided: more samples are needed, or, once Result.Done, none will tell and the defaults stay.
	Undecided Verdict = iota
	// Better: the candidate is faster; the whole interval is above 1.
	Better
	// NotBetter: the candidate is slower, or no faster than NoGain; the interval says so.
	NotBetter
)

const (
	// NoGain is the speed-up below which switching is not worth it: an interval entirely below it is
	// NotBetter even if it is above 1, since a gain that small is within what a different day's
	// conditions undo.
	NoGain = 1.01
	// MinPairs is the fewest pairs a verdict is given from: with fewer, the spread itself is a guess.
	MinPairs = 3
)

// Rule sets the decision's confidence and its budget. Its zero value is the default rule: 95%
// confidence, at most 20 pairs.
type Rule struct {
	// Confidence is the simultaneous confidence of the intervals over all looks. 0 means 0.95.
	Confidence float64
	// MaxPairs is the most pairs the caller will measure; Undecided there is final and keeps the
	// defaults. It also sets the number of looks the confidence is spread over. 0 means 20.
	MaxPairs int
	// Pooled, when its DF exceeds the pairs' own (pairs - 1), is the variance of one pair's log
	// speed-up estimated from more comparisons of the same run, these pairs among them (a pooled
	// variance, as in an analysis of variance). The interval then takes it and its degrees of
	// freedom in place of the pairs' own spread, unless that spread is the larger: a few pairs
	// estimate their spread so poorly that the t quantile with 2-4 degrees of freedom, not the
	// spread, sets most of the interval's width, and a pooled estimate narrows it without
	// assuming anything of this candidate but that its noise is no larger than the run's.
	Pooled Spread
}

// Spread is a variance estimate and its degrees of freedom.
type Spread struct {
	Var float64
	DF  int
}

// Result is the comparison's outcome. Speedup, Low and High are the defaults' time over the
// candidate's (the candidate's steps/s over the defaults'): above 1 the candidate is faster.
type Result struct {
	Verdict Verdict
	// Done says no more samples are wanted: a verdict is reached, or MaxPairs pairs were measured.
	Done bool
	// Pairs is the number of candidate samples with a defaults sample on both sides.
	Pairs int
	// Speedup is the geometric mean of the pairs' speed-ups; NaN with no pairs.
	Speedup float64
	// Low and High bound the speed-up at the rule's Confidence, simultaneously over all looks; 0 and
	// +Inf while there are fewer than MinPairs pairs.
	Low, High float64
}

// Errors callers may branch on.
var (
	ErrNoSamples = errors.New("decide: no samples")
	ErrOrder     = errors.New("decide: samples are not interleaved defaults, candidate, ..., defaults")
	ErrBadTime   = errors.New("decide: step time is not a positive finite number of seconds")
	ErrBadRule   = errors.New("decide: bad rule")
)

func (r Rule) withDefaults() (Rule, error) {
	if r.Confidence == 0 {
		r.Confidence = 0.95
	}
	if r.MaxPairs == 0 {
		r.MaxPairs = 20
	}
	switch {
	case !(r.Confidence > 0 && r.Confidence < 1):
		return r, fmt.Errorf("%w: confidence %g not in (0, 1)", ErrBadRule, r.Confidence)
	case r.MaxPairs < MinPairs:
		return r, fmt.Errorf("%w: max pairs %d below min pairs %d", ErrBadRule, r.MaxPairs, MinPairs)
	}
	return r, nil
}

// Compare judges the candidate from step times in seconds taken alternately: defaults[0],
// candidate[0], defaults[1], candidate[1], ... A candidate sample counts once the defaults sample
// after it is in, so defaults may be one longer than candidate (every candidate sample counted) or
// as long (the last one waits for its closing defaults sample).
func (r Rule) Compare(defaults, candidate []float64) (Result, error) {
	r, err := r.withDefaults()
	if err != nil {
		return Result{}, err
	}
	if len(defaults) == 0 {
		return Result{}, fmt.Errorf("%w: no defaults samples", ErrNoSamples)
	}
	if n := len(defaults) - len(candidate); n != 0 && n != 1 {
		return Result{}, fmt.Errorf("%w: %d defaults samples and %d candidate samples", ErrOrder, len(defaults), len(candidate))
	}
	for i, t := range defaults {
		if !(t > 0) || math.IsInf(t, 0) {
			return Result{}, fmt.Errorf("%w: defaults sample %d is %g", ErrBadTime, i, t)
		}
	}
	for i, t := range candidate {
		if !(t > 0) || math.IsInf(t, 0) {
			return Result{}, fmt.Errorf("%w: candidate sample %d is %g", ErrBadTime, i, t)
		}
	}

	n := len(defaults) - 1
	res := Result{Pairs: n, Speedup: math.NaN(), Low: 0, High: math.Inf(1)}
	if n == 0 {
		return res, nil
	}
	logs := make([]float64, n) // log speed-up of each pair
	var mean, jumps float64
	for i := range n {
		a0, a1 := math.Log(defaults[i]), math.Log(defaults[i+1])
		logs[i] = (a0+a1)/2 - math.Log(candidate[i])
		mean += logs[i]
		jumps += (a1 - a0) * (a1 - a0)
	}
	mean /= float64(n)
	res.Speedup = math.Exp(mean)
	if n < MinPairs {
		// No interval: from fewer pairs it would span orders of magnitude (0.01-111 from two),
		// and no verdict is given from them anyway.
		return res, nil
	}
	var ss float64
	for _, l := range logs {
		ss += (l - mean) * (l - mean)
	}
	// Var(mean) = (γ0 + 2γ1)/n: γ0 is the pairs' variance; γ1, the covariance of neighbouring pairs,
	// is a quarter of the variance of one defaults sample, which successive defaults samples estimate
	// as half their squared difference (drift only inflates it, erring towards Undecided).
	gamma0 := ss / float64(n-1)
	defaultsVar := jumps / float64(2*n)
	se := math.Sqrt((gamma0 + defaultsVar/2) / float64(n))
	df := n - 1
	if p := r.Pooled; p.DF > df && p.Var > 0 && !math.IsInf(p.Var, 0) && gamma0 <= p.Var {
		// A pair's variance is 1.5 times a sample's (σ²) and the neighbours' covariance term
		// adds σ²/2 more: a third of the pair's.
		se, df = math.Sqrt(p.Var*4/3/float64(n)), p.DF
	}

	looks := float64(r.MaxPairs - MinPairs + 1)
	alpha := (1 - r.Confidence) / looks
	t := distuv.StudentsT{Mu: 0, Sigma: 1, Nu: float64(df)}.Quantile(1 - alpha/2)
	res.Low, res.High = math.Exp(mean-t*se), math.Exp(mean+t*se)

	switch {
	case res.High < NoGain:
		// Checked before Better: a gain that is sure but smaller than NoGain is not worth a switch.
		res.Verdict, res.Done = NotBetter, true
	case res.Low > 1:
		res.Verdict, res.Done = Better, true
	case n >= r.MaxPairs:
		res.Done = true
	}
	return res, nil
}
