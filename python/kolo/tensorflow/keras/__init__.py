"""horovod.tensorflow.keras on kolo: the distributed Keras optimizer, for TensorFlow's Keras
(Keras 3 as tf.keras; Keras 2 as tf.keras: tf-keras where TF_USE_LEGACY_KERAS=1 makes it tf.keras,
or TensorFlow's own Keras before TensorFlow 2.16).

The optimizer is the user's optimizer class with the reduction put in front of its update, built
again from its config, as Horovod builds it: Keras 3's update runs _clip_gradients first (on the
steps that update, after Keras 3's own gradient accumulation), Keras 2's is apply_gradients.
Which Keras an optimizer belongs to is told by what it has (_is_keras3), not by version numbers.
"""

from kolo.process_sets import ProcessSet, add_process_set, global_process_set, remove_process_set  # noqa: F401
from kolo.tensorflow.compression import Compression
# horovod.tensorflow.keras offers the basics beside the optimizer: hvd.init(), hvd.size(), ...
from kolo.tensorflow.mpi_ops import (  # noqa: F401
    Adasum, Average, HorovodInternalError, Max, Min, Product, Sum, allgather, allreduce, alltoall, barrier,
    broadcast, cross_rank, cross_size, init, is_initialized, join, local_rank, local_size, mpi_built,
    mpi_enabled, mpi_threads_supported, nccl_built, rank, reducescatter, shutdown, size,
)
from kolo.tensorflow.functions import allgather_object, broadcast_object  # noqa: F401

_K3_METHOD = "_backend_apply_gradients"  # present on Keras 3 optimizers only


def _is_keras3(optimizer):
    return hasattr(optimizer, _K3_METHOD) and hasattr(optimizer, "gradient_accumulation_steps")


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
    """Keras 2 (tf-keras, and TensorFlow's own Keras before 2.16): reduces the gradients in
    apply_gradients, before the wrapped optimizer's. With backward_passes_per_step N > 1
    (_hvd_passes), as Horovod: each call adds its gradients to local sums (sparse ones made
    dense); every Nth reduces the sums (divided by N with average_aggregated_gradients), applies
    them and zeroes them, and the calls between only add one to iterations, which so counts calls
    (Keras 3's count updates)."""

    _hvd_passes = 1
    _hvd_average = False

    def apply_gradients(self, grads_and_vars, *args, **kwargs):
        from kolo.tensorflow import _allreduce_grads
        grads_and_vars = list(grads_and_vars)
        grads, variables = [g for g, _ in grads_and_vars], [v for _, v in grads_and_vars]
        if self._hvd_passes == 1:
            grads = _allreduce_grads(grads, *self._hvd_args)
            return super(_TFKerasReduce, self).apply_gradients(list(zip(grads, variables)), *args, **kwargs)
        import tensorflow as tf
        sums, count = self._hvd_sums(grads, variables)
        added = [s.assign_add(tf.convert_to_tensor(g)) for s, g in zip(sums, grads) if s is not None]
        with tf.control_dependencies(added):
            calls = count.assign_add(1)

        def update():
            total = [None if s is None else s.read_value() for s in sums]
            total = _allreduce_grads(total, *self._hvd_args)
            if self._hvd_average:
                total = [None if g is None else g / self._hvd_passes for g in total]
            super(_TFKerasReduce, self).apply_gradients(list(zip(total, variables)), *args, **kwargs)
            for s in sums:
                if s is not None:
                    s.assign(tf.zeros_like(s))
            count.assign(0)
            return tf.constant(True)

        def skip():
            self.iterations.assign_add(1)
            return tf.constant(False)
        return tf.cond(tf.equal(calls, self._hvd_passes), update, skip)

    def _hvd_sums(self, grads, variables):
        """The sum variable of each variable whose gradient is not None, and the calls' count,
        made where first needed, in tf.init_scope (outside any tf.function), and kept in a plain
        object, which Keras neither tracks nor counts among the optimizer's variables or saves."""
        import tensorflow as tf
        state = getattr(self, "_hvd_state", None)
        if state is None:
            state = self._hvd_state = _GradientSums()
        with tf.init_scope():
            if state.count is None:
                state.count = tf.Variable(0, dtype=tf.int64, trainable=False, name="hvd_calls")
                _ = self.iterations  # made here, not in a branch of tf.cond
            for g, v in zip(grads, variables):
                if g is not None and v.ref() not in state.sums:
                    state.sums[v.ref()] = tf.Variable(tf.zeros(v.shape, g.dtype), trainable=False,
                                                      name="hvd_sum")
        return [None if g is None else state.sums[v.ref()] for g, v in zip(grads, variables)], state.count


