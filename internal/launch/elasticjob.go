package launch

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/kolo-dl/kolo/internal/auth"
	"github.com/kolo-dl/kolo/internal/jobenv"
	"github.com/kolo-dl/kolo/internal/launch/elastic"
	"github.com/kolo-dl/kolo/internal/launch/flags"
	"github.com/kolo-dl/kolo/internal/launch/layout"
	"github.com/kolo-dl/kolo/internal/launch/proc"
	"github.com/kolo-dl/kolo/internal/observe/relay"
	"github.com/kolo-dl/kolo/internal/observe/report"
	"github.com/kolo-dl/kolo/internal/rendezvous"
	"github.com/kolo-dl/kolo/internal/settings"
	"github.com/kolo-dl/kolo/internal/transport"
)

// Elastic mode, the launcher's half (kolo run --min-np/--max-np/--host-discovery-script).
//
// One event loop owns an elastic.Planner and does what its decisions say: it feeds the planner
// the discovery script's listings, the workers' failed exits (in batches) and the time, stops
// the workers a new generation lost, publishes every world as a jobenv.Round at the rendezvous
// it hosts and starts the generation's newcomers. Survivors are never restarted: they find their
// place, and their new rank, in the next round. The loop also re-forms a round of the same workers
// when every one of them asked for it (jobenv.ReinitKey: an error that killed nobody), and stops
// as stuck the workers that have not asked a while after the others did.

// elasticSettings are the loop's timings and its starter; tests shorten them. Zero fields take
// the defaults.
type elasticSettings struct {
	starter         proc.Starter      // nil: local processes, ssh for other hosts (srun inside a Slurm allocation)
	env             map[string]string // nil: the process's; where a Slurm allocation is read from
	discoverEvery   time.Duration     // pause between runs of the discovery script; 1 s, Horovod's
	discoverTimeout time.Duration     // a discovery run that takes longer failed; 30 s
	tick            time.Duration     // planner ticks and reinit checks; 100 ms
	batch           time.Duration     // failed exits seen within this are reported together; 100 ms
	reinitGrace     time.Duration     // how long after another's request a worker may take to ask for a re-forming; 30 s
	stopGrace       time.Duration     // SIGTERM to SIGKILL when stopping a worker; 3 s
	streamWait      time.Duration     // how long the end waits for the workers' output to end; 5 s

	// No-ssh mode (node.go), static or elastic.
	beat        time.Duration // a joined node's heartbeat interval; 1 s
	nodeSilence time.Duration // a node silent this long has left the job (and the serving node, for it); 10 s
	// stoppingSilence replaces nodeSilence once a static job is being stopped: a live node keeps
	// beating while its ranks stop, and waiting the full silence for a dead one would only delay
	// the end; 3 s.
	stoppingSilence time.Duration
	finishWait      time.Duration // how long the serving node keeps the rendezvous up for the others to read the end; 5 s
}

func (s *elasticSettings) fill() {
	for d, v := range map[*time.Duration]time.Duration{
		&s.discoverEvery: time.Second, &s.discoverTimeout: 30 * time.Second, &s.tick: 100 * time.Millisecond,
		&s.batch: 100 * time.Millisecond, &s.reinitGrace: 30 * time.Second, &s.stopGrace: 3 * time.Second,
		&s.streamWait: 5 * time.Second, &s.beat: time.Second, &s.nodeSilence: 10 * time.Second,
		&s.stoppingSilence: 3 * time.Second, &s.finishWait: 5 * time.Second,
	} {
		if *d <= 0 {
			*d = v
		}
	}
}

// RunElastic runs an elastic job: workers on the hosts the --host-discovery-script lists (or the
// fixed -H/--hostfile hosts), between --min-np and --max-np of them, a new round of the job's
// world published at this process's rendezvous every time they change. It returns the launcher's
// exit code (0 once every worker of the last round has exited 0; 1, or the workers' own code when
// every rank failed; ExitInterrupted; ExitUsage) and an error to print, if any; the failure
// summary is already written to stderr.
func RunElastic(ctx context.Context, opts *flags.Options, stdout, stderr io.Writer) (int, error) {
	return runElastic(ctx, opts, elasticSettings{}, stdout, stderr)
}

