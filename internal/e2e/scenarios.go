package e2e

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"math/rand/v2"
	"os"
	"os/exec"
	"os/signal"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/kolo-dl/kolo"
	"github.com/kolo-dl/kolo/dtype"
	"github.com/kolo-dl/kolo/reduce"
)

// Scenarios maps a name to what every rank runs. Each returns nil when this rank saw what it should.
var Scenarios = map[string]func(ctx context.Context) error{
	"ops":                    opsScenario,
	"big":                    bigScenario,
	"order":                  orderScenario,
	"mismatch":               mismatchScenario,
	"stall":                  stallScenario,
	"join":                   joinScenario,
	"kill":                   killScenario,
	"kill-small":             killSmallScenario,
	"abort":                  abortScenario,
	"ended-early":            endedEarlyScenario,
	"ended-early-unreported": endedEarlyUnreportedScenario,
	"steady":                 steadyScenario,
	"loop":                   loopScenario,
	"sigstop":                sigstopScenario,
	"sigstop-small":          sigstopSmallScenario,
	"sigstop-between":        sigstopBetweenScenario,
	"shell-env":              shellEnvScenario,
}

// ShellOnly is a variable a test sets only in the launcher's environment; the shell-env scenario
// checks every rank has it, and not the launcher's CUDA_VISIBLE_DEVICES (per host, as horovodrun).
const ShellOnly = "E2E_SET_IN_THE_LAUNCHING_SHELL"

