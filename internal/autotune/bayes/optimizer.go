package bayes

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"sort"
	"strconv"
	"strings"

	"gonum.org/v1/gonum/stat/distuv"
)

// DefaultNoise is Horovod's default for --autotune-gaussian-process-noise, for callers that want the
// same smoothing.
const DefaultNoise = 0.8

const (
	// candidates is the number of random points at which each Suggest evaluates the expected
	// improvement before refining the best of them.
	candidates = 512
	// starts is the number of the best candidates refined by local search.
	starts = 5
)

// ErrExhausted is returned by Suggest when it finds no point of the box that was not sampled.
var ErrExhausted = errors.New("bayes: every point of the search space has been sampled")

// ErrNoData is returned by ExpectedImprovement before any observation.
var ErrNoData = errors.New("bayes: no observations")

// Optimizer suggests points to measure in a box, minimising the measured value.
type Optimizer struct {
	dims    []Dim
	noise   float64
	rng     *rand.Rand
	x       [][]float64 // as given, in the dimensions' units
	y       []float64
	sampled map[string]bool
	m       *model // nil when observations changed since the last fit
}

// New returns an optimiser over the box dims. All randomness comes from rng, so a seeded rng makes
// every suggestion reproducible.
//
// noise is the variance of a measurement's noise on the standardised scale, where the values seen so
// far have variance 1: added to the kernel's diagonal, it says how much of the spread between
// samples is measurement, not setting. 0 interpolates every sample exactly; DefaultNoise (0.8) says
// most of the spread may be noise, so the model trusts trends over single samples.
func New(dims []Dim, noise float64, rng *rand.Rand) (*Optimizer, error) {
	if len(dims) == 0 {
		return nil, fmt.Errorf("%w: no dimensions", ErrBadSpace)
	}
	names := map[string]bool{}
	for i, d := range dims {
		if err := d.validate(); err != nil {
			return nil, fmt.Errorf("dimension %d: %w", i, err)
		}
		if d.Name != "" && names[d.Name] {
			return nil, fmt.Errorf("%w: dimension %d: name %q used twice", ErrBadSpace, i, d.Name)
		}
		names[d.Name] = true
	}
	if rng == nil {
		return nil, errors.New("bayes: nil rng")
	}
	if math.IsNaN(noise) || noise < 0 || math.IsInf(noise, 0) {
		return nil, fmt.Errorf("bayes: noise %g: want a finite variance >= 0", noise)
	}
	return &Optimizer{dims: append([]Dim(nil), dims...), noise: noise, rng: rng, sampled: map[string]bool{}}, nil
}

// Add records that the point x measured y. Any point of the box may be added, in any order: the
// defaults first, repeats of a point (which the model averages), points that Suggest did not propose.
func (o *Optimizer) Add(x []float64, y float64) error {
	if err := o.check(x); err != nil {
		return err
	}
	if math.IsNaN(y) || math.IsInf(y, 0) {
		return fmt.Errorf("bayes: add %v: value %g is not finite", x, y)
	}
	o.x = append(o.x, append([]float64(nil), x...))
	o.y = append(o.y, y)
	o.sampled[key(x)] = true
	o.m = nil
	return nil
}

func (o *Optimizer) check(x []float64) error {
	if len(x) != len(o.dims) {
		return fmt.Errorf("bayes: point has %d values, the space %d dimensions", len(x), len(o.dims))
	}
	for i, d := range o.dims {
		if err := d.check(x[i]); err != nil {
			return fmt.Errorf("bayes: point %v: %s", x, err)
		}
	}
	return nil
}

// key identifies a point exactly; suggestions are snapped to the whole numbers of integer
// dimensions, so "already sampled" is exact equality.
func key(x []float64) string {
	var b strings.Builder
	for i, v := range x {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(strconv.FormatFloat(v, 'g', -1, 64))
	}
	return b.String()
}

func (o *Optimizer) unit(x []float64) []float64 {
	u := make([]float64, len(x))
	for i, d := range o.dims {
		u[i] = d.Unit(x[i])
	}
	return u
}

func (o *Optimizer) fromUnit(u []float64) []float64 {
	x := make([]float64, len(u))
	for i, d := range o.dims {
		x[i] = d.fromUnit(u[i])
	}
	return x
}

func (o *Optimizer) model() (*model, error) {
	if len(o.y) == 0 {
		return nil, ErrNoData
	}
	if o.m != nil {
		return o.m, nil
	}
	m := &model{dims: o.dims, noise: o.noise}
	for _, x := range o.x {
		m.x = append(m.x, o.unit(x))
	}
	if err := m.fit(o.y); err != nil {
		return nil, err
	}
	o.m = m
	return m, nil
}

func (m *model) bestSampled() (int, float64) {
	best, bestMu := 0, math.Inf(1)
	for i, u := range m.x {
		if mu, _ := m.predict(u); mu < bestMu {
			best, bestMu = i, mu
		}
	}
	return best, bestMu
}

