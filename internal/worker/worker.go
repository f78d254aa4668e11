// Package worker owns one process's life in a kolo job, one world at a time: Join joins the job
// (the launcher's bootstrap, a subset of its ranks, or an elastic place and the round that has
// it), connects that world and starts its engine; Worker.Leave stops the engine and leaves the
// world. In an elastic job it follows the rounds (a watcher of the launcher's newer rounds, the
// workers to name as suspects, the rendezvous connection that keeps this worker present between
// rounds). It keeps no package-level state: what one world leaves to the next is a Memory the
// caller keeps. It must not hold the public API (package kolo), negotiation or transport logic.
package worker

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"runtime"
	"sync"
	"sync/atomic"

	"github.com/kolo-dl/kolo/internal/bootstrap"
	"github.com/kolo-dl/kolo/internal/engine"
	"github.com/kolo-dl/kolo/internal/jobenv"
	"github.com/kolo-dl/kolo/internal/observe/report"
	"github.com/kolo-dl/kolo/internal/rendezvous"
	"github.com/kolo-dl/kolo/internal/spin"
	"github.com/kolo-dl/kolo/internal/world"
)

// Memory is what a process keeps from the worlds it joined for the next one. The zero value is a
// process that joined none.
type Memory struct {
	mu sync.Mutex
	// joined counts, per set of ranks ("" for the whole job), the worlds of those ranks this
	// process has started to join: each gets rendezvous records and shared memory of its own
	// (world ids differ), so that a world joined after Leave never reads what an earlier one
	// left. Every member of a set of ranks joins its worlds the same number of times, whatever
	// other worlds some of them joined in between.
	joined map[string]int
	// round is the last elastic round this process joined: the next Join waits for a newer one.
	// 0 before the first.
	round int
	// suspects are the workers the engine of the round left found stuck: the next Join names
	// them to the launcher when it asks for the next round.
	suspects []jobenv.Place
	// lingering is the rendezvous connection of the round this process left: it stays open,
	// keeping the worker's presence record (jobenv.AliveKey), until the next round's connection
	// has set its own.
	lingering *rendezvous.Client
}

// linger keeps c open as the lingering connection, closing the one before; nil closes it.
func (m *Memory) linger(c *rendezvous.Client) {
	m.mu.Lock()
	old := m.lingering
	m.lingering = c
	m.mu.Unlock()
	if old != nil {
		old.Close()
	}
}

// Options say how to join.
type Options struct {
	// Env is the launcher's environment (jobenv.FromEnviron).
	Env    map[string]string
	Engine engine.Config
	World  world.Options
	// Ranks, when not nil, makes the world one of only these ranks of the launcher's job
	// (kolo.WithRanks): this process's rank is its index in Ranks.
	Ranks []int
	// ShareCPUs lowers GOMAXPROCS to this rank's share of the host's CPUs (kolo.WithCPUShare).
	ShareCPUs bool
}

// Worker is this process in one world of the job: its place, connections and engine.
type Worker struct {
	job     jobenv.Job
	boot    *bootstrap.Session // rank 0 under mpirun/srun hosts the rendezvous here
	world   *world.World
	engine  *engine.Engine
	report  *reporter     // nil in a world of one
	elastic *elasticRound // nil unless this is a worker of an elastic job
}

