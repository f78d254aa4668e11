// Package proc starts, supervises and stops the processes of kolo run's ranks: a Starter starts a
// Worker locally (its own process group, an orphan guard, optionally bound to cores), over ssh (a
// small sh wrapper, no kolo needed on the host) or as a Slurm job step (srun); a Runner streams
// the ranks' output with rank prefixes, stops every rank when one fails, and names the rank the
// failure traces back to (Blame, Summary). It must not plan ranks, host a rendezvous or know what
// a job is (static, no-ssh, elastic): those are launch's; a Starter gets a complete Worker and
// only runs it.
package proc

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/kolo-dl/kolo/launch/layout"
)

// Worker is one process to start for one rank.
type Worker struct {
	Slot layout.Slot
	Argv []string // program and its arguments, untouched
	Env  []string // complete environment ("K=V"), including the job contract and the secret
	Dir  string   // working directory ("" = the launcher's)
}

// Process is a started worker. Starters other than the local one (ssh) return their own.
type Process interface {
	Stdout() io.Reader
	Stderr() io.Reader
	// Wait blocks until the process ends and returns its exit status.
	Wait() Exit
	// Signal delivers sig to the worker and everything it started.
	Signal(sig syscall.Signal) error
}

// Starter starts a Worker somewhere (locally, over ssh, ...).
type Starter interface {
	Start(ctx context.Context, w Worker) (Process, error)
}

// Exit describes how a worker ended.
type Exit struct {
	Code   int            // exit code; -1 when killed by a signal or never started
	Signal syscall.Signal // non-zero when killed by a signal
	Err    error          // the process could not be started or waited for
}

// Failed reports whether the worker ended unsuccessfully.
func (e Exit) Failed() bool { return e.Code != 0 || e.Signal != 0 || e.Err != nil }

// ShellCode is the exit status a shell would report: the code, or 128+signal.
func (e Exit) ShellCode() int {
	switch {
	case e.Signal != 0:
		return 128 + int(e.Signal)
	case e.Code > 0:
		return e.Code
	case e.Err != nil || e.Code < 0:
		return 1
	}
	return 0
}

func (e Exit) String() string {
	switch {
	case e.Err != nil:
		return e.Err.Error()
	case e.Signal != 0:
		return fmt.Sprintf("killed by signal %d (%v)", int(e.Signal), e.Signal)
	}
	return fmt.Sprintf("exited with code %d", e.Code)
}

// Result is the outcome of one rank.
type Result struct {
	Slot       layout.Slot
	Exit       Exit
	StderrTail []string // last lines the rank wrote to stderr
	Ended      time.Time
	Stopped    bool // the runner stopped it because another rank failed or the job was cancelled
}

// Runner starts workers, streams their output and stops them all when one fails.
type Runner struct {
	Starter     Starter
	Stdout      io.Writer     // prefixed stdout of every rank
	Stderr      io.Writer     // prefixed stderr of every rank
	GracePeriod time.Duration // between SIGTERM and SIGKILL when stopping; default 3 s
	OutputDir   string        // if set, also write rank.N/stdout and rank.N/stderr there
	Timestamps  bool          // prefix each line with the time
	TailLines   int           // stderr lines kept per rank for the summary; default 20
	Plain       bool          // no rank prefix on output lines (kolo bench prints rank 0's table)
	// OnFailure, if set, is called once, in its own goroutine, with the first failing rank as soon as
	// it has ended (its StderrTail holds what it wrote before ending): a multi-node launcher uses it
	// to tell the other nodes to stop without waiting for this node's ranks to wind down. Run does
	// not return before OnFailure has.
	OnFailure func(Result)
	// StreamWait bounds how long Run waits, once every rank has ended, for the ranks' output to
	// reach its end: a process a rank started in a session of its own (setsid, a daemon) escapes
	// the rank's process group and may hold the pipes open for ever. Default 5 s.
	StreamWait time.Duration
}

