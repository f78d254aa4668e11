package e2e

import (
	"context"
	"encoding/binary"
	"fmt"
	"math"
	"os"
	"os/signal"
	"syscall"
	"time"
	"unsafe"

	"github.com/kolo-dl/kolo"
	"github.com/kolo-dl/kolo/dtype"
	"github.com/kolo-dl/kolo/gpu"
	"github.com/kolo-dl/kolo/gpu/nccl"
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
