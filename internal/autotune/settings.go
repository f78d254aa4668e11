package autotune

import (
	"fmt"
	"math"
	"strconv"
	"time"

	"github.com/kolo-dl/kolo/internal/autotune/bayes"
)

// Settings are the knobs the tuner turns: the ones every rank must agree on at every step.
//
// FusionBytes and CycleTime are always tuned. The collective knobs after them are tuned when the
// defaults set them (the engine sets those that can matter in its world: a shared-memory round
// size only where ranks share memory and each has a CPU, hierarchical allreduce only across hosts
// that run several ranks each); their zero value means "not tuned: the job's own setting".
type Settings struct {
	FusionBytes int64         // fusion threshold in bytes (0: no fusion)
	CycleTime   time.Duration // negotiation cycle time (0: negotiate at once)

	// SmallAllreduceBytes: allreduces shorter than this use recursive doubling, longer ones the
	// shared-memory slots or the ring (collective.Tuning).
	SmallAllreduceBytes int64
	// SharedRoundBytes: what the shared-memory collectives move per rank per round of barriers.
	SharedRoundBytes int64
	// Hierarchical: the two-level allreduce across hosts.
	Hierarchical Switch
	// SpinTime: how long a rank's waits (the engine's and shared memory's) poll before they sleep.
	// Unlike the collective knobs it is each rank's own business, so it comes into force by step
	// number, like the fusion threshold. Tuned only where every local rank has a CPU: with more
	// ranks than CPUs a polling rank steals the core the awaited one needs (internal/spin), and
	// the default there is not to poll.
	SpinTime time.Duration
	// ResponseCache: whether the coordinator gives ops cache ids, so that ranks send a known op as
	// an id. Horovod's autotuner tunes it too: with few, large ops the cache saves little, and each
	// op's id costs the coordinator a lookup. Switched on rank 0 only, at its step: the other ranks follow the
	// evictions in the response stream.
	ResponseCache Switch
}

// Switch is an on/off knob that may be left to the job.
type Switch uint8

const (
	Unset Switch = iota // not tuned: the job's own setting
	Off
	On
)

// SwitchOf is On for true, Off for false.
func SwitchOf(on bool) Switch {
	if on {
		return On
	}
	return Off
}

func (s Switch) String() string {
	switch s {
	case Off:
		return "off"
	case On:
		return "on"
	}
	return ""
}

const (
	kib = 1 << 10
	mib = 1 << 20

	// MaxFusionBytes and MaxCycleTime bound the search box (widened to the defaults if they lie
	// beyond). Horovod searches cycle times of 1-100 ms, which leaves out its own 1 ms default and
	// kolo's 0; kolo's box starts at 0 so that it holds the defaults, and ends at 25 ms because a
	// longer cycle only adds latency to every step's negotiation. A job whose step is short gets a
	// shorter box: cycle times up to half its step time (cycleCap).
	MaxFusionBytes = 256 * mib
	MaxCycleTime   = 25 * time.Millisecond

	// fusionLogOffset makes the fusion dimension log(bytes + 1 MiB): ratios count from 1 MiB up
	// (1 to 2 MiB is as far as 64 to 128), and everything below 1 MiB, fusion off included, is one
	// step of that size, since thresholds that small fuse little.
	fusionLogOffset = mib
)

// Column names of the settings in the CSV log, and of the map ParseSettings reads.
const (
	ColumnFusionBytes    = "fusion_bytes"
	ColumnCycleMs        = "cycle_ms"
	ColumnSmallAllreduce = "small_allreduce_bytes"
	ColumnSharedRound    = "shared_round_bytes"
	ColumnHierarchical   = "hierarchical"
	ColumnSpinUs         = "spin_us"
	ColumnResponseCache  = "response_cache"
	// ColumnPhase is not a setting: it marks warm-up rows ("warmup"), which the decision ignores,
	// apart from the measured ones ("tuning"), a candidate's sample cut short because its first
	// steps were far slower than the defaults' ("abandoned"), and the decision ("decided").
	// csvlog's roles say which settings a row ran (default or candidate), not whether it counted.
	ColumnPhase = "phase"
	// ColumnSteps is not a setting either: the steps a sample measured (empty in the decision's
	// row).
	ColumnSteps = "steps"
)

