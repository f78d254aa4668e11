package kolo

import (
	"context"
	"fmt"
	"math"
	"slices"
	"sync"

	"github.com/kolo-dl/kolo/dtype"
	"github.com/kolo-dl/kolo/engine"
	"github.com/kolo-dl/kolo/engine/negotiate"
	"github.com/kolo-dl/kolo/gpu"
	"github.com/kolo-dl/kolo/gpu/nccl"
)

// DeviceTensor is a tensor in GPU memory: its address there (torch's data_ptr()), element type
// and shape. kolo never reads it from the host.
type DeviceTensor struct {
	Ptr   gpu.Ptr
	DType dtype.DType
	Shape []int64
}

// ncclPaths are where DevicePath's caller says libnccl is (torch's copy), tried first by the
// first load of the library.
var ncclPaths struct {
	sync.Mutex
	paths []string
}

// deviceBackend is the engine's device backend: NCCL and the CUDA runtime, loaded (gpu/nccl)
// only when this rank first has a device op, never at Init, so a CPU job loads neither.
func deviceBackend(getenv func(string) string) (*engine.DeviceBackend, error) {
	setting, err := gpu.ParseMode(getenv)
	if err != nil {
		return nil, err
	}
	return &engine.DeviceBackend{
		Setting: setting,
		HostID:  getenv("NCCL_HOSTID"),
		Open: func() (gpu.Library, gpu.Version, error) {
			ncclPaths.Lock()
			paths := slices.Clone(ncclPaths.paths)
			ncclPaths.Unlock()
			b, err := nccl.Open(nccl.Options{NCCLPaths: paths})
			if err != nil {
				return nil, gpu.Version{}, err
			}
			return b, b.Version(), nil
		},
		Device: func(lib gpu.Library, ordinal int) (gpu.Device, string, error) {
			b, ok := lib.(nccl.Backend)
			if !ok {
				return nil, "", fmt.Errorf("a %T is not NCCL", lib)
			}
			bus, err := b.PCIBusID(ordinal)
			if err != nil {
				return nil, "", err
			}
			d, err := b.Device(ordinal)
			return d, bus, err
		},
	}, nil
}

// DevicePath sets up the GPU data path on CUDA device ordinal (this process's, after
// CUDA_VISIBLE_DEVICES) and returns the job's decision, the same on every rank: Use, or why GPU
// tensors are staged through host memory (logged once at Info). Every rank must call it (or
// submit a device op) before its first device op; it blocks until every rank has. ncclPaths are
// tried first when the library loads (the binding passes torch's libnccl.so.2). The error is set
// when KOLO_NCCL=1 and the path cannot serve, or setting up failed.
func DevicePath(ctx context.Context, ordinal int, ncclPath ...string) (gpu.Decision, error) {
	s, err := get()
	if err != nil {
		return gpu.Decision{}, err
	}
	if len(ncclPath) > 0 {
		ncclPaths.Lock()
		ncclPaths.paths = slices.Clone(ncclPath)
		ncclPaths.Unlock()
	}
	return s.engine.DevicePath(ctx, ordinal)
}