func runElastic(ctx context.Context, opts *flags.Options, set elasticSettings, stdout, stderr io.Writer) (code int, err error) {
	set.fill()
	var j *elasticJob
	defer func() {
		var whole *Outcome
		if j != nil { // it ran
			whole = new(j.outcome(code, err, code == ExitInterrupted))
		}
		writeOutcome(opts.OutcomeFile, finalOutcome(code, err, ctx.Err() != nil, whole), stderr)
	}()
	planner, err := elastic.NewPlanner(opts.ElasticConfig())
	if err != nil {
		return ExitUsage, err
	}
	var fixed []elastic.Host
	var slurm *slurmAlloc
	if opts.DiscoveryScript == "" && opts.Hosts == "" && opts.Hostfile == "" && opts.Rendezvous == "" {
		// Inside a Slurm allocation, its nodes are the hosts and srun starts the workers.
		env := set.env
		if env == nil {
			env = jobenv.FromEnviron(os.Environ())
		}
		a, ok, err := slurmAllocation(env, opts.SlotsPerHost)
		if err != nil {
			return ExitUsage, err
		}
		if ok {
			slurm, fixed = &a, a.Hosts
		}
	}
	if opts.DiscoveryScript == "" && slurm == nil {
		if opts.Hosts == "" && opts.Hostfile == "" {
			n, flag := elasticLocalRanks(opts)
			if err := checkOversubscribe(opts, n, flag, runtime.NumCPU()); err != nil {
				return ExitUsage, err
			}
		}
		if fixed, err = fixedElasticHosts(opts); err != nil {
			return ExitUsage, err
		}
	}
	addrs, err := newRendezvousAddrs(opts.NetworkInterface, opts.DiscoveryScript != "", fixed)
	if err != nil {
		return ExitUsage, err
	}
	secret, err := auth.NewSecret()
	if err != nil {
		return 1, err
	}
	srv := rendezvous.NewServer([]byte(secret))
	// A worker whose host stops answering loses its connection, and with it its presence record
	// (jobenv.AliveKey), as soon as its peers' connections give up on it.
	srv.SetLiveness(transport.DeadHostTimeout(progressTimeout(opts)))
	defer srv.Close()
	addrs.lns = newRendezvousListeners(srv, "")
	if addrs.fixed != "" {
		addr, err := addrs.lns.at(addrs.fixed)
		if err != nil {
			return 1, fmt.Errorf("start rendezvous: %w", err)
		}
		if opts.Verbose {
			slog.Info("rendezvous listening", "addr", addr)
		}
	}

	starter, closeGuard := set.localStarter(opts, nil)
	defer closeGuard()
	if local, ok := starter.(proc.LocalStarter); ok && slurm != nil {
		starter = &proc.SlurmStarter{JobID: slurm.JobID, Local: local}
	} else if ok { // other hosts' workers over ssh
		starter = proc.HostStarter{Local: local, Remote: sshStarter(opts)}
	}
	j = newElasticJob(opts, set, planner, srv, starter, secret, NewJobID(), stdout, stderr)
	if slurm != nil {
		j.log("hosts from Slurm job %s's allocation; each worker starts as a job step of its own (srun)", slurm.JobID)
	}
	j.workerRendezvous = func(host string) string { return addrs.dial(host, j.hosts) }
	source := j.discover
	if opts.DiscoveryScript == "" {
		source = fixedHosts(fixed)
	}
	return j.run(ctx, source)
}

func newElasticJob(opts *flags.Options, set elasticSettings, planner *elastic.Planner, srv *rendezvous.Server, starter proc.Starter,
	secret, jobID string, stdout, stderr io.Writer) *elasticJob {
	return &elasticJob{
		opts: opts, set: set, planner: planner, srv: srv, starter: starter,
		secret: secret, jobID: jobID, extra: workerExtraEnv(opts),
		timeout: planner.Config().Timeout,
		out:     proc.NewLineWriter(stdout, opts.Timestamps),
		errw:    proc.NewLineWriter(stderr, opts.Timestamps),
		stdout:  stdout, stderr: stderr,
		procs:   map[elastic.Worker]*elasticProc{},
		rounds:  map[int]jobenv.Round{},
		exits:   make(chan elasticExit),
		started: make(chan struct{}),
	}
}

// hostSource feeds the event loop the hosts available, each listing as it comes, until ctx
// ends: the --host-discovery-script (discover), the fixed -H hosts, or in no-ssh mode the nodes
// that have joined (nodeRegistry.listings). It must not block on anything the loop waits for.
type hostSource func(ctx context.Context, out chan<- discovery)

// localStarter is the settings' starter, else local processes under an orphan guard
// (startGuard), bound per bind; closeGuard closes the guard.
func (s elasticSettings) localStarter(o *flags.Options, bind *proc.Binding) (_ proc.Starter, closeGuard func()) {
	if s.starter != nil {
		return s.starter, func() {}
	}
	guard := startGuard(o.AfterOrphans)
	return proc.LocalStarter{Guard: guard, Bind: bind}, func() { guard.Close() }
}

