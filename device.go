package kolo

import (
	"context"
	"fmt"
	"slices"
	"sync"

	"github.com/kolo-dl/kolo/internal/engine"
	"github.com/kolo-dl/kolo/internal/gpu"
	"github.com/kolo-dl/kolo/internal/gpu/nccl"
)

// DevicePtr is an address in GPU memory (torch's data_ptr()).
type DevicePtr = gpu.Ptr

// PathDecision says whether ops on GPU tensors take the device path (Use) and, when they are
// staged through host memory instead, why (Why, matching ErrDeviceUnavailable).
type PathDecision = gpu.Decision

// DeviceTensor is a tensor in GPU memory: its address there (torch's data_ptr()), element type
// and shape. kolo never reads it from the host.
type DeviceTensor struct {
	Ptr   DevicePtr
	DType DType
	Shape []int64
}

// ncclPaths are where DevicePath's caller says libnccl is (torch's copy), tried first by the
// first load of the library.
var ncclPaths struct {
	sync.Mutex
	paths []string
}

// deviceBackend is the engine's device backend: NCCL and the CUDA runtime, loaded (internal/gpu/nccl)
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
func DevicePath(ctx context.Context, ordinal int, ncclPath ...string) (PathDecision, error) {
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
// framework's ops before and after; an Average is NCCL's Avg). Arguments wrong on this rank fail
// it with an ArgumentError, and the other ranks' submissions of the op with its text, as for an op
// in host memory.
func SubmitDevice(kind OpKind, name string, in DeviceTensor, out DevicePtr, op Op, root int, splits []int64, ordinal int, stream uintptr, opts ...OpOption) *Handle {
	if err := deviceKind(kind); err != nil {
		return failed(err)
	}
	return submit(kind, name, in.operands(out, ordinal, stream), op, root, splits, opts, false)
}

// SubmitDeviceGroup submits the members of one grouped call on tensors in GPU memory (horovod's
// grouped_allreduce, grouped_allgather and grouped_reducescatter on CUDA tensors), all at once,
// as AllreduceGroupAsync and the like do for host memory: every rank releases them together and
// they fuse only with each other. outs[i] receives an allreduce's result for ins[i] (nil: in
// place); the rest is as SubmitDevice. When the device path refuses one member, every member
// fails with that error (matching gpu.ErrUnavailable where the caller is to stage the group).
func SubmitDeviceGroup(kind OpKind, name string, ins []DeviceTensor, outs []DevicePtr, op Op, ordinal int, stream uintptr, opts ...OpOption) []*Handle {
	if err := deviceKind(kind); err != nil {
		hs := make([]*Handle, len(ins))
		for i := range hs {
			hs[i] = failed(err)
		}
		return hs
	}
	xs := make([]operands, len(ins))
	for i, in := range ins {
		out := in.Ptr
		if outs != nil && i < len(outs) {
			out = outs[i]
		}
		xs[i] = in.operands(out, ordinal, stream)
	}
	return submitGroup(kind, name, xs, op, opts, outputCount(kind, len(ins), outs))
}

// deviceKind refuses a kind of op that has no tensor to submit in device memory.
func deviceKind(kind OpKind) error {
	if !hasTensor(kind) {
		return &ArgumentError{Err: fmt.Errorf("%v has no tensor in device memory (submit it with its Async function)", kind)}
	}
	return nil
}

// deviceOperands are where a device op's tensors are: addresses on device ordinal, and the
// producer's stream.
type deviceOperands struct {
	in, out DevicePtr
	ordinal int
	stream  uintptr
}

// operands are the memory of an op on t whose result goes to out.
func (t DeviceTensor) operands(out DevicePtr, ordinal int, stream uintptr) operands {
	return operands{
		in:  Tensor{DType: t.DType, Shape: t.Shape},
		dev: &deviceOperands{in: t.Ptr, out: out, ordinal: ordinal, stream: stream},
	}
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
func (h *Handle) DeviceOutput() (DevicePtr, int, []int64) {
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
func DeviceDecision() (PathDecision, bool) {
	s, err := get()
	if err != nil {
		return gpu.Decision{}, false
	}
	return s.engine.Decided()
}
