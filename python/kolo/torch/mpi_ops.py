"""horovod.torch's collectives on kolo's Go engine.

Tensors reach the engine as data_ptr() pointers through ctypes (kolo._lib): nothing here links
against libtorch, so one build of the engine serves every torch version. An async op returns an
integer handle, as Horovod's do; the handle map keeps the op's tensors alive until synchronize()
(the engine reads and writes them meanwhile). Names, signatures and results follow horovod.torch
0.28; where kolo differs it says so in the docstring.

Tensors the engine cannot address directly are staged: a non-contiguous tensor goes through a
contiguous copy, a CUDA tensor through host memory, and in-place ops copy the result back into the
caller's tensor at synchronize(). Where the job uses the engine's GPU data path (NCCL; decided at a
rank's first op on a CUDA tensor, _device_path), a CUDA tensor's op takes it instead (_DeviceOp):
device addresses go to the engine, ordered after the producer's stream, and synchronize() makes
the consumer's stream wait for the engine's work, never the host.
"""

import ctypes
import os
import struct
import sys

import torch

from kolo import _lib
from kolo._lib import HorovodInternalError, KoloInternalError  # noqa: F401 (re-exported)
from kolo._job import (  # noqa: F401 (re-exported: the same for every binding)
    ccl_built, cross_rank, cross_size, ddl_built, gloo_built, gloo_enabled, is_homogeneous, is_initialized,
    local_rank, local_size, mpi_built, mpi_enabled, mpi_threads_supported, rank, rank_stats, rocm_built,
    shutdown, size, start_timeline, stop_timeline,
)
# Reduction ops (horovod's values), op kinds (the C ABI's), the kolo_enqueue block and names: as
# every binding submits them (kolo._ops).
from kolo._ops import Adasum, Average, Max, Min, Product, Sum  # noqa: F401 (re-exported)
from kolo._ops import (
    ALLGATHER as _ALLGATHER, ALLREDUCE as _ALLREDUCE, ALLTOALL as _ALLTOALL, BARRIER as _BARRIER,
    BROADCAST as _BROADCAST, JOIN as _JOIN, REDUCE_OPS as _REDUCE_OPS, REDUCESCATTER as _REDUCESCATTER,
    check_reduce_op as _check_reduce_op, name_arg as _name_arg, op_block as _op_block,
)
from kolo.torch.compression import Compression
from kolo.process_sets import _init_process_sets
from kolo.process_sets import ProcessSet, global_process_set  # noqa: F401 (re-exported)

# torch dtypes the engine has, with the C ABI's dtype numbers (internal/dtype/dtype.go).
_DTYPES = {
    torch.uint8: 1,
    torch.int8: 2,
    torch.int16: 9,
    torch.int32: 3,
    torch.int64: 4,
    torch.float16: 5,
    torch.bfloat16: 6,
    torch.float32: 7,
    torch.float64: 8,
}

_CPU = torch.device("cpu")
# CUDA tensors are staged through pinned host memory (torch's caching host allocator keeps the
# blocks), which the GPU copies to and from at the link's speed and the copy back can run
# asynchronously on the tensor's stream; KOLO_CUDA_PINNED=0 stages through pageable memory instead,
# for comparison (bench/python_latency.py --device cuda --kolo-env KOLO_CUDA_PINNED=0).
_PINNED = os.environ.get("KOLO_CUDA_PINNED", "1") != "0"

# Ops whose result needs nothing from the engine once they complete.
_NO_RESULT_IN_ENGINE = frozenset((_ALLREDUCE, _BROADCAST, _BARRIER))

# handle -> _Op or _Group: what synchronize() needs, and the tensors the engine is using.
_handle_map = {}


# ----------------------------------------------------------------------------------------------
# Basics

def _drop_handles():
    """Releases the handles of ops nobody synchronized, once a new world is joined: an elastic
    reset abandons the ops of the world left, and their engine entries must not pile up across
    resets (horovod#3109)."""
    for entry in _handle_map.values():
        for o in (entry.ops if entry.__class__ is _Group else (entry,)):
            if _lib.C.kolo_poll(o.h) != _lib.PENDING:
                _lib.C.kolo_release(o.h)
    _handle_map.clear()


def init(comm=None, process_sets=None):
    """Joins the job that `kolo run` (or mpirun/srun) started this process in. Idempotent; after
    shutdown() it joins again.

    comm, as in Horovod, runs kolo on a subset of the job: a list of job ranks, or an mpi4py
    communicator (under mpirun). Only the processes in it take part, ranked by their order in
    it, and every one of them must pass the same subset; processes outside it must not call
    init(comm=...) with it. kolo meets the subset's processes through the launcher's rendezvous,
    not through MPI: an mpi4py communicator is read for its members' world ranks only.
    process_sets are ProcessSet objects to register at start-up, as add_process_set does."""
    ranks = _lib.comm_ranks(comm)
    if _lib.init(ranks):
        _drop_handles()
        _device_paths.clear()  # a new world decides anew
    if process_sets:
        _init_process_sets(process_sets)


def nccl_built():
    """As Horovod's, the version code of the NCCL that GPU ops can use (2.21.5: 22105), 0 for none:
    that of PyTorch's NCCL, which the library loads (first) at run time, on Linux; 0 where PyTorch
    has no NCCL. Whether a job's ops use it is decided at its first op on a CUDA tensor, and the
    engine logs that decision."""
    if not sys.platform.startswith("linux"):
        return 0  # the library's NCCL loader is Linux's
    try:
        v = torch.cuda.nccl.version()
    except Exception:  # PyTorch without CUDA or NCCL
        return 0
    if isinstance(v, int):
        return v
    major, minor, patch = (tuple(v) + (0, 0, 0))[:3]
    if (major, minor) >= (2, 9):  # nccl.h's NCCL_VERSION(), which changed form at 2.9
        return major * 10000 + minor * 100 + patch
    return major * 1000 + minor * 100 + patch


def cuda_built():
    """Whether ops on CUDA tensors can run in device memory (the library loads the CUDA runtime
    and NCCL at run time): as nccl_built()."""
    return nccl_built() != 0


# ----------------------------------------------------------------------------------------------
# Submission

# Ops whose handle a KeyboardInterrupt took before it was recorded: the engine may still use their
# tensors, which must outlive it.
_interrupted = []


