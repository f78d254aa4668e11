package autotune

import (
	"cmp"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"time"

	"github.com/kolo-dl/kolo/internal/autotune/bayes"
	"github.com/kolo-dl/kolo/internal/autotune/csvlog"
	"github.com/kolo-dl/kolo/internal/autotune/decide"
	"gonum.org/v1/gonum/stat/distuv"
)

// Config sets up a tuner. Zero values mean the defaults given; negative ones are errors.
type Config struct {
	// Defaults are the job's own settings: the first point measured, the reference every
	// candidate is compared with, and what is kept unless a candidate is better with 95%
	// confidence over the whole run. The engine starts with them in force at step 1.
	Defaults Settings
	// Builtin is kolo's own fusion threshold and cycle time (the other fields are ignored; zero:
	// not given). Where the job's differ, the first candidate is the job's settings with these
	// two, so that a job started with settings that cost it finds its way back first of all.
	Builtin Settings
	// WarmupSamples are discarded at the start (default 3, Horovod's --autotune-warmup-samples).
	WarmupSamples int
	// StepsPerSample, when set (--autotune-steps-per-sample), is the number of optimizer steps in
	// every sample. 0, the default, sizes samples by time: a sample lasts at least SampleTime and
	// MinSampleSteps steps, and at most the steps that still let the tuner decide within
	// StepBudget (maxSampleSteps), whichever ends it first. An early abandon (doc.go) ends a
	// candidate's sample sooner either way.
	StepsPerSample int
	// SampleTime is the least time a sample lasts when samples are sized by time (default 1 s).
	SampleTime time.Duration
	// MinSampleSteps is the fewest steps in a sample sized by time (default 5).
	MinSampleSteps int
	// StepBudget is the step by which a tuner whose samples are sized by time has decided (default
	// 300): it caps the steps of a sample (maxSampleSteps).
	StepBudget int64
	// MaxSamples is the number of measured samples after warm-up, defaults' and candidates'
	// together, before the tuner must decide (default 20, --autotune-bayes-opt-max-samples). At
	// least 7: a candidate is judged from 3 pairs, each between two defaults samples.
	MaxSamples int
	// CandidatePairs caps the pairs one candidate is measured for before the next is tried
	// (default 5, at least 3). decide spreads each candidate's confidence over the looks up to
	// this cap, so a lower cap gives narrower intervals and leaves samples for more candidates.
	CandidatePairs int
	// Noise is the Gaussian process's noise (default bayes.DefaultNoise 0.8,
	// --autotune-gaussian-process-noise).
	Noise float64
	// Seed makes the search reproducible: equal configs and step times give equal decisions.
	Seed uint64
	// Log receives the CSV log (package csvlog); nil: none. New writes the header, so a job that
	// ends in warm-up still leaves a log.
	Log io.Writer
	// AppendLog says Log already holds a log whose columns are this tuner's (CanAppend): New
	// writes no header, and the rows follow the earlier ones (an elastic job's later rounds).
	AppendLog bool
	// Lag is the number of steps between deciding a switch and the step it applies from (default
	// 2): time for the broadcast to reach every rank.
	Lag int64
	// World is the world tuned for, written in every log row: a decision holds for a world like it
	// (DecisionFor).
	World World
}

const (
	defaultWarmup         = 3
	defaultSampleTime     = time.Second
	defaultMinSampleSteps = 5
	defaultStepBudget     = 300
	defaultMaxSamples     = 20
	defaultCandidatePairs = 5

	// DefaultLag is Config.Lag's default, which a caller that switches every rank to settings of
	// its own (a decision read back from the log) uses too.
	DefaultLag = 2
)

// ErrBadConfig is wrapped by New's errors.
var ErrBadConfig = errors.New("autotune: bad config")

