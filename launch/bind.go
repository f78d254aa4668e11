package launch

import (
	"fmt"
	"os/exec"
	"runtime"

	"github.com/kolo-dl/kolo/internal/cpuset"
)

// --bind-to values.
const (
	BindNone = "none"
	BindCore = "core"
)

// bindCPUs is local rank s.LocalRank's share of the CPUs kolo run itself may use, split among the
// s.LocalSize ranks of this machine by whole cores (cpuset.Split). Read on every start rather than
// once, so a launcher started under taskset or a cgroup's cpuset divides what it was given.
func bindCPUs(s Slot) (cpuset.Set, error) {
	all, err := cpuset.Current()
	if err != nil {
		return nil, err
	}
	shares, err := cpuset.Split(cpuset.Cores(all, cpuset.SysfsTopology), s.LocalSize)
	if err != nil {
		return nil, fmt.Errorf("CPUs %s: %w", all, err)
	}
	if s.LocalRank < 0 || s.LocalRank >= len(shares) {
		return nil, fmt.Errorf("local rank %d of %d", s.LocalRank, s.LocalSize)
	}
	return shares[s.LocalRank], nil
}

// startBound starts cmd bound to its rank's CPUs. The binding is set on the launcher thread that
// forks, so the child has it from its first instruction and every thread it ever starts inherits
// it; setting it on the child's pid after Start would miss threads a runtime (Go's, OpenMP's)
// starts at once. The thread gets its own mask back before it runs anything else.
func startBound(cmd *exec.Cmd, s Slot) error {
	runtime.LockOSThread()
	own, err := cpuset.Current()
	if err != nil {
		runtime.UnlockOSThread()
		return fmt.Errorf("--bind-to core: %w", err)
	}
	cpus, err := bindCPUs(s)
	if err == nil {
		err = cpuset.Apply(cpus)
	}
	if err != nil {
		runtime.UnlockOSThread()
		return fmt.Errorf("--bind-to core: rank %d: %w", s.Rank, err)
	}
	startErr := cmd.Start()
	if err := cpuset.Apply(own); err != nil {
		// Left locked: the runtime retires the thread with this goroutine rather than run other
		// goroutines on the narrowed mask.
		if startErr == nil {
			return nil
		}
		return startErr
	}
	runtime.UnlockOSThread()
	return startErr
}
