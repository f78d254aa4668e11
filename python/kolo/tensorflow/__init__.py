"""horovod.tensorflow's API on kolo's Go engine: change ``import horovod.tensorflow as hvd`` to
``import kolo.tensorflow as hvd`` and start the script with ``kolo run -np N python train.py``.

No custom op is compiled: ops reach the engine through ctypes from Python functions over numpy
arrays, eagerly at once and inside tf.function as numpy functions (kolo.tensorflow.mpi_ops), so one
installation serves every TensorFlow 2 it imports with. docs/tensorflow.md says what that costs.
"""

import tensorflow as tf

from kolo import _ops
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
    process_set_included_op, rank, rank_op, rank_stats, reducescatter, rocm_built, shutdown, size, size_op,
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


def broadcast_global_variables(root_rank, process_set=global_process_set):
    """Broadcasts tf.compat.v1's global variables from root_rank (graph-mode scripts); TF2 code
    passes its variables to broadcast_variables instead."""
    if tf.executing_eagerly():
        raise RuntimeError("hvd.broadcast_global_variables() does not support eager execution. "
                           "Please use `hvd.broadcast_variables(<model/optimizer variables>)` instead.")
    return broadcast_variables(tf.compat.v1.global_variables(), root_rank, process_set=process_set)


class BroadcastGlobalVariablesHook(tf.compat.v1.train.SessionRunHook):
    """A SessionRunHook (tf.compat.v1.train.MonitoredTrainingSession's hooks) that broadcasts
    every global variable from root_rank once the session is made, as Horovod's: the ranks start
    from the same weights, whether they initialized them or restored a checkpoint. device is
    accepted for Horovod's signature (kolo stages every tensor through host memory)."""

    def __init__(self, root_rank, device="", process_set=global_process_set):
        super(BroadcastGlobalVariablesHook, self).__init__()
        self.root_rank = root_rank
        self.device = device
        self.process_set = process_set
        self.bcast_op = None

    def begin(self):
        # The graph is final after begin: the op is made here, once per graph.
        if self.bcast_op is None or self.bcast_op.graph is not tf.compat.v1.get_default_graph():
            self.bcast_op = broadcast_global_variables(self.root_rank, process_set=self.process_set)

    def after_create_session(self, session, coord):
        session.run(self.bcast_op)


def _allreduce_grads(grads, compression, sparse_as_dense, op, gradient_predivide_factor, process_set):
    """Every gradient of the list reduced across ranks (None stays None): dense ones as one
    grouped allreduce (one submission, fused by the engine), tf.IndexedSlices as allreduce does
    them, or made dense first with sparse_as_dense. As Horovod's, a rank outside process_set, or a
    set of one rank, keeps its own gradients (and submits nothing)."""
    pre, post = _ops.scale_factors(op, gradient_predivide_factor)
    grads = list(grads)
    if sparse_as_dense:
        grads = [tf.convert_to_tensor(g) if isinstance(g, tf.IndexedSlices) else g for g in grads]
    if not (process_set.included() and process_set.size() > 1):
        return grads
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


