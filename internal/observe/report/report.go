// Package report is what a rank tells the launcher about itself a few times a second: a compact
// Report (its counters, the tail of its flight recorder, a heartbeat time, and on rank 0 the
// straggler figures), the binary codec that carries it through the rendezvous store, the Failure
// record a rank sends when it fails (which rank, how, whom it blames), the Meter a
// rank keeps its counters in, and Summarize, which folds 1,000 ranks' reports into a view of
// bounded size.
//
// Scale: a report is a few hundred bytes; at Interval's rates the job sends at most about a
// thousand a second in all, whatever its size (250 ms per rank up to 250 ranks, then slower), so
// the launcher's store and decoder see a bounded load; the launcher keeps one report per rank
// (300 KB at 1,000 ranks) and renders from a Summary of O(hosts + worst) entries, never from all
// ranks at once.
//
// The package moves and counts; it must not decide (who is slow is package straggle's call, what
// to print is package view's) and must not do I/O: callers put the bytes where they go.
package report

import (
	"time"

	"github.com/kolo-dl/kolo/internal/observe/flight"
)

// Report is one rank's state at one moment.
type Report struct {
	Rank int
	Host string
	// Seq counts this rank's reports from 1: the launcher keeps the newest.
	Seq uint64
	// At is when the rank made the report (its own clock): the heartbeat.
	At time.Time
	// Up is how long the rank's engine has run: time outside collectives is Up - InCollectives.
	Up time.Duration

	// Steps is the rank's step count (the optimizer's, or MarkStep); StepMedian and StepP95 are
	// over its last StepWindow steps.
	Steps               uint64
	StepMedian, StepP95 time.Duration
	InCollectives       time.Duration // executing responses, fused or not
	BytesReduced        uint64
	OpsDone, OpsFailed  uint64
	OpLatency           []KindLatency // per op kind, submit to done
	Current             *Op           // the op the rank is in (its oldest unfinished), if any
	Open                int           // how many of its ops have not finished
	Last                []Op          // its last few finished ops, oldest first
	Straggle            *Straggle     // rank 0 of the global set only
}

// Op is a flight-recorder entry, as much of it as travels.
type Op struct {
	Name       string
	Kind       string
	Bytes      int64
	State      flight.State
	Submitted  time.Time
	Negotiated time.Time
	Started    time.Time
	Finished   time.Time
}

// FromFlight copies a flight-recorder entry.
func FromFlight(o flight.Op) Op {
	return Op{Name: o.Name, Kind: o.Kind, Bytes: o.Bytes, State: o.State, Submitted: o.Submitted,
		Negotiated: o.Negotiated, Started: o.Started, Finished: o.Finished}
}

// Straggle is rank 0's straggler figures (package straggle's, as data).
type Straggle struct {
	// Unit is what the samples are ("steps" or "ops"); Samples how many the window holds.
	Unit    string
	Samples int
	// Slowest is the named rank, -1 for none.
	Slowest int
	// Ranks are the latest ranks, latest first: every rank in a job of up to MaxLate ranks, the
	// latest MaxLate in a larger one.
	Ranks []Late
	// Stalled are the ops waiting on ranks past the warning time (at most MaxStalled).
	Stalled []Stalled
}

// Late is one rank's lateness figures over the window.
type Late struct {
	Rank     int
	Last     int // samples it was last in
	Lateness time.Duration
}

// Stalled is an op some ranks submitted and others have not.
type Stalled struct {
	Name         string
	Since        time.Time
	Arrived      int
	Missing      []int // at most MaxMissing
	MissingCount int
}

// Bounds of what a report carries (and what Decode accepts).
const (
	MaxLast       = 8
	MaxLate       = 64
	MaxStalled    = 8
	MaxMissing    = 16
	MaxKinds      = 16
	MaxString     = 1024
	LatencyBounds = 12 // buckets of KindLatency
)

// Buckets are the upper bounds of the op-latency histogram's buckets; the last is +Inf.
var Buckets = [LatencyBounds - 1]time.Duration{
	100 * time.Microsecond, 300 * time.Microsecond, time.Millisecond, 3 * time.Millisecond,
	10 * time.Millisecond, 30 * time.Millisecond, 100 * time.Millisecond, 300 * time.Millisecond,
	time.Second, 3 * time.Second, 10 * time.Second,
}

// KindLatency is a histogram of one op kind's latencies: Counts[i] ops took at most Buckets[i]
// (and more than Buckets[i-1]); the last count is the rest.
type KindLatency struct {
	Kind   string
	Counts [LatencyBounds]uint64
	Sum    time.Duration
}

// Interval is how often each of size ranks should report: 250 ms up to 250 ranks, then slower, so
// that the whole job sends about a thousand reports a second at most.
func Interval(size int) time.Duration {
	return max(250*time.Millisecond, time.Duration(size)*time.Second/1000)
}
