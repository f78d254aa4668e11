package decide

import (
	"errors"
	"math"
	"math/rand/v2"
	"testing"

	"gonum.org/v1/gonum/stat/distuv"
)

// machine yields the step time of sample number k (0, 1, 2, ... in time order; defaults on even k,
// candidate on odd k).
type machine func(k int, candidate bool) float64

// run plays the tuner's loop: a defaults sample, then candidate and defaults alternately, asking the
// rule after each completed pair and stopping when it is done.
func run(t *testing.T, r Rule, m machine) Result {
	t.Helper()
	defaults := []float64{m(0, false)}
	var candidate []float64
	for k := 1; ; k += 2 {
		candidate = append(candidate, m(k, true))
		defaults = append(defaults, m(k+1, false))
		res, err := r.Compare(defaults, candidate)
		if err != nil {
			t.Fatal(err)
		}
		if res.Done {
			return res
		}
		if len(defaults) > 1000 {
			t.Fatal("rule never done")
		}
	}
}

func seeded(seed uint64) *rand.Rand { return rand.New(rand.NewPCG(seed, 0x6465636964)) }

// noisy is a machine whose defaults take 1 s per step and the candidate 1/speedup, each sample off by
// a normal relative error of sd.
func noisy(rng *rand.Rand, speedup, sd float64) machine {
	return func(k int, candidate bool) float64 {
		base := 1.0
		if candidate {
			base /= speedup
		}
		return base * math.Exp(sd*rng.NormFloat64())
	}
}

// TestPureNoiseKeepsDefaults: the candidate is the defaults under another name. The rule may look
// after every pair; it must still keep the defaults nearly always.
func TestPureNoiseKeepsDefaults(t *testing.T) {
	tests := []struct {
		name string
		m    func(rng *rand.Rand) machine
	}{
		{"2% noise", func(rng *rand.Rand) machine { return noisy(rng, 1, 0.02) }},
		{"10% noise", func(rng *rand.Rand) machine { return noisy(rng, 1, 0.10) }},
		{"1% noise, 5% of samples stall 30%", func(rng *rand.Rand) machine {
			base := noisy(rng, 1, 0.01)
			return func(k int, c bool) float64 {
				s := base(k, c)
				if rng.Float64() < 0.05 {
					s *= 1.3
				}
				return s
			}
		}},
	}
	const seeds = 200
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			crowned, pairs := 0, 0
			for seed := uint64(1); seed <= seeds; seed++ {
				res := run(t, Rule{}, tc.m(seeded(seed)))
				if res.Verdict == Better {
					crowned++
				}
				pairs += res.Pairs
			}
			t.Logf("crowned %d of %d, %.1f pairs on average", crowned, seeds, float64(pairs)/seeds)
			if crowned > seeds/10 {
				t.Errorf("crowned a candidate no better than the defaults in %d of %d runs, want at most %d", crowned, seeds, seeds/10)
			}
		})
	}
}

// TestDetectsRealGain: a faster candidate must be crowned in every run, within the cap, and in few
// pairs on average. (Over 500 seeds a 1.05x gain with 2% noise took 7.5 pairs on average, 17 at
// most; 1.10x took 5, 8 at most.)
func TestDetectsRealGain(t *testing.T) {
	tests := []struct {
		speedup, sd float64
		maxPairs    int     // every seed decides within this many
		meanPairs   float64 // and this many on average
	}{
		{1.05, 0.02, 20, 9},
		{1.10, 0.02, 10, 6},
		{1.05, 0.01, 10, 6},
	}
	const seeds = 50
	for _, tc := range tests {
		pairs := 0
		for seed := uint64(1); seed <= seeds; seed++ {
			res := run(t, Rule{}, noisy(seeded(seed), tc.speedup, tc.sd))
			pairs += res.Pairs
			if res.Verdict != Better || res.Pairs > tc.maxPairs {
				t.Errorf("%.2fx with %g noise, seed %d: %+v, want better within %d pairs", tc.speedup, tc.sd, seed, res, tc.maxPairs)
			}
			if !(res.Low <= tc.speedup && res.High >= tc.speedup) {
				t.Errorf("%.2fx with %g noise, seed %d: interval %.3f-%.3f misses the truth", tc.speedup, tc.sd, seed, res.Low, res.High)
			}
		}
		mean := float64(pairs) / seeds
		t.Logf("%.2fx with %g noise: %.1f pairs on average", tc.speedup, tc.sd, mean)
		if mean > tc.meanPairs {
			t.Errorf("%.2fx with %g noise: %.1f pairs on average, want at most %g", tc.speedup, tc.sd, mean, tc.meanPairs)
		}
	}
}