// SubmitDevice submits a collective on a tensor in GPU memory on device ordinal, ordered after
// the work enqueued so far on stream (the producer's CUDA stream handle: torch's
// current_stream().cuda_stream). out receives an allreduce's or broadcast's result (it may be
// in.Ptr); allgather, alltoall and reducescatter leave theirs in memory kolo allocates
// (Handle.DeviceOutput). The handle completes when the work is enqueued on kolo's stream: then
// WaitOnStream(consumer) orders the consumer after it, with no host synchronisation.
//
// Refused with an error matching gpu.ErrUnavailable, for the caller to stage the tensor through
// host memory as before: when the device path is not in use, for Adasum, for types NCCL lacks,
// and for Prescale and Postscale factors (no device kernels: the caller scales with its own
// framework's ops before and after; an Average is NCCL's Avg).
func SubmitDevice(kind OpKind, name string, in DeviceTensor, out gpu.Ptr, op Op, root int, splits []int64, ordinal int, stream uintptr, opts ...OpOption) *Handle {
	s, err := get()
	if err != nil {
		return failed(err)
	}
	req, _ := newRequest(kind, Tensor{DType: in.DType, Shape: in.Shape}, root, splits, opts)
	req.Name = s.names.name(req.Set, kind, name)
	h := &Handle{kind: kind, size: s.job.Size}
	dop, err := s.prepareDevice(&req, in, out, op, ordinal, stream)
	if err != nil {
		h.early = &ArgumentError{Err: fmt.Errorf("%s %q: %w", kind, req.Name, err)}
		return h
	}
	h.out = Tensor{DType: in.DType, Shape: slices.Clone(req.Shape)}
	h.h = s.engine.EnqueueDevice(req, dop)
	return h
}

// SubmitDeviceGroup submits the members of one grouped call on tensors in GPU memory (horovod's
// grouped_allreduce, grouped_allgather and grouped_reducescatter on CUDA tensors), all at once,
// as AllreduceGroupAsync and the like do for host memory: every rank releases them together and
// they fuse only with each other. outs[i] receives an allreduce's result for ins[i] (nil: in
// place); the rest is as SubmitDevice. When the device path refuses one member, every member
// fails with that error (matching gpu.ErrUnavailable where the caller is to stage the group).
func SubmitDeviceGroup(kind OpKind, name string, ins []DeviceTensor, outs []gpu.Ptr, op Op, ordinal int, stream uintptr, opts ...OpOption) []*Handle {
	hs := make([]*Handle, len(ins))
	s, err := get()
	if err != nil {
		for i := range hs {
			hs[i] = failed(err)
		}
		return hs
	}
	fail := func(err error) []*Handle {
		for i := range hs {
			hs[i] = &Handle{kind: kind, size: s.job.Size, early: &ArgumentError{Err: err}}
		}
		return hs
	}
	if outs != nil && len(outs) != len(ins) {
		return fail(fmt.Errorf("grouped %s: %d outputs for %d inputs", kind, len(outs), len(ins)))
	}
	ts := make([]Tensor, len(ins))
	for i, in := range ins {
		ts[i] = Tensor{DType: in.DType, Shape: in.Shape}
	}
	reqs := s.groupRequests(kind, name, ts, opts)
	dops := make([]engine.DeviceOp, len(ins))
	for i, in := range ins {
		out := in.Ptr
		if outs != nil {
			out = outs[i]
		}
		if dops[i], err = s.prepareDevice(&reqs[i], in, out, op, ordinal, stream); err != nil {
			return fail(fmt.Errorf("grouped %s %q, tensor %d: %w", kind, reqs[i].Name, i, err))
		}
	}
	for i, h := range s.engine.EnqueueDeviceGroup(reqs, dops) {
		hs[i] = &Handle{kind: kind, size: s.job.Size, h: h, out: Tensor{DType: ins[i].DType, Shape: slices.Clone(reqs[i].Shape)}}
	}
	return hs
}