class _GradientSums(object):
    """A Keras 2 DistributedOptimizer's gradient sums, by variable (its ref()), and its count of
    calls since the last update."""

    def __init__(self):
        self.count = None
        self.sums = {}


def _create_distributed_optimizer(optimizer, name=None, compression=Compression.none, sparse_as_dense=False,
                                  backward_passes_per_step=1, op=None, gradient_predivide_factor=1.0,
                                  average_aggregated_gradients=False, process_set=global_process_set):
    from kolo.tensorflow.mpi_ops import Average
    op = Average if op is None else op
    config = optimizer.get_config()
    n = int(backward_passes_per_step)
    if n < 1:
        raise ValueError("backward_passes_per_step must be > 0")
    scale = 1
    if _is_keras3(optimizer):
        mixin = _Keras3Reduce
        if n > 1:
            config["gradient_accumulation_steps"] = n
            scale = 1 if average_aggregated_gradients else n
    else:
        mixin = _TFKerasReduce
    attrs = {"_hvd_args": (compression, sparse_as_dense, op, gradient_predivide_factor, process_set),
             "_hvd_scale": scale, "_hvd_passes": n, "_hvd_average": bool(average_aggregated_gradients)}
    # The wrapped class's name and module: a saved model records the optimizer as the plain one,
    # which any Keras loads (and load_model below wraps again), as with Horovod.
    attrs["__module__"] = optimizer.__class__.__module__
    cls = type(optimizer.__class__.__name__, (mixin, optimizer.__class__), attrs)
    if name is not None:
        config["name"] = name
    return cls.from_config(config)


def DistributedOptimizer(optimizer, name=None, device_dense="", device_sparse="", compression=Compression.none,
                         sparse_as_dense=False, gradient_predivide_factor=1.0, op=None,
                         backward_passes_per_step=1, average_aggregated_gradients=False, num_groups=0,
                         groups=None, process_set=global_process_set, scale_local_gradients=True):
    """A copy of optimizer (built from its config) whose updates use the gradients reduced across
    ranks (Average by default). backward_passes_per_step N > 1 updates every Nth step with the
    sum of the N steps' gradients (their mean with average_aggregated_gradients)."""
    return _create_distributed_optimizer(
        optimizer, name, compression, sparse_as_dense, backward_passes_per_step, op, gradient_predivide_factor,
        average_aggregated_gradients, process_set)


def _load_model(keras, filepath, custom_optimizers, custom_objects, compression):
    """keras.models.load_model, then the model's optimizer made distributed, with its state."""
    from kolo.tensorflow.sync_batch_norm import SyncBatchNormalization
    objects = dict(custom_objects or {})
    objects.setdefault("SyncBatchNormalization", SyncBatchNormalization)  # kolo's own layer
    for c in custom_optimizers or []:
        objects.setdefault(c.__name__, c)
    model = keras.models.load_model(filepath, custom_objects=objects)
    opt = getattr(model, "optimizer", None)
    if opt is None:
        return model
    dist = _create_distributed_optimizer(opt, compression=compression)
    old_vars = _optimizer_variables(opt)
    if old_vars:
        if hasattr(dist, "build"):  # Keras 3's optimizers and Keras 2's (tf-keras, TensorFlow < 2.16)
            dist.build(model.trainable_variables)
        elif hasattr(dist, "_create_all_weights"):
            # Keras 2's legacy optimizers (OptimizerV2), which TensorFlow 2.12's load_model gives
            # back for a .keras file: iterations, then the slots, as the loaded one has them.
            dist._create_all_weights(model.trainable_variables)
        new_vars = _optimizer_variables(dist)
        if len(new_vars) != len(old_vars):
            raise ValueError("load_model: the distributed optimizer has %d variables, the loaded one %d"
                             % (len(new_vars), len(old_vars)))
        for a, b in zip(new_vars, old_vars):
            a.assign(b)
    model.optimizer = dist
    return model


def _optimizer_variables(optimizer):
    v = optimizer.variables
    return list(v() if callable(v) else v)


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