// ExpectedImprovement is the expected amount, in the caller's units, by which the objective at x
// falls below the best posterior mean at a sampled point.
func (o *Optimizer) ExpectedImprovement(x []float64) (float64, error) {
	if err := o.check(x); err != nil {
		return 0, err
	}
	m, err := o.model()
	if err != nil {
		return 0, err
	}
	_, fStar := m.bestSampled()
	return m.scale * math.Exp(logExpectedImprovement(m, o.unit(x), fStar)), nil
}

var stdNormal = distuv.Normal{Mu: 0, Sigma: 1}

// logExpectedImprovement is log(EI), EI = E[max(fStar - f(u), 0)] on the standardised scale. The
// incumbent fStar is the best posterior mean, not the best sample: with noisy samples the lowest one
// is usually the luckiest, and improving on luck sends the search chasing noise. Suggest ranks by the
// log because far from the incumbent EI underflows to 0 everywhere (a few outliers make the standardised gains tiny), and a search over zeros is random.
// EI = sd·h(z) with h(z) = zΦ(z) + φ(z); for z < -25 the two terms cancel to nothing, and the
// asymptote h(z) ≈ φ(z)/z² is used instead (relative error under 3/z²).
func logExpectedImprovement(m *model, u []float64, fStar float64) float64 {
	mu, v := m.predict(u)
	gain := fStar - mu
	sd := math.Sqrt(v)
	if sd < 1e-12 {
		return math.Log(math.Max(gain, 0))
	}
	z := gain / sd
	if z < -25 {
		return math.Log(sd) + stdNormal.LogProb(z) - 2*math.Log(-z)
	}
	return math.Log(sd) + math.Log(math.Max(z*stdNormal.CDF(z)+stdNormal.Prob(z), 0))
}

// Suggest returns the next point to measure: the unsampled point of highest expected improvement that
// the search finds. Random candidates are scored, the best few are refined by a compass search, and
// the best unsampled result wins.
func (o *Optimizer) Suggest() ([]float64, error) {
	if len(o.y) == 0 {
		return o.randomUnsampled()
	}
	m, err := o.model()
	if err != nil {
		return nil, err
	}
	_, fStar := m.bestSampled()
	score := func(x []float64) float64 {
		if o.sampled[key(x)] {
			return math.Inf(-1)
		}
		return logExpectedImprovement(m, o.unit(x), fStar)
	}

	type scored struct {
		x  []float64
		ei float64 // log
	}
	var cands []scored
	add := func(x []float64) { cands = append(cands, scored{x, score(x)}) }
	for range candidates {
		add(o.randomPoint())
	}
	// Near the incumbent is where improvements usually are; random points alone rarely land close
	// enough to resolve a narrow minimum.
	best, _ := m.bestSampled()
	for range candidates / 8 {
		add(o.perturb(o.x[best], 0.05))
	}
	sort.SliceStable(cands, func(i, j int) bool { return cands[i].ei > cands[j].ei })
	for i := range min(starts, len(cands)) {
		x, ei := o.refine(cands[i].x, cands[i].ei, score)
		cands = append(cands, scored{x, ei})
	}
	sort.SliceStable(cands, func(i, j int) bool { return cands[i].ei > cands[j].ei })
	for _, c := range cands {
		if !o.sampled[key(c.x)] {
			return c.x, nil
		}
	}
	return o.randomUnsampled()
}

// refine climbs score from x by compass search: each dimension moves ±step in unit coordinates,
// halving the step when nothing improves; integer dimensions also move to the neighbouring values.
// EI is smooth between samples, so this finds the local peak a random candidate only lands near.
func (o *Optimizer) refine(x []float64, ei float64, score func([]float64) float64) ([]float64, float64) {
	step := 0.1
	for iter := 0; iter < 200; iter++ {
		bestX, bestEI := x, ei
		try := func(y []float64) {
			if v := score(y); v > bestEI {
				bestX, bestEI = y, v
			}
		}
		u := o.unit(x)
		for d, dim := range o.dims {
			// An integer range can be wide (bytes): it moves like a continuous one, snapped, and also
			// to its neighbouring values, which the halving step may never reach alone.
			for _, s := range []float64{-step, step} {
				v := append([]float64(nil), u...)
				v[d] += s
				try(o.fromUnit(v))
			}
			if !dim.Integer {
				continue
			}
			for _, s := range []float64{-1, 1} {
				if y := x[d] + s; y >= dim.Min && y <= dim.Max {
					v := append([]float64(nil), x...)
					v[d] = y
					try(v)
				}
			}
		}
		if bestEI > ei {
			x, ei = bestX, bestEI
			continue
		}
		if step /= 2; step < 1e-4 {
			break
		}
	}
	return x, ei
}

func (o *Optimizer) randomPoint() []float64 {
	u := make([]float64, len(o.dims))
	for i := range u {
		u[i] = o.rng.Float64()
	}
	return o.fromUnit(u)
}

// perturb moves x by a normal step of sd in unit coordinates.
func (o *Optimizer) perturb(x []float64, sd float64) []float64 {
	u := o.unit(x)
	for i := range u {
		u[i] += sd * o.rng.NormFloat64()
	}
	return o.fromUnit(u)
}

func (o *Optimizer) randomUnsampled() ([]float64, error) {
	for range 1000 {
		if x := o.randomPoint(); !o.sampled[key(x)] {
			return x, nil
		}
	}
	return nil, ErrExhausted
}
