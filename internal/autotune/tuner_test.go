package autotune

import (
	"bytes"
	"errors"
	"math"
	"math/rand/v2"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kolo-dl/kolo/internal/autotune/csvlog"
)

// job is a synthetic training job: the mean seconds of a step under some settings, and lognormal
// jitter around it.
type job struct {
	mean   func(s Settings, step int64) float64
	jitter float64 // sd of the log of a step's time
	// noisier, if set, multiplies the jitter under some settings: noise that differs between
	// settings.
	noisier func(s Settings) float64
	// switchCost is extra seconds on the first step under new settings, which no sample may see.
	switchCost float64
	// sleepsOut adds the old settings' cycle time to the first step under new ones: a negotiation
	// cycle that began in the old regime sleeps it out (doc.go).
	sleepsOut bool
}

type switchAt struct {
	at, from int64
	s        Settings
}

type run struct {
	tuner    *Tuner
	cfg      Config // as given
	switches []switchAt
	log      *bytes.Buffer
	steps    int64 // reported
	// inForce is the settings each step ran under, by step (index 0 unused).
	inForce []Settings
	// secs is each step's time, by step (index 0 unused).
	secs []float64
}

// simulate runs j under cfg for at most maxSteps steps, applying the tuner's switches as the
// engine would, and stops a few steps after the tuner is done and every switch has applied.
func simulate(t *testing.T, cfg Config, j job, seed uint64, maxSteps int64) *run {
	t.Helper()
	r := &run{cfg: cfg, log: &bytes.Buffer{}, inForce: []Settings{{}}, secs: []float64{0}}
	cfg.Log = r.log
	tu, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	r.tuner = tu
	rng := rand.New(rand.NewPCG(seed, 77))
	now := time.Unix(1000, 0)
	inForce := cfg.Defaults
	pending := map[int64]Settings{}
	var lastFrom int64
	jitter := func(s Settings) float64 {
		if j.noisier != nil {
			return j.jitter * j.noisier(s)
		}
		return j.jitter
	}
	for step := int64(1); step <= maxSteps; step++ {
		secs := j.mean(inForce, step) * math.Exp(jitter(inForce)*rng.NormFloat64())
		if s, ok := pending[step]; ok {
			old := inForce
			inForce = s
			delete(pending, step)
			secs = j.mean(inForce, step)*math.Exp(jitter(inForce)*rng.NormFloat64()) + j.switchCost
			if j.sleepsOut {
				secs += old.CycleTime.Seconds()
			}
		}
		r.inForce = append(r.inForce, inForce)
		r.secs = append(r.secs, secs)
		now = now.Add(time.Duration(secs * float64(time.Second)))
		s, from, change := tu.Step(step, now)
		r.steps = step
		if change {
			r.switches = append(r.switches, switchAt{step, from, s})
			pending[from] = s
			lastFrom = from
		}
		if tu.Done() && step > lastFrom+5 {
			break
		}
	}
	if err := tu.Close(); err != nil {
		t.Fatal(err)
	}
	return r
}

func flat(secs float64) func(Settings, int64) float64 {
	return func(Settings, int64) float64 { return secs }
}

// cycleCost is a job whose negotiation cycle adds k times itself to a step: cycle 0 is best,
// whatever the fusion threshold.
func cycleCost(base, k float64) func(Settings, int64) float64 {
	return func(s Settings, _ int64) float64 { return base + k*s.CycleTime.Seconds() }
}

func readLog(t *testing.T, r *run) *csvlog.Log {
	t.Helper()
	l, err := csvlog.Read(bytes.NewReader(r.log.Bytes()))
	if err != nil {
		t.Fatalf("read the log: %v\n%s", err, r.log)
	}
	return l
}

// TestKeepsDefaultsWhenNothingMatters: when the settings make no difference, the tuner must not
// crown a candidate, and must give up within its budget, drift or not.
func TestKeepsDefaultsWhenNothingMatters(t *testing.T) {
	defaults := Settings{FusionBytes: 64 << 20, CycleTime: 0}
	for _, tc := range []struct {
		name string
		job  job
	}{
		{"2% jitter", job{mean: flat(0.1), jitter: 0.02}},
		{"5% jitter", job{mean: flat(0.1), jitter: 0.05}},
		// 30% slower over 400 steps: measured one after the other, later candidates would look slower.
		{"drift", job{mean: func(_ Settings, step int64) float64 { return 0.1 * (1 + 0.3*float64(step)/400) }, jitter: 0.02}},
		{"switches cost", job{mean: flat(0.1), jitter: 0.02, switchCost: 0.1}},
		// Samples sized by time: 10 steps of a 10 ms job, 5 of a 400 ms one.
		{"10 ms steps, 15% jitter", job{mean: flat(0.01), jitter: 0.15}},
		{"400 ms steps, 3% jitter", job{mean: flat(0.4), jitter: 0.03}},
	} {
		for seed := uint64(1); seed <= 6; seed++ {
			r := simulate(t, Config{Defaults: defaults, Seed: seed}, tc.job, seed, 2000)
			res := r.tuner.Result()
			if !r.tuner.Done() || !res.Decided {
				t.Fatalf("%s, seed %d: not done after %d steps: %v", tc.name, seed, r.steps, res)
			}
			if !res.KeptDefaults || res.Chosen != defaults {
				t.Errorf("%s, seed %d: %v", tc.name, seed, res)
			}
			if len(r.switches) > 0 && r.switches[len(r.switches)-1].s != defaults {
				t.Errorf("%s, seed %d: last switch to %v, not back to the defaults", tc.name, seed, r.switches[len(r.switches)-1].s)
			}
			if res.Samples > 20 || res.Candidates < 1 {
				t.Errorf("%s, seed %d: %d samples, %d candidates: want <= 20 and >= 1", tc.name, seed, res.Samples, res.Candidates)
			}
			if seed == 1 {
				t.Logf("%s: %v (%d candidates)", tc.name, res, res.Candidates)
			}
		}
	}
}