// Values of ColumnPhase.
const (
	PhaseWarmup    = "warmup"
	PhaseTuning    = "tuning"
	PhaseAbandoned = "abandoned"
	PhaseDecided   = "decided"
)

// String reads like "fusion 32 MiB, cycle 0 ms", followed by the other knobs that are set:
// ", small allreduce 64 KiB, shm round 1 MiB, hierarchical off, spin 50 us, response cache on".
func (s Settings) String() string {
	out := "fusion " + formatBytes(s.FusionBytes) + ", cycle " + round2(float64(s.CycleTime)/float64(time.Millisecond)) + " ms"
	if s.SmallAllreduceBytes != 0 {
		out += ", small allreduce " + formatBytes(s.SmallAllreduceBytes)
	}
	if s.SharedRoundBytes != 0 {
		out += ", shm round " + formatBytes(s.SharedRoundBytes)
	}
	if s.Hierarchical != Unset {
		out += ", hierarchical " + s.Hierarchical.String()
	}
	if s.SpinTime != 0 {
		out += ", spin " + round2(float64(s.SpinTime)/float64(time.Microsecond)) + " us"
	}
	if s.ResponseCache != Unset {
		out += ", response cache " + s.ResponseCache.String()
	}
	return out
}

func formatBytes(b int64) string {
	switch {
	case b == 0:
		return "off"
	case b >= mib || b <= -mib:
		return round2(float64(b)/mib) + " MiB"
	case b >= kib || b <= -kib:
		return round2(float64(b)/kib) + " KiB"
	}
	return strconv.FormatInt(b, 10) + " B"
}

// round2 prints v with at most two decimals and no trailing zeros.
func round2(v float64) string {
	return strconv.FormatFloat(math.Round(v*100)/100, 'f', -1, 64)
}

// columns are the log's columns (logColumns) of a row of settings s in phase, measuring n steps (0:
// none, the decision's row), in the tuner's world.
func (t *Tuner) columns(s Settings, phase string, n int64) map[string]string {
	w := t.cfg.World
	return map[string]string{
		ColumnFusionBytes:    strconv.FormatInt(s.FusionBytes, 10),
		ColumnCycleMs:        strconv.FormatFloat(float64(s.CycleTime)/float64(time.Millisecond), 'f', -1, 64),
		ColumnSmallAllreduce: optionalInt(s.SmallAllreduceBytes),
		ColumnSharedRound:    optionalInt(s.SharedRoundBytes),
		ColumnHierarchical:   s.Hierarchical.String(),
		ColumnSpinUs:         optionalMicros(s.SpinTime),
		ColumnResponseCache:  s.ResponseCache.String(),
		ColumnPhase:          phase,
		ColumnSteps:          optionalInt(n),
		ColumnRound:          strconv.Itoa(w.Round),
		ColumnRanks:          strconv.Itoa(w.Ranks),
		ColumnHosts:          strconv.Itoa(w.Hosts),
	}
}

// optionalInt is b as a column: empty when 0 (a knob not tuned, the decision's steps).
func optionalInt(b int64) string {
	if b == 0 {
		return ""
	}
	return strconv.FormatInt(b, 10)
}

// optionalMicros is d in microseconds as a column: empty when 0 (not tuned).
func optionalMicros(d time.Duration) string {
	if d == 0 {
		return ""
	}
	return strconv.FormatFloat(float64(d)/float64(time.Microsecond), 'f', -1, 64)
}

// logColumns are the tuner's columns of the log: the settings, the row's phase and steps, and the
// world it ran in (world.go).
var logColumns = []string{ColumnFusionBytes, ColumnCycleMs, ColumnSmallAllreduce, ColumnSharedRound, ColumnHierarchical, ColumnSpinUs, ColumnResponseCache, ColumnPhase, ColumnSteps, ColumnRound, ColumnRanks, ColumnHosts}

