package worker

import (
	"errors"
	"fmt"
	"hash/fnv"

	"github.com/kolo-dl/kolo/internal/engine"
	"github.com/kolo-dl/kolo/internal/jobenv"
	"github.com/kolo-dl/kolo/internal/world"
)

// isEveryRank reports whether ranks is 0..size-1 in order: the whole job, as without WithRanks.
func isEveryRank(ranks []int, size int) bool {
	if len(ranks) != size {
		return false
	}
	for i, r := range ranks {
		if r != i {
			return false
		}
	}
	return true
}

// subset is the job of ranks (WithRanks) within the launcher's job: ranked by position in ranks,
// local and cross numbers left for world.Connect to derive from the hosts, and a world id of its
// own.
func subset(job jobenv.Job, ranks []int) (jobenv.Job, error) {
	if len(ranks) == 0 {
		return job, errors.New("WithRanks: no ranks")
	}
	seen := map[int]bool{}
	idx := -1
	for i, r := range ranks {
		if r < 0 || r >= job.Size {
			return job, fmt.Errorf("WithRanks %v: rank %d is not a rank of this job of %d", ranks, r, job.Size)
		}
		if seen[r] {
			return job, fmt.Errorf("WithRanks %v: rank %d is listed twice", ranks, r)
		}
		seen[r] = true
		if r == job.Rank {
			idx = i
		}
	}
	if idx < 0 {
		return job, fmt.Errorf("WithRanks %v: this process (rank %d of the job) is not one of them", ranks, job.Rank)
	}
	h := fnv.New64a()
	for _, r := range ranks {
		fmt.Fprintf(h, "%d,", r)
	}
	job.JobID = fmt.Sprintf("%s.ranks%x", job.JobID, h.Sum64())
	job.Rank, job.Size = idx, len(ranks)
	job.LocalRank, job.LocalSize, job.CrossRank, job.CrossSize = 0, 0, 0, 0
	return job, nil
}

// spinSettings settles how long this rank's waits poll. A Spin left unset (negative, as in
// engine.DefaultConfig and in ConfigFromEnv without KOLO_SPIN_TIME) becomes the host's default,
// and the shared-memory waits keep theirs. A Spin given (KOLO_SPIN_TIME, or a Config that sets it)
// governs the shared-memory waits too, unless the world options set ShmSpin themselves: 0 means
// never to spin there as here (for shm.Config.Spin 0 would mean its default).
func spinSettings(cfg engine.Config, w world.Options, localSize int) (engine.Config, world.Options) {
	if cfg.Spin < 0 {
		cfg.Spin = engine.DefaultSpin(localSize)
		cfg.Yields = engine.DefaultYields(localSize)
		return cfg, w
	}
	if w.ShmSpin == 0 {
		w.ShmSpin = cfg.Spin
		if cfg.Spin == 0 {
			w.ShmSpin = -1
		}
	}
	return cfg, w
}