// TestFindsFasterCycle starts a job whose cycle time costs time with bad defaults, and wants a
// small cycle time chosen with 95% confidence, within 300 steps.
func TestFindsFasterCycle(t *testing.T) {
	defaults := Settings{FusionBytes: 1 << 20, CycleTime: 20 * time.Millisecond}
	for _, tc := range []struct {
		name string
		job  job
	}{
		{"50 ms + cycle", job{mean: cycleCost(0.05, 1), jitter: 0.02}},
		{"200 ms + cycle", job{mean: cycleCost(0.2, 1), jitter: 0.02}},
		{"50 ms + cycle, 5% jitter", job{mean: cycleCost(0.05, 1), jitter: 0.05}},
	} {
		var at []int64
		for seed := uint64(1); seed <= 8; seed++ {
			r := simulate(t, Config{Defaults: defaults, Seed: seed, WarmupSamples: 3, StepsPerSample: 10}, tc.job, seed, 1000)
			res := r.tuner.Result()
			if !res.Decided || res.KeptDefaults {
				t.Fatalf("%s, seed %d: %v", tc.name, seed, res)
			}
			if res.Chosen.CycleTime >= 5*time.Millisecond || !(res.Low > 1) {
				t.Errorf("%s, seed %d: %v", tc.name, seed, res)
			}
			if res.DecidedAt > 300 {
				t.Errorf("%s, seed %d: decided at step %d, want <= 300", tc.name, seed, res.DecidedAt)
			}
			at = append(at, res.DecidedAt)
			if seed == 1 {
				t.Logf("%s: %v", tc.name, res)
			}
		}
		t.Logf("%s: decided at steps %v", tc.name, at)
	}
}

// TestSwitchSchedule checks what the engine relies on: every switch applies Lag steps after it is
// returned, only between samples, and every sample ran one setting, the one its log row names,
// with the first step under new settings in no sample.
func TestSwitchSchedule(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  Config
		job  job
	}{
		{"faster cycle, lag 2", Config{Defaults: Settings{FusionBytes: 1 << 20, CycleTime: 20 * time.Millisecond}}, job{mean: cycleCost(0.05, 1), jitter: 0.02}},
		{"noise, lag 1", Config{Defaults: Settings{FusionBytes: 64 << 20, CycleTime: 0}, Lag: 1}, job{mean: flat(0.1), jitter: 0.02}},
		{"noise, lag 5, 4 steps", Config{Defaults: Settings{FusionBytes: 64 << 20, CycleTime: 0}, Lag: 5, StepsPerSample: 4, WarmupSamples: 1}, job{mean: flat(0.1), jitter: 0.03}},
		{"noise, 1 step", Config{Defaults: Settings{FusionBytes: 0, CycleTime: 0}, StepsPerSample: 1, MaxSamples: 30}, job{mean: flat(0.1), jitter: 0.03}},
	} {
		cfg, _ := tc.cfg.withDefaults()
		r := simulate(t, tc.cfg, tc.job, 3, 3000)
		if !r.tuner.Done() {
			t.Fatalf("%s: not done", tc.name)
		}
		if len(r.switches) < 2 {
			t.Fatalf("%s: %d switches", tc.name, len(r.switches))
		}
		for _, sw := range r.switches {
			if sw.from != sw.at+cfg.Lag {
				t.Errorf("%s: switch to %v returned at step %d applies from %d, want %d", tc.name, sw.s, sw.at, sw.from, sw.at+cfg.Lag)
			}
		}
		l := readLog(t, r)
		samples := 0
		for _, row := range l.Rows {
			if row.Role == csvlog.Chosen {
				continue
			}
			samples++
			n, err := strconv.ParseInt(row.Settings[ColumnSteps], 10, 64)
			if err != nil || n < 1 {
				t.Fatalf("%s: sample %d: steps %q", tc.name, row.Sample, row.Settings[ColumnSteps])
			}
			if want := int64(cfg.StepsPerSample); want > 0 && n != want && row.Settings[ColumnPhase] != PhaseAbandoned {
				t.Errorf("%s: sample %d measured %d steps, want %d", tc.name, row.Sample, n, want)
			}
			first := row.Step - n + 1 // the sample is steps first..row.Step, timed from the end of first-1
			if first < 2 {
				t.Errorf("%s: sample %d timed from step %d: the first step's start is unknown", tc.name, row.Sample, first-1)
			}
			for _, sw := range r.switches {
				if sw.from >= first && sw.from <= row.Step {
					t.Errorf("%s: switch at step %d (returned at %d) inside sample %d (steps %d-%d)",
						tc.name, sw.from, sw.at, row.Sample, first, row.Step)
				}
			}
			for step := first; step <= row.Step; step++ {
				if got, _ := ParseSettings(row.Settings); r.inForce[step] != got {
					t.Fatalf("%s: sample %d logs %v, step %d ran %v", tc.name, row.Sample, got, step, r.inForce[step])
				}
			}
		}
		if samples != cfg.WarmupSamples+r.tuner.Result().Samples {
			t.Errorf("%s: %d rows, want %d warm-up and %d measured", tc.name, samples, cfg.WarmupSamples, r.tuner.Result().Samples)
		}
	}
}