class _Reduction(object):
    """How a distributed tape or optimizer reduces its gradients: _allreduce_grads' arguments,
    and the worker-local sources (variables or tensors) whose gradients are not reduced.

    As in Horovod, a local gradient stays this rank's, divided by the process set's size where
    scale_local_gradients, so that it weighs in the update as a gradient averaged over the set
    would."""

    def __init__(self, compression, sparse_as_dense, op, gradient_predivide_factor, process_set,
                 scale_local_gradients=True):
        self.args = (compression, sparse_as_dense, op, gradient_predivide_factor, process_set)
        self.process_set = process_set
        self.scale_local_gradients = scale_local_gradients
        self._local = {}  # id(source) -> source, kept so that its id stays its own

    def register_local(self, source):
        self._local[id(source)] = source

    def is_local(self, source):
        return id(source) in self._local

    def __call__(self, grads, sources):
        """grads (one per source, None for none) reduced across ranks, but the local sources'."""
        grads = list(grads)
        local = [i for i, s in enumerate(sources) if id(s) in self._local]
        if not local:
            return _allreduce_grads(grads, *self.args)
        out = list(grads)
        local_set = set(local)
        shared = [i for i in range(len(grads)) if i not in local_set]
        for i, r in zip(shared, _allreduce_grads([grads[i] for i in shared], *self.args)):
            out[i] = r
        if self.scale_local_gradients:
            n = float(self.process_set.size())
            for i in local:
                g = out[i]
                if isinstance(g, tf.IndexedSlices):
                    out[i] = tf.IndexedSlices(g.values / n, g.indices, g.dense_shape)
                elif g is not None:
                    out[i] = g / n
        return out


class _DistributedGradientTape(tf.GradientTape):
    """A GradientTape whose gradient() returns gradients reduced across ranks."""

    def gradient(self, target, sources, output_gradients=None, unconnected_gradients=None, use_generic_names=False):
        kw = {} if unconnected_gradients is None else {"unconnected_gradients": unconnected_gradients}
        grads = super(_DistributedGradientTape, self).gradient(target, sources, output_gradients, **kw)
        flat = self._hvd_reduction(tf.nest.flatten(grads), tf.nest.flatten(sources))
        return tf.nest.pack_sequence_as(grads, flat)

    def register_local_source(self, source):
        """Marks source (a variable) worker-local: its gradient is not reduced (and is divided by
        the set's size, unless the tape was made with scale_local_gradients=False)."""
        self._hvd_reduction.register_local(source)

    def get_local_and_global_gradients(self, target, sources, output_gradients=None, use_generic_names=False):
        """gradient()'s gradients as two lists of (source, gradient): the worker-local sources'
        and the others'."""
        grads = self.gradient(target, sources, output_gradients)
        local, global_ = [], []
        for s, g in zip(sources, grads):
            (local if self._hvd_reduction.is_local(s) else global_).append((s, g))
        return local, global_


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
    tape._hvd_reduction = _Reduction(compression, sparse_as_dense, op, gradient_predivide_factor, process_set,
                                     scale_local_gradients)
    return tape


def PartialDistributedGradientTape(gradtape, device_dense="", device_sparse="", compression=Compression.none,
                                   sparse_as_dense=False, op=Average, gradient_predivide_factor=1.0, num_groups=0,
                                   groups=None, process_set=global_process_set, local_layers=None,
                                   scale_local_gradients=True):
    """DistributedGradientTape whose local_layers' (a Keras layer or a list of them) trainable
    variables are worker-local (register_local_source)."""
    if local_layers is None:
        local_layers = []
    elif isinstance(local_layers, tf.keras.layers.Layer):
        local_layers = [local_layers]
    elif not all(isinstance(layer, tf.keras.layers.Layer) for layer in local_layers):
        raise ValueError("All local layers must be of tf.keras.layers.Layer type.")
    tape = DistributedGradientTape(gradtape, device_dense, device_sparse, compression, sparse_as_dense, op,
                                   gradient_predivide_factor, num_groups, groups, process_set,
                                   scale_local_gradients)
    for layer in local_layers:
        for v in layer.trainable_weights:
            tape.register_local_source(v)
    return tape