func TestSlowerCandidateIsNotBetter(t *testing.T) {
	for seed := uint64(1); seed <= 50; seed++ {
		res := run(t, Rule{}, noisy(seeded(seed), 0.9, 0.02))
		if res.Verdict != NotBetter || res.Pairs > 6 {
			t.Errorf("seed %d: 0.9x candidate: %+v, want not better within 6 pairs", seed, res)
		}
	}
}

// TestDriftDoesNotCrown: the machine's speed changes while the candidate, no better than the
// defaults, is measured. Pairing each candidate sample with the defaults either side must keep the
// change from looking like a gain.
func TestDriftDoesNotCrown(t *testing.T) {
	type drift struct {
		name  string
		speed func(k int) float64 // multiplies step time of sample k
	}
	var drifts []drift
	// A 30% slow stretch of every length and start, over both kinds of sample.
	for start := 0; start < 20; start++ {
		for length := 1; length <= 12; length++ {
			drifts = append(drifts, drift{"slow stretch", func(k int) float64 {
				if k >= start && k < start+length {
					return 1.3
				}
				return 1
			}})
		}
	}
	drifts = append(drifts,
		drift{"speeding up 1% a sample", func(k int) float64 { return math.Pow(0.99, float64(k)) }},
		drift{"slowing down 1% a sample", func(k int) float64 { return math.Pow(1.01, float64(k)) }},
		drift{"slowing down 0.5% a sample, linearly", func(k int) float64 { return 1 + 0.005*float64(k) }},
		// Curved, so the neighbours' mean does not cancel it: still warming up when tuning starts.
		drift{"warm-up 50% slow, decaying over 4 samples", func(k int) float64 { return 1 + 0.5*math.Exp(-float64(k)/4) }},
	)
	crowned := 0
	for i, d := range drifts {
		rng := seeded(uint64(i + 1))
		res := run(t, Rule{}, func(k int, c bool) float64 { return d.speed(k) * math.Exp(0.01*rng.NormFloat64()) })
		if res.Verdict == Better {
			crowned++
			t.Logf("%s (case %d): %+v", d.name, i, res)
		}
	}
	if crowned > 0 {
		t.Errorf("drift crowned the candidate in %d of %d cases", crowned, len(drifts))
	}
}

// TestNaivePairingFallsForDrift shows the trap the neighbour pairing avoids: comparing each candidate
// sample with the defaults sample just before it sees a steady speed-up of the machine as a gain.
func TestNaivePairingFallsForDrift(t *testing.T) {
	speed := func(k int) float64 { return math.Pow(0.99, float64(k)) }
	var defaults, candidate []float64
	for k := 0; k <= 20; k += 2 {
		defaults = append(defaults, speed(k))
		if k < 20 {
			candidate = append(candidate, speed(k+1))
		}
	}
	var naive float64
	for i := range candidate {
		naive += math.Log(defaults[i] / candidate[i])
	}
	naive = math.Exp(naive / float64(len(candidate)))
	res, err := Rule{}.Compare(defaults, candidate)
	if err != nil {
		t.Fatal(err)
	}
	if naive < 1.009 || math.Abs(res.Speedup-1) > 1e-3 || res.Verdict == Better {
		t.Errorf("naive speed-up %.4f (want ~1.01), rule %+v (want ~1.00, not better)", naive, res)
	}
}

