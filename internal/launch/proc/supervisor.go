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
	"sync/atomic"
	"syscall"
	"time"
)

// Supervisor owns the child processes of a job, whatever the job: it starts them, pumps their
// output (prefixed, to per-child files, a tail of stderr kept), stops them (a signal, then SIGKILL
// after Grace), reports each exit and, at Close, bounds the wait for output a child's own children
// hold open. What to start and what an exit means is the caller's: it never stops a child itself.
type Supervisor struct {
	Starter Starter
	Stdout  *LineWriter // every child's stdout, prefixed with its label
	Stderr  *LineWriter // every child's stderr, prefixed with its label
	// OutputDir, if set, also gets DIR/<child's dir>/{stdout,stderr}.
	OutputDir string
	// AppendFiles opens those files for appending rather than afresh: an elastic job's place
	// runs several workers in turn.
	AppendFiles bool
	Plain       bool          // no label prefix on output lines
	TailLines   int           // stderr lines kept per child; default 20
	Grace       time.Duration // between the stop signal and SIGKILL; default 3 s
	// StreamWait bounds how long Close waits for the children's output to reach its end once
	// they have ended: a process a child started in a session of its own (setsid, a daemon)
	// escapes the child's process group and may hold the pipes open for ever. Default 5 s.
	StreamWait time.Duration
	// HeldOpen, if set, is told about each child whose output Close stops waiting for; by
	// default Close writes a line to Stderr.
	HeldOpen func(c *Child)

	mu       sync.Mutex
	children []*Child
	pumps    sync.WaitGroup
	waiters  sync.WaitGroup
}

// Child is one process the Supervisor started.
type Child struct {
	Worker Worker
	Label  string // how its output lines and the Supervisor's messages name it

	proc    Process
	tail    *Tail
	drained chan struct{} // closed once its output has reached its end
	grace   time.Duration

	mu     sync.Mutex
	exited bool
	kill   *time.Timer // armed by Stop
}

// Start starts w and pumps its output, labelled label and written under dir in OutputDir. When
// the process ends, exited is called with its exit, in a goroutine of its own; the caller
// receives every exit before it calls Close. A child that cannot be started is returned too, as
// one that ended without output (exited is not called), with the error.
func (s *Supervisor) Start(ctx context.Context, w Worker, label, dir string, exited func(Exit)) (*Child, error) {
	tailLines := s.TailLines
	if tailLines <= 0 {
		tailLines = 20
	}
	c := &Child{Worker: w, Label: label, tail: NewTail(tailLines), drained: make(chan struct{}), grace: s.Grace}
	if c.grace <= 0 {
		c.grace = 3 * time.Second
	}
	p, err := s.Starter.Start(ctx, w)
	if err != nil {
		c.exited = true
		close(c.drained)
		return c, err
	}
	c.proc = p
	s.mu.Lock()
	s.children = append(s.children, c)
	s.mu.Unlock()
	wait := func() Exit {
		e := p.Wait()
		c.mu.Lock()
		c.exited = true
		if c.kill != nil {
			c.kill.Stop()
		}
		c.mu.Unlock()
		return e
	}
	if ro, ok := p.(RemoteOutput); ok {
		s.waiters.Go(func() {
			e := wait()
			for _, l := range ro.StderrTail() {
				c.tail.Add(l)
			}
			close(c.drained)
			exited(e)
		})
		return c, nil
	}
	files := s.files(dir)
	var open atomic.Int32 // streams not yet at their end
	open.Store(2)
	pump := func(r io.Reader, w *LineWriter, stream string, file io.Writer, tail *Tail) func() {
		return func() {
			Pump(r, w, s.prefix(label, stream), file, tail)
			if open.Add(-1) == 0 {
				close(c.drained)
			}
		}
	}
	s.pumps.Go(pump(p.Stdout(), s.Stdout, "stdout", files[0], nil))
	s.pumps.Go(pump(p.Stderr(), s.Stderr, "stderr", files[1], c.tail))
	s.waiters.Go(func() { exited(wait()) })
	return c, nil
}