// TestLog: a job that ends in warm-up leaves a log with no decision; a finished one, a log that
// reads back to the decision, with warm-up rows marked and candidate rows carrying their speed-up.
func TestLog(t *testing.T) {
	t.Run("ends in warm-up", func(t *testing.T) {
		for _, steps := range []int64{0, 1, 15} {
			var buf bytes.Buffer
			tu, err := New(Config{Defaults: Settings{FusionBytes: 1 << 20, CycleTime: 0}, Log: &buf})
			if err != nil {
				t.Fatal(err)
			}
			now := time.Unix(0, 0)
			for step := int64(1); step <= steps; step++ {
				now = now.Add(100 * time.Millisecond)
				if _, _, change := tu.Step(step, now); change {
					t.Fatalf("a switch in warm-up, at step %d", step)
				}
			}
			if err := tu.Close(); err != nil {
				t.Fatal(err)
			}
			l, err := csvlog.Read(bytes.NewReader(buf.Bytes()))
			if err != nil {
				t.Fatalf("%d steps: %v\n%s", steps, err, buf.String())
			}
			if _, _, err := DecisionFor(l, World{}); !errors.Is(err, csvlog.ErrNoDecision) {
				t.Errorf("%d steps: decision error %v, want ErrNoDecision", steps, err)
			}
			if want := int(max(steps-1, 0) / 10); len(l.Rows) != want {
				t.Errorf("%d steps: %d rows, want %d", steps, len(l.Rows), want)
			}
			for _, row := range l.Rows {
				if row.Settings[ColumnPhase] != PhaseWarmup || row.Role != csvlog.Default {
					t.Errorf("%d steps: row %+v: want a warm-up defaults row", steps, row)
				}
			}
			if !reflect.DeepEqual(l.Settings, []string{ColumnFusionBytes, ColumnCycleMs, ColumnSmallAllreduce, ColumnSharedRound, ColumnHierarchical,
				ColumnSpinUs, ColumnResponseCache, ColumnPhase, ColumnSteps, ColumnRound, ColumnRanks, ColumnHosts}) {
				t.Errorf("columns %q", l.Settings)
			}
		}
	})
	t.Run("decided", func(t *testing.T) {
		for _, tc := range []struct {
			name string
			job  job
			keep bool
		}{
			{"switches", job{mean: cycleCost(0.05, 1), jitter: 0.02}, false},
			{"keeps", job{mean: flat(0.05), jitter: 0.02}, true},
		} {
			r := simulate(t, Config{Defaults: Settings{FusionBytes: 1 << 20, CycleTime: 20 * time.Millisecond}, Seed: 5}, tc.job, 5, 2000)
			res := r.tuner.Result()
			if res.KeptDefaults != tc.keep {
				t.Fatalf("%s: %v", tc.name, res)
			}
			if s, _, err := DecisionFor(readLog(t, r), World{}); err != nil || s != res.Chosen {
				t.Errorf("%s: the log chose %v (%v), the tuner %v", tc.name, s, err, res.Chosen)
			}
			l := readLog(t, r)
			last := l.Rows[len(l.Rows)-1]
			if last.Role != csvlog.Chosen || last.Step != res.DecidedAt || last.Settings[ColumnPhase] != PhaseDecided {
				t.Errorf("%s: last row %+v", tc.name, last)
			}
			if !tc.keep && !(last.CILow > 1 && last.Speedup == res.Speedup) {
				t.Errorf("%s: chosen row %+v, result %v", tc.name, last, res)
			}
			warm, withCI := 0, 0
			for i, row := range l.Rows[:len(l.Rows)-1] {
				if row.Sample != i {
					t.Errorf("%s: row %d numbered %d", tc.name, i, row.Sample)
				}
				if row.Settings[ColumnPhase] == PhaseWarmup {
					warm++
				}
				if row.Role == csvlog.Candidate {
					if math.IsNaN(row.Speedup) {
						t.Errorf("%s: candidate row %+v has no speed-up", tc.name, row)
					}
					if !math.IsNaN(row.CILow) {
						withCI++
					}
				} else if !math.IsNaN(row.Speedup) {
					t.Errorf("%s: defaults row %+v has a speed-up", tc.name, row)
				}
			}
			if warm != 3 || withCI == 0 {
				t.Errorf("%s: %d warm-up rows, %d candidate rows with an interval\n%s", tc.name, warm, withCI, r.log)
			}
			if !strings.HasPrefix(r.log.String(), csvlog.Comment+"\n") {
				t.Errorf("%s: log starts %q", tc.name, r.log.String()[:40])
			}
		}
	})
}

// TestDeterministic: the same seed and the same step times give the same run, log included.
func TestDeterministic(t *testing.T) {
	cfg := Config{Defaults: Settings{FusionBytes: 8 << 20, CycleTime: 5 * time.Millisecond}, Seed: 42}
	j := job{mean: func(s Settings, _ int64) float64 {
		return 0.1 + 0.002*math.Abs(math.Log2(float64(s.FusionBytes+1<<20))-25) + 0.5*s.CycleTime.Seconds()
	}, jitter: 0.03}
	a := simulate(t, cfg, j, 9, 2000)
	b := simulate(t, cfg, j, 9, 2000)
	if !reflect.DeepEqual(a.switches, b.switches) || a.log.String() != b.log.String() {
		t.Errorf("two runs differ:\n%s\n%s", a.log, b.log)
	}
	if a.tuner.Result().String() != b.tuner.Result().String() {
		t.Errorf("%v\n%v", a.tuner.Result(), b.tuner.Result())
	}
}

