"""horovod.tensorflow's collectives on kolo's Go engine, with no custom op to compile.

Every op is a Python function over numpy arrays (kolo._ops.run), which reaches the engine through
ctypes. Eagerly it runs at once, on the host buffer of the EagerTensor (``_numpy()``, a view: no
copy of a tensor in host memory), and a large allreduce or broadcast writes its result into a
tensor TensorFlow allocated (no copy either; _into_tensor). Inside tf.function it is a ``tf.numpy_function`` (stateful, so
tf.function's automatic control dependencies run the ops of one function in program order, the
same on every rank), with the static shape set on its outputs. Gradients are attached with
tf.custom_gradient as Horovod registers them for its ops: allreduce's is an allreduce, allgather's
an averaged allreduce sliced to this rank's rows, broadcast's an averaged allreduce kept on the
root, alltoall's an alltoall back along the received splits, reducescatter's an allgather.

Ops are matched across ranks by name, as the engine matches kolo.torch's: an unnamed eager op is
numbered by the engine in submission order, and an unnamed op inside tf.function is named after
its input tensor in the graph (``HorovodAllreduce_<tensor>``, as Horovod names them), which every
rank's trace of the same function gives alike. A failed op raises the tf.errors class Horovod's
ops raise, eagerly and in a graph: FailedPreconditionError for an op the ranks disagreed on,
UnknownError (eagerly also HorovodInternalError, kolo.KoloInternalError) for one that failed
otherwise (a rank lost or ended), InvalidArgumentError for arguments this rank refused.
"""

import sys
import weakref

import numpy as np
import tensorflow as tf

from kolo import _lib, _ops
from kolo._lib import HorovodInternalError, KoloInternalError, KoloMismatchError  # noqa: F401 (re-exported)
from kolo._job import (  # noqa: F401 (re-exported: the same for every binding)
    ccl_built, cross_rank, cross_size, ddl_built, gloo_built, gloo_enabled, is_homogeneous, is_initialized,
    local_rank, local_size, mpi_built, mpi_enabled, mpi_threads_supported, rank, rank_stats, rocm_built,
    shutdown, size, start_timeline, stop_timeline,
)
from kolo._ops import Adasum, Average, Max, Min, Product, Sum  # noqa: F401 (re-exported)
from kolo.process_sets import (  # noqa: F401 (re-exported)
    ProcessSet, _engine_ranks, _init_process_sets, add_process_set, global_process_set, remove_process_set,
)


# ----------------------------------------------------------------------------------------------
# Basics

def init(comm=None, process_sets=None):
    """Joins the job that `kolo run` (or mpirun/srun) started this process in; idempotent.
    comm: a list of job ranks to run on (kolo.torch's init explains it); process_sets: ProcessSet
    objects to register at start-up."""
    _lib.init(_lib.comm_ranks(comm))
    if process_sets:
        _init_process_sets(process_sets)


def rank_op(name=None):
    """This rank as an int32 tensor (Horovod's rank_op)."""
    return tf.constant(rank(), dtype=tf.int32, name=name)


def local_rank_op(name=None):
    return tf.constant(local_rank(), dtype=tf.int32, name=name)


def size_op(process_set_id=0, name=None):
    from kolo.process_sets import process_set_by_id
    return tf.constant(process_set_by_id(process_set_id).size(), dtype=tf.int32, name=name)


def local_size_op(name=None):
    return tf.constant(local_size(), dtype=tf.int32, name=name)


def process_set_included_op(process_set_id=0, name=None):
    from kolo.process_sets import process_set_by_id
    return tf.constant(1 if process_set_by_id(process_set_id).included() else 0, dtype=tf.int32, name=name)


# TensorFlow tensors on a GPU are staged through host memory: no device path for them yet.
def nccl_built():
    return 0


def cuda_built():
    return False


# ----------------------------------------------------------------------------------------------
# How an op reaches the engine

def _normalize_name(name):
    """A tensor's graph name as part of an op name (Horovod's: ':' and '/' are not kept)."""
    return name.replace(":", "_").replace("/", "_")


def _op_name(name, prefix, tensor):
    """The engine name of an op: name if given; inside tf.function, Horovod's name from the
    input tensor's graph name (the same on every rank that traced the same function); eagerly
    None, numbered by the engine in submission order."""
    if name:
        return name
    if tf.executing_eagerly():
        return None
    return "%s_%s" % (prefix, _normalize_name(tensor.name))


