"""Gradient compression for allreduce, framework-free: Horovod's compressor classes, which
kolo.torch.compression and kolo.tensorflow.compression give their framework's casts and dtypes.

A compressor turns a gradient into what goes over the wire and back: ``compress(tensor)`` returns
``(tensor_to_send, ctx)`` and ``decompress(tensor_received, ctx)`` returns a tensor of the original
dtype. Halving the bytes of float32 gradients halves the data the engine moves; the reduction then
runs in half precision, so large sums can lose precision (fp16 overflows above 65504; bf16 keeps
float32's range with 8 bits of mantissa).
"""


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


class CastCompressor(Compressor):
    """Casts floating-point tensors to ``wire_dtype``; leaves other dtypes alone. A framework's
    subclass says what floating point is and how to cast (``floating``, ``cast``)."""

    wire_dtype = None

    @staticmethod
    def floating(tensor):
        raise NotImplementedError

    @staticmethod
    def cast(tensor, dtype):
        raise NotImplementedError

    @classmethod
    def compress(cls, tensor):
        if cls.floating(tensor) and tensor.dtype != cls.wire_dtype:
            return cls.cast(tensor, cls.wire_dtype), tensor.dtype
        return tensor, tensor.dtype

    @classmethod
    def decompress(cls, tensor, ctx):
        if ctx is not None and tensor.dtype != ctx:
            return cls.cast(tensor, ctx)
        return tensor