// Signal delivers sig to a child that still runs.
func (c *Child) Signal(sig syscall.Signal) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.exited && c.proc != nil {
		_ = c.proc.Signal(sig)
	}
}

// Stop delivers sig (StopSignal, unless the policy says otherwise) to a child that still runs
// and kills it Grace later if it has not ended by then. Stopping again signals again but keeps
// the first deadline.
func (c *Child) Stop(sig syscall.Signal) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.exited || c.proc == nil {
		return
	}
	_ = c.proc.Signal(sig)
	if c.kill == nil {
		c.kill = time.AfterFunc(c.grace, c.Kill)
	}
}

// Kill ends a child that still runs at once, with SIGKILL: the only place the launcher kills
// one.
func (c *Child) Kill() { c.Signal(syscall.SIGKILL) }

// Drained is closed once the child's output has reached its end (at once for one never started).
func (c *Child) Drained() <-chan struct{} { return c.drained }

// Tail returns the last lines of the child's stderr, waiting at most wait for its output to end
// first: the lines a failure summary quotes come last, and a child left behind may hold the
// pipes open.
func (c *Child) Tail(wait time.Duration) []string {
	if wait > 0 {
		t := time.NewTimer(wait)
		defer t.Stop()
		select {
		case <-c.drained:
		case <-t.C:
		}
	}
	return c.tail.Lines()
}

// Close waits, StreamWait at most, for every child's output to reach its end; then it says which
// children's output is still held open, closes it so the pumps end, and waits for every
// goroutine the Supervisor started. Call it once every exit has been received.
func (s *Supervisor) Close() {
	wait := s.StreamWait
	if wait <= 0 {
		wait = 5 * time.Second
	}
	all := make(chan struct{})
	go func() {
		s.pumps.Wait()
		close(all)
	}()
	select {
	case <-all:
	case <-time.After(wait):
		s.mu.Lock()
		children := append([]*Child(nil), s.children...)
		s.mu.Unlock()
		for _, c := range children {
			select {
			case <-c.drained:
				continue
			default:
			}
			if s.HeldOpen != nil {
				s.HeldOpen(c)
			} else {
				s.Stderr.WriteLine("", fmt.Sprintf("kolo run: %s has ended, but a process it started still holds its output open; not waiting for it\n", c.Label))
			}
			for _, r := range []io.Reader{c.proc.Stdout(), c.proc.Stderr()} {
				if cl, ok := r.(io.Closer); ok {
					cl.Close() // ends the pump's blocked read
				}
			}
		}
		<-all
	}
	s.waiters.Wait()
}

func (s *Supervisor) prefix(label, stream string) string {
	if s.Plain {
		return ""
	}
	return fmt.Sprintf("[%s]<%s>:", label, stream)
}

// files opens OutputDir/dir/{stdout,stderr}; a file that cannot be opened is left out, with a
// warning.
func (s *Supervisor) files(dir string) [2]io.Writer {
	var files [2]io.Writer
	if s.OutputDir == "" {
		return files
	}
	path := filepath.Join(s.OutputDir, dir)
	if err := os.MkdirAll(path, 0o755); err != nil {
		slog.Warn("cannot write per-worker output", "worker", dir, "err", err)
		return files
	}
	flag := os.O_CREATE | os.O_WRONLY | os.O_TRUNC
	if s.AppendFiles {
		flag = os.O_CREATE | os.O_WRONLY | os.O_APPEND
	}
	for i, name := range []string{"stdout", "stderr"} {
		f, err := os.OpenFile(filepath.Join(path, name), flag, 0o644)
		if err != nil {
			slog.Warn("cannot write per-worker output", "worker", dir, "err", err)
			continue
		}
		files[i] = f // Pump closes it at the end of the stream
	}
	return files
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
