// Package proc starts, supervises and stops the processes of kolo run's ranks: a Starter starts a
// Worker locally (its own process group, an orphan guard, optionally bound to cores), over ssh or
// as a Slurm job step; the Supervisor owns every child of every job kind; a Runner is the static
// job's policy above it, and Blame and Summary name the rank a failure traces back to. It must not
// plan ranks, host a rendezvous or know what a job is: a Starter gets a complete Worker and runs it.
package proc

import (
	"context"
	"fmt"
	"io"
	"syscall"

	"github.com/kolo-dl/kolo/internal/launch/layout"
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

// RemoteOutput is a Process whose output is printed where it runs, not by the launcher that
// supervises it (a worker another node of a no-ssh job started): it has no streams to pump, and
// the last lines of its stderr come with its exit.
type RemoteOutput interface {
	StderrTail() []string
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
