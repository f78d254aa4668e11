package proc

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/kolo-dl/kolo/launch/layout"
)

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
	// OnFailure, if set, is called once, in its own goroutine, with the first failing rank when
	// Run stops the others (its StderrTail holds what it wrote before ending): a multi-node
	// launcher uses it to tell the other nodes to stop without waiting for this node's ranks to
	// wind down. Run does not return before OnFailure has.
	OnFailure func(Result)
	// SettleWait is how long, after the first rank fails on its own, the others may still end on
	// their own before Run stops them (and calls OnFailure): a rank that failed too (it lost the
	// first, or was told why it failed) sends the launcher its failure record before it exits, and
	// its own exit status and last output say more than the launcher's stop. Ctrl-C stops every
	// rank at once. Default 2 s; negative: stop at once.
	SettleWait time.Duration
	// StreamWait bounds how long Run waits, once every rank has ended, for the ranks' output to
	// reach its end: a process a rank started in a session of its own (setsid, a daemon) escapes
	// the rank's process group and may hold the pipes open for ever. Default 5 s.
	StreamWait time.Duration
}

// Run starts every worker and waits for all of them. When one fails (SettleWait later) or ctx
// ends, the others get SIGTERM and, after GracePeriod, SIGKILL. It returns the results in rank
// order and the first rank to fail on its own (by time of exit: Blame traces it to the rank the
// failure began with), or nil if every rank succeeded. Every goroutine it starts has ended when
// it returns.
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
		if ro, ok := p.(RemoteOutput); ok {
			others.Add(1)
			go func() {
				defer others.Done()
				e := p.Wait()
				for _, l := range ro.StderrTail() {
					tails[i].Add(l)
				}
				close(drained[i])
				done <- ended{i, e}
			}()
			continue
		}
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
	firstAt := -1 // first's index
	stopping := false
	var killTimer <-chan time.Time
	var settle <-chan time.Time // fires when the others have had SettleWait to end on their own
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
	failed := func() {
		stop()
		if r.OnFailure != nil {
			others.Add(1)
			go func(res Result, drained <-chan struct{}, tail *Tail) {
				defer others.Done()
				r.reportFailure(res, drained, tail)
			}(*first, drained[firstAt], tails[firstAt])
		}
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
				firstAt = e.i
				if r.SettleWait < 0 || stopping {
					failed()
					continue
				}
				wait := r.SettleWait
				if wait == 0 {
					wait = 2 * time.Second
				}
				settle = time.After(wait)
			}
		case <-settle:
			settle = nil
			failed()
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
	if settle != nil { // every rank ended on its own
		failed()
	}
	r.awaitStreams(&streams, procs, results, drained, errw)
	for i := range results {
		results[i].StderrTail = tails[i].Lines()
	}
	if first == nil && ctx.Err() == nil {
		return results, nil
	}
	return results, first // nil when cancelled: the cancellation is reported rather than a rank
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
