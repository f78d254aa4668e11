package launch

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"os"
	"runtime"
	"slices"
	"strings"
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
)

// Exit codes of kolo run other than a failing rank's own.
const (
	ExitUsage       = 2   // bad flags or an impossible plan
	ExitInterrupted = 130 // Ctrl-C (or SIGTERM): every rank was stopped
)

// RunHosts runs the job of -np/-H/--hostfile: ranks of this machine as child processes, ranks of
// other hosts over ssh (after checking every host answers, within --start-timeout), all meeting at
// a rendezvous served from this process. It returns the launcher's exit code (0, the first failing
// rank's, ExitInterrupted, ExitUsage, or 1) and an error to print, if any; the failure summary is
// already written to stderr, and the outcome to --outcome-file.
func RunHosts(ctx context.Context, opts *flags.Options, stdout, stderr io.Writer) (code int, err error) {
	var ran staticRan
	defer func() { writeOutcome(opts.OutcomeFile, ran.outcome(code, err, ctx.Err() != nil), stderr) }()
	hosts, err := opts.ResolveHosts()
	if err != nil {
		return ExitUsage, err
	}
	np := opts.NP
	if np == 0 {
		for _, h := range hosts {
			np += h.Slots
		}
	}
	if opts.Hosts == "" && opts.Hostfile == "" {
		if err := checkOversubscribe(opts, np, "-np", runtime.NumCPU()); err != nil {
			return ExitUsage, err
		}
	}
	slots, err := layout.Plan(hosts, np)
	if err != nil {
		return ExitUsage, err
	}
	var remote []string
	seen := map[string]bool{}
	for _, s := range slots {
		if !seen[s.Host] && !layout.IsLocal(s.Host) {
			remote = append(remote, s.Host)
		}
		seen[s.Host] = true
	}
	if opts.BindTo == flags.BindCore && len(remote) > 0 {
		return ExitUsage, fmt.Errorf("--bind-to core binds the ranks kolo run starts on its own machine, not those it starts over ssh (on %s): run kolo run on every node with --rendezvous (no-ssh mode), which binds each node's ranks, or drop --bind-to", strings.Join(remote, ", "))
	}
	var bind *proc.Binding
	if opts.BindTo == flags.BindCore {
		// Every slot is local here. Plan counts local ranks per host name, so two names for this
		// machine (localhost and its hostname) would give two ranks the same CPUs.
		if len(seen) > 1 {
			names := slices.Sorted(maps.Keys(seen))
			return ExitUsage, fmt.Errorf("--bind-to core: the ranks of this machine are under %d host names (%s): give them under one", len(names), strings.Join(names, ", "))
		}
		if bind, err = proc.NewBinding(len(slots), opts.BindOverload); err != nil {
			return ExitUsage, err
		}
	}
	// A job all on this machine meets at Unix sockets (listenOneHost); any other over TCP.
	oneHost := len(remote) == 0 && opts.NetworkInterface == ""
	advertise := map[string]string{} // by host: the IP its workers dial the rendezvous at
	if !oneHost {
		others := make([]elastic.Host, len(remote))
		for i, h := range remote {
			others[i].Name = h
		}
		addrs, err := newRendezvousAddrs(opts.NetworkInterface, false, others)
		if err != nil {
			return ExitUsage, err
		}
		for h := range seen {
			advertise[h] = addrs.ip(h, others)
		}
	}

	ssh := sshStarter(opts)
	if len(remote) > 0 {
		if opts.Verbose {
			slog.Info("checking ssh to every host", "hosts", remote)
		}
		cctx, cancel := context.WithTimeout(ctx, opts.StartTimeout)
		err := ssh.Check(cctx, remote)
		cancel()
		if err != nil {
			if ctx.Err() != nil {
				return ExitInterrupted, errors.New("interrupted while checking ssh to the hosts")
			}
			return 1, fmt.Errorf("cannot start ranks over ssh:\n%w", err)
		}
	}

	secret, err := auth.NewSecret()
	if err != nil {
		return 1, err
	}
	srv := rendezvous.NewServer([]byte(secret))
	defer srv.Close()
	guard := startGuard(opts.AfterOrphans)
	defer guard.Close()
	workerRV := map[string]string{} // by host: the rendezvous address its workers dial
	if oneHost {
		// The guard learns the directory before it exists: a launcher killed at any moment
		// of start-up leaves nothing in TMPDIR.
		sock, dir, err := listenOneHost(srv, guard.RemoveAfterOrphans)
		if err != nil {
			return 1, fmt.Errorf("start rendezvous: %w", err)
		}
		defer os.RemoveAll(dir)
		for _, s := range slots {
			workerRV[s.Host] = sock
		}
	} else {
		rvAddr, err := newRendezvousListeners(srv, "").atAll(slices.Collect(maps.Values(advertise)))
		if err != nil {
			return 1, fmt.Errorf("start rendezvous: %w", err)
		}
		for h, ip := range advertise {
			workerRV[h] = rvAddr[ip]
		}
	}
	if opts.Verbose {
		slog.Info("rendezvous listening", "addrs", slices.Compact(slices.Sorted(maps.Values(workerRV))), "ranks", np, "hosts", len(seen))
		// What start-up (and the job's later rendezvous use) cost the server: bench/scaling.py
		// reads it for its table.
		defer func() { slog.Info("rendezvous served", "requests", srv.Requests(), "ranks", np) }()
	}
	extra := workerExtraEnv(opts)
	jobID := NewJobID()
	workers := make([]proc.Worker, len(slots))
	for i, s := range slots {
		workers[i] = proc.Worker{Slot: s, Argv: opts.Command, Env: WorkerEnv(s, workerRV[s.Host], jobID, secret, extra, opts.Env)}
	}
	return runStatic(ctx, opts, staticRun{
		workers: workers, store: relay.Local{S: srv.Store}, jobID: jobID, ran: &ran,
		starter: proc.HostStarter{Local: proc.LocalStarter{Guard: guard, Bind: bind}, Remote: ssh},
	}, stdout, stderr)
}

