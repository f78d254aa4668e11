"""kolo.keras on Keras 3's TensorFlow backend: kolo.tensorflow.keras's optimizer and ops (tf
tensors, tf.function), with load_model on standalone Keras."""

from kolo.tensorflow.keras import *  # noqa: F401,F403
from kolo.tensorflow.keras import (  # noqa: F401
    DistributedOptimizer, PartialDistributedOptimizer, broadcast_global_variables,
)
from kolo.tensorflow import broadcast_variables  # noqa: F401
from kolo.tensorflow.keras import Compression as _Compression
from kolo.tensorflow.keras import _load_model


def load_model(filepath, custom_optimizers=None, custom_objects=None, compression=_Compression.none):
    """keras.models.load_model with the model's optimizer made a DistributedOptimizer (its state
    carried over), as kolo.tensorflow.keras.load_model."""
    import keras
    return _load_model(keras, filepath, custom_optimizers, custom_objects, compression)