// Run starts every worker and waits for all of them. When one fails (or ctx ends) the others
// get SIGTERM and, after GracePeriod, SIGKILL. It returns the results in rank order and the
// first failure (by time of exit, then traced to the rank it blames: see Blame), or nil if every
// rank succeeded. Every goroutine it starts has
// ended when it returns.
func (r *Runner) Run(ctx context.Context, workers []Worker) ([]Result, *Result) {
	grace := r.GracePeriod
	if grace <= 0 {
		grace = 3 * time.Second
	}
	tail := r.TailLines
	if tail <= 0 {
		tail = 20
	}
	out := NewLineWriter(r.Stdout, r.Timestamps)
	errw := NewLineWriter(r.Stderr, r.Timestamps)

	results := make([]Result, len(workers))
	procs := make([]Process, len(workers))
	type ended struct {
		i    int
		exit Exit
	}
	done := make(chan ended, len(workers))
	var streams sync.WaitGroup // the output pumps: results are complete once they are done
	var others sync.WaitGroup  // every other goroutine started here
	defer others.Wait()
	tails := make([]*Tail, len(workers))
	drained := make([]chan struct{}, len(workers)) // closed once both of a rank's streams hit EOF

	for i, w := range workers {
		results[i].Slot = w.Slot
		tails[i] = NewTail(tail)
		drained[i] = make(chan struct{})
		p, err := r.Starter.Start(ctx, w)
		if err != nil {
			close(drained[i])
			done <- ended{i, Exit{Code: -1, Err: fmt.Errorf("start rank %d on %s: %w", w.Slot.Rank, w.Slot.Host, err)}}
			continue
		}
		procs[i] = p
		files, err := r.rankFiles(w.Slot.Rank)
		if err != nil {
			slog.Warn("cannot write per-rank output", "rank", w.Slot.Rank, "err", err)
		}
		streams.Add(2)
		var rankStreams sync.WaitGroup
		rankStreams.Add(2)
		go func() {
			defer streams.Done()
			defer rankStreams.Done()
			Pump(p.Stdout(), out, r.prefix(w.Slot.Rank, "stdout"), files[0], nil)
		}()
		go func() {
			defer streams.Done()
			defer rankStreams.Done()
			Pump(p.Stderr(), errw, r.prefix(w.Slot.Rank, "stderr"), files[1], tails[i])
		}()
		others.Add(2)
		go func() {
			defer others.Done()
			rankStreams.Wait()
			close(drained[i])
		}()
		go func() {
			defer others.Done()
			done <- ended{i, p.Wait()} // never blocks: done has room for every rank
		}()
	}

	var first *Result
	stopping := false
	var killTimer <-chan time.Time
	stop := func() {
		if stopping {
			return
		}
		stopping = true
		for i, p := range procs {
			if p != nil && results[i].Ended.IsZero() {
				results[i].Stopped = true
				_ = p.Signal(StopSignal)
			}
		}
		killTimer = time.After(grace)
	}
	ctxDone := ctx.Done()
	for remaining := len(workers); remaining > 0; {
		select {
		case e := <-done:
			remaining--
			results[e.i].Exit = e.exit
			results[e.i].Ended = time.Now()
			if e.exit.Failed() && first == nil && !results[e.i].Stopped {
				first = &results[e.i]
				stop()
				if r.OnFailure != nil {
					others.Add(1)
					go func(res Result, drained <-chan struct{}, tail *Tail) {
						defer others.Done()
						r.reportFailure(res, drained, tail)
					}(*first, drained[e.i], tails[e.i])
				}
			}
		case <-ctxDone:
			ctxDone = nil
			stop()
		case <-killTimer:
			killTimer = nil
			for i, p := range procs {
				if p != nil && results[i].Ended.IsZero() {
					_ = p.Signal(syscall.SIGKILL)
				}
			}
		}
	}
	r.awaitStreams(&streams, procs, results, drained, errw)
	for i := range results {
		results[i].StderrTail = tails[i].Lines()
	}
	if first == nil && ctx.Err() == nil {
		return results, nil
	}
	if first == nil { // cancelled: report the cancellation rather than a rank
		return results, nil
	}
	return results, Blame(results, first)
}

// StopSignal is what Run sends the ranks it stops; GracePeriod later, SIGKILL.
const StopSignal = syscall.SIGTERM

