//go:build cgo && linux

package engine

// The device path over internal/gpu/nccl's C layer and the stand-in libnccl/libcudart
// (testbed/ncclstandin), where the fake device cannot show what the real libraries do:
// cudaFree waits for all the device's work.

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"
	"unsafe"

	"github.com/kolo-dl/kolo/internal/gpu"
	"github.com/kolo-dl/kolo/internal/gpu/nccl"
	"github.com/kolo-dl/kolo/testbed/ncclstandin"
)

var standinNCCL struct {
	once sync.Once
	b    nccl.Backend
	err  error
}

// standinBackend is the stand-in NCCL, loaded once per test binary (nccl.Open binds one library
// per process).
func standinBackend(t *testing.T) nccl.Backend {
	t.Helper()
	t.Setenv("STANDIN_NCCL_DIR", t.TempDir())
	report := filepath.Join(t.TempDir(), "report")
	t.Setenv("STANDIN_REPORT", report)
	t.Cleanup(func() {
		if r := ncclstandin.Reports(report); r != "" && !t.Failed() {
			t.Errorf("the stand-in reported misuse:\n%s", r)
		}
	})
	standinNCCL.once.Do(func() {
		dir, err := os.MkdirTemp("", "kolo-standin-")
		if err != nil {
			standinNCCL.err = err
			return
		}
		// The libraries stay mapped for the life of the process; the files need not.
		defer os.RemoveAll(dir)
		l, err := ncclstandin.Build(dir, ncclstandin.Variant{})
		if err != nil {
			standinNCCL.err = err
			return
		}
		standinNCCL.b, standinNCCL.err = nccl.Open(nccl.Options{NCCLPaths: []string{l.NCCL}, CUDAPaths: []string{l.CUDA}})
	})
	if standinNCCL.err != nil {
		t.Fatal(standinNCCL.err)
	}
	return standinNCCL.b
}

// standinComms forms a communicator of n ranks in this process, rank r on device r.
func standinComms(t *testing.T, b nccl.Backend, n int) ([]gpu.Device, []gpu.Comm) {
	t.Helper()
	id, err := b.NewUniqueID()
	if err != nil {
		t.Fatal(err)
	}
	devs, comms, errs := make([]gpu.Device, n), make([]gpu.Comm, n), make([]error, n)
	var wg sync.WaitGroup
	for r := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			if devs[r], errs[r] = b.Device(r); errs[r] == nil {
				comms[r], errs[r] = b.NewComm(ctx, devs[r], id, n, r)
			}
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	return devs, comms
}

// Memory whose readers have run is freed while a collective waits for a peer that never comes:
// cudaFree waits for that collective. The abort that ends it must not wait for the free.
func TestDeviceFreeDoesNotHoldTheAbort(t *testing.T) {
	b := standinBackend(t)
	t.Setenv("STANDIN_DEADLINE_S", "20")
	devs, comms := standinComms(t, b, 2)
	defer comms[1].Abort()
	dev := devs[0]
	d := newDevicePath()
	d.dev = dev
	d.comms = []gpu.Comm{comms[0]}
	stream, err := dev.NewStream()
	if err != nil {
		t.Fatal(err)
	}
	buf, err := dev.Alloc(64)
	if err != nil {
		t.Fatal(err)
	}
	if err := comms[0].AllReduce(buf, buf, 16, gpu.Float32, gpu.Sum, stream); err != nil { // rank 1 never joins it
		t.Fatal(err)
	}
	// A result whose reader has run: its event is complete.
	p, err := dev.Alloc(64)
	if err != nil {
		t.Fatal(err)
	}
	ev, err := dev.NewEvent()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	other, err := dev.NewStream()
	if err != nil {
		t.Fatal(err)
	}
	if err := other.Record(ev); err != nil {
		t.Fatal(err)
	}
	if err := ev.Synchronize(ctx); err != nil {
		t.Fatal(err)
	}
	d.frees = []deferredFree{{p, ev}}

	reaped := make(chan struct{})
	reapedPtrs := make(chan []gpu.Ptr, 1)
	go func() {
		reapedPtrs <- d.reap()
		close(reaped)
	}()
	time.Sleep(100 * time.Millisecond) // the free is under way, or done with
	aborted := make(chan struct{})
	go func() {
		d.abort(errors.New("a peer is lost"))
		close(aborted)
	}()
	select {
	case <-aborted:
	case <-time.After(3 * time.Second):
		t.Fatal("the abort waited 3 s for a cudaFree that waits for the collective only the abort ends")
	}
	if err := stream.Synchronize(ctx); err != nil {
		t.Fatalf("the aborted collective still holds its stream: %v", err)
	}
	select {
	case <-reaped:
	case <-ctx.Done():
		t.Fatal("reap still running after the abort")
	}
	if ps := <-reapedPtrs; len(ps) != 1 || ps[0] != p {
		t.Fatalf("reap returned %v for release, want [%v]", ps, p)
	}
	d.release([]gpu.Ptr{p})
	for {
		d.wmu.Lock()
		done := !d.releasing
		d.wmu.Unlock()
		if done {
			break
		}
		if ctx.Err() != nil {
			t.Fatal("the release still running after the abort")
		}
		time.Sleep(time.Millisecond)
	}
	if err := errors.Join(stream.Destroy(), other.Destroy()); err != nil {
		t.Fatal(err)
	}
}

// standinDevice is a device of the stand-in, whose memory is host memory: the test reads and
// writes it directly.
type standinDevice struct{ gpu.Device }

func (d standinDevice) Unwrap() gpu.Device { return d.Device }

func (standinDevice) Bytes(p gpu.Ptr, n int) ([]byte, error) {
	return unsafe.Slice(*(**byte)(unsafe.Pointer(&p)), n), nil
}

// standinCluster is a cluster of n ranks on the stand-in's devices 0 to n-1, over lib (the
// stand-in's backend, or a wrapper of it).
func standinCluster(t *testing.T, b nccl.Backend, lib gpu.Library, n int) *deviceCluster {
	t.Helper()
	devs := make([]testDevice, n)
	for r := range devs {
		d, err := b.Device(r)
		if err != nil {
			t.Fatal(err)
		}
		devs[r] = standinDevice{d}
	}
	return newDeviceClusterWith(t, DefaultConfig(), lib, b.Version(), devs, nil)
}

// Process sets get communicators split from the global one, or (an NCCL without ncclCommSplit)
// formed from ids of their own, through the stand-in.
func TestDeviceProcessSetsThroughStandin(t *testing.T) {
	t.Run("split", func(t *testing.T) {
		b := standinBackend(t)
		testDeviceProcessSets(t, standinCluster(t, b, b, 3))
	})
	t.Run("new ids", func(t *testing.T) {
		b := standinBackend(t)
		testDeviceProcessSets(t, standinCluster(t, b, noSplitLibrary{b}, 3))
	})
}

// The device conformance suite through internal/gpu/nccl's C layer and the stand-in NCCL, at 2 and 3
// ranks: every op on the device path gives what the host path gives.
func TestDeviceOpsMatchHostPathThroughStandin(t *testing.T) {
	for _, n := range []int{2, 3} {
		t.Run(fmt.Sprint(n), func(t *testing.T) {
			b := standinBackend(t)
			deviceConformance(t, standinCluster(t, b, b, n))
		})
	}
}

// Grouped calls on device memory go in as one group, through the stand-in.
func TestDeviceGroupThroughStandin(t *testing.T) {
	b := standinBackend(t)
	testDeviceGroup(t, standinCluster(t, b, b, 2))
}