def _issue(o, block):
    """Submits op o (block from _op_block) and returns it with its handle in o.h, recorded in the
    handle map; o.h is 0 for a synchronous call that completed within its first wait slice (its
    handle is released already: o.result() is the result). Raises what the op failed with at once."""
    try:
        h = _lib.C.kolo_enqueue(block, len(block))
        if h > 0:
            o.h = h
            _handle_map[h] = o
    except BaseException:  # Ctrl-C during the wait of a synchronous call
        _interrupted.append(o)
        raise
    if h < 0:
        raise _lib.take_error(-h)
    o.h = h
    return o


def _dtype_of(tensor):
    dt = _DTYPES.get(tensor.dtype)
    if dt is None:
        raise ValueError("Tensor type %s is not supported (supported: %s)"
                         % (tensor.type(), ", ".join(str(t).replace("torch.", "") for t in _DTYPES)))
    return dt


def _refuse(kind, name, process_set, exc, group_size=0):
    """Raises exc, an error this rank's own checks found in a call (a ValueError, or what Horovod
    raises in its place), after telling the engine: the call takes its turn as refused, so that the
    other ranks' submissions of it fail with the reason instead of waiting for this rank (and an
    unnamed call uses up its number, keeping the ranks' numbering in step)."""
    psid = process_set.process_set_id
    if psid is None:  # a set never registered: the call has no turn to take anywhere
        raise exc
    nm, nlen = _name_arg(name)
    reason = str(exc).encode("utf-8", "replace")
    h = _lib.C.kolo_refuse(kind, nm, nlen, group_size, reason, len(reason), psid)
    _lib.C.kolo_release(abs(h))
    raise exc


def _splits_arg(splits):
    """alltoall's splits as a list of ints, checked as Horovod checks them."""
    if isinstance(splits, torch.Tensor):
        if splits.dim() > 1:
            raise ValueError("alltoall expects a 1D splits tensor, got %d dimensions" % splits.dim())
        if splits.dtype not in (torch.int32, torch.int64):
            raise ValueError("alltoall expects splits to contain 32-bit integer elements, got %s"
                             % splits.dtype)
        return splits.tolist()
    try:
        out = [int(x) for x in splits]
    except (TypeError, ValueError):
        raise ValueError("alltoall expects splits to be a sequence of integers, got %r" % (splits,))
    if any(int(x) != x for x in splits):
        raise ValueError("alltoall expects integer splits, got %r" % (splits,))
    return out


def _reduce_op(op, average, kind=None, name=None, process_set=None, group_size=None):
    """Horovod's handling of the deprecated average argument. With kind, a bad op or argument
    pair is refused (_refuse): the other ranks' calls fail instead of waiting for this rank.
    group_size is the number of tensors of a grouped call (None: not grouped; an empty group is
    refused by _enqueue_group on every rank alike, and is no op to refuse)."""
    if average is None and op in _REDUCE_OPS:  # the common call: nothing else to check
        return op
    try:
        return _check_reduce_op(op, average)
    except ValueError as e:
        if kind is None or group_size == 0:
            raise
        _refuse(kind, name, process_set, e, group_size or 0)


def _process_set_id(process_set):
    psid = process_set.process_set_id
    if psid is None:
        raise ValueError("process set %s is not registered (add_process_set)" % (process_set,))
    return psid


class _Op(object):
    """One submitted op: its handle, the tensors the engine uses, and how to build the result."""

    __slots__ = ("h", "kind", "inp", "out", "dest", "device", "splits_like")

    def result(self):
        kind = self.kind
        if kind == _ALLREDUCE or kind == _BROADCAST:
            if self.dest is not None:  # in place on a tensor the engine could not address
                with torch.no_grad():
                    self.dest.copy_(self.out, non_blocking=self.dest.is_cuda and self.out.is_pinned())
                return self.dest
            if self.device is None:
                return self.out
            return self.out.to(self.device, non_blocking=self.out.is_pinned())
        if kind == _ALLGATHER or kind == _REDUCESCATTER:
            return self._fetch()
        if kind == _ALLTOALL:
            out = self._fetch()
            n = _lib.C.kolo_recv_splits(self.h, None, 0)
            if n < 0:
                raise KoloInternalError("kolo: received splits of handle %d: %s"
                                        % (self.h, _lib.last_error()))
            splits = torch.empty(n, dtype=torch.int64, device=_CPU)  # the engine writes it
            _lib.C.kolo_recv_splits(self.h, splits.data_ptr(), n)
            # As Horovod: received splits are like the splits tensor given (its dtype and device),
            # else int32 in host memory.
            if self.splits_like is None:
                return out, splits.to(torch.int32)
            return out, splits.to(device=self.splits_like.device, dtype=self.splits_like.dtype)
        if kind == _JOIN:
            return _lib.C.kolo_join_last(self.h)
        return None

    def _fetch(self):
        """The engine-allocated result of allgather, alltoall or reducescatter, copied out."""
        nd = self.inp.dim()
        shape = (ctypes.c_int64 * nd)()
        nbytes = _lib.C.kolo_result(self.h, shape, nd)
        if nbytes < 0:
            raise KoloInternalError("kolo: result of handle %d: %s" % (self.h, _lib.last_error()))
        # is_pinned only for a device tensor's staging: on a host tensor it could start CUDA.
        pinned = self.device is not None and self.inp.is_pinned()
        # device=: under torch.set_default_device("cuda") a tensor without one is on the GPU.
        out = torch.empty(tuple(shape), dtype=self.inp.dtype, device=_CPU, pin_memory=pinned)
        if nbytes and _lib.C.kolo_result_copy(self.h, out.data_ptr(), nbytes) != nbytes:
            raise KoloInternalError("kolo: copying the result of handle %d: %s"
                                    % (self.h, _lib.last_error()))
        return out if self.device is None else out.to(self.device, non_blocking=pinned)


class _Group(object):
    """The ops of one grouped call; its handle is its first op's."""

    __slots__ = ("ops",)

    def __init__(self, ops):
        self.ops = ops


def _stage(kind, tensor, inplace):
    """Builds the _Op for tensor: the buffers the engine reads (inp) and writes (out).

    The engine needs contiguous host memory: a CUDA tensor is copied to the host (and its result
    back to its device), a non-contiguous one to a contiguous copy; in place, the result is then
    copied into the caller's tensor (dest) at synchronize."""
    o = _Op()
    o.kind = kind
    o.dest = o.device = o.splits_like = None
    if tensor.is_cpu:
        inp = tensor if tensor.is_contiguous() else tensor.contiguous()
    else:
        inp = _host_copy(tensor)
        o.device = tensor.device
    out = None
    if kind == _ALLREDUCE or kind == _BROADCAST:
        if inplace:
            out = inp
            if inp is not tensor:
                o.dest, o.device = tensor, None
        elif inp is tensor:
            out = torch.empty_like(inp)
        else:
            out = inp  # already a private copy
    o.inp, o.out = inp, out
    return o