// ParseSettings reads settings from a log row's columns, so that a later run can start with an
// earlier run's decision (DecisionFor). Columns it does not know are ignored; the collective knobs'
// columns may be empty or absent (not tuned, or a log of an older kolo).
func ParseSettings(cols map[string]string) (Settings, error) {
	var s Settings
	f, ok := cols[ColumnFusionBytes]
	if !ok {
		return s, fmt.Errorf("autotune: settings have no %s column", ColumnFusionBytes)
	}
	var err error
	if s.FusionBytes, err = strconv.ParseInt(f, 10, 64); err != nil || s.FusionBytes < 0 {
		return Settings{}, fmt.Errorf("autotune: %s %q: want a whole number of bytes >= 0", ColumnFusionBytes, f)
	}
	c, ok := cols[ColumnCycleMs]
	if !ok {
		return Settings{}, fmt.Errorf("autotune: settings have no %s column", ColumnCycleMs)
	}
	ms, err := strconv.ParseFloat(c, 64)
	if err != nil || !(ms >= 0) || ms > float64(math.MaxInt64/int64(time.Millisecond)) {
		return Settings{}, fmt.Errorf("autotune: %s %q: want a number of milliseconds >= 0", ColumnCycleMs, c)
	}
	s.CycleTime = time.Duration(math.Round(ms * float64(time.Millisecond)))
	for _, b := range []struct {
		col string
		dst *int64
	}{{ColumnSmallAllreduce, &s.SmallAllreduceBytes}, {ColumnSharedRound, &s.SharedRoundBytes}} {
		v := cols[b.col]
		if v == "" {
			continue
		}
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n <= 0 {
			return Settings{}, fmt.Errorf("autotune: %s %q: want a whole number of bytes > 0, or nothing", b.col, v)
		}
		*b.dst = n
	}
	for _, b := range []struct {
		col string
		dst *Switch
	}{{ColumnHierarchical, &s.Hierarchical}, {ColumnResponseCache, &s.ResponseCache}} {
		switch v := cols[b.col]; v {
		case "":
		case "on":
			*b.dst = On
		case "off":
			*b.dst = Off
		default:
			return Settings{}, fmt.Errorf("autotune: %s %q: want on, off or nothing", b.col, v)
		}
	}
	if v := cols[ColumnSpinUs]; v != "" {
		us, err := strconv.ParseFloat(v, 64)
		if err != nil || !(us > 0) || us > float64(time.Hour/time.Microsecond) {
			return Settings{}, fmt.Errorf("autotune: %s %q: want a number of microseconds > 0 (at most an hour), or nothing", ColumnSpinUs, v)
		}
		s.SpinTime = max(time.Nanosecond, time.Duration(math.Round(us*float64(time.Microsecond))))
	}
	return s, nil
}

// The collective knobs' ranges. Recursive doubling below 1 KiB or above 4 MiB is never the better
// choice (at 4 MiB the ring and the slots move a fraction of the bytes). A shared-memory round of
// less than 128 KiB costs more in barriers than it gains in cache; one as large as the slot (8 MiB
// by default) moves a slot, and the box reaches 16 MiB so that kolo's 1 MiB default lies below its
// middle: with 4 ranks, rounds of a whole slot measured faster (collective.DefaultSharedRoundBytes).
const (
	MinSmallAllreduceBytes = 1 * kib
	MaxSmallAllreduceBytes = 4 * mib
	MinSharedRoundBytes    = 128 * kib
	MaxSharedRoundBytes    = 16 * mib
)

