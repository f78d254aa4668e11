package e2e

import (
	"context"
	"fmt"
	"os"
	"strconv"

	"github.com/kolo-dl/kolo"
	"github.com/kolo-dl/kolo/internal/dtype"
	"github.com/kolo-dl/kolo/internal/settings"
)

// ExpectEnv tells the "launcher" scenario the placement to expect: size,localSize,crossSize.
var ExpectEnv = settings.E2EExpect.Name

// launcherScenario runs in ranks that mpirun or srun started with no kolo run: it checks that the
// rank kolo took is the launcher's, that the placement is the expected one, then runs every op
// against the reference (opsScenario) and says so on stdout.
func launcherScenario(ctx context.Context) error {
	if _, ok := os.LookupEnv(settings.Rank.Name); ok {
		return fmt.Errorf("%s is set: this scenario must run under mpirun or srun, not kolo run", settings.Rank.Name)
	}
	want := -1
	for _, k := range []string{"OMPI_COMM_WORLD_RANK", "SLURM_PROCID"} {
		if v, ok := os.LookupEnv(k); ok {
			want, _ = strconv.Atoi(v)
			break
		}
	}
	if kolo.Rank() != want {
		return fmt.Errorf("kolo.Rank() = %d, launcher says %d", kolo.Rank(), want)
	}
	var size, localSize, crossSize int
	if _, err := fmt.Sscanf(os.Getenv(ExpectEnv), "%d,%d,%d", &size, &localSize, &crossSize); err != nil {
		return fmt.Errorf("%s=%q: %v", ExpectEnv, os.Getenv(ExpectEnv), err)
	}
	if kolo.Size() != size || kolo.LocalSize() != localSize || kolo.CrossSize() != crossSize ||
		kolo.LocalRank() != kolo.Rank()%localSize || kolo.CrossRank() != 0 {
		return fmt.Errorf("placement rank %d local %d/%d cross %d/%d; want size %d, local size %d, cross size %d",
			kolo.Rank(), kolo.LocalRank(), kolo.LocalSize(), kolo.CrossRank(), kolo.CrossSize(), size, localSize, crossSize)
	}
	if err := opsScenario(ctx); err != nil {
		return err
	}
	fmt.Printf("LAUNCHER-OK rank=%d size=%d\n", kolo.Rank(), kolo.Size())
	return nil
}

// autotuneScenario is a training loop for a job run with autotuning on (KOLO_AUTOTUNE and its
// companions in the environment, however the launcher passes them): 60 steps of four allreduces
// on both sides of the small-allreduce threshold, each checked against the reference, and a
// MarkStep after each, so the tuner samples, switches every rank's settings and decides while
// the sums must stay right. Rank 0 says what it decided when it shuts down.
func autotuneScenario(ctx context.Context) error {
	for step := range 60 {
		var checks []check
		for i, n := range []int{1, 1000, 40_000, 300_000} {
			checks = append(checks, allreduceCheck(fmt.Sprintf("grad.%d", i), n, dtype.Float32, reduceOps[1]))
		}
		if err := waitAll(ctx, checks); err != nil {
			return fmt.Errorf("step %d: %w", step, err)
		}
		kolo.MarkStep()
	}
	fmt.Printf("AUTOTUNE-OK rank=%d size=%d\n", kolo.Rank(), kolo.Size())
	return nil
}
