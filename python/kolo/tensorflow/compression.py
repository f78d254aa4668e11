"""Gradient compression for allreduce, as horovod.tensorflow.compression (kolo._compression says
what it costs in precision)."""

import tensorflow as tf

from kolo._compression import CastCompressor, Compressor, NoneCompressor  # noqa: F401


class _CastCompressor(CastCompressor):
    floating = staticmethod(lambda t: t.dtype.is_floating)
    cast = staticmethod(lambda t, dtype: tf.cast(t, dtype))


class FP16Compressor(_CastCompressor):
    """Sends floating-point tensors as IEEE float16."""

    wire_dtype = tf.float16


class BF16Compressor(_CastCompressor):
    """Sends floating-point tensors as bfloat16."""

    wire_dtype = tf.bfloat16


class Compression(object):
    """The compressors by name: ``Compression.none``, ``Compression.fp16``, ``Compression.bf16``."""

    none = NoneCompressor
    fp16 = FP16Compressor
    bf16 = BF16Compressor