// TestStepsOutOfOrder: repeated steps are ignored, and a gap or a clock going backwards drops
// the sample being timed instead of logging a wrong time.
func TestStepsOutOfOrder(t *testing.T) {
	var buf bytes.Buffer
	tu, err := New(Config{Defaults: Settings{FusionBytes: 1 << 20, CycleTime: 0}, Log: &buf, StepsPerSample: 2, WarmupSamples: 5})
	if err != nil {
		t.Fatal(err)
	}
	base := time.Unix(0, 0)
	at := func(ms int) time.Time { return base.Add(time.Duration(ms) * time.Millisecond) }
	for _, c := range []struct {
		step int64
		ms   int
	}{
		{1, 100}, {2, 200}, {2, 900}, {3, 300}, // sample 0: steps 2-3, 100 ms/step
		{4, 400}, {6, 600}, // a gap: no sample
		{7, 700}, {8, 800}, // sample 1: steps 7-8
		{9, 850}, {10, 10}, // the clock went back: no sample
		{11, 110}, {12, 210}, // sample 2
	} {
		if _, _, change := tu.Step(c.step, at(c.ms)); change {
			t.Fatal("a switch in warm-up")
		}
	}
	l, err := csvlog.Read(&buf)
	if err != nil {
		t.Fatal(err)
	}
	var got []int64
	for _, row := range l.Rows {
		got = append(got, row.Step)
		if math.Abs(row.StepTime-0.1) > 1e-9 {
			t.Errorf("row %+v: step time %g, want 0.1", row, row.StepTime)
		}
	}
	if want := []int64{3, 8, 12}; !reflect.DeepEqual(got, want) {
		t.Errorf("samples end at steps %v, want %v", got, want)
	}
}

func TestBadConfig(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  Config
	}{
		{"negative warm-up", Config{WarmupSamples: -1}},
		{"negative steps per sample", Config{StepsPerSample: -10}},
		{"negative max samples", Config{MaxSamples: -1}},
		{"max samples 1", Config{MaxSamples: 1}},
		{"max samples 6", Config{MaxSamples: 6}},
		{"candidate pairs 2", Config{CandidatePairs: 2}},
		{"negative candidate pairs", Config{CandidatePairs: -1}},
		{"negative lag", Config{Lag: -2}},
		{"negative noise", Config{Noise: -0.1}},
		{"NaN noise", Config{Noise: math.NaN()}},
		{"negative fusion", Config{Defaults: Settings{FusionBytes: -1}}},
		{"negative cycle", Config{Defaults: Settings{CycleTime: -time.Millisecond}}},
	} {
		if _, err := New(tc.cfg); !errors.Is(err, ErrBadConfig) {
			t.Errorf("%s: New = %v, want ErrBadConfig", tc.name, err)
		}
	}
	for _, cfg := range []Config{
		{},
		{MaxSamples: 7, CandidatePairs: 3, StepsPerSample: 1, WarmupSamples: 1, Lag: 1},
		// Defaults outside the usual box widen it.
		{Defaults: Settings{FusionBytes: 1 << 30, CycleTime: time.Second}},
	} {
		if _, err := New(cfg); err != nil {
			t.Errorf("%+v: %v", cfg, err)
		}
	}
}

// fusionOptimum is a job whose step time is convex in log fusion bytes, least at fusion opt, rising
// by curve per squared doubling, plus the cycle time: an interior optimum no corner of the box sees.
func fusionOptimum(base float64, opt int64, curve float64) func(Settings, int64) float64 {
	return func(s Settings, _ int64) float64 {
		l := math.Log2(float64(s.FusionBytes+1<<20) / float64(opt+1<<20))
		return base*(1+curve*l*l) + s.CycleTime.Seconds()
	}
}

// largeFusionCost is a job whose cycle time adds itself to a step and whose fusion past 64 MiB costs
// perDoubling seconds per doubling: from defaults 1 MiB / 20 ms (70 ms), fusion 64 MiB or less at
// cycle 0 is best (50 ms, 1.4x), the far corner 256 MiB / 0 ms is 50 + 2 perDoubling ms.
func largeFusionCost(perDoubling float64) func(Settings, int64) float64 {
	return func(s Settings, _ int64) float64 {
		return 0.05 + s.CycleTime.Seconds() + perDoubling*math.Max(0, math.Log2(float64(s.FusionBytes)/float64(64<<20)))
	}
}

// bestOnGrid is the least mean step time over the tuner's box on a grid of gridSize values per
// knob (fusion in log bytes, cycle time linear) and the powers of two from 1 to 256 MiB at cycles
// 0, 1, 2, 5, 10 and 20 ms: the exhaustive search the tuner is measured against.
func bestOnGrid(defaults Settings, mean func(Settings, int64) float64) float64 {
	best := math.Inf(1)
	for _, x := range newSpace(defaults, MaxCycleTime).grid(gridSize) {
		best = math.Min(best, mean(newSpace(defaults, MaxCycleTime).settings(x), 0))
	}
	for f := int64(1 << 20); f <= MaxFusionBytes; f *= 2 {
		for _, ms := range []time.Duration{0, 1, 2, 5, 10, 20} {
			best = math.Min(best, mean(Settings{FusionBytes: f, CycleTime: ms * time.Millisecond}, 0))
		}
	}
	return best
}