class _DistributedOptimizer(tf.compat.v1.train.Optimizer):
    """A TensorFlow 1 optimizer (tf.compat.v1.train.Optimizer, for graphs and sessions) whose
    compute_gradients returns the wrapped optimizer's gradients reduced across the ranks of
    process_set, as horovod.tensorflow's: minimize() and apply_gradients() apply them."""

    def __init__(self, optimizer, name, use_locking, compression, sparse_as_dense, op, gradient_predivide_factor,
                 process_set, scale_local_gradients):
        if name is None:
            name = "Distributed{}".format(type(optimizer).__name__)
        super(_DistributedOptimizer, self).__init__(name=name, use_locking=use_locking)
        self._optimizer = optimizer
        self._hvd_reduction = _Reduction(compression, sparse_as_dense, op, gradient_predivide_factor, process_set,
                                         scale_local_gradients)
        self.process_set = process_set
        self.scale_local_gradients = scale_local_gradients

    def register_local_var(self, var):
        """Marks var worker-local: its gradient is not reduced (only divided by the set's size,
        with scale_local_gradients, as Horovod does)."""
        self._hvd_reduction.register_local(var)

    def compute_gradients(self, *args, **kwargs):
        """The wrapped optimizer's (gradient, variable) pairs, the gradients reduced across ranks."""
        pairs = list(self._optimizer.compute_gradients(*args, **kwargs))
        grads = self._hvd_reduction([g for g, _ in pairs], [v for _, v in pairs])
        return [(g, v) for g, (_, v) in zip(grads, pairs)]

    def apply_gradients(self, grads_and_vars, global_step=None, name=None):
        """The wrapped optimizer's apply_gradients."""
        return self._optimizer.apply_gradients(grads_and_vars, global_step=global_step, name=name)

    def get_slot(self, *args, **kwargs):
        return self._optimizer.get_slot(*args, **kwargs)

    def get_slot_names(self, *args, **kwargs):
        return self._optimizer.get_slot_names(*args, **kwargs)

    def variables(self, *args, **kwargs):
        return self._optimizer.variables(*args, **kwargs)


def DistributedOptimizer(optimizer, name=None, use_locking=False, device_dense="", device_sparse="",
                         compression=Compression.none, sparse_as_dense=False, backward_passes_per_step=1,
                         op=Average, gradient_predivide_factor=1.0, average_aggregated_gradients=False,
                         num_groups=0, groups=None, process_set=global_process_set, scale_local_gradients=True):
    """Wraps a Keras optimizer (Keras 3's keras.optimizers.Optimizer, or Keras 2's) so that the
    gradients it applies are first reduced across ranks (Average by default). With
    backward_passes_per_step N > 1 the gradients of N calls are summed locally, and only every
    Nth call reduces and applies them (divided by N with average_aggregated_gradients).

    A TensorFlow 1 optimizer (tf.compat.v1.train.Optimizer) is wrapped as Horovod wraps it: its
    compute_gradients reduces (not with Adasum, nor with backward_passes_per_step > 1 yet)."""
    if isinstance(optimizer, tf.compat.v1.train.Optimizer):
        _ops.scale_factors(op, gradient_predivide_factor)  # its ValueError, as Horovod's
        if op == Adasum:
            raise NotImplementedError("kolo.tensorflow's DistributedOptimizer does not run Adasum on a "
                                      "tf.compat.v1.train.Optimizer (Horovod's delta optimizer)")
        if backward_passes_per_step > 1:
            raise NotImplementedError("kolo.tensorflow's DistributedOptimizer does not aggregate "
                                      "backward_passes_per_step > 1 for a tf.compat.v1.train.Optimizer yet")
        return _DistributedOptimizer(optimizer, name, use_locking, compression, sparse_as_dense, op,
                                     gradient_predivide_factor, process_set, scale_local_gradients)
    from kolo.tensorflow.keras import _create_distributed_optimizer
    return _create_distributed_optimizer(
        optimizer, name=name, compression=compression, sparse_as_dense=sparse_as_dense,
        backward_passes_per_step=backward_passes_per_step, op=op,
        gradient_predivide_factor=gradient_predivide_factor,
        average_aggregated_gradients=average_aggregated_gradients, process_set=process_set,
        scale_local_gradients=scale_local_gradients)


from kolo.tensorflow import elastic  # noqa: E402,F401  (hvd.elastic.run, TensorFlowKerasState, ...)