def _host(t):
    """The numpy array of eager tensor t: a view of its host buffer where it has one (_numpy),
    else a copy to the host."""
    f = getattr(t, "_numpy", None)
    return f() if f is not None else np.asarray(t)


# From this size on, an eager allreduce or broadcast writes its result into a tensor TensorFlow
# allocated (its buffer as a numpy view), saving the copy that making a tensor of a numpy array
# costs (3 ms for 4 MiB on a 2-core machine); below it the copy costs less than the extra op.
_INTO_TENSOR_BYTES = 1 << 16


def _into_tensor(kind, x, nm, op, root, prescale, postscale, psid):
    """An eager allreduce or broadcast of x whose result is written into a new tensor; None where
    that does not apply (small, bool, or a type the engine lacks)."""
    a = _host(x)
    if not isinstance(a, np.ndarray) or a.nbytes < _INTO_TENSOR_BYTES or _ops.engine_dtype(a) is None:
        return None
    out_t = tf.raw_ops.Empty(shape=a.shape, dtype=x.dtype, init=False)
    out = _host(out_t)
    if not isinstance(out, np.ndarray) or out.shape != a.shape or out.dtype != a.dtype:
        return None
    _eager(lambda: _ops.run(np, kind, a, nm, op, root, prescale, postscale, None, psid, out=out))
    return out_t


def _tensor(t):
    return t if isinstance(t, tf.Tensor) else tf.convert_to_tensor(t)


# numpy types the engine moves as another of the same width (no arithmetic on them).
_AS_BYTES = {np.dtype(np.bool_): np.dtype(np.uint8)}

# Unsigned types the engine lacks, reduced as the signed type of their width: a sum wraps to the
# same bits either way; Min, Max, Average and scaling would not, and are refused.
_AS_SIGNED = {np.dtype(np.uint16): np.dtype(np.int16), np.dtype(np.uint32): np.dtype(np.int32),
              np.dtype(np.uint64): np.dtype(np.int64)}


def _signed_view(kind, arr, name, op, prescale, postscale, psid):
    """arr as the signed type of its width where the engine can run kind on that (else arr)."""
    signed = _AS_SIGNED.get(arr.dtype)
    if signed is None:
        return arr
    if kind in (_ops.ALLREDUCE, _ops.REDUCESCATTER) and (op != Sum or prescale != 1.0 or postscale != 1.0):
        _ops.refuse(kind, name, psid, ValueError("Tensor type %s is reduced by Sum only, unscaled" % arr.dtype.name))
    return arr.view(signed)


# The last KoloInternalError a numpy function raised inside tf.function: TensorFlow reports it as
# a tf.errors.OpError, and elastic.run takes the typed error back from here (take_graph_error)
# rather than reading the OpError's message.
_graph_error = [None]


def take_graph_error():
    """The KoloInternalError that the last failed kolo op inside tf.function raised (None if
    none did since the last call), which TensorFlow reported as a tf.errors.OpError."""
    e, _graph_error[0] = _graph_error[0], None
    return e


class InvalidArgumentError(tf.errors.InvalidArgumentError, ValueError):
    """An op's arguments refused (a rank outside the op's process set, a type the engine lacks):
    tf.errors.InvalidArgumentError as Horovod's ops raise it, and the ValueError that a numpy
    function's error would be."""

    def __init__(self, message):
        tf.errors.InvalidArgumentError.__init__(self, None, None, message)


class FailedPreconditionError(tf.errors.FailedPreconditionError):
    """An op the ranks disagreed on (kolo._lib.KoloMismatchError: its dtype, shape, reduce op,
    root, ...): tf.errors.FailedPreconditionError, as Horovod's ops raise it. Not a
    HorovodInternalError: as with Horovod, hvd.elastic.run does not restore and retry it."""

    def __init__(self, message):
        tf.errors.FailedPreconditionError.__init__(self, None, None, message)


class UnknownError(tf.errors.UnknownError, KoloInternalError):
    """An op that failed otherwise (a rank lost, ended or stalled, the engine shut down):
    tf.errors.UnknownError, as Horovod's ops raise it, and the HorovodInternalError
    (kolo.KoloInternalError) that hvd.elastic.run recovers from."""

    def __init__(self, message):
        tf.errors.UnknownError.__init__(self, None, None, message)