// awaitStreams waits, for at most StreamWait, until every rank's output has reached its end; then
// it says which ranks' output is still held open, closes it and waits for the pumps to end.
func (r *Runner) awaitStreams(streams *sync.WaitGroup, procs []Process, results []Result, drained []chan struct{}, errw *LineWriter) {
	wait := r.StreamWait
	if wait <= 0 {
		wait = 5 * time.Second
	}
	all := make(chan struct{})
	go func() {
		streams.Wait()
		close(all)
	}()
	select {
	case <-all:
		return
	case <-time.After(wait):
	}
	for i, p := range procs {
		select {
		case <-drained[i]:
			continue
		default:
		}
		errw.WriteLine("", fmt.Sprintf("kolo run: rank %d has ended, but a process it started still holds its output open; not waiting for it\n", results[i].Slot.Rank))
		for _, s := range []io.Reader{p.Stdout(), p.Stderr()} {
			if c, ok := s.(io.Closer); ok {
				c.Close() // ends the pump's blocked read
			}
		}
	}
	<-all
}

// reportFailure hands OnFailure the failed rank once its last output lines are in (bounded: a
// child it left behind may hold its pipes open).
func (r *Runner) reportFailure(res Result, drained <-chan struct{}, tail *Tail) {
	select {
	case <-drained:
	case <-time.After(time.Second):
	}
	res.StderrTail = tail.Lines()
	r.OnFailure(res)
}

// prefix is horovodrun's "[1]<stdout>:" marker.
func (r *Runner) prefix(rank int, stream string) string {
	if r.Plain {
		return ""
	}
	return fmt.Sprintf("[%d]<%s>:", rank, stream)
}

func (r *Runner) rankFiles(rank int) ([2]io.Writer, error) {
	var files [2]io.Writer
	if r.OutputDir == "" {
		return files, nil
	}
	dir := filepath.Join(r.OutputDir, fmt.Sprintf("rank.%d", rank))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return files, err
	}
	for i, name := range []string{"stdout", "stderr"} {
		f, err := os.Create(filepath.Join(dir, name))
		if err != nil {
			return files, err
		}
		files[i] = f // closed when the process exits (pump returns) via closer below
	}
	return files, nil
}

// Pump copies whole lines from r to w with a prefix, and to file and tail when set.
func Pump(r io.Reader, w *LineWriter, prefix string, file io.Writer, tail *Tail) {
	br := bufio.NewReaderSize(r, 64<<10)
	for {
		line, err := br.ReadString('\n')
		if line != "" {
			if !strings.HasSuffix(line, "\n") {
				line += "\n"
			}
			w.WriteLine(prefix, line)
			if file != nil {
				io.WriteString(file, line)
			}
			if tail != nil {
				tail.Add(strings.TrimRight(line, "\n"))
			}
		}
		if err != nil {
			if c, ok := file.(io.Closer); ok {
				c.Close()
			}
			if c, ok := r.(io.Closer); ok {
				c.Close()
			}
			return
		}
	}
}

// LineWriter serialises whole lines from many ranks so output never interleaves mid-line.
type LineWriter struct {
	mu sync.Mutex
	w  io.Writer
	ts bool
}

// NewLineWriter writes whole lines to w, each after the time when timestamps is set.
func NewLineWriter(w io.Writer, timestamps bool) *LineWriter {
	return &LineWriter{w: w, ts: timestamps}
}

