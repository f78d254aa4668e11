package spin

import (
	"os"
	"runtime"
	"sync"
	"time"

	"github.com/kolo-dl/kolo/internal/cpuset"
	"github.com/kolo-dl/kolo/internal/settings"
)

const (
	// DefaultSpin is how long a wait polls before it sleeps on a host with a CPU for every rank.
	// Spinning buys latency only while the awaited peer runs at the same time; 50 µs rather than a
	// few because a rank asleep in a collective can stay asleep while its spinning peer holds the
	// core its wake-up was queued on: with 5 µs, a quarter of 2-rank runs on a host with 2 cores
	// settled into ~100 µs per small allreduce instead of ~10 µs (`bench/python_latency.py --np 2
	// --sizes 4 --rounds 5 --kolo-env KOLO_SPIN_TIME=5` shows it).
	DefaultSpin = 50 * time.Microsecond
	// DefaultYields is how many times a wait that does not poll yields its CPU (Yield) before it
	// sleeps, on a host whose ranks outnumber its CPUs. A yield hands the core to a rank that can
	// run, often the one awaited, for about a microsecond of system call, where a futex sleep and
	// wake-up costs tens of microseconds: with 4 ranks on 2 cores (`kolo bench
	// allreduce -np 4`, 200 ops) a 4-byte allreduce went from 218-257 us to 118-151 us, 4 KiB from
	// 249-288 to 147-165 us; 8 yields gave half of that, 128 or 512 no more.
	DefaultYields = 32
)

// Defaults is how a wait on a host running ranks ranks (on HostCPUs CPUs) behaves before it
// sleeps: it polls for spin when every rank has a CPU; when the ranks outnumber the CPUs polling
// only steals the core the awaited rank needs, so spin is 0 and it yields the CPU yields times
// instead. The engine's driver and the shared-memory transport's waits both follow this rule.
func Defaults(ranks int) (spin time.Duration, yields int) {
	if ranks > HostCPUs() {
		return 0, DefaultYields
	}
	return DefaultSpin, 0
}

// HostCPUs is how many CPUs this host gives its ranks: what kolo run --bind-to core says
// (settings.HostCPUs); else the CPUs this process may use, or those of the process that started it
// if more. A launcher that binds each rank to cores of its own (mpirun does by default for 2 ranks,
// srun --cpu-bind) leaves the rank a mask of its own share, while its own mask spans what the job
// may use on this host; a launcher started under a narrower mask passes it on to its ranks.
func HostCPUs() int {
	if n, err := settings.HostCPUs.Count(os.Getenv); err == nil && n > 0 {
		return n
	}
	return max(runtime.NumCPU(), parentCPUs())
}

// parentCPUs is how many CPUs the parent process may use (0 if unknown); masks of running
// processes rarely change, and a rank asks once.
var parentCPUs = sync.OnceValue(func() int {
	s, err := cpuset.Of(os.Getppid())
	if err != nil {
		return 0
	}
	return len(s)
})
