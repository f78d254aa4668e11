"""horovod.keras.elastic on kolo: kolo.tensorflow.keras.elastic's KerasState and callbacks, the
callbacks made on standalone Keras 3's Callback."""

import keras

from kolo.tensorflow.elastic import TensorFlowKerasState, run  # noqa: F401
from kolo.tensorflow.keras.elastic import make_callbacks


class KerasState(TensorFlowKerasState):
    """State of a Keras model, its optimizer (the model's compiled one if not given) and any other
    values (keyword arguments, kept as attributes)."""

    def __init__(self, model, optimizer=None, **kwargs):
        super(KerasState, self).__init__(model, optimizer=optimizer, backend=keras.backend, **kwargs)


_classes = make_callbacks(keras)
CommitStateCallback = _classes["CommitStateCallback"]
UpdateBatchStateCallback = _classes["UpdateBatchStateCallback"]
UpdateEpochStateCallback = _classes["UpdateEpochStateCallback"]

__all__ = ["KerasState", "CommitStateCallback", "UpdateBatchStateCallback", "UpdateEpochStateCallback", "run"]