func TestCompareExact(t *testing.T) {
	tests := []struct {
		name                string
		defaults, candidate []float64
		want                Result
	}{
		{
			name:     "no pairs yet",
			defaults: []float64{1}, candidate: nil,
			want: Result{Pairs: 0, Speedup: math.NaN(), Low: 0, High: math.Inf(1)},
		},
		{
			name:     "last candidate waits for its closing defaults",
			defaults: []float64{1, 1}, candidate: []float64{0.5, 0.1},
			want: Result{Pairs: 1, Speedup: 2, Low: 0, High: math.Inf(1)},
		},
		{
			name:     "constant 10% gain",
			defaults: []float64{1.1, 1.1, 1.1, 1.1}, candidate: []float64{1, 1, 1},
			want: Result{Verdict: Better, Done: true, Pairs: 3, Speedup: 1.1, Low: 1.1, High: 1.1},
		},
		{
			name:     "constant 0.5% gain is not worth it",
			defaults: []float64{1.005, 1.005, 1.005, 1.005}, candidate: []float64{1, 1, 1},
			want: Result{Verdict: NotBetter, Done: true, Pairs: 3, Speedup: 1.005, Low: 1.005, High: 1.005},
		},
		{
			name:     "two pairs are too few for a verdict or an interval",
			defaults: []float64{2, 2, 2}, candidate: []float64{1, 1},
			want: Result{Pairs: 2, Speedup: 2, Low: 0, High: math.Inf(1)},
		},
		{
			// Defaults 1, 1.21 around candidate 1.1: the geometric mean of the neighbours is 1.1, so
			// every pair says 1.00x, but the defaults' jumps widen the interval past a verdict.
			name:     "neighbours' geometric mean",
			defaults: []float64{1, 1.21, 1.21 * 1.21, 1.21 * 1.21 * 1.21}, candidate: []float64{1.1, 1.1 * 1.21, 1.1 * 1.21 * 1.21},
			want: Result{Pairs: 3, Speedup: 1},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := Rule{}.Compare(tc.defaults, tc.candidate)
			if err != nil {
				t.Fatal(err)
			}
			near := func(a, b float64) bool {
				return a == b || math.IsNaN(a) && math.IsNaN(b) || math.Abs(a-b) < 1e-9
			}
			if got.Verdict != tc.want.Verdict || got.Done != tc.want.Done || got.Pairs != tc.want.Pairs ||
				!near(got.Speedup, tc.want.Speedup) {
				t.Errorf("got %+v, want %+v", got, tc.want)
			}
			if tc.want.Low != 0 || tc.want.High != 0 { // 0-0: the case leaves the interval unchecked
				if !near(got.Low, tc.want.Low) || !near(got.High, tc.want.High) {
					t.Errorf("interval %g-%g, want %g-%g", got.Low, got.High, tc.want.Low, tc.want.High)
				}
			}
		})
	}
}

func TestMaxPairsKeepsDefaults(t *testing.T) {
	// Alternating ±3% around no gain: never decided, so the cap must end it.
	defaults := []float64{1}
	var candidate []float64
	for i := range 5 {
		candidate = append(candidate, 1+0.03*float64(1-2*(i%2)))
		defaults = append(defaults, 1)
	}
	res, err := Rule{MaxPairs: 5}.Compare(defaults, candidate)
	if err != nil {
		t.Fatal(err)
	}
	if res.Verdict != Undecided || !res.Done {
		t.Errorf("at the cap: %+v, want undecided, done", res)
	}
}

