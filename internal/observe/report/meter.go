package report

import (
	"slices"
	"sync"
	"time"

	"github.com/kolo-dl/kolo/internal/observe/flight"
)

// StepWindow is how many of its last steps a rank's step-time median and p95 are over.
const StepWindow = 256

// Meter is a rank's counters: the engine adds to it as ops finish and collectives run, the step
// hook marks steps, and a reporter fills Reports from it. Its methods are safe for concurrent use;
// each takes one short, uncontended lock and none allocates once every op kind has been seen.
type Meter struct {
	mu        sync.Mutex
	start     time.Time
	steps     uint64
	lastStep  time.Time
	stepTimes [StepWindow]time.Duration
	inColl    time.Duration
	bytes     uint64
	done      uint64
	failed    uint64
	kinds     []KindLatency
}

// NewMeter returns a Meter whose uptime counts from start.
func NewMeter(start time.Time) *Meter { return &Meter{start: start, lastStep: start} }

// Step marks the end of a step at now. The first step counts from the Meter's start.
func (m *Meter) Step(now time.Time) {
	m.mu.Lock()
	m.stepTimes[m.steps%StepWindow] = now.Sub(m.lastStep)
	m.steps++
	m.lastStep = now
	m.mu.Unlock()
}

// Collective adds one executed response: how long it ran and, for a reduction, how many bytes it
// reduced (0 for others).
func (m *Meter) Collective(d time.Duration, reduced int64) {
	m.mu.Lock()
	m.inColl += d
	m.bytes += uint64(max(reduced, 0))
	m.mu.Unlock()
}

// OpDone adds one finished op of kind (a constant name, as negotiate.OpKind.String returns) that
// took latency from submission to completion.
func (m *Meter) OpDone(kind string, latency time.Duration, failed bool) {
	m.mu.Lock()
	if failed {
		m.failed++
	} else {
		m.done++
	}
	i := slices.IndexFunc(m.kinds, func(k KindLatency) bool { return k.Kind == kind })
	if i < 0 && len(m.kinds) < MaxKinds {
		m.kinds = append(m.kinds, KindLatency{Kind: kind})
		i = len(m.kinds) - 1
	}
	if i >= 0 {
		k := &m.kinds[i]
		b, _ := slices.BinarySearch(Buckets[:], latency)
		k.Counts[b]++
		k.Sum += latency
	}
	m.mu.Unlock()
}

// Fill sets r's counters from the Meter at now and its flight fields from snap (the rank's flight
// recorder), leaving Rank, Host, Seq and Straggle to the caller. It reuses r's slices.
func (m *Meter) Fill(r *Report, now time.Time, snap flight.Snapshot) {
	m.mu.Lock()
	r.At = now
	r.Up = now.Sub(m.start)
	r.Steps = m.steps
	n := int(min(m.steps, StepWindow))
	var win [StepWindow]time.Duration
	copy(win[:], m.stepTimes[:n])
	r.InCollectives = m.inColl
	r.BytesReduced = m.bytes
	r.OpsDone = m.done
	r.OpsFailed = m.failed
	r.OpLatency = append(r.OpLatency[:0], m.kinds...)
	m.mu.Unlock()

	r.StepMedian, r.StepP95 = 0, 0
	if n > 0 {
		w := win[:n]
		slices.Sort(w)
		r.StepMedian = w[(n-1)/2]
		r.StepP95 = w[(n*95+99)/100-1]
	}
	r.Current = nil
	if cur, ok := snap.Current(); ok {
		op := FromFlight(cur)
		r.Current = &op
	}
	r.Open = snap.Open()
	r.Last = r.Last[:0]
	for _, o := range snap.Ops {
		if o.State.Finished() {
			r.Last = append(r.Last, FromFlight(o))
		}
	}
	r.Last = r.Last[max(0, len(r.Last)-4):]
}
