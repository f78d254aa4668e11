package proc

import (
	"context"
	"errors"
	"io"
	"os"
	"os/exec"
	"syscall"
)

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
	pr, pw, err := pipes(2)
	if err != nil {
		return nil, err
	}
	cmd.Stdout, cmd.Stderr = pw[0], pw[1]
	if l.Bind != nil {
		err = l.Bind.start(cmd, w.Slot)
	} else {
		err = cmd.Start()
	}
	closeAll(pw...)
	if err != nil {
		closeAll(pr...)
		return nil, err
	}
	l.Guard.Add(cmd.Process.Pid)
	return &localProcess{cmd: cmd, stdout: pr[0], stderr: pr[1], guard: l.Guard}, nil
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
	return exitOf(err)
}

// exitOf is the Exit of a process whose Wait returned err.
func exitOf(err error) Exit {
	var ee *exec.ExitError
	switch {
	case err == nil:
		return Exit{Code: 0}
	case !errors.As(err, &ee):
		return Exit{Code: -1, Err: err}
	}
	if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return Exit{Code: -1, Signal: ws.Signal()}
	}
	return Exit{Code: ee.ExitCode()}
}

// pipes returns the read and write ends of n new pipes, or none and the error.
func pipes(n int) (r, w []*os.File, err error) {
	for range n {
		pr, pw, err := os.Pipe()
		if err != nil {
			closeAll(append(r, w...)...)
			return nil, nil, err
		}
		r, w = append(r, pr), append(w, pw)
	}
	return r, w, nil
}

func closeAll(fs ...*os.File) {
	for _, f := range fs {
		f.Close()
	}
}