func TestBadInput(t *testing.T) {
	tests := []struct {
		name                string
		rule                Rule
		defaults, candidate []float64
		want                error
	}{
		{"empty", Rule{}, nil, nil, ErrNoSamples},
		{"candidate but no defaults", Rule{}, nil, []float64{1}, ErrNoSamples},
		{"candidate first", Rule{}, []float64{1}, []float64{1, 1}, ErrOrder},
		{"two defaults in a row", Rule{}, []float64{1, 1, 1}, []float64{1}, ErrOrder},
		{"zero time", Rule{}, []float64{1, 0}, []float64{1}, ErrBadTime},
		{"negative time", Rule{}, []float64{1, 1}, []float64{-1}, ErrBadTime},
		{"NaN time", Rule{}, []float64{math.NaN(), 1}, []float64{1}, ErrBadTime},
		{"infinite time", Rule{}, []float64{1, 1}, []float64{math.Inf(1)}, ErrBadTime},
		{"confidence 1", Rule{Confidence: 1}, []float64{1, 1}, []float64{1}, ErrBadRule},
		{"negative confidence", Rule{Confidence: -0.5}, []float64{1, 1}, []float64{1}, ErrBadRule},
		{"max below min", Rule{MaxPairs: MinPairs - 1}, []float64{1, 1}, []float64{1}, ErrBadRule},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := tc.rule.Compare(tc.defaults, tc.candidate); !errors.Is(err, tc.want) {
				t.Errorf("got %v, want %v", err, tc.want)
			}
		})
	}
}

// A pooled spread with more degrees of freedom narrows the interval by exactly the t quantile's
// and the spread's change; it is ignored when the pairs' own spread is larger (a noisier
// candidate), when it has no more degrees of freedom than the pairs, or when it is not a variance.
func TestPooledSpread(t *testing.T) {
	defaults := []float64{1.10, 1.14, 1.08, 1.12, 1.10}
	candidate := []float64{1.00, 0.97, 1.02, 0.99}
	own, err := Rule{}.Compare(defaults, candidate)
	if err != nil {
		t.Fatal(err)
	}
	// The pairs' own variance, as Compare's γ0.
	var logs []float64
	var mean float64
	for i := range candidate {
		l := (math.Log(defaults[i])+math.Log(defaults[i+1]))/2 - math.Log(candidate[i])
		logs = append(logs, l)
		mean += l / 4
	}
	var gamma0 float64
	for _, l := range logs {
		gamma0 += (l - mean) * (l - mean) / 3
	}
	pooled := Spread{Var: 2 * gamma0, DF: 30}
	got, err := Rule{Pooled: pooled}.Compare(defaults, candidate)
	if err != nil {
		t.Fatal(err)
	}
	looks := float64(20 - 3 + 1)
	q := distuv.StudentsT{Mu: 0, Sigma: 1, Nu: 30}.Quantile(1 - 0.05/looks/2)
	half := q * math.Sqrt(pooled.Var*4/3/4)
	if math.Abs(math.Log(got.Low)-(mean-half)) > 1e-9 || math.Abs(math.Log(got.High)-(mean+half)) > 1e-9 {
		t.Errorf("pooled: interval %g-%g, want %g-%g", got.Low, got.High, math.Exp(mean-half), math.Exp(mean+half))
	}
	if !(got.Low > own.Low && got.High < own.High) {
		t.Errorf("the pooled interval %g-%g is not inside the pairs' own %g-%g", got.Low, got.High, own.Low, own.High)
	}
	for name, p := range map[string]Spread{
		"smaller than the pairs' own": {Var: gamma0 / 2, DF: 30},
		"no more degrees of freedom":  {Var: 2 * gamma0, DF: 3},
		"infinite":                    {Var: math.Inf(1), DF: 30},
		"zero":                        {Var: 0, DF: 30},
	} {
		got, err := Rule{Pooled: p}.Compare(defaults, candidate)
		if err != nil {
			t.Fatal(err)
		}
		if got.Low != own.Low || got.High != own.High {
			t.Errorf("%s: interval %g-%g, want the pairs' own %g-%g", name, got.Low, got.High, own.Low, own.High)
		}
	}
}