def _eager(fn, *args):
    """fn(*args), its kolo errors raised as the tf.errors classes Horovod's ops raise."""
    try:
        return fn(*args)
    except KoloMismatchError as e:
        raise FailedPreconditionError(str(e)) from e
    except UnknownError:
        raise
    except KoloInternalError as e:
        raise UnknownError(str(e)) from e
    except ValueError as e:
        raise InvalidArgumentError(str(e)) from e


# The last kolo op of each TensorFlow 1 graph (and control flow context in it), which the next
# one is made to run after. A numpy function holds one of TensorFlow's inter-op threads (as many
# as the cores) while it waits for the other ranks: in a graph where several kolo ops could run at
# once, each rank may take a different few of them and wait with every thread held, for ops the
# other ranks cannot reach (a deadlock; Horovod's compiled ops are asynchronous and free their
# thread). tf.function orders its stateful ops already (automatic control dependencies); a plain
# graph gets the order its ops were made in, the same on every rank that built the same graph.
# An op so made also runs the kolo ops made before it in its graph that a fetch had not needed.
_graph_last = weakref.WeakKeyDictionary()

# In a graph, an exception of a numpy function reaches the caller as tf.errors.UnknownError
# (InvalidArgumentError for a ValueError), whatever its class: TensorFlow maps Python exceptions
# to its error codes by a few builtin classes. So a kolo op in a graph does not raise a mismatch:
# its numpy function returns a flag instead, and an op that fails with FailedPreconditionError
# when the flag is set guards its outputs. That op reads a variable that is never made, which
# TensorFlow documents as a FailedPreconditionError; the variable's name, fixed when the graph is
# built, is all of the message that TensorFlow lets kolo choose, so the reason goes to stderr.
_MISMATCH = ("kolo: the ranks disagreed on %s (its dtype, shape, reduce op, root, ...), "
             "which failed on every rank; stderr says how")


def _flagging(fn, touts):
    """fn for a numpy function in a graph: its outputs and False, or when the ranks disagreed on
    the op, empty outputs of dtypes touts and True. A KoloInternalError is kept for
    take_graph_error and raised."""
    def call(*arrays):
        try:
            outs = fn(*arrays)
        except KoloMismatchError as e:
            sys.stderr.write("kolo: %s\n" % e)
            return tuple(np.zeros(0, t.as_numpy_dtype) for t in touts) + (np.bool_(True),)
        except KoloInternalError as e:
            _graph_error[0] = e
            raise
        if not isinstance(outs, (list, tuple)):
            outs = (outs,)
        return tuple(outs) + (np.bool_(False),)
    return call


def _mismatch_check(flag, name):
    """An op that fails with FailedPreconditionError, naming op name, when flag is set."""
    flag.set_shape([])
    def fail():
        what = "op %s" % name if name else "a collective"
        v = tf.raw_ops.VarHandleOp(dtype=tf.bool, shape=[], shared_name=_MISMATCH % what)
        return tf.raw_ops.ReadVariableOp(resource=v, dtype=tf.bool)
    return tf.cond(flag, fail, lambda: flag, name="kolo_mismatch_check")


def _numpy_function(fn, inputs, touts, name=None, ordered=True):
    """fn as a stateful numpy function of inputs returning dtypes touts (a list, or one dtype for
    one output), with its mismatch check (_flagging) before its outputs; name: the op's.

    In a graph outside tf.function the op runs after the graph's previous kolo op (_graph_last)
    unless ordered is false. The order costs something: fetching an op runs every kolo op made
    before it, whatever it was made for. So an op that a script fetches on its own, once, and
    that is one op whatever it covers (broadcast_variables' group) is made with ordered=False:
    it neither waits for the ops before it (a broadcast made after the training op would
    otherwise run the training step's allreduces, and need its placeholders fed) nor makes the
    ops after it run it again (a broadcast made first would rerun at every step)."""
    one = not isinstance(touts, (list, tuple))
    touts = [touts] if one else list(touts)
    g = tf.compat.v1.get_default_graph()
    if getattr(g, "_add_control_dependencies", False) or not ordered:  # tf.function: ordered already
        *outs, flag = tf.numpy_function(_flagging(fn, touts), inputs, touts + [tf.bool], stateful=True)
        check = _mismatch_check(flag, name)
    else:
        ctx = g._get_control_flow_context()
        last = _graph_last.setdefault(g, {})
        prev = last.get(ctx)
        with tf.control_dependencies([prev] if prev is not None else []):
            *outs, flag = tf.numpy_function(_flagging(fn, touts), inputs, touts + [tf.bool], stateful=True)
            check = _mismatch_check(flag, name)
        # The next op runs once this one's check passed: never after a mismatch, on any rank.
        last[ctx] = check.op
    with tf.control_dependencies([check]):
        outs = [tf.identity(o) for o in outs]
    return outs[0] if one else outs


