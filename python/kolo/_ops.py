"""The engine's ops on host buffers, framework-free: what every binding submits the same way.

kolo.torch and kolo.tensorflow turn their tensors into addresses and shapes; this module holds what
does not depend on the framework: the reduction ops' and op kinds' numbers, the kolo_enqueue block
(capi/ops.go's kolo_op), names, and a synchronous op on numpy arrays (run), which kolo.tensorflow
uses for every op. Nothing here imports a framework; numpy is imported by run's callers only.
"""

import ctypes
import struct
import warnings

from kolo import _lib
from kolo._lib import KoloInternalError

# Reduction ops, with horovod's values.
Average = 0
Sum = 1
Adasum = 2
Min = 3
Max = 4
Product = 5
REDUCE_OPS = (Average, Sum, Adasum, Min, Max, Product)

# Op kinds, as the C ABI numbers them.
ALLREDUCE, ALLGATHER, BROADCAST, ALLTOALL, REDUCESCATTER, BARRIER, JOIN = 1, 2, 3, 4, 5, 6, 7

# The engine's dtypes by numpy dtype name, with the C ABI's numbers (internal/dtype/dtype.go). bfloat16 is
# ml_dtypes' (TensorFlow's and JAX's numpy bfloat16).
NUMPY_DTYPES = {
    "uint8": 1, "int8": 2, "int16": 9, "int32": 3, "int64": 4,
    "float16": 5, "bfloat16": 6, "float32": 7, "float64": 8,
}

_SHAPE_STRUCTS = [struct.Struct("=%dq" % n) for n in range(9)]


def pack_int64s(values):
    n = len(values)
    s = _SHAPE_STRUCTS[n] if n < len(_SHAPE_STRUCTS) else struct.Struct("=%dq" % n)
    return s.pack(*values)


# kolo_enqueue reads one block per op (capi/ops.go's kolo_op): the input's and output's addresses,
# the scale factors, ten C ints (kind, dt, ndim, reduceOp, root, nsplits, processSet, device,
# waitUS, nameLen), then the shape, the splits and the name. One argument rather than one per
# field: ctypes converts each argument with a Python call, and seventeen cost more than the op.
_OP_HEAD = "@PPdd10i"
_OP_STRUCTS = [struct.Struct(_OP_HEAD + "%dq" % n) for n in range(9)]


def op_block(kind, inp, out, dt, shape, op, root, prescale, postscale, splits, psid, device, wait_us, name):
    """The kolo_enqueue block of an op: inp and out are addresses (0 for none), splits a list
    (None: none), name bytes (None: unnamed). wait_us > 0 makes it a synchronous call."""
    n = len(shape)
    s = _OP_STRUCTS[n] if n < len(_OP_STRUCTS) else struct.Struct(_OP_HEAD + "%dq" % n)
    b = s.pack(inp, out, prescale, postscale, kind, dt, n, op, root, -1 if splits is None else len(splits),
               psid, device, wait_us, len(name) if name else 0, *shape)
    if splits:
        b += pack_int64s(splits)
    if name:
        b += name
    return b


def name_arg(name):
    """An op's name as the C ABI takes it: (bytes or None, length). An unnamed op (None or "")
    is numbered by the engine in the order this rank submits unnamed ops of its kind."""
    if name is None or name == "":
        return None, 0
    b = name.encode("utf-8") if isinstance(name, str) else bytes(name)
    return b, len(b)


def refuse(kind, name, psid, exc, group_size=0):
    """Raises exc, an error this rank's own checks found in a call, after telling the engine: the
    call takes its turn as refused, so that the other ranks' submissions of it fail with the
    reason instead of waiting for this rank. psid None: the set has no turn to take anywhere."""
    if psid is not None and _lib.is_initialized():
        nm, nlen = name_arg(name)
        reason = str(exc).encode("utf-8", "replace")
        h = _lib.C.kolo_refuse(kind, nm, nlen, group_size, reason, len(reason), psid)
        _lib.C.kolo_release(abs(h))
    raise exc