def _device_id(tensor):
    """Horovod's device id of tensor: -1 in host memory, else its GPU's index (0 if unset)."""
    if tensor.is_cuda:
        return tensor.device.index or 0
    return -1


def _host_copy(tensor):
    """A contiguous host copy of a device tensor, complete when this returns (the engine reads it
    from another thread): pinned for a CUDA tensor unless KOLO_CUDA_PINNED=0. A copy back from
    pinned memory is asynchronous and ordered on the tensor's stream; the caching host allocator
    does not reuse the block before that copy ran."""
    if _PINNED and tensor.is_cuda:
        # device=: under torch.set_default_device("cuda") a tensor without one is on the GPU,
        # where pin_memory fails.
        h = torch.empty(tensor.shape, dtype=tensor.dtype, device=_CPU, pin_memory=True)
        h.copy_(tensor.detach())
        return h
    return tensor.detach().to(_CPU).contiguous()


# ----------------------------------------------------------------------------------------------
# The GPU data path

# CUDA device ordinal -> whether the job's ops on that device's tensors take the engine's device
# path (True) or are staged through host memory (False); asked once per device and world.
_device_paths = {}


def _device_path(ordinal):
    """Asks the engine whether ops on CUDA device ordinal's tensors take its device path, and
    remembers the answer. The first time, every rank asks (kolo_device_setup waits for all of
    them, in slices, as synchronize() does) and every rank gets the same answer, which the engine
    logs with its reason. Raises what setting up failed with (KOLO_NCCL=1 where NCCL cannot
    serve). The engine sets the path up on one device per rank: another device of the rank gets
    the decision made for the first (staged; or used, and then the engine refuses its ops)."""
    if _device_paths:
        use = _device_paths[ordinal] = next(iter(_device_paths.values()))
        return use
    nccl = _torch_nccl()
    C = _lib.C
    h = C.kolo_device_setup(ordinal, nccl, len(nccl) if nccl else 0)
    if h < 0:
        raise _lib.take_error(-h)
    if _lib.wait(h) == _lib.FAILED:
        raise _lib.take_error(h)
    C.kolo_release(h)
    use = C.kolo_device_decision() == 1
    _device_paths[ordinal] = use
    return use


def _torch_nccl(maps="/proc/self/maps", search=None):
    """The path (bytes) of the libnccl PyTorch loaded, which the engine loads first, so that both
    use one NCCL; else the copy torch's wheel depends on (pip's nvidia-nccl-cu12, in
    site-packages/nvidia/nccl/lib beside torch), which torch loads when it first needs it; None
    where there is neither (the engine then looks for one on the loader's path)."""
    try:
        with open(maps) as f:
            for line in f:
                i = line.find("/")
                if i >= 0 and "/libnccl.so" in line:
                    return line[i:].rstrip("\n").encode()
    except OSError:
        pass
    if search is None:
        search = [os.path.dirname(os.path.dirname(os.path.abspath(torch.__file__)))] + sys.path
    for base in search:
        p = os.path.join(base or ".", "nvidia", "nccl", "lib", "libnccl.so.2")
        if os.path.isfile(p):
            return os.path.abspath(p).encode()
    return None


def _cuda_ordinal(tensor):
    index = tensor.device.index
    return torch.cuda.current_device() if index is None else index


def _float16_factor(f):
    """f rounded to float32, then to float16, as the engine rounds a float16 GPU tensor's scale
    factor (Horovod's CUDA kernels do)."""
    try:
        return struct.unpack("=e", struct.pack("=e", struct.unpack("=f", struct.pack("=f", f))[0]))[0]
    except OverflowError:  # beyond float16's range: infinity, as the conversion gives on the GPU
        return f * float("inf")


def _submit_device(kind, tensor, inplace, name, op, root, prescale, postscale, splits, process_set, dt):
    """Submits an op on a CUDA tensor to the engine's device path and returns its _DeviceOp; None
    when it is to be staged through host memory: the job does not use the device path, or the
    engine refused the op as one it cannot run (kolo_error_kind 3: Adasum, a type NCCL lacks,
    scale factors on an integer type, a process set without a device communicator)."""
    ordinal = _cuda_ordinal(tensor)
    use = _device_paths.get(ordinal)
    if use is None:
        use = _device_path(ordinal)
    if not use:
        return None
    pre = post = 1.0
    if (prescale != 1 or postscale != 1) and op != Adasum and tensor.is_floating_point():
        # The device path runs no kernels of its own (engine.EnqueueDevice): the factors are
        # applied here with torch ops on the tensor's stream, as Horovod's GPU ops apply them: an
        # average's 1/n folded into the postscale, a float16 tensor's factors rounded to float16.
        # Other types pass their factors on, and the engine refuses the op: it is staged.
        if op == Average:
            op, postscale = Sum, postscale / process_set.size()
        pre, post = prescale, postscale
        if tensor.dtype == torch.float16:
            pre, post = _float16_factor(pre), _float16_factor(post)
        prescale = postscale = 1.0
    stream = torch.cuda.current_stream(ordinal).cuda_stream
    inp, out, dest = _device_buffers(kind, tensor, inplace, pre)
    block = _op_block(kind, inp.data_ptr(), out.data_ptr() if out is not None else 0, dt, inp.shape, op, root,
                      prescale, postscale, splits, process_set.process_set_id, ordinal, 0, _name_arg(name)[0])
    C = _lib.C
    h = C.kolo_enqueue_device(block, len(block), stream)
    if h < 0:
        if C.kolo_error_kind(-h) == _lib.ERROR_UNAVAILABLE:
            C.kolo_release(-h)
            return None
        raise _lib.take_error(-h)
    o = _DeviceOp()
    o.h, o.kind, o.inp, o.out, o.dest, o.device = h, kind, inp, out, dest, None
    o.ordinal, o.stream, o.post = ordinal, stream, post
    _handle_map[h] = o
    return o