// workerSupervisor is the one supervisor of the workers of an elastic job, or of a no-ssh node;
// log says when a worker's output outlives it.
func workerSupervisor(o *flags.Options, set elasticSettings, starter proc.Starter, out, errw *proc.LineWriter, log func(string, ...any)) *proc.Supervisor {
	return &proc.Supervisor{Starter: starter, Stdout: out, Stderr: errw, OutputDir: o.OutputDir, AppendFiles: true,
		Plain: o.PlainOutput, Grace: set.stopGrace, StreamWait: set.streamWait,
		HeldOpen: func(c *proc.Child) {
			log("%s has ended, but a process it started still holds its output open; not waiting for it", c.Label)
		}}
}

// fixedHosts lists hosts once.
func fixedHosts(hosts []elastic.Host) hostSource {
	return func(ctx context.Context, out chan<- discovery) {
		select {
		case out <- discovery{at: time.Now(), hosts: hosts}:
		case <-ctx.Done():
		}
	}
}

// progressTimeout is the workers' progress deadline as they will read it: the tuning flags'
// variables, else the launcher's own environment, which workers inherit (either spelling, and
// "60s" as well as "60"); 0: the default (also for a malformed value, which the pre-start check
// has refused already).
func progressTimeout(o *flags.Options) time.Duration {
	d, err := settings.ProgressTimeout.Duration(func(k string) string {
		if v, ok := o.EngineEnv[k]; ok {
			return v
		}
		return os.Getenv(k)
	})
	if err != nil {
		return 0
	}
	return d
}

// fixedElasticHosts are the hosts of an elastic job without a discovery script: -H, --hostfile,
// or this machine with as many slots as the job may use.
func fixedElasticHosts(o *flags.Options) ([]elastic.Host, error) {
	if o.Hosts == "" && o.Hostfile == "" {
		return []elastic.Host{{Name: "localhost", Slots: max(o.NP, o.MinNP, o.MaxNP)}}, nil
	}
	hosts, err := o.ResolveHosts()
	out := make([]elastic.Host, len(hosts))
	for i, h := range hosts {
		out[i] = elastic.Host(h)
	}
	return out, err
}

// elasticJob is the event loop's state. Only the loop's goroutine touches it.
type elasticJob struct {
	opts    *flags.Options
	set     elasticSettings
	planner *elastic.Planner
	srv     *rendezvous.Server
	starter proc.Starter
	secret  string
	jobID   string
	extra   map[string]string
	timeout time.Duration // the planner's, passed to the workers
	// workerRendezvous is the HOST:PORT of the rendezvous the workers of host dial.
	workerRendezvous func(host string) string

	out, errw      *proc.LineWriter
	stdout, stderr io.Writer // the launcher's own, under out and errw
	// started is closed once run has put out and errw under the live view: goroutines that log
	// beside the loop (the no-ssh nodes' poll) start after it.
	started  chan struct{}
	view     *live           // the ranks' reports and failure records, from run on
	startCtx context.Context // what a start waits under (ssh sessions queue per host)

	hosts  []elastic.Host                  // the last discovery
	listed bool                            // a discovery came: the planner is ticked from then on
	round  jobenv.Round                    // the newest round published; Number 0: none yet
	rounds map[int]jobenv.Round            // every round published, by number
	done   *jobenv.Round                   // once finishing: the round the job finished training in
	ended  bool                            // the end record is published (as round.Number+1)
	procs  map[elastic.Worker]*elasticProc // the newest process of each place of the current world
	all    []*elasticProc                  // every process started, for the end
	exits  chan elasticExit                // from the supervisor's waiters; the loop always drains it
	sup    *proc.Supervisor                // owns the worker processes, from run on

	pending     []*elasticProc   // failed exits not yet reported to the planner
	batchC      <-chan time.Time // fires when pending is due
	lastBatch   []*elasticProc   // the last failures reported, for the exit code
	failures    []*elasticProc   // every failure reported, for the summary
	finishing   bool             // a worker of the current round exited 0: the job is ending
	reinitSince time.Time        // when the loop first saw a worker of the current round ask for a re-forming

	lastWait, lastNothing, lastWarning string
	endNote                            string // why the job ended, with the summary when it failed
}

// elasticProc is one worker process: a place, started for one round.
type elasticProc struct {
	place elastic.Worker
	round int // the round it was started for
	rank  int // its rank in that round
	num   int // on a joined node: the number of the order that started it
	child *proc.Child

	exited   bool
	exit     proc.Exit
	record   *report.Failure // the failure record it sent, if any
	stopped  bool            // the launcher stopped it: its exit is expected
	stuck    bool            // killed for not asking for a re-forming
	reported bool            // handed to the planner as failed
	failedAs string          // "rank 1 of round 3", set when reported
}

// String names p in log lines: "host[0] (started for round 2 as rank 1)".
func (p *elasticProc) String() string {
	return fmt.Sprintf("%s (started for round %d as rank %d)", p.place, p.round, p.rank)
}

type elasticExit struct {
	p    *elasticProc
	exit proc.Exit
}

type discovery struct {
	at    time.Time
	hosts []elastic.Host
	err   error
}