func (c Config) withDefaults() (Config, error) {
	bad := func(format string, args ...any) (Config, error) {
		return c, fmt.Errorf("%w: "+format, append([]any{ErrBadConfig}, args...)...)
	}
	switch {
	case c.WarmupSamples < 0:
		return bad("warm-up samples %d < 0", c.WarmupSamples)
	case c.StepsPerSample < 0:
		return bad("steps per sample %d < 0", c.StepsPerSample)
	case c.SampleTime < 0:
		return bad("sample time %v < 0", c.SampleTime)
	case c.MinSampleSteps < 0:
		return bad("min steps per sample %d < 0", c.MinSampleSteps)
	case c.StepBudget < 0:
		return bad("step budget %d < 0", c.StepBudget)
	case c.World.Round < 0 || c.World.Ranks < 0 || c.World.Hosts < 0:
		return bad("world %+v: negative", c.World)
	case c.MaxSamples < 0:
		return bad("max samples %d < 0", c.MaxSamples)
	case c.CandidatePairs < 0:
		return bad("pairs per candidate %d < 0", c.CandidatePairs)
	case c.Lag < 0:
		return bad("lag %d steps < 0", c.Lag)
	case math.IsNaN(c.Noise) || math.IsInf(c.Noise, 0) || c.Noise < 0:
		return bad("Gaussian process noise %g: want a finite variance >= 0", c.Noise)
	case c.Defaults.FusionBytes < 0:
		return bad("default fusion threshold %d bytes < 0", c.Defaults.FusionBytes)
	case c.Defaults.CycleTime < 0:
		return bad("default cycle time %v < 0", c.Defaults.CycleTime)
	case c.Defaults.SpinTime < 0:
		return bad("default spin time %v < 0", c.Defaults.SpinTime)
	}
	c.WarmupSamples = cmp.Or(c.WarmupSamples, defaultWarmup)
	c.SampleTime = cmp.Or(c.SampleTime, defaultSampleTime)
	c.MinSampleSteps = cmp.Or(c.MinSampleSteps, defaultMinSampleSteps)
	c.StepBudget = cmp.Or(c.StepBudget, defaultStepBudget)
	c.MaxSamples = cmp.Or(c.MaxSamples, defaultMaxSamples)
	c.CandidatePairs = cmp.Or(c.CandidatePairs, defaultCandidatePairs)
	c.Noise = cmp.Or(c.Noise, bayes.DefaultNoise)
	c.Lag = cmp.Or(c.Lag, DefaultLag)
	if c.MaxSamples < 1+2*decide.MinPairs {
		return bad("max samples %d: a candidate needs %d (%d pairs and the defaults either side of each) before it can be judged",
			c.MaxSamples, 1+2*decide.MinPairs, decide.MinPairs)
	}
	if c.CandidatePairs < decide.MinPairs {
		return bad("pairs per candidate %d: a verdict needs %d", c.CandidatePairs, decide.MinPairs)
	}
	return c, nil
}

// maxSampleSteps is the most steps of a sample sized by time: the most that still decide within
// StepBudget when every sample, warm-up included, runs that long and every measured sample but the
// first follows a switch (Lag steps and the transitional one). At least MinSampleSteps. 10 at the
// defaults (3 warm-up samples, 20 measured, Lag 2, 300 steps), the count Horovod uses.
func (c Config) maxSampleSteps() int {
	spare := c.StepBudget - int64(c.MaxSamples)*(c.Lag+1) - c.Lag
	return max(c.MinSampleSteps, int(spare/int64(c.WarmupSamples+c.MaxSamples)))
}

type phase int

const (
	warmingUp phase = iota
	tuning
	decided
)

// evaluation is one candidate's A/B comparison.
type evaluation struct {
	settings  Settings
	rule      decide.Rule
	defaults  []float64 // seconds per step, A samples, the first one shared with the previous candidate
	candidate []float64 // B samples
	result    decide.Result
	abandoned bool // its sample was cut short, its first steps far slower than the defaults'
}

