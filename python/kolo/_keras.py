"""What kolo's Keras bindings share, whatever runs under Keras: the distributed optimizer built from
the user's (its settings, the class made from the user's), PartialDistributedOptimizer's local
layers, load_model, broadcast of variables, and the callbacks (horovod's names).

A binding supplies what depends on the framework, the reduction of a step's gradients (and the
aggregation of backward_passes_per_step), as a mixin class put in front of the user's optimizer
class: kolo.tensorflow.keras's for TensorFlow, kolo.keras._jax's for JAX. Everything else here works
on numpy arrays through kolo._ops, so it serves tf.keras and tf-keras (kolo.tensorflow.keras) and
Keras 3 on the TensorFlow and JAX backends (kolo.keras) alike. It imports no framework and no
Keras: callers pass their keras module.

Keras 3 on JAX keeps a model's state outside its variables while fit runs; a callback's
self.model (Keras 3's Callback.model) puts that state back into the variables first and makes the
next step read them, so the callbacks read and assign variables alike on every backend.
"""

import numpy as np

from kolo import _lib, _ops
from kolo._objects import process_set_id
from kolo.process_sets import global_process_set

_K3_METHOD = "_backend_apply_gradients"  # present on Keras 3 optimizers only


def is_keras3(optimizer):
    return hasattr(optimizer, _K3_METHOD) and hasattr(optimizer, "gradient_accumulation_steps")


class Settings(object):
    """DistributedOptimizer's arguments, kept on the class it makes (so that from_config, which
    builds a new instance, builds a distributed one). reduction is what a binding's reduction
    takes: (compression, sparse_as_dense, op, gradient_predivide_factor, process_set,
    scale_local_gradients)."""

    def __init__(self, compression, sparse_as_dense, op, gradient_predivide_factor, process_set,
                 scale_local_gradients, backward_passes_per_step, average_aggregated_gradients):
        self.reduction = (compression, sparse_as_dense, op, gradient_predivide_factor, process_set,
                          scale_local_gradients)
        self.sparse_as_dense = sparse_as_dense
        self.backward_passes_per_step = int(backward_passes_per_step)
        self.average_aggregated_gradients = average_aggregated_gradients


def distributed_optimizer(optimizer, mixin, settings, name=None, config=None):
    """A copy of optimizer, built from its config (or config), whose class is (mixin, optimizer's
    class) with settings as _hvd_settings, as Horovod builds it: the binding's mixin reduces."""
    attrs = {"_hvd_settings": settings}
    # The wrapped class's name and module: a saved model records the optimizer as the plain one,
    # which any Keras loads (and load_model wraps again), as with Horovod.
    attrs["__module__"] = optimizer.__class__.__module__
    cls = type(optimizer.__class__.__name__, (mixin, optimizer.__class__), attrs)
    config = dict(optimizer.get_config() if config is None else config)
    if name is not None:
        config["name"] = name
    return cls.from_config(config)


def local_layer_variables(local_layers):
    """The trainable weights of PartialDistributedOptimizer's local_layers (a Keras layer or a
    list of them), in order."""
    if local_layers is None:
        local_layers = []
    elif hasattr(local_layers, "trainable_weights"):
        local_layers = [local_layers]
    local_layers = list(local_layers)
    if not all(hasattr(layer, "trainable_weights") for layer in local_layers):
        raise ValueError("All local layers must be of tf.keras.layers.Layer type.")
    return [v for layer in local_layers for v in layer.trainable_weights]


def optimizer_variables(optimizer):
    if optimizer is None:
        return []
    v = optimizer.variables
    return list(v() if callable(v) else v)


def load_model(keras, filepath, custom_optimizers, custom_objects, distribute):
    """keras.models.load_model, then the model's optimizer replaced by distribute(optimizer), its
    state (iterations, slots) carried over. custom_optimizers are optimizer classes of the
    script's own, as in Horovod."""
    objects = dict(custom_objects or {})
    for c in custom_optimizers or []:
        objects.setdefault(c.__name__, c)
    model = keras.models.load_model(filepath, custom_objects=objects)
    opt = getattr(model, "optimizer", None)
    if opt is None:
        return model
    dist = distribute(opt)
    old_vars = optimizer_variables(opt)
    if old_vars:
        if hasattr(dist, "build"):  # Keras 3's optimizers and Keras 2's (tf-keras, TensorFlow < 2.16)
            dist.build(model.trainable_variables)
        elif hasattr(dist, "_create_all_weights"):
            # Keras 2's legacy optimizers (OptimizerV2), which TensorFlow 2.12's load_model gives
            # back for a .keras file: iterations, then the slots, as the loaded one has them.
            dist._create_all_weights(model.trainable_variables)
        new_vars = optimizer_variables(dist)
        if len(new_vars) != len(old_vars):
            raise ValueError("load_model: the distributed optimizer has %d variables, the loaded one %d"
                             % (len(new_vars), len(old_vars)))
        for a, b in zip(new_vars, old_vars):
            a.assign(b)
    model.optimizer = dist
    return model


def broadcast_variables(variables, root_rank, process_set=global_process_set):
    """Assigns root_rank's values to variables (Keras or tf.Variables: anything np.asarray reads
    and .assign writes) on every rank: the broadcasts are submitted together (the engine fuses
    them), matched across ranks by their order, and assigned once all completed."""
    variables = list(variables)
    if not variables:
        return
    psid = process_set_id(process_set)
    arrays = [np.asarray(v) for v in variables]
    sent = [a.view(np.uint8) if a.dtype == np.bool_ else a for a in arrays]
    outs = _ops.run_many(np, _ops.BROADCAST, sent, [None] * len(sent), root=root_rank, psid=psid)
    for v, a, o in zip(variables, arrays, outs):
        v.assign(o.view(a.dtype))