// staticRun is a static job's ranks, every one started once, and what runStatic needs to run them.
type staticRun struct {
	workers   []proc.Worker
	starter   proc.Starter
	store     relay.Store // where the ranks' reports arrive: the rendezvous this launcher serves
	jobID     string
	onFailure func() // when set, told when the first rank to fail stops the others
	// end, when set, gets a copy of what the job's end prints: the node serving a no-ssh job sends
	// it to every node, and names itself (host) as where the flight-recorder file is.
	end  io.Writer
	host string
	ran  *staticRan // gets how the ranks ended, for the outcome file
}

// staticRan is how a static job's ranks ended, for its outcome (first nil: none failed).
type staticRan struct {
	results []proc.Result
	first   *proc.Result
	records map[int]report.Failure
}

func (r *staticRan) outcome(code int, err error, interrupted bool) Outcome {
	return staticOutcome(code, err, interrupted, r.results, r.first, r.records)
}

// jobStop is why a static job was stopped before its ranks ended (the cause of its context): the
// exit code, and what to say.
type jobStop struct {
	code int
	why  string
}

func (s jobStop) Error() string { return s.why }

// runStatic runs the ranks of a static job (RunHosts, and the node serving a no-ssh job): the
// first to fail stops the others, and so does ctx ending. It prints the summary of the rank the
// failure traces back to and returns the job's exit code and an error to print, if any: ctx's
// cause when it is a jobStop, else, when ctx ended, that the job was interrupted.
func runStatic(ctx context.Context, opts *flags.Options, r staticRun, stdout, stderr io.Writer) (int, error) {
	size := len(r.workers)
	view, rankOut, rankErr, err := startLive(ctx, opts, r.store, r.jobID, size, stdout, stderr)
	if err != nil {
		return ExitUsage, err
	}
	report := stderr
	if r.end != nil {
		report = io.MultiWriter(stderr, r.end)
		view.stderr, view.flightHost = report, r.host
	}
	runner := &proc.Runner{
		Starter:    r.starter,
		Stdout:     rankOut,
		Stderr:     rankErr,
		OutputDir:  opts.OutputDir,
		Timestamps: opts.Timestamps,
		Plain:      opts.PlainOutput,
	}
	if r.onFailure != nil {
		runner.OnFailure = func(proc.Result) { r.onFailure() }
	}
	results, _ := runner.Run(ctx, r.workers)
	view.stop()
	var stop jobStop
	if ctx.Err() != nil && !errors.As(context.Cause(ctx), &stop) {
		stop = jobStop{code: ExitInterrupted, why: "interrupted: stopped every rank"}
	}
	r.ran.results = results
	if first := firstFailure(ctx, results); first != nil {
		records := view.failures(size)
		code := failureCode(first)
		first = proc.Blame(results, first, records)
		r.ran.first, r.ran.records = first, records
		fmt.Fprint(report, proc.Summary(results, first, records))
		view.end(fmt.Sprintf("rank %d on %s: %s", first.Slot.Rank, first.Slot.Host, first.Exit), opts.OutputDir)
		if stop.code != 0 && stop.code != ExitInterrupted {
			return failureCode(first, code), stop // what else went wrong: a node lost
		}
		return failureCode(first, code), nil
	}
	view.end("", "")
	if stop.code != 0 {
		return stop.code, stop
	}
	return 0, nil
}