// TestFindsBestPoint: a candidate shown faster does not end the search; the tuner chooses, within
// 300 steps at 10 steps per sample and 3 warm-up samples, a point within 2% of the grid's best
// step time, where the first candidate is modest, worse than the defaults, or the optimum is inside
// the box.
func TestFindsBestPoint(t *testing.T) {
	bad := Settings{FusionBytes: 1 << 20, CycleTime: 20 * time.Millisecond}
	for _, tc := range []struct {
		name     string
		defaults Settings
		job      job
	}{
		// The far corner (256 MiB, 0 ms) is 66 ms, 1.06x the defaults: shown Better first.
		{"first candidate modest", bad, job{mean: largeFusionCost(0.008), jitter: 0.02}},
		// The far corner is 80 ms, slower than the defaults' 70.
		{"far corner worse", bad, job{mean: largeFusionCost(0.015), jitter: 0.02}},
		{"far corner worse, 5% jitter", bad, job{mean: largeFusionCost(0.015), jitter: 0.05}},
		{"fusion optimum 24 MiB", bad, job{mean: fusionOptimum(0.05, 24<<20, 0.02), jitter: 0.02}},
		{"fusion optimum 24 MiB, from 128 MiB / 0 ms", Settings{FusionBytes: 128 << 20, CycleTime: 0}, job{mean: fusionOptimum(0.05, 24<<20, 0.02), jitter: 0.02}},
		{"fusion optimum 16 MiB, 5% jitter", bad, job{mean: fusionOptimum(0.05, 16<<20, 0.03), jitter: 0.05}},
		{"fusion optimum 24 MiB, half the cycle time", bad, job{mean: func(s Settings, step int64) float64 {
			return fusionOptimum(0.05, 24<<20, 0.02)(s, step) - s.CycleTime.Seconds()/2
		}, jitter: 0.02}},
	} {
		best := bestOnGrid(tc.defaults, tc.job.mean)
		var at []int64
		for seed := uint64(1); seed <= 8; seed++ {
			r := simulate(t, Config{Defaults: tc.defaults, Seed: seed, WarmupSamples: 3, StepsPerSample: 10}, tc.job, seed, 1000)
			res := r.tuner.Result()
			if !res.Decided || res.KeptDefaults || !(res.Low > 1) {
				t.Fatalf("%s, seed %d: %v", tc.name, seed, res)
			}
			if got := tc.job.mean(res.Chosen, 0); got > 1.02*best {
				t.Errorf("%s, seed %d: chose %v, %.1f ms a step, the grid's best is %.1f ms (%.1f%% slower): %v",
					tc.name, seed, res.Chosen, 1e3*got, 1e3*best, 100*(got/best-1), res)
			}
			if res.DecidedAt > 300 {
				t.Errorf("%s, seed %d: decided at step %d, want <= 300", tc.name, seed, res.DecidedAt)
			}
			at = append(at, res.DecidedAt)
			if seed == 1 {
				t.Logf("%s: %v, %d candidates", tc.name, res, res.Candidates)
			}
		}
		t.Logf("%s: decided at steps %v", tc.name, at)
	}
}

// TestFalseCrownRate: on jobs the settings do not change, the run as a whole, every candidate it
// measures together, must crown one no more than 5% of the time. 100 seeds per job, deterministic.
func TestFalseCrownRate(t *testing.T) {
	drift := func(_ Settings, step int64) float64 { return 0.1 * (1 + 0.3*float64(step)/400) }
	for _, defaults := range []Settings{{FusionBytes: 64 << 20}, {FusionBytes: 1 << 20, CycleTime: 20 * time.Millisecond}} {
		for _, tc := range []struct {
			name string
			job  job
		}{
			{"2% jitter", job{mean: flat(0.1), jitter: 0.02}},
			{"5% jitter", job{mean: flat(0.1), jitter: 0.05}},
			{"drift, 2% jitter", job{mean: drift, jitter: 0.02}},
			{"drift, 5% jitter", job{mean: drift, jitter: 0.05}},
			// Fast steps, whose per-step jitter also abandons some candidates early, and slow
			// ones, whose samples sized by time are 5 steps.
			{"10 ms, 20% jitter", job{mean: flat(0.01), jitter: 0.2}},
			{"400 ms, 5% jitter", job{mean: flat(0.4), jitter: 0.05}},
			// Noise that differs between settings: the pooled spread (decide.Rule.Pooled) must
			// not lend a noisy candidate the defaults' narrower one.
			{"candidates 3x as noisy, 10% jitter", job{mean: flat(0.14), jitter: 0.1, noisier: noisierThan(defaults, 3)}},
			{"candidates 5x as noisy, 5% jitter", job{mean: flat(0.14), jitter: 0.05, noisier: noisierThan(defaults, 5)}},
		} {
			kept, candidates, last := 0, 0, int64(0)
			for seed := uint64(1); seed <= 100; seed++ {
				r := simulate(t, Config{Defaults: defaults, Seed: seed}, tc.job, 1000+seed, 2000)
				res := r.tuner.Result()
				if !res.Decided {
					t.Fatalf("%v, %s, seed %d: not decided: %v", defaults, tc.name, seed, res)
				}
				if res.KeptDefaults {
					kept++
				}
				candidates += res.Candidates
				last = max(last, res.DecidedAt)
			}
			if kept < 95 {
				t.Errorf("%v, %s: kept the defaults in %d of 100 runs, want >= 95", defaults, tc.name, kept)
			}
			t.Logf("%v, %s: kept the defaults in %d of 100 runs, %.1f candidates a run, decided by step %d",
				defaults, tc.name, kept, float64(candidates)/100, last)
		}
	}
}

// noisierThan makes every setting but defaults k times as noisy.
func noisierThan(defaults Settings, k float64) func(Settings) float64 {
	return func(s Settings) float64 {
		if s == defaults {
			return 1
		}
		return k
	}
}

