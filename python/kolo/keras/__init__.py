"""horovod.keras on kolo, for standalone Keras 3 (``import keras``) on the TensorFlow backend:
``import kolo.keras as hvd``. The optimizer and the ops are kolo.tensorflow.keras's; the callbacks
and the elastic ones are made on ``keras.callbacks.Callback``."""

from kolo.tensorflow.keras import *  # noqa: F401,F403
from kolo.tensorflow.keras import (  # noqa: F401
    DistributedOptimizer, PartialDistributedOptimizer, broadcast_global_variables,
)
from kolo.keras import callbacks, elastic  # noqa: F401  (made on standalone Keras's classes)
from kolo.tensorflow.keras import Compression as _Compression
from kolo.tensorflow.keras import _load_model


def load_model(filepath, custom_optimizers=None, custom_objects=None, compression=_Compression.none):
    """keras.models.load_model with the model's optimizer made a DistributedOptimizer (its state
    carried over), as kolo.tensorflow.keras.load_model."""
    import keras
    return _load_model(keras, filepath, custom_optimizers, custom_objects, compression)