// Join joins the job the environment describes and returns this process's worker in the world it
// joined. An error caused by the caller's arguments (Ranks) is an *engine.ArgumentError.
func Join(mem *Memory, opt Options) (*Worker, error) {
	env := opt.Env
	// kolo run, mpirun or srun: who started this process decides where the ranks meet.
	hn, _ := os.Hostname()
	if opt.Ranks != nil {
		// Refused before the rendezvous: a rank outside the world must not wait there (under
		// mpirun rank 0 may have closed it already, having left a world of its own).
		if d, err := jobenv.Detect(env, hn); err == nil {
			if _, err := subset(d.Job, opt.Ranks); err != nil {
				return nil, &engine.ArgumentError{Err: err}
			}
		}
	}
	boot, err := bootstrap.Join(context.Background(), env, hn, bootstrap.Options{Timeout: opt.World.Timeout})
	if err != nil {
		return nil, err
	}
	reports, err := jobenv.ReportsFrom(env)
	if err != nil {
		boot.Close()
		return nil, err
	}
	_, _, isElastic, err := jobenv.ElasticPlace(env)
	if err != nil {
		boot.Close()
		return nil, err
	}
	if isElastic && opt.Ranks != nil {
		boot.Close()
		return nil, &engine.ArgumentError{Err: errors.New("a world of some ranks (WithRanks, init(comm=...)) is not available in an elastic job, whose ranks change")}
	}
	job := boot.Job
	if opt.Ranks != nil && !isEveryRank(opt.Ranks, job.Size) {
		if job, err = subset(job, opt.Ranks); err != nil {
			boot.Close()
			return nil, &engine.ArgumentError{Err: err}
		}
	}
	var w *world.World
	cfg := opt.Engine
	connect := func(ctx context.Context, j jobenv.Job) error {
		// An elastic worker may try several rounds, of other local sizes.
		var wopt world.Options
		cfg, wopt = spinSettings(opt.Engine, opt.World, j.LocalSize)
		if opt.ShareCPUs {
			shareCPUs(j.LocalSize)
		}
		var err error
		w, err = world.Connect(ctx, j, boot.Secret, wopt)
		return err
	}
	var er *elasticRound
	if isElastic {
		er, job, err = joinElastic(mem, env, job, boot.Secret, connect)
	} else {
		mem.mu.Lock()
		if mem.joined == nil {
			mem.joined = map[string]int{}
		}
		mem.joined[job.JobID]++
		n := mem.joined[job.JobID]
		mem.mu.Unlock()
		if n > 1 && job.Size > 1 {
			job.JobID = fmt.Sprintf("%s.%d", job.JobID, n)
		}
		err = connect(context.Background(), job)
	}
	if err != nil {
		boot.Close()
		return nil, err
	}
	job = w.Job // with the local and cross ranks derived where the launcher could not say them
	if er != nil {
		cfg.Autotune.Round = er.round.Number // the autotuner tunes each round's world anew
		slog.Debug("kolo: joined an elastic round", "round", er.round.Number, "rank", job.Rank, "size", job.Size)
	}
	// The reporter starts with the engine it reports on: the engine reaches it through rep.
	var rep atomic.Pointer[reporter]
	e, err := engine.New(cfg, engine.Group{
		Rank: job.Rank, Size: job.Size, Hosts: w.Hosts, Comm: w.Comm, Messenger: w.Messenger,
		Local: w.Local, LocalRanks: w.LocalRanks, Cross: w.Cross, Abort: w.Abort,
		// The failure record goes out as the engine stops, or an op fails for ranks that ended,
		// before the program hears of it: a program that exits on the error without
		// ReportFailure or Shutdown has still told the launcher why.
		Stopped: func(err error) {
			if r := rep.Load(); r != nil {
				r.sendFailure(failureOf(err, false))
			}
		},
		PeersEnded: func(err *engine.OpError) {
			if r := rep.Load(); r != nil {
				r.sendFailure(failureOf(err, false))
			}
		},
	})
	if err != nil {
		w.Close()
		if er != nil {
			er.close()
		}
		boot.Close()
		return nil, err
	}
	key := failureKey{world: boot.Job.JobID, who: report.RankName(boot.Job.Rank), rank: boot.Job.Rank, host: job.Hostname,
		launcherRank: func(r int) int { return r }}
	switch {
	case er != nil:
		// The launcher knows an elastic worker by its place; ranks are the round's.
		key.who, key.rank, key.round = er.place.String(), job.Rank, er.round.Number
	case opt.Ranks != nil:
		key.launcherRank = func(r int) int {
			if r >= 0 && r < len(opt.Ranks) {
				return opt.Ranks[r]
			}
			return r
		}
	}
	r := startReporter(boot.Launcher, w, e, key, reports)
	rep.Store(r)
	if err := e.Err(); err != nil && r != nil { // it stopped before rep was set
		r.sendFailure(failureOf(err, false))
	}
	return &Worker{job: job, boot: boot, world: w, engine: e, report: r, elastic: er}, nil
}

// Job is this process's place in the world it joined.
func (w *Worker) Job() jobenv.Job { return w.job }

// World is the world's connections.
func (w *Worker) World() *world.World { return w.world }

// Engine is the world's engine.
func (w *Worker) Engine() *engine.Engine { return w.engine }

// Elastic reports whether this is a worker of an elastic job.
func (w *Worker) Elastic() bool { return w.elastic != nil }

// ElasticRound is the elastic round this worker is in; 0 when the job is not elastic.
func (w *Worker) ElasticRound() int {
	if w.elastic == nil {
		return 0
	}
	return w.elastic.round.Number
}

// ElasticUpdate reports the newest round the launcher published after this worker's, and whether
// every worker of it is in this round already; ok is false while there is none, or when the job is
// not elastic.
func (w *Worker) ElasticUpdate() (newest int, removalOnly, ok bool) {
	if w.elastic == nil {
		return 0, false, false
	}
	return w.elastic.update()
}

// Leave leaves the world: the engine's shutdown barrier (skipped by an engine that stopped on an
// error), the last report to the launcher (with the flight recorder after an error), then
// connections and the bootstrap session. Rank 0 then says what the autotuner did, if it ran: the
// line that ends the job's output under kolo run. An elastic worker first tells the launcher that
// it leaves its round on purpose, naming whom its engine's error blames (elasticRound.leaving),
// and only then closes its connections.
func (w *Worker) Leave() error {
	err := w.engine.Shutdown(context.Background())
	w.report.stop(err)
	if r := w.engine.AutotuneReport(); r != "" {
		fmt.Fprintln(os.Stderr, r)
	}
	if w.elastic != nil {
		w.elastic.leaving(w.engine.Err())
	}
	if cerr := w.world.Close(); err == nil {
		err = cerr
	}
	if cerr := w.boot.Close(); err == nil {
		err = cerr
	}
	if w.elastic != nil {
		w.elastic.close()
	}
	return err
}

// shareCPUs lowers GOMAXPROCS to this rank's share of the host's CPUs (see Options.ShareCPUs); it
// never raises it above what the runtime chose (the CPUs this process may run on).
func shareCPUs(localSize int) {
	n := max(1, spin.HostCPUs()/max(1, localSize))
	if cur := runtime.GOMAXPROCS(0); n < cur {
		runtime.GOMAXPROCS(n)
		slog.Debug("kolo: GOMAXPROCS set to this rank's share of the host's CPUs", "from", cur, "to", n,
			"host_cpus", spin.HostCPUs(), "local_ranks", localSize)
	}
}
