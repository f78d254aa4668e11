package proc

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/kolo-dl/kolo/internal/launch/layout"
	"github.com/kolo-dl/kolo/testbed/proctest"
)

func shWorkers(scripts ...string) []Worker {
	ws := make([]Worker, len(scripts))
	for i, s := range scripts {
		ws[i] = Worker{
			Slot: layout.Slot{Rank: i, Size: len(scripts), Host: "localhost", LocalRank: i, LocalSize: len(scripts)},
			Argv: []string{"/bin/sh", "-c", s},
			Env:  os.Environ(),
		}
	}
	return ws
}

func TestRunAllSucceed(t *testing.T) {
	var out, errOut proctest.Buffer
	r := &Runner{Starter: LocalStarter{}, Stdout: &out, Stderr: &errOut}
	results, first := r.Run(context.Background(), shWorkers("echo hello; echo partial-line | tr -d '\\n'", "echo world >&2"))
	if first != nil {
		t.Fatalf("unexpected failure: %+v", first)
	}
	for _, want := range []string{"[0]<stdout>:hello\n", "[0]<stdout>:partial-line\n"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("stdout %q lacks %q", out.String(), want)
		}
	}
	if !strings.Contains(errOut.String(), "[1]<stderr>:world\n") {
		t.Errorf("stderr %q lacks prefixed line", errOut.String())
	}
	if len(results) != 2 || results[0].Exit.Failed() || results[1].Exit.Failed() {
		t.Errorf("results %+v", results)
	}
}

func TestRunFailureStopsOthers(t *testing.T) {
	var out, errOut proctest.Buffer
	r := &Runner{Starter: LocalStarter{}, Stdout: &out, Stderr: &errOut, GracePeriod: time.Second}
	start := time.Now()
	results, first := r.Run(context.Background(), shWorkers(
		"sleep 60",
		"echo 'Traceback: ValueError: bad batch' >&2; sleep 0.2; exit 7",
		"trap '' TERM; sleep 60", // ignores SIGTERM: must be SIGKILLed after the grace period
	))
	elapsed := time.Since(start)
	if first == nil || first.Slot.Rank != 1 || first.Exit.ShellCode() != 7 {
		t.Fatalf("first failure = %+v, want rank 1 exit 7", first)
	}
	if elapsed > 5*time.Second {
		t.Errorf("stopping took %v, want < 5s", elapsed)
	}
	if !results[0].Stopped || results[0].Exit.Signal != syscall.SIGTERM {
		t.Errorf("rank 0: %+v, want stopped by SIGTERM", results[0])
	}
	if results[2].Exit.Signal != syscall.SIGKILL {
		t.Errorf("rank 2: %+v, want SIGKILL after grace", results[2])
	}
	sum := Summary(results, first, nil)
	for _, want := range []string{"rank 1 on localhost exited with code 7", "ValueError: bad batch", "rank 0 on localhost: stopped by the launcher"} {
		if !strings.Contains(sum, want) {
			t.Errorf("summary lacks %q:\n%s", want, sum)
		}
	}
}

// After the first failure, Run lets the other ranks end on their own for SettleWait before it
// stops them, and calls OnFailure after; a rank that ends in that time is not stopped.
func TestRunSettlesBeforeStopping(t *testing.T) {
	var onFailure time.Duration
	start := time.Now()
	r := &Runner{Starter: LocalStarter{}, GracePeriod: time.Second, SettleWait: time.Second,
		OnFailure: func(Result) { onFailure = time.Since(start) }}
	results, first := r.Run(context.Background(), shWorkers("exit 3", "sleep 0.3; exit 5", "sleep 60"))
	if first == nil || first.Slot.Rank != 0 {
		t.Fatalf("first %+v, want rank 0", first)
	}
	if results[1].Stopped || results[1].Exit.Code != 5 {
		t.Errorf("rank 1 %+v: want its own exit, code 5", results[1])
	}
	if !results[2].Stopped {
		t.Errorf("rank 2 %+v: want stopped", results[2])
	}
	if stopped := results[2].Ended.Sub(start); stopped < time.Second || stopped > 3*time.Second {
		t.Errorf("rank 2 stopped %v after the start, want after the 1 s wait", stopped)
	}
	if onFailure < time.Second {
		t.Errorf("OnFailure came %v after the start, before the wait ended", onFailure)
	}
}

