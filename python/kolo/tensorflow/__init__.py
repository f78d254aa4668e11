"""horovod.tensorflow's API on kolo's Go engine: change ``import horovod.tensorflow as hvd`` to
``import kolo.tensorflow as hvd`` and start the script with ``kolo run -np N python train.py``.

No custom op is compiled: ops reach the engine through ctypes from Python functions over numpy
arrays, eagerly at once and inside tf.function as numpy functions (kolo.tensorflow.mpi_ops), so one
installation serves every TensorFlow 2 it imports with. docs/tensorflow.md says what that costs.
"""

import tensorflow as tf

from kolo._lib import HorovodInternalError, KoloForkError, KoloInternalError  # noqa: F401
from kolo.process_sets import ProcessSet, add_process_set, global_process_set, remove_process_set  # noqa: F401
from kolo.tensorflow.compression import Compression
from kolo.tensorflow.functions import (  # noqa: F401
    allgather_object, broadcast_object, broadcast_object_fn, broadcast_variables,
)
from kolo.tensorflow.util import _executing_eagerly  # noqa: F401  (hvd._executing_eagerly, as Horovod has it)
from kolo.tensorflow.mpi_ops import (  # noqa: F401
    Adasum, Average, Max, Min, Product, Sum,
    allgather, allreduce, alltoall, barrier, broadcast, broadcast_, ccl_built, cross_rank, cross_size,
    cuda_built, ddl_built, gloo_built, gloo_enabled, grouped_allgather, grouped_allreduce,
    grouped_reducescatter, init, is_homogeneous, is_initialized, join, local_rank, local_rank_op,
    local_size, local_size_op, mpi_built, mpi_enabled, mpi_threads_supported, nccl_built,
    process_set_included_op, rank, rank_op, reducescatter, rocm_built, shutdown, size, size_op,
    start_timeline, stop_timeline,
)


def __getattr__(name):
    # SyncBatchNormalization subclasses a Keras layer: importing Keras costs seconds, so only a
    # script that uses it pays.
    if name == "SyncBatchNormalization":
        from kolo.tensorflow.sync_batch_norm import SyncBatchNormalization
        return SyncBatchNormalization
    raise AttributeError("module %r has no attribute %r" % (__name__, name))


def tensorflow_built():
    """Whether this kolo serves TensorFlow: True wherever this module imports."""
    return True


def broadcast_global_variables(root_rank):
    """Broadcasts tf.compat.v1's global variables from root_rank (graph-mode scripts); TF2 code
    passes its variables to broadcast_variables instead."""
    if tf.executing_eagerly():
        raise RuntimeError("hvd.broadcast_global_variables() does not support eager execution. "
                           "Please use `hvd.broadcast_variables(<model/optimizer variables>)` instead.")
    return broadcast_variables(tf.compat.v1.global_variables(), root_rank)


def _scale_factors(op, gradient_predivide_factor):
    """Horovod's split of an average across the scale factors: divide by the factor before the
    sum, multiply after (the engine's Average divides by the set's size)."""
    if gradient_predivide_factor != 1.0:
        if op != Average:
            raise ValueError("gradient_predivide_factor not supported with op != Average")
        return 1.0 / gradient_predivide_factor, gradient_predivide_factor
    return 1.0, 1.0


def _allreduce_grads(grads, compression, sparse_as_dense, op, gradient_predivide_factor, process_set):
    """Every gradient of the list reduced across ranks (None stays None): dense ones as one
    grouped allreduce (one submission, fused by the engine), tf.IndexedSlices as allreduce does
    them, or made dense first with sparse_as_dense."""
    pre, post = _scale_factors(op, gradient_predivide_factor)
    grads = list(grads)
    if sparse_as_dense:
        grads = [tf.convert_to_tensor(g) if isinstance(g, tf.IndexedSlices) else g for g in grads]
    dense = [i for i, g in enumerate(grads) if g is not None and not isinstance(g, tf.IndexedSlices)]
    out = list(grads)
    if dense:
        reduced = grouped_allreduce([grads[i] for i in dense], compression=compression, op=op,
                                    prescale_factor=pre, postscale_factor=post, process_set=process_set)
        for i, r in zip(dense, reduced):
            out[i] = r
    for i, g in enumerate(grads):
        if isinstance(g, tf.IndexedSlices):
            out[i] = allreduce(g, op=op, process_set=process_set)
    return out


