package e2e

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/kolo-dl/kolo"
	"github.com/kolo-dl/kolo/internal/dtype"
	"github.com/kolo-dl/kolo/internal/settings"
)

// stallScenario: the last rank never submits "stalled"; with a short shutdown time the others must
// get an error naming it. The launcher's stderr must show the stall warning (the test checks).
func stallScenario(ctx context.Context) error {
	rank, size := kolo.Rank(), kolo.Size()
	var stalled *kolo.Handle
	if rank != size-1 {
		x := make([]float32, 4)
		stalled = kolo.AllreduceAsync("stalled", kolo.Of(x), kolo.Of(x), kolo.Sum)
	}
	// Ops submitted by everyone go on while "stalled" waits.
	if err := waitAll(ctx, []check{allreduceCheck("after.stall", 10, dtype.Float32, reduceOps[0])}); err != nil {
		return err
	}
	if stalled == nil {
		// The rank that never submits stays busy past the stall shutdown time before it leaves;
		// otherwise its shutdown barrier would itself stall (and rightly fail) at 3 s.
		time.Sleep(4 * time.Second)
	}
	if stalled != nil {
		err := stalled.Wait(ctx)
		if err == nil || !strings.Contains(err.Error(), fmt.Sprintf("rank %d", size-1)) || !strings.Contains(err.Error(), "stalled") {
			return fmt.Errorf("stalled op: got %v, want an error naming rank %d", err, size-1)
		}
	}
	return nil
}

// killScenario: rank 1 kills itself with SIGKILL in the middle of a stream of allreduces. Every
// other rank must fail within 5 s with an error naming rank 1; it prints the error on stderr as
// "KILL-RESULT elapsed=<ms> err=<error>" and exits 3 (the test reads it).
func killScenario(ctx context.Context) error {
	return killRun(ctx, 1<<18, func(i int) string { return fmt.Sprintf("kill.%d", i) })
}

// killSmallScenario is killScenario with one 4-byte allreduce under one name, which from the
// second op on is negotiated as a response-cache id.
func killSmallScenario(ctx context.Context) error {
	return killRun(ctx, 1, func(int) string { return "kill" })
}

func killRun(ctx context.Context, elems int, name func(i int) string) error {
	rank := kolo.Rank()
	signal.Ignore(syscall.SIGTERM) // the test measures the engine's detection, not the launcher's stop
	buf := make([]float32, elems)
	for i := 0; ; i++ {
		if rank == 1 && i == 20 {
			syscall.Kill(os.Getpid(), syscall.SIGKILL)
		}
		start := time.Now()
		err := kolo.Allreduce(ctx, name(i), kolo.Of(buf), kolo.Sum)
		if err != nil {
			fmt.Fprintf(os.Stderr, "KILL-RESULT elapsed=%d err=%v\n", time.Since(start).Milliseconds(), err)
			os.Exit(3)
		}
	}
}

// abortScenario: rank 1 gives up with kolo.Abort("bad batch") after a few allreduces and leaves only
// a second later, with exit code 4, so that every other rank's error ("rank 1 failed: bad batch",
// printed as "ABORT-RESULT err=<error>", exit 3) ends its process well before rank 1 does. The
// launcher must still name rank 1 as the rank that failed, by following that error to it.
func abortScenario(ctx context.Context) error {
	rank := kolo.Rank()
	// Every rank leaves on its own, rank 1 with its own exit code and the others once they have
	// reported the abort: the test is of the engine's notice and the launcher's blame, not its stop.
	signal.Ignore(syscall.SIGTERM)
	buf := make([]float32, 256)
	for i := 0; ; i++ {
		if rank == 1 && i == 5 {
			kolo.Abort(errors.New("bad batch"))
			fmt.Fprintln(os.Stderr, "rank 1: giving up on a bad batch")
			time.Sleep(time.Second)
			os.Exit(4)
		}
		if err := kolo.Allreduce(ctx, fmt.Sprintf("abort.%d", i), kolo.Of(buf), kolo.Sum); err != nil {
			fmt.Fprintf(os.Stderr, "ABORT-RESULT err=%v\n", err)
			os.Exit(3)
		}
	}
}

// endedEarlyScenario: rank 1's program finishes after 5 allreduces and shuts down, while the others
// go on to 50. Their next op fails at once, naming rank 1 ("ENDED-RESULT err=..."), and they
// leave on it as a program does (kolo.ReportFailure, exit 3); rank 1's shutdown then loses them,
// and it exits 0.
func endedEarlyScenario(ctx context.Context) error { return endedEarlyRun(ctx, true) }

// endedEarlyUnreportedScenario is endedEarlyScenario with the others leaving on their op's error
// at once, without kolo.ReportFailure or Shutdown: the failure record must not depend on them.
func endedEarlyUnreportedScenario(ctx context.Context) error { return endedEarlyRun(ctx, false) }