// A rank that leaves a process of its own session (out of reach of the group kill) holding its
// output: Run returns after StreamWait, with the rank's output so far, and says why it stopped
// reading.
func TestRunDoesNotWaitForLeftoverOutputForever(t *testing.T) {
	var out, errOut proctest.Buffer
	r := &Runner{Starter: LocalStarter{}, Stdout: &out, Stderr: &errOut, StreamWait: 300 * time.Millisecond}
	pidFile := filepath.Join(t.TempDir(), "pid")
	defer func() {
		if b, err := os.ReadFile(pidFile); err == nil {
			if pid, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil {
				syscall.Kill(pid, syscall.SIGKILL)
			}
		}
	}()
	start := time.Now()
	results, first := r.Run(context.Background(), shWorkers(
		// The pause gives setsid time to leave the rank's process group, which dies with the rank.
		"echo before; setsid sleep 30 & echo $! > "+pidFile+"; sleep 0.3; echo after >&2",
		"true",
	))
	if took := time.Since(start); took > 5*time.Second {
		t.Errorf("Run took %v, want about StreamWait", took)
	}
	if first != nil || results[0].Exit.Failed() {
		t.Errorf("first = %+v, results %+v: want success", first, results)
	}
	if !strings.Contains(out.String(), "[0]<stdout>:before") || !strings.Contains(errOut.String(), "[0]<stderr>:after") {
		t.Errorf("rank 0's output lost: stdout %q stderr %q", out.String(), errOut.String())
	}
	if !strings.Contains(errOut.String(), "rank 0 has ended, but a process it started still holds its output open") {
		t.Errorf("no word on the held output: %q", errOut.String())
	}
}

func TestRunSignalledRank(t *testing.T) {
	r := &Runner{Starter: LocalStarter{}, GracePeriod: time.Second}
	_, first := r.Run(context.Background(), shWorkers("sleep 60", "kill -9 $$"))
	if first == nil || first.Slot.Rank != 1 || first.Exit.Signal != syscall.SIGKILL || first.Exit.ShellCode() != 137 {
		t.Fatalf("first = %+v, want rank 1 killed by SIGKILL (137)", first)
	}
}

func TestRunCancelStopsEverything(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	r := &Runner{Starter: LocalStarter{}, GracePeriod: time.Second}
	time.AfterFunc(300*time.Millisecond, cancel)
	start := time.Now()
	// The grandchild (sleep in background) must die too: its process group is signalled.
	results, first := r.Run(ctx, shWorkers("sleep 60 & wait", "sleep 60"))
	if time.Since(start) > 4*time.Second {
		t.Fatalf("cancel took %v", time.Since(start))
	}
	if first != nil {
		t.Errorf("cancel reported as rank failure: %+v", first)
	}
	for _, r := range results {
		if !r.Stopped {
			t.Errorf("rank %d not marked stopped", r.Slot.Rank)
		}
	}
}

func TestRunOutputDir(t *testing.T) {
	dir := t.TempDir()
	r := &Runner{Starter: LocalStarter{}, OutputDir: dir}
	r.Run(context.Background(), shWorkers("echo out0; echo err0 >&2", "echo out1"))
	for rank, want := range map[int]string{0: "out0\n", 1: "out1\n"} {
		b, err := os.ReadFile(fmt.Sprintf("%s/rank.%d/stdout", dir, rank))
		if err != nil || string(b) != want {
			t.Errorf("rank %d stdout file = %q, %v; want %q", rank, b, err, want)
		}
	}
	if b, _ := os.ReadFile(dir + "/rank.0/stderr"); string(b) != "err0\n" {
		t.Errorf("rank 0 stderr file = %q", b)
	}
}

func TestRunStartFailure(t *testing.T) {
	ws := shWorkers("sleep 60")
	ws = append(ws, Worker{Slot: layout.Slot{Rank: 1, Host: "localhost"}, Argv: []string{"/nonexistent/prog"}})
	r := &Runner{Starter: LocalStarter{}, GracePeriod: time.Second}
	_, first := r.Run(context.Background(), ws)
	if first == nil || first.Slot.Rank != 1 || !strings.Contains(first.Exit.String(), "/nonexistent/prog") {
		t.Fatalf("first = %+v, want rank 1 start failure naming the program", first)
	}
}

// fakeProcess ends with exit as soon as it is waited for; its output is out (stdout) and errOut.
type fakeProcess struct {
	out, errOut string
	exit        Exit
}