class _DistributedGradientTape(tf.GradientTape):
    """A GradientTape whose gradient() returns gradients reduced across ranks."""

    def gradient(self, target, sources, output_gradients=None, unconnected_gradients=None, use_generic_names=False):
        kw = {} if unconnected_gradients is None else {"unconnected_gradients": unconnected_gradients}
        grads = super(_DistributedGradientTape, self).gradient(target, sources, output_gradients, **kw)
        flat = tf.nest.flatten(grads)
        src = tf.nest.flatten(sources)
        local = self._hvd_local_vars
        keep = [i for i, s in enumerate(src) if not (local and hasattr(s, "ref") and s.ref() in local)]
        reduced = _allreduce_grads([flat[i] for i in keep], *self._hvd_args)
        for i, r in zip(keep, reduced):
            flat[i] = r
        return tf.nest.pack_sequence_as(grads, flat)

    def register_local_source(self, source):
        """Marks source (a variable) worker-local: its gradient is not reduced."""
        self._hvd_local_vars.add(source.ref())


def DistributedGradientTape(gradtape, device_dense="", device_sparse="", compression=Compression.none,
                            sparse_as_dense=False, op=Average, gradient_predivide_factor=1.0, num_groups=0,
                            groups=None, process_set=global_process_set, scale_local_gradients=True):
    """Wraps gradtape (a tf.GradientTape, used or in use) so that its gradient() returns the
    gradients reduced across ranks (Average by default). The wrapped tape shares the original's
    recording: wrap it after the forward pass, as Horovod's examples do, or before.

    num_groups and groups are accepted for Horovod's signature: the dense gradients always go to
    the engine as one group, which it fuses by size."""
    if op == Adasum:
        raise NotImplementedError("kolo.tensorflow's DistributedGradientTape supports Average and Sum; "
                                  "Adasum needs allreduce(op=Adasum)")
    cls = type(gradtape.__class__.__name__, (_DistributedGradientTape, gradtape.__class__), {})
    tape = cls.__new__(cls)
    tape.__dict__.update(gradtape.__dict__)
    tape._hvd_args = (compression, sparse_as_dense, op, gradient_predivide_factor, process_set)
    tape._hvd_local_vars = set()
    return tape


def DistributedOptimizer(optimizer, name=None, use_locking=False, device_dense="", device_sparse="",
                         compression=Compression.none, sparse_as_dense=False, backward_passes_per_step=1,
                         op=Average, gradient_predivide_factor=1.0, average_aggregated_gradients=False,
                         num_groups=0, groups=None, process_set=global_process_set, scale_local_gradients=True):
    """Wraps a Keras optimizer (Keras 3's keras.optimizers.Optimizer, or Keras 2's) so that the
    gradients it applies are first reduced across ranks (Average by default). With
    backward_passes_per_step N > 1 the gradients of N calls are summed locally, and only every
    Nth call reduces and applies them (divided by N with average_aggregated_gradients)."""
    from kolo.tensorflow.keras import _create_distributed_optimizer
    return _create_distributed_optimizer(
        optimizer, name=name, compression=compression, sparse_as_dense=sparse_as_dense,
        backward_passes_per_step=backward_passes_per_step, op=op,
        gradient_predivide_factor=gradient_predivide_factor,
        average_aggregated_gradients=average_aggregated_gradients, process_set=process_set)




from kolo.tensorflow import elastic  # noqa: E402,F401  (hvd.elastic.run, TensorFlowKerasState, ...)