func shellEnvScenario(context.Context) error {
	if v := os.Getenv(ShellOnly); v != "yes" {
		return fmt.Errorf("%s=%q, want the launcher's \"yes\"", ShellOnly, v)
	}
	if v, ok := os.LookupEnv("CUDA_VISIBLE_DEVICES"); ok {
		return fmt.Errorf("the launcher's CUDA_VISIBLE_DEVICES=%q reached it", v)
	}
	return nil
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

// allreduceCheck submits one allreduce of n elements and returns its verification.
func allreduceCheck(name string, n int, t dtype.DType, ro struct {
	op      kolo.Op
	rop     reduce.Op
	average bool
}) check {
	rank, size := kolo.Rank(), kolo.Size()
	data := Encode(t, Input(name, rank, n, t, ro.rop))
	tensor := kolo.Tensor{Data: data, DType: t, Shape: []int64{int64(n)}}
	h := kolo.AllreduceAsync(name, tensor, tensor, ro.op)
	return check{h, func() error {
		want := Allreduce(name, size, n, t, ro.rop, ro.average)
		return Compare(fmt.Sprintf("allreduce %s", name), Decode(t, data), want, Tolerance(t, ro.average))
	}}
}

// opsScenario: every op x dtype x reduction at awkward sizes, submitted together so they fuse.
func opsScenario(ctx context.Context) error {
	size := kolo.Size()
	sizes := []int{0, 1, 7, 13, 1000}
	if n := 2*size + 1; !slices.Contains(sizes, n) { // not a multiple of the rank count
		sizes = append(sizes, n)
	}
	var checks []check
	for _, t := range dtype.All {
		for _, ro := range reduceOps {
			for _, n := range sizes {
				name := fmt.Sprintf("ar.%v.%v.%d", t, ro.op, n)
				checks = append(checks, allreduceCheck(name, n, t, ro))
			}
		}
		checks = append(checks, allgatherCheck(t), alltoallCheck(t), reducescatterCheck(t, reduceOps[0]), reducescatterCheck(t, reduceOps[1]))
		for root := 0; root < size; root++ {
			checks = append(checks, broadcastCheck(t, root, 11))
		}
	}
	// Pre- and post-scaling.
	{
		rank := kolo.Rank()
		name := "ar.scaled"
		data := Encode(dtype.Float32, Input(name, rank, 9, dtype.Float32, reduce.Sum))
		tensor := kolo.Tensor{Data: data, DType: dtype.Float32, Shape: []int64{9}}
		h := kolo.AllreduceAsync(name, tensor, tensor, kolo.Sum, kolo.Prescale(2), kolo.Postscale(0.25))
		checks = append(checks, check{h, func() error {
			want := Allreduce(name, size, 9, dtype.Float32, reduce.Sum, false)
			for i := range want {
				want[i] *= 0.5
			}
			return Compare(name, Decode(dtype.Float32, data), want, 1e-6)
		}})
	}
	if err := waitAll(ctx, checks); err != nil {
		return err
	}
	return kolo.Barrier(ctx)
}

// bigScenario: several MiB through every op, where chunking, rings and shared slots matter.
func bigScenario(ctx context.Context) error {
	n := 3<<20/4 + 3 // ~3 MiB of float32, not a multiple of anything nice
	var checks []check
	for _, t := range []dtype.DType{dtype.Float32, dtype.Float16, dtype.Int32} {
		checks = append(checks, allreduceCheck(fmt.Sprintf("big.%v", t), n*4/t.Size(), t, reduceOps[0]))
	}
	checks = append(checks, allreduceCheck("big.avg", n, dtype.Float32, reduceOps[1]))
	checks = append(checks, broadcastCheck(dtype.Float32, kolo.Size()-1, n))
	if err := waitAll(ctx, checks); err != nil {
		return err
	}
	return waitAll(ctx, []check{bigAllgather(ctx)})
}

func bigAllgather(ctx context.Context) check {
	rank, size := kolo.Rank(), kolo.Size()
	rows := func(r int) int { return 100000 + 1000*r }
	name := "big.allgather"
	data := Encode(dtype.Float32, Input(name, rank, rows(rank)*3, dtype.Float32, reduce.Sum))
	h := kolo.AllgatherAsync(name, kolo.Tensor{Data: data, DType: dtype.Float32, Shape: []int64{int64(rows(rank)), 3}})
	return check{h, func() error {
		var want []float64
		for r := 0; r < size; r++ {
			want = append(want, Input(name, r, rows(r)*3, dtype.Float32, reduce.Sum)...)
		}
		return Compare(name, Decode(dtype.Float32, h.Tensor().Data), want, 0)
	}}
}

func broadcastCheck(t dtype.DType, root, n int) check {
	rank := kolo.Rank()
	name := fmt.Sprintf("bc.%v.%d.%d", t, root, n)
	data := Encode(t, Input(name, rank, n, t, reduce.Sum))
	tensor := kolo.Tensor{Data: data, DType: t, Shape: []int64{int64(n)}}
	h := kolo.BroadcastAsync(name, tensor, root)
	return check{h, func() error {
		return Compare(name, Decode(t, data), Input(name, root, n, t, reduce.Sum), 0)
	}}
}

// allgatherCheck: rank r contributes (3r+1)%4 rows of 3 (some ranks contribute none).
func allgatherCheck(t dtype.DType) check {
	rank, size := kolo.Rank(), kolo.Size()
	rows := func(r int) int { return (3*r + 1) % 4 }
	name := fmt.Sprintf("ag.%v", t)
	data := Encode(t, Input(name, rank, rows(rank)*3, t, reduce.Sum))
	h := kolo.AllgatherAsync(name, kolo.Tensor{Data: data, DType: t, Shape: []int64{int64(rows(rank)), 3}})
	return check{h, func() error {
		var want []float64
		total := 0
		for r := 0; r < size; r++ {
			want = append(want, Input(name, r, rows(r)*3, t, reduce.Sum)...)
			total += rows(r)
		}
		out := h.Tensor()
		if len(out.Shape) != 2 || out.Shape[0] != int64(total) || out.Shape[1] != 3 {
			return fmt.Errorf("%s: result shape %v, want [%d 3]", name, out.Shape, total)
		}
		return Compare(name, Decode(t, out.Data), want, 0)
	}}
}

// alltoallCheck: src sends (src+2*dst)%3 rows of 2 to dst.
func alltoallCheck(t dtype.DType) check {
	rank, size := kolo.Rank(), kolo.Size()
	split := func(src, dst int) int { return (src + 2*dst) % 3 }
	name := fmt.Sprintf("a2a.%v", t)
	rowsOf := func(src int) int {
		n := 0
		for d := 0; d < size; d++ {
			n += split(src, d)
		}
		return n
	}
	splits := make([]int64, size)
	for d := range splits {
		splits[d] = int64(split(rank, d))
	}
	data := Encode(t, Input(name, rank, rowsOf(rank)*2, t, reduce.Sum))
	h := kolo.AlltoallAsync(name, kolo.Tensor{Data: data, DType: t, Shape: []int64{int64(rowsOf(rank)), 2}}, splits)
	return check{h, func() error {
		var want []float64
		for src := 0; src < size; src++ {
			in := Input(name, src, rowsOf(src)*2, t, reduce.Sum)
			off := 0
			for d := 0; d < rank; d++ {
				off += split(src, d) * 2
			}
			want = append(want, in[off:off+split(src, rank)*2]...)
		}
		got := h.RecvSplits()
		for src := 0; src < size; src++ {
			if src < len(got) && got[src] != int64(split(src, rank)) {
				return fmt.Errorf("%s: received splits %v", name, got)
			}
		}
		return Compare(name, Decode(t, h.Tensor().Data), want, 0)
	}}
}

// reducescatterCheck: dim 0 of 2n+1 rows of 2, not a multiple of the rank count.
func reducescatterCheck(t dtype.DType, ro struct {
	op      kolo.Op
	rop     reduce.Op
	average bool
}) check {
	rank, size := kolo.Rank(), kolo.Size()
	d0 := 2*size + 1
	name := fmt.Sprintf("rs.%v.%v", t, ro.op)
	data := Encode(t, Input(name, rank, d0*2, t, ro.rop))
	h := kolo.ReduceScatterAsync(name, kolo.Tensor{Data: data, DType: t, Shape: []int64{int64(d0), 2}}, ro.op)
	return check{h, func() error {
		full := Allreduce(name, size, d0*2, t, ro.rop, ro.average)
		start := 0
		for r := 0; r < rank; r++ {
			start += d0 / size
			if r < d0%size {
				start++
			}
		}
		rows := d0 / size
		if rank < d0%size {
			rows++
		}
		return Compare(name, Decode(t, h.Tensor().Data), full[start*2:(start+rows)*2], Tolerance(t, ro.average))
	}}
}

// orderScenario: every rank submits the same 60 tensors in its own random order.
func orderScenario(ctx context.Context) error {
	rank := kolo.Rank()
	idx := rand.New(rand.NewPCG(uint64(rank), 1)).Perm(60)
	var checks []check
	for _, i := range idx {
		checks = append(checks, allreduceCheck(fmt.Sprintf("order.%d", i), 1+i*37, dtype.Float32, reduceOps[0]))
	}
	return waitAll(ctx, checks)
}

// mismatchScenario: rank 1 sends a different shape, the last rank a different dtype; every rank
// must get an error naming the tensor, the ranks and what each sent, and the job must go on.
func mismatchScenario(ctx context.Context) error {
	rank, size := kolo.Rank(), kolo.Size()
	shape := []int64{4}
	if rank == 1 {
		shape = []int64{5}
	}
	data := make([]float32, shape[0])
	err := kolo.Allreduce(ctx, "bad.shape", kolo.Of(data, shape...), kolo.Sum)
	if err == nil {
		return errors.New("mismatched shapes succeeded")
	}
	for _, want := range []string{`"allreduce.bad.shape"`, "rank 1", "[5]", "[4]"} {
		if !strings.Contains(err.Error(), want) {
			return fmt.Errorf("mismatch error %q lacks %q", err, want)
		}
	}
	var d kolo.Tensor
	if rank == size-1 {
		d = kolo.Of(make([]float64, 3))
	} else {
		d = kolo.Of(make([]float32, 3))
	}
	err = kolo.Allreduce(ctx, "bad.dtype", d, kolo.Sum)
	if err == nil || !strings.Contains(err.Error(), "float64") || !strings.Contains(err.Error(), fmt.Sprintf("rank %d", size-1)) {
		return fmt.Errorf("dtype mismatch error %v does not name rank %d and float64", err, size-1)
	}
	// The job goes on.
	return waitAll(ctx, []check{allreduceCheck("after.mismatch", 10, dtype.Float32, reduceOps[0])})
}

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

// joinScenario: rank 0 joins at once; the others run allreduces that rank 0 contributes nothing
// to, then join. Join returns the same last rank everywhere.
func joinScenario(ctx context.Context) error {
	rank, size := kolo.Rank(), kolo.Size()
	if rank != 0 {
		for i := 0; i < 3; i++ {
			name := fmt.Sprintf("join.%d", i)
			data := Encode(dtype.Float32, Input(name, rank, 50, dtype.Float32, reduce.Sum))
			if err := kolo.Allreduce(ctx, name, kolo.Tensor{Data: data, DType: dtype.Float32, Shape: []int64{50}}, kolo.Sum); err != nil {
				return err
			}
			want := make([]float64, 50)
			for r := 1; r < size; r++ {
				for j, v := range Input(name, r, 50, dtype.Float32, reduce.Sum) {
					want[j] += v
				}
			}
			if err := Compare(name, Decode(dtype.Float32, data), want, 0); err != nil {
				return err
			}
		}
	}
	last, err := kolo.Join(ctx)
	if err != nil {
		return err
	}
	if last < 0 || last >= size || (size > 1 && last == 0) {
		return fmt.Errorf("join: last rank %d, want one of 1..%d", last, size-1)
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
const StopForEnv = "KOLO_E2E_STOP_SECONDS"

// StopMarkEnv names a file, on a file system every rank sees, that the sigstop scenario's helper
// creates once rank 1 is stopped: the ranks wait for it rather than for a time, since a loaded
// machine can start the helper late.
const StopMarkEnv = "KOLO_E2E_STOP_MARK"

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