// elasticEnd ends the loop: the launcher's exit code and an error to print.
type elasticEnd struct {
	code int
	err  error
}

func (j *elasticJob) run(ctx context.Context, source hostSource) (code int, err error) {
	j.startCtx = ctx
	view, outW, errW, err := startLive(ctx, j.opts, relay.Local{S: j.srv.Store}, j.jobID, 0, j.stdout, j.stderr)
	if err != nil {
		return ExitUsage, err
	}
	j.view = view
	j.out, j.errw = proc.NewLineWriter(outW, j.opts.Timestamps), proc.NewLineWriter(errW, j.opts.Timestamps)
	j.sup = workerSupervisor(j.opts, j.set, j.starter, j.out, j.errw, j.log)
	close(j.started)
	defer func() {
		view.stop()
		failure := ""
		if code != 0 && code != ExitInterrupted {
			failure = "the elastic job failed"
			if err != nil {
				failure = err.Error()
			}
		}
		view.end(failure, j.opts.OutputDir)
	}()
	dctx, cancel := context.WithCancel(ctx)
	var discoverer sync.WaitGroup
	discoveries := make(chan discovery)
	defer func() {
		cancel()
		discoverer.Wait()
		// Workers stopped without waiting (a reset's released ones) may still run: their
		// exits are the last the loop drains.
		j.stopAndAwait(j.all)
		j.sup.Close()
	}()
	discoverer.Go(func() { source(dctx, discoveries) })

	ticker := time.NewTicker(j.set.tick)
	defer ticker.Stop()
	for {
		var o *elasticEnd
		select {
		case <-ctx.Done():
			o = j.interrupted()
		case e := <-j.exits:
			j.onExit(e)
		case d := <-discoveries:
			if !j.finishing {
				o = j.discovered(d)
			}
		case <-j.batchC:
			j.batchC = nil
			if ctx.Err() == nil {
				o = j.reportFailures(time.Now())
			}
		case now := <-ticker.C:
			if !j.finishing && j.listed {
				if o = j.act(j.planner.Tick(now)); o == nil {
					o = j.checkReinit(now)
				}
			}
		}
		if o == nil && j.succeeded() {
			j.log("every worker of round %d exited 0: the job is done", j.last().Number)
			o = &elasticEnd{}
		}
		if o != nil {
			return o.code, o.err
		}
	}
}

func (j *elasticJob) discovered(d discovery) *elasticEnd {
	j.listed = true
	if d.err != nil {
		return j.act(j.planner.DiscoveryFailed(d.at, d.err))
	}
	j.hosts = d.hosts
	j.lastWarning = "" // a later failure is news again
	return j.act(j.planner.Discovered(d.at, d.hosts))
}

// act logs a decision and carries it out.
func (j *elasticJob) act(d elastic.Decision) *elasticEnd {
	if !d.Discovery.Empty() {
		j.log("hosts: %s", d.Discovery)
	}
	if d.Warning != "" && d.Warning != j.lastWarning {
		j.log("%s", d.Warning)
		j.lastWarning = d.Warning
	}
	if d.Action != elastic.Wait {
		j.lastWait = ""
	}
	switch d.Action {
	case elastic.Nothing:
		if j.opts.Verbose && d.Reason != j.lastNothing {
			j.log("%s", d.Reason)
		}
		j.lastNothing = d.Reason
	case elastic.Wait:
		// The reason counts the seconds waited: log it when what the job waits for changes.
		what, _, _ := strings.Cut(d.Reason, "; waited ")
		if what != j.lastWait {
			j.log("waiting: %s (the job fails at %s)", d.Reason, d.Deadline.Format("15:04:05"))
		}
		j.lastWait = what
	case elastic.Reset:
		j.lastNothing = ""
		return j.reset(d)
	case elastic.Fail:
		code := 1
		if errors.Is(d.Err, elastic.ErrAllFailed) && len(j.lastBatch) > 0 {
			code = 0 // from the exits, once they are in
		}
		return j.fail(d.Reason, code)
	}
	return nil
}

