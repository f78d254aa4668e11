// Package straggle says which rank the others wait for. Rank 0's coordinator already sees when
// each rank submits each named op; fed those arrival times (its own clock, so no clock
// synchronisation between hosts is needed) and the step boundaries, a Tracker keeps per rank how
// often it arrived last and how late it arrives relative to the median rank, and names the slowest
// rank only when one is last clearly more often than chance.
//
// The Tracker is pure (raft style): time is an argument, it starts no goroutine, reads no clock,
// does no I/O, and is not safe for concurrent use (rank 0's engine loop feeds it; a reporter asks it
// through that loop or under the caller's lock). Its memory is bounded whatever the run length:
// O(Window × ranks) for the verdict's window plus O(MaxPending × ranks) for ops not yet complete.
// It must not decide anything about the job (fail it, reorder ops): it only observes.
package straggle

import (
	"fmt"
	"slices"
	"time"
)

// Config tunes a Tracker; the zero value takes the defaults.
type Config struct {
	// Window is how many samples (steps, or ops until the first step mark) the verdict and the
	// per-rank figures look back over. Default 20.
	Window int
	// MinLateness is the floor under which no rank is named: a rank that is last every step but
	// by less than this costs the job nothing worth reporting. Default 1 ms.
	MinLateness time.Duration
	// MaxPending bounds the ops tracked while waiting for their last rank; past it the oldest is
	// dropped (an op a rank never submits must not make the tracker grow). Default 1024.
	MaxPending int
}

func (c Config) withDefaults() Config {
	if c.Window <= 0 {
		c.Window = 20
	}
	if c.MinLateness <= 0 {
		c.MinLateness = time.Millisecond
	}
	if c.MaxPending <= 0 {
		c.MaxPending = 1024
	}
	return c
}

// Tracker is the state for one world of n ranks. An elastic re-form makes a new world and so a
// new Tracker: nothing carries over, as ranks are renumbered.
type Tracker struct {
	cfg  Config
	n    int
	base time.Time // arrival times are kept as nanoseconds since base
	set  bool

	pending map[string]*pendingOp
	pool    []*pendingOp
	scratch []int64 // n values, for an op's median
	wvals   []int64 // Window values, for a rank's median over the window

	// The current step's accumulators: per rank, the sum of its lateness over the step's
	// completed ops, and how many ops that is.
	stepSum []int64
	stepOps int

	stepMode bool // a step mark has been seen: samples are steps, not ops
	win      window

	steps, ops uint64 // samples taken since the start, of each kind
}

type pendingOp struct {
	name    string
	since   int64   // first arrival
	arrived []int64 // per rank; -1 not yet
	count   int
}

// New returns a Tracker for n ranks (n >= 1).
func New(n int, cfg Config) (*Tracker, error) {
	if n < 1 {
		return nil, fmt.Errorf("straggle: tracker for %d ranks: need at least 1", n)
	}
	cfg = cfg.withDefaults()
	return &Tracker{
		cfg:     cfg,
		n:       n,
		pending: map[string]*pendingOp{},
		scratch: make([]int64, n),
		wvals:   make([]int64, cfg.Window),
		stepSum: make([]int64, n),
		win:     newWindow(cfg.Window, n),
	}, nil
}

// Size is the number of ranks.
func (t *Tracker) Size() int { return t.n }

func (t *Tracker) nanos(now time.Time) int64 {
	if !t.set {
		t.base, t.set = now, true
	}
	return int64(now.Sub(t.base))
}

// Arrive records that rank submitted op at now (the coordinator's clock). A rank arriving twice at
// a pending op keeps its first time; a rank out of range is an error (the caller's bug).
func (t *Tracker) Arrive(now time.Time, op string, rank int) error {
	if rank < 0 || rank >= t.n {
		return fmt.Errorf("straggle: op %q: rank %d of %d ranks out of range", op, rank, t.n)
	}
	at := t.nanos(now)
	p := t.pending[op]
	if p == nil {
		if len(t.pending) >= t.cfg.MaxPending {
			t.dropOldest()
		}
		p = t.newPending(op, at)
		t.pending[op] = p
	}
	if p.arrived[rank] >= 0 {
		return nil
	}
	p.arrived[rank] = at
	p.count++
	if p.count == t.n {
		t.complete(p, rank)
	}
	return nil
}

// Answered tells the tracker the coordinator answered op without every rank arriving (an error, or
// ranks that joined): it stops waiting for the rest. An op not pending is ignored, so the engine may
// call it for every name it answers.
func (t *Tracker) Answered(op string) {
	if p := t.pending[op]; p != nil {
		t.release(p)
	}
}

