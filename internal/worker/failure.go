package worker

// A rank's failure record (report.Failure): built here from the engine's typed errors, sent to the
// launcher over the report channel when the engine stops on an error, when an op fails for ranks
// that ended (both before the program hears of it, so a program that just exits has still sent
// it), or when the program leaves on one (ReportFailure), so that the launcher names the rank
// behind a job's failure from data.

import (
	"context"
	"errors"
	"log/slog"

	"github.com/kolo-dl/kolo/internal/engine"
	"github.com/kolo-dl/kolo/internal/observe/relay"
	"github.com/kolo-dl/kolo/internal/observe/report"
	"github.com/kolo-dl/kolo/internal/transport"
)

// failureOf is the record of a rank that fails with err. own says err is the program's own (an
// exception, kolo.Abort) rather than one kolo returned. Blames is a rank of the world that failed;
// the reporter renames it as the launcher numbers ranks.
func failureOf(err error, own bool) report.Failure {
	f := report.Failure{Kind: report.KindError, Blames: -1, Message: err.Error()}
	var (
		stuck  *engine.StuckError
		stall  *transport.StallError
		told   *engine.PeerFailedError
		peer   *transport.PeerError
		lost   *engine.LostError
		opErr  *engine.OpError
		argErr *engine.ArgumentError
		abort  *engine.AbortError
	)
	switch {
	case own || errors.As(err, &abort):
		f.Kind = report.KindException
	case errors.As(err, &stuck):
		f.Kind, f.Blames = report.KindStalled, stuck.Rank
	case errors.As(err, &stall):
		f.Kind, f.Blames = report.KindStalled, stall.Rank
	case errors.As(err, &told):
		f.Kind, f.Blames = report.KindPeerFailed, told.Rank
	case errors.As(err, &peer):
		f.Kind, f.Blames = report.KindLost, peer.Rank
	case errors.As(err, &lost):
		f.Kind, f.Blames = report.KindLost, lost.Rank
	case errors.As(err, &opErr) && len(opErr.Ended) > 0:
		f.Kind, f.Op, f.Blames = report.KindEnded, opErr.Op, opErr.Ended[0]
	case errors.As(err, &opErr):
		f.Kind, f.Op = report.KindOp, opErr.Op
	case errors.As(err, &argErr):
		f.Kind = report.KindException // the program's own arguments
	}
	return f
}

// ReportFailure tells the launcher that this process leaves on err, in a failure record sent
// before it returns (within flightSendTimeout): the engine's own error when it stopped on one (the
// program's error is then its consequence); else, when own is false (err is one of kolo's, a
// failed op), the last op error the engine returned; else err, the program's own failure. It does
// nothing where no launcher reads reports.
func (w *Worker) ReportFailure(err error, own bool) {
	if w == nil || w.report == nil || err == nil {
		return
	}
	w.report.sendFailure(w.failure(err, own))
}

// failure builds the record ReportFailure sends.
func (w *Worker) failure(err error, own bool) report.Failure {
	switch eng := w.engine.Err(); {
	case eng != nil:
		err, own = eng, false
	case !own:
		if op := w.engine.LastOpError(); op != nil {
			err = op
		}
	}
	return failureOf(err, own)
}

// failureKey is who the launcher knows this process as, for report.FailureKey: its rank in the
// launcher's job, or its place in an elastic job. launcherRank renames a rank of the world as the
// launcher numbers it (a world of some ranks numbers them anew); -1 stays -1.
type failureKey struct {
	world        string
	who          string
	rank         int
	host         string
	round        int // the elastic round; 0 when not elastic
	launcherRank func(int) int
}

// sendFailure sends f (bounded by flightSendTimeout) with the whole flight recorder, once: the
// first failure is the rank's, what follows (the program leaving on the engine's error, the
// engine stopping on the program's abort) its consequence.
func (r *reporter) sendFailure(f report.Failure) {
	f.Rank, f.Host, f.Round = r.key.rank, r.key.host, r.key.round
	if f.Blames >= 0 {
		f.Blames = r.key.launcherRank(f.Blames)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.sentFailure != nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), flightSendTimeout)
	defer cancel()
	if err := relay.PublishFailure(ctx, r.store, r.key.world, r.key.who, f); err != nil {
		slog.Debug("kolo: failure record not sent to the launcher", "rank", r.pub.Rank, "err", err)
		return
	}
	r.sentFailure = &f
	r.sendFlightLocked(ctx)
}
