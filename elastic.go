package kolo

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/kolo-dl/kolo/engine"
	"github.com/kolo-dl/kolo/jobenv"
	"github.com/kolo-dl/kolo/rendezvous"
	"github.com/kolo-dl/kolo/transport"
)

// A worker of an elastic job (kolo run --min-np/--max-np/--host-discovery-script) is known by its
// place, a host and a slot, and joins the job's worlds one round at a time (jobenv/elastic.go):
// Init waits at the rendezvous for the next round that has its place, and joins it under the
// round's own job id. The process, its Go runtime and the Python interpreter above it are never
// restarted; only the world's connections are made anew. While a round runs, a goroutine waits
// at the rendezvous for the round after it, so that ElasticUpdate (Python's
// check_host_updates) answers from memory.

// elasticJoined is, per place, the last round this process joined: the next Init waits for a
// newer one. 0 before the first.
var (
	elasticMu     sync.Mutex
	elasticJoined int
	// elasticSuspects are the workers the engine of the round left found stuck: the next Init
	// names them to the launcher when it asks for the next round.
	elasticSuspects []jobenv.Place
	// elasticLingering is the rendezvous connection of the round this process left: it stays
	// open, keeping the worker's presence record (jobenv.AliveKey), until the next round's
	// connection has set its own.
	elasticLingering *rendezvous.Client
)

// lingerClient keeps c open as the lingering connection, closing the one before; nil closes it.
func lingerClient(c *rendezvous.Client) {
	elasticMu.Lock()
	old := elasticLingering
	elasticLingering = c
	elasticMu.Unlock()
	if old != nil {
		old.Close()
	}
}

// ErrElasticEnded is wrapped by Init's error in an elastic worker when the launcher ended the job
// (below --min-np past the timeout, the reset limit, every host blacklisted) instead of
// publishing a round for it.
var ErrElasticEnded = errors.New("the elastic job ended")

// elasticWorker is this process's place in an elastic job while it is in a round.
type elasticWorker struct {
	place  jobenv.Place
	client *rendezvous.Client
	round  jobenv.Round

	cancel context.CancelFunc // stops the watcher
	done   chan struct{}      // closed when the watcher has returned

	mu          sync.Mutex
	newest      int  // the newest round published after ours; 0: none yet
	removalOnly bool // every worker of newest was in our round
}