// The spin time's range, log-scaled. 1 us is about one poll before a wait sleeps: not spinning,
// in effect, but a value that cannot be mistaken for "not tuned". 2 ms outlasts most of a
// collective's waits between two running ranks. kolo's 50 us default lies just above the middle
// (45 us), so the initial design's far corner barely spins: the safer side, since a long spin
// takes the core from the job's own compute threads when its ranks fill the host's cores (cnn:16
// with 2 ranks on a host with 2 cores, `bench/autotune.py --jobs cnn:16 --fusion-mib 128
// --cycle-ms 0 --spin-us 1,50,500,4000 --grid-repeats 2 --tuned-repeats 0`: 41 and 58 steps/s
// spinning 4 ms against 55 and 60 at 50 us), while a short one costs at most a wake-up per wait.
const (
	MinSpinTime = time.Microsecond
	MaxSpinTime = 2 * time.Millisecond
)

// space is the search box of a tuner: fusion bytes (log-scaled) and cycle time in milliseconds,
// then the collective knobs its defaults set, in Settings' order: the small-allreduce threshold
// and the shared-memory round (log-scaled bytes), hierarchical allreduce (0 off, 1 on), the spin
// time (log-scaled microseconds), and the response cache (0 off, 1 on).
type space struct {
	dims     []bayes.Dim
	defaults Settings // the knobs not searched keep these values
}

// newSpace is the box from no fusion and cycle 0 to MaxFusionBytes and maxCycle, and over the
// collective knobs' ranges, widened to hold the defaults.
func newSpace(defaults Settings, maxCycle time.Duration) space {
	maxFusion := max(int64(MaxFusionBytes), defaults.FusionBytes)
	maxCycle = max(maxCycle, defaults.CycleTime)
	dims := []bayes.Dim{
		bayes.Int(ColumnFusionBytes, 0, maxFusion).LogScale(fusionLogOffset),
		bayes.Real(ColumnCycleMs, 0, float64(maxCycle)/float64(time.Millisecond)),
	}
	if b := defaults.SmallAllreduceBytes; b != 0 {
		dims = append(dims, bayes.Int(ColumnSmallAllreduce, min(MinSmallAllreduceBytes, b), max(MaxSmallAllreduceBytes, b)).LogScale(0))
	}
	if b := defaults.SharedRoundBytes; b != 0 {
		dims = append(dims, bayes.Int(ColumnSharedRound, min(MinSharedRoundBytes, b), max(MaxSharedRoundBytes, b)).LogScale(0))
	}
	if defaults.Hierarchical != Unset {
		dims = append(dims, bayes.Int(ColumnHierarchical, 0, 1))
	}
	if d := defaults.SpinTime; d != 0 {
		us := float64(d) / float64(time.Microsecond)
		dims = append(dims, bayes.Real(ColumnSpinUs, math.Min(float64(MinSpinTime/time.Microsecond), us),
			math.Max(float64(MaxSpinTime/time.Microsecond), us)).LogScale(0))
	}
	if defaults.ResponseCache != Unset {
		dims = append(dims, bayes.Int(ColumnResponseCache, 0, 1))
	}
	return space{dims: dims, defaults: defaults}
}

// cycleCap is the longest cycle time worth trying in a job whose defaults take stepSecs a step: half
// a step, at most MaxCycleTime. A negotiation cycle delays the ops of every step by up to its length,
// so a cycle of half a step already costs about a quarter to a half of the step, which no saving in
// negotiation (microseconds an op) pays back; and on a 10 ms step a 25 ms candidate runs each of its
// steps 3.5 times as long. Rounded to a microsecond, at least 1 ms.
func cycleCap(stepSecs float64) time.Duration {
	c := time.Duration(stepSecs / 2 * float64(time.Second)).Round(time.Microsecond)
	return max(time.Millisecond, min(MaxCycleTime, c))
}

