package e2e

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"
	"unsafe"

	"github.com/kolo-dl/kolo"
	"github.com/kolo-dl/kolo/internal/dtype"
	"github.com/kolo-dl/kolo/internal/gpu"
	"github.com/kolo-dl/kolo/internal/gpu/nccl"
)

// The device scenarios run ops on tensors in device memory on the device path, through the NCCL
// and CUDA runtime the loader finds: tests put the stand-in ones (testbed/ncclstandin), whose
// device memory is host memory, on LD_LIBRARY_PATH. Each rank uses device LocalRank.

// deviceMemory is n float32 in device memory of the stand-in, read and written by the host.
func deviceMemory(ordinal, n int) (gpu.Ptr, []byte, error) {
	b, err := nccl.Open(nccl.Options{}) // the library the device path binds (one per process)
	if err != nil {
		return 0, nil, err
	}
	dev, err := b.Device(ordinal)
	if err != nil {
		return 0, nil, err
	}
	p, err := dev.Alloc(4 * n)
	if err != nil {
		return 0, nil, err
	}
	return p, unsafe.Slice(*(**byte)(unsafe.Pointer(&p)), 4*n), nil
}

func deviceSetUp(ctx context.Context) (int, error) {
	ordinal := kolo.LocalRank()
	dec, err := kolo.DevicePath(ctx, ordinal)
	if err != nil {
		return 0, err
	}
	if !dec.Use {
		return 0, fmt.Errorf("device path not used: %v", dec.Why)
	}
	return ordinal, nil
}

// deviceScenario allreduces and allgathers float32 tensors in device memory.
func deviceScenario(ctx context.Context) error {
	ordinal, err := deviceSetUp(ctx)
	if err != nil {
		return err
	}
	rank, size := kolo.Rank(), kolo.Size()
	const n = 1000
	p, m, err := deviceMemory(ordinal, n)
	if err != nil {
		return err
	}
	for step := range 5 {
		for i := range n {
			binary.LittleEndian.PutUint32(m[4*i:], math.Float32bits(float32(rank+i+step)))
		}
		t := kolo.DeviceTensor{Ptr: p, DType: dtype.Float32, Shape: []int64{n}}
		h := kolo.SubmitDevice(kolo.KindAllreduce, fmt.Sprintf("dev.ar.%d", step), t, p, kolo.Sum, 0, nil, ordinal, 0)
		if err := h.Synchronize(ctx); err != nil {
			return fmt.Errorf("step %d: allreduce: %w", step, err)
		}
		for i := range n {
			got := math.Float32frombits(binary.LittleEndian.Uint32(m[4*i:]))
			if want := float32(size*(size-1)/2 + size*(i+step)); got != want {
				return fmt.Errorf("step %d: allreduce[%d] = %v, want %v", step, i, got, want)
			}
		}
		g := kolo.SubmitDevice(kolo.KindAllgather, fmt.Sprintf("dev.ag.%d", step), kolo.DeviceTensor{Ptr: p, DType: dtype.Float32,
			Shape: []int64{int64(rank + 1)}}, 0, kolo.Sum, 0, nil, ordinal, 0)
		if err := g.Synchronize(ctx); err != nil {
			return fmt.Errorf("step %d: allgather: %w", step, err)
		}
		out, bytes, _ := g.DeviceOutput()
		if want := 4 * size * (size + 1) / 2; bytes != want {
			return fmt.Errorf("step %d: allgather of %d bytes, want %d", step, bytes, want)
		}
		gathered := unsafe.Slice(*(**byte)(unsafe.Pointer(&out)), bytes)
		k := 0
		for q := range size {
			for j := range q + 1 {
				got := math.Float32frombits(binary.LittleEndian.Uint32(gathered[4*k:]))
				if want := float32(size*(size-1)/2 + size*(j+step)); got != want {
					return fmt.Errorf("step %d: allgather: rank %d's element %d = %v, want %v", step, q, j, got, want)
				}
				k++
			}
		}
		if err := g.ReleaseDeviceOutput(0); err != nil {
			return err
		}
	}
	return nil
}

