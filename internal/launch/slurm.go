package launch

import (
	"cmp"
	"fmt"

	"github.com/kolo-dl/kolo/internal/jobenv"
	"github.com/kolo-dl/kolo/internal/launch/elastic"
)

// An elastic kolo run inside a Slurm allocation takes its hosts from it and starts each worker as
// a job step of its own (srun, one task on one node), not over ssh: Slurm places, accounts for and
// cleans up every worker, and a failed node ends only its steps, which the launcher sees as those
// workers failing.

// slurmAlloc is the allocation a launcher runs in, read from the variables sbatch and salloc set.
type slurmAlloc struct {
	JobID string
	Hosts []elastic.Host
}

// slurmAllocation reads the allocation from env: ok is false outside one, and inside a job step
// (an srun task is a worker, not a launcher). Slots per node are the tasks the allocation asked
// for per node (SLURM_TASKS_PER_NODE, from -n/--ntasks-per-node), else its CPUs per node; a
// positive slotsPerHost (--slots-per-host) overrides both.
func slurmAllocation(env map[string]string, slotsPerHost int) (slurmAlloc, bool, error) {
	id := cmp.Or(env["SLURM_JOB_ID"], env["SLURM_JOBID"])
	if id == "" || cmp.Or(env["SLURM_STEP_ID"], env["SLURM_STEPID"]) != "" {
		return slurmAlloc{}, false, nil
	}
	nl := cmp.Or(env["SLURM_JOB_NODELIST"], env["SLURM_NODELIST"])
	if nl == "" {
		return slurmAlloc{}, false, fmt.Errorf("inside Slurm job %s, but SLURM_JOB_NODELIST is not set", id)
	}
	names, err := jobenv.ExpandNodelist(nl)
	if err != nil {
		return slurmAlloc{}, false, fmt.Errorf("Slurm job %s's SLURM_JOB_NODELIST: %w", id, err)
	}
	slots := make([]int, len(names))
	if slotsPerHost > 0 {
		for i := range slots {
			slots[i] = slotsPerHost
		}
	} else {
		v, from := env["SLURM_TASKS_PER_NODE"], "SLURM_TASKS_PER_NODE"
		if v == "" {
			v, from = env["SLURM_JOB_CPUS_PER_NODE"], "SLURM_JOB_CPUS_PER_NODE"
		}
		if v == "" {
			return slurmAlloc{}, false, fmt.Errorf("Slurm job %s sets neither SLURM_TASKS_PER_NODE nor SLURM_JOB_CPUS_PER_NODE: give --slots-per-host", id)
		}
		per, err := jobenv.ParseTasksPerNode(v)
		if err != nil {
			return slurmAlloc{}, false, fmt.Errorf("Slurm job %s's %s: %w", id, from, err)
		}
		if len(per) != len(names) {
			return slurmAlloc{}, false, fmt.Errorf("Slurm job %s: %s=%q counts %d nodes, SLURM_JOB_NODELIST=%q names %d", id, from, v, len(per), nl, len(names))
		}
		copy(slots, per)
	}
	a := slurmAlloc{JobID: id}
	for i, n := range names {
		a.Hosts = append(a.Hosts, elastic.Host{Name: n, Slots: slots[i]})
	}
	return a, true, nil
}
