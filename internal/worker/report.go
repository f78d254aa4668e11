package worker

// The rank's side of the launcher's live view (package observe): a reporter publishes this rank's
// flight recorder, meter and (rank 0) straggler figures on the job's rendezvous every
// report.Interval, from the world's own rendezvous connection, and sends its whole flight
// recorder and its failure record (failure.go) once when the engine stops on an error. It never
// waits on the launcher: a report that cannot be sent is dropped, and the next one goes out an
// interval later; a failure record waits at most flightSendTimeout.

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/kolo-dl/kolo/internal/engine"
	"github.com/kolo-dl/kolo/internal/jobenv"
	"github.com/kolo-dl/kolo/internal/observe/relay"
	"github.com/kolo-dl/kolo/internal/observe/report"
	"github.com/kolo-dl/kolo/internal/world"
)

// flightSendTimeout bounds sending the flight recorder after a failure: the rendezvous may be gone
// with the job, and leaving must not wait for it.
const flightSendTimeout = 2 * time.Second

// reporter is one world's publishing goroutine.
type reporter struct {
	pub      relay.Publisher
	store    relay.Store
	key      failureKey
	engErr   func() error // the engine's error, nil while it runs
	interval time.Duration

	cancel context.CancelFunc
	done   chan struct{}

	mu          sync.Mutex      // serialises the Publisher, which is not safe for concurrent use
	sentFail    bool            // the flight recorder went out after the engine's error
	sentFailure *report.Failure // the failure record, once sent
}

// startReporter starts w's reporter, or returns nil where no launcher reads the reports: a world
// of one, or a job mpirun or srun started (its rendezvous is rank 0's own). With reports off
// (jobenv.Reports) it sends only the failure record, if the rank fails.
func startReporter(launcher jobenv.Launcher, w *world.World, eng *engine.Engine, key failureKey, reports bool) *reporter {
	if launcher != jobenv.KoloRun || w.Job.Size <= 1 || w.Rendezvous == nil {
		return nil
	}
	pub := relay.Publisher{
		World: w.Job.JobID, Rank: w.Job.Rank, Host: w.Job.Hostname,
		Recorder: eng.Flight(), Meter: eng.Meter(),
	}
	if w.Job.Rank == 0 {
		pub.Straggle = eng.Straggle
	}
	interval := report.Interval(w.Job.Size)
	if !reports {
		interval = 0
	}
	return newReporter(pub, w.Rendezvous, key, interval, eng.Err)
}

// newReporter starts publishing pub's reports on store every interval; interval 0 publishes none
// (the failure record still goes out).
func newReporter(pub relay.Publisher, store relay.Store, key failureKey, interval time.Duration, engErr func() error) *reporter {
	ctx, cancel := context.WithCancel(context.Background())
	r := &reporter{pub: pub, store: store, key: key, engErr: engErr, interval: interval, cancel: cancel, done: make(chan struct{})}
	if interval <= 0 {
		close(r.done)
		return r
	}
	go r.run(ctx)
	return r
}

func (r *reporter) run(ctx context.Context) {
	defer close(r.done)
	t := time.NewTicker(r.interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			r.publish(ctx, now)
			if err := r.engErr(); err != nil {
				r.sendFailure(failureOf(err, false))
			}
		}
	}
}

// publish sends one report, bounded by an interval: a slow rendezvous costs a report, not a stall.
func (r *reporter) publish(ctx context.Context, now time.Time) {
	ctx, cancel := context.WithTimeout(ctx, r.interval)
	defer cancel()
	r.mu.Lock()
	err := r.pub.Publish(ctx, r.store, now)
	r.mu.Unlock()
	if err != nil && ctx.Err() == nil {
		slog.Debug("kolo: report to the launcher not sent", "rank", r.pub.Rank, "err", err)
	}
}

// sendFlightLocked sends the whole flight recorder once, after the engine stopped on an error, with
// r.mu held.
func (r *reporter) sendFlightLocked(ctx context.Context) {
	if r.sentFail {
		return
	}
	r.sentFail = true
	if err := r.pub.PublishFlight(ctx, r.store, r.pub.Recorder.Snapshot()); err != nil {
		slog.Debug("kolo: flight recorder not sent to the launcher", "rank", r.pub.Rank, "err", err)
	}
}

// stop ends the reporter (before its world closes): it sends a last report, so that the launcher
// sees the rank's final counts, and the failure record with the whole flight recorder if the rank
// leaves on an error (failed: its engine's, or a shutdown that did not complete) and it has not
// sent them yet.
func (r *reporter) stop(failed error) {
	if r == nil {
		return
	}
	r.cancel()
	<-r.done
	if r.interval > 0 {
		ctx, cancel := context.WithTimeout(context.Background(), flightSendTimeout)
		r.publish(ctx, time.Now())
		cancel()
	}
	if err := r.engErr(); err != nil {
		failed = err
	}
	if failed != nil {
		r.sendFailure(failureOf(failed, false))
	}
}
