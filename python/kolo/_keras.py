"""What kolo's Keras bindings share, whatever runs under Keras: the distributed optimizer built from
the user's (its settings, the class made from the user's), PartialDistributedOptimizer's local
layers, load_model, broadcast of variables, and the callbacks (horovod's names).

A binding supplies what depends on the framework, the reduction of a step's gradients (and the
aggregation of backward_passes_per_step), as a mixin class put in front of the user's optimizer
class: kolo.tensorflow.keras's for TensorFlow. On Keras 3's JAX and torch backends the mixin is
Keras3DistributedOptimizer below (local variables, backward_passes_per_step on Keras's gradient
accumulation, the reduction's arguments), and the binding (kolo.keras._jax, kolo.keras._torch)
adds only how the gradients cross to the engine (_hvd_allreduce_grads); keras3_api makes the
DistributedOptimizer, PartialDistributedOptimizer and load_model of such a binding. Everything
else here works on numpy arrays through kolo._ops, so it serves tf.keras and tf-keras
(kolo.tensorflow.keras) and Keras 3 on every backend kolo.keras serves alike: the callbacks, and
the elastic ones (make_elastic_callbacks). It imports no framework and no Keras: callers pass
their keras module.

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


class _Sources(object):
    """The worker-local variables of a distributed optimizer and the variables of the gradients
    its current step reduces. A plain object: Keras's optimizer tracks the variables in a list or
    a dict set as its attribute as its own."""

    def __init__(self):
        self.local = {}  # id(variable) -> variable, kept so that its id stays its own
        self.step = None


class Keras3DistributedOptimizer(object):
    """What a distributed optimizer's class adds to a Keras 3 optimizer on the JAX and torch
    backends: its step's gradients reduced across ranks before Keras clips and applies them (in
    _clip_gradients, which Keras runs on the gradients just before the update, after its gradient
    accumulation); worker-local variables (register_local_var), whose gradients stay this rank's
    (divided by the set's size with scale_local_gradients); backward_passes_per_step.

    A binding's subclass defines _hvd_allreduce_grads(grads, name, op, prescale, postscale,
    process_set): the gradients (compressed) reduced as one grouped op named name, on the steps
    that update (Keras on JAX runs _clip_gradients on every step of an accumulation inside the
    compiled step, and keeps the old state on those that do not; on torch it runs it on the
    updating steps only).

    backward_passes_per_step N > 1 runs on Keras 3's gradient accumulation (the optimizer's
    gradient_accumulation_steps, whose sums are optimizer variables): Keras averages the N passes'
    gradients, _hvd_scale makes that Horovod's sum again (the mean with
    average_aggregated_gradients), and iterations counts every pass, as Horovod's and
    kolo.tensorflow's do (Keras's own counts updates)."""

    def __init__(self, *args, **kwargs):
        super(Keras3DistributedOptimizer, self).__init__(*args, **kwargs)
        s = self._hvd_settings
        n = s.backward_passes_per_step
        self._hvd_scale = 1 if n <= 1 or s.average_aggregated_gradients else n
        self._hvd_sources = _Sources()

    @property
    def iterations(self):
        if self._hvd_settings.backward_passes_per_step > 1:
            return self._iterations
        return super(Keras3DistributedOptimizer, self).iterations

    def register_local_var(self, var):
        """Registers var as worker-local: its gradient is not reduced across ranks (and is
        divided by the size, with scale_local_gradients)."""
        self._hvd_sources.local[id(var)] = var

    def _backend_apply_gradients(self, grads, trainable_variables):
        # The variables of the gradients _clip_gradients gets (Keras filtered out those without).
        self._hvd_sources.step = list(trainable_variables)
        try:
            return super(Keras3DistributedOptimizer, self)._backend_apply_gradients(grads, trainable_variables)
        finally:
            self._hvd_sources.step = None

    def _clip_gradients(self, grads):
        compression, _, op, predivide, process_set, scale_local = self._hvd_settings.reduction
        prescale, postscale = _ops.scale_factors(op, predivide)
        grads = list(grads)
        variables = self._hvd_sources.step or [None] * len(grads)
        local = {i for i, v in enumerate(variables) if v is not None and id(v) in self._hvd_sources.local}
        if self._hvd_scale != 1:
            grads = [g * self._hvd_scale if g is not None else g for g in grads]
        shared = [i for i, g in enumerate(grads) if g is not None and i not in local]
        # As Horovod's: a rank outside the set, or a set of one, keeps its gradients.
        if shared and process_set.included() and process_set.size() > 1:
            sent, ctxs = [], []
            for i in shared:
                x, c = compression.compress(grads[i])
                sent.append(x)
                ctxs.append(c)
            reduced = self._hvd_allreduce_grads(sent, "%s.grads" % self.name, op, prescale, postscale, process_set)
            for i, r, c in zip(shared, reduced, ctxs):
                grads[i] = compression.decompress(r, c)
        if scale_local:
            n = float(process_set.size())
            for i in local:
                if grads[i] is not None:
                    grads[i] = grads[i] / n
        return super(Keras3DistributedOptimizer, self)._clip_gradients(grads)


def keras3_api(mixin, compression_none, framework):
    """DistributedOptimizer, PartialDistributedOptimizer and load_model (a dict by name), with
    Horovod's signatures, of a Keras 3 binding whose mixin is a Keras3DistributedOptimizer
    (framework names the backend in errors)."""
    from kolo._ops import Average

    def DistributedOptimizer(optimizer, name=None, device_dense="", device_sparse="", compression=compression_none,
                             sparse_as_dense=False, gradient_predivide_factor=1.0, op=None,
                             backward_passes_per_step=1, average_aggregated_gradients=False, num_groups=0,
                             groups=None, process_set=global_process_set, scale_local_gradients=True):
        """A copy of optimizer (a Keras 3 optimizer, built from its config) whose updates use the
        gradients reduced across ranks (Average by default) as one grouped op per step.
        backward_passes_per_step N > 1 sums N passes' gradients locally and updates every Nth
        pass with the reduced sum (its mean with average_aggregated_gradients), reducing only on
        those passes; iterations counts every pass, as in Horovod. Gradients are dense:
        sparse_as_dense changes nothing; num_groups and groups are accepted (every gradient goes
        in one group)."""
        op = Average if op is None else _ops.check_reduce_op(op)
        _ops.scale_factors(op, gradient_predivide_factor)  # its ValueError, now
        if not is_keras3(optimizer):
            raise ValueError("kolo.keras on %s wraps Keras 3 optimizers (keras.optimizers.*); got %r"
                             % (framework, type(optimizer).__name__))
        settings = Settings(compression or compression_none, sparse_as_dense, op, gradient_predivide_factor,
                            process_set, scale_local_gradients, backward_passes_per_step,
                            average_aggregated_gradients)
        config = optimizer.get_config()
        if settings.backward_passes_per_step > 1:
            config["gradient_accumulation_steps"] = settings.backward_passes_per_step
        return distributed_optimizer(optimizer, mixin, settings, name, config)

    def PartialDistributedOptimizer(optimizer, name=None, device_dense="", device_sparse="",
                                    compression=compression_none, sparse_as_dense=False,
                                    gradient_predivide_factor=1.0, op=Average, backward_passes_per_step=1,
                                    average_aggregated_gradients=False, groups=None,
                                    process_set=global_process_set, local_layers=None, scale_local_gradients=True):
        """DistributedOptimizer whose local_layers (a Keras layer or a list of them) keep their
        gradients worker-local: their trainable weights are registered with register_local_var."""
        local_vars = local_layer_variables(local_layers)
        opt = DistributedOptimizer(optimizer, name=name, compression=compression, sparse_as_dense=sparse_as_dense,
                                   gradient_predivide_factor=gradient_predivide_factor, op=op,
                                   backward_passes_per_step=backward_passes_per_step,
                                   average_aggregated_gradients=average_aggregated_gradients,
                                   process_set=process_set, scale_local_gradients=scale_local_gradients)
        for var in local_vars:
            opt.register_local_var(var)
        return opt

    def load_model_(filepath, custom_optimizers=None, custom_objects=None, compression=compression_none):
        """keras.models.load_model with the model's optimizer made a DistributedOptimizer, its
        state (iterations, slots) carried over. An optimizer saved with backward_passes_per_step
        N > 1 has Keras's gradient accumulation in its config and its sums among its variables: it
        is loaded with backward_passes_per_step N again."""
        import keras

        from kolo.keras.sync_batch_norm import SyncBatchNormalization

        def distribute(opt):
            return DistributedOptimizer(opt, compression=compression,
                                        backward_passes_per_step=opt.gradient_accumulation_steps or 1)
        objects = dict(custom_objects or {})
        objects.setdefault("SyncBatchNormalization", SyncBatchNormalization)  # kolo's own layer
        return load_model(keras, filepath, custom_optimizers, objects, distribute)
    load_model_.__name__ = "load_model"

    api = {"DistributedOptimizer": DistributedOptimizer, "PartialDistributedOptimizer": PartialDistributedOptimizer,
           "load_model": load_model_}
    for fn in api.values():
        fn.__module__ = mixin.__module__  # where help() and tracebacks' readers look for them
    return api


def broadcast_global_variables(root_rank):
    """Horovod's TensorFlow 1 broadcast of the session's variables: Keras 3 keeps no list of
    global variables; hvd.callbacks.BroadcastGlobalVariablesCallback or broadcast_variables does
    the job."""
    raise RuntimeError("hvd.broadcast_global_variables() needs TensorFlow 1's global variables, which Keras 3 "
                       "does not have; use hvd.callbacks.BroadcastGlobalVariablesCallback(root_rank) with fit, or "
                       "hvd.broadcast_variables(model.variables, root_rank)")


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


def make_elastic_callbacks(keras):
    """Horovod's elastic Keras callback classes on keras (a module with keras.callbacks.Callback),
    as a dict by name: they keep an elastic state's batch and epoch current during model.fit and
    commit it. They only count and call state.commit(); the state knows how to read the model
    (kolo.keras.elastic.KerasState syncs Keras's JAX state into the variables first)."""

    class CommitStateCallback(keras.callbacks.Callback):
        """Commits state every batches_per_commit batches (at the batch's end) and at the end of
        every epoch."""

        def __init__(self, state, batches_per_commit=1):
            super(CommitStateCallback, self).__init__()
            self.state = state
            self.batches_per_commit = batches_per_commit
            self.batches_remaining = batches_per_commit

        def on_train_begin(self, logs=None):
            # Every rank counts from here after a reset, so that they commit at the same batches.
            self.batches_remaining = self.batches_per_commit

        def on_batch_end(self, batch, logs=None):
            self.batches_remaining -= 1
            if self.batches_remaining == 0:
                self.state.commit()
                self.batches_remaining = self.batches_per_commit

        def on_epoch_end(self, epoch, logs=None):
            self.state.commit()

    class UpdateBatchStateCallback(keras.callbacks.Callback):
        """Keeps state.batch at the number of the batch last finished in this epoch (0 at an
        epoch's end). With steps_per_epoch, the first epoch after a reset runs only the batches
        the state had not done."""

        def __init__(self, state):
            super(UpdateBatchStateCallback, self).__init__()
            self.state = state
            self.steps_per_epoch = None

        def on_train_begin(self, logs=None):
            self.steps_per_epoch = None

        def on_epoch_begin(self, epoch, logs=None):
            if self.params.get("steps"):
                if self.steps_per_epoch is None:
                    self.steps_per_epoch = self.params.get("steps")
                self.params["steps"] = self.steps_per_epoch - self.state.batch

        def on_batch_end(self, batch, logs=None):
            self.state.batch = batch

        def on_epoch_end(self, epoch, logs=None):
            self.state.batch = 0

    class UpdateEpochStateCallback(keras.callbacks.Callback):
        """Keeps state.epoch at the number of epochs finished, counted across resets: the epochs
        of each fit (numbered from 0, as fit numbers them without initial_epoch) after those the
        state had when it began. Fit the remaining ones: epochs=total - state.epoch."""

        def __init__(self, state):
            super(UpdateEpochStateCallback, self).__init__()
            self.state = state
            self.initial_epoch = self.state.epoch

        def on_train_begin(self, logs=None):
            self.initial_epoch = self.state.epoch

        def on_epoch_end(self, epoch, logs=None):
            # + 1: the epoch is done, and a reset after state.batch went back to 0 must not run it again
            self.state.epoch = self.initial_epoch + epoch + 1

    return {c.__name__: c for c in (CommitStateCallback, UpdateBatchStateCallback, UpdateEpochStateCallback)}