// Tuner is the autotuner's state. Create it with New.
type Tuner struct {
	cfg   Config
	space space
	opt   *bayes.Optimizer
	rng   *rand.Rand
	log   *csvlog.Writer
	err   error // the first log write error, returned by Close

	phase phase
	last  int64 // the last step reported; 0 before the first

	inForce   Settings
	candidate bool  // inForce is the current candidate, not the defaults
	from      int64 // step a decided switch applies from; 0 when none is pending

	timing   bool // a sample is being timed, from the end of markStep
	mark     time.Time
	markStep int64
	prevEnd  time.Time // the end of the last step of the sample being timed
	slow     int64     // its steps so far that took abandonRatio times the defaults' step or longer

	designed int // points of the initial design taken (design)

	sampleIndex int         // samples logged so far, warm-up included
	ended       []SampleEnd // samples finished since the last TakeSamples
	measured    int         // samples measured after warm-up
	pending     *csvlog.Row // a candidate row, held until its closing defaults sample gives its speed-up
	defaultTime []float64   // every measured defaults sample, seconds per step

	eval       *evaluation   // the candidate being measured; nil when none is
	evaluated  []*evaluation // finished candidates, in order
	incumbent  *evaluation   // the finished candidate Better with the highest speed-up; nil if none
	confidence float64       // each candidate's confidence: 95% shared over the candidates the budget allows

	result      Result
	chosenRowed bool // the chosen row is in the log
}

// New validates cfg, fills in its defaults and, if cfg.Log is set, writes the log's header.
func New(cfg Config) (*Tuner, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	t := &Tuner{cfg: cfg, rng: rand.New(rand.NewPCG(cfg.Seed, 0x6b6f6c6f6175746f)), inForce: cfg.Defaults,
		confidence: candidateConfidence(cfg)}
	if err := t.setBox(MaxCycleTime); err != nil {
		return nil, err
	}
	if cfg.Log != nil {
		newWriter := csvlog.NewWriter
		if cfg.AppendLog {
			newWriter = csvlog.AppendWriter
		}
		if t.log, err = newWriter(cfg.Log, logColumns); err != nil {
			return nil, fmt.Errorf("autotune: %w", err)
		}
	}
	return t, nil
}

// setBox makes the search box, with cycle times up to maxCycle, and a model that knows only the
// defaults.
func (t *Tuner) setBox(maxCycle time.Duration) error {
	sp := newSpace(t.cfg.Defaults, maxCycle)
	opt, err := bayes.New(sp.dims, t.cfg.Noise, t.rng)
	if err != nil {
		return fmt.Errorf("autotune: %w", err)
	}
	// The defaults' log time ratio to themselves is 0 by definition: the point every candidate's
	// observation is relative to.
	if err := opt.Add(sp.point(t.cfg.Defaults), 0); err != nil {
		return fmt.Errorf("autotune: defaults %v: %w", t.cfg.Defaults, err)
	}
	t.space, t.opt = sp, opt
	return nil
}

// Step reports that optimizer step `step` (1, 2, 3, ... consecutive) ended at `now` on this rank.
// When the tuner wants other settings in force, it returns them with the first step they apply
// from (from = step + Lag; change true); the caller applies them on every rank at that step.
//
// A step reported twice or out of order is ignored. A gap in the steps (some not reported) drops
// the sample being timed, which starts again from the reported step; so does a clock that went
// backwards. Neither changes the switch schedule, which is in steps.
func (t *Tuner) Step(step int64, now time.Time) (s Settings, from int64, change bool) {
	if t.last != 0 && step <= t.last {
		return Settings{}, 0, false
	}
	gap := t.last != 0 && step != t.last+1
	t.last = step
	if t.phase == decided {
		return Settings{}, 0, false
	}
	if t.from != 0 {
		if step < t.from {
			return Settings{}, 0, false // the old settings still run: no sample's
		}
		// The first step under the new settings is transitional: the next sample starts at its end.
		t.from = 0
		t.startSample(step, now)
		return Settings{}, 0, false
	}
	if !t.timing || gap || !now.After(t.prevEnd) {
		t.startSample(step, now)
		return Settings{}, 0, false
	}
	n := step - t.markStep
	if t.candidate && t.phase == tuning && t.eval != nil &&
		now.Sub(t.prevEnd).Seconds() >= abandonRatio*geomean(t.eval.defaults) {
		t.slow++
	}
	t.prevEnd = now
	abandon := t.candidate && t.phase == tuning && n >= abandonSteps && t.slow == n
	if !abandon && !t.sampleDone(n, now.Sub(t.mark)) {
		return Settings{}, 0, false
	}
	if abandon {
		t.eval.abandoned = true
	}
	next, final := t.sample(step, n, now.Sub(t.mark).Seconds()/float64(n))
	if final {
		t.decide(step)
	}
	if next == t.inForce {
		if !final {
			t.startSample(step, now)
		}
		return Settings{}, 0, false
	}
	t.inForce = next
	t.timing = false
	t.from = step + t.cfg.Lag
	return next, t.from, true
}

