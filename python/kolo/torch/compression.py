"""Gradient compression for allreduce, as horovod.torch.compression (kolo._compression says what
it costs in precision)."""

import torch

from kolo._compression import CastCompressor, Compressor, NoneCompressor  # noqa: F401


class _CastCompressor(CastCompressor):
    floating = staticmethod(lambda t: t.dtype.is_floating_point)
    cast = staticmethod(lambda t, dtype: t.to(dtype))


class FP16Compressor(_CastCompressor):
    """Sends floating-point tensors as IEEE float16."""

    wire_dtype = torch.float16


class BF16Compressor(_CastCompressor):
    """Sends floating-point tensors as bfloat16."""

    wire_dtype = torch.bfloat16


class Compression(object):
    """The compressors by name: ``Compression.none``, ``Compression.fp16``, ``Compression.bf16``."""

    none = NoneCompressor
    fp16 = FP16Compressor
    bf16 = BF16Compressor