def _device_buffers(kind, tensor, inplace, pre):
    """The device memory an op on CUDA tensor reads (inp, scaled by pre) and writes (out), and
    the caller's tensor to copy the result into at synchronize (dest, in place on a tensor the
    engine could not address)."""
    with torch.no_grad():
        inp = tensor if tensor.is_contiguous() else tensor.contiguous()
        if pre != 1:
            inp = inp * pre  # a private, contiguous copy
        dest = out = None
        if kind == _ALLREDUCE or kind == _BROADCAST:
            if inplace:
                out = inp
                if inp is not tensor:
                    dest = tensor
            elif inp is tensor:
                out = torch.empty_like(inp, memory_format=torch.contiguous_format)
            else:
                out = inp  # already a private copy
    return inp, out, dest


class _DeviceBytes(object):
    """n bytes of device memory at address ptr, as torch.as_tensor takes them without a copy (the
    CUDA array interface): how the binding reads a result the engine allocated."""

    __slots__ = ("__cuda_array_interface__",)

    def __init__(self, ptr, n):
        self.__cuda_array_interface__ = {"shape": (n,), "typestr": "|u1", "data": (ptr, False), "version": 2,
                                         "strides": None}


class _DeviceOp(_Op):
    """An op on the engine's device path. It holds the tensors the engine reads and writes until
    synchronize() (the engine's stream uses them meanwhile); completion is on the consumer's
    stream: result() makes it wait for the engine's work (kolo_device_wait_stream) and returns
    without blocking the host."""

    __slots__ = ("ordinal", "stream", "post")

    def result(self):
        C = _lib.C
        consumer = torch.cuda.current_stream(self.ordinal).cuda_stream
        # The producer's stream waits too where it is another: the caching allocator hands the
        # memory of the tensors this op held out again on the stream they were made on.
        for s in (consumer,) if consumer == self.stream else (consumer, self.stream):
            if C.kolo_device_wait_stream(self.h, s) != 0:
                raise KoloInternalError("kolo: %s" % _lib.last_error())
        out = _Op.result(self)
        if self.post != 1:
            with torch.no_grad():
                out.mul_(self.post)
        return out

    def _fetch(self):
        """The engine-allocated result of allgather, alltoall or reducescatter, copied on the
        consumer's stream (ordered after the engine's work by result()) into a new tensor, and
        the engine's memory released once that copy ran."""
        C = _lib.C
        nd = self.inp.dim()
        shape = (ctypes.c_int64 * nd)()
        ptr = ctypes.c_uint64(0)
        nbytes = C.kolo_device_result(self.h, ctypes.byref(ptr), shape, nd)
        if nbytes < 0:
            raise KoloInternalError("kolo: device result of handle %d: %s" % (self.h, _lib.last_error()))
        out = torch.empty(tuple(shape), dtype=self.inp.dtype, device=self.inp.device)
        if nbytes == 0:  # nothing to copy, and the engine allocated nothing to release
            return out
        if nbytes != out.numel() * out.element_size():
            raise KoloInternalError("kolo: device result of handle %d: %d bytes for shape %s of %s"
                                    % (self.h, nbytes, tuple(shape), out.dtype))
        src = torch.as_tensor(_DeviceBytes(ptr.value, nbytes), device=out.device)
        out.view(-1).view(torch.uint8).copy_(src)
        if C.kolo_device_release(self.h, torch.cuda.current_stream(self.ordinal).cuda_stream) != 0:
            raise KoloInternalError("kolo: releasing the device result of handle %d: %s"
                                    % (self.h, _lib.last_error()))
        return out


def _submit(kind, tensor, inplace, name, op, root, prescale_factor, postscale_factor, splits, process_set,
            wait_us):
    """Submits one op (_issue) and returns its _Op."""
    psid = process_set.process_set_id
    if psid is None:
        _process_set_id(process_set)  # raises
    dt = _DTYPES.get(tensor.dtype)
    splits_like = None
    if dt is None or splits is not None:
        try:
            dt = _dtype_of(tensor)
            splits_like = splits if isinstance(splits, torch.Tensor) else None
            if splits is not None:
                splits = _splits_arg(splits)
        except ValueError as e:
            _refuse(kind, name, process_set, e)
    if tensor.is_cuda:
        o = _submit_device(kind, tensor, inplace, name, op, root, prescale_factor, postscale_factor, splits,
                           process_set, dt)
        if o is not None:
            o.splits_like = splits_like
            return o
    o = _stage(kind, tensor, inplace)
    o.splits_like = splits_like
    inp, out = o.inp, o.out
    return _issue(o, _op_block(kind, inp.data_ptr(), out.data_ptr() if out is not None else 0, dt, inp.shape, op,
                               root, prescale_factor, postscale_factor, splits, psid,
                               _device_id(tensor), wait_us,
                               name.encode("utf-8") if name.__class__ is str else _name_arg(name)[0]))


def _enqueue(kind, tensor, inplace, name, op=Sum, root=0, prescale_factor=1.0, postscale_factor=1.0,
             splits=None, process_set=global_process_set):
    """Submits one op and returns its handle."""
    return _submit(kind, tensor, inplace, name, op, root, prescale_factor, postscale_factor, splits, process_set,
                   0).h


def _run(kind, tensor, inplace, name, op=Sum, root=0, prescale_factor=1.0, postscale_factor=1.0, splits=None,
         process_set=global_process_set):
    """Runs one op as a synchronous call and returns what synchronize() would. The engine arms no
    timer to drive it (the caller does), and kolo_enqueue waits the first slice itself: an op that
    completes within it costs one call into the library."""
    o = _submit(kind, tensor, inplace, name, op, root, prescale_factor, postscale_factor, splits, process_set,
                _lib.WAIT_SLICE_US)
    if o.h == 0:
        return o.result()
    return synchronize(o.h)