// SampleEnd is a sample the tuner finished timing, as the timeline marks it.
type SampleEnd struct {
	Index               int   // its row's sample number in the log
	FirstStep, LastStep int64 // the steps it timed
	Settings            Settings
	Candidate           bool    // a candidate's sample, else the defaults'
	Phase               string  // PhaseWarmup, PhaseTuning or PhaseAbandoned
	StepTime            float64 // seconds per step
}

// String reads like "sample 5 (steps 41-53), candidate: fusion 15 MiB, cycle 0 ms: 16.98 ms a step".
func (e SampleEnd) String() string {
	who := "defaults"
	if e.Candidate {
		who = "candidate"
	}
	if e.Phase != PhaseTuning {
		who += ", " + e.Phase
	}
	return fmt.Sprintf("sample %d (steps %d-%d), %s: %v: %s ms a step", e.Index, e.FirstStep, e.LastStep, who, e.Settings,
		round2(e.StepTime*1e3))
}

// TakeSamples returns the samples finished since the last call, in order.
func (t *Tuner) TakeSamples() []SampleEnd {
	out := t.ended
	t.ended = nil
	return out
}

func (t *Tuner) startSample(step int64, now time.Time) {
	t.timing, t.mark, t.markStep, t.prevEnd, t.slow = true, now, step, now, 0
}

// sampleDone says a sample of n steps that has lasted elapsed is complete.
func (t *Tuner) sampleDone(n int64, elapsed time.Duration) bool {
	if t.cfg.StepsPerSample > 0 {
		return n >= int64(t.cfg.StepsPerSample)
	}
	return n >= int64(t.cfg.maxSampleSteps()) || n >= int64(t.cfg.MinSampleSteps) && elapsed >= t.cfg.SampleTime
}

// Abandoning a candidate early: its sample ends once its first abandonSteps steps, and every step
// since, each took at least abandonRatio times the defaults' step time (the mean of the defaults
// samples of its comparison). A candidate that far behind cannot win, and on a fast-step job each
// of its steps costs the job a quarter of a step or more: a 25 ms cycle time on a 10 ms step runs
// 3.5 times as long. A candidate no slower than the defaults passes the test unless each of two
// steps runs 25% slow by chance, which per-step jitter of 10% (sd of the log) does one time in
// 10,000 and of 20% one time in 70; it then only costs a missed candidate, never a wrong crown.
const (
	abandonSteps = 2
	abandonRatio = 1.25
)

