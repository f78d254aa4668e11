"""SyncBatchNormalization, as horovod.tensorflow's: batch normalization whose training-time
statistics are those of the whole global batch (every rank's), not of this rank's part.

Each rank sums its values, their squares and its count over the reduced axes; one grouped
allreduce (Sum) adds them up, and mean and variance follow. The allreduce's gradient (an allreduce
of the gradient) carries the gradient across ranks, as Horovod's does. Keras 3 computes the
statistics in _moments, tf-keras in _calculate_mean_and_var: both are overridden.
"""

import inspect

import tensorflow as tf

from kolo.tensorflow.mpi_ops import Sum, grouped_allreduce


def _global_moments(x, axes, keepdims):
    """Mean and variance of x over axes and over every rank's x."""
    dtype = x.dtype
    xf = tf.cast(x, tf.float32) if dtype in (tf.float16, tf.bfloat16) else x
    shape = tf.shape(xf)
    count = tf.cast(tf.reduce_prod(tf.gather(shape, list(axes))), xf.dtype)
    s, sq, n = grouped_allreduce([tf.reduce_sum(xf, axes, keepdims=keepdims),
                                  tf.reduce_sum(tf.square(xf), axes, keepdims=keepdims),
                                  tf.reshape(count, [1])], op=Sum)
    n = tf.reshape(n, [])
    mean = s / n
    variance = tf.maximum(sq / n - tf.square(mean), 0.0)
    return tf.cast(mean, dtype), tf.cast(variance, dtype)


class SyncBatchNormalization(tf.keras.layers.BatchNormalization):
    """Batch normalization over the global batch (every rank's), as Horovod's."""

    def __init__(self, *args, **kwargs):
        # tf-keras's fused kernel computes the statistics itself, past _moments: never fused.
        if "fused" in inspect.signature(tf.keras.layers.BatchNormalization.__init__).parameters:
            if kwargs.get("fused"):
                raise ValueError("SyncBatchNormalization does not support fused=True")
            kwargs["fused"] = False
        super(SyncBatchNormalization, self).__init__(*args, **kwargs)

    def _moments(self, inputs, *args, **kwargs):
        # Keras 3: _moments(inputs, mask); tf-keras: _moments(inputs, reduction_axes, keep_dims,
        # mask=None).
        if len(args) >= 2 or "keep_dims" in kwargs:
            axes = args[0] if args else kwargs["reduction_axes"]
            keep_dims = args[1] if len(args) > 1 else kwargs["keep_dims"]
            mask = args[2] if len(args) > 2 else kwargs.get("mask")
        else:
            axes, keep_dims = self._reduction_axes, False
            mask = args[0] if args else kwargs.get("mask")
        if mask is not None:
            raise NotImplementedError("SyncBatchNormalization does not support masks")
        return _global_moments(inputs, axes, keepdims=keep_dims)
