"""The device the suite's tensors live on, and `torch` as the case modules use it.

    KOLO_TEST_DEVICE=cuda   # every case's tensors and models on the GPU (default: cpu)

The case modules import torch from here (`from conformance.device import torch`): the same module,
except that its tensor factories (ones, zeros, full, tensor, arange, ...) put what they make on
DEVICE unless the call names a device. Random factories draw on the host, from the seed or
generator the case gives, and move the result, so that every rank (and a reference replayed on
one rank) sees the same values on either device. Models are moved with `on_device(module)`.
kolo itself is untouched: only the tests' own tensors change device.
"""

import functools
import os
import types

import torch as _torch

DEVICE = os.environ.get("KOLO_TEST_DEVICE", "cpu").strip() or "cpu"

# Factories whose device the suite chooses when the call does not.
_MADE_THERE = ("ones", "zeros", "full", "empty", "tensor", "arange", "linspace", "eye")
# Factories that draw random numbers: drawn on the host, then moved.
_DRAWN_HERE = ("randn", "rand", "randint", "randperm")


def _made_there(fn):
    @functools.wraps(fn)
    def make(*args, **kwargs):
        if kwargs.get("device") is None:
            kwargs["device"] = DEVICE
        return fn(*args, **kwargs)
    return make


def _drawn_here(fn):
    @functools.wraps(fn)
    def draw(*args, **kwargs):
        if kwargs.get("device") is not None:
            return fn(*args, **kwargs)
        return fn(*args, **kwargs).to(DEVICE)
    return draw


def _suite_torch():
    if DEVICE == "cpu":
        return _torch
    _torch.device(DEVICE)  # a malformed KOLO_TEST_DEVICE fails here, at import, with torch's message
    m = types.ModuleType("torch", doc="torch, with the factories making tensors on %s" % DEVICE)
    m.__dict__.update(_torch.__dict__)
    for name in _MADE_THERE:
        setattr(m, name, _made_there(getattr(_torch, name)))
    for name in _DRAWN_HERE:
        setattr(m, name, _drawn_here(getattr(_torch, name)))
    return m


torch = _suite_torch()


def on_device(module):
    """module (a torch.nn.Module), moved to DEVICE; returns it."""
    return module.to(DEVICE)