// joinElastic waits for the round this worker joins next, dials the rendezvous for it and returns
// the worker and its job in that round. connect is world set-up for the job: it is cancelled and
// the next round tried when the launcher publishes a newer round meanwhile (a member of this one
// is gone, so its Gather would wait for ever).
func joinElastic(env map[string]string, base jobenv.Job, secret []byte, connect func(context.Context, jobenv.Job) error) (*elasticWorker, jobenv.Job, error) {
	place, started, _, err := jobenv.ElasticPlace(env)
	if err != nil {
		return nil, base, err
	}
	timeout, err := jobenv.ElasticTimeoutFrom(env)
	if err != nil {
		return nil, base, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	client, err := rendezvous.Dial(ctx, base.Rendezvous, secret)
	if err != nil {
		return nil, base, fmt.Errorf("elastic worker %s: reach the launcher's rendezvous %s: %w", place, base.Rendezvous, err)
	}
	ok := false
	defer func() {
		if !ok {
			client.Close()
		}
	}()

	elasticMu.Lock()
	last := elasticJoined
	elasticMu.Unlock()
	want := started
	if last > 0 {
		// Leaving round last: tell the launcher, which publishes the same workers again once
		// every one of them asked and nobody was lost (an error that killed nobody). When a
		// newer round exists already (a lost rank, hosts updated), this is moot.
		want = max(started, last+1)
		elasticMu.Lock()
		suspects := elasticSuspects
		elasticSuspects = nil
		elasticMu.Unlock()
		if err := client.Set(ctx, jobenv.ReinitKey(last, place), jobenv.EncodeReinit(suspects)); err != nil {
			return nil, base, fmt.Errorf("elastic worker %s: ask for the round after %d: %w", place, last, err)
		}
	}
	for {
		r, err := newestRound(ctx, client, want)
		if err != nil {
			return nil, base, fmt.Errorf("elastic worker %s: waiting (up to the elastic timeout, %s) for round %d: %w", place, timeout, want, err)
		}
		if r.End != "" {
			return nil, base, fmt.Errorf("elastic worker %s: %w: %s", place, ErrElasticEnded, r.End)
		}
		job, in := r.Job(place, base)
		if !in {
			return nil, base, fmt.Errorf("elastic worker %s: round %d has no rank for this worker (the launcher stops it)", place, r.Number)
		}
		// Connect, unless a newer round comes first: then this one never completes.
		cctx, ccancel := context.WithCancel(ctx)
		newer := make(chan struct{})
		go func() {
			if _, err := client.Get(cctx, jobenv.RoundKey(r.Number+1)); err == nil {
				close(newer)
				ccancel()
			}
		}()
		err = connect(cctx, job)
		ccancel()
		if err == nil {
			// Present before joined: the launcher reads a joined worker without a presence
			// record as unreachable.
			if err := client.SetSession(ctx, jobenv.AliveKey(place), []byte(fmt.Sprintf("round %d", r.Number))); err != nil {
				slog.Warn("kolo: elastic worker could not record its presence at the launcher", "place", place, "round", r.Number, "err", err)
			}
			lingerClient(nil) // the record is this connection's now
			if err := client.Set(ctx, jobenv.JoinedKey(r.Number, place), []byte("1")); err != nil {
				slog.Warn("kolo: elastic worker could not tell the launcher it joined its round", "place", place, "round", r.Number, "err", err)
			}
			// A newer round published meanwhile is the watcher's to report: this world is
			// complete, and the training loop resets at its next commit.
			w := &elasticWorker{place: place, client: client, round: r, done: make(chan struct{})}
			elasticMu.Lock()
			elasticJoined = r.Number
			elasticMu.Unlock()
			wctx, wcancel := context.WithCancel(context.Background())
			w.cancel = wcancel
			go w.watch(wctx)
			ok = true
			return w, job, nil
		}
		select {
		case <-newer:
		default:
			return nil, base, fmt.Errorf("elastic worker %s: join round %d as rank %d of %d: %w", place, r.Number, job.Rank, job.Size, err)
		}
		slog.Debug("kolo: elastic round superseded while joining it", "place", place, "round", r.Number, "err", err)
		want = r.Number + 1
	}
}

// newestRound waits until round want is published, then returns the newest round there is.
func newestRound(ctx context.Context, c *rendezvous.Client, want int) (jobenv.Round, error) {
	if _, err := c.Get(ctx, jobenv.RoundKey(want)); err != nil {
		return jobenv.Round{}, err
	}
	n := want
	if v, ok, err := c.TryGet(ctx, jobenv.LatestRoundKey); err != nil {
		return jobenv.Round{}, err
	} else if ok {
		if latest, err := strconv.Atoi(strings.TrimSpace(string(v))); err == nil && latest > n {
			n = latest
		}
	}
	b, err := c.Get(ctx, jobenv.RoundKey(n))
	if err != nil {
		return jobenv.Round{}, err
	}
	return jobenv.DecodeRound(b)
}

// watch waits for the rounds after ours, one at a time, and records the newest.
func (w *elasticWorker) watch(ctx context.Context) {
	defer close(w.done)
	ours := map[jobenv.Place]bool{}
	for _, k := range w.round.Ranks {
		ours[k.Place] = true
	}
	for n := w.round.Number + 1; ; n++ {
		b, err := w.client.Get(ctx, jobenv.RoundKey(n))
		if err != nil {
			if ctx.Err() == nil {
				slog.Debug("kolo: elastic worker stops watching for new rounds", "place", w.place, "err", err)
			}
			return
		}
		r, err := jobenv.DecodeRound(b)
		if err != nil {
			slog.Warn("kolo: elastic worker read a bad round from the launcher", "round", n, "err", err)
			return
		}
		removal := r.End == ""
		for _, k := range r.Ranks {
			removal = removal && ours[k.Place]
		}
		w.mu.Lock()
		w.newest, w.removalOnly = n, removal
		w.mu.Unlock()
		if r.End != "" {
			return
		}
	}
}

func (w *elasticWorker) update() (newest int, removalOnly, ok bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.newest, w.removalOnly, w.newest > 0
}

// leaving records, as this worker leaves its round with the engine's error err, the worker err
// blames (a progress deadline passed waiting on it, or its connection broke: a stopped process,
// a cut link), for the next Init to name to the launcher, which otherwise cannot tell a worker
// that will never ask for the next round from one still computing. A lost peer's rank is trusted
// only when its host agrees with the round's: errors of a host's shared memory may number ranks
// within the host, and a rank misread there names a worker of the host that failed anyway.
func (w *elasticWorker) leaving(err error) {
	rank, host := -1, ""
	var stuck *engine.StuckError
	var stall *transport.StallError
	var lost *transport.PeerError
	switch {
	case errors.As(err, &stuck):
		rank = stuck.Rank
	case errors.As(err, &stall):
		rank = stall.Rank
	case errors.As(err, &lost) && !errors.Is(err, transport.ErrPeerLeft):
		// (A peer that left is a survivor that saw the failure first, not its cause.)
		rank, host = lost.Rank, lost.Host
	}
	var suspects []jobenv.Place
	if rank >= 0 && rank < len(w.round.Ranks) {
		p := w.round.Ranks[rank].Place
		if p != w.place && (host == "" || host == p.Host) {
			suspects = []jobenv.Place{p}
		}
	}
	elasticMu.Lock()
	elasticSuspects = suspects
	elasticMu.Unlock()
	if err != nil {
		// Ask for the next round now, while this connection still holds the presence record:
		// the launcher never sees this worker both silent and unrecorded. (The next Init asks
		// again, the same way.)
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if serr := w.client.Set(ctx, jobenv.ReinitKey(w.round.Number, w.place), jobenv.EncodeReinit(suspects)); serr != nil {
			slog.Debug("kolo: elastic worker could not ask for the next round as it left", "place", w.place, "err", serr)
		}
	}
}

// close stops the watcher; the rendezvous connection lingers (lingerClient) until the next
// round's replaces it, or the process ends.
func (w *elasticWorker) close() {
	w.cancel()
	select {
	case <-w.done:
	case <-time.After(5 * time.Second):
		slog.Warn("kolo: elastic worker's round watcher did not stop within 5 s", "place", w.place)
		w.client.Close()
		return
	}
	lingerClient(w.client)
}

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
	if err != nil || s.elastic == nil {
		return 0
	}
	return s.elastic.round.Number
}

// ElasticUpdate reports whether the launcher has published a round after this worker's: hosts
// were added or removed, or a rank was lost. newest is that round's number; removalOnly is true
// when every worker of it is in this round already, so no newcomer needs the training state.
// It answers from memory (a goroutine watches the rendezvous), so it may be called every step.
// Elastic training loops call it at each commit, agree on it across ranks, and reset (Shutdown,
// Init) when it reports an update. ok is false outside an elastic job.
func ElasticUpdate() (newest int, removalOnly, ok bool) {
	s, err := get()
	if err != nil || s.elastic == nil {
		return 0, false, false
	}
	return s.elastic.update()
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
	if s.elastic == nil {
		return nil
	}
	view := []int64{0, 0}
	if n, removal, ok := s.elastic.update(); ok {
		view[0] = int64(n)
		if removal {
			view[1] = 1
		}
	}
	if err := Broadcast(ctx, "kolo.elastic.hosts", Of(view), 0); err != nil {
		return err
	}
	if int(view[0]) > s.elastic.round.Number {
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