def check_reduce_op(op, average=None):
    """The reduction op of Horovod's op and deprecated average arguments (average=True is Average,
    False Sum; neither given: Average), refusing an unknown op or both arguments at once."""
    if op is not None and average is not None:
        raise ValueError("The op parameter supersedes average. Please provide only one of them.")
    if average is not None:
        warnings.warn("Parameter `average` has been replaced with `op` and will be removed", DeprecationWarning)
        op = Average if average else Sum
    elif op is None:
        op = Average
    if op not in REDUCE_OPS:
        raise ValueError("unknown reduction op %r (want Average, Sum, Adasum, Min, Max or Product)" % (op,))
    return op


def scale_factors(op, gradient_predivide_factor):
    """(prescale, postscale) of Horovod's gradient_predivide_factor: divide by the factor before
    the sum, multiply after (the engine's Average divides by the set's size)."""
    if gradient_predivide_factor != 1.0:
        if op != Average:
            raise ValueError("gradient_predivide_factor not supported with op != Average")
        return 1.0 / gradient_predivide_factor, gradient_predivide_factor
    return 1.0, 1.0


def engine_dtype(arr):
    """The engine's dtype number of numpy array arr; None for a type the engine lacks."""
    return NUMPY_DTYPES.get(arr.dtype.name)


def _wait(h):
    """Waits for handle h in slices (Ctrl-C works); raises its error, releasing it, if it failed."""
    if _lib.wait(h) == _lib.FAILED:
        raise _lib.take_error(h)


def run(np, kind, arr, name=None, op=Sum, root=0, prescale=1.0, postscale=1.0, splits=None, psid=0, out=None):
    """Runs one op on numpy array arr (contiguous, in host memory; np is the numpy module) and
    returns its result as a new numpy array: for alltoall (output, received splits as an int32
    array), for barrier None, for join the last rank to join. The engine reads arr where it lies
    (no copy); allreduce and broadcast write into a new array, or into out (an array of arr's
    shape and dtype, or a view of a framework's buffer: the binding's result without a copy); the
    others' results are copied out of the engine. Raises KoloInternalError (HorovodInternalError) if the op failed on any rank.

    The call waits the first slice inside kolo_enqueue: an op that completes within it costs one
    call into the library."""
    C = _lib.C
    if kind in (BARRIER, JOIN):
        block = op_block(kind, 0, 0, 0, (), 0, 0, 1.0, 1.0, None, psid, -1, _lib.WAIT_SLICE_US, None)
        h = C.kolo_enqueue(block, len(block))
        if h < 0:
            raise _lib.take_error(-h)
        if h == 0:
            return None
        _wait(h)
        last = C.kolo_join_last(h) if kind == JOIN else None
        C.kolo_release(h)
        return last
    arr = np.asarray(arr)  # a numpy scalar (a 0-d tensor's) made an array; an array as it is
    dt = engine_dtype(arr)
    if dt is None:
        refuse(kind, name, psid, ValueError("Tensor type %s is not supported (supported: %s)"
                                            % (arr.dtype.name, ", ".join(sorted(NUMPY_DTYPES)))))
    if not arr.flags.c_contiguous:
        arr = np.ascontiguousarray(arr)
    if kind == ALLREDUCE or kind == BROADCAST:
        if out is None:
            out = np.empty_like(arr)
    else:
        out = None
    block = op_block(kind, arr.ctypes.data, out.ctypes.data if out is not None else 0, dt, arr.shape, op, root,
                     prescale, postscale, splits, psid, -1, _lib.WAIT_SLICE_US, name_arg(name)[0])
    h = C.kolo_enqueue(block, len(block))
    if h < 0:
        raise _lib.take_error(-h)
    if h == 0:  # completed within the first slice: released already
        return out
    _wait(h)
    if kind == ALLREDUCE or kind == BROADCAST:
        C.kolo_release(h)
        return out
    try:
        nd = arr.ndim
        shape = (ctypes.c_int64 * max(nd, 1))()
        nbytes = C.kolo_result(h, shape, nd)
        if nbytes < 0:
            raise KoloInternalError("kolo: result of handle %d: %s" % (h, _lib.last_error()))
        res = np.empty(tuple(shape[:nd]), dtype=arr.dtype)
        if nbytes and C.kolo_result_copy(h, res.ctypes.data, nbytes) != nbytes:
            raise KoloInternalError("kolo: copying the result of handle %d: %s" % (h, _lib.last_error()))
        if kind != ALLTOALL:
            return res
        n = C.kolo_recv_splits(h, None, 0)
        if n < 0:
            raise KoloInternalError("kolo: received splits of handle %d: %s" % (h, _lib.last_error()))
        rs = np.empty(n, dtype=np.int64)
        C.kolo_recv_splits(h, rs.ctypes.data, n)
        return res, rs.astype(np.int32)
    finally:
        C.kolo_release(h)


