package bayes

import (
	"errors"
	"math"
	"math/rand/v2"
	"slices"
	"testing"
)

func seeded(seed uint64) *rand.Rand { return rand.New(rand.NewPCG(seed, 0x6b6f6c6f)) }

func branin(x []float64) float64 {
	a, b, c := 1.0, 5.1/(4*math.Pi*math.Pi), 5/math.Pi
	r, s, t := 6.0, 10.0, 1/(8*math.Pi)
	return a*math.Pow(x[1]-b*x[0]*x[0]+c*x[0]-r, 2) + s*(1-t)*math.Cos(x[0]) + s
}

const mib = 1 << 20

// TestFindsMinimum runs the tuner's loop (defaults first, then Suggest/Add) on functions with a known
// minimum and checks the point Best picks by posterior mean, for several seeds.
func TestFindsMinimum(t *testing.T) {
	tests := []struct {
		name     string
		dims     []Dim
		defaults []float64
		f        func([]float64) float64
		fMin     float64
		budget   int // evaluations, defaults included
		tol      float64
	}{
		{
			name: "quadratic 1-D", dims: []Dim{Real("x", -5, 10)}, defaults: []float64{0},
			f:    func(x []float64) float64 { return (x[0] - 2.3) * (x[0] - 2.3) },
			fMin: 0, budget: 12, tol: 1e-3,
		},
		{
			name: "shifted bowl 2-D", dims: []Dim{Real("x", -3, 3), Real("y", 0, 100)}, defaults: []float64{0, 50},
			f: func(x []float64) float64 {
				return 1 + (x[0]-1.2)*(x[0]-1.2) + (x[1]-71)*(x[1]-71)/400
			},
			fMin: 1, budget: 20, tol: 1e-2,
		},
		{
			name: "branin", dims: []Dim{Real("x1", -5, 10), Real("x2", 0, 15)}, defaults: []float64{2.5, 7.5},
			f: branin, fMin: 0.397887, budget: 40, tol: 0.05,
		},
		{
			// The boolean moves the continuous optimum, so the two cannot be tuned one at a time.
			name: "continuous and boolean", dims: []Dim{Real("x", 0, 1), Int("on", 0, 1)}, defaults: []float64{0.5, 0},
			f: func(x []float64) float64 {
				if x[1] == 1 {
					return 1 + (x[0]-0.7)*(x[0]-0.7)
				}
				return 1.1 + (x[0]-0.2)*(x[0]-0.2)
			},
			fMin: 1, budget: 15, tol: 1e-3,
		},
		{
			// A fusion-threshold-like knob: bytes from 0 to 256 MiB, best at 8 MiB, log-scaled.
			name: "log-scaled integer", dims: []Dim{Int("threshold", 0, 256*mib).LogScale(mib), Int("cache", 0, 1)},
			defaults: []float64{64 * mib, 1},
			f: func(x []float64) float64 {
				l := math.Log2((x[0] + mib) / (9 * mib))
				return 0.1 + 0.01*l*l + 0.02*(1-x[1])
			},
			fMin: 0.1, budget: 15, tol: 1e-3,
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			for seed := uint64(1); seed <= 5; seed++ {
				o, err := New(tc.dims, 1e-6, seeded(seed))
				if err != nil {
					t.Fatal(err)
				}
				if err := o.Add(tc.defaults, tc.f(tc.defaults)); err != nil {
					t.Fatal(err)
				}
				for len(o.y) < tc.budget {
					x, err := o.Suggest()
					if err != nil {
						t.Fatalf("seed %d, after %d: %v", seed, len(o.y), err)
					}
					if err := o.Add(x, tc.f(x)); err != nil {
						t.Fatalf("seed %d: suggested %v: %v", seed, x, err)
					}
				}
				x, _, err := o.best()
				if err != nil {
					t.Fatal(err)
				}
				if got := tc.f(x); got-tc.fMin > tc.tol {
					t.Errorf("seed %d: best after %d evaluations is f(%v) = %.5g, want within %g of %g",
						seed, tc.budget, x, got, tc.tol, tc.fMin)
				}
			}
		})
	}
}

