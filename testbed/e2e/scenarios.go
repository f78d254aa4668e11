package e2e

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/kolo-dl/kolo"
	"github.com/kolo-dl/kolo/internal/dtype"
	"github.com/kolo-dl/kolo/internal/reduce"
)

// Scenarios maps a name to what every rank runs. Each returns nil when this rank saw what it should.
// A scenario lives in the file of its family, and the test that runs it in the root package's
// file of the same family:
//   - scenarios_ops.go, ops_e2e_test.go: every op against the naive reference, big tensors, submit
//     orders, mismatches, join.
//   - scenarios_failures.go, failures_e2e_test.go: stalls, killed, aborted, stopped and early-ended
//     ranks.
//   - scenarios_launchers.go, launchers_e2e_test.go: ranks started by mpirun or srun, autotuning.
//   - scenarios_processsets.go, processsets_e2e_test.go: process sets, the timeline.
//   - scenarios_device.go, device_e2e_test.go: ops on device memory through the stand-in NCCL, a
//     rank killed inside one, one rank's arguments refused, the staged path with the real
//     libraries and no GPU.
//   - this file: what other tests poke from outside (a steady stream, a loop until killed).
var Scenarios = map[string]func(ctx context.Context) error{
	// scenarios_ops.go
	"ops":      opsScenario,
	"big":      bigScenario,
	"order":    orderScenario,
	"mismatch": mismatchScenario,
	"join":     joinScenario,
	// scenarios_failures.go
	"stall":                  stallScenario,
	"kill":                   killScenario,
	"kill-small":             killSmallScenario,
	"abort":                  abortScenario,
	"ended-early":            endedEarlyScenario,
	"ended-early-unreported": endedEarlyUnreportedScenario,
	"sigstop":                sigstopScenario,
	"sigstop-small":          sigstopSmallScenario,
	"sigstop-between":        sigstopBetweenScenario,
	// scenarios_launchers.go
	"launcher": launcherScenario,
	"autotune": autotuneScenario,
	// scenarios_processsets.go
	"processsets": processSetsScenario,
	"timeline":    timelineScenario,
	// scenarios_device.go
	"device":         deviceScenario,
	"device-kill":    deviceKillScenario,
	"device-staged":  deviceStagedScenario,
	"device-group":   deviceGroupScenario,
	"device-refused": deviceRefusedScenario,
	// this file
	"steady": steadyScenario,
	"loop":   loopScenario,
}

// loopScenario allreduces until an op fails (a test kills part of the job) and returns that error.
// It prints "looping pid=P" once the job is connected.
func loopScenario(ctx context.Context) error {
	fmt.Printf("looping pid=%d\n", os.Getpid())
	buf := make([]float32, 1024)
	for i := 0; ; i++ {
		if err := kolo.Allreduce(ctx, "loop", kolo.Of(buf), kolo.Sum); err != nil {
			return fmt.Errorf("step %d: %w", i, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// steadyScenario is a training-like stream of steps (the same names every step, so the response
// cache is exercised), long enough for a test to poke the job while it runs.
func steadyScenario(ctx context.Context) error {
	for step := 0; step < 150; step++ {
		var checks []check
		for i := 0; i < 4; i++ {
			checks = append(checks, allreduceCheck(fmt.Sprintf("steady.%d", i), 4096+i, dtype.Float32, reduceOps[1]))
		}
		if err := waitAll(ctx, checks); err != nil {
			return fmt.Errorf("step %d: %w", step, err)
		}
		time.Sleep(5 * time.Millisecond)
	}
	return nil
}

// Run initialises kolo, runs scenario and shuts down.
func Run(scenario string) error {
	f, ok := Scenarios[scenario]
	if !ok {
		return fmt.Errorf("unknown scenario %q", scenario)
	}
	if err := kolo.Init(); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	if err := f(ctx); err != nil {
		return fmt.Errorf("rank %d: %w", kolo.Rank(), err)
	}
	return kolo.Shutdown()
}

var reduceOps = []struct {
	op      kolo.Op
	rop     reduce.Op
	average bool
}{
	{kolo.Sum, reduce.Sum, false},
	{kolo.Average, reduce.Sum, true},
	{kolo.Min, reduce.Min, false},
	{kolo.Max, reduce.Max, false},
	{kolo.Product, reduce.Prod, false},
}

// check is a pending verification of one submitted op.
type check struct {
	h      *kolo.Handle
	verify func() error
}

func waitAll(ctx context.Context, checks []check) error {
	var errs []error
	for _, c := range checks {
		if err := c.h.Wait(ctx); err != nil {
			errs = append(errs, err)
			continue
		}
		if err := c.verify(); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}
