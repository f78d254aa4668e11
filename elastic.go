package kolo

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"

	"github.com/kolo-dl/kolo/internal/jobenv"
	"github.com/kolo-dl/kolo/internal/worker"
)

// ErrElasticEnded is wrapped by Init's error in an elastic worker when the launcher ended the job
// (below --min-np past the timeout, the reset limit, every host blacklisted) instead of
// publishing a round for it.
var ErrElasticEnded = worker.ErrElasticEnded

// IsElastic reports whether this process is a worker of an elastic job (kolo run with --min-np,
// --max-np or --host-discovery-script); it reads the environment, so it answers before Init.
func IsElastic() bool {
	_, _, ok, _ := jobenv.ElasticPlace(jobenv.FromEnviron(os.Environ()))
	return ok
}

// ElasticRound is the round of the elastic job this worker is in (1, 2, ...); 0 when this is not
// an elastic worker or it is not initialized.
func ElasticRound() int {
	s, err := get()
	if err != nil {
		return 0
	}
	return s.worker.ElasticRound()
}

// ElasticUpdate reports whether the launcher has published a round after this worker's: hosts
// were added or removed, or a rank was lost. newest is that round's number; removalOnly is true
// when every worker of it is in this round already, so no newcomer needs the training state.
// It answers from memory (a goroutine watches the rendezvous), so it may be called every step.
// Elastic training loops call it at each commit, agree on it across ranks, and reset (Shutdown,
// Init) when it reports an update. ok is false outside an elastic job.
func ElasticUpdate() (newest int, removalOnly, ok bool) {
	s, err := get()
	if err != nil || !s.worker.Elastic() {
		return 0, false, false
	}
	return s.worker.ElasticUpdate()
}

// HostsUpdatedError is what CheckHostUpdates returns on every rank, at the same call, once the
// launcher has published a new round (Horovod's HostsUpdatedInterrupt): the training function
// returns it and ElasticRun moves every rank to the new round. SkipSync is true when the new
// round only removed workers, so that no rank needs the state broadcast.
type HostsUpdatedError struct {
	Round    int
	SkipSync bool
}

func (e *HostsUpdatedError) Error() string {
	return fmt.Sprintf("kolo: the launcher published elastic round %d (hosts were added or removed)", e.Round)
}

// ElasticState is what an elastic program keeps across resets (Horovod's elastic State): Save
// records the live state as the last commit, Restore rolls the live state back to it, and Sync
// makes every rank's state rank 0's (with collectives; ranks joining a round get the state
// there). A state with an OnReset() method has it called after every reset, before Sync: the
// place to rescale a learning rate to the new Size.
type ElasticState interface {
	Save() error
	Restore() error
	Sync(ctx context.Context) error
}

// Commit saves st and checks for host updates (Horovod's state.commit()): it returns a
// *HostsUpdatedError, on every rank alike, when the job's world is about to change.
func Commit(ctx context.Context, st ElasticState) error {
	if err := st.Save(); err != nil {
		return fmt.Errorf("kolo: commit: save the state: %w", err)
	}
	return CheckHostUpdates(ctx)
}

// CheckHostUpdates returns a *HostsUpdatedError when the launcher has published a round after
// this one, nil otherwise. Ranks learn of a new round at slightly different times, so rank 0's
// view is broadcast: every rank returns the same answer at the same call, which is what lets
// them all leave the round at one step. It costs one small broadcast; outside an elastic job it
// returns nil at once.
func CheckHostUpdates(ctx context.Context) error {
	s, err := get()
	if err != nil {
		return err
	}
	if !s.worker.Elastic() {
		return nil
	}
	view := []int64{0, 0}
	if n, removal, ok := s.worker.ElasticUpdate(); ok {
		view[0] = int64(n)
		if removal {
			view[1] = 1
		}
	}
	if err := Broadcast(ctx, "kolo.elastic.hosts", Of(view), 0); err != nil {
		return err
	}
	if int(view[0]) > s.worker.ElasticRound() {
		return &HostsUpdatedError{Round: int(view[0]), SkipSync: view[1] == 1}
	}
	return nil
}

// ElasticRun runs train until it returns nil, across the worlds of an elastic job (Horovod's
// hvd.elastic.run): it syncs st, calls train, and when train fails because a rank was lost (the
// engine stopped: Failed) it restores st to the last commit, moves to the next round (Shutdown,
// Init with opts) and goes again; when train returns a *HostsUpdatedError (from Commit) it moves
// to the new round the same way, without a restore. Any other error ends the run. Survivors keep
// their process and their memory; only the connections are new. Outside an elastic job a lost
// rank ends the run with its error, as there is no next round.
func ElasticRun(ctx context.Context, st ElasticState, train func(ctx context.Context) error, opts ...Option) error {
	skipSync := false
	for {
		err := func() error {
			if !skipSync {
				if err := st.Sync(ctx); err != nil {
					return err
				}
			}
			return train(ctx)
		}()
		var hu *HostsUpdatedError
		switch {
		case err == nil:
			return nil
		case errors.As(err, &hu):
			skipSync = hu.SkipSync
		case Failed() && IsElastic():
			if rerr := st.Restore(); rerr != nil {
				return fmt.Errorf("kolo: elastic: restore the last commit after %v: %w", err, rerr)
			}
			skipSync = false
			slog.Info("kolo: elastic: restored the last commit; moving to the next round", "err", err)
		default:
			return err
		}
		if serr := Shutdown(); serr != nil && !Failed() {
			slog.Debug("kolo: elastic: leaving the round", "err", serr)
		}
		if err := Init(opts...); err != nil {
			return fmt.Errorf("kolo: elastic: join the next round: %w", err)
		}
		if r, ok := st.(interface{ OnReset() error }); ok {
			if err := r.OnReset(); err != nil {
				return fmt.Errorf("kolo: elastic: reset callback: %w", err)
			}
		}
	}
}