// point is s as the optimiser sees it.
func (sp space) point(s Settings) []float64 {
	x := make([]float64, len(sp.dims))
	for i, d := range sp.dims {
		switch d.Name {
		case ColumnFusionBytes:
			x[i] = float64(s.FusionBytes)
		case ColumnCycleMs:
			x[i] = float64(s.CycleTime) / float64(time.Millisecond)
		case ColumnSmallAllreduce:
			x[i] = float64(s.SmallAllreduceBytes)
		case ColumnSharedRound:
			x[i] = float64(s.SharedRoundBytes)
		case ColumnHierarchical:
			if s.Hierarchical == On {
				x[i] = 1
			}
		case ColumnSpinUs:
			x[i] = float64(s.SpinTime) / float64(time.Microsecond)
		case ColumnResponseCache:
			if s.ResponseCache == On {
				x[i] = 1
			}
		}
	}
	return x
}

// settings is the point x, the cycle time rounded to a microsecond (finer means nothing to a
// background loop's sleep), byte sizes to whole elements of 8 bytes (so that every dtype's
// elements fit a round whole), hierarchical to on or off; knobs not searched keep the defaults'.
func (sp space) settings(x []float64) Settings {
	s := sp.defaults
	for i, d := range sp.dims {
		switch d.Name {
		case ColumnFusionBytes:
			s.FusionBytes = int64(math.Round(x[i]))
		case ColumnCycleMs:
			s.CycleTime = time.Duration(math.Round(x[i]*1e3)) * time.Microsecond
		case ColumnSmallAllreduce:
			s.SmallAllreduceBytes = max(8, int64(math.Round(x[i]/8))*8)
		case ColumnSharedRound:
			s.SharedRoundBytes = max(8, int64(math.Round(x[i]/8))*8)
		case ColumnHierarchical:
			s.Hierarchical = SwitchOf(x[i] >= 0.5)
		case ColumnSpinUs:
			s.SpinTime = max(time.Nanosecond, time.Duration(math.Round(x[i]*10))*100*time.Nanosecond) // to 0.1 us
		case ColumnResponseCache:
			s.ResponseCache = SwitchOf(x[i] >= 0.5)
		}
	}
	return s
}

// middle is the value in the middle of dimension i, in the coordinates distance measures.
func (sp space) middle(i int) float64 {
	d := sp.dims[i]
	if d.Log {
		return math.Sqrt((d.Min+d.LogOffset)*(d.Max+d.LogOffset)) - d.LogOffset
	}
	return (d.Min + d.Max) / 2
}

// distance is the Euclidean distance of two points in the unit box.
func (sp space) distance(a, b []float64) float64 {
	var s float64
	for i, d := range sp.dims {
		diff := d.Unit(a[i]) - d.Unit(b[i])
		s += diff * diff
	}
	return math.Sqrt(s)
}

// grid is n evenly spaced values (in unit coordinates) along every dimension, all combinations.
func (sp space) grid(n int) [][]float64 {
	var out [][]float64
	var rec func(prefix []float64)
	rec = func(prefix []float64) {
		i := len(prefix)
		if i == len(sp.dims) {
			out = append(out, sp.point(sp.settings(prefix)))
			return
		}
		d := sp.dims[i]
		for k := range n {
			u := float64(k) / float64(n-1)
			v := d.Min
			if d.Log {
				lo, hi := math.Log(d.Min+d.LogOffset), math.Log(d.Max+d.LogOffset)
				v = math.Exp(lo+u*(hi-lo)) - d.LogOffset
			} else {
				v += u * (d.Max - d.Min)
			}
			rec(append(prefix[:i:i], math.Max(d.Min, math.Min(d.Max, v))))
		}
	}
	rec(nil)
	return out
}

// farCorner is the corner of the box farthest from the defaults along every dimension: a point of
// the initial design. With only the defaults measured, expected improvement is highest where the
// model knows least, which is there; bayes, fitting length scales to a single point, cannot tell
// one distant point from another and would return a random one.
func (sp space) farCorner(defaults Settings) Settings {
	x := sp.point(defaults)
	c := make([]float64, len(x))
	for i, d := range sp.dims {
		if d.Unit(x[i]) < 0.5 {
			c[i] = d.Max
		} else {
			c[i] = d.Min
		}
	}
	return sp.settings(c)
}
