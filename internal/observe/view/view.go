// Package view is the launcher's picture of a running job: a State folded from the ranks' reports
// (package report), and what is shown of it: the live status lines, the table printed at the end,
// the text printed when ops stall or the job fails, and the flight-recorder file written then.
//
// State and the renderings are pure: time is an argument, nothing here reads a clock, starts a
// goroutine or writes to a terminal (package console does), and renderings return strings for the
// caller to put somewhere. Shared wraps a State for the launcher's goroutines. The package must not
// judge the job (who is slow comes from rank 0's straggle figures; whether to fail the job is the
// engine's and the launcher's call): it shows what the ranks reported.
package view

import (
	"fmt"
	"sync"
	"time"

	"github.com/kolo-dl/kolo/internal/observe/report"
)

// State is the launcher's view of one job. An elastic re-form (Reset) keeps the counts that span
// worlds (resets, stalls seen) and starts the ranks' figures anew, as their numbering changed.
type State struct {
	size     int
	reports  []*report.Report // by rank; nil until heard from
	received []time.Time      // the launcher's clock when each report came
	// lateness is each rank's last known median lateness (rank 0 names only the latest ranks in a
	// large job, so a rank keeps the figure it had when last named).
	lateness []time.Duration
	known    []bool

	straggle   *report.Straggle
	maxSteps   uint64
	progress   [32]progress // ring of (time, steps) samples for the rate
	progressN  int
	resets     int
	stalls     uint64
	seenStalls [16]string // recent stalled ops counted, so one stall counts once
	seenNext   int
}

type progress struct {
	at    time.Time
	steps uint64
}

// New returns the view of a job of size ranks.
func New(size int) *State {
	s := &State{}
	s.init(size)
	return s
}

func (s *State) init(size int) {
	s.size = size
	s.reports = make([]*report.Report, size)
	s.received = make([]time.Time, size)
	s.lateness = make([]time.Duration, size)
	s.known = make([]bool, size)
	s.straggle = nil
	s.maxSteps = 0
	s.progressN = 0
}

// Size is the number of ranks of the current world.
func (s *State) Size() int { return s.size }

// Resets is how many elastic re-forms the job went through.
func (s *State) Resets() int { return s.resets }

// Stalls is how many distinct ops were reported stalled.
func (s *State) Stalls() uint64 { return s.stalls }

// Begin gives a view made before its job's first world (New(0): an elastic job before its first
// round) that world, of size ranks. It is not a re-form: Reset is.
func (s *State) Begin(size int) { s.init(size) }

// Reset starts a new world of size ranks (an elastic re-form).
func (s *State) Reset(size int) {
	s.resets++
	s.init(size)
}

// Fold takes a report received at now (the launcher's clock). A report older than the one held
// for its rank (a lower Seq) is ignored; a rank outside the world is an error (a report from a
// world already re-formed).
func (s *State) Fold(now time.Time, r report.Report) error {
	if r.Rank < 0 || r.Rank >= s.size {
		return fmt.Errorf("view: report from rank %d of a %d-rank world", r.Rank, s.size)
	}
	if old := s.reports[r.Rank]; old != nil && r.Seq <= old.Seq {
		return nil
	}
	s.reports[r.Rank] = &r
	s.received[r.Rank] = now
	if r.Steps > s.maxSteps {
		s.maxSteps = r.Steps
		s.progress[s.progressN%len(s.progress)] = progress{now, r.Steps}
		s.progressN++
	}
	if st := r.Straggle; st != nil {
		s.straggle = st
		for _, l := range st.Ranks {
			if l.Rank >= 0 && l.Rank < s.size {
				s.lateness[l.Rank], s.known[l.Rank] = l.Lateness, true
			}
		}
		for _, p := range st.Stalled {
			s.countStall(p)
		}
	}
	return nil
}

func (s *State) countStall(p report.Stalled) {
	key := fmt.Sprintf("%s@%d", p.Name, p.Since.UnixNano())
	for _, k := range s.seenStalls {
		if k == key {
			return
		}
	}
	s.seenStalls[s.seenNext%len(s.seenStalls)] = key
	s.seenNext++
	s.stalls++
}

// Report returns rank's latest report and when it came, or nil.
func (s *State) Report(rank int) (*report.Report, time.Time) {
	if rank < 0 || rank >= s.size {
		return nil, time.Time{}
	}
	return s.reports[rank], s.received[rank]
}

// Reports are the latest reports by rank (nil for ranks not heard from). The slice is the
// State's: read it, do not keep it past the next Fold.
func (s *State) Reports() []*report.Report { return s.reports }

// Lateness is rank's last known median lateness, if rank 0 ever named it.
func (s *State) Lateness(rank int) (time.Duration, bool) {
	if rank < 0 || rank >= s.size {
		return 0, false
	}
	return s.lateness[rank], s.known[rank]
}

// Straggle is rank 0's latest straggler figures, or nil.
func (s *State) Straggle() *report.Straggle { return s.straggle }

// Steps is the largest step count any rank reported.
func (s *State) Steps() uint64 { return s.maxSteps }

// StepRate is steps per second over the progress seen in the last window before now (0 if too
// little was seen).
func (s *State) StepRate(now time.Time, window time.Duration) float64 {
	n := min(s.progressN, len(s.progress))
	if n < 2 {
		return 0
	}
	newest := s.progress[(s.progressN-1)%len(s.progress)]
	oldest := newest
	for i := 2; i <= n; i++ {
		p := s.progress[(s.progressN-i)%len(s.progress)]
		if now.Sub(p.at) > window {
			break
		}
		oldest = p
	}
	dt := newest.at.Sub(oldest.at)
	if dt <= 0 {
		return 0
	}
	return float64(newest.steps-oldest.steps) / dt.Seconds()
}

// age is how long ago, on the launcher's clock, rank's clock read t: the report's own age plus
// how far before the report t was on the rank's clock. No clocks need agree.
func (s *State) age(now time.Time, rank int, t time.Time) time.Duration {
	r, got := s.reports[rank], s.received[rank]
	return now.Sub(got) + r.At.Sub(t)
}

// Shared is a State for several goroutines: the launcher's report poller folds, the console
// redraws, and Prometheus scrapes.
type Shared struct {
	mu sync.Mutex
	s  *State
}

// NewShared wraps s.
func NewShared(s *State) *Shared { return &Shared{s: s} }

// Do runs f with the State, holding the lock: f must not keep the State or anything it returns.
func (sh *Shared) Do(f func(*State)) {
	sh.mu.Lock()
	defer sh.mu.Unlock()
	f(sh.s)
}
