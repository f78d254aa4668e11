package proc

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kolo-dl/kolo/testbed/proctest"
)

// The supervisor's part of every job kind: how a child ends, what it is told, and how long its
// output is waited for.
func TestSupervisor(t *testing.T) {
	tests := []struct {
		name   string
		script string
		stop   bool // Stop the child once it wrote "ready"
		freeze bool // SIGSTOP its process group (its pid in PIDFILE) before
		// want
		code, signal int
		tail         string // a line of its stderr tail
		heldOpen     bool   // Close gives up on its output
		maxTook      time.Duration
	}{
		{name: "exits on its own", script: "echo out; echo err >&2; exit 3", code: 3, tail: "err", maxTook: 3 * time.Second},
		{name: "ends on SIGTERM", script: "trap 'echo bye >&2; exit 7' TERM; echo ready; while :; do sleep 0.05; done", stop: true, code: 7, tail: "bye", maxTook: 3 * time.Second},
		{name: "ignores SIGTERM", script: "trap '' TERM; echo ready; while :; do sleep 0.05; done", stop: true, code: -1, signal: int(syscall.SIGKILL), maxTook: 3 * time.Second},
		// exec, not a loop of sleeps: the group's SIGSTOP could catch the shell in vfork with its
		// child stopped before exec, which leaves the shell in state D, never T.
		{name: "stopped with SIGSTOP", script: "echo $$ > PIDFILE; echo ready; exec sleep 30", stop: true, freeze: true, code: -1, signal: int(syscall.SIGKILL), maxTook: 3 * time.Second},
		// The pause gives setsid time to leave the process group, which dies with the child.
		{name: "grandchild holds stdout", script: "setsid sleep 30 & echo $! > PIDFILE; sleep 0.3; echo err >&2; exit 0", tail: "err", heldOpen: true, maxTook: 3 * time.Second},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			pidFile := filepath.Join(dir, "pid")
			defer func() {
				if b, err := os.ReadFile(pidFile); err == nil {
					if pid, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil {
						syscall.Kill(pid, syscall.SIGKILL)
					}
				}
			}()
			var out, errOut proctest.Buffer
			var held []string
			s := &Supervisor{
				Starter: LocalStarter{}, Stdout: NewLineWriter(&out, false), Stderr: NewLineWriter(&errOut, false),
				OutputDir: dir, Grace: 300 * time.Millisecond, StreamWait: 300 * time.Millisecond,
				HeldOpen: func(c *Child) { held = append(held, c.Label) },
			}
			w := shWorkers(strings.ReplaceAll(tc.script, "PIDFILE", pidFile))[0]
			exits := make(chan Exit, 1)
			start := time.Now()
			c, err := s.Start(context.Background(), w, "a", "child.a", func(e Exit) { exits <- e })
			if err != nil {
				t.Fatal(err)
			}
			if tc.stop {
				awaitOutput(t, &out, "[a]<stdout>:ready")
				if tc.freeze {
					b, err := os.ReadFile(pidFile)
					pid, _ := strconv.Atoi(strings.TrimSpace(string(b)))
					if err != nil || pid <= 0 {
						t.Fatalf("pid file: %q, %v", b, err)
					}
					syscall.Kill(-pid, syscall.SIGSTOP)
					awaitStopped(t, pid) // a SIGTERM sent while SIGSTOP is pending comes first
				}
				c.Stop(StopSignal)
			}
			var e Exit
			select {
			case e = <-exits:
			case <-time.After(10 * time.Second):
				c.Kill()
				t.Fatal("no exit")
			}
			s.Close()
			if took := time.Since(start); took > tc.maxTook {
				t.Errorf("took %v, want at most %v", took, tc.maxTook)
			}
			if e.Code != tc.code || int(e.Signal) != tc.signal {
				t.Errorf("exit %+v, want code %d signal %d", e, tc.code, tc.signal)
			}
			tail := c.Tail(0)
			if tc.tail != "" && (len(tail) == 0 || tail[len(tail)-1] != tc.tail) {
				t.Errorf("stderr tail %q, want it to end with %q", tail, tc.tail)
			}
			if got := len(held) > 0; got != tc.heldOpen {
				t.Errorf("held open: %v, want %v", held, tc.heldOpen)
			}
			if tc.tail != "" {
				b, err := os.ReadFile(filepath.Join(dir, "child.a", "stderr"))
				if err != nil || !strings.Contains(string(b), tc.tail) {
					t.Errorf("child.a/stderr: %q, %v; want %q in it", b, err, tc.tail)
				}
				if !strings.Contains(errOut.String(), "[a]<stderr>:"+tc.tail) {
					t.Errorf("stderr %q: want the labelled line", errOut.String())
				}
			}
		})
	}
}

