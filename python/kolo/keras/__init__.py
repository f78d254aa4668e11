"""horovod.keras on kolo, for standalone Keras 3 (``import keras``): ``import kolo.keras as hvd``
on the TensorFlow, JAX or PyTorch backend (KERAS_BACKEND), with the same lines on each::

    hvd.init()
    opt = hvd.DistributedOptimizer(keras.optimizers.SGD(0.01 * hvd.size()))
    model.compile(optimizer=opt, loss=...)
    model.fit(x, y, callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0)])

On TensorFlow the optimizer and the ops are kolo.tensorflow.keras's (kolo.keras._tensorflow); on
JAX they are kolo.keras._jax's, which never imports TensorFlow; on torch kolo.keras._torch's (the
ops kolo.torch's), which imports neither TensorFlow nor JAX. The callbacks and load_model's
handling are the same on all three (kolo._keras), and so is the distributed optimizer on JAX and
torch. hvd.elastic (KerasState, the elastic callbacks, run) is kolo.keras.elastic on every backend
(on TensorFlow with kolo.tensorflow's state, on JAX and torch with one state of Keras variables);
SyncBatchNormalization is kolo.tensorflow's on TensorFlow and kolo.keras.sync_batch_norm's on JAX
and torch. Other backends (numpy, openvino) raise ImportError: docs/keras.md says why.
"""

from importlib import import_module as _import_module

import keras as _keras_module

_backend = _keras_module.backend.backend()
if _backend == "tensorflow":
    from kolo.keras._tensorflow import *  # noqa: F401,F403
    from kolo.keras._tensorflow import (  # noqa: F401
        DistributedOptimizer, PartialDistributedOptimizer, broadcast_global_variables, load_model,
    )
elif _backend == "jax":
    from kolo.keras._jax import *  # noqa: F401,F403
    from kolo.keras._jax import (  # noqa: F401
        DistributedOptimizer, PartialDistributedOptimizer, broadcast_global_variables, load_model,
    )
elif _backend == "torch":
    from kolo.keras._torch import *  # noqa: F401,F403
    from kolo.keras._torch import (  # noqa: F401
        DistributedOptimizer, PartialDistributedOptimizer, broadcast_global_variables, load_model,
    )
else:
    raise ImportError("kolo.keras supports Keras 3 on the tensorflow, jax and torch backends; this Keras runs on %r "
                      "(KERAS_BACKEND). See docs/keras.md." % _backend)

# The submodules themselves: "from kolo.keras import callbacks" would return the attribute that
# the star import above brought (kolo.tensorflow.keras's, made on tf.keras).
callbacks = _import_module("kolo.keras.callbacks")
elastic = _import_module("kolo.keras.elastic")


def __getattr__(name):
    # SyncBatchNormalization, as kolo.tensorflow's: made on first use.
    if name == "SyncBatchNormalization":
        if _backend == "tensorflow":
            from kolo.tensorflow.sync_batch_norm import SyncBatchNormalization
        else:
            from kolo.keras.sync_batch_norm import SyncBatchNormalization
        return SyncBatchNormalization
    raise AttributeError("module %r has no attribute %r" % (__name__, name))
