"""SyncBatchNormalization for Keras 3 on JAX and torch, as horovod.tensorflow's (and
kolo.tensorflow's, which serves the TensorFlow backend): batch normalization whose training-time
statistics are those of the whole global batch (every rank's), not of this rank's part.

Each rank sums its values and their squares over the reduced axes and counts them; one allreduce
(Sum) of the three, packed into one vector, adds them up across ranks, and the mean and the
(biased, as Keras's) variance follow: mean = sum / count, variance = sum of squares / count -
mean², as kolo.tensorflow's and Keras's own synchronized moments compute them. Ranks may hold
batches of different sizes. The allreduce is the binding's differentiable one, whose gradient is
the same allreduce of the output's gradient (as Horovod's): on torch kolo.torch's autograd
Function, on JAX kolo.keras._jax's custom_vjp, which inside Keras's compiled train step runs, with
its gradient, as an ordered callback in the step (kolo.keras._jax says how). So each rank's input
gradient is that of the global batch's loss, and the gradients of gamma and beta are this rank's
share, which the DistributedOptimizer averages like any other gradient.

Only _moments is overridden: the moving statistics, the normalization and Keras's float32
upcast are BatchNormalization's own. Masks are not supported (as kolo.tensorflow's).
"""

from importlib import import_module

import keras
from keras import ops

_binding = import_module("kolo.keras._" + keras.backend.backend())


def _symbolic(x):
    """Whether x carries no values: Keras infers shapes on torch with tensors on the meta device."""
    device = getattr(x, "device", None)
    return getattr(device, "type", None) == "meta"


class SyncBatchNormalization(keras.layers.BatchNormalization):
    """Batch normalization over the global batch (every rank's), as Horovod's. The arguments are
    keras.layers.BatchNormalization's; fused (Horovod's and tf-keras's) is accepted when false.
    Every rank must call the layer in training the same number of times, in the same order: its
    statistics are a collective, named after the layer."""

    def __init__(self, *args, **kwargs):
        if kwargs.pop("fused", False):
            raise ValueError("SyncBatchNormalization does not support fused=True")
        super(SyncBatchNormalization, self).__init__(*args, **kwargs)

    def _moments(self, inputs, mask):
        if mask is not None:
            raise NotImplementedError("SyncBatchNormalization does not support masks")
        axes = list(self._reduction_axes)
        if _symbolic(inputs) or any(inputs.shape[a] is None for a in axes):
            return ops.moments(inputs, axes=axes)  # shape inference: nothing to reduce
        count = 1
        for a in axes:
            count *= int(inputs.shape[a])
        s = ops.sum(inputs, axis=axes)
        sq = ops.sum(ops.square(inputs), axis=axes)
        c = int(s.shape[0])
        packed = ops.concatenate([s, sq, ops.full([1], float(count), dtype=s.dtype)])
        total = _binding.allreduce(packed, op=_binding.Sum, name="%s.moments" % self.name)
        n = total[2 * c]
        mean = total[:c] / n
        variance = ops.maximum(total[c:2 * c] / n - ops.square(mean), 0.0)
        return mean, variance