// reset moves the job to the decision's generation: stop before start, since a slot can be lost
// and restarted in one reset, and a lost worker still running must not join the new round at
// its old place.
func (j *elasticJob) reset(d elastic.Decision) *elasticEnd {
	lost := map[elastic.Worker]bool{}
	var stop []*elasticProc
	for _, l := range d.Lost {
		lost[l.Worker] = true
		if p := j.procs[l.Worker]; p != nil {
			stop = append(stop, p)
		}
	}
	for _, w := range d.Start {
		if p := j.procs[w]; p != nil && !lost[w] {
			stop = append(stop, p) // never expected: a newcomer's place is free
		}
	}
	// Only a place of the new world can be claimed by its old worker: the rest are stopped
	// without waiting for them (a cut-off host's workers cannot even be told).
	n := j.round.Number + 1
	r := jobenv.Round{Number: n, Generation: d.World.Number}
	inWorld := map[elastic.Worker]bool{}
	for _, k := range d.World.Ranks {
		inWorld[k.Worker] = true
		r.Ranks = append(r.Ranks, jobenv.RoundRank{Place: jobenv.Place(k.Worker),
			LocalRank: k.LocalRank, LocalSize: k.LocalSize, CrossRank: k.CrossRank, CrossSize: k.CrossSize})
	}
	var await, release []*elasticProc
	for _, p := range stop {
		if inWorld[p.place] {
			await = append(await, p)
		} else {
			release = append(release, p)
		}
	}
	j.stopAndAwait(await)
	stopping(release)
	keep := j.pending[:0]
	for _, p := range j.pending {
		if lost[p.place] {
			// Failed on its own, but the new world does without it already.
			p.reported, p.failedAs = true, j.placeIn(p.place)
			j.failures = append(j.failures, p)
			continue
		}
		keep = append(keep, p)
	}
	j.pending = keep
	for w := range lost {
		delete(j.procs, w)
	}
	if err := j.publish(r); err != nil {
		return j.fail(err.Error(), 1)
	}
	j.log("round %d: %s", n, d.Reason)
	j.reinitSince = time.Time{}
	if j.startCtx.Err() != nil {
		return nil // interrupted while stopping the lost workers: the loop ends the job
	}
	j.start(d.World, d.Start)
	return nil
}

// publish makes r the newest round: the pointer to it first, then its record.
func (j *elasticJob) publish(r jobenv.Round) error {
	// The pointer first: whoever sees round n then finds "latest" at n or later. A reader that
	// follows the pointer before the round is there waits for it (a Get), which is harmless.
	if err := j.srv.Set(jobenv.LatestRoundKey, []byte(strconv.Itoa(r.Number))); err != nil {
		return fmt.Errorf("publish round %d: %w", r.Number, err)
	}
	if err := j.srv.Set(jobenv.RoundKey(r.Number), r.Encode()); err != nil {
		return fmt.Errorf("publish round %d: %w", r.Number, err)
	}
	if r.End == "" {
		if j.view != nil {
			j.view.setWorld(r.JobID(j.jobID), len(r.Ranks))
		}
		j.round = r
		j.rounds[r.Number] = r
	} else {
		j.ended = true
	}
	return nil
}

// start starts the newcomers of world, all at once (ssh sessions take a while each). A worker
// that cannot be started counts as one that failed.
func (j *elasticJob) start(world *elastic.Generation, newcomers []elastic.Worker) {
	ranks := make(map[elastic.Worker]elastic.Rank, len(world.Ranks))
	for _, r := range world.Ranks {
		ranks[r.Worker] = r
	}
	procs := make([]*elasticProc, len(newcomers))
	errs := make([]error, len(newcomers))
	var starting sync.WaitGroup
	for i, w := range newcomers {
		r := ranks[w]
		s := layout.Slot{Rank: r.Rank, Size: r.Size, Host: w.Host, LocalRank: r.LocalRank, LocalSize: r.LocalSize,
			CrossRank: r.CrossRank, CrossSize: r.CrossSize}
		p := &elasticProc{place: w, round: j.round.Number, rank: r.Rank}
		procs[i] = p
		worker := proc.Worker{Slot: s, Argv: j.opts.Command, Env: j.workerEnv(s, w)}
		starting.Go(func() {
			p.child, errs[i] = j.sup.Start(j.startCtx, worker, w.String(), w.String(), func(e proc.Exit) {
				j.exits <- elasticExit{p, e} // the loop drains exits until every worker has ended
			})
		})
	}
	starting.Wait()
	for i, p := range procs {
		j.procs[p.place] = p
		j.all = append(j.all, p)
		if errs[i] != nil {
			j.onExit(elasticExit{p, proc.Exit{Code: -1, Err: fmt.Errorf("start %s: %w", p.place, errs[i])}})
			continue
		}
		if j.opts.Verbose {
			j.log("started %s for round %d as rank %d", p.place, p.round, p.rank)
		}
	}
}

// workerEnv is WorkerEnv of the worker's first round plus its place in the elastic job.
func (j *elasticJob) workerEnv(s layout.Slot, w elastic.Worker) []string {
	return elasticWorkerEnv(s, w.Slot, j.round.Number, j.timeout, j.workerRendezvous(w.Host), j.jobID, j.secret, j.extra, j.opts.Env)
}