func (t *Tracker) newPending(name string, at int64) *pendingOp {
	var p *pendingOp
	if k := len(t.pool); k > 0 {
		p, t.pool = t.pool[k-1], t.pool[:k-1]
	} else {
		p = &pendingOp{arrived: make([]int64, t.n)}
	}
	p.name, p.since, p.count = name, at, 0
	for i := range p.arrived {
		p.arrived[i] = -1
	}
	return p
}

func (t *Tracker) release(p *pendingOp) {
	delete(t.pending, p.name)
	p.name = ""
	t.pool = append(t.pool, p)
}

// dropOldest forgets the pending op that started first. It scans: it runs only when MaxPending
// ops are outstanding, which a healthy job never reaches.
func (t *Tracker) dropOldest() {
	var old *pendingOp
	for _, p := range t.pending {
		if old == nil || p.since < old.since || p.since == old.since && p.name < old.name {
			old = p
		}
	}
	if old != nil {
		t.release(old)
	}
}

// complete folds a fully arrived op into the current step, and in op mode takes it as a sample.
// The rank whose arrival completed it is the one everybody waited for.
func (t *Tracker) complete(p *pendingOp, last int) {
	s := t.scratch[:len(p.arrived)]
	copy(s, p.arrived)
	slices.Sort(s)
	var sample []int64
	if !t.stepMode {
		sample = t.win.push(last)
	}
	for r, at := range p.arrived {
		late := at - medianOfOthers(s, at)
		t.stepSum[r] += late
		if sample != nil {
			sample[r] = late
		}
	}
	t.stepOps++
	t.ops++
	t.release(p)
}

// medianOfOthers is the median of sorted s with one occurrence of v taken out (the mean of the
// middle two for an even count; v itself when s holds nothing else). Lateness is measured against
// the other ranks, not all of them, so that of two ranks the late one is late by the whole gap.
func medianOfOthers(s []int64, v int64) int64 {
	k := len(s) - 1
	if k == 0 {
		return v
	}
	p, _ := slices.BinarySearch(s, v)
	other := func(i int) int64 {
		if i < p {
			return s[i]
		}
		return s[i+1]
	}
	if k%2 == 1 {
		return other(k / 2)
	}
	a, b := other(k/2-1), other(k/2)
	return a + (b-a)/2
}

// EndStep closes a step (rank 0's step mark: every rank runs the same ops per step, so rank 0's
// boundary is the job's). The step's sample gives each rank its mean lateness over the step's ops;
// the rank with the greatest is the step's last. A step in which no op completed is no sample. The
// first call switches the tracker from ops to steps as its samples, forgetting the op samples.
func (t *Tracker) EndStep() {
	if !t.stepMode {
		t.stepMode = true
		t.win.clear()
	}
	if t.stepOps == 0 {
		return
	}
	last, worst := 0, int64(0)
	for r, sum := range t.stepSum {
		if r == 0 || sum > worst {
			last, worst = r, sum
		}
	}
	s := t.win.push(last)
	for r, sum := range t.stepSum {
		s[r] = sum / int64(t.stepOps)
		t.stepSum[r] = 0
	}
	t.stepOps = 0
	t.steps++
}

// Unit names what the samples are: "steps" or "ops".
func (t *Tracker) Unit() string {
	if t.stepMode {
		return "steps"
	}
	return "ops"
}

// RankStat is one rank's figures over the window.
type RankStat struct {
	Rank int
	// Last is how many of the window's samples the rank arrived last in, of Samples.
	Last, Samples int
	// Lateness is the median over the window of the rank's lateness: how long after the median
	// of the other ranks it arrives (negative: before).
	Lateness time.Duration
}

// LastFraction is Last/Samples (0 with no samples).
func (s RankStat) LastFraction() float64 {
	if s.Samples == 0 {
		return 0
	}
	return float64(s.Last) / float64(s.Samples)
}

// Rank returns rank r's figures.
func (t *Tracker) Rank(r int) RankStat {
	st := RankStat{Rank: r, Samples: t.win.len()}
	if r < 0 || r >= t.n || st.Samples == 0 {
		return st
	}
	st.Last = t.win.lastCount[r]
	vals := t.wvals[:0]
	for i := range st.Samples {
		vals = append(vals, t.win.sample(i)[r])
	}
	slices.Sort(vals)
	if k := len(vals); k%2 == 1 {
		st.Lateness = time.Duration(vals[k/2])
	} else {
		st.Lateness = time.Duration(vals[k/2-1] + (vals[k/2]-vals[k/2-1])/2)
	}
	return st
}

