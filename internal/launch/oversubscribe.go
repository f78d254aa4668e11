package launch

import (
	"fmt"

	"github.com/kolo-dl/kolo/internal/jobenv"
	"github.com/kolo-dl/kolo/internal/launch/flags"
)

// checkOversubscribe refuses a job of this machine alone (no -H, hostfile, discovery script or
// Slurm allocation) of more ranks (local, asked for by flag) than cpus, unless --oversubscribe:
// a typo (-np 999) would start hundreds of processes without a word. Hosts a user lists are
// trusted with their slots, as mpirun does; --bind-to core checks its own split.
func checkOversubscribe(opts *flags.Options, local int, flag string, cpus int) error {
	if opts.Oversubscribe || opts.BindTo == flags.BindCore || local <= cpus {
		return nil
	}
	return fmt.Errorf("%s %d: more ranks than the %d CPUs of this machine; give --oversubscribe (or %s=1) to start them anyway, each with a share of a CPU, or -H/--hostfile to spread them over hosts",
		flag, local, cpus, jobenv.Oversubscribe)
}

// elasticLocalRanks is the most workers an elastic job of this machine alone may start, and the
// flag that allows them.
func elasticLocalRanks(opts *flags.Options) (int, string) {
	n, flag := opts.NP, "-np"
	if opts.MinNP > n {
		n, flag = opts.MinNP, "--min-np"
	}
	if opts.MaxNP > n {
		n, flag = opts.MaxNP, "--max-np"
	}
	return n, flag
}