// sample takes a finished sample of n steps of secs seconds each, ending at step, and says which
// settings the next sample runs, and whether the tuner has decided (next is then the decision).
func (t *Tuner) sample(step, n int64, secs float64) (next Settings, final bool) {
	phase := PhaseTuning
	switch {
	case t.phase == warmingUp:
		phase = PhaseWarmup
	case t.candidate && t.eval.abandoned:
		phase = PhaseAbandoned
	}
	row := csvlog.Row{Sample: t.sampleIndex, Step: step, Settings: t.columns(t.inForce, phase, n), StepTime: secs,
		Role: csvlog.Default, Speedup: math.NaN(), CILow: math.NaN(), CIHigh: math.NaN()}
	t.ended = append(t.ended, SampleEnd{Index: t.sampleIndex, FirstStep: step - n + 1, LastStep: step, Settings: t.inForce,
		Candidate: t.candidate, StepTime: secs, Phase: phase})
	t.sampleIndex++
	if t.phase == warmingUp {
		t.write(row)
		if t.sampleIndex == t.cfg.WarmupSamples {
			t.phase = tuning
			// The box's cycle times end at half the defaults' step, as the last warm-up sample
			// measured it; the model starts over in it, knowing the defaults only.
			if err := t.setBox(cycleCap(secs)); err != nil {
				t.err = err
			}
		}
		return t.inForce, false
	}
	t.measured++

	if t.candidate {
		// A candidate sample: its row waits for the defaults sample after it, which completes
		// its pair and gives the speed-up to write.
		t.eval.candidate = append(t.eval.candidate, secs)
		row.Role = csvlog.Candidate
		t.pending = &row
		t.candidate = false
		return t.cfg.Defaults, false
	}

	t.defaultTime = append(t.defaultTime, secs)
	if t.eval == nil {
		t.write(row)
		return t.next(secs)
	}
	e := t.eval
	e.defaults = append(e.defaults, secs)
	// The run's pooled spread (every comparison's pairs and defaults samples, this one's included)
	// narrows the interval of a candidate whose own few pairs spread no wider (decide.Rule.Pooled).
	v, df := t.pairVariance()
	e.rule.Pooled = decide.Spread{Var: v, DF: df}
	res, err := e.rule.Compare(e.defaults, e.candidate)
	if err != nil {
		// Cannot happen: the samples alternate and are positive. Drop the candidate rather than
		// act on a comparison that failed.
		res = decide.Result{Done: true, Speedup: math.NaN(), Low: math.NaN(), High: math.NaN()}
	}
	e.result = res
	t.flushPending(res)
	t.write(row)
	if !res.Done && !e.abandoned && !t.hopeless(e) {
		t.candidate = true
		return e.settings, false
	}
	t.finish(e)
	return t.next(secs)
}

// finish ends the measurement of e: the model learns its mean log time ratio to the defaults, and
// if it is Better and faster than the incumbent by its estimate, it becomes the incumbent.
func (t *Tuner) finish(e *evaluation) {
	t.evaluated = append(t.evaluated, e)
	t.eval = nil
	if y := -math.Log(e.result.Speedup); !math.IsNaN(y) && !math.IsInf(y, 0) {
		_ = t.opt.Add(t.space.point(e.settings), y) // a point of the box, a finite value
	}
	if e.result.Verdict == decide.Better && (t.incumbent == nil || e.result.Speedup > t.incumbent.result.Speedup) {
		t.incumbent = e
	}
}

// next starts the next candidate after a defaults sample of secs, or decides: when the samples
// left cannot give a candidate its minimum pairs, when the model has nothing left to suggest, or
// when it expects less than minGain from the best it can suggest.
func (t *Tuner) next(secs float64) (Settings, bool) {
	if t.pairsLeft() < decide.MinPairs {
		return t.stop()
	}
	s, ok := t.design()
	if !ok {
		var ei float64
		if s, ei, ok = t.suggest(); !ok || ei < minGain {
			return t.stop()
		}
	}
	return t.startCandidate(secs, s)
}

// stop ends the tuning: the incumbent is chosen, or, if no candidate was Better, the defaults kept.
func (t *Tuner) stop() (Settings, bool) {
	if t.incumbent != nil {
		return t.incumbent.settings, true
	}
	return t.cfg.Defaults, true
}