def _enqueue_group(kind, tensors, inplace, name, op=Sum, prescale_factor=1.0, postscale_factor=1.0,
                   process_set=global_process_set):
    tensors = list(tensors)
    n = len(tensors)
    if n == 0:
        raise ValueError("grouped ops need at least one tensor")
    try:
        dts = [_dtype_of(t) for t in tensors]
    except ValueError as e:
        _refuse(kind, name, process_set, e, group_size=n)
    if any(t.is_cuda != tensors[0].is_cuda for t in tensors):
        # A RuntimeError, as Horovod raises (its test_horovod_grouped_allreduce_cpu_gpu_error).
        _refuse(kind, name, process_set,
                RuntimeError("a group's tensors must all be in host memory or all on GPUs"), group_size=n)
    if tensors[0].is_cuda:
        h = _enqueue_device_group(kind, tensors, inplace, name, op, prescale_factor, postscale_factor, process_set,
                                  dts)
        if h is not None:
            return h
    ops = [_stage(kind, t, inplace) for t in tensors]
    ins, outs, shape_arr, ndims = _group_arrays(ops)
    handles = (ctypes.c_int64 * n)()
    nm, nlen = _name_arg(name)
    # stream -1: the tensors are in host memory (staged from device _device_id's where it is a GPU).
    rc = _lib.C.kolo_enqueue_group(kind, nm, nlen, n, ins, outs, (ctypes.c_int * n)(*dts), shape_arr,
                                   ndims, op, prescale_factor, postscale_factor,
                                   _process_set_id(process_set), _device_id(tensors[0]), -1, handles)
    if rc != 0:
        _raise_group(handles)
    return _issued_group(ops, handles)


def _group_arrays(ops):
    """kolo_enqueue_group's array arguments for the _Ops of a group: ins, outs (allreduce's; else
    None), shapes (concatenated) and ndims."""
    n = len(ops)
    ins = (ctypes.c_void_p * n)(*[o.inp.data_ptr() for o in ops])
    outs = None
    if ops[0].kind == _ALLREDUCE:
        outs = (ctypes.c_void_p * n)(*[o.out.data_ptr() for o in ops])
    shapes = [d for o in ops for d in o.inp.shape]
    return ins, outs, (ctypes.c_int64 * max(len(shapes), 1))(*shapes), (ctypes.c_int * n)(*[o.inp.dim() for o in ops])


def _raise_group(handles):
    """Raises the error of a group that failed at once, releasing its handles."""
    err = None
    for h in handles:
        if h < 0 and err is None:
            err = _lib.take_error(-h)
        elif h != 0:
            _lib.C.kolo_release(abs(h))
    raise err or KoloInternalError("kolo: grouped op: %s" % _lib.last_error())


def _issued_group(ops, handles):
    for o, h in zip(ops, handles):
        o.h = h
    _handle_map[handles[0]] = _Group(ops)
    return handles[0]


def _enqueue_device_group(kind, tensors, inplace, name, op, prescale, postscale, process_set, dts):
    """A grouped op on CUDA tensors where the job uses the device path (None where it does not):
    every member goes to the engine at once as one group on its device path (kolo_enqueue_group
    with the producer's stream), as a group in host memory does. Where the engine cannot run the
    group there (kolo_error_kind 3: Adasum, a type NCCL lacks, factors on integers) or its tensors
    are on several devices, each member is submitted on its own as _submit does (on the device
    path, or staged), named as the engine names a group's members. Returns the group's handle."""
    ordinal = _cuda_ordinal(tensors[0])
    use = _device_paths.get(ordinal)
    if use is None:
        use = _device_path(ordinal)
    if not use:
        return None
    if all(_cuda_ordinal(t) == ordinal for t in tensors):
        h = _submit_device_group(kind, tensors, inplace, name, op, prescale, postscale, process_set, dts, ordinal)
        if h is not None:
            return h
    ops = [_submit(kind, t, inplace, None if name is None or name == "" else "%s.%d" % (name, i), op, 0,
                   prescale, postscale, None, process_set, 0)
           for i, t in enumerate(tensors)]
    for o in ops:
        del _handle_map[o.h]
    _handle_map[ops[0].h] = _Group(ops)
    return ops[0].h


def _submit_device_group(kind, tensors, inplace, name, op, prescale, postscale, process_set, dts, ordinal):
    """Submits a grouped op on CUDA tensors of device ordinal to the engine's device path as one
    group and returns its handle; None when the engine refused it there as one to stage. Scale
    factors are applied as _submit_device applies them, where every member is a float tensor."""
    n = len(tensors)
    pres, posts = [1.0] * n, [1.0] * n
    if (prescale != 1 or postscale != 1) and op != Adasum and all(t.is_floating_point() for t in tensors):
        if op == Average:
            op, postscale = Sum, postscale / process_set.size()
        f16 = [t.dtype == torch.float16 for t in tensors]
        pres = [_float16_factor(prescale) if h else prescale for h in f16]
        posts = [_float16_factor(postscale) if h else postscale for h in f16]
        prescale = postscale = 1.0
    stream = torch.cuda.current_stream(ordinal).cuda_stream
    ops = []
    for t, pre, post in zip(tensors, pres, posts):
        o = _DeviceOp()
        o.kind, o.device, o.splits_like = kind, None, None
        o.inp, o.out, o.dest = _device_buffers(kind, t, inplace, pre)
        o.ordinal, o.stream, o.post = ordinal, stream, post
        ops.append(o)
    ins, outs, shape_arr, ndims = _group_arrays(ops)
    handles = (ctypes.c_int64 * n)()
    nm, nlen = _name_arg(name)
    C = _lib.C
    rc = C.kolo_enqueue_group(kind, nm, nlen, n, ins, outs, (ctypes.c_int * n)(*dts), shape_arr, ndims, op,
                              prescale, postscale, _process_set_id(process_set), ordinal, stream, handles)
    if rc != 0:
        if handles[0] < 0 and C.kolo_error_kind(-handles[0]) == _lib.ERROR_UNAVAILABLE:
            for h in handles:
                C.kolo_release(abs(h))
            return None
        _raise_group(handles)
    return _issued_group(ops, handles)


# ----------------------------------------------------------------------------------------------
# Completion

def poll(handle):
    """Whether the op of handle has completed; synchronize() then returns without blocking."""
    entry = _handle_map.get(handle)
    if entry is None:
        raise ValueError("kolo: unknown handle %r (already synchronized?)" % (handle,))
    ops = entry.ops if isinstance(entry, _Group) else (entry,)
    return all(_lib.C.kolo_poll(o.h) != _lib.PENDING for o in ops)