def _call(fn, inputs, touts, shapes, name=None):
    """Runs fn over the inputs' numpy arrays and returns its outputs as tensors of dtypes touts:
    at once when eager, else as a tf.numpy_function, its outputs given the static shapes (name:
    the op's, for the message of a mismatch in a graph)."""
    if tf.executing_eagerly():
        outs = _eager(fn, *[_host(t) for t in inputs])
        # tf.constant: the numpy array's dtype is the tensor's already, and convert_to_tensor with
        # a dtype takes a path several times slower for large arrays (4 ms against 0.7 for 4 MiB).
        return [tf.constant(o) for o in outs]
    outs = _numpy_function(fn, list(inputs), list(touts), name)
    if not isinstance(outs, (list, tuple)):
        outs = [outs]
    outs = list(outs)
    for o, s in zip(outs, shapes):
        o.set_shape(s)
    return outs


def _run1(kind, arr, name, op=Sum, root=0, prescale=1.0, postscale=1.0, splits=None, psid=0):
    """kolo._ops.run on one array (a numpy scalar for a 0-d tensor: made an array, no copy of
    anything larger), moving booleans as bytes."""
    arr = np.asarray(arr)
    as_bytes = _AS_BYTES.get(arr.dtype)
    if as_bytes is not None:
        if kind in (_ops.ALLREDUCE, _ops.REDUCESCATTER):
            _ops.refuse(kind, name, psid, ValueError("Tensor type bool is not supported by reductions"))
        res = _ops.run(np, kind, arr.view(as_bytes), name, op, root, prescale, postscale, splits, psid)
        if kind == _ops.ALLTOALL:
            return res[0].view(arr.dtype), res[1]
        return res.view(arr.dtype)
    a = _signed_view(kind, arr, name, op, prescale, postscale, psid)
    if a is not arr:
        res = _ops.run(np, kind, a, name, op, root, prescale, postscale, splits, psid)
        if kind == _ops.ALLTOALL:
            return res[0].view(arr.dtype), res[1]
        return res.view(arr.dtype)
    return _ops.run(np, kind, arr, name, op, root, prescale, postscale, splits, psid)


def _psid(process_set):
    """process_set's id; ValueError if it is not registered. Eagerly the op's call raises that
    (the engine refuses an unknown set); in a graph it is found here, when the op is made, as
    Horovod finds it."""
    psid = process_set.process_set_id
    if psid is None or (psid != 0 and not tf.executing_eagerly() and _engine_ranks(psid) is None):
        raise ValueError("process set %s is not registered (add_process_set)" % (process_set,))
    return psid


def _differentiable(tensor):
    return tensor.dtype.is_floating or tensor.dtype.is_complex


try:  # whether a GradientTape records eagerly now: tf.custom_gradient costs more than a small op
    from tensorflow.python.eager import record as _record
    _could_record = _record.could_possibly_record
except (ImportError, AttributeError):  # another TensorFlow's layout: always attach the gradient
    def _could_record():
        return True


def _with_grad(tensor, forward, backward):
    """forward(tensor) with backward(dy) as its gradient, where tensor can have one and something
    could record it (a tape, or a graph being built)."""
    if not _differentiable(tensor) or (tf.executing_eagerly() and not _could_record()):
        return forward(tensor)

    @tf.custom_gradient
    def f(x):
        return forward(x), backward
    return f(tensor)


# ----------------------------------------------------------------------------------------------
# Allreduce