// elasticWorkerEnv is the environment of a worker of an elastic job started for round at slot
// of host s.Host (s: its numbers in that round): WorkerEnv and the place (internal/jobenv/elastic.go).
func elasticWorkerEnv(s layout.Slot, slot, round int, timeout time.Duration, rv, jobID, secret string, extra map[string]string, forward []string) []string {
	env := WorkerEnv(s, rv, jobID, secret, extra, forward)
	return append(env,
		jobenv.Elastic+"=1",
		jobenv.ElasticHost+"="+s.Host,
		jobenv.ElasticSlot+"="+strconv.Itoa(slot),
		jobenv.ElasticRound+"="+strconv.Itoa(round),
		jobenv.ElasticTimeout+"="+strconv.FormatFloat(timeout.Seconds(), 'f', -1, 64),
	)
}

// onExit records a worker's end. A failure the launcher did not cause waits in pending, so that
// the failures of one event reach the planner together.
func (j *elasticJob) onExit(e elasticExit) {
	p := e.p
	p.exited, p.exit = true, e.exit
	switch {
	case p.stopped || p.reported:
		if j.opts.Verbose {
			j.log("%s stopped: %s", p.place, e.exit)
		}
	case errors.Is(e.exit.Err, errNodeLeft) && !j.finishing:
		// No-ssh mode: the listing without its node, which follows, makes the next round.
		j.log("%s: %s", p, e.exit)
	case e.exit.Failed():
		reported := ""
		if p.record = j.failureRecord(p); p.record != nil {
			reported = fmt.Sprintf(": rank %d of round %d reported %s", p.record.Rank, p.record.Round, p.record)
		}
		j.log("%s %s%s", p, e.exit, reported)
		j.pending = append(j.pending, p)
		if j.batchC == nil {
			j.batchC = time.After(j.set.batch)
		}
	default:
		if j.opts.Verbose {
			j.log("%s exited 0", p.place)
		}
		if j.procs[p.place] == p && !j.finishing {
			j.finishing = true // no new round: the job ends with this one
			j.finishedIn(p)
		}
	}
}

// failureRecord is the failure record p sent before it exited, if any: one of a round it joined,
// not one an earlier worker at its place left.
func (j *elasticJob) failureRecord(p *elasticProc) *report.Failure {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	f, ok, err := relay.Failure(ctx, relay.Local{S: j.srv.Store}, j.jobID, jobenv.Place(p.place).String())
	if err != nil {
		slog.Debug("kolo run: failure record", "place", p.place, "err", err)
	}
	if !ok || f.Round < p.round {
		return nil
	}
	return &f
}

// finishedIn settles, at the first worker to exit 0, which round the job finished training in:
// the last one that worker joined. Every worker of that round must exit 0 too; workers started
// for a later round (a host that joined, or came back, as the others finished) wait for a round
// that can no longer form, and are stopped: they are not failures.
func (j *elasticJob) finishedIn(p *elasticProc) {
	for n := j.round.Number; n >= 1; n-- {
		r, ok := j.rounds[n]
		if !ok {
			continue
		}
		if !stored(j.srv, jobenv.JoinedKey(n, jobenv.Place(p.place))) {
			continue
		}
		j.done = &r
		in := map[elastic.Worker]bool{}
		for _, k := range r.Ranks {
			in[elastic.Worker(k.Place)] = true
		}
		var idle []*elasticProc
		for w, q := range j.procs {
			if !in[w] && !q.exited && !q.stopped {
				idle = append(idle, q)
			}
		}
		if len(idle) > 0 {
			j.log("training finished in round %d; %s, started for a later round, stopped", n, elasticPlaces(idle))
			j.stopAndAwait(idle)
		}
		return
	}
}

// reportFailures hands the planner the failed exits collected so far, as one event.
func (j *elasticJob) reportFailures(now time.Time) *elasticEnd {
	batch := j.pending
	j.pending = nil
	ws := j.blame(batch)
	switch {
	case len(ws) == 0:
		return nil
	case j.finishing:
		return j.fail(fmt.Sprintf("%s failed after other workers had finished", elasticPlaces(batch)), batch[0].exit.ShellCode())
	}
	return j.act(j.planner.Failed(now, ws...))
}

// blame makes ps the last failures reported (lastBatch) and returns their places for the planner.
func (j *elasticJob) blame(ps []*elasticProc) []elastic.Worker {
	j.lastBatch = append(j.lastBatch[:0], ps...)
	ws := make([]elastic.Worker, len(ps))
	for i, p := range ps {
		p.reported, p.failedAs = true, j.placeIn(p.place)
		j.failures = append(j.failures, p)
		ws[i] = p.place
	}
	return ws
}