// TestPooledSpreadRaisesPower: started from bad settings (fusion 1 MiB, cycle 20 ms) on a 140 ms
// step whose samples are as noisy as a shared 2-core VM's (10% jitter a step), with a real 10% gain for any
// cycle under 8 ms, the tuner crowns a winning candidate in most runs. Judged on each candidate's
// own 3-5 pairs, whose t quantile with 2-4 degrees of freedom sets most of the interval's width,
// it did in 45 of 100; with the run's pooled spread (decide.Rule.Pooled), 74.
func TestPooledSpreadRaisesPower(t *testing.T) {
	bad := Settings{FusionBytes: 1 << 20, CycleTime: 20 * time.Millisecond}
	gain := func(s Settings, _ int64) float64 {
		if s.CycleTime < 8*time.Millisecond {
			return 0.14 / 1.10
		}
		return 0.14
	}
	crowned := 0
	for seed := uint64(1); seed <= 100; seed++ {
		r := simulate(t, Config{Defaults: bad, Seed: seed}, job{mean: gain, jitter: 0.1}, 5000+seed, 2000)
		res := r.tuner.Result()
		if !res.KeptDefaults {
			if gain(res.Chosen, 0) == 0.14 {
				t.Errorf("seed %d crowned a candidate no faster than the defaults: %v", seed, res)
			}
			crowned++
		}
	}
	if crowned < 60 {
		t.Errorf("a real 10%% gain crowned in %d of 100 runs, want >= 60", crowned)
	}
	t.Logf("a real 10%% gain crowned in %d of 100 runs", crowned)
}

func TestCandidateConfidence(t *testing.T) {
	for _, tc := range []struct {
		maxSamples int
		want       float64
	}{
		{7, 0.95}, {12, 0.95}, {13, 0.975}, {20, 1 - 0.05/3}, {61, 1 - 0.05/10},
	} {
		cfg, err := Config{MaxSamples: tc.maxSamples}.withDefaults()
		if err != nil {
			t.Fatal(err)
		}
		if got := candidateConfidence(cfg); math.Abs(got-tc.want) > 1e-12 {
			t.Errorf("max samples %d: confidence %g, want %g", tc.maxSamples, got, tc.want)
		}
	}
}

// overhead is what tuning cost the job up to its decision: its time for steps 1 to DecidedAt over
// the same steps at the defaults' mean step time, less 1.
func (r *run) overhead(j job) float64 {
	at := r.tuner.Result().DecidedAt
	var got, want float64
	for step := int64(1); step <= at; step++ {
		got += r.secs[step]
		want += j.mean(r.cfg.Defaults, step)
	}
	return got/want - 1
}

// fastStep is a cnn:16-like job: a 10 ms step at kolo's defaults, which every millisecond of cycle
// time lengthens by a millisecond, and which runs 30% slower without fusion and 5% faster at a
// fusion threshold of 4-32 MiB.
func fastStep(s Settings, _ int64) float64 {
	t := 0.010
	switch {
	case s.FusionBytes < 1<<20:
		t *= 1.3
	case s.FusionBytes >= 4<<20 && s.FusionBytes <= 32<<20:
		t *= 0.95
	}
	return t + s.CycleTime.Seconds()
}

// TestFastStepOverhead: on a 10 ms step, where a 25 ms cycle time would run each step 3.5 times as
// long, tuning costs the job under 5% of its time up to the decision, which comes within 300 steps;
// no candidate has a cycle time over half a step; a candidate far slower is abandoned within its
// first steps.
func TestFastStepOverhead(t *testing.T) {
	defaults := Settings{FusionBytes: 128 << 20, CycleTime: 0}
	for _, jitter := range []float64{0.05, 0.15} {
		j := job{mean: fastStep, jitter: jitter, sleepsOut: true}
		var overheads []float64
		abandoned := 0
		for seed := uint64(1); seed <= 20; seed++ {
			r := simulate(t, Config{Defaults: defaults, Seed: seed}, j, seed, 2000)
			res := r.tuner.Result()
			if !res.Decided || res.DecidedAt > 300 {
				t.Fatalf("jitter %g, seed %d: %v", jitter, seed, res)
			}
			if !res.KeptDefaults && fastStep(res.Chosen, 0) > fastStep(defaults, 0) {
				t.Errorf("jitter %g, seed %d: chose a slower point: %v", jitter, seed, res)
			}
			for _, sw := range r.switches {
				if sw.s.CycleTime > 6*time.Millisecond { // half a step as the last warm-up sample measured it
					t.Errorf("jitter %g, seed %d: tried %v, a cycle over half the 10 ms step", jitter, seed, sw.s)
				}
			}
			for _, row := range readLog(t, r).Rows {
				if row.Settings[ColumnPhase] != PhaseAbandoned {
					continue
				}
				abandoned++
				if row.Settings[ColumnSteps] != "2" && row.Settings[ColumnSteps] != "3" {
					t.Errorf("jitter %g, seed %d: abandoned after %s steps, want 2 or 3", jitter, seed, row.Settings[ColumnSteps])
				}
			}
			overheads = append(overheads, r.overhead(j))
			if seed == 1 {
				t.Logf("jitter %g: %v (%d candidates)", jitter, res, res.Candidates)
			}
		}
		slices.Sort(overheads)
		med := overheads[len(overheads)/2]
		t.Logf("jitter %g: overhead median %.3f, range %.3f-%.3f; %d samples abandoned in 20 runs", jitter, med, overheads[0], overheads[len(overheads)-1], abandoned)
		if med > 0.05 || overheads[len(overheads)-1] > 0.08 {
			t.Errorf("jitter %g: overhead median %.3f, max %.3f: want under 0.05 and 0.08", jitter, med, overheads[len(overheads)-1])
		}
		if abandoned == 0 {
			t.Errorf("jitter %g: no candidate abandoned early", jitter)
		}
	}
}