// WriteLine writes prefix and line (which ends in a newline) in one piece.
func (l *LineWriter) WriteLine(prefix, line string) {
	if l.w == nil {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.ts {
		io.WriteString(l.w, time.Now().Format("Mon Jan 2 15:04:05 2006")+":")
	}
	io.WriteString(l.w, prefix+line)
}

// WriteBlock writes s (several lines: a summary) as it is, without a time prefix, between other
// writers' lines.
func (l *LineWriter) WriteBlock(s string) {
	if l.w == nil {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	io.WriteString(l.w, s)
}

// Tail keeps the last lines of a stream (a rank's stderr) for a failure summary.
type Tail struct {
	mu  sync.Mutex
	max int
	buf []string
}

// maxTailLine caps a summary line: the tail travels in a node's done record (no-SSH mode), and a
// rank may write megabytes without a newline.
const maxTailLine = 4 << 10

// NewTail keeps the last max lines.
func NewTail(max int) *Tail { return &Tail{max: max} }

// Add keeps s, capped at maxTailLine, dropping the oldest line beyond max.
func (t *Tail) Add(s string) {
	if len(s) > maxTailLine {
		s = s[:maxTailLine] + " [...]"
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	t.buf = append(t.buf, s)
	if len(t.buf) > t.max {
		t.buf = t.buf[len(t.buf)-t.max:]
	}
}

// Lines returns a copy of the lines kept, oldest first.
func (t *Tail) Lines() []string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return append([]string(nil), t.buf...)
}

// Summary renders the report the launcher prints when a job fails: the first failing rank, its
// host, how it ended and its last stderr lines, then how every other rank ended.
func Summary(results []Result, first *Result) string {
	var b strings.Builder
	if first == nil {
		return ""
	}
	if first.Stopped {
		// Blame traced the failure to a rank that was still winding down when the launcher stopped it.
		fmt.Fprintf(&b, "kolo run: rank %d on %s failed first (then stopped by the launcher: %s).\n", first.Slot.Rank, first.Slot.Host, first.Exit)
	} else {
		fmt.Fprintf(&b, "kolo run: rank %d on %s %s (the first rank to fail).\n", first.Slot.Rank, first.Slot.Host, first.Exit)
	}
	if len(first.StderrTail) > 0 {
		fmt.Fprintf(&b, "Last lines of rank %d's stderr:\n", first.Slot.Rank)
		for _, l := range first.StderrTail {
			fmt.Fprintf(&b, "    %s\n", l)
		}
	}
	var others []string
	for i := range results {
		r := &results[i]
		if r == first {
			continue
		}
		how := r.Exit.String()
		if r.Stopped {
			how = "stopped by the launcher (" + how + ")"
		}
		others = append(others, fmt.Sprintf("rank %d on %s: %s", r.Slot.Rank, r.Slot.Host, how))
	}
	if len(others) > 0 {
		fmt.Fprintf(&b, "Other ranks: %s\n", strings.Join(others, "; "))
	}
	return b.String()
}

// LocalStarter runs workers as child processes of the launcher, each in its own process group so
// that stopping a rank also stops whatever it started (no orphans).
type LocalStarter struct {
	// Guard, if set, learns each rank's process group, so that the group dies even when the
	// launcher is killed outright; once a rank's process ends, what it left in its group is killed.
	Guard *OrphanGuard
	// Bind, if set, starts each rank bound to its share of this machine's CPUs (--bind-to core).
	Bind *Binding
}

type localProcess struct {
	cmd            *exec.Cmd
	stdout, stderr io.ReadCloser
	guard          *OrphanGuard
}

func (l LocalStarter) Start(ctx context.Context, w Worker) (Process, error) {
	if len(w.Argv) == 0 {
		return nil, errors.New("no command to run")
	}
	cmd := exec.Command(w.Argv[0], w.Argv[1:]...)
	cmd.Env = w.Env
	cmd.Dir = w.Dir
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	// Our own pipes rather than StdoutPipe: Wait closes those at exit and can drop a rank's last
	// lines, which are exactly the lines the failure summary needs.
	outR, outW, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	errR, errW, err := os.Pipe()
	if err != nil {
		outR.Close()
		outW.Close()
		return nil, err
	}
	cmd.Stdout, cmd.Stderr = outW, errW
	if l.Bind != nil {
		err = l.Bind.start(cmd, w.Slot)
	} else {
		err = cmd.Start()
	}
	outW.Close()
	errW.Close()
	if err != nil {
		outR.Close()
		errR.Close()
		return nil, err
	}
	l.Guard.Add(cmd.Process.Pid)
	return &localProcess{cmd: cmd, stdout: outR, stderr: errR, guard: l.Guard}, nil
}

func (p *localProcess) Stdout() io.Reader { return p.stdout }
func (p *localProcess) Stderr() io.Reader { return p.stderr }

func (p *localProcess) Signal(sig syscall.Signal) error {
	// Negative pid: the whole process group the worker leads.
	return syscall.Kill(-p.cmd.Process.Pid, sig)
}

func (p *localProcess) Wait() Exit {
	err := p.cmd.Wait()
	// Whatever the rank left running in its process group goes with it, guard or not.
	syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
	if p.guard != nil {
		p.guard.Remove(p.cmd.Process.Pid)
	}
	if err == nil {
		return Exit{Code: 0}
	}
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			return Exit{Code: -1, Signal: ws.Signal()}
		}
		return Exit{Code: ee.ExitCode()}
	}
	return Exit{Code: -1, Err: err}
}
