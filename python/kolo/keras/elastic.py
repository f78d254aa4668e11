"""horovod.keras.elastic on kolo: KerasState, the elastic callbacks (CommitStateCallback,
UpdateBatchStateCallback, UpdateEpochStateCallback) and run, for standalone Keras.

On the TensorFlow backend the state is kolo.tensorflow.elastic's TensorFlowKerasState (as for
tf.keras). On JAX and torch it is KerasState below, one class for both: it works on Keras variables
only (a commit copies each one's value to host memory as numpy, a restore assigns them back, a sync
broadcasts rank 0's with kolo._keras.broadcast_variables), so it needs nothing of the backend but
two things it asks the model and the binding for:

* Keras on JAX keeps the model's state outside its variables while fit runs; the state is put
  back into the variables (the model's jax_state_sync, which Keras's own callbacks use) before a
  commit reads them or a restore or sync writes them, and the next step reads them again.
* A collective that fails inside JAX's compiled step reaches fit's caller as a JaxRuntimeError;
  run takes the typed HorovodInternalError back from the binding (kolo.keras._jax's
  _take_step_error), as kolo.tensorflow.elastic.run does from a tf.errors.OpError. On torch the
  error is typed already.

The callbacks are kolo._keras's (make_elastic_callbacks), the same on every backend; how a reset
works is kolo.elastic's (run_fn).
"""

from importlib import import_module

import keras
import numpy as np

from kolo import _keras
from kolo._keras import make_elastic_callbacks
from kolo._lib import HorovodInternalError, HostsUpdatedInterrupt, KoloInternalError  # noqa: F401
from kolo._objects import broadcast_object
from kolo.elastic import ObjectState, run_fn

_backend = keras.backend.backend()

if _backend == "tensorflow":
    from kolo.tensorflow.elastic import TensorFlowKerasState, run  # noqa: F401

    class KerasState(TensorFlowKerasState):
        """State of a Keras model, its optimizer (the model's compiled one if not given) and any
        other values (keyword arguments, kept as attributes)."""

        def __init__(self, model, optimizer=None, **kwargs):
            super(KerasState, self).__init__(model, optimizer=optimizer, backend=keras.backend, **kwargs)

elif _backend in ("jax", "torch"):
    _binding = import_module("kolo.keras._" + _backend)

    def run(func):
        """Decorator for an elastic training function func(state, ...), as kolo.torch.elastic.run:
        the state is synced before func runs; a failed collective restores its last commit, a
        change of workers (HostsUpdatedInterrupt, raised by state.commit()) keeps it; then this
        worker leaves its world, joins the next, and calls func again. A collective that failed
        inside JAX's compiled step (a JaxRuntimeError to the caller) counts as failed when a kolo
        op raised it."""
        # On torch a failed collective raises its own HorovodInternalError: nothing to take back.
        return run_fn(func, _binding.shutdown, _binding.init, getattr(_binding, "_take_step_error", None))

    class KerasState(ObjectState):
        """State of a Keras model, its optimizer (the model's compiled one if not given) and any
        other values (keyword arguments, kept as attributes: batch and epoch for the callbacks).

        The model must be built (it has its variables); an optimizer not built yet is built for
        the model's trainable variables here, so that every rank, a newcomer too, has the same
        variables to sync. save copies every variable of the model (model.variables: weights and
        seed generators) and of the optimizer (its iterations and slots, and with
        backward_passes_per_step > 1 the gradients summed so far) to numpy; restore assigns them
        back; sync broadcasts rank 0's. reset (after the world changed) makes fit compile its
        train step again: on JAX the step captured the world's size when it was traced."""

        def __init__(self, model, optimizer=None, **kwargs):
            if not model.built:
                raise ValueError("KerasState: the model must be built first (model.build(input_shape), or call "
                                 "it once)")
            self.model = model
            self.optimizer = optimizer if optimizer is not None else getattr(model, "optimizer", None)
            if self.optimizer is not None and not getattr(self.optimizer, "built", True):
                self.optimizer.build(model.trainable_variables)
            self._values = None
            super(KerasState, self).__init__(bcast_object=broadcast_object, get_rank=_binding.rank, **kwargs)
            self._save_variables()

        def _variables(self):
            return list(self.model.variables) + _keras.optimizer_variables(self.optimizer)

        def _attach(self):
            # JAX: the values of fit's last step, put back into the variables (a no-op outside fit).
            sync = getattr(self.model, "jax_state_sync", None)
            if sync is not None:
                sync()

        def _save_variables(self):
            self._attach()
            self._values = [np.array(np.asarray(v), copy=True) for v in self._variables()]

        def save(self):
            self._save_variables()
            super(KerasState, self).save()

        def restore(self):
            self._attach()
            variables = self._variables()
            if len(variables) != len(self._values):
                raise ValueError("KerasState.restore: the model and optimizer have %d variables, the commit %d"
                                 % (len(variables), len(self._values)))
            for v, a in zip(variables, self._values):
                v.assign(a)
            super(KerasState, self).restore()

        def sync(self):
            self._attach()
            _keras.broadcast_variables(self._variables(), root_rank=0)
            self._save_variables()
            super(KerasState, self).sync()

        def reset(self):
            self.model.train_function = None  # fit makes it again
            super(KerasState, self).reset()

else:
    raise ImportError("kolo.keras.elastic supports Keras 3 on the tensorflow, jax and torch backends; this Keras "
                      "runs on %r (KERAS_BACKEND). See docs/keras.md." % _backend)


_classes = make_elastic_callbacks(keras)
CommitStateCallback = _classes["CommitStateCallback"]
UpdateBatchStateCallback = _classes["UpdateBatchStateCallback"]
UpdateEpochStateCallback = _classes["UpdateEpochStateCallback"]

__all__ = ["KerasState", "CommitStateCallback", "UpdateBatchStateCallback", "UpdateEpochStateCallback", "run"]