// TestSampleSize: samples sized by time last 1 s and at least 5 steps, at most 10 (what decides
// within 300 steps); an explicit StepsPerSample is every sample's length, as in Horovod.
func TestSampleSize(t *testing.T) {
	if got := maxSampleSteps(t, Config{}); got != 10 {
		t.Errorf("maxSampleSteps at the defaults %d, want 10", got)
	}
	if got := maxSampleSteps(t, Config{StepBudget: 600}); got != 23 {
		t.Errorf("maxSampleSteps with a budget of 600 steps %d, want 23", got)
	}
	for _, tc := range []struct {
		name  string
		cfg   Config
		secs  float64
		steps int
	}{
		{"10 ms", Config{}, 0.010, 10},
		{"150 ms", Config{}, 0.150, 7},
		{"400 ms", Config{}, 0.400, 5},
		{"2 s", Config{}, 2, 5},
		{"10 ms, 4 steps asked", Config{StepsPerSample: 4}, 0.010, 4},
		{"400 ms, 10 steps asked", Config{StepsPerSample: 10}, 0.400, 10},
		{"50 ms, 0.5 s", Config{SampleTime: 500 * time.Millisecond, MinSampleSteps: 2}, 0.050, 10},
		{"400 ms, 0.5 s", Config{SampleTime: 500 * time.Millisecond, MinSampleSteps: 2}, 0.400, 2},
	} {
		cfg := tc.cfg
		cfg.Defaults = Settings{FusionBytes: 64 << 20}
		r := simulate(t, cfg, job{mean: flat(tc.secs)}, 1, 2000)
		res := r.tuner.Result()
		if !res.Decided || res.DecidedAt > 300 {
			t.Errorf("%s: %v", tc.name, res)
		}
		for _, row := range readLog(t, r).Rows {
			if row.Role != csvlog.Chosen && row.Settings[ColumnSteps] != strconv.Itoa(tc.steps) {
				t.Errorf("%s: sample %d measured %s steps, want %d", tc.name, row.Sample, row.Settings[ColumnSteps], tc.steps)
				break
			}
		}
	}
}

// collectiveJob is a job that gains from a larger shared-memory round up to the slot (8 MiB; each
// halving below costs perHalving of the step, as with 4 ranks on 2 cores, where whole-slot
// rounds measured fastest) and from the flat allreduce (hierarchical on costs hier seconds a
// step), and loses the cycle time; fusion and the small-allreduce threshold do not matter.
func collectiveJob(base, perHalving, hier float64) func(Settings, int64) float64 {
	return func(s Settings, _ int64) float64 {
		l := math.Max(0, math.Log2(float64(8<<20)/float64(s.SharedRoundBytes)))
		t := base*(1+perHalving*l) + s.CycleTime.Seconds()
		if s.Hierarchical == On {
			t += hier
		}
		return t
	}
}

// findsWithin2Percent tunes a job of step time mean from defaults with 8 seeds (2% jitter, 10-step
// samples) and checks that every run crowns a candidate, within 2% of best's step time, by step 300.
func findsWithin2Percent(t *testing.T, defaults Settings, mean func(Settings, int64) float64, best float64) {
	t.Helper()
	for seed := uint64(1); seed <= 8; seed++ {
		r := simulate(t, Config{Defaults: defaults, Seed: seed, WarmupSamples: 3, StepsPerSample: 10}, job{mean: mean, jitter: 0.02}, seed, 1000)
		res := r.tuner.Result()
		if !res.Decided || res.KeptDefaults || !(res.Low > 1) {
			t.Fatalf("seed %d: %v", seed, res)
		}
		if got := mean(res.Chosen, 0); got > 1.02*best {
			t.Errorf("seed %d: chose %v, %.1f ms a step, the best is %.1f ms (%.1f%% slower)", seed, res.Chosen, 1e3*got, 1e3*best, 100*(got/best-1))
		}
		if res.DecidedAt > 300 {
			t.Errorf("seed %d: decided at step %d, want <= 300", seed, res.DecidedAt)
		}
		if seed == 1 {
			t.Logf("%v, %d candidates", res, res.Candidates)
		}
	}
}

// TestTunesCollectiveKnobs: the collective knobs the defaults set are searched with fusion and the
// cycle time, and the knobs they leave unset stay unset in every setting the tuner runs.
func TestTunesCollectiveKnobs(t *testing.T) {
	defaults := Settings{FusionBytes: 128 << 20, SmallAllreduceBytes: 64 << 10, SharedRoundBytes: 1 << 20, Hierarchical: On, SpinTime: 50 * time.Microsecond}
	mean := collectiveJob(0.05, 0.04, 0.004)
	// The box's best: rounds of 8 MiB or more, flat, cycle 0: 50 ms against the defaults' 60 ms.
	best := mean(Settings{SharedRoundBytes: 8 << 20, Hierarchical: Off}, 0)
	findsWithin2Percent(t, defaults, mean, best)
	// Fusion and cycle only: the collective knobs stay the job's own in every setting run.
	r := simulate(t, Config{Defaults: Settings{FusionBytes: 1 << 20, CycleTime: 20 * time.Millisecond}, Seed: 3}, job{mean: cycleCost(0.05, 1), jitter: 0.02}, 3, 1000)
	for step, s := range r.inForce {
		if s.SmallAllreduceBytes != 0 || s.SharedRoundBytes != 0 || s.Hierarchical != Unset || s.SpinTime != 0 || s.ResponseCache != Unset {
			t.Fatalf("step %d ran %v: a knob the defaults leave unset was tuned", step, s)
		}
	}
	if res := r.tuner.Result(); !res.Decided || res.Chosen.CycleTime != 0 && res.KeptDefaults {
		t.Errorf("fusion and cycle only: %v", res)
	}
}

// spinJob is a job whose waits spin past a peer's usual lateness (enough) only to take the core
// from its own compute threads: every doubling of the spin beyond enough costs perDoubling of the
// step; shorter spins cost nothing (a wake-up per wait is lost in a step of milliseconds).
func spinJob(base, perDoubling float64, enough time.Duration) func(Settings, int64) float64 {
	return func(s Settings, _ int64) float64 {
		t := base + s.CycleTime.Seconds()
		if s.SpinTime > enough {
			t += base * perDoubling * math.Log2(float64(s.SpinTime)/float64(enough))
		}
		return t
	}
}

