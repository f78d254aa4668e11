package proc

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/kolo-dl/kolo/internal/jobenv"
)

// SlurmStarter starts each worker as a job step of one task on its host, with srun, inside the
// allocation JobID. The step shares the allocation's CPUs with the other workers' steps
// (--overlap), is not killed when another fails (--kill-on-bad-exit=0), and gets the worker's
// environment (srun passes its own on; the job secret never appears on a command line).
type SlurmStarter struct {
	JobID   string
	Program string // the srun command; default "srun" (tests substitute a fake)
	// Local starts the srun process itself: its own process group, the orphan guard.
	Local LocalStarter
	// KillAfter is how long a stopped step may take to end before srun itself is killed; 3 s.
	KillAfter time.Duration
}

// slurmArgs is the srun command line that starts w.
func (s *SlurmStarter) slurmArgs(w Worker) []string {
	args := []string{cmp.Or(s.Program, "srun"),
		"--jobid=" + s.JobID,
		"--nodes=1", "--ntasks=1", "--nodelist=" + w.Slot.Host,
		"--overlap", "--kill-on-bad-exit=0", "--cpu-bind=none", "--mpi=none",
		"--export=ALL", "--unbuffered", "--quiet",
		"--job-name=kolo:" + slurmStepName(w),
	}
	if w.Dir != "" {
		args = append(args, "--chdir="+w.Dir)
	}
	return append(append(args, "--"), w.Argv...)
}

// slurmStepName names a worker's step after its place, as kolo run's output does ("node1[0]").
func slurmStepName(w Worker) string {
	if p, _, ok, err := jobenv.ElasticPlace(jobenv.FromEnviron(w.Env)); ok && err == nil {
		return p.String()
	}
	return w.Slot.Host + "[" + strconv.Itoa(w.Slot.LocalRank) + "]"
}

func (s *SlurmStarter) Start(ctx context.Context, w Worker) (Process, error) {
	if len(w.Argv) == 0 {
		return nil, errors.New("no command to run")
	}
	if w.Slot.Host == "" {
		return nil, errors.New("a Slurm worker needs a host")
	}
	sw := w
	sw.Argv = s.slurmArgs(w)
	sw.Env = withoutSlurmLayout(w.Env)
	p, err := s.Local.Start(ctx, sw)
	if err != nil {
		return nil, fmt.Errorf("srun on %s: %w", w.Slot.Host, err)
	}
	after := s.KillAfter
	if after <= 0 {
		after = 3 * time.Second
	}
	return &slurmProcess{Process: p, killAfter: after, exited: make(chan struct{})}, nil
}

// withoutSlurmLayout drops the variables an allocation's shell holds that srun would read as
// options of the step's layout (SLURM_NTASKS=8 from sbatch -n 8, ...): every worker's step is one
// task on one node, which the command line says.
func withoutSlurmLayout(env []string) []string {
	out := make([]string, 0, len(env))
	for _, kv := range env {
		k, _, _ := strings.Cut(kv, "=")
		switch k {
		case "SLURM_NTASKS", "SLURM_NPROCS", "SLURM_NNODES", "SLURM_NTASKS_PER_NODE", "SLURM_TASKS_PER_NODE",
			"SLURM_DISTRIBUTION", "SLURM_CPUS_PER_TASK", "SLURM_CPU_BIND", "SLURM_NODELIST", "SLURM_JOB_NODELIST",
			"SLURM_MEM_PER_CPU", "SLURM_MEM_PER_NODE", "SLURM_EXCLUSIVE", "SLURM_OVERLAP":
			continue
		}
		out = append(out, kv)
	}
	return out
}

// intEvery is the gap between the SIGINTs that stop a step: well within srun's second, and long
// enough for a loaded srun to have taken the one before (a signal sent while the same one is
// pending merges with it, and one SIGINT only makes srun print the step's status). They go on
// until srun ends: a third one to an srun already ending its step changes nothing.
const intEvery = 250 * time.Millisecond

// slurmProcess is srun running one worker's step. srun forwards SIGTERM and SIGINT to the task;
// a SIGKILL becomes SIGINTs in a row, on two of which within a second srun ends the whole step
// (its tasks killed on their node), and srun itself is killed if it has not ended after killAfter.
type slurmProcess struct {
	Process
	killAfter time.Duration
	once      sync.Once
	exited    chan struct{}
}

func (p *slurmProcess) Wait() Exit {
	e := p.Process.Wait()
	p.once.Do(func() { close(p.exited) })
	return e
}

func (p *slurmProcess) Signal(sig syscall.Signal) error {
	if sig != syscall.SIGKILL {
		return p.Process.Signal(sig)
	}
	err := p.Process.Signal(syscall.SIGINT)
	go func() {
		tick := time.NewTicker(intEvery)
		defer tick.Stop()
		kill := time.After(p.killAfter)
		for {
			select {
			case <-p.exited:
				return
			case <-tick.C:
				p.Process.Signal(syscall.SIGINT)
			case <-kill:
				p.Process.Signal(syscall.SIGKILL)
				return
			}
		}
	}()
	return err
}
