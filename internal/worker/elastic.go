package worker

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/kolo-dl/kolo/internal/engine"
	"github.com/kolo-dl/kolo/internal/jobenv"
	"github.com/kolo-dl/kolo/internal/rendezvous"
	"github.com/kolo-dl/kolo/internal/transport"
)

// A worker of an elastic job (kolo run --min-np/--max-np/--host-discovery-script) is known by its
// place, a host and a slot, and joins the job's worlds one round at a time (internal/jobenv/elastic.go):
// Join waits at the rendezvous for the next round that has its place, and joins it under the
// round's own job id. The process, its Go runtime and the Python interpreter above it are never
// restarted; only the world's connections are made anew. While a round runs, a goroutine waits
// at the rendezvous for the round after it, so that Worker.ElasticUpdate (Python's
// check_host_updates) answers from memory.

// ErrElasticEnded is wrapped by Join's error in an elastic worker when the launcher ended the job
// (below --min-np past the timeout, the reset limit, every host blacklisted) instead of
// publishing a round for it.
var ErrElasticEnded = errors.New("the elastic job ended")

// elasticRound is this process's place in an elastic job while it is in a round.
type elasticRound struct {
	mem    *Memory
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
func joinElastic(mem *Memory, env map[string]string, base jobenv.Job, secret []byte, connect func(context.Context, jobenv.Job) error) (*elasticRound, jobenv.Job, error) {
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

	mem.mu.Lock()
	last := mem.round
	mem.mu.Unlock()
	want := started
	if last > 0 {
		// Leaving round last: tell the launcher, which publishes the same workers again once
		// every one of them asked and nobody was lost (an error that killed nobody). When a
		// newer round exists already (a lost rank, hosts updated), this is moot.
		want = max(started, last+1)
		mem.mu.Lock()
		suspects := mem.suspects
		mem.suspects = nil
		mem.mu.Unlock()
		if err := client.Set(ctx, jobenv.ReinitKey(last, place), jobenv.EncodeReinit(suspects)); err != nil {
			return nil, base, fmt.Errorf("elastic worker %s: ask for the round after %d: %w", place, last, err)
		}
	}
	var lastErr error // why the last round this worker tried to join failed
	for {
		r, err := newestRound(ctx, client, want)
		if err != nil {
			err = fmt.Errorf("elastic worker %s: waiting (up to the elastic timeout, %s) for round %d: %w", place, timeout, want, err)
			if lastErr != nil {
				err = fmt.Errorf("%w, after %w", err, lastErr)
			}
			return nil, base, err
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
			mem.linger(nil) // the record is this connection's now
			if err := client.Set(ctx, jobenv.JoinedKey(r.Number, place), []byte("1")); err != nil {
				slog.Warn("kolo: elastic worker could not tell the launcher it joined its round", "place", place, "round", r.Number, "err", err)
			}
			// A newer round published meanwhile is the watcher's to report: this world is
			// complete, and the training loop resets at its next commit.
			w := &elasticRound{mem: mem, place: place, client: client, round: r, done: make(chan struct{})}
			mem.mu.Lock()
			mem.round = r.Number
			mem.mu.Unlock()
			wctx, wcancel := context.WithCancel(context.Background())
			w.cancel = wcancel
			go w.watch(wctx)
			ok = true
			return w, job, nil
		}
		var lost *transport.PeerError
		select {
		case <-newer:
			slog.Debug("kolo: elastic round superseded while joining it", "place", place, "round", r.Number, "err", err)
		default:
			if !errors.As(err, &lost) {
				// This worker's own failure (no shared memory, no port): not a round's to fix.
				return nil, base, fmt.Errorf("elastic worker %s: join round %d as rank %d of %d: %w", place, r.Number, job.Rank, job.Size, err)
			}
			// A peer lost while the round forms (its host killed, or its own connect failed
			// because of another loss) fails the connect here, before any round is newer. This
			// worker survives: it asks the launcher for the next round, as after a failed op,
			// naming nobody (a peer whose connect failed too is no suspect; one that died is
			// the launcher's to see), and waits for it within the elastic timeout.
			joinErr := fmt.Errorf("elastic worker %s: join round %d as rank %d of %d: %w", place, r.Number, job.Rank, job.Size, err)
			if serr := client.Set(ctx, jobenv.ReinitKey(r.Number, place), jobenv.EncodeReinit(nil)); serr != nil {
				return nil, base, fmt.Errorf("%w (and asking for the next round failed: %v)", joinErr, serr)
			}
			slog.Info("kolo: elastic worker could not join its round; waiting for the next", "place", place, "round", r.Number, "err", err)
			lastErr = joinErr
		}
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
func (w *elasticRound) watch(ctx context.Context) {
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

func (w *elasticRound) update() (newest int, removalOnly, ok bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.newest, w.removalOnly, w.newest > 0
}

// leaving tells the launcher, as this worker leaves its round with the engine's error err, that
// it leaves on purpose, before its connections close: a peer whose call then fails on them names
// this worker, and the launcher, which stops at once a named worker that has not asked for the
// next round (it takes it for stuck), must know by then that this one left. After an error that
// is the request for the next round (jobenv.ReinitKey), naming the worker err blames (a progress
// deadline passed waiting on it, or its connection broke: a stopped process, a cut link, or a
// peer that left first), which the launcher otherwise cannot tell from one still computing;
// without one it is jobenv.LeftKey (the next Join asks for the next round). Either is set while
// this connection still holds the presence record: the launcher never sees this worker both
// silent and unrecorded. The suspect is kept for the next Join to name again. A lost peer's rank
// is trusted only when its host agrees with the round's: errors of a host's shared memory may
// number ranks within the host, and a rank misread there names a worker of the host that failed
// anyway.
func (w *elasticRound) leaving(err error) {
	rank, host := -1, ""
	var stuck *engine.StuckError
	var stall *transport.StallError
	var lost *transport.PeerError
	switch {
	case errors.As(err, &stuck):
		rank = stuck.Rank
	case errors.As(err, &stall):
		rank = stall.Rank
	case errors.As(err, &lost):
		rank, host = lost.Rank, lost.Host
	}
	var suspects []jobenv.Place
	if rank >= 0 && rank < len(w.round.Ranks) {
		p := w.round.Ranks[rank].Place
		if p != w.place && (host == "" || host == p.Host) {
			suspects = []jobenv.Place{p}
		}
	}
	w.mem.mu.Lock()
	w.mem.suspects = suspects
	w.mem.mu.Unlock()
	key, val := jobenv.LeftKey(w.round.Number, w.place), []byte("1")
	if err != nil {
		key, val = jobenv.ReinitKey(w.round.Number, w.place), jobenv.EncodeReinit(suspects)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if serr := w.client.Set(ctx, key, val); serr != nil {
		slog.Debug("kolo: elastic worker could not tell the launcher it leaves its round", "place", w.place, "key", key, "err", serr)
	}
}

// close stops the watcher; the rendezvous connection lingers (Memory.linger) until the next
// round's replaces it, or the process ends.
func (w *elasticRound) close() {
	w.cancel()
	select {
	case <-w.done:
	case <-time.After(5 * time.Second):
		slog.Warn("kolo: elastic worker's round watcher did not stop within 5 s", "place", w.place)
		w.client.Close()
		return
	}
	w.mem.linger(w.client)
}