// TestNoisyQuadratic has measurement noise and Horovod's default noise parameter: the posterior-mean
// pick must land near the minimum even though single samples mislead. Within ±1 of the minimum the
// function rises by less than 0.04, about one noise standard deviation, so ±1 is as close as 25
// samples can be asked to tell (over 40 seeds the worst was 0.7 off).
func TestNoisyQuadratic(t *testing.T) {
	for seed := uint64(1); seed <= 5; seed++ {
		rng := seeded(seed + 100)
		f := func(x []float64) float64 { return 1 + (x[0]-2.3)*(x[0]-2.3)/25 + 0.03*rng.NormFloat64() }
		o, err := New([]Dim{Real("x", -5, 10)}, DefaultNoise, seeded(seed))
		if err != nil {
			t.Fatal(err)
		}
		if err := o.Add([]float64{-4}, f([]float64{-4})); err != nil {
			t.Fatal(err)
		}
		for len(o.y) < 25 {
			x, err := o.Suggest()
			if err != nil {
				t.Fatal(err)
			}
			if err := o.Add(x, f(x)); err != nil {
				t.Fatal(err)
			}
		}
		x, _, err := o.best()
		if err != nil {
			t.Fatal(err)
		}
		if math.Abs(x[0]-2.3) > 1 {
			t.Errorf("seed %d: best x = %.3g, want 2.3 ± 1", seed, x[0])
		}
	}
}

func TestInterpolatesNoiseFreeData(t *testing.T) {
	o, err := New([]Dim{Real("x", 0, 6), Int("b", 0, 1)}, 0, seeded(1))
	if err != nil {
		t.Fatal(err)
	}
	xs := [][]float64{{0, 0}, {1, 1}, {2.5, 0}, {3, 1}, {4.2, 0}, {6, 1}, {5, 0}}
	f := func(x []float64) float64 { return math.Sin(x[0]) + 0.3*x[1] }
	for _, x := range xs {
		if err := o.Add(x, f(x)); err != nil {
			t.Fatal(err)
		}
	}
	for _, x := range xs {
		mean, variance, err := o.predict(x)
		if err != nil {
			t.Fatal(err)
		}
		if math.Abs(mean-f(x)) > 1e-4 || variance > 1e-6 {
			t.Errorf("at sample %v: mean %.6g (want %.6g), variance %.3g (want ~0)", x, mean, f(x), variance)
		}
	}
	if _, variance, _ := o.predict([]float64{1.7, 0}); variance < 1e-4 {
		t.Errorf("between samples: variance %.3g, want > 0", variance)
	}
}

func TestExpectedImprovement(t *testing.T) {
	o, err := New([]Dim{Real("x", 0, 1)}, 0, seeded(1))
	if err != nil {
		t.Fatal(err)
	}
	samples := []float64{0, 0.3, 0.5, 0.9}
	for _, x := range samples {
		if err := o.Add([]float64{x}, (x-0.6)*(x-0.6)); err != nil {
			t.Fatal(err)
		}
	}
	for _, x := range samples {
		ei, err := o.ExpectedImprovement([]float64{x})
		if err != nil {
			t.Fatal(err)
		}
		if ei > 1e-6 {
			t.Errorf("EI at sample %g = %.3g, want ~0", x, ei)
		}
	}
	for _, x := range []float64{0.1, 0.4, 0.6, 0.7, 1} {
		ei, err := o.ExpectedImprovement([]float64{x})
		if err != nil {
			t.Fatal(err)
		}
		if !(ei > 0) {
			t.Errorf("EI at unsampled %g = %.3g, want > 0", x, ei)
		}
	}
}