// deviceKillScenario allreduces in device memory until rank 1 kills itself with -9 at step 20;
// every other rank prints how long its op took to fail, and exits 3.
func deviceKillScenario(ctx context.Context) error {
	ordinal, err := deviceSetUp(ctx)
	if err != nil {
		return err
	}
	signal.Ignore(syscall.SIGTERM) // the test measures the engine's detection, not the launcher's stop
	p, _, err := deviceMemory(ordinal, 1<<16)
	if err != nil {
		return err
	}
	for i := 0; ; i++ {
		if kolo.Rank() == 1 && i == 20 {
			syscall.Kill(os.Getpid(), syscall.SIGKILL)
		}
		start := time.Now()
		t := kolo.DeviceTensor{Ptr: p, DType: dtype.Float32, Shape: []int64{1 << 16}}
		err := kolo.SubmitDevice(kolo.KindAllreduce, fmt.Sprintf("dev.kill.%d", i), t, p, kolo.Sum, 0, nil, ordinal, 0).Synchronize(ctx)
		if err != nil {
			fmt.Fprintf(os.Stderr, "KILL-RESULT elapsed=%d err=%v\n", time.Since(start).Milliseconds(), err)
			os.Exit(3)
		}
	}
}

// deviceStagedScenario sets the device path up where it cannot serve (the real libraries on a
// machine without a GPU): every rank must decide to stage, and print why.
func deviceStagedScenario(ctx context.Context) error {
	dec, err := kolo.DevicePath(ctx, kolo.LocalRank())
	if err != nil {
		return err
	}
	if dec.Use {
		return fmt.Errorf("the device path is used")
	}
	fmt.Printf("STAGED why=%v\n", dec.Why)
	return nil
}

// deviceGroupScenario runs grouped allreduces and allgathers of float32 tensors in device memory
// (kolo.SubmitDeviceGroup), named and unnamed.
func deviceGroupScenario(ctx context.Context) error {
	ordinal, err := deviceSetUp(ctx)
	if err != nil {
		return err
	}
	rank, size := kolo.Rank(), kolo.Size()
	lens := []int{1, 7, 300}
	ptrs := make([]gpu.Ptr, len(lens))
	mems := make([][]byte, len(lens))
	for i, l := range lens {
		if ptrs[i], mems[i], err = deviceMemory(ordinal, l); err != nil {
			return err
		}
	}
	f := func(m []byte, j int) float32 { return math.Float32frombits(binary.LittleEndian.Uint32(m[4*j:])) }
	for step := range 4 {
		name := fmt.Sprintf("dev.group.%d", step)
		if step%2 == 1 {
			name = "" // numbered alike on every rank
		}
		ts := make([]kolo.DeviceTensor, len(lens))
		for i, l := range lens {
			for j := range l {
				binary.LittleEndian.PutUint32(mems[i][4*j:], math.Float32bits(float32(rank+i+j+step)))
			}
			ts[i] = kolo.DeviceTensor{Ptr: ptrs[i], DType: dtype.Float32, Shape: []int64{int64(l)}}
		}
		for i, h := range kolo.SubmitDeviceGroup(kolo.KindAllreduce, name, ts, nil, kolo.Sum, ordinal, 0) {
			if err := h.Synchronize(ctx); err != nil {
				return fmt.Errorf("step %d: grouped allreduce, tensor %d: %w", step, i, err)
			}
		}
		for i, l := range lens {
			for j := range l {
				if got, want := f(mems[i], j), float32(size*(size-1)/2+size*(i+j+step)); got != want {
					return fmt.Errorf("step %d: grouped allreduce, tensor %d [%d] = %v, want %v", step, i, j, got, want)
				}
			}
		}
		// Allgather each tensor's first rank+1 elements (the sums above).
		for i := range ts {
			ts[i].Shape = []int64{int64(min(rank+1, lens[i]))}
		}
		hs := kolo.SubmitDeviceGroup(kolo.KindAllgather, name, ts, nil, kolo.Sum, ordinal, 0)
		for i, h := range hs {
			if err := h.Synchronize(ctx); err != nil {
				return fmt.Errorf("step %d: grouped allgather, tensor %d: %w", step, i, err)
			}
			out, n, _ := h.DeviceOutput()
			gathered := unsafe.Slice(*(**byte)(unsafe.Pointer(&out)), n)
			k := 0
			for q := range size {
				for j := range min(q+1, lens[i]) {
					if got, want := f(gathered, k), float32(size*(size-1)/2+size*(i+j+step)); got != want {
						return fmt.Errorf("step %d: grouped allgather, tensor %d: rank %d's element %d = %v, want %v", step, i, q, j, got, want)
					}
					k++
				}
			}
			if 4*k != n {
				return fmt.Errorf("step %d: grouped allgather, tensor %d: %d bytes, want %d", step, i, n, 4*k)
			}
			if err := h.ReleaseDeviceOutput(0); err != nil {
				return err
			}
		}
	}
	return nil
}

