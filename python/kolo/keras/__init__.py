"""horovod.keras on kolo, for standalone Keras 3 (``import keras``) on the TensorFlow backend:
``import kolo.keras as hvd``. The optimizer and the ops are kolo.tensorflow.keras's; the callbacks
are made on ``keras.callbacks.Callback``."""

from kolo.tensorflow.keras import *  # noqa: F401,F403
from kolo.tensorflow.keras import DistributedOptimizer, broadcast_global_variables  # noqa: F401
from kolo.keras import callbacks  # noqa: F401