def synchronize(handle):
    """Waits for the op of handle and returns its result: the output tensor; for grouped ops a
    list; for alltoall (output, received_splits); for join the last rank to join. Raises
    HorovodInternalError if the op failed. An unknown handle returns None, as in Horovod."""
    entry = _handle_map.get(handle)
    if entry is None:
        return None
    if entry.__class__ is _Op and entry.kind in _NO_RESULT_IN_ENGINE:
        # The common case (an allreduce or broadcast): the wait releases the handle on success.
        st = _lib.wait(entry.h, 1)  # KeyboardInterrupt keeps the entry: the engine may still write
        del _handle_map[handle]
        if st == _lib.FAILED:
            raise _lib.take_error(entry.h)
        return entry.result()
    ops = entry.ops if entry.__class__ is _Group else (entry,)
    failed = [o for o in ops if _lib.wait(o.h) == _lib.FAILED]
    del _handle_map[handle]
    try:
        if failed:
            raise KoloInternalError(_lib.error(failed[0].h))
        if isinstance(entry, _Group):
            return [o.result() for o in ops]
        return entry.result()
    finally:
        for o in ops:
            _lib.C.kolo_release(o.h)


# ----------------------------------------------------------------------------------------------
# Allreduce

def allreduce_async(tensor, average=None, name=None, op=None, prescale_factor=1.0,
                    postscale_factor=1.0, process_set=global_process_set):
    """Starts reducing tensor across ranks into a new tensor; the input is not modified."""
    op = _reduce_op(op, average, _ALLREDUCE, name, process_set)
    return _enqueue(_ALLREDUCE, tensor, False, name, op, 0, prescale_factor, postscale_factor, None,
                    process_set)


def allreduce_async_(tensor, average=None, name=None, op=None, prescale_factor=1.0,
                     postscale_factor=1.0, process_set=global_process_set):
    """Starts reducing tensor across ranks in place."""
    op = _reduce_op(op, average, _ALLREDUCE, name, process_set)
    return _enqueue(_ALLREDUCE, tensor, True, name, op, 0, prescale_factor, postscale_factor, None,
                    process_set)


def allreduce_(tensor, average=None, name=None, op=None, prescale_factor=1.0, postscale_factor=1.0,
               process_set=global_process_set):
    """Reduces tensor across ranks in place and returns it."""
    op = _reduce_op(op, average, _ALLREDUCE, name, process_set)
    return _run(_ALLREDUCE, tensor, True, name, op, 0, prescale_factor, postscale_factor, None, process_set)


class HorovodAllreduce(torch.autograd.Function):
    """Allreduce with autograd: the gradient is the same allreduce of the output's gradient."""

    @staticmethod
    def forward(ctx, tensor, average, name, op, prescale_factor, postscale_factor, process_set):
        ctx.average = average
        ctx.op = op
        ctx.prescale_factor = prescale_factor
        ctx.postscale_factor = postscale_factor
        ctx.process_set = process_set
        return _allreduce(tensor, average, name, op, prescale_factor, postscale_factor, process_set)

    @staticmethod
    def backward(ctx, grad_output):
        return (allreduce(grad_output, average=ctx.average, op=ctx.op, prescale_factor=ctx.prescale_factor,
                          postscale_factor=ctx.postscale_factor, process_set=ctx.process_set),
                None, None, None, None, None, None)


def _compress(compression, tensor):
    if compression is None or compression is Compression.none:  # as NoneCompressor, without its calls
        return tensor, None
    return compression.compress(tensor)


def _decompress(compression, tensor, ctx):
    if compression is None or compression is Compression.none:
        return tensor
    return compression.decompress(tensor, ctx)


def allreduce(tensor, average=None, name=None, compression=Compression.none, op=None,
              prescale_factor=1.0, postscale_factor=1.0, process_set=global_process_set):
    """Returns tensor reduced across ranks (Average by default); differentiable."""
    t, ctx = _compress(compression, tensor)
    if t.requires_grad and torch.is_grad_enabled():
        out = HorovodAllreduce.apply(t, average, name, op, prescale_factor, postscale_factor, process_set)
    else:  # nothing to differentiate: the Function's bookkeeping would cost more than a small op
        out = _allreduce(t, average, name, op, prescale_factor, postscale_factor, process_set)
    return _decompress(compression, out, ctx)


def _allreduce(tensor, average, name, op, prescale_factor, postscale_factor, process_set):
    """allreduce's result, as HorovodAllreduce's forward computes it."""
    op = _reduce_op(op, average, _ALLREDUCE, name, process_set)
    return _run(_ALLREDUCE, tensor, False, name, op, 0, prescale_factor, postscale_factor, None, process_set)


def grouped_allreduce_async(tensors, average=None, name=None, op=None, prescale_factor=1.0,
                            postscale_factor=1.0, process_set=global_process_set):
    """Starts reducing every tensor of the list into new tensors, as one group that every rank
    releases together (member i is named name.i)."""
    tensors = list(tensors)
    op = _reduce_op(op, average, _ALLREDUCE, name, process_set, len(tensors))
    return _enqueue_group(_ALLREDUCE, tensors, False, name, op, prescale_factor, postscale_factor,
                          process_set)


def grouped_allreduce_async_(tensors, average=None, name=None, op=None, prescale_factor=1.0,
                             postscale_factor=1.0, process_set=global_process_set):
    """grouped_allreduce_async, in place."""
    tensors = list(tensors)
    op = _reduce_op(op, average, _ALLREDUCE, name, process_set, len(tensors))
    return _enqueue_group(_ALLREDUCE, tensors, True, name, op, prescale_factor, postscale_factor,
                          process_set)


def grouped_allreduce_(tensors, average=None, name=None, op=None, prescale_factor=1.0,
                       postscale_factor=1.0, process_set=global_process_set):
    """Reduces every tensor of the list in place, as one group; returns the list."""
    return synchronize(grouped_allreduce_async_(tensors, average, name, op, prescale_factor,
                                                postscale_factor, process_set))


class HorovodGroupedAllreduce(torch.autograd.Function):
    """Grouped allreduce with autograd."""

    @staticmethod
    def forward(ctx, average, name, op, prescale_factor, postscale_factor, process_set, *tensors):
        ctx.average = average
        ctx.op = op
        ctx.prescale_factor = prescale_factor
        ctx.postscale_factor = postscale_factor
        ctx.process_set = process_set
        return tuple(synchronize(grouped_allreduce_async(list(tensors), average, name, op, prescale_factor,
                                                         postscale_factor, process_set)))

    @staticmethod
    def backward(ctx, *grad_output):
        grads = grouped_allreduce(list(grad_output), average=ctx.average, op=ctx.op,
                                  prescale_factor=ctx.prescale_factor, postscale_factor=ctx.postscale_factor,
                                  process_set=ctx.process_set)
        return (None, None, None, None, None, None) + tuple(grads)


