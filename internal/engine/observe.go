package engine

// What the engine records for the launcher's live view of the job (package observe): every rank
// keeps a flight recorder of its last ops and a meter of its steps, ops and collective time; rank 0
// also tracks, from when each rank's submissions reach it, which rank the others wait for. All of
// it is fed from the driver's own steps, with times it reads anyway, and allocates nothing per op
// (TestHotPathWithinBudget). A publisher outside the engine (the worker) reads it a few times a
// second.

import (
	"sync/atomic"
	"time"

	"github.com/kolo-dl/kolo/internal/engine/negotiate"
	"github.com/kolo-dl/kolo/internal/observe/flight"
	"github.com/kolo-dl/kolo/internal/observe/report"
	"github.com/kolo-dl/kolo/internal/observe/straggle"
)

// flightOps is how many ops a rank's flight recorder keeps.
const flightOps = 64

type observer struct {
	flight *flight.Recorder
	meter  *report.Meter

	// Rank 0 only: the straggler tracker of the global set (driver-owned), the step marks the
	// program made and those the tracker has closed, and the latest figures for the publisher.
	track     *straggle.Tracker
	stepMarks atomic.Uint64
	tracked   uint64
	nextSnap  time.Time
	figures   atomic.Pointer[report.Straggle]
}

func newObserver(rank, size int, now time.Time) (*observer, error) {
	o := &observer{flight: flight.New(flightOps), meter: report.NewMeter(now)}
	if rank == 0 {
		// A window of 10 steps: a slowed rank is named 10 steps after it slowed down.
		t, err := straggle.New(size, straggle.Config{Window: 10})
		if err != nil {
			return nil, err
		}
		o.track = t
	}
	return o, nil
}

// Flight is this rank's flight recorder: its last ops, with when each was submitted, negotiated,
// started and finished.
func (e *Engine) Flight() *flight.Recorder { return e.obs.flight }

// Meter counts this rank's steps, ops, bytes reduced and time in collectives.
func (e *Engine) Meter() *report.Meter { return e.obs.meter }

// Straggle is rank 0's latest figures of who the others wait for (nil elsewhere, or before the
// first): refreshed every report.Interval by the driver.
func (e *Engine) Straggle() *report.Straggle { return e.obs.figures.Load() }

// observeStep notes a step mark (MarkStep).
func (o *observer) observeStep(now time.Time) {
	o.meter.Step(now)
	if o.track != nil {
		o.stepMarks.Add(1)
	}
}

// closeSteps (rank 0's driver, before it takes its queue) closes the tracker's steps up to the
// program's marks, so that rank 0's next step's ops fall after the boundary.
func (o *observer) closeSteps() {
	if o.track == nil {
		return
	}
	for marks := o.stepMarks.Load(); o.tracked < marks; o.tracked++ {
		o.track.EndStep()
	}
}

// arrived (rank 0) notes the global set's submissions in one rank's Batch, at the coordinator's
// time. Names of cached ids come from the hub.
func (e *Engine) arrived(now time.Time, from int, b *negotiate.Batch) {
	t := e.obs.track
	if t == nil || b.Set != 0 {
		return
	}
	for i := range b.Requests {
		t.Arrive(now, b.Requests[i].Name, from)
	}
	for _, id := range b.Cached {
		if name, _, ok := e.hub.CachedName(0, b.Seen, id); ok {
			t.Arrive(now, name, from)
		}
	}
}

// answered (rank 0) tells the tracker the global set's responses are out: an op answered without
// every rank (an error, joined ranks) is no longer waited on.
func (e *Engine) answered(out []negotiate.SetResponses) {
	t := e.obs.track
	if t == nil {
		return
	}
	for i := range out {
		if out[i].Set != 0 {
			continue
		}
		for j := range out[i].Responses {
			for _, n := range out[i].Responses[j].Names {
				t.Answered(n)
			}
		}
	}
}

// refreshFigures (rank 0, at each tick) takes the tracker's figures for the publisher every
// report.Interval.
func (e *Engine) refreshFigures(now time.Time) {
	o := e.obs
	if o.track == nil || now.Before(o.nextSnap) {
		return
	}
	o.nextSnap = now.Add(report.Interval(e.g.Size))
	o.figures.Store(report.StraggleOf(o.track, now, stallWarning(e.cfg)))
}