def _allreduce(tensor, name=None, op=Sum, prescale_factor=1.0, postscale_factor=1.0,
               process_set=global_process_set, ignore_name_scope=False):
    """The engine's allreduce of a dense tensor, with Horovod's gradient: the same allreduce of
    the output's gradient."""
    tensor = _tensor(tensor)
    psid = _psid(process_set)
    nm = _op_name(name, "HorovodAllreduce", tensor)

    def forward(x):
        if tf.executing_eagerly() and x.device.endswith("CPU:0"):
            t = _into_tensor(_ops.ALLREDUCE, x, nm, op, 0, prescale_factor, postscale_factor, psid)
            if t is not None:
                return t

        def fn(a):
            return (_run1(_ops.ALLREDUCE, a, nm, op, 0, prescale_factor, postscale_factor, psid=psid),)
        return _call(fn, [x], [x.dtype], [x.shape], nm)[0]

    def backward(dy):
        return _allreduce(dy, None, op, prescale_factor, postscale_factor, process_set)
    return _with_grad(tensor, forward, backward)


def allreduce(tensor, average=None, device_dense="", device_sparse="", compression=None, op=None,
              prescale_factor=1.0, postscale_factor=1.0, name=None, process_set=global_process_set,
              ignore_name_scope=False):
    """Returns tensor reduced across ranks (Average by default). A tf.IndexedSlices is reduced
    as Horovod does, by allgathering its values and indices (Sum or Average only). device_dense
    and device_sparse are accepted for Horovod's signature: kolo stages every tensor through
    host memory."""
    from kolo.tensorflow.compression import Compression
    compression = compression or Compression.none
    op = _ops.check_reduce_op(op, average)
    if isinstance(tensor, tf.IndexedSlices):
        if op == Adasum:
            raise NotImplementedError("The Adasum reduction does not currently support sparse tensors. As a "
                                      "workaround please pass sparse_as_dense=True to DistributedOptimizer")
        if op not in (Sum, Average):
            raise NotImplementedError("Only Sum and Average ops are supported with tf.IndexedSlices")
        if prescale_factor != 1.0 or postscale_factor != 1.0:
            raise NotImplementedError("Pre/postscale_factor are not supported with tf.IndexedSlices")
        values = allgather(tensor.values, name=name and name + ".values", process_set=process_set)
        indices = allgather(tensor.indices, name=name and name + ".indices", process_set=process_set)
        if op == Average:
            values = values / tf.cast(process_set.size(), values.dtype)
        return tf.IndexedSlices(values, indices, dense_shape=tensor.dense_shape)
    tensor = _tensor(tensor)
    compressed, ctx = compression.compress(tensor)
    out = _allreduce(compressed, name, op, prescale_factor, postscale_factor, process_set)
    return compression.decompress(out, ctx)


def grouped_allreduce(tensors, average=None, device_dense="", device_sparse="", compression=None, op=None,
                      prescale_factor=1.0, postscale_factor=1.0, process_set=global_process_set, name=None):
    """Returns every tensor of the list reduced across ranks. Inside tf.function the tensors go
    to the engine as one numpy function (their allreduces submitted together, so the engine fuses
    them); gradients as allreduce's."""
    from kolo.tensorflow.compression import Compression
    compression = compression or Compression.none
    op = _ops.check_reduce_op(op, average)
    tensors = list(tensors)
    if not tensors:
        return []
    if any(isinstance(t, tf.IndexedSlices) for t in tensors):
        return [allreduce(t, op=op, compression=compression, prescale_factor=prescale_factor,
                          postscale_factor=postscale_factor, process_set=process_set,
                          name=name and "%s.%d" % (name, i)) for i, t in enumerate(tensors)]
    pairs = [compression.compress(tf.convert_to_tensor(t)) for t in tensors]
    outs = _grouped_allreduce([p[0] for p in pairs], name, op, prescale_factor, postscale_factor, process_set)
    return [compression.decompress(o, p[1]) for o, p in zip(outs, pairs)]


def _grouped_allreduce(tensors, name, op, prescale, postscale, process_set):
    psid = _psid(process_set)
    names = [_op_name(None if not name else "%s.%d" % (name, i), "HorovodGroupedAllreduce", t)
             for i, t in enumerate(tensors)]

    def fn(*arrays):
        # Submitted together, then waited for: the engine fuses what is ready at once.
        views = [_signed_view(_ops.ALLREDUCE, np.asarray(a), n, op, prescale, postscale, psid)
                 for a, n in zip(arrays, names)]
        outs = _ops.run_many(np, _ops.ALLREDUCE, views, names, op, 0, prescale, postscale, psid)
        return tuple(o.view(np.asarray(a).dtype) for o, a in zip(outs, arrays))

    def forward(*xs):
        return _call(fn, list(xs), [x.dtype for x in xs], [x.shape for x in xs], names[0])

    if not all(_differentiable(t) for t in tensors):
        return forward(*tensors)

    @tf.custom_gradient
    def f(*xs):
        def backward(*dys):
            return _grouped_allreduce(list(dys), None, op, prescale, postscale, process_set)
        return forward(*xs), backward
    return list(f(*tensors))


