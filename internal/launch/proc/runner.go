package proc

import (
	"context"
	"fmt"
	"io"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/kolo-dl/kolo/internal/launch/layout"
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
	StreamWait time.Duration // Supervisor.StreamWait: for the ranks' output once they have ended; default 5 s
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
			res, c := *first, children[firstAt]
			others.Go(func() {
				res.StderrTail = c.Tail(time.Second)
				r.OnFailure(res)
			})
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
	return results, first // nil when cancelled: the cancellation is reported rather than a rank
}

// StopSignal is what a policy stops a child with; Grace later, the Supervisor kills it.
const StopSignal = syscall.SIGTERM