func endedEarlyRun(ctx context.Context, reportFailure bool) error {
	rank := kolo.Rank()
	n := 50
	if rank == 1 {
		n = 5
	}
	buf := make([]float32, 64)
	for i := range n {
		if err := kolo.Allreduce(ctx, fmt.Sprintf("early.%d", i), kolo.Of(buf), kolo.Sum); err != nil {
			fmt.Fprintf(os.Stderr, "ENDED-RESULT err=%v\n", err)
			if reportFailure {
				kolo.ReportFailure(err)
			}
			os.Exit(3)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if rank == 1 {
		kolo.Shutdown() // fails once the others, failing, are gone: this rank's program still succeeded
		os.Exit(0)
	}
	return nil
}

// StopForEnv is how long, in seconds, the sigstop scenario keeps rank 1 stopped.
var StopForEnv = settings.E2EStopSeconds.Name

// StopMarkEnv names a file, on a file system every rank sees, that the sigstop scenario's helper
// creates once rank 1 is stopped: the ranks wait for it rather than for a time, since a loaded
// machine can start the helper late.
var StopMarkEnv = settings.E2EStopMark.Name

// sigstopScenario: every rank runs 40 allreduces of 1 MiB. Rank 1 enters the 21st and has a helper
// process stop it (SIGSTOP) 200 ms later, once its request for the op is out, and continue it
// (SIGCONT) StopForEnv seconds after that; the other ranks enter the op 300 ms after rank 1
// stopped, so that it starts while rank 1 is stopped and they wait on rank 1 inside the
// collective. A rank whose op fails prints "STOP-RESULT rank=R silent=MS err=ERROR" (MS: how long
// it waited in the op) and exits 3; a rank that finishes, every result checked, prints
// "STOP-OK rank=R".
func sigstopScenario(ctx context.Context) error {
	return sigstopRun(ctx, 1<<18, func(i int) string { return fmt.Sprintf("stop.%d", i) }, 200*time.Millisecond)
}

// sigstopSmallScenario is sigstopScenario with one 4-byte allreduce under one name: from the
// second op on it is cached. Rank 1 is stopped 500 ms into the op, long after it sent the op to
// rank 0.
func sigstopSmallScenario(ctx context.Context) error {
	return sigstopRun(ctx, 1, func(int) string { return "stop" }, 500*time.Millisecond)
}

// sigstopBetweenScenario stops rank 1 between two ops: it has finished op 20 and stops 100 ms
// later, before it submits op 21, which the others enter at once. Nothing of rank 1 is in a
// collective: only its silence (no heartbeat) tells it from a rank that computes.
func sigstopBetweenScenario(ctx context.Context) error {
	return sigstopRun(ctx, 1<<10, func(i int) string { return fmt.Sprintf("between.%d", i) }, -100*time.Millisecond)
}

// sigstopRun stops rank 1 stopAfter into op 21; the others enter it 300 ms after rank 1 stopped.
// A negative stopAfter stops rank 1 that long after it finished op 20, before it enters op 21 (it
// waits until it has been stopped), and the others enter op 21 at once.
func sigstopRun(ctx context.Context, elems int, name func(i int) string, stopAfter time.Duration) error {
	rank, size := kolo.Rank(), kolo.Size()
	stopFor, err := strconv.ParseFloat(os.Getenv(StopForEnv), 64)
	if err != nil {
		return fmt.Errorf("%s: %w", StopForEnv, err)
	}
	mark := os.Getenv(StopMarkEnv)
	if mark == "" {
		return fmt.Errorf("%s is not set", StopMarkEnv)
	}
	signal.Ignore(syscall.SIGTERM) // the test measures the engine's detection, not the launcher's stop
	buf := make([]float32, elems)
	for i := range 40 {
		if i == 20 && rank == 1 {
			pid := os.Getpid()
			helper := exec.Command("sh", "-c", fmt.Sprintf(`sleep %g; kill -STOP %d; : >"$1"; sleep %g; kill -CONT %d`, stopAfter.Abs().Seconds(), pid, stopFor, pid), "sh", mark)
			helper.SysProcAttr = &syscall.SysProcAttr{Setpgid: true} // out of reach of the launcher's stop
			if err := helper.Start(); err != nil {
				return err
			}
			go helper.Wait()
			if stopAfter < 0 {
				if err := awaitFile(mark); err != nil { // stopped in here, between ops
					return err
				}
			}
		} else if i == 20 && stopAfter > 0 {
			if err := awaitFile(mark); err != nil {
				return err
			}
			time.Sleep(300 * time.Millisecond)
		}
		for j := range buf {
			buf[j] = float32(rank + 1 + i)
		}
		start := time.Now()
		if err := kolo.Allreduce(ctx, name(i), kolo.Of(buf), kolo.Sum); err != nil {
			fmt.Fprintf(os.Stderr, "STOP-RESULT rank=%d silent=%d err=%v\n", rank, time.Since(start).Milliseconds(), err)
			os.Exit(3)
		}
		// Rank r adds r+1+i: the sum is size(size+1)/2 + size*i.
		want := float32(size*(size+1)/2 + size*i)
		for j, v := range buf {
			if v != want {
				return fmt.Errorf("op %d: element %d is %v, want %v", i, j, v, want)
			}
		}
	}
	fmt.Fprintf(os.Stderr, "STOP-OK rank=%d\n", rank)
	return nil
}

// awaitFile waits until path exists.
func awaitFile(path string) error {
	deadline := time.Now().Add(30 * time.Second)
	for {
		if _, err := os.Stat(path); err == nil {
			return nil
		} else if !errors.Is(err, fs.ErrNotExist) {
			return err
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("waited 30 s for %s, which the stopping helper creates", path)
		}
		time.Sleep(5 * time.Millisecond)
	}
}
