"""Elastic training for kolo.tensorflow, as horovod.tensorflow.elastic: hvd.elastic.run,
TensorFlowKerasState, TensorFlowState and ObjectState (kolo.elastic says how a reset works;
docs/elastic.md how to launch). As Horovod's, a commit copies the variables' values to host
memory, a restore assigns them back, and a sync broadcasts rank 0's state.
"""


import numpy as np
import tensorflow as tf

from kolo._lib import HorovodInternalError, HostsUpdatedInterrupt, KoloInternalError  # noqa: F401
from kolo.elastic import ObjectState as _ObjectState
from kolo.elastic import State, run_fn  # noqa: F401
from kolo.tensorflow.functions import broadcast_object, broadcast_variables
from kolo.tensorflow.mpi_ops import init, rank, shutdown, take_graph_error


def run(func):
    """Decorator for an elastic training function func(state, ...), as kolo.torch.elastic.run:
    the state is synced before func runs; a failed collective restores its last commit, a change
    of workers (HostsUpdatedInterrupt, raised by state.commit()) keeps it; then this worker leaves
    its world, joins the next, and calls func again. A collective that failed inside tf.function
    (a tf.errors.OpError to the caller) counts as failed when a kolo op raised it."""
    return run_fn(func, shutdown, init, take_graph_error)


class ObjectState(_ObjectState):
    """State of plain Python values, given as keyword arguments (kolo.elastic.ObjectState)."""

    def __init__(self, **kwargs):
        super(ObjectState, self).__init__(bcast_object=broadcast_object, get_rank=rank, **kwargs)


def _optimizer_variables(optimizer):
    if optimizer is None:
        return []
    v = optimizer.variables
    return list(v() if callable(v) else v)


class TensorFlowState(ObjectState):
    """State of a list of TensorFlow variables and any other values (keyword arguments)."""

    def __init__(self, variables=None, session=None, **kwargs):
        if session is not None:
            raise ValueError("kolo.tensorflow.elastic supports TensorFlow 2's eager variables, not sessions")
        self._vars_list = list(variables or [])
        self._values = None
        super(TensorFlowState, self).__init__(**kwargs)
        self._save_variables()

    def _variables(self):
        return self._vars_list

    def _save_variables(self):
        self._values = [np.asarray(v.numpy()) for v in self._variables()]  # numpy(): a copy

    def save(self):
        self._save_variables()
        super(TensorFlowState, self).save()

    def restore(self):
        # Positionally: a Keras optimizer that made its variables since the save (at its first
        # step) has them after the model's, and they keep their values.
        for v, a in zip(self._variables(), self._values):
            v.assign(a)
        super(TensorFlowState, self).restore()

    def sync(self):
        broadcast_variables(self._variables(), root_rank=0)
        self._save_variables()
        super(TensorFlowState, self).sync()


class TensorFlowKerasState(TensorFlowState):
    """State of a Keras model, its optimizer and any other values (keyword arguments): the
    model's variables and the optimizer's, saved, restored and synced together; a restore or a
    sync also starts a new aggregation round of a DistributedOptimizer with
    backward_passes_per_step > 1. backend is accepted for Horovod's signature."""

    def __init__(self, model, optimizer=None, backend=None, **kwargs):
        self.model = model
        self.optimizer = optimizer if optimizer is not None else getattr(model, "optimizer", None)
        super(TensorFlowKerasState, self).__init__(**kwargs)

    def _variables(self):
        # The optimizer makes its variables at its first step: read them anew each time.
        return list(self.model.variables) + _optimizer_variables(self.optimizer)

    def restore(self):
        super(TensorFlowKerasState, self).restore()
        self._reset_aggregation()

    def sync(self):
        super(TensorFlowKerasState, self).sync()
        self._reset_aggregation()

    def _reset_aggregation(self):
        # A DistributedOptimizer with backward_passes_per_step > 1 sums passes outside its
        # variables: a restored state drops the sums of the passes it undid, and after a sync
        # every rank (one new to the job too) starts a round at the same pass.
        helper = getattr(self.optimizer, "_agg_helper", None)
        if helper is not None:
            helper.reset()
