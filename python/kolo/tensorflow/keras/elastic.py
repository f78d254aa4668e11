"""horovod.tensorflow.keras.elastic on kolo: KerasState, the elastic state of a Keras model and
its optimizer, and the callbacks that keep it current during model.fit (CommitStateCallback,
UpdateBatchStateCallback, UpdateEpochStateCallback), for TensorFlow's Keras (tf.keras). The
callbacks are kolo._keras's (make_elastic_callbacks), which kolo.keras.elastic makes on standalone
Keras on every backend.

The state is kolo.tensorflow.elastic's TensorFlowKerasState (a commit copies the model's and the
optimizer's variables to host memory, a restore assigns them back, a sync broadcasts rank 0's);
hvd.elastic.run around the training function resets the job as kolo.elastic says.
"""

import tensorflow as tf

from kolo._keras import make_elastic_callbacks
from kolo.tensorflow.elastic import TensorFlowKerasState, run  # noqa: F401


class KerasState(TensorFlowKerasState):
    """State of a Keras model, its optimizer (the model's compiled one if not given) and any other
    values (keyword arguments, kept as attributes: batch and epoch for the callbacks)."""

    def __init__(self, model, optimizer=None, **kwargs):
        super(KerasState, self).__init__(model, optimizer=optimizer, backend=tf.keras.backend, **kwargs)


_classes = make_elastic_callbacks(tf.keras)
CommitStateCallback = _classes["CommitStateCallback"]
UpdateBatchStateCallback = _classes["UpdateBatchStateCallback"]
UpdateEpochStateCallback = _classes["UpdateEpochStateCallback"]

__all__ = ["KerasState", "CommitStateCallback", "UpdateBatchStateCallback", "UpdateEpochStateCallback", "run"]
