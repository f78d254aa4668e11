package engine

// Device ops: submitting them, their handles' completion and results (see device.go).

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/kolo-dl/kolo/internal/dtype"
	"github.com/kolo-dl/kolo/internal/engine/negotiate"
	"github.com/kolo-dl/kolo/internal/gpu"
)

// DeviceOp is the device side of an op on tensors in device memory.
type DeviceOp struct {
	Ordinal int
	// Stream is the producer's stream (torch's current stream, adopted with Device.WrapStream):
	// the engine's work waits for what was enqueued on it before the op was submitted.
	Stream gpu.Stream
	// In holds the input (the bytes its shape and dtype say); Out receives the result of an
	// allreduce or broadcast (as many bytes; it may be In). Allgather, alltoall and reducescatter
	// leave theirs in memory the engine allocates (Handle.DeviceOutput).
	In, Out gpu.Ptr
	Bytes   int // In's size in bytes
}

// EnqueueDevice submits an op on device memory. The handle completes when the op's device work is
// enqueued on the engine's stream, not when it has run: the caller then makes its consumer stream
// wait on it (Handle.WaitOnStream), or blocks the host (Handle.Synchronize).
//
// The op is refused, and the caller stages it through host memory as before, when the device path
// is not in use (the error matches gpu.ErrUnavailable and says why) or cannot run it: Adasum,
// element types NCCL lacks, prescale or postscale factors (no kernels run without a CUDA compiler:
// the binding scales with torch ops before and after). Average uses NCCL's Avg: for floats each
// input is multiplied by 1/n, then summed; for integers the sum is divided by n and truncated
// toward zero, which is what the host path's postscale of 1/n gives integers.
//
// An op whose arguments are wrong on this rank (a tensor on another device, no producer stream,
// or what Enqueue refuses) fails with an ArgumentError, and the other ranks' submissions of it with
// its text, as Enqueue's refusals do.
func (e *Engine) EnqueueDevice(req negotiate.Request, op DeviceOp) *Handle {
	dv, local, refused := e.prepareDevice(&req, op)
	switch {
	case local != nil:
		h := newHandle(req.Name, e)
		h.finish(local)
		return h
	case refused != nil:
		req.Error = refused.Error()
	}
	return e.enqueue(req, nil, nil, true, dv)
}

// EnqueueDeviceGroup submits the members of one grouped call on device memory (reqs[i] on
// ops[i]) as EnqueueDevice would, all at once, as EnqueueGroup does for host memory: the
// coordinator negotiates them together and they fuse only with each other. If the device path
// refuses one member, it refuses every member with that error before any is queued (the binding
// then stages the group): a group is run by one path or not at all. If one member's arguments are
// wrong, every member is refused, on every rank.
func (e *Engine) EnqueueDeviceGroup(reqs []negotiate.Request, ops []DeviceOp) []*Handle {
	dvs := make([]*deviceEntry, len(reqs))
	var refused error
	for i := range reqs {
		dv, local, ref := e.prepareDevice(&reqs[i], ops[i])
		if local != nil {
			hs := make([]*Handle, len(reqs))
			for j := range hs {
				e.dev.drop(dvs[j])
				hs[j] = newHandle(reqs[j].Name, e)
				hs[j].finish(local)
			}
			return hs
		}
		if ref != nil && refused == nil {
			refused = fmt.Errorf("grouped %s, tensor %d: %w", reqs[i].Kind, i, ref)
		}
		dvs[i] = dv
	}
	if refused != nil {
		for i := range reqs {
			e.dev.drop(dvs[i])
			dvs[i] = nil
			reqs[i].Error = refused.Error()
		}
	}
	return e.enqueueGroup(reqs, nil, nil, dvs)
}