// design is the next point of the initial design that lies clear of the points measured, if one is
// left. First, when the job's fusion threshold or cycle time differ from kolo's own (Builtin),
// the job's settings with kolo's two: settings that cost a job are most often a user's or an
// old script's, and kolo's own are where it finds its way back. Then the middle of the fusion range (in log bytes) at the shorter of the defaults' and the
// far corner's cycle times: where a fusion threshold's usual optimum lies (small ones send many
// small allreduces, large ones start communicating late), which no corner sees, and the likeliest
// winner (a cycle only adds latency to negotiation, so the shorter is the likelier to win); a
// winner found first makes every later candidate that cannot beat it hopeless sooner. Then the far
// corner, where a model that has seen one point expects the most. Then the defaults with the cycle
// time alone moved to the corner's, which with the defaults and the corner makes three corners of
// a rectangle and tells the two knobs' effects apart. The model takes over from there, with points
// enough to fit a length scale per knob.
func (t *Tuner) design() (Settings, bool) {
	d := t.cfg.Defaults
	corner := t.space.farCorner(d)
	x := t.space.point(d)
	x[0] = t.space.middle(0)
	middle := t.space.settings(x) // the middle fusion threshold at the shorter cycle
	middle.CycleTime = min(d.CycleTime, corner.CycleTime)
	cycle := d // the far cycle time
	cycle.CycleTime = corner.CycleTime
	var points []Settings
	if b := t.cfg.Builtin; b != (Settings{}) && (b.FusionBytes != d.FusionBytes || b.CycleTime != d.CycleTime) {
		own := d
		own.FusionBytes, own.CycleTime = b.FusionBytes, b.CycleTime
		points = append(points, own)
	}
	points = append(points, middle)
	if len(t.space.dims) > 2 {
		// The collective knobs alone at the corner, before the far corner: that moves the cycle
		// time too, which alone often makes it slow enough to abandon, and says nothing of them
		// then.
		coll := corner
		coll.FusionBytes, coll.CycleTime = d.FusionBytes, d.CycleTime
		points = append(points, coll)
	}
	points = append(points, corner, cycle)
	for t.designed < len(points) {
		s := points[t.designed]
		t.designed++
		if t.far(t.space.point(s)) {
			return s, true
		}
	}
	return Settings{}, false
}

// minGain is the expected improvement (in log time ratio: a fraction of the step time) below which
// another candidate is not worth its samples.
const minGain = 0.01

// hopeless says e, still undecided, cannot plausibly beat what it has to: the incumbent's
// estimated speed-up, or before there is one the no-gain speed-up. It compares e's pairs so far
// with the noise of the samples measured so far, one-sided at dropLevel. Dropping a candidate early
// never crowns one, so a wrong drop costs at most a missed better point, and a right one frees
// samples for the search: a candidate 10% slower than the defaults is plain after a pair.
func (t *Tuner) hopeless(e *evaluation) bool {
	pairs := e.result.Pairs
	if pairs == 0 || math.IsNaN(e.result.Speedup) {
		return false
	}
	v, df := t.pairVariance()
	if df < 1 {
		return false
	}
	target, se2 := math.Log(decide.NoGain), v/float64(pairs)
	if inc := t.incumbent; inc != nil {
		target = math.Log(inc.result.Speedup)
		se2 += v / float64(inc.result.Pairs)
	}
	q := distuv.StudentsT{Mu: 0, Sigma: 1, Nu: float64(df)}.Quantile(dropLevel)
	return math.Log(e.result.Speedup)+q*math.Sqrt(se2) < target
}

// dropLevel is the one-sided confidence with which an early-dropped candidate falls short.
const dropLevel = 0.99

// pairVariance estimates the variance of one pair's log speed-up, and its degrees of freedom, from
// every comparison so far (the current one included): the spread of each candidate's pairs about
// their mean, and the jumps between successive defaults samples. A pair's log speed-up is a
// candidate sample's log less the mean of two defaults samples', 1.5 times a sample's variance;
// a jump is the difference of two defaults samples, twice it. Drift only inflates the jumps, which
// errs towards measuring on. Successive jumps share a sample, and squared successive differences
// estimate a variance with about two thirds of the efficiency of as many independent deviations
// (von Neumann), so the jumps count two thirds of a degree of freedom each.
func (t *Tuner) pairVariance() (float64, int) {
	var ss float64
	df, jumps := 0, 0
	for _, e := range t.measuring() {
		n := min(len(e.candidate), len(e.defaults)-1)
		var mean float64
		for i := range n {
			mean += t.pairLog(e, i)
		}
		mean /= float64(max(n, 1))
		for i := range n {
			d := t.pairLog(e, i) - mean
			ss += d * d
		}
		df += max(n-1, 0)
		for i := 1; i < len(e.defaults); i++ {
			d := math.Log(e.defaults[i]) - math.Log(e.defaults[i-1])
			ss += 0.75 * d * d
			jumps++
		}
	}
	if df+jumps == 0 {
		return 0, 0
	}
	return ss / float64(df+jumps), df + 2*jumps/3
}