def _value(x):
    return float(np.asarray(x))


def make_callbacks(keras):
    """Horovod's Keras callback classes on keras (a module with keras.callbacks.Callback), as a
    dict by name. They run between the steps, with kolo's ops on numpy arrays. Momentum
    correction (Horovod's momentum_correction) is accepted and not done: Keras 3 optimizers keep
    momentum as a Python number that a compiled step has captured already."""

    class BroadcastGlobalVariablesCallback(keras.callbacks.Callback):
        """Broadcasts the model's and its optimizer's variables from root_rank at the end of the
        first batch (after the optimizer made its variables), so that every rank trains from the
        same state. local_variables (or register_local_var) stay as each rank has them."""

        def __init__(self, root_rank, device="", local_variables=None):
            super().__init__()
            self.root_rank = root_rank
            self.broadcast_done = False
            self._local_vars = set()
            for v in local_variables or ():
                self.register_local_var(v)

        def register_local_var(self, var):
            """A variable that stays worker-local (not broadcast)."""
            self._local_vars.add(id(var))

        def on_batch_end(self, batch, logs=None):
            if self.broadcast_done:
                return
            variables = [v for v in self.model.variables if id(v) not in self._local_vars]
            if getattr(self.model, "optimizer", None) is not None:
                variables += optimizer_variables(self.model.optimizer)
            broadcast_variables(variables, self.root_rank)
            self.broadcast_done = True

    class MetricAverageCallback(keras.callbacks.Callback):
        """Replaces each epoch's metrics in logs by their average across ranks (metrics matched by
        name, in sorted order on every rank). Put it before callbacks that read the metrics."""

        def __init__(self, device=""):
            super().__init__()

        def on_epoch_end(self, epoch, logs=None):
            if not logs:
                return
            for metric in sorted(logs):
                try:
                    value = _value(logs[metric])
                except (TypeError, ValueError):
                    continue
                logs[metric] = float(_ops.run(np, _ops.ALLREDUCE, np.array(value, np.float64), "metric." + metric,
                                              op=_ops.Average))

    class LearningRateScheduleCallback(keras.callbacks.Callback):
        """Sets the learning rate to initial_lr * multiplier(epoch) from start_epoch until
        end_epoch (multiplier a function of the epoch, or a number raised to the epochs since
        start_epoch); per epoch with staircase, else per batch with fractional epochs."""

        def __init__(self, initial_lr, multiplier, start_epoch=0, end_epoch=None, staircase=True,
                     momentum_correction=True, steps_per_epoch=None):
            super().__init__()
            if initial_lr is None:
                raise ValueError("Parameter `initial_lr` is required")
            self.initial_lr = initial_lr
            self.start_epoch, self.end_epoch, self.staircase = start_epoch, end_epoch, staircase
            self.steps_per_epoch = steps_per_epoch
            self.current_epoch = None
            self.multiplier = multiplier if callable(multiplier) else (
                lambda epoch: multiplier ** (epoch - start_epoch))

        def _autodetect_steps_per_epoch(self):
            if self.params.get("steps"):
                return self.params["steps"]
            if self.params.get("samples") and self.params.get("batch_size"):
                return self.params["samples"] // self.params["batch_size"]
            raise ValueError("Could not autodetect the number of steps per epoch. Please specify the "
                             "steps_per_epoch parameter to the %s()" % self.__class__.__name__)

        def _adjust_learning_rate(self, epoch):
            self.model.optimizer.learning_rate = self.initial_lr * self.multiplier(epoch)

        def on_train_begin(self, logs=None):
            if not self.staircase and not self.steps_per_epoch:
                self.steps_per_epoch = self._autodetect_steps_per_epoch()

        def on_epoch_begin(self, epoch, logs=None):
            self.current_epoch = epoch

        def on_batch_begin(self, batch, logs=None):
            if self.current_epoch < self.start_epoch or (
                    self.end_epoch is not None and self.current_epoch >= self.end_epoch):
                return
            if self.staircase and batch == 0:
                self._adjust_learning_rate(self.current_epoch)
            elif not self.staircase:
                self._adjust_learning_rate(self.current_epoch + float(batch) / self.steps_per_epoch)

        def on_epoch_end(self, epoch, logs=None):
            if logs is not None:
                logs["lr"] = _value(self.model.optimizer.learning_rate)

    class LearningRateWarmupCallback(LearningRateScheduleCallback):
        """Goyal et al.'s warmup, as Horovod's: the learning rate rises from initial_lr / size to
        initial_lr over warmup_epochs, per batch."""

        def __init__(self, initial_lr, warmup_epochs=5, momentum_correction=True, steps_per_epoch=None,
                     verbose=0):
            def multiplier(epoch):
                epoch += 1.0 / self.steps_per_epoch
                n = _lib.topology()[1]
                return 1.0 / n * (epoch * (n - 1) / warmup_epochs + 1)
            super().__init__(initial_lr, multiplier, start_epoch=0, end_epoch=warmup_epochs, staircase=False,
                             momentum_correction=momentum_correction, steps_per_epoch=steps_per_epoch)
            self.verbose = verbose

        def on_epoch_end(self, epoch, logs=None):
            super().on_epoch_end(epoch, logs)
            if epoch == self.end_epoch - 1 and self.verbose > 0 and _lib.topology()[0] == 0:
                print("\nEpoch %d: finished gradual learning rate warmup to %g."
                      % (epoch + 1, _value(self.model.optimizer.learning_rate)))

    return {c.__name__: c for c in (BroadcastGlobalVariablesCallback, MetricAverageCallback,
                                    LearningRateScheduleCallback, LearningRateWarmupCallback)}