func (p *fakeProcess) Stdout() io.Reader           { return strings.NewReader(p.out) }
func (p *fakeProcess) Stderr() io.Reader           { return strings.NewReader(p.errOut) }
func (p *fakeProcess) Wait() Exit                  { return p.exit }
func (p *fakeProcess) Signal(syscall.Signal) error { return nil }

// fakeStarter starts the fakeProcess of each rank.
type fakeStarter map[int]*fakeProcess

func (f fakeStarter) Start(_ context.Context, w Worker) (Process, error) { return f[w.Slot.Rank], nil }

// Run returns only once every goroutine it started has ended, OnFailure's included: nothing it
// started may act after the caller has moved on (a node publishing a stop after its outcome).
func TestRunLeavesNoGoroutineBehind(t *testing.T) {
	before := runtime.NumGoroutine()
	var reported atomic.Bool
	r := &Runner{
		Starter: fakeStarter{0: {out: "ok\n"}, 1: {errOut: "boom\n", exit: Exit{Code: 3}}},
		OnFailure: func(res Result) {
			time.Sleep(200 * time.Millisecond) // a slow rendezvous
			if res.Slot.Rank != 1 || len(res.StderrTail) != 1 || res.StderrTail[0] != "boom" {
				t.Errorf("OnFailure got %+v, want rank 1 with its stderr", res)
			}
			reported.Store(true)
		},
	}
	_, first := r.Run(context.Background(), shWorkers("", ""))
	if first == nil || first.Slot.Rank != 1 {
		t.Fatalf("first = %+v, want rank 1", first)
	}
	if !reported.Load() {
		t.Error("Run returned while OnFailure was still running")
	}
	// Goroutines that have called Done may take a moment to exit; none may stay.
	deadline := time.Now().Add(2 * time.Second)
	for runtime.NumGoroutine() > before && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if n := runtime.NumGoroutine(); n > before {
		t.Errorf("%d goroutines before Run, %d after", before, n)
	}
}

func TestTailCapsLongLines(t *testing.T) {
	tb := NewTail(2)
	tb.Add(strings.Repeat("x", 1<<20)) // a megabyte without a newline
	tb.Add("short")
	got := tb.Lines()
	if len(got) != 2 || len(got[0]) > maxTailLine+10 || !strings.HasSuffix(got[0], "[...]") || got[1] != "short" {
		t.Errorf("tail = %d lines, first %d bytes; want it cut to %d bytes and marked", len(got), len(got[0]), maxTailLine)
	}
}

// remoteProcess is a worker whose output is printed where it runs (RemoteOutput): the runner has
// nothing of it to pump or file, and takes its stderr's last lines from its exit.
type remoteProcess struct {
	fakeProcess
	tail []string
}

func (p *remoteProcess) Stdout() io.Reader    { panic("the runner read a remote worker's stdout") }
func (p *remoteProcess) Stderr() io.Reader    { panic("the runner read a remote worker's stderr") }
func (p *remoteProcess) StderrTail() []string { return p.tail }

// starterFunc starts workers with a function.
type starterFunc func(w Worker) (Process, error)

func (f starterFunc) Start(_ context.Context, w Worker) (Process, error) { return f(w) }

func TestRunRemoteOutput(t *testing.T) {
	dir := t.TempDir()
	local := LocalStarter{}
	r := &Runner{OutputDir: dir, GracePeriod: time.Second, Starter: starterFunc(func(w Worker) (Process, error) {
		if w.Slot.Rank == 1 {
			return &remoteProcess{fakeProcess: fakeProcess{exit: Exit{Code: 3}}, tail: []string{"ValueError: bad batch"}}, nil
		}
		return local.Start(context.Background(), w)
	})}
	results, first := r.Run(context.Background(), shWorkers("echo out0", ""))
	if first == nil || first.Slot.Rank != 1 || fmt.Sprint(first.StderrTail) != "[ValueError: bad batch]" {
		t.Fatalf("first = %+v, want rank 1 with the tail its exit brought", first)
	}
	if s := Summary(results, first, nil); !strings.Contains(s, "    ValueError: bad batch") {
		t.Errorf("summary lacks the remote rank's tail:\n%s", s)
	}
	if _, err := os.Stat(dir + "/rank.1"); !os.IsNotExist(err) {
		t.Errorf("rank.1 was filed here (%v): its node files its output", err)
	}
	if b, _ := os.ReadFile(dir + "/rank.0/stdout"); string(b) != "out0\n" {
		t.Errorf("rank 0 stdout file = %q", b)
	}
}
