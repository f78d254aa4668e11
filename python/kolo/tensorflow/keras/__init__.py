"""horovod.tensorflow.keras on kolo: the distributed Keras optimizer, for TensorFlow's Keras
(Keras 3 as tf.keras, or tf-keras where TF_USE_LEGACY_KERAS=1 makes it tf.keras).

The optimizer is the user's optimizer class with the reduction put in front of its update, built
again from its config, as Horovod builds it: Keras 3's update runs _clip_gradients first (on the
steps that update, after Keras 3's own gradient accumulation), tf-keras's is apply_gradients.
"""

from kolo import _keras
from kolo.process_sets import ProcessSet, add_process_set, global_process_set, remove_process_set  # noqa: F401
from kolo.tensorflow.compression import Compression
# horovod.tensorflow.keras offers the basics beside the optimizer: hvd.init(), hvd.size(), ...
from kolo.tensorflow.mpi_ops import (  # noqa: F401
    Adasum, Average, HorovodInternalError, Max, Min, Product, Sum, allgather, allreduce, alltoall, barrier,
    broadcast, cross_rank, cross_size, init, is_initialized, join, local_rank, local_size, mpi_built,
    mpi_enabled, mpi_threads_supported, nccl_built, rank, reducescatter, shutdown, size,
)
from kolo.tensorflow.functions import allgather_object, broadcast_object  # noqa: F401

class _Keras3Reduce(object):
    """Keras 3: reduces the gradients of an update step before clipping, as Horovod reduces
    before the wrapped optimizer sees them. With gradient accumulation, Keras averages the steps'
    gradients first; _hvd_scale undoes that where Horovod sums them."""

    def _clip_gradients(self, grads):
        from kolo.tensorflow import _allreduce_grads
        compression, sparse_as_dense, op, factor, process_set = self._hvd_args
        grads = list(grads)
        if self._hvd_scale != 1:
            grads = [g * self._hvd_scale if g is not None else g for g in grads]
        grads = _allreduce_grads(grads, compression, sparse_as_dense, op, factor, process_set)
        return super(_Keras3Reduce, self)._clip_gradients(grads)


class _TFKerasReduce(object):
    """tf-keras: reduces the gradients in apply_gradients, before the wrapped optimizer's."""

    def apply_gradients(self, grads_and_vars, *args, **kwargs):
        from kolo.tensorflow import _allreduce_grads
        grads_and_vars = list(grads_and_vars)
        grads = _allreduce_grads([g for g, _ in grads_and_vars], *self._hvd_args)
        return super(_TFKerasReduce, self).apply_gradients(
            list(zip(grads, [v for _, v in grads_and_vars])), *args, **kwargs)


def _create_distributed_optimizer(optimizer, name=None, compression=Compression.none, sparse_as_dense=False,
                                  backward_passes_per_step=1, op=None, gradient_predivide_factor=1.0,
                                  average_aggregated_gradients=False, process_set=global_process_set):
    from kolo.tensorflow.mpi_ops import Average
    op = Average if op is None else op
    mixin = _Keras3Reduce if _keras.is_keras3(optimizer) else _TFKerasReduce
    return _keras.distributed_optimizer(
        optimizer, mixin, (compression, sparse_as_dense, op, gradient_predivide_factor, process_set),
        backward_passes_per_step, average_aggregated_gradients, name)


def DistributedOptimizer(optimizer, name=None, device_dense="", device_sparse="", compression=Compression.none,
                         sparse_as_dense=False, gradient_predivide_factor=1.0, op=None,
                         backward_passes_per_step=1, average_aggregated_gradients=False, num_groups=0,
                         groups=None, process_set=global_process_set, scale_local_gradients=True):
    """A copy of optimizer (built from its config) whose updates use the gradients reduced across
    ranks (Average by default). backward_passes_per_step N > 1 (Keras 3) updates every Nth step
    with the sum of the N steps' gradients (their mean with average_aggregated_gradients)."""
    return _create_distributed_optimizer(
        optimizer, name, compression, sparse_as_dense, backward_passes_per_step, op, gradient_predivide_factor,
        average_aggregated_gradients, process_set)


def _load_model(keras, filepath, custom_optimizers, custom_objects, compression):
    """keras.models.load_model, then the model's optimizer made distributed, with its state."""
    from kolo.tensorflow.sync_batch_norm import SyncBatchNormalization
    objects = dict(custom_objects or {})
    objects.setdefault("SyncBatchNormalization", SyncBatchNormalization)  # kolo's own layer
    return _keras.load_model(keras, filepath, custom_optimizers, objects,
                             lambda opt: _create_distributed_optimizer(opt, compression=compression))


def load_model(filepath, custom_optimizers=None, custom_objects=None, compression=Compression.none):
    """Loads a model saved with model.save (tf.keras's load_model) and returns it with its
    optimizer made a DistributedOptimizer, its state (iterations, slots) carried over.
    custom_optimizers are optimizer classes of the script's own, as in Horovod."""
    import tensorflow as tf
    return _load_model(tf.keras, filepath, custom_optimizers, custom_objects, compression)


def broadcast_global_variables(root_rank):
    """Horovod's TensorFlow 1 broadcast of the session's variables: there are none in TensorFlow 2's
    eager Keras; the callback or broadcast_variables does the job there."""
    raise RuntimeError("hvd.broadcast_global_variables() does not support eager execution; use "
                       "hvd.callbacks.BroadcastGlobalVariablesCallback or hvd.broadcast_variables")


from kolo.tensorflow.keras import callbacks  # noqa: E402,F401