// prepareDevice completes the named request req of a device op on in (out: an allreduce's or
// broadcast's result) and returns the op's device side.
func (s *state) prepareDevice(req *negotiate.Request, in DeviceTensor, out gpu.Ptr, op Op, ordinal int, stream uintptr) (engine.DeviceOp, error) {
	kind := req.Kind
	n, err := dtype.Bytes(in.DType, in.Shape)
	if err == nil && (len(in.Shape) == 0) && (kind == negotiate.Allgather || kind == negotiate.Alltoall || kind == negotiate.ReduceScatter) {
		err = fmt.Errorf("needs a tensor with at least one dimension")
	}
	if err == nil && kind == negotiate.Alltoall {
		// As Horovod: rows past the sum of the splits stay behind.
		req.Shape = sentRows(Tensor{DType: in.DType, Shape: in.Shape, Data: make([]byte, 0)}, req.Splits).Shape
		n, err = dtype.Bytes(in.DType, req.Shape)
	}
	if err == nil && (kind == negotiate.Allreduce || kind == negotiate.ReduceScatter) {
		req.ReduceOp, req.Average, err = reduction(op)
	}
	if err == nil && (math.IsNaN(req.PreScale) || math.IsNaN(req.PostScale)) {
		err = fmt.Errorf("NaN scale factor")
	}
	var st gpu.Stream
	if err == nil {
		st, err = s.engine.DeviceStream(ordinal, stream)
	}
	if err != nil {
		return engine.DeviceOp{}, err
	}
	if req.PreScale == 1 {
		req.PreScale = 0 // 1 and 0 both mean none; the device path takes no factor
	}
	if req.PostScale == 1 {
		req.PostScale = 0
	}
	return engine.DeviceOp{Ordinal: ordinal, Stream: st, In: in.Ptr, Out: out, Bytes: int(n)}, nil
}

// reduction is op as the engine's request says it.
func reduction(op Op) (code uint8, average bool, err error) {
	switch op {
	case Sum, Average:
		return negotiate.ReduceSum, op == Average, nil
	case Min:
		return negotiate.ReduceMin, false, nil
	case Max:
		return negotiate.ReduceMax, false, nil
	case Product:
		return negotiate.ReduceProd, false, nil
	case Adasum:
		return negotiate.ReduceAdasum, false, nil
	}
	return 0, false, fmt.Errorf("unsupported reduction %v", op)
}

// WaitOnStream makes the work enqueued from now on on stream (a CUDA stream handle) wait until the
// device op's work has run, without blocking the host. Call it once Wait returned nil.
func (h *Handle) WaitOnStream(stream uintptr) error {
	st, err := h.wrap(stream)
	if err != nil {
		return err
	}
	return h.h.WaitOnStream(st)
}

// Synchronize blocks until a device op's work has run (or ctx ends) and returns its error,
// including a failure of the job (a lost rank) after the op was enqueued.
func (h *Handle) Synchronize(ctx context.Context) error {
	if h.early != nil {
		return h.early
	}
	return h.h.Synchronize(ctx)
}

// DeviceOutput is a device allgather's, alltoall's or reducescatter's result: its address, size
// in bytes and shape. The caller copies it on its stream after WaitOnStream, then releases it.
func (h *Handle) DeviceOutput() (gpu.Ptr, int, []int64) {
	if h.h == nil {
		return 0, 0, nil
	}
	p, n := h.h.DeviceOutput()
	shape := slices.Clone(h.out.Shape)
	if len(shape) > 0 {
		shape[0] = h.h.Rows()
	}
	return p, n, shape
}

// ReleaseDeviceOutput frees the device result once the work enqueued so far on stream (the
// caller's copy of it) has run.
func (h *Handle) ReleaseDeviceOutput(stream uintptr) error {
	st, err := h.wrap(stream)
	if err != nil {
		return err
	}
	return h.h.ReleaseDeviceOutput(st)
}

func (h *Handle) wrap(stream uintptr) (gpu.Stream, error) {
	if h.early != nil {
		return nil, h.early
	}
	s, err := get()
	if err != nil {
		return nil, err
	}
	return s.engine.WrapStream(stream)
}

// ErrDeviceUnavailable is matched by the error of a device op or DevicePath that the GPU data
// path cannot serve: the caller stages the tensor through host memory instead.
var ErrDeviceUnavailable = gpu.ErrUnavailable

// DeviceDecision is the device path's decision, once DevicePath has made it.
func DeviceDecision() (gpu.Decision, bool) {
	s, err := get()
	if err != nil {
		return gpu.Decision{}, false
	}
	return s.engine.Decided()
}