// pairLog is the log speed-up of e's pair i.
func (t *Tuner) pairLog(e *evaluation, i int) float64 {
	return (math.Log(e.defaults[i])+math.Log(e.defaults[i+1]))/2 - math.Log(e.candidate[i])
}

// minSeparation is how far (in the model's unit box) a candidate must lie from every point measured
// already. Expected improvement with few points likes the neighbourhood of the best one, which is
// the defaults until a candidate beats them; but a candidate a hair from the defaults costs as many
// samples as any other and cannot be shown faster in a tuning run's budget.
const minSeparation = 0.15

// far says x lies at least minSeparation from the defaults and every candidate measured.
func (t *Tuner) far(x []float64) bool {
	if t.space.distance(x, t.space.point(t.cfg.Defaults)) < minSeparation {
		return false
	}
	for _, e := range t.evaluated {
		if t.space.distance(x, t.space.point(e.settings)) < minSeparation {
			return false
		}
	}
	return true
}

// suggest is bayes's suggestion, or, if that is too close to a point measured, the point of highest
// expected improvement on a grid over the box that is not; with its expected improvement in log
// time ratio.
func (t *Tuner) suggest() (Settings, float64, bool) {
	if x, err := t.opt.Suggest(); err == nil {
		s := t.space.settings(x)
		if p := t.space.point(s); t.far(p) {
			if ei, err := t.opt.ExpectedImprovement(p); err == nil {
				return s, ei, true
			}
		}
	}
	var best Settings
	bestEI := math.Inf(-1)
	for _, x := range t.space.grid(gridPoints(len(t.space.dims))) {
		if !t.far(x) {
			continue
		}
		if ei, err := t.opt.ExpectedImprovement(x); err == nil && ei > bestEI {
			best, bestEI = t.space.settings(x), ei
		}
	}
	return best, bestEI, !math.IsInf(bestEI, -1)
}

// gridSize is the number of grid values per dimension suggest falls back to in a box of two.
const gridSize = 21

// gridPoints is the values per dimension of suggest's grid over dims dimensions: gridSize for two,
// fewer for more, so that the grid stays near gridSize² points (at least 3 values each).
func gridPoints(dims int) int {
	if dims <= 2 {
		return gridSize
	}
	return max(3, int(math.Pow(gridSize*gridSize, 1/float64(dims))))
}

// startCandidate begins measuring s against the defaults, whose last sample (secs) opens the
// comparison, if the samples left allow a verdict; otherwise the tuner keeps the defaults.
func (t *Tuner) startCandidate(secs float64, s Settings) (Settings, bool) {
	pairs := min(t.cfg.CandidatePairs, t.pairsLeft())
	if pairs < decide.MinPairs {
		return t.stop()
	}
	t.eval = &evaluation{settings: s, rule: decide.Rule{Confidence: t.confidence, MaxPairs: pairs}, defaults: []float64{secs}}
	t.candidate = true
	return s, false
}

// pairsLeft is the number of pairs the samples left can measure.
func (t *Tuner) pairsLeft() int { return (t.cfg.MaxSamples - t.measured) / 2 }

// measuring is every candidate measured: the finished ones and the current one.
func (t *Tuner) measuring() []*evaluation {
	all := t.evaluated[:len(t.evaluated):len(t.evaluated)]
	if t.eval != nil {
		all = append(all, t.eval)
	}
	return all
}

// candidateConfidence is the confidence each candidate is judged at: 95% Bonferroni-shared over the
// most candidates the budget can bring to a verdict (each needs decide.MinPairs pairs of 2
// samples, after the first defaults sample), so that the chance that any candidate of the run is
// crowned without being faster stays within 5%.
func candidateConfidence(cfg Config) float64 {
	n := max(1, (cfg.MaxSamples-1)/(2*decide.MinPairs))
	return 1 - (1-confidence)/float64(n)
}

// confidence is the run's: the chance that the decision's interval, and every other candidate's,
// holds.
const confidence = 0.95

// decide records the decision taken at step: the candidate just found Better, or the defaults.
func (t *Tuner) decide(step int64) {
	t.phase = decided
	t.result = t.summary()
	t.result.Decided = true
	t.result.DecidedAt = step
	t.writeChosen()
}