# ----------------------------------------------------------------------------------------------
# Allgather, broadcast, alltoall, reducescatter

def _allgather_raw(tensor, nm, psid):
    def fn(a):
        return (_run1(_ops.ALLGATHER, a, nm, psid=psid),)
    shape = tf.TensorShape([None]).concatenate(tensor.shape[1:]) if tensor.shape.rank else tensor.shape
    return _call(fn, [tensor], [tensor.dtype], [shape], nm)[0]


def allgather(tensor, name=None, ignore_name_scope=False, process_set=global_process_set):
    """Returns every rank's tensor concatenated along dimension 0, whose size may differ across
    ranks. Gradient: the output's gradient averaged across ranks, this rank's rows of it."""
    tensor = tf.convert_to_tensor(tensor)
    psid = _psid(process_set)
    nm = _op_name(name, "HorovodAllgather", tensor)

    def backward(dy):
        grad = _allreduce(dy, op=Average, process_set=process_set)
        d = tf.reshape(tf.shape(tensor, out_type=tf.int64)[0], [1])
        dims = tf.reshape(allgather(d, process_set=process_set), [process_set.size()])
        return tf.split(grad, num_or_size_splits=dims, axis=0)[process_set.rank()]
    return _with_grad(tensor, lambda x: _allgather_raw(x, nm, psid), backward)


def grouped_allgather(tensors, name=None, ignore_name_scope=False, process_set=global_process_set):
    """allgather of every tensor of the list (member i named name.i)."""
    return [allgather(t, name=name and "%s.%d" % (name, i), process_set=process_set)
            for i, t in enumerate(tensors)]


def broadcast(tensor, root_rank, name=None, ignore_name_scope=False, process_set=global_process_set):
    """Returns root_rank's tensor on every rank (root_rank is a job rank, also within a process
    set). Gradient: the output's gradient averaged across ranks on the root, zero elsewhere."""
    tensor = tf.convert_to_tensor(tensor)
    psid = _psid(process_set)
    nm = _op_name(name, "HorovodBroadcast", tensor)

    def forward(x):
        if tf.executing_eagerly() and x.device.endswith("CPU:0"):
            t = _into_tensor(_ops.BROADCAST, x, nm, Sum, root_rank, 1.0, 1.0, psid)
            if t is not None:
                return t

        def fn(a):
            return (_run1(_ops.BROADCAST, a, nm, root=root_rank, psid=psid),)
        return _call(fn, [x], [x.dtype], [x.shape], nm)[0]

    def backward(dy):
        g = _allreduce(dy, op=Average, process_set=process_set)
        return g if rank() == root_rank else g * 0
    return _with_grad(tensor, forward, backward)


def broadcast_(variables, root_rank, name=None, process_set=global_process_set):
    """Assigns root_rank's values to variables on every rank; returns their new values (in a
    graph, tensors whose evaluation runs the broadcast and the assignment, as Horovod's)."""
    out = []
    for i, v in enumerate(variables):
        nm = name and "%s.%d" % (name, i)
        if nm is None and tf.executing_eagerly():
            nm = "broadcast_.%s" % v.name
        assigned = v.assign(broadcast(v, root_rank, name=nm, process_set=process_set))
        if tf.executing_eagerly():
            out.append(v.read_value() if hasattr(v, "read_value") else tf.convert_to_tensor(v))
        else:
            out.append(tf.identity(assigned))
    return out