// TestDuplicatePoints: the same settings measured twice is normal (the defaults are re-measured); a
// noise-free kernel matrix is then singular and the model must add jitter rather than fail.
func TestDuplicatePoints(t *testing.T) {
	many := make([]float64, 300)
	for i := range many {
		many[i] = 1 + 0.01*float64(i%7)
	}
	tests := []struct {
		name      string
		ys        []float64
		minJitter float64 // on the diagonal, beyond the noise
	}{
		{"same value", []float64{1, 1, 1}, 0},
		{"different values", []float64{1, 1.2, 0.9}, 0},
		// 300 copies make K's condition number 300/jitter: the first jitter tried (1e-10) is not enough.
		{"300 copies", many, 1e-9},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			o, err := New([]Dim{Real("x", 0, 1), Int("b", 0, 1)}, 0, seeded(1))
			if err != nil {
				t.Fatal(err)
			}
			for _, y := range tc.ys {
				if err := o.Add([]float64{0.5, 1}, y); err != nil {
					t.Fatal(err)
				}
			}
			if err := o.Add([]float64{0.1, 0}, 2); err != nil {
				t.Fatal(err)
			}
			mean, _, err := o.predict([]float64{0.5, 1})
			if err != nil {
				t.Fatal(err)
			}
			var avg float64
			for _, y := range tc.ys {
				avg += y / float64(len(tc.ys))
			}
			if math.Abs(mean-avg) > 1e-3 {
				t.Errorf("mean at the repeated point %.6g, want their average %.6g", mean, avg)
			}
			if o.m.jitter < tc.minJitter {
				t.Errorf("jitter %g, want at least %g", o.m.jitter, tc.minJitter)
			}
			x, err := o.Suggest()
			if err != nil {
				t.Fatal(err)
			}
			if x[0] == 0.5 && x[1] == 1 {
				t.Errorf("suggested the sampled point %v", x)
			}
		})
	}
}

func TestSmallSpaceNeverRepeats(t *testing.T) {
	dims := []Dim{Int("hierarchical", 0, 1), Int("cache", 0, 1), Int("cycle", 0, 3)}
	o, err := New(dims, 0.1, seeded(3))
	if err != nil {
		t.Fatal(err)
	}
	f := func(x []float64) float64 { return 1 + 0.1*x[0] - 0.05*x[1] + 0.02*math.Abs(x[2]-2) }
	seen := map[string]bool{}
	for i := 0; i < 16; i++ {
		x, err := o.Suggest()
		if err != nil {
			t.Fatalf("suggestion %d: %v", i, err)
		}
		if seen[key(x)] {
			t.Fatalf("suggestion %d repeats %v", i, x)
		}
		seen[key(x)] = true
		if err := o.Add(x, f(x)); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := o.Suggest(); !errors.Is(err, ErrExhausted) {
		t.Errorf("after all 16 points: %v, want ErrExhausted", err)
	}
}

func TestDeterministicGivenSeed(t *testing.T) {
	run := func() [][]float64 {
		o, err := New([]Dim{Real("x1", -5, 10), Real("x2", 0, 15), Int("b", 0, 1)}, 0.1, seeded(7))
		if err != nil {
			t.Fatal(err)
		}
		var xs [][]float64
		x := []float64{0, 0, 0}
		for range 8 {
			if err := o.Add(x, branin(x)+x[2]); err != nil {
				t.Fatal(err)
			}
			if x, err = o.Suggest(); err != nil {
				t.Fatal(err)
			}
			xs = append(xs, x)
		}
		return xs
	}
	a, b := run(), run()
	for i := range a {
		if !slices.Equal(a[i], b[i]) {
			t.Fatalf("suggestion %d differs between runs: %v vs %v", i, a[i], b[i])
		}
	}
}

func TestBeforeAnyObservation(t *testing.T) {
	o, err := New([]Dim{Int("n", 1, 8)}, 0, seeded(1))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := o.ExpectedImprovement([]float64{2}); !errors.Is(err, ErrNoData) {
		t.Errorf("ExpectedImprovement: %v, want ErrNoData", err)
	}
	x, err := o.Suggest()
	if err != nil || len(x) != 1 || x[0] < 1 || x[0] > 8 || x[0] != math.Trunc(x[0]) {
		t.Errorf("Suggest = %v, %v: want a whole number in [1, 8]", x, err)
	}
}

func TestBadSpace(t *testing.T) {
	tests := []struct {
		name  string
		dims  []Dim
		noise float64
	}{
		{"no dimensions", nil, 0},
		{"min equals max", []Dim{Real("x", 1, 1)}, 0},
		{"min above max", []Dim{Real("x", 2, 1)}, 0},
		{"NaN bound", []Dim{Real("x", math.NaN(), 1)}, 0},
		{"infinite bound", []Dim{Real("x", 0, math.Inf(1))}, 0},
		{"fractional integer bound", []Dim{{Name: "n", Integer: true, Min: 0.5, Max: 4}}, 0},
		{"log of zero", []Dim{Real("x", 0, 1).LogScale(0)}, 0},
		{"log of negative", []Dim{Int("x", -4, 4).LogScale(2)}, 0},
		{"duplicate name", []Dim{Real("x", 0, 1), Int("x", 0, 1)}, 0},
		{"negative noise", []Dim{Real("x", 0, 1)}, -0.1},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := New(tc.dims, tc.noise, seeded(1)); err == nil {
				t.Errorf("New accepted %+v", tc.dims)
			}
		})
	}
	if _, err := New([]Dim{Real("x", 0, 1)}, 0, nil); err == nil {
		t.Error("New accepted a nil rng")
	}
	if _, err := New([]Dim{Real("x", 0, 1)}, 0, seeded(1)); err != nil {
		t.Errorf("good space: %v", err)
	}
}