// Verdict names the slowest rank.
type Verdict struct {
	RankStat
	Unit string // what the samples are: "steps" or "ops"
}

func (v Verdict) String() string {
	return fmt.Sprintf("rank %d arrives last in %.0f%% of %s, %s after the median of the others", v.Rank, 100*v.LastFraction(), v.Unit, v.Lateness.Round(time.Millisecond))
}

// Threshold is the share of samples a rank must be last in, strictly more than, to be named:
// max(1/2, 2/n), capped at 9/10 so that one of two ranks can be named. By chance each rank is last
// in 1/n of them; 20 samples at the threshold are far out in the binomial tail (n=2: 19 of 20,
// p≈2e-5; n=4: 11 of 20, p≈0.004), and the lateness floor must hold too.
func Threshold(n int) float64 {
	return max(0.5, min(0.9, 2/float64(n)))
}

// Slowest names the rank the others wait for, if one is clearly it: the window is full, the rank
// was last in more than Threshold(n) of its samples, and its median lateness is at least
// MinLateness. With no slowed rank, nobody is named.
func (t *Tracker) Slowest() (Verdict, bool) {
	if t.n < 2 || t.win.len() < t.cfg.Window {
		return Verdict{}, false
	}
	best := -1
	for r, c := range t.win.lastCount {
		if best < 0 || c > t.win.lastCount[best] {
			best = r
		}
	}
	st := t.Rank(best)
	if st.LastFraction() <= Threshold(t.n) || st.Lateness < t.cfg.MinLateness {
		return Verdict{}, false
	}
	return Verdict{RankStat: st, Unit: t.Unit()}, true
}

// Pending is an op some ranks have submitted and others not.
type Pending struct {
	Name    string
	Since   time.Time // first arrival
	Arrived int
	// Missing are the ranks that have not submitted it, lowest first, at most the limit asked
	// for; MissingCount is how many there are in all.
	Missing      []int
	MissingCount int
}

// Stalled lists the pending ops whose first arrival is at least olderThan before now, oldest
// first, each with at most maxRanks of its missing ranks. It scans every pending op: call it at a
// reporter's rate, not per op.
func (t *Tracker) Stalled(now time.Time, olderThan time.Duration, maxRanks int) []Pending {
	if !t.set {
		return nil
	}
	cut := int64(now.Sub(t.base)) - int64(olderThan)
	var out []Pending
	for _, p := range t.pending {
		if p.since > cut {
			continue
		}
		q := Pending{Name: p.name, Since: t.base.Add(time.Duration(p.since)), Arrived: p.count, MissingCount: t.n - p.count}
		for r, at := range p.arrived {
			if at < 0 && len(q.Missing) < maxRanks {
				q.Missing = append(q.Missing, r)
			}
		}
		out = append(out, q)
	}
	slices.SortFunc(out, func(a, b Pending) int {
		if c := a.Since.Compare(b.Since); c != 0 {
			return c
		}
		if a.Name < b.Name {
			return -1
		}
		return 1
	})
	return out
}

// Samples is how many samples were taken since the start: steps and (completed) ops.
func (t *Tracker) Samples() (steps, ops uint64) { return t.steps, t.ops }

// window is a ring of the last samples: per sample, the last rank and every rank's lateness, plus
// how many samples in the ring each rank was last in.
type window struct {
	size      int
	n         int
	lateness  []int64 // size × n
	last      []int   // per slot
	lastCount []int   // per rank
	head, k   int     // next slot; samples kept
}

func newWindow(size, n int) window {
	return window{size: size, n: n, lateness: make([]int64, size*n), last: make([]int, size), lastCount: make([]int, n)}
}

func (w *window) len() int { return w.k }

// push takes a new sample whose last rank is last, evicting the oldest if full, and returns the
// slot for its lateness values.
func (w *window) push(last int) []int64 {
	if w.k == w.size {
		w.lastCount[w.last[w.head]]--
	} else {
		w.k++
	}
	w.last[w.head] = last
	w.lastCount[last]++
	s := w.lateness[w.head*w.n : (w.head+1)*w.n]
	w.head = (w.head + 1) % w.size
	return s
}

// sample i of the kept ones (any order serves: callers take medians and counts).
func (w *window) sample(i int) []int64 { return w.lateness[i*w.n : (i+1)*w.n] }

func (w *window) clear() {
	w.head, w.k = 0, 0
	clear(w.lastCount)
}