def alltoall(tensor, splits=None, name=None, ignore_name_scope=False, process_set=global_process_set):
    """Sends splits[r] rows (dimension 0) of tensor to rank r of the set, dimension 0 split evenly
    without splits; returns the rows received, and with splits (output, received_splits) as
    Horovod does (received_splits int32). Gradient: an alltoall back along the received splits."""
    tensor = tf.convert_to_tensor(tensor)
    psid = _psid(process_set)
    nm = _op_name(name, "HorovodAlltoall", tensor)
    has_splits = splits is not None
    splits_t = tf.cast(tf.convert_to_tensor(splits), tf.int64) if has_splits else tf.zeros([0], tf.int64)
    if splits_t.shape.rank not in (None, 1):
        raise ValueError("alltoall expects a 1D splits tensor, got %d dimensions" % splits_t.shape.rank)
    shape = tf.TensorShape([None]).concatenate(tensor.shape[1:]) if tensor.shape.rank else tensor.shape

    def fn(a, s):
        sp = [int(x) for x in s] if has_splits else None
        out, rs = _run1(_ops.ALLTOALL, a, nm, splits=sp, psid=psid)
        return out, rs

    def forward(x):
        return _call(fn, [x, splits_t], [x.dtype, tf.int32], [shape, tf.TensorShape([None])], nm)

    if _differentiable(tensor):
        @tf.custom_gradient
        def f(x):
            out, rs = forward(x)

            def backward(dy, drs=None):
                g, _ = alltoall(dy, splits=rs, process_set=process_set)
                return g
            return (out, rs), backward
        out, rs = f(tensor)
    else:
        out, rs = forward(tensor)
    return (out, rs) if has_splits else out


def _scatter_shape(tensor, process_set):
    if not tensor.shape.rank:
        return tensor.shape
    return tf.TensorShape([None]).concatenate(tensor.shape[1:])


def _reducescatter(tensor, name=None, op=Sum, prescale_factor=1.0, postscale_factor=1.0,
                   process_set=global_process_set):
    tensor = tf.convert_to_tensor(tensor)
    psid = _psid(process_set)
    nm = _op_name(name, "HorovodReducescatter", tensor)

    def forward(x):
        def fn(a):
            return (_run1(_ops.REDUCESCATTER, a, nm, op, 0, prescale_factor, postscale_factor, psid=psid),)
        return _call(fn, [x], [x.dtype], [_scatter_shape(x, process_set)], nm)[0]

    def backward(dy):
        # Horovod's convention: Sum's gradient is the gathered gradient times the set's size
        # (as allreduce's Sum gradient sums), Average's the gathered gradient; times the factors.
        scale = prescale_factor * postscale_factor * (process_set.size() if op == Sum else 1)
        if scale != 1:
            dy = dy * scale
        return allgather(dy, process_set=process_set)
    return _with_grad(tensor, forward, backward)


def reducescatter(tensor, device_dense="", compression=None, op=Average, name=None,
                  process_set=global_process_set, ignore_name_scope=False, prescale_factor=1.0,
                  postscale_factor=1.0):
    """Returns this rank's share (dimension 0; the first dim0 % size ranks get one row more) of
    tensor reduced across ranks. kolo also accepts Min, Max and Product."""
    from kolo.tensorflow.compression import Compression
    compression = compression or Compression.none
    _ops.check_reduce_op(op)
    t, ctx = compression.compress(tf.convert_to_tensor(tensor))
    out = _reducescatter(t, name, op, prescale_factor, postscale_factor, process_set)
    return compression.decompress(out, ctx)


def grouped_reducescatter(tensors, device_dense="", compression=None, op=Average, name=None,
                          process_set=global_process_set, prescale_factor=1.0, postscale_factor=1.0):
    return [reducescatter(t, compression=compression, op=op, name=name and "%s.%d" % (name, i),
                          process_set=process_set, prescale_factor=prescale_factor,
                          postscale_factor=postscale_factor) for i, t in enumerate(tensors)]


# ----------------------------------------------------------------------------------------------
# Barrier and join

def barrier(process_set=global_process_set):
    """Returns once every rank of the set has called barrier."""
    psid = _psid(process_set)
    if tf.executing_eagerly():
        _eager(_ops.run, np, _ops.BARRIER, None, None, _ops.Sum, 0, 1.0, 1.0, None, psid)
        return None

    def fn():
        _ops.run(np, _ops.BARRIER, None, psid=psid)
        return np.int32(0)
    return _numpy_function(fn, [], tf.int32)


def join():
    """Says this rank has no more data: other ranks' allreduces go on with it contributing
    nothing until every rank joined. Returns the last rank to join (an int32 tensor)."""
    def fn():
        return np.int32(_ops.run(np, _ops.JOIN, None))
    if tf.executing_eagerly():
        return tf.constant(_eager(fn))
    out = _numpy_function(fn, [], tf.int32)
    out.set_shape([])
    return out