// deviceRefusedScenario submits device ops that rank 1 gets wrong, one way per op, while the other
// ranks get them right: every rank must fail each op within 5 s (the stall checks wait 30 s and
// more), rank 1 with an ArgumentError saying what is wrong, the others with its reason, naming
// rank 1, as for an op in host memory. A grouped call with one such member fails every member on
// every rank. An op every rank gets right then runs: the job goes on.
func deviceRefusedScenario(ctx context.Context) error {
	ordinal, err := deviceSetUp(ctx)
	if err != nil {
		return err
	}
	rank, size := kolo.Rank(), kolo.Size()
	const n = 8
	p, m, err := deviceMemory(ordinal, n)
	if err != nil {
		return err
	}
	// One op of each case, as every rank submits it; spoil makes it rank 1's.
	type call struct {
		kind    kolo.OpKind
		t       kolo.DeviceTensor
		op      kolo.Op
		ordinal int
		opts    []kolo.OpOption
	}
	cases := []struct {
		name  string
		kind  kolo.OpKind
		spoil func(*call)
		want  string
	}{
		{"reduction", kolo.KindAllreduce, func(c *call) { c.op = kolo.Op(9) }, "unsupported reduction op(9)"},
		{"nan", kolo.KindAllreduce, func(c *call) { c.opts = []kolo.OpOption{kolo.Prescale(math.NaN())} }, "NaN scale factor"},
		{"scalar", kolo.KindAllgather, func(c *call) { c.t.Shape = nil }, "needs a tensor with at least one dimension"},
		{"negative", kolo.KindAllreduce, func(c *call) { c.t.Shape = []int64{-n} }, "negative dimension"},
		{"ordinal", kolo.KindAllreduce, func(c *call) { c.ordinal = -1 }, "device -1 is not a device ordinal"},
		{"other-device", kolo.KindAllreduce, func(c *call) { c.ordinal = ordinal + 1 }, "the device path runs on device"},
	}
	// check says what is wrong with the error of a case's op on this rank, which took d to fail.
	check := func(what, want string, err error, d time.Duration) error {
		var ae *kolo.ArgumentError
		switch {
		case d > 5*time.Second:
			return fmt.Errorf("%s: failed after %v, not at once: %v", what, d, err)
		case err == nil || !strings.Contains(err.Error(), want):
			return fmt.Errorf("%s: %v, want a refusal saying %q", what, err, want)
		case rank == 1 && !errors.As(err, &ae):
			return fmt.Errorf("%s: %v, want an ArgumentError", what, err)
		case rank != 1 && !strings.Contains(err.Error(), "rank 1 refused it"):
			return fmt.Errorf("%s: %v, want rank 1 named", what, err)
		}
		return nil
	}
	for _, tc := range cases {
		c := call{kind: tc.kind, t: kolo.DeviceTensor{Ptr: p, DType: dtype.Float32, Shape: []int64{n}}, op: kolo.Sum, ordinal: ordinal}
		if rank == 1 {
			tc.spoil(&c)
		}
		start := time.Now()
		h := kolo.SubmitDevice(c.kind, "dev.refused."+tc.name, c.t, p, c.op, 0, nil, c.ordinal, 0, c.opts...)
		if err := check(tc.name, tc.want, h.Synchronize(ctx), time.Since(start)); err != nil {
			return err
		}
	}
	ts := []kolo.DeviceTensor{{Ptr: p, DType: dtype.Float32, Shape: []int64{n}}, {Ptr: p, DType: dtype.Float32, Shape: []int64{n}}}
	if rank == 1 {
		ts[1].Shape = []int64{-1}
	}
	start := time.Now()
	for i, h := range kolo.SubmitDeviceGroup(kolo.KindAllreduce, "dev.refused.group", ts, nil, kolo.Sum, ordinal, 0) {
		if err := check(fmt.Sprintf("group member %d", i), "grouped allreduce, tensor 1: input: negative dimension", h.Synchronize(ctx), time.Since(start)); err != nil {
			return err
		}
	}
	for i := range n {
		binary.LittleEndian.PutUint32(m[4*i:], math.Float32bits(float32(rank)))
	}
	t := kolo.DeviceTensor{Ptr: p, DType: dtype.Float32, Shape: []int64{n}}
	if err := kolo.SubmitDevice(kolo.KindAllreduce, "dev.refused.after", t, p, kolo.Sum, 0, nil, ordinal, 0).Synchronize(ctx); err != nil {
		return fmt.Errorf("the op after the refusals: %w", err)
	}
	if got, want := math.Float32frombits(binary.LittleEndian.Uint32(m)), float32(size*(size-1)/2); got != want {
		return fmt.Errorf("the op after the refusals: %v, want %v", got, want)
	}
	return nil
}
