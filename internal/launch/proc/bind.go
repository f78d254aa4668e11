package proc

import (
	"fmt"
	"log/slog"
	"os/exec"
	"runtime"
	"strconv"

	"github.com/kolo-dl/kolo/internal/cpuset"
	"github.com/kolo-dl/kolo/internal/jobenv"
	"github.com/kolo-dl/kolo/internal/launch/layout"
)

// Binding is what --bind-to core gives the ranks of this machine: the CPUs kolo run may use
// (all of them, or what taskset or a cgroup's cpuset left it), split among the local ranks by
// whole cores (cpuset.Split). It is computed once, before any rank starts, so that a bad split is a
// usage error and every rank's share comes from the same reading.
type Binding struct {
	all    cpuset.Set   // what the launcher thread gets back after each fork
	shares []cpuset.Set // by local rank
}

// NewBinding splits this machine's CPUs among localSize ranks; with overload, more ranks than
// CPUs share them round robin instead of failing.
func NewBinding(localSize int, overload bool) (*Binding, error) {
	all, err := cpuset.Current()
	if err != nil {
		return nil, fmt.Errorf("--bind-to core: %w", err)
	}
	split := cpuset.Split
	if overload {
		split = cpuset.Overload
	}
	shares, err := split(cpuset.Cores(all, cpuset.SysfsTopology), localSize)
	if err != nil {
		return nil, fmt.Errorf("--bind-to core: CPUs %s: %w (--bind-to core:overload-allowed shares them round robin)", all, err)
	}
	return &Binding{all: all, shares: shares}, nil
}

// cpus is local rank s.LocalRank's share.
func (b *Binding) cpus(s layout.Slot) (cpuset.Set, error) {
	if s.LocalRank < 0 || s.LocalRank >= len(b.shares) {
		return nil, fmt.Errorf("--bind-to core: rank %d is local rank %d, but the CPUs were split among %d", s.Rank, s.LocalRank, len(b.shares))
	}
	return b.shares[s.LocalRank], nil
}

// start starts cmd bound to its rank's CPUs. The binding is set on the launcher thread that forks,
// so the child has it from its first instruction and every thread it ever starts inherits it;
// setting it on the child's pid after Start would miss threads a runtime (Go's, OpenMP's) starts
// at once. The thread gets the launcher's mask back before it runs anything else. The rank is
// told how many CPUs the machine gives its ranks (jobenv.HostCPUs): its own mask shows only its
// share, which would make it think the machine's ranks outnumber its CPUs.
func (b *Binding) start(cmd *exec.Cmd, s layout.Slot) error {
	cpus, err := b.cpus(s)
	if err != nil {
		return err
	}
	cmd.Env = append(cmd.Env, jobenv.HostCPUs+"="+strconv.Itoa(len(b.all)))
	runtime.LockOSThread()
	if err := cpuset.Apply(cpus); err != nil {
		runtime.UnlockOSThread()
		return fmt.Errorf("--bind-to core: rank %d: %w", s.Rank, err)
	}
	startErr := cmd.Start()
	if err := cpuset.Apply(b.all); err != nil {
		// The thread stays locked to this goroutine (so no other goroutine runs on the narrowed
		// mask) until the goroutine ends; later ranks still get their own shares, computed above.
		slog.Warn("--bind-to core: the launcher thread could not get its CPUs back", "rank", s.Rank, "err", err)
		return startErr
	}
	runtime.UnlockOSThread()
	return startErr
}