def grouped_allreduce(tensors, average=None, name=None, compression=Compression.none, op=None,
                      prescale_factor=1.0, postscale_factor=1.0, process_set=global_process_set):
    """Returns every tensor of the list reduced across ranks, as one group; differentiable."""
    pairs = [_compress(compression, t) for t in tensors]
    outs = HorovodGroupedAllreduce.apply(average, name, op, prescale_factor, postscale_factor, process_set,
                                         *[p[0] for p in pairs])
    return [_decompress(compression, t, p[1]) for t, p in zip(outs, pairs)]


def sparse_allreduce_async(tensor, name, op, process_set=global_process_set):
    """Starts reducing a sparse COO tensor across ranks by gathering every rank's indices and
    values (allgather: ranks may hold different numbers of nonzeros). Returns a function that
    waits and returns the reduced sparse tensor (coalesced: entries at the same index summed).
    op is Average or Sum, as in Horovod."""
    if op not in (Average, Sum):
        raise ValueError("sparse_allreduce_async supports op=Average or op=Sum, not %r" % (op,))
    if not tensor.is_sparse:
        raise ValueError("sparse_allreduce_async needs a sparse COO tensor; use allreduce_async")
    t = tensor.coalesce()
    # allgather concatenates along dim 0, so the indices travel as (nnz, ndim).
    indices = allgather_async(t.indices().t().contiguous(), name="%s.indices" % name,
                              process_set=process_set)
    values = allgather_async(t.values().contiguous(), name="%s.values" % name,
                             process_set=process_set)

    def wait():
        v = synchronize(values)
        i = synchronize(indices)
        if op == Average:
            v = v / process_set.size()
        return torch.sparse_coo_tensor(i.t(), v, t.size()).coalesce()
    return wait


# ----------------------------------------------------------------------------------------------
# Allgather

def allgather_async(tensor, name=None, process_set=global_process_set):
    """Starts concatenating every rank's tensor along dim 0 (which may differ across ranks)."""
    return _enqueue(_ALLGATHER, tensor, False, name, process_set=process_set)


class HorovodAllgather(torch.autograd.Function):
    """Allgather with autograd: the gradient is this rank's slice of the averaged gradient."""

    @staticmethod
    def forward(ctx, tensor, name, process_set):
        # raises for a scalar
        out = _run(_ALLGATHER, tensor, False, name, process_set=process_set)
        ctx.dim = tensor.shape[0]
        ctx.process_set = process_set
        return out

    @staticmethod
    def backward(ctx, grad_output):
        grad_reduced = allreduce(grad_output, average=True, process_set=ctx.process_set)
        dims = allgather(torch.tensor([ctx.dim], dtype=torch.int32), process_set=ctx.process_set)
        r = ctx.process_set.rank()
        offset = int(dims[:r].sum()) if r else 0
        return grad_reduced.narrow(0, offset, ctx.dim), None, None


def allgather(tensor, name=None, process_set=global_process_set):
    """Returns every rank's tensor concatenated along dim 0; differentiable."""
    return HorovodAllgather.apply(tensor, name, process_set)


def grouped_allgather_async(tensors, name=None, process_set=global_process_set):
    """Starts allgathering every tensor of the list, as one group."""
    return _enqueue_group(_ALLGATHER, tensors, False, name, process_set=process_set)


class HorovodGroupedAllgather(torch.autograd.Function):
    """Grouped allgather with autograd (each tensor as HorovodAllgather)."""

    @staticmethod
    def forward(ctx, name, process_set, *tensors):
        outs = tuple(synchronize(grouped_allgather_async(list(tensors), name, process_set)))
        ctx.dims = [t.shape[0] for t in tensors]
        ctx.process_set = process_set
        return outs

    @staticmethod
    def backward(ctx, *grad_output):
        grads = grouped_allreduce(list(grad_output), average=True, process_set=ctx.process_set)
        dims = allgather(torch.tensor([ctx.dims], dtype=torch.int64), process_set=ctx.process_set)
        r = ctx.process_set.rank()
        out = []
        for i, g in enumerate(grads):
            offset = int(dims[:r, i].sum()) if r else 0
            out.append(g.narrow(0, offset, ctx.dims[i]))
        return (None, None) + tuple(out)


def grouped_allgather(tensors, name=None, process_set=global_process_set):
    """Returns the allgather of every tensor of the list, as one group; differentiable."""
    return list(HorovodGroupedAllgather.apply(name, process_set, *tensors))


# ----------------------------------------------------------------------------------------------
# Broadcast

def broadcast_async(tensor, root_rank, name=None, process_set=global_process_set):
    """Starts copying root_rank's tensor into a new tensor on every rank."""
    return _enqueue(_BROADCAST, tensor, False, name, root=root_rank, process_set=process_set)


def broadcast_async_(tensor, root_rank, name=None, process_set=global_process_set):
    """Starts copying root_rank's tensor into tensor on every rank."""
    return _enqueue(_BROADCAST, tensor, True, name, root=root_rank, process_set=process_set)


def broadcast_(tensor, root_rank, name=None, process_set=global_process_set):
    """Copies root_rank's tensor into tensor on every rank and returns it."""
    return _run(_BROADCAST, tensor, True, name, root=root_rank, process_set=process_set)


class HorovodBroadcast(torch.autograd.Function):
    """Broadcast with autograd: the root gets the averaged gradient, other ranks zero."""

    @staticmethod
    def forward(ctx, tensor, root_rank, name, process_set):
        ctx.root_rank = root_rank
        ctx.process_set = process_set
        return _run(_BROADCAST, tensor, False, name, root=root_rank, process_set=process_set)

    @staticmethod
    def backward(ctx, grad_output):
        grad_reduced = allreduce(grad_output, average=True, process_set=ctx.process_set)
        if rank() != ctx.root_rank:
            grad_reduced *= 0
        return grad_reduced, None, None, None


def broadcast(tensor, root_rank, name=None, process_set=global_process_set):
    """Returns root_rank's tensor on every rank; differentiable."""
    return HorovodBroadcast.apply(tensor, root_rank, name, process_set)


# ----------------------------------------------------------------------------------------------
# Alltoall

def alltoall_async(tensor, splits=None, name=None, process_set=global_process_set):
    """Starts sending splits[r] rows (dim 0) of tensor to rank r and receiving what every rank
    sends here; without splits dim 0 is split evenly. synchronize() returns (output,
    received_splits)."""
    return _enqueue(_ALLTOALL, tensor, False, name, splits=splits, process_set=process_set)