// A child that cannot be started comes back as one that ended without output.
func TestSupervisorStartFails(t *testing.T) {
	s := &Supervisor{Starter: LocalStarter{}}
	c, err := s.Start(context.Background(), Worker{}, "a", "a", func(Exit) { t.Error("exit of a child never started") })
	if err == nil {
		t.Fatal("started a worker without a command")
	}
	select {
	case <-c.Drained():
	default:
		t.Error("output of a child never started not at its end")
	}
	c.Stop(StopSignal)
	c.Kill()
	s.Close()
}

func awaitOutput(t *testing.T, b *proctest.Buffer, s string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !strings.Contains(b.String(), s) {
		if time.Now().After(deadline) {
			t.Fatalf("no %q in %q", s, b.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// awaitStopped waits until process pid is stopped (state T in /proc/PID/stat).
func awaitStopped(t *testing.T, pid int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if i := strings.LastIndexByte(string(b), ')'); err == nil && i >= 0 && strings.HasPrefix(string(b[i:]), ") T") {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("process %d not stopped: %q, %v", pid, b, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// remoteChild is a worker whose output another machine prints: it ends when told to.
type remoteChild struct {
	end     chan Exit
	signals chan syscall.Signal
}

func (r *remoteChild) Stdout() io.Reader               { return strings.NewReader("") }
func (r *remoteChild) Stderr() io.Reader               { return strings.NewReader("") }
func (r *remoteChild) Wait() Exit                      { return <-r.end }
func (r *remoteChild) StderrTail() []string            { return []string{"remote line"} }
func (r *remoteChild) Signal(sig syscall.Signal) error { r.signals <- sig; return nil }

// A child whose output is printed elsewhere: no pumps, its tail comes with its exit, and a child
// that ends within the grace gets no SIGKILL.
func TestSupervisorRemoteOutput(t *testing.T) {
	r := &remoteChild{end: make(chan Exit, 1), signals: make(chan syscall.Signal, 4)}
	s := &Supervisor{Starter: starterFunc(func(Worker) (Process, error) { return r, nil }), Grace: 200 * time.Millisecond}
	exits := make(chan Exit, 1)
	c, err := s.Start(context.Background(), Worker{}, "a", "a", func(e Exit) { exits <- e })
	if err != nil {
		t.Fatal(err)
	}
	c.Stop(StopSignal)
	if sig := <-r.signals; sig != StopSignal {
		t.Errorf("signal %v, want %v", sig, StopSignal)
	}
	r.end <- Exit{Code: -1, Signal: StopSignal}
	if e := <-exits; e.Signal != StopSignal {
		t.Errorf("exit %+v", e)
	}
	s.Close()
	if tail := c.Tail(time.Second); len(tail) != 1 || tail[0] != "remote line" {
		t.Errorf("tail %q", tail)
	}
	time.Sleep(400 * time.Millisecond) // past the grace: the kill must not come
	select {
	case sig := <-r.signals:
		t.Errorf("signal %v after the exit", sig)
	default:
	}
}
