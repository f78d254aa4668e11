"""kolo.keras on Keras 3's JAX backend: horovod.keras's names over jax arrays, without TensorFlow.

Every op is kolo._ops' on numpy arrays in host memory (ctypes into the engine library). On a
concrete jax array it runs at once: np.asarray reads the array's host buffer, and the result
becomes a jax array. Under tracing (inside jax.jit, where Keras compiles its train step) it is an
ordered jax.experimental.io_callback: the compiled step calls back into Python on the host with the
operands as numpy arrays, and the op runs there, in program order. Ordered, because a collective
must run exactly once per execution and in the same order on every rank; pure_callback may be
removed when its result is unused, run more than once, or moved, which leaves the other ranks
waiting for an op that never comes. Ops are matched across ranks by name; an unnamed op is
numbered by the engine in the order this rank submits unnamed ops of its kind (its place in the
program, inside jit as outside).

DistributedOptimizer (kolo._keras's Keras 3 optimizer, shared with the torch backend) reduces a
step's gradients in the optimizer's _clip_gradients, which Keras 3 runs inside the compiled step
before the update: one callback per step, the gradients packed into
one buffer per dtype for the crossing, reduced as one grouped op named "<optimizer name>.grads"
whose members are the gradients (each one's shape checked across ranks). Keras on JAX runs
_clip_gradients on every step, also under gradient accumulation (it computes the update and keeps
the old state on the steps that do not update); the callback gets whether the step updates and
skips the collective when it does not.

A collective that fails inside the compiled step reaches the script as jax.errors.JaxRuntimeError
("CpuCallback error"), whose message ends with kolo's error, as a tf.errors.OpError does for
kolo.tensorflow inside tf.function; the typed error is kept for hvd.elastic.run
(_take_step_error). Needs one JAX device per process (ordered callbacks run on
one device).
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import io_callback

from kolo import _keras, _lib, _ops
from kolo._compression import CastCompressor, Compressor, NoneCompressor  # noqa: F401 (re-exported)
from kolo._job import (  # noqa: F401 (re-exported: the same for every binding)
    ccl_built, cross_rank, cross_size, ddl_built, gloo_built, gloo_enabled, is_homogeneous, is_initialized,
    local_rank, local_size, mpi_built, mpi_enabled, mpi_threads_supported, rank, rank_stats, rocm_built, shutdown,
    size, start_timeline, stop_timeline,
)
from kolo._lib import HorovodInternalError, KoloInternalError  # noqa: F401 (re-exported)
from kolo._objects import allgather_object, broadcast_object, broadcast_object_fn, process_set_id  # noqa: F401
from kolo._ops import Adasum, Average, Max, Min, Product, Sum  # noqa: F401 (re-exported)
from kolo.process_sets import (  # noqa: F401 (re-exported)
    ProcessSet, _init_process_sets, add_process_set, global_process_set, remove_process_set,
)


def init(comm=None, process_sets=None):
    """Joins the job that `kolo run` (or mpirun/srun) started this process in; idempotent.
    comm: a list of job ranks to run on (kolo.torch's init explains it); process_sets: ProcessSet
    objects to register at start-up."""
    _lib.init(_lib.comm_ranks(comm))
    if process_sets:
        _init_process_sets(process_sets)


def nccl_built():
    return 0


def cuda_built():
    return False


# ----------------------------------------------------------------------------------------------
# Compression

class _CastCompressor(CastCompressor):
    floating = staticmethod(lambda t: jnp.issubdtype(t.dtype, jnp.floating))
    cast = staticmethod(lambda t, dtype: t.astype(dtype))


class FP16Compressor(_CastCompressor):
    """Sends floating-point arrays as IEEE float16."""

    wire_dtype = jnp.float16


class BF16Compressor(_CastCompressor):
    """Sends floating-point arrays as bfloat16."""

    wire_dtype = jnp.bfloat16


class Compression(object):
    """The compressors by name: ``Compression.none``, ``Compression.fp16``, ``Compression.bf16``."""

    none = NoneCompressor
    fp16 = FP16Compressor
    bf16 = BF16Compressor


# ----------------------------------------------------------------------------------------------
# How an op reaches the engine

def _traced(arrays):
    return any(isinstance(a, jax.core.Tracer) for a in arrays)


# The last KoloInternalError a kolo op inside a compiled step raised: JAX reports it as a
# jax.errors.JaxRuntimeError, and hvd.elastic.run takes the typed error back from here
# (_take_step_error) rather than reading the JaxRuntimeError's message.
_step_error = [None]


def _take_step_error():
    """The KoloInternalError that the last failed kolo op inside a compiled step raised (None if
    none did since the last call), which JAX reported as a JaxRuntimeError."""
    e, _step_error[0] = _step_error[0], None
    return e


def _on_host(fn, arrays, results):
    """fn(*numpy arrays) -> list of numpy arrays, on arrays (jax or numpy), returning jax arrays:
    at once when every array is concrete, else as an ordered io_callback whose results have the
    shapes and dtypes of results (jax.ShapeDtypeStruct)."""
    if not _traced(arrays):
        return [jnp.asarray(o) for o in fn(*[np.asarray(a) for a in arrays])]

    def recorded(*a):
        try:
            return fn(*a)
        except KoloInternalError as e:
            _step_error[0] = e
            raise
    return list(io_callback(recorded, list(results), *arrays, ordered=True))


def _bytes_view(kind, a, name, psid):
    """Booleans moved as bytes (broadcast, allgather); the engine has no boolean type."""
    if a.dtype != np.bool_:
        return a
    if kind in (_ops.ALLREDUCE, _ops.REDUCESCATTER):
        _ops.refuse(kind, name, psid, ValueError("Tensor type bool is not supported by reductions"))
    return a.view(np.uint8)


def _run1(kind, a, name, op=Sum, root=0, prescale=1.0, postscale=1.0, psid=0):
    a = np.asarray(a)
    res = _ops.run(np, kind, _bytes_view(kind, a, name, psid), name, op, root, prescale, postscale, None, psid)
    return res.view(a.dtype) if a.dtype == np.bool_ else res


def _struct(shape, dtype):
    return jax.ShapeDtypeStruct(tuple(shape), dtype)


# ----------------------------------------------------------------------------------------------
# The ops

@functools.partial(jax.custom_vjp, nondiff_argnums=(1,))
def _allreduce_with_grad(x, params):
    return _allreduce(x, *params)


def _allreduce_fwd(x, params):
    return _allreduce(x, *params), None


def _allreduce_bwd(params, _, dy):
    name, op, prescale, postscale, psid = params
    return (_allreduce(dy, name and name + ".grad", op, prescale, postscale, psid),)


_allreduce_with_grad.defvjp(_allreduce_fwd, _allreduce_bwd)


def _allreduce(x, name, op, prescale, postscale, psid):
    def fn(a):
        return [_run1(_ops.ALLREDUCE, a, name, op, 0, prescale, postscale, psid)]
    return _on_host(fn, [x], [_struct(x.shape, x.dtype)])[0]


def allreduce(tensor, average=None, device_dense="", device_sparse="", compression=Compression.none, op=None,
              prescale_factor=1.0, postscale_factor=1.0, name=None, process_set=global_process_set):
    """Returns tensor (a jax or numpy array) reduced across ranks (Average by default), as a jax
    array; inside jax.jit too. Its gradient (jax.grad) is the same allreduce of the output's
    gradient, as Horovod's. device_dense and device_sparse are accepted for Horovod's signature."""
    op = _ops.check_reduce_op(op, average)
    psid = process_set_id(process_set)
    x, ctx = (compression or Compression.none).compress(jnp.asarray(tensor))
    params = (name or None, op, float(prescale_factor), float(postscale_factor), psid)
    if jnp.issubdtype(x.dtype, jnp.inexact):
        out = _allreduce_with_grad(x, params)
    else:
        out = _allreduce(x, *params)
    return (compression or Compression.none).decompress(out, ctx)


def grouped_allreduce(tensors, average=None, device_dense="", device_sparse="", compression=Compression.none,
                      op=None, prescale_factor=1.0, postscale_factor=1.0, name=None, process_set=global_process_set):
    """Every tensor reduced across ranks, as one grouped op (Horovod's: released together on every
    rank); inside jax.jit one callback. No gradient."""
    op = _ops.check_reduce_op(op, average)
    compression = compression or Compression.none
    psid = process_set_id(process_set)
    sent, ctxs = [], []
    for t in tensors:
        x, c = compression.compress(jnp.asarray(t))
        sent.append(x)
        ctxs.append(c)
    outs = _grouped(sent, name or None, op, prescale_factor, postscale_factor, psid)
    return [compression.decompress(o, c) for o, c in zip(outs, ctxs)]


def _grouped(arrays, name, op, prescale, postscale, psid, update=None, step=False):
    """The allreduces of arrays as one grouped op named name (None: numbered by the engine); with
    update (a boolean array, traced or not), only where it is true (else the arrays come back as
    they are); with step, a training step marked for kolo run's live view and the autotuner.

    The arrays cross into Python packed, one flat buffer per dtype: io_callback's cost grows with
    the number of its operands (docs/keras.md), a copy's only with their bytes. On the host each
    array is a view of its buffer, a member of the group with its own shape (the engine checks
    each member's shape across ranks), reduced into a view of one output buffer. One group rather
    than an op per array: the engine's cost per op is what a step of many small gradients pays."""
    if not arrays:
        return []
    by_dtype = {}
    for i, a in enumerate(arrays):
        by_dtype.setdefault(jnp.dtype(a.dtype), []).append(i)
    groups = list(by_dtype.values())
    flats = [jnp.concatenate([jnp.ravel(arrays[i]) for i in g]) if len(g) > 1 else jnp.ravel(arrays[g[0]])
             for g in groups]

    def fn(*a):
        if update is not None:
            if not a[0]:
                return [np.asarray(x) for x in a[1:]]
            a = a[1:]
        views, into, outs = [None] * len(arrays), [None] * len(arrays), []
        for flat, g in zip(a, groups):
            flat = np.asarray(flat)
            out = np.empty_like(flat)
            outs.append(out)
            off = 0
            for i in g:
                n = int(np.prod(arrays[i].shape, dtype=np.int64))
                views[i] = flat[off:off + n].reshape(arrays[i].shape)
                into[i] = out[off:off + n].reshape(arrays[i].shape)
                off += n
        _ops.run_group(np, _ops.ALLREDUCE, views, name, op, prescale, postscale, psid, into=into)
        if step:
            _lib.mark_step()
        return outs
    inputs = flats if update is None else [jnp.asarray(update)] + flats
    reduced = _on_host(fn, inputs, [_struct(f.shape, f.dtype) for f in flats])
    out = [None] * len(arrays)
    for flat, g in zip(reduced, groups):
        off = 0
        for i in g:
            n = int(np.prod(arrays[i].shape, dtype=np.int64))
            out[i] = flat[off:off + n].reshape(arrays[i].shape)
            off += n
    return out


def allgather(tensor, name=None, process_set=global_process_set):
    """Returns every rank's tensor concatenated along the first dimension, in rank order. Outside
    jit the first dimensions may differ across ranks; inside jit the result's shape is fixed when
    the step is traced, so every rank must give the same first dimension (else the op fails)."""
    psid = process_set_id(process_set)
    x = jnp.asarray(tensor)
    name = name or None

    def fn(a):
        return [_run1(_ops.ALLGATHER, a, name, psid=psid)]
    if not _traced([x]):
        return _on_host(fn, [x], None)[0]
    if x.ndim == 0:
        raise ValueError("allgather needs at least one dimension")
    want = (x.shape[0] * process_set.size(),) + tuple(x.shape[1:])

    def fixed(a):
        out = fn(a)[0]
        if out.shape != want:
            raise ValueError("allgather inside jax.jit: ranks gave different first dimensions (the result is "
                             "%s, the traced step expects %s)" % (out.shape, want))
        return [out]
    return _on_host(fixed, [x], [_struct(want, x.dtype)])[0]


def broadcast(tensor, root_rank, name=None, process_set=global_process_set):
    """Returns root_rank's tensor on every rank (root_rank is a job rank, also within a process
    set); inside jax.jit too. No gradient."""
    psid = process_set_id(process_set)
    x = jnp.asarray(tensor)
    name = name or None

    def fn(a):
        return [_run1(_ops.BROADCAST, a, name, root=root_rank, psid=psid)]
    return _on_host(fn, [x], [_struct(x.shape, x.dtype)])[0]


def reducescatter(tensor, device_dense="", compression=Compression.none, op=Average, name=None,
                  process_set=global_process_set, prescale_factor=1.0, postscale_factor=1.0):
    """Returns this rank's share (dimension 0; the first dim0 % size ranks get one row more) of
    tensor reduced across ranks; inside jax.jit too. No gradient."""
    _ops.check_reduce_op(op)
    psid = process_set_id(process_set)
    compression = compression or Compression.none
    x, ctx = compression.compress(jnp.asarray(tensor))
    if x.ndim == 0:
        raise ValueError("reducescatter needs at least one dimension")
    n, me = process_set.size(), process_set.rank()
    rows = x.shape[0] // n + (1 if me is not None and me < x.shape[0] % n else 0)
    name = name or None

    def fn(a):
        return [_run1(_ops.REDUCESCATTER, a, name, op, 0, prescale_factor, postscale_factor, psid)]
    out = _on_host(fn, [x], [_struct((rows,) + tuple(x.shape[1:]), x.dtype)])[0]
    return compression.decompress(out, ctx)


def alltoall(tensor, splits=None, name=None, process_set=global_process_set):
    """Scatters tensor's first dimension to the ranks (splits rows each; equal shares without
    splits) and returns what every rank sent this one, concatenated, as Horovod does: (output,
    received_splits) with splits, output alone without. Outside jit only: the output's shape
    depends on what the other ranks send."""
    psid = process_set_id(process_set)
    x = jnp.asarray(tensor)
    if _traced([x]) or (splits is not None and _traced([splits])):
        raise NotImplementedError("kolo.keras on JAX: alltoall inside jax.jit is not supported (its output's shape "
                                  "depends on the other ranks); call it outside the compiled step")
    a = np.asarray(x)
    sp = None if splits is None else [int(s) for s in np.asarray(splits).reshape(-1)]
    out, received = _ops.run(np, _ops.ALLTOALL, _bytes_view(_ops.ALLTOALL, a, name, psid), name or None,
                             splits=sp, psid=psid)
    out = jnp.asarray(out.view(a.dtype) if a.dtype == np.bool_ else out)
    return (out, jnp.asarray(received)) if splits is not None else out


def barrier(process_set=global_process_set):
    """Returns once every rank of the set has called barrier (outside jit)."""
    _ops.run(np, _ops.BARRIER, None, psid=process_set_id(process_set))


def join():
    """Says this rank has no more data: other ranks' allreduces go on with it contributing
    nothing until every rank joined. Returns the last rank to join (outside jit)."""
    return _ops.run(np, _ops.JOIN, None)


# ----------------------------------------------------------------------------------------------
# Keras

class _JaxDistributedOptimizer(_keras.Keras3DistributedOptimizer):
    """kolo._keras's Keras 3 distributed optimizer on JAX: the step's gradients cross to the
    engine inside the compiled step, as one ordered callback (_grouped), and on a step of an
    accumulation that does not update the callback skips the collective (Keras on JAX runs
    _clip_gradients on every step there)."""

    def _hvd_allreduce_grads(self, grads, name, op, prescale, postscale, process_set):
        update = None
        if self.gradient_accumulation_steps:
            update = (self._iterations + 1) % self.gradient_accumulation_steps == 0
        return _grouped(grads, name, op, prescale, postscale, process_set_id(process_set), update, step=True)


_api = _keras.keras3_api(_JaxDistributedOptimizer, Compression.none, "JAX")
DistributedOptimizer = _api["DistributedOptimizer"]
PartialDistributedOptimizer = _api["PartialDistributedOptimizer"]
load_model = _api["load_model"]
broadcast_global_variables = _keras.broadcast_global_variables


def broadcast_variables(variables, root_rank, process_set=global_process_set):
    """Assigns root_rank's values to variables (Keras variables) on every rank, outside jit."""
    _keras.broadcast_variables(variables, root_rank, process_set)
