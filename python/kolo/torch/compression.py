"""Gradient compression for allreduce, as horovod.torch.compression.

A compressor turns a gradient into what goes over the wire and back: ``compress(tensor)`` returns
``(tensor_to_send, ctx)`` and ``decompress(tensor_received, ctx)`` returns a tensor of the original
dtype. Halving the bytes of float32 gradients halves the data the engine moves; the reduction then
runs in half precision, so large sums can lose precision (fp16 overflows above 65504; bf16 keeps
float32's range with 8 bits of mantissa).
"""

import torch


class Compressor(object):
    """Interface for compressing and decompressing a tensor."""

    @staticmethod
    def compress(tensor):
        """Returns the tensor to send and the context decompress needs."""
        raise NotImplementedError

    @staticmethod
    def decompress(tensor, ctx):
        """Returns the tensor restored from what compress sent."""
        raise NotImplementedError


class NoneCompressor(Compressor):
    """Sends tensors as they are."""

    @staticmethod
    def compress(tensor):
        return tensor, None

    @staticmethod
    def decompress(tensor, ctx):
        return tensor


class _CastCompressor(Compressor):
    """Casts floating-point tensors to ``wire_dtype``; leaves other dtypes alone."""

    wire_dtype = None

    @classmethod
    def compress(cls, tensor):
        if tensor.dtype.is_floating_point and tensor.dtype != cls.wire_dtype:
            return tensor.to(cls.wire_dtype), tensor.dtype
        return tensor, tensor.dtype

    @staticmethod
    def decompress(tensor, ctx):
        if ctx is not None and tensor.dtype != ctx:
            return tensor.to(ctx)
        return tensor


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