func TestAddRejects(t *testing.T) {
	o, err := New([]Dim{Real("x", 0, 1), Int("n", 1, 4), Int("c", 0, 2)}, 0, seeded(1))
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		x    []float64
		y    float64
	}{
		{"too few values", []float64{0.5, 2}, 1},
		{"too many values", []float64{0.5, 2, 0, 1}, 1},
		{"below min", []float64{-0.1, 2, 0}, 1},
		{"above max", []float64{0.5, 5, 0}, 1},
		{"fractional integer", []float64{0.5, 2.5, 0}, 1},
		{"level above max", []float64{0.5, 2, 3}, 1},
		{"NaN value", []float64{math.NaN(), 2, 0}, 1},
		{"NaN result", []float64{0.5, 2, 0}, math.NaN()},
		{"infinite result", []float64{0.5, 2, 0}, math.Inf(1)},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if err := o.Add(tc.x, tc.y); err == nil {
				t.Errorf("Add(%v, %g) accepted", tc.x, tc.y)
			}
		})
	}
	if len(o.y) != 0 {
		t.Errorf("%d observations recorded from rejected Adds", len(o.y))
	}
}

// BenchmarkSuggest is one tuning step late in a run: six knobs, 40 samples, model refit included.
//
//	go test -run '^$' -bench Suggest ./internal/autotune/bayes/
func BenchmarkSuggest(b *testing.B) {
	dims := []Dim{
		Int("fusion_threshold_bytes", 0, 256*mib).LogScale(mib), Real("cycle_time_ms", 0.5, 50).LogScale(0),
		Int("hierarchical_allreduce", 0, 1), Int("hierarchical_allgather", 0, 1), Int("cache", 0, 1), Int("threads", 1, 8),
	}
	rng := seeded(1)
	f := func(x []float64) float64 {
		return 1 + math.Abs(math.Log2((x[0]+mib)/(9*mib)))/10 + math.Abs(math.Log(x[1]/5))/10 + 0.05*x[2] + 0.01*rng.NormFloat64()
	}
	o, err := New(dims, DefaultNoise, seeded(2))
	if err != nil {
		b.Fatal(err)
	}
	for len(o.y) < 40 {
		x, err := o.Suggest()
		if err != nil {
			b.Fatal(err)
		}
		if err := o.Add(x, f(x)); err != nil {
			b.Fatal(err)
		}
	}
	b.ResetTimer()
	for b.Loop() {
		o.m = nil // refit, as after an Add
		if _, err := o.Suggest(); err != nil {
			b.Fatal(err)
		}
	}
}

// predict is the posterior mean and variance of the (noise-free) objective at x, in the caller's
// units.
func (o *Optimizer) predict(x []float64) (mean, variance float64, err error) {
	if err := o.check(x); err != nil {
		return 0, 0, err
	}
	m, err := o.model()
	if err != nil {
		return 0, 0, err
	}
	mu, v := m.predict(o.unit(x))
	return m.mean + m.scale*mu, m.scale * m.scale * v, nil
}

// best is the sampled point with the lowest posterior mean, and that mean: the model's pick among
// the points measured, as a tuner would choose.
func (o *Optimizer) best() (x []float64, mean float64, err error) {
	m, err := o.model()
	if err != nil {
		return nil, 0, err
	}
	i, mu := m.bestSampled()
	return append([]float64(nil), o.x[i]...), m.mean + m.scale*mu, nil
}