def run_many(np, kind, arrays, names, op=Sum, root=0, prescale=1.0, postscale=1.0, psid=0, into=None):
    """Allreduces or broadcasts (kind) of every array (numpy, in host memory) submitted together
    and then waited for, so that the engine can fuse them; returns the results as new arrays, or
    writes them into into[i] (contiguous arrays of array i's shape and dtype: views of one buffer,
    say) and returns those. names[i] is the name of array i's op (None: numbered by the engine).
    If any fails, the rest are still waited for (the engine writes into their outputs until they
    complete) and the first error is raised."""
    C = _lib.C
    outs, handles = [], []
    try:
        for i, (a, name) in enumerate(zip(arrays, names)):
            a = np.asarray(a)
            dt = engine_dtype(a)
            if dt is None:
                refuse(kind, name, psid, ValueError("Tensor type %s is not supported" % a.dtype.name))
            if not a.flags.c_contiguous:
                a = np.ascontiguousarray(a)
            out = np.empty_like(a) if into is None else into[i]
            block = op_block(kind, a.ctypes.data, out.ctypes.data, dt, a.shape, op, root, prescale, postscale,
                             None, psid, -1, 0, name_arg(name)[0])
            h = C.kolo_enqueue(block, len(block))
            if h < 0:
                raise _lib.take_error(-h)
            outs.append((a, out))
            handles.append(h)
    finally:
        err = None
        for h in handles:
            if _lib.wait(h) == _lib.FAILED:
                e = _lib.take_error(h)
                err = err or e
            else:
                C.kolo_release(h)
        if err is not None:
            raise err
    return [out for _, out in outs]


def run_group(np, kind, arrays, name, op=Sum, prescale=1.0, postscale=1.0, psid=0, into=None):
    """Allreduces (kind ALLREDUCE; or allgathers, reducescatters) of every array as one grouped op
    (kolo_enqueue_group, Horovod's grouped ops: one submission, released on every rank together,
    each member's shape checked across ranks), named name (None: numbered by the engine), then
    waited for. Allreduce writes into into[i] (contiguous arrays of array i's shape and dtype) or
    new arrays and returns them; the other kinds' results are not returned (run does that). If
    any member fails, the first error is raised once all completed."""
    C = _lib.C
    n = len(arrays)
    arrays = [np.ascontiguousarray(a) for a in arrays]
    dts = []
    for a in arrays:
        dt = engine_dtype(a)
        if dt is None:
            refuse(kind, name, psid, ValueError("Tensor type %s is not supported" % a.dtype.name), group_size=n)
        dts.append(dt)
    outs = None
    if kind == ALLREDUCE:
        outs = list(into) if into is not None else [np.empty_like(a) for a in arrays]
    shapes = [d for a in arrays for d in a.shape]
    handles = (ctypes.c_int64 * n)()
    nm, nlen = name_arg(name)
    rc = C.kolo_enqueue_group(
        kind, nm, nlen, n, (ctypes.c_void_p * n)(*[a.ctypes.data for a in arrays]),
        (ctypes.c_void_p * n)(*[o.ctypes.data for o in outs]) if outs is not None else None,
        (ctypes.c_int * n)(*dts), (ctypes.c_int64 * max(len(shapes), 1))(*shapes),
        (ctypes.c_int * n)(*[a.ndim for a in arrays]), op, prescale, postscale, psid, -1, -1, handles)
    err = None
    for h in handles:
        if h < 0:
            e = _lib.take_error(-h)
        elif h == 0:
            continue
        elif _lib.wait(h) == _lib.FAILED:
            e = _lib.take_error(h)
        else:
            C.kolo_release(h)
            continue
        err = err or e
    if err is not None:
        raise err
    if rc != 0:
        raise KoloInternalError("kolo: grouped op %r: %s" % (name, _lib.last_error()))
    return outs