// checkReinit re-forms the current round when all its workers ask for it, and stops as stuck those
// that have not asked reinitGrace after another did. It looks only at rounds whose every worker
// runs: when one is gone, the planner decides.
func (j *elasticJob) checkReinit(now time.Time) *elasticEnd {
	n := j.round.Number
	if n == 0 || j.ended {
		return nil
	}
	asked := 0
	var waiting []*elasticProc
	suspect := map[jobenv.Place]bool{} // named stuck by a worker that asked
	for _, k := range j.round.Ranks {
		p := j.procs[elastic.Worker(k.Place)]
		if p == nil || p.exited || p.reported || p.stopped {
			j.reinitSince = time.Time{}
			return nil
		}
		v, ok, err := j.srv.TryGet(jobenv.ReinitKey(n, k.Place))
		if err != nil {
			return nil
		}
		if !ok {
			waiting = append(waiting, p)
			continue
		}
		asked++
		names, err := jobenv.DecodeReinit(v)
		if err != nil {
			j.log("%s asked for a new round with a bad record: %v", k.Place, err)
		}
		for _, s := range names {
			suspect[s] = true
		}
	}
	// A worker its peers found stuck (a progress deadline: stopped, cut off) will not ask: it
	// is stopped now rather than after the grace, unless it left the round on purpose (a peer
	// names the worker whose closed connections cut its call, and a worker says that it left
	// before it closes them: read again now, after the records that name it). So is one that
	// joined the round and can no longer be reached (its presence record went with its
	// connection), once another asked: not before, since a launcher cut off from every worker
	// for a while must not end a job that trains on without it. Others that have not asked get
	// the grace.
	var named, unreachable []*elasticProc
	for _, p := range waiting {
		pl := jobenv.Place(p.place)
		switch {
		case suspect[pl] && !j.left(n, pl):
			named = append(named, p)
		case asked > 0 && j.unreachable(n, pl):
			unreachable = append(unreachable, p)
		}
	}
	if len(named) > 0 {
		return j.stopStuck(now, named, fmt.Sprintf("found stuck by the other workers of round %d (they passed their progress deadline waiting on it)", n))
	}
	if len(unreachable) > 0 {
		return j.stopStuck(now, unreachable, fmt.Sprintf("joined round %d but can no longer be reached (its connection to the launcher is gone: its host is down or cut off)", n))
	}
	switch {
	case asked == 0:
		j.reinitSince = time.Time{}
		return nil
	case len(waiting) == 0:
		next := j.round
		next.Number = n + 1
		if err := j.publish(next); err != nil {
			return j.fail(err.Error(), 1)
		}
		j.reinitSince = time.Time{}
		j.log("round %d: the same %d workers as round %d (generation %d), which every one of them asked for after an error",
			next.Number, len(next.Ranks), n, next.Generation)
		return nil
	case j.reinitSince.IsZero():
		j.reinitSince = now
		if j.opts.Verbose {
			j.log("%d of round %d's %d workers asked for a new round", asked, n, len(j.round.Ranks))
		}
		return nil
	case now.Sub(j.reinitSince) < j.set.reinitGrace:
		return nil
	}
	return j.stopStuck(now, waiting, fmt.Sprintf("did not ask for a new round within %s of the other workers of round %d", j.set.reinitGrace, n))
}

// left reports whether the worker at pl said that it left round n on purpose: it asked for the
// next round, or left without an error (jobenv.LeftKey).
func (j *elasticJob) left(n int, pl jobenv.Place) bool {
	return stored(j.srv, jobenv.ReinitKey(n, pl)) || stored(j.srv, jobenv.LeftKey(n, pl))
}

// unreachable reports whether the worker at pl joined round n and has lost its presence record.
func (j *elasticJob) unreachable(n int, pl jobenv.Place) bool {
	if !stored(j.srv, jobenv.JoinedKey(n, pl)) {
		return false
	}
	_, alive, err := j.srv.TryGet(jobenv.AliveKey(pl))
	return err == nil && !alive
}

// stopStuck kills workers of the round that will not move to the next one and reports them to
// the planner as failed.
func (j *elasticJob) stopStuck(now time.Time, stuck []*elasticProc, why string) *elasticEnd {
	for _, p := range stuck {
		p.stuck = true
		p.child.Kill()
	}
	j.reinitSince = time.Time{}
	j.log("%s %s: stopped as stuck", elasticPlaces(stuck), why)
	return j.act(j.planner.Failed(now, j.blame(stuck)...))
}

// last is the round the job finished training in, once settled (done), else the newest.
func (j *elasticJob) last() jobenv.Round {
	if j.done != nil {
		return *j.done
	}
	return j.round
}

// succeeded reports whether the job is done: every worker of its last round exited 0.
func (j *elasticJob) succeeded() bool {
	if !j.finishing || j.round.Number == 0 || len(j.pending) > 0 {
		return false
	}
	for _, k := range j.last().Ranks {
		p := j.procs[elastic.Worker(k.Place)]
		if p == nil || !p.exited || p.stopped || p.exit.Failed() {
			return false
		}
	}
	return true
}