// firstFailure is the first rank to fail on its own: the earliest end among the ranks that
// failed and were not stopped. A rank that was still waiting to start when ctx ended, or whose
// node left the job, did not fail.
func firstFailure(ctx context.Context, results []proc.Result) *proc.Result {
	var first *proc.Result
	for i := range results {
		r := &results[i]
		switch {
		case !r.Exit.Failed() || r.Stopped || errors.Is(r.Exit.Err, errNodeLeft):
		case ctx.Err() != nil && errors.Is(r.Exit.Err, ctx.Err()):
		case first == nil || r.Ended.Before(first.Ended):
			first = r
		}
	}
	return first
}

// failureCode is the exit code of a job whose failure traces back to cause: cause's own, or, when
// cause exited 0 (it ended while the others needed it), the first of fallback that is not 0, else 1.
func failureCode(cause *proc.Result, fallback ...int) int {
	if c := cause.Exit.ShellCode(); c != 0 {
		return c
	}
	for _, c := range fallback {
		if c != 0 {
			return c
		}
	}
	return 1
}

// workerExtraEnv is the engine tuning of opts plus the network interface workers must use.
func workerExtraEnv(opts *flags.Options) map[string]string {
	extra := map[string]string{}
	maps.Copy(extra, opts.EngineEnv)
	if opts.NetworkInterface != "" {
		extra[jobenv.NetworkInterface] = opts.NetworkInterface
	}
	return extra
}

// connectTimeout leaves ssh room to say why it failed before --start-timeout ends the check.
func connectTimeout(start time.Duration) time.Duration {
	return max(time.Second, start-time.Second)
}

// sshStarter starts the ranks of other hosts over ssh, as the flags say.
func sshStarter(opts *flags.Options) *proc.SSHStarter {
	return &proc.SSHStarter{
		Port: opts.SSHPort, IdentityFile: opts.SSHIdentityFile, Options: opts.SSHOptions,
		ConnectTimeout: connectTimeout(opts.StartTimeout), Forward: opts.Env,
	}
}

// startGuard starts an OrphanGuard that runs then after it killed the ranks of a launcher that
// died, or returns nil (no guard) where sh cannot be started.
func startGuard(then []string) *proc.OrphanGuard {
	g, err := proc.StartOrphanGuard(then...)
	if err != nil {
		slog.Warn("ranks' children may outlive a killed launcher", "err", err)
		return nil
	}
	return g
}