// TestTunesSpin: where the defaults set a spin time it is searched with the other knobs, and a job
// that loses by spinning gets a shorter spin; a job indifferent to it keeps the defaults' (no knob
// moves without evidence).
func TestTunesSpin(t *testing.T) {
	defaults := Settings{FusionBytes: 128 << 20, SmallAllreduceBytes: 64 << 10, SpinTime: 50 * time.Microsecond}
	// The defaults' 50 us is 3.3 doublings past the 5 us that suffice: 13% slower.
	mean := spinJob(0.05, 0.04, 5*time.Microsecond)
	best := mean(Settings{SpinTime: time.Microsecond}, 0)
	findsWithin2Percent(t, defaults, mean, best)
	// Spin does not matter, nor does anything else but a longer cycle: the defaults stay.
	flat := cycleCost(0.05, 1)
	for seed := uint64(1); seed <= 8; seed++ {
		r := simulate(t, Config{Defaults: defaults, Seed: seed}, job{mean: flat, jitter: 0.02}, seed, 1000)
		if res := r.tuner.Result(); !res.Decided || !res.KeptDefaults && flat(res.Chosen, 0) > flat(defaults, 0) {
			t.Errorf("seed %d, spin without effect: %v", seed, res)
		}
	}
}

// TestTunesResponseCache: where the defaults have the response cache on it is searched with the
// other knobs; a job that pays for the cache (a coordinator's lookups it never gains from) gets it
// off, and one that gains from it (its many small ops sent as ids) keeps it on.
func TestTunesResponseCache(t *testing.T) {
	defaults := Settings{FusionBytes: 128 << 20, SmallAllreduceBytes: 64 << 10, ResponseCache: On}
	cacheCost := func(cost float64) func(Settings, int64) float64 {
		return func(s Settings, _ int64) float64 {
			t := 0.05 + s.CycleTime.Seconds()
			if s.ResponseCache == On {
				t += cost
			}
			return t
		}
	}
	// The cache costs 12% of the step.
	mean := cacheCost(0.006)
	findsWithin2Percent(t, defaults, mean, mean(Settings{ResponseCache: Off}, 0))
	for _, seed := range []uint64{1, 2, 3} {
		r := simulate(t, Config{Defaults: defaults, Seed: seed, WarmupSamples: 3, StepsPerSample: 10}, job{mean: mean, jitter: 0.02}, seed, 1000)
		if res := r.tuner.Result(); res.Chosen.ResponseCache != Off {
			t.Errorf("seed %d, the cache costing 12%%: %v", seed, res)
		}
	}
	// The cache saves 12% of the step: whatever is chosen keeps it on.
	gain := cacheCost(-0.006)
	for seed := uint64(1); seed <= 8; seed++ {
		r := simulate(t, Config{Defaults: defaults, Seed: seed}, job{mean: gain, jitter: 0.02}, seed, 1000)
		if res := r.tuner.Result(); !res.Decided || res.Chosen.ResponseCache != On {
			t.Errorf("seed %d, the cache saving 12%%: %v", seed, res)
		}
	}
}

// TestFindsItsWayBackFromBadSettings: a job started with a fusion threshold and a cycle time that
// cost it 18% (1 MiB and 20 ms, kolo's own being 128 MiB and 0) gets kolo's back, or as good, in
// every run, whatever collective knobs the defaults also set: kolo's own fusion threshold and
// cycle time are the first candidate.
func TestFindsItsWayBackFromBadSettings(t *testing.T) {
	builtin := Settings{FusionBytes: 128 << 20}
	bad := Settings{FusionBytes: 1 << 20, CycleTime: 20 * time.Millisecond, SmallAllreduceBytes: 64 << 10, ResponseCache: On}
	mean := func(s Settings, _ int64) float64 {
		t := 0.1 + s.CycleTime.Seconds()/2
		if s.FusionBytes < 8<<20 {
			t += 0.008 // many small fused buffers
		}
		return t
	}
	best := mean(builtin, 0)
	for seed := uint64(1); seed <= 8; seed++ {
		r := simulate(t, Config{Defaults: bad, Builtin: builtin, Seed: seed, WarmupSamples: 3, StepsPerSample: 10}, job{mean: mean, jitter: 0.02}, seed, 1000)
		res := r.tuner.Result()
		if !res.Decided || res.KeptDefaults {
			t.Fatalf("seed %d: %v", seed, res)
		}
		if got := mean(res.Chosen, 0); got > 1.02*best {
			t.Errorf("seed %d: chose %v, %.1f ms a step; kolo's own settings take %.1f ms", seed, res.Chosen, 1e3*got, 1e3*best)
		}
		first := bad
		first.FusionBytes, first.CycleTime = builtin.FusionBytes, builtin.CycleTime
		for _, s := range r.inForce[1:] {
			if s != bad {
				if s != first {
					t.Errorf("seed %d: the first candidate was %v, want the job's settings with kolo's fusion and cycle (%v)", seed, s, first)
				}
				break
			}
		}
		if res.DecidedAt > 300 {
			t.Errorf("seed %d: decided at step %d, want <= 300", seed, res.DecidedAt)
		}
		if seed == 1 {
			t.Logf("%v, %d candidates", res, res.Candidates)
		}
	}
}

// maxSampleSteps is cfg's, its defaults filled in.
func maxSampleSteps(t *testing.T, cfg Config) int {
	t.Helper()
	c, err := cfg.withDefaults()
	if err != nil {
		t.Fatal(err)
	}
	return c.maxSampleSteps()
}
