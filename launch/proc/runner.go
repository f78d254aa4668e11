package proc

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"strconv"
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

// Runner is the static job's policy over a Supervisor: it starts every rank at once and stops them
// all when one fails.
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
	sup := &Supervisor{
		Starter: r.Starter, Stdout: NewLineWriter(r.Stdout, r.Timestamps), Stderr: NewLineWriter(r.Stderr, r.Timestamps),
		OutputDir: r.OutputDir, Plain: r.Plain, TailLines: r.TailLines, Grace: r.GracePeriod, StreamWait: r.StreamWait,
	}
	sup.HeldOpen = func(c *Child) {
		sup.Stderr.WriteLine("", fmt.Sprintf("kolo run: rank %d has ended, but a process it started still holds its output open; not waiting for it\n", c.Worker.Slot.Rank))
	}
	results := make([]Result, len(workers))
	children := make([]*Child, len(workers))
	type ended struct {
		i    int
		exit Exit
	}
	done := make(chan ended, len(workers)) // room for every rank: an exit never waits
	var others sync.WaitGroup              // OnFailure's goroutine
	defer others.Wait()
	for i, w := range workers {
		results[i].Slot = w.Slot
		c, err := sup.Start(ctx, w, strconv.Itoa(w.Slot.Rank), fmt.Sprintf("rank.%d", w.Slot.Rank), func(e Exit) { done <- ended{i, e} })
		children[i] = c
		if err != nil {
			done <- ended{i, Exit{Code: -1, Err: fmt.Errorf("start rank %d on %s: %w", w.Slot.Rank, w.Slot.Host, err)}}
		}
	}

	var first *Result
	firstAt := -1 // first's index
	stopping := false
	var settle <-chan time.Time // fires when the others have had SettleWait to end on their own
	stop := func() {
		if stopping {
			return
		}
		stopping = true
		for i, c := range children {
			if c.proc != nil && results[i].Ended.IsZero() { // one never started did not get stopped
				results[i].Stopped = true
				c.Stop(StopSignal)
			}
		}
	}
	failed := func() {
		stop()
		if r.OnFailure != nil {
			others.Add(1)
			go func(res Result, c *Child) {
				defer others.Done()
				res.StderrTail = c.Tail(time.Second)
				r.OnFailure(res)
			}(*first, children[firstAt])
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
		}
	}
	if settle != nil { // every rank ended on its own
		failed()
	}
	sup.Close()
	for i := range results {
		results[i].StderrTail = children[i].Tail(0)
	}
	if first == nil && ctx.Err() == nil {
		return results, nil
	}
	return results, first // nil when cancelled: the cancellation is reported rather than a rank
}

// StopSignal is what a policy stops a child with; Grace later, the Supervisor kills it.
const StopSignal = syscall.SIGTERM

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
