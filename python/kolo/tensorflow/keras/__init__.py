"""horovod.tensorflow.keras on kolo: the distributed Keras optimizer, for TensorFlow's Keras
(Keras 3 as tf.keras, or tf-keras where TF_USE_LEGACY_KERAS=1 makes it tf.keras).

The optimizer is the user's optimizer class with the reduction put in front of its update, built
again from its config, as Horovod builds it. As in Horovod, compute_gradients (and
_compute_gradients, get_gradients, so minimize and tf-keras's model.fit) returns the gradients
reduced; apply_gradients (Keras 3's apply, so Keras 3's model.fit) reduces those it is given
that compute_gradients did not return, so that every gradient is reduced once either way. With
backward_passes_per_step N > 1 the reduction is Horovod's local aggregation
(kolo.tensorflow.gradient_aggregation): every pass is summed locally, every Nth reduced and
applied, and the passes between only count their iteration.
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


class _Settings(object):
    """DistributedOptimizer's arguments, kept on the class it makes (so that from_config, which
    builds a new instance, builds a distributed one)."""

    def __init__(self, compression, sparse_as_dense, op, gradient_predivide_factor, process_set,
                 scale_local_gradients, backward_passes_per_step, average_aggregated_gradients):
        self.reduction = (compression, sparse_as_dense, op, gradient_predivide_factor, process_set,
                          scale_local_gradients)
        self.sparse_as_dense = sparse_as_dense
        self.backward_passes_per_step = int(backward_passes_per_step)
        self.average_aggregated_gradients = average_aggregated_gradients


class _Reduced(object):
    """The gradients compute_gradients returned last, reduced already: apply_gradients does not
    reduce them again."""

    def __init__(self, grads):
        self.grads = grads

    def are(self, grads):
        return len(grads) == len(self.grads) and all(a is b for a, b in zip(grads, self.grads))


def _tape_gradients(loss, var_list, grad_loss=None, tape=None):
    """(gradient, variable) pairs of loss, as tf-keras's compute_gradients makes them: loss a
    tensor that tape recorded, or a function of no arguments; var_list a list or a function
    returning one. For Keras 3 optimizers, which have no compute_gradients."""
    import tensorflow as tf
    if not callable(loss) and tape is None:
        raise ValueError("`tape` is required when a `Tensor` loss is passed. Received: loss=%s, tape=%s."
                         % (loss, tape))
    if tape is None:
        tape = tf.GradientTape()
    if callable(loss):
        with tape:
            if not callable(var_list):
                # a Keras 3 variable is watched as the tf.Variable it holds
                tape.watch([v if isinstance(v, (tf.Variable, tf.Tensor)) else v.value for v in var_list])
            loss = loss()
            if callable(var_list):
                var_list = var_list()
    var_list = list(var_list)
    grads = tape.gradient(loss, var_list, output_gradients=grad_loss)
    return list(zip(grads, var_list))


class _DistributedOptimizer(object):
    """What a distributed optimizer's class adds to the wrapped one, for every Keras: the
    gradients reduced in compute_gradients (Horovod's _compute_gradients), worker-local
    variables (register_local_var), and the aggregation helper (_agg_helper, None unless
    backward_passes_per_step > 1)."""

    def __init__(self, *args, **kwargs):
        super(_DistributedOptimizer, self).__init__(*args, **kwargs)
        from kolo.tensorflow import _Reduction
        from kolo.tensorflow.gradient_aggregation import LocalGradientAggregationHelper
        s = self._hvd_settings
        self._hvd_reduction = _Reduction(*s.reduction)
        self._hvd_reduced = None
        self._agg_helper = None
        if s.backward_passes_per_step > 1:
            self._agg_helper = LocalGradientAggregationHelper(
                s.backward_passes_per_step, self._hvd_reduction, s.sparse_as_dense, s.average_aggregated_gradients)

    def register_local_var(self, var):
        """Registers var as worker-local: its gradient is not reduced across ranks (and is
        divided by the size, with scale_local_gradients)."""
        self._hvd_reduction.register_local(var)

    def compute_gradients(self, loss, var_list, tape=None):
        return self._compute_gradients(loss, var_list, None, tape)

    def _compute_gradients(self, loss, var_list, grad_loss=None, tape=None):
        """The (gradient, variable) pairs of loss, the gradients reduced across ranks (with
        aggregation: this rank's sums so far, reduced on a round's last pass)."""
        base = super(_DistributedOptimizer, self)
        if hasattr(base, "_compute_gradients"):  # tf-keras's legacy optimizers
            pairs = base._compute_gradients(loss, var_list, grad_loss, tape=tape)
        elif hasattr(base, "compute_gradients"):  # tf-keras's
            pairs = base.compute_gradients(loss, var_list, tape=tape)
        else:  # Keras 3's have none
            pairs = _tape_gradients(loss, var_list, grad_loss, tape)
        pairs = list(pairs)
        variables = [v for _, v in pairs]
        grads = self._allreduce([g for g, _ in pairs], variables)
        self._hvd_reduced = _Reduced(grads)
        return list(zip(grads, variables))

    def _allreduce(self, grads, variables):
        if self._agg_helper is not None:
            return self._agg_helper.compute_gradients(grads, variables)
        return self._hvd_reduction(grads, variables)

    def _reduce_unreduced(self, grads, variables):
        """grads as apply_gradients uses them: as they are if compute_gradients returned them,
        else reduced (and counted, with aggregation) now."""
        reduced, self._hvd_reduced = self._hvd_reduced, None
        if reduced is not None and reduced.are(grads):
            return grads
        return self._allreduce(grads, variables)


class _TFKerasDistributedOptimizer(_DistributedOptimizer):
    """tf-keras's optimizers (and its legacy ones): the update is apply_gradients."""

    def get_gradients(self, loss, params):
        """TensorFlow 1 graph Keras's gradients (legacy optimizers), reduced across ranks."""
        grads = list(super(_TFKerasDistributedOptimizer, self).get_gradients(loss, params))
        grads = self._allreduce(grads, list(params))
        self._hvd_reduced = _Reduced(grads)
        return grads

    def apply_gradients(self, grads_and_vars, *args, **kwargs):
        pairs = list(grads_and_vars)
        variables = [v for _, v in pairs]
        grads = self._reduce_unreduced([g for g, _ in pairs], variables)
        pairs = list(zip(grads, variables))
        base = super(_TFKerasDistributedOptimizer, self)
        if self._agg_helper is None:
            return base.apply_gradients(pairs, *args, **kwargs)
        return self._agg_helper.apply_gradients(lambda: base.apply_gradients(pairs, *args, **kwargs),
                                                lambda: self.iterations.assign_add(1))


class _Keras3DistributedOptimizer(_DistributedOptimizer):
    """Keras 3's optimizers: the update is apply (which apply_gradients calls)."""

    def apply(self, grads, trainable_variables=None):
        import tensorflow as tf
        grads = list(grads)
        base = super(_Keras3DistributedOptimizer, self)
        variables = list(trainable_variables) if trainable_variables is not None else None
        if variables is None and not self.built:
            return base.apply(grads, variables)  # which says why it cannot
        grads = self._reduce_unreduced(grads, variables if variables is not None else self._trainable_variables)
        if self._agg_helper is None:
            return base.apply(grads, variables)
        if variables is not None and not self.built:
            self.build(variables)  # outside the tf.cond below: Keras makes its variables there
            self.built = True

        def update():
            base.apply(grads, variables)
            return tf.constant(True)

        def count():
            self._iterations.assign_add(1)
            return tf.constant(False)
        return self._agg_helper.apply_gradients(update, count)


def _create_distributed_optimizer(optimizer, name=None, compression=Compression.none, sparse_as_dense=False,
                                  backward_passes_per_step=1, op=None, gradient_predivide_factor=1.0,
                                  average_aggregated_gradients=False, process_set=global_process_set,
                                  scale_local_gradients=True):
    from kolo.tensorflow.mpi_ops import Average
    op = Average if op is None else op
    mixin = _Keras3DistributedOptimizer if _is_keras3(optimizer) else _TFKerasDistributedOptimizer
    attrs = {"_hvd_settings": _Settings(compression, sparse_as_dense, op, gradient_predivide_factor, process_set,
                                        scale_local_gradients, backward_passes_per_step,
                                        average_aggregated_gradients)}
    # The wrapped class's name and module: a saved model records the optimizer as the plain one,
    # which any Keras loads (and load_model below wraps again), as with Horovod.
    attrs["__module__"] = optimizer.__class__.__module__
    cls = type(optimizer.__class__.__name__, (mixin, optimizer.__class__), attrs)
    config = optimizer.get_config()
    if name is not None:
        config["name"] = name
    return cls.from_config(config)


def DistributedOptimizer(optimizer, name=None, device_dense="", device_sparse="", compression=Compression.none,
                         sparse_as_dense=False, gradient_predivide_factor=1.0, op=None,
                         backward_passes_per_step=1, average_aggregated_gradients=False, num_groups=0,
                         groups=None, process_set=global_process_set, scale_local_gradients=True):
    """A copy of optimizer (built from its config) whose updates use the gradients reduced across
    ranks (Average by default). backward_passes_per_step N > 1 sums N passes' gradients locally
    and updates every Nth pass with the reduced sum (its mean with average_aggregated_gradients);
    iterations counts every pass, as in Horovod."""
    return _create_distributed_optimizer(
        optimizer, name, compression, sparse_as_dense, backward_passes_per_step, op, gradient_predivide_factor,
        average_aggregated_gradients, process_set, scale_local_gradients)


def PartialDistributedOptimizer(optimizer, name=None, device_dense="", device_sparse="",
                                compression=Compression.none, sparse_as_dense=False, gradient_predivide_factor=1.0,
                                op=Average, backward_passes_per_step=1, average_aggregated_gradients=False,
                                groups=None, process_set=global_process_set, local_layers=None,
                                scale_local_gradients=True):
    """DistributedOptimizer whose local_layers (a Keras layer or a list of them) keep their
    gradients worker-local: their trainable weights are registered with register_local_var."""
    if local_layers is None:
        local_layers = []
    elif hasattr(local_layers, "trainable_weights"):
        local_layers = [local_layers]
    local_layers = list(local_layers)
    if not all(hasattr(layer, "trainable_weights") for layer in local_layers):
        raise ValueError("All local layers must be of tf.keras.layers.Layer type.")
    opt = DistributedOptimizer(optimizer, name=name, compression=compression, sparse_as_dense=sparse_as_dense,
                               gradient_predivide_factor=gradient_predivide_factor, op=op,
                               backward_passes_per_step=backward_passes_per_step,
                               average_aggregated_gradients=average_aggregated_gradients, process_set=process_set,
                               scale_local_gradients=scale_local_gradients)
    for layer in local_layers:
        for var in layer.trainable_weights:
            opt.register_local_var(var)
    return opt


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


from kolo.tensorflow.keras import callbacks, elastic  # noqa: E402,F401