class HorovodAlltoall(torch.autograd.Function):
    """Alltoall with autograd: the gradient goes back along the way the rows came."""

    @staticmethod
    def forward(ctx, tensor, splits, name, process_set):
        output, received_splits = _run(_ALLTOALL, tensor, False, name, splits=splits, process_set=process_set)
        ctx.process_set = process_set
        ctx.recvsplits = received_splits
        if splits is None:
            return output
        ctx.mark_non_differentiable(received_splits)
        return output, received_splits

    @staticmethod
    def backward(ctx, grad_output, *dead_gradients):
        grad, _ = alltoall(grad_output.contiguous(), splits=ctx.recvsplits, process_set=ctx.process_set)
        return grad, None, None, None


def alltoall(tensor, splits=None, name=None, process_set=global_process_set):
    """Returns the rows every rank sent here; with splits, (output, received_splits)."""
    return HorovodAlltoall.apply(tensor, splits, name, process_set)


# ----------------------------------------------------------------------------------------------
# Reducescatter

def reducescatter_async(tensor, name=None, op=Average, process_set=global_process_set,
                        prescale_factor=1.0, postscale_factor=1.0):
    """Starts reducing tensor across ranks, each rank keeping its share of dim 0 (the first
    dim0 % size ranks get one extra row). kolo also accepts Min, Max and Product."""
    op = _reduce_op(op, None, _REDUCESCATTER, name, process_set)
    return _enqueue(_REDUCESCATTER, tensor, False, name, op, 0, prescale_factor, postscale_factor,
                    process_set=process_set)


def _scatter_grad_scale(op, process_set, prescale_factor, postscale_factor):
    """What reducescatter's gradient is multiplied by, by Horovod's convention (the one its
    allreduce gradient follows too): the set's size for Sum, 1 for Average, times the scale
    factors; the gradient is the output's gradient gathered from every rank."""
    scale = prescale_factor * postscale_factor
    if op == Sum:
        scale *= process_set.size()
    return scale


class HorovodReducescatter(torch.autograd.Function):
    """Reducescatter with autograd: each input row's gradient is the gradient of the output row
    it went into, gathered from the rank that holds it, scaled as _scatter_grad_scale says."""

    @staticmethod
    def forward(ctx, tensor, name, op, process_set, prescale_factor, postscale_factor):
        ctx.op = op
        ctx.process_set = process_set
        ctx.scale = (prescale_factor, postscale_factor)
        rop = _reduce_op(op, None, _REDUCESCATTER, name, process_set)
        return _run(_REDUCESCATTER, tensor, False, name, rop, 0, prescale_factor, postscale_factor,
                    process_set=process_set)

    @staticmethod
    def backward(ctx, grad_output):
        scale = _scatter_grad_scale(ctx.op, ctx.process_set, *ctx.scale)
        if scale != 1:
            grad_output = grad_output * scale
        grad = allgather(grad_output.contiguous(), process_set=ctx.process_set)
        return grad, None, None, None, None, None


def reducescatter(tensor, name=None, compression=Compression.none, op=Average,
                  process_set=global_process_set, prescale_factor=1.0, postscale_factor=1.0):
    """Returns this rank's share of the reduction of tensor across ranks; differentiable."""
    t, ctx = _compress(compression, tensor)
    out = HorovodReducescatter.apply(t, name, op, process_set, prescale_factor, postscale_factor)
    return _decompress(compression, out, ctx)


def grouped_reducescatter_async(tensors, name=None, op=Average, process_set=global_process_set,
                                prescale_factor=1.0, postscale_factor=1.0):
    """Starts reduce-scattering every tensor of the list, as one group."""
    tensors = list(tensors)
    op = _reduce_op(op, None, _REDUCESCATTER, name, process_set, len(tensors))
    return _enqueue_group(_REDUCESCATTER, tensors, False, name, op, prescale_factor, postscale_factor,
                          process_set)


class HorovodGroupedReducescatter(torch.autograd.Function):
    """Grouped reducescatter with autograd (each tensor as HorovodReducescatter)."""

    @staticmethod
    def forward(ctx, name, op, process_set, prescale_factor, postscale_factor, *tensors):
        ctx.op = op
        ctx.process_set = process_set
        ctx.scale = (prescale_factor, postscale_factor)
        return tuple(synchronize(grouped_reducescatter_async(list(tensors), name, op, process_set,
                                                             prescale_factor, postscale_factor)))

    @staticmethod
    def backward(ctx, *grad_output):
        scale = _scatter_grad_scale(ctx.op, ctx.process_set, *ctx.scale)
        if scale != 1:
            grad_output = [g * scale for g in grad_output]
        grads = grouped_allgather([g.contiguous() for g in grad_output], process_set=ctx.process_set)
        return (None, None, None, None, None) + tuple(grads)


def grouped_reducescatter(tensors, name=None, compression=Compression.none, op=Average,
                          process_set=global_process_set, prescale_factor=1.0, postscale_factor=1.0):
    """Returns this rank's share of the reduction of every tensor of the list, as one group."""
    pairs = [_compress(compression, t) for t in tensors]
    outs = HorovodGroupedReducescatter.apply(name, op, process_set, prescale_factor, postscale_factor,
                                             *[p[0] for p in pairs])
    return [_decompress(compression, t, p[1]) for t, p in zip(outs, pairs)]


# ----------------------------------------------------------------------------------------------
# Barrier and join

def barrier(process_set=global_process_set):
    """Returns once every rank has called barrier."""
    o = _Op()
    o.kind = _BARRIER
    _issue(o, _op_block(_BARRIER, 0, 0, 0, (), 0, 0, 1.0, 1.0, None, _process_set_id(process_set), -1,
                        _lib.WAIT_SLICE_US, None))
    if o.h:
        synchronize(o.h)


def join(device=-1):
    """Says this rank has no more data; other ranks' allreduces go on with it contributing
    nothing until every rank has joined. Returns the last rank to join. device is accepted for
    Horovod compatibility (kolo needs no device for the zeros it contributes)."""
    o = _Op()
    o.kind = _JOIN
    return synchronize(_issue(o, _op_block(_JOIN, 0, 0, 0, (), 0, 0, 1.0, 1.0, None, 0, -1, _lib.WAIT_SLICE_US,
                                          None)).h)
