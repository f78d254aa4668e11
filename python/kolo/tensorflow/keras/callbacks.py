"""horovod.tensorflow.keras.callbacks on kolo, for TensorFlow's Keras (tf.keras); kolo.keras.callbacks
makes the same classes on standalone Keras 3 (make_callbacks).

Callbacks run eagerly, between the steps: each uses kolo.tensorflow's eager ops. Momentum
correction (Horovod's momentum_correction) is accepted and not done: Keras 3 optimizers keep
momentum as a Python number that a compiled step has captured already.
"""

import numpy as np
import tensorflow as tf


def _value(x):
    return float(np.asarray(x))


def _optimizer_variables(optimizer):
    v = optimizer.variables
    return list(v() if callable(v) else v)


def make_callbacks(keras):
    """The callback classes on keras (a module with keras.callbacks.Callback), as a dict."""
    import kolo.tensorflow as hvd

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
            hvd.broadcast_variables([v for v in self.model.variables if id(v) not in self._local_vars],
                                    root_rank=self.root_rank)
            if getattr(self.model, "optimizer", None) is not None:
                hvd.broadcast_variables(_optimizer_variables(self.model.optimizer), root_rank=self.root_rank)
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
                logs[metric] = float(hvd.allreduce(tf.constant(value, tf.float64), name="metric." + metric))

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
                return 1.0 / hvd.size() * (epoch * (hvd.size() - 1) / warmup_epochs + 1)
            super().__init__(initial_lr, multiplier, start_epoch=0, end_epoch=warmup_epochs, staircase=False,
                             momentum_correction=momentum_correction, steps_per_epoch=steps_per_epoch)
            self.verbose = verbose

        def on_epoch_end(self, epoch, logs=None):
            super().on_epoch_end(epoch, logs)
            if epoch == self.end_epoch - 1 and self.verbose > 0 and hvd.rank() == 0:
                print("\nEpoch %d: finished gradual learning rate warmup to %g."
                      % (epoch + 1, _value(self.model.optimizer.learning_rate)))

    return {c.__name__: c for c in (BroadcastGlobalVariablesCallback, MetricAverageCallback,
                                    LearningRateScheduleCallback, LearningRateWarmupCallback)}


_classes = make_callbacks(tf.keras)
BroadcastGlobalVariablesCallback = _classes["BroadcastGlobalVariablesCallback"]
MetricAverageCallback = _classes["MetricAverageCallback"]
LearningRateScheduleCallback = _classes["LearningRateScheduleCallback"]
LearningRateWarmupCallback = _classes["LearningRateWarmupCallback"]