// prepareDevice runs EnqueueDevice's checks of req on op and records op's ready event on its
// stream; it marks req as a GPU op. It fails with local, an error for this rank alone: the device
// path's setup error, or an ArgumentError for a name of kolo's own or for an op the device path
// cannot run (matching gpu.ErrUnavailable: the binding stages it, as every rank does); or with
// refused, what is wrong with the op's arguments on this rank, which the other ranks hear of.
func (e *Engine) prepareDevice(req *negotiate.Request, op DeviceOp) (dv *deviceEntry, local, refused error) {
	here := func(err error) (*deviceEntry, error, error) {
		return nil, &ArgumentError{fmt.Errorf("rank %d: %s %q: %w", e.g.Rank, req.Kind, req.Name, err)}, nil
	}
	if reservedName(req.Name) {
		return here(errors.New("names starting with kolo's reserved prefixes are kolo's own"))
	}
	d := e.dev
	if _, ok := e.Decided(); !ok {
		ctx, cancel := context.WithTimeout(context.Background(), e.setupWait())
		_, err := e.DevicePath(ctx, op.Ordinal)
		cancel()
		if err != nil {
			return nil, err, nil
		}
	}
	if !d.use.Load() {
		return here(d.decision.Why)
	}
	e.mu.Lock()
	ps := e.sets[req.Set]
	e.mu.Unlock()
	if ps != nil && ps.rank >= 0 && ps.dcomm == nil {
		return here(ps.dcommErr)
	}
	if op.Ordinal != d.ordinal {
		return nil, nil, fmt.Errorf("tensor on device %d; the device path runs on device %d", op.Ordinal, d.ordinal)
	}
	if err := deviceServes(req.Kind, req.DType, req.ReduceOp, req.PreScale, req.PostScale); err != nil {
		return here(err)
	}
	if op.Stream == nil {
		return nil, nil, errors.New("no producer stream")
	}
	ready, err := d.event()
	if err == nil {
		err = op.Stream.Record(ready)
	}
	if err != nil {
		return nil, nil, fmt.Errorf("recording the ready event on the producer's stream: %w", err)
	}
	req.GPU = true
	return &deviceEntry{op: op, ready: ready}, nil, nil
}

// setupWait bounds how long an op waits for the device path's setup: the other ranks must reach
// their first device op too.
func (e *Engine) setupWait() time.Duration {
	if e.cfg.SetupTimeout > 0 {
		return e.cfg.SetupTimeout
	}
	return DefaultConfig().SetupTimeout
}

// deviceServes says why the device path cannot run an op of this kind, type and scaling (nil when
// it can). It depends on what every rank negotiated alike, so every rank routes alike.
func deviceServes(kind negotiate.OpKind, t dtype.DType, op uint8, pre, post float64) error {
	switch kind {
	case negotiate.Allreduce, negotiate.Allgather, negotiate.Broadcast, negotiate.Alltoall, negotiate.ReduceScatter:
	default:
		return fmt.Errorf("%w: %s has no device form", gpu.ErrUnavailable, kind)
	}
	if _, err := gpu.FromDType(t); err != nil {
		return err
	}
	if op == negotiate.ReduceAdasum && kind == negotiate.Allreduce {
		return fmt.Errorf("%w: Adasum on GPU tensors is staged through host memory", gpu.ErrUnavailable)
	}
	if (pre != 0 && pre != 1) || (post != 0 && post != 1) {
		return fmt.Errorf("%w: prescale and postscale factors are applied by the caller on its stream (no device kernels)", gpu.ErrUnavailable)
	}
	return nil
}

// onDevice reports whether response r of set ps runs on the device path: a set whose device
// communicator could not form stages its GPU ops on every rank (EnqueueDevice refuses them).
func (e *Engine) onDevice(ps *procSet, r *negotiate.Response) bool {
	return e.deviceRuns(ps, r.GPU, r.Kind, r.DType, r.ReduceOp, r.PreScale, r.PostScale)
}

// deviceRuns is onDevice for the fields an op's request and its response share: the rule the
// engine routes a response by and refuses a staged GPU op by, so that the two never disagree.
func (e *Engine) deviceRuns(ps *procSet, gpu bool, kind negotiate.OpKind, t dtype.DType, op uint8, pre, post float64) bool {
	return gpu && e.dev.use.Load() && ps.dcomm != nil && deviceServes(kind, t, op, pre, post) == nil
}

// deviceEntry is the device side of a submitted op.
type deviceEntry struct {
	op    DeviceOp
	ready gpu.Event // recorded on the producer's stream at submission
}

// deviceResult is what a device op's handle reports.
type deviceResult struct {
	d    *devicePath
	done gpu.Event // recorded on the engine's stream after the op's work
	out  gpu.Ptr   // engine-allocated result (allgather, alltoall, reducescatter); 0: none
	n    int       // its bytes
	err  atomic.Pointer[error]
	rel  atomic.Bool
	ran  atomic.Bool // its work ran, and done went back to the pool
}

