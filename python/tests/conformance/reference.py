"""Expected results, computed without kolo: every rank knows what every rank contributes (inputs
are functions of the rank), so a case compares kolo's result with arithmetic done here in float64,
the way Horovod defines it.
"""

import math

from conformance.device import torch

import kolo.torch as hvd

DTYPES = [torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.float16,
          torch.bfloat16, torch.float32, torch.float64]
FLOATS = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
INTS = tuple(d for d in DTYPES if d not in FLOATS)
SIGNED = (torch.int8, torch.int16, torch.int32, torch.int64)
OPS = [("Sum", hvd.Sum), ("Average", hvd.Average), ("Min", hvd.Min), ("Max", hvd.Max),
       ("Product", hvd.Product)]

# (rtol, atol) per float dtype: kolo sums halves in float32 and rounds once; the reference rounds
# the exact result once, so they may differ by an ulp or two of the result.
TOLERANCE = {torch.float16: (4e-3, 4e-3), torch.bfloat16: (2e-2, 2e-2),
             torch.float32: (1e-5, 1e-6), torch.float64: (1e-12, 1e-12)}


def short(dtype):
    return str(dtype).replace("torch.", "")


def contribution(r, dtype, shape=(3, 4)):
    """Rank r's input: small values that differ per rank, negative ones for signed types, a
    fraction for floats; the product of 3 ranks' values fits int8."""
    n = math.prod(shape)
    i = torch.arange(n, dtype=torch.float64)
    if dtype == torch.uint8:
        base = i % 3
    else:
        base = i % 5 - 2
    x = base * (r + 1)
    if dtype in FLOATS:
        x = x + 0.25 * ((i + r) % 2)
    return x.reshape(shape).to(dtype)


def contributions(n, dtype, shape=(3, 4)):
    return [contribution(r, dtype, shape) for r in range(n)]


def reduce_ref(op, xs, dtype, pre=1.0, post=1.0):
    """Horovod's reduction of the tensors xs in float64, rounded to dtype: prescale each input,
    reduce, divide an Average by the count, postscale. Integers are scaled in float64 and truncated
    toward zero at each step, and an integer Average truncates toward zero (Horovod divides)."""
    integer = dtype not in FLOATS
    xs = [x.double() for x in xs]
    if pre != 1.0:
        xs = [x * pre for x in xs]
        if integer:
            xs = [torch.trunc(x) for x in xs]
    s = torch.stack(xs)
    if op in (hvd.Sum, hvd.Average):
        out = s.sum(0)
    elif op == hvd.Min:
        out = s.min(0).values
    elif op == hvd.Max:
        out = s.max(0).values
    elif op == hvd.Product:
        out = s.prod(0)
    else:
        raise ValueError("reduce_ref: op %r" % (op,))
    if op == hvd.Average:
        out = torch.div(out, len(xs), rounding_mode="trunc") if integer else out / len(xs)
    if post != 1.0:
        out = out * post
        if integer:
            out = torch.trunc(out)
    return out.to(dtype)


def reduced(op, n, dtype, shape=(3, 4), pre=1.0, post=1.0):
    """What an allreduce of contribution(r, dtype, shape) over n ranks gives."""
    return reduce_ref(op, contributions(n, dtype, shape), dtype, pre, post)


def split_counts(dim0, n):
    """How reducescatter splits dim 0 over n ranks: the first dim0 % n ranks get one more row."""
    return [dim0 // n + (1 if s < dim0 % n else 0) for s in range(n)]


def share(full, r, n):
    """Rank r's rows of full, as reducescatter hands them out."""
    counts = split_counts(full.shape[0], n)
    start = sum(counts[:r])
    return full[start:start + counts[r]]


def difference(got, want, rtol=None, atol=None):
    """None if tensor got equals want (dtype, shape, values: exact for integers, within the
    dtype's tolerance for floats); else what differs."""
    if not torch.is_tensor(got):
        return "got %s, want a tensor" % type(got).__name__
    if got.dtype != want.dtype:
        return "dtype %s, want %s" % (short(got.dtype), short(want.dtype))
    if tuple(got.shape) != tuple(want.shape):
        return "shape %s, want %s" % (tuple(got.shape), tuple(want.shape))
    if got.is_sparse or want.is_sparse:
        got, want = got.to_dense(), want.to_dense()
    if got.dtype in FLOATS:
        rt, at = TOLERANCE[got.dtype]
        rt = rt if rtol is None else rtol
        at = at if atol is None else atol
        if torch.allclose(got.double(), want.double(), rtol=rt, atol=at, equal_nan=True):
            return None
        bad = ~torch.isclose(got.double(), want.double(), rtol=rt, atol=at, equal_nan=True)
    else:
        if torch.equal(got, want):
            return None
        bad = got != want
    idx = bad.nonzero()[:3].tolist()
    shown = ", ".join("at %s got %s want %s" % (tuple(i), got[tuple(i)].item(), want[tuple(i)].item())
                      for i in idx)
    return "%d of %d values differ (%s)" % (int(bad.sum()), got.numel(), shown)


# ----------------------------------------------------------------------------------------------
# Adasum

# A side whose squared norm is below this keeps coefficient 1 (as Horovod: sqrt(DBL_MIN)).
_TINY = math.sqrt(2.2250738585072014e-308)


def adasum_pair(a, b):
    """adasum(a, b) = (1 - a.b / (2|a|^2)) a + (1 - a.b / (2|b|^2)) b, in float64."""
    a, b = a.double(), b.double()
    dot = float((a * b).sum())
    na, nb = float((a * a).sum()), float((b * b).sum())
    ca = 1.0 - dot / (2 * na) if na >= _TINY else 1.0
    cb = 1.0 - dot / (2 * nb) if nb >= _TINY else 1.0
    return ca * a + cb * b


def adasum_tree(vs):
    """kolo's Adasum of the ranks' tensors vs (rank order): with p the largest power of two not
    above n, rank p+i is first folded into rank i, then pairs are combined level by level. n=2:
    adasum(v0, v1); n=3: adasum(adasum(v0, v2), v1); n=4: adasum(adasum(v0, v1), adasum(v2, v3))."""
    n = len(vs)
    p = 1
    while p * 2 <= n:
        p *= 2
    w = [v.double() for v in vs[:p]]
    for i in range(n - p):
        w[i] = adasum_pair(vs[i], vs[p + i])
    while len(w) > 1:
        w = [adasum_pair(w[k], w[k + 1]) for k in range(0, len(w), 2)]
    return w[0]