// fail ends the job: the end record for workers waiting for a round, every worker stopped, the
// summary. code 0 takes the code of the last failures reported (every rank failed).
func (j *elasticJob) fail(reason string, code int) *elasticEnd {
	j.end(reason)
	// The summary quotes the failed workers' last stderr lines: let their output end first.
	late := make(chan struct{})
	defer time.AfterFunc(time.Second, func() { close(late) }).Stop()
	for _, p := range j.failures {
		select {
		case <-p.child.Drained():
		case <-late:
		}
	}
	if code == 0 && len(j.lastBatch) > 0 {
		code = j.lastBatch[0].exit.ShellCode()
	}
	if code == 0 {
		code = 1
	}
	j.endNote = j.summary(reason)
	j.errw.WriteBlock(j.endNote)
	return &elasticEnd{code: code}
}

func (j *elasticJob) interrupted() *elasticEnd {
	j.endNote = "kolo run: elastic: the job was interrupted: stopped every worker"
	j.end("kolo run was interrupted")
	return &elasticEnd{code: ExitInterrupted, err: errors.New("interrupted: stopped every worker")}
}

// end publishes the end record, reason, for workers waiting for a round, and stops every worker.
func (j *elasticJob) end(reason string) {
	if err := j.publish(jobenv.Round{Number: j.round.Number + 1, End: reason}); err != nil {
		slog.Warn("cannot publish the end of the job", "err", err)
	}
	j.stopAndAwait(j.all)
}

// stopping stops the workers of ps that still run and were not stopped yet (StopSignal; the
// supervisor kills them stopGrace later; one killed as stuck has had its SIGKILL), and returns
// those that still run. Those the caller does not await are drained at the end of the job.
func stopping(ps []*elasticProc) []*elasticProc {
	var running []*elasticProc
	for _, p := range ps {
		if p.exited || p.child == nil {
			continue
		}
		if !p.stopped && !p.stuck {
			p.stopped = true
			p.child.Stop(proc.StopSignal)
		}
		running = append(running, p)
	}
	return running
}

// stopAndAwait stops the workers of ps that still run and waits for their exits, recording every
// other exit that arrives meanwhile.
func (j *elasticJob) stopAndAwait(ps []*elasticProc) {
	for _, p := range stopping(ps) {
		for !p.exited {
			j.onExit(<-j.exits)
		}
	}
}

// placeIn names a place by its rank in the current round, for the summary.
func (j *elasticJob) placeIn(w elastic.Worker) string {
	for i, k := range j.round.Ranks {
		if k.Host == w.Host && k.Slot == w.Slot {
			return fmt.Sprintf("rank %d of round %d", i, j.round.Number)
		}
	}
	return "in no round"
}

// summary is the report of a failed job: why, then the workers that failed (the last few) with
// how they ended and their last stderr lines, then how the others ended.
func (j *elasticJob) summary(reason string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "kolo run: elastic: the job failed: %s\n", reason)
	const shown = 8
	failed := j.failures
	if len(failed) > shown {
		fmt.Fprintf(&b, "kolo run: %d earlier worker failures not shown\n", len(failed)-shown)
		failed = failed[len(failed)-shown:]
	}
	isFailed := map[*elasticProc]bool{}
	for _, p := range failed {
		isFailed[p] = true
		how := p.exit.String()
		if p.stuck {
			how = "was stopped as stuck (" + how + ")"
		}
		fmt.Fprintf(&b, "kolo run: %s (%s) %s.\n", p.place, p.failedAs, how)
		if p.record != nil {
			fmt.Fprintf(&b, "%s reported (rank %d of round %d): %s\n", p.place, p.record.Rank, p.record.Round, p.record)
		}
		if tail := p.child.Tail(0); len(tail) > 0 {
			fmt.Fprintf(&b, "Last lines of %s's stderr:\n", p.place)
			for _, l := range tail {
				fmt.Fprintf(&b, "    %s\n", l)
			}
		}
	}
	var others []string
	for _, k := range j.round.Ranks {
		p := j.procs[elastic.Worker(k.Place)]
		if p == nil || isFailed[p] {
			continue
		}
		how := p.exit.String()
		if p.stopped {
			how = "stopped by the launcher (" + how + ")"
		}
		others = append(others, fmt.Sprintf("%s: %s", p.place, how))
	}
	if len(others) > 0 {
		fmt.Fprintf(&b, "Other workers: %s\n", strings.Join(others, "; "))
	}
	return b.String()
}

// log writes a "kolo run: elastic:" line to stderr, between the workers' lines.
func (j *elasticJob) log(format string, args ...any) {
	j.errw.WriteLine("", "kolo run: elastic: "+fmt.Sprintf(format, args...)+"\n")
}

func elasticPlaces(ps []*elasticProc) string {
	s := make([]string, len(ps))
	for i, p := range ps {
		s[i] = p.place.String()
	}
	return strings.Join(s, ", ")
}