// WaitOnStream makes work enqueued on s from now on wait until the op's device work has run,
// without blocking the host: the consumer's side of completion. Call it after Wait returned nil.
func (h *Handle) WaitOnStream(s gpu.Stream) error {
	if !h.Poll() {
		return fmt.Errorf("%q: WaitOnStream before the op completed (call Wait first)", h.name)
	}
	if h.err != nil {
		return h.err
	}
	if h.dev == nil {
		return fmt.Errorf("%q: not a device op", h.name)
	}
	if h.dev.ran.Load() {
		return nil
	}
	return s.WaitEvent(h.dev.done)
}

// Synchronize blocks the host until the op completed and its device work has run, or ctx ends,
// and returns the op's error: one of negotiation, or the engine's if it stopped (a lost rank, the
// progress deadline) before the device work finished.
func (h *Handle) Synchronize(ctx context.Context) error {
	if err := h.Wait(ctx); err != nil {
		return err
	}
	if h.dev == nil {
		return nil
	}
	if !h.dev.ran.Load() {
		if err := h.dev.done.Synchronize(ctx); err != nil {
			return fmt.Errorf("%q: waiting for its device work to run: %w", h.name, err)
		}
	}
	if p := h.dev.err.Load(); p != nil {
		return *p
	}
	return nil
}

// DeviceOutput is the result of a device allgather, alltoall or reducescatter, in device memory
// the engine allocated: its address and size in bytes (Rows and RecvSplits say its shape). The
// caller copies it on its stream after WaitOnStream, then calls ReleaseDeviceOutput.
func (h *Handle) DeviceOutput() (gpu.Ptr, int) {
	if h.dev == nil {
		return 0, 0
	}
	return h.dev.out, h.dev.n
}

// ReleaseDeviceOutput gives the result's memory back once the work enqueued on s so far (the
// caller's copy of it) has run: it is freed then, never while a queued copy may still read it.
// A second release is an error.
func (h *Handle) ReleaseDeviceOutput(s gpu.Stream) error {
	if h.dev == nil || (h.dev.out == 0 && h.dev.n > 0) {
		return fmt.Errorf("%q: no device output to release", h.name)
	}
	if h.dev.rel.Swap(true) {
		return fmt.Errorf("%q: device output released twice", h.name)
	}
	if h.dev.out == 0 {
		return nil // an empty result the library allocated as nothing
	}
	d := h.dev.d
	ev, err := d.event()
	if err == nil {
		err = s.Record(ev)
	}
	if err != nil {
		return fmt.Errorf("%q: release: recording an event after the caller's copy: %w", h.name, err)
	}
	d.wmu.Lock()
	d.frees = append(d.frees, deferredFree{h.dev.out, ev})
	d.wmu.Unlock()
	return nil
}

// WrapStream adopts a stream of this rank's device by its handle (torch's cuda_stream), for
// EnqueueDevice, WaitOnStream and ReleaseDeviceOutput. The device path must be in use.
func (e *Engine) WrapStream(handle uintptr) (gpu.Stream, error) {
	if !e.dev.use.Load() {
		return nil, fmt.Errorf("rank %d: wrap stream %#x: the device path is not in use", e.g.Rank, handle)
	}
	s, err := e.dev.dev.WrapStream(handle)
	if err != nil {
		return nil, fmt.Errorf("rank %d: wrap stream %#x: %w", e.g.Rank, handle, err)
	}
	return s, nil
}

// DeviceStream is WrapStream for a device op's submitter: it sets the device path up on ordinal
// first if this rank has not (bounded by Config.SetupTimeout), and fails with the decision's
// reason (gpu.ErrUnavailable) when the path is not in use.
func (e *Engine) DeviceStream(ordinal int, handle uintptr) (gpu.Stream, error) {
	if _, ok := e.Decided(); !ok {
		ctx, cancel := context.WithTimeout(context.Background(), e.setupWait())
		_, err := e.DevicePath(ctx, ordinal)
		cancel()
		if err != nil {
			return nil, err
		}
	}
	if !e.dev.use.Load() {
		return nil, e.dev.decision.Why
	}
	return e.WrapStream(handle)
}

// inBytes is the size of en's input, in host or device memory.
func (en *entry) inBytes() int64 {
	if en.dev != nil {
		return int64(en.dev.op.Bytes)
	}
	return int64(len(en.in))
}

// drop gives back the ready event of a device op that never reaches the executor (nil: a host
// op). Nothing waits on it: the pool may record it again.
func (d *devicePath) drop(dv *deviceEntry) {
	if dv != nil {
		d.recycle(dv.ready)
	}
}