// summary is what is known: the incumbent if a candidate was Better, else the defaults and the
// candidate measured fastest so far.
func (t *Tuner) summary() Result {
	r := Result{Chosen: t.cfg.Defaults, KeptDefaults: true, Speedup: math.NaN(), Low: math.NaN(), High: math.NaN(),
		Samples: t.measured, Candidates: len(t.evaluated)}
	best := t.incumbent
	if best != nil {
		r.Chosen, r.KeptDefaults = best.settings, false
	} else {
		for _, e := range t.measuring() {
			if e.result.Pairs == 0 || math.IsNaN(e.result.Speedup) {
				continue
			}
			if best == nil || e.result.Speedup > best.result.Speedup {
				best = e
			}
		}
	}
	if best != nil {
		r.Best, r.HaveBest = best.settings, true
		r.Speedup, r.Low, r.High, r.Pairs = best.result.Speedup, best.result.Low, best.result.High, best.result.Pairs
	}
	return r
}

func (t *Tuner) write(row csvlog.Row) {
	if t.log == nil || t.err != nil {
		return
	}
	if err := t.log.Sample(row); err != nil {
		t.err = err
	}
}

// flushPending writes the held candidate row with the comparison as it stands after its pair.
func (t *Tuner) flushPending(res decide.Result) {
	if t.pending == nil {
		return
	}
	row := *t.pending
	t.pending = nil
	row.Speedup, row.CILow, row.CIHigh = res.Speedup, finiteOrNaN(res.Low), finiteOrNaN(res.High)
	t.write(row)
}

// finiteOrNaN turns decide's "no interval yet" (0 and +Inf) into empty cells.
func finiteOrNaN(v float64) float64 {
	if v <= 0 || math.IsInf(v, 0) {
		return math.NaN()
	}
	return v
}

// writeChosen appends the decision row: written as soon as the decision is taken, so that a job
// that dies before Close still leaves it; Close writes it if that failed to happen.
func (t *Tuner) writeChosen() {
	if t.log == nil || t.err != nil || t.chosenRowed {
		return
	}
	r := t.result
	row := csvlog.Row{Step: r.DecidedAt, Settings: t.columns(r.Chosen, PhaseDecided, 0), StepTime: t.meanTime(),
		Speedup: 1, CILow: math.NaN(), CIHigh: math.NaN()}
	if !r.KeptDefaults {
		row.Speedup, row.CILow, row.CIHigh = r.Speedup, finiteOrNaN(r.Low), finiteOrNaN(r.High)
	}
	if err := t.log.Chosen(row); err != nil {
		t.err = err
		return
	}
	t.chosenRowed = true
}

// meanTime is the geometric mean seconds per step of the chosen settings' measured samples: the
// candidate's, or the defaults'.
func (t *Tuner) meanTime() float64 {
	xs := t.defaultTime
	if t.incumbent != nil {
		xs = t.incumbent.candidate
	}
	return geomean(xs)
}

// geomean is the geometric mean of xs, NaN if there are none.
func geomean(xs []float64) float64 {
	if len(xs) == 0 {
		return math.NaN()
	}
	var s float64
	for _, x := range xs {
		s += math.Log(x)
	}
	return math.Exp(s / float64(len(xs)))
}

// Done says the tuner has decided: no more changes will come.
func (t *Tuner) Done() bool { return t.phase == decided }

// Result is the decision once Done; before that, what is known so far, with Decided false.
func (t *Tuner) Result() Result {
	if t.phase == decided {
		return t.result
	}
	return t.summary()
}

// Close flushes a candidate row still waiting for its pair, makes sure the decision row is written
// if the tuner decided, and otherwise leaves the log as it is, so that a reader says the job ended
// with no decision. It returns the first error writing the log met. It does not close cfg.Log.
func (t *Tuner) Close() error {
	if t.pending != nil {
		row := *t.pending
		t.pending = nil
		t.write(row)
	}
	if t.phase == decided {
		t.writeChosen()
	}
	if t.err != nil {
		return fmt.Errorf("autotune: log: %w", t.err)
	}
	return nil
}
