"""op=hvd.Adasum: allreduce (all forms) and grouped_allreduce against a reference computed here
in float64 (reference.adasum_tree: at 2 ranks adasum(v0, v1), at 3 adasum(adasum(v0, v2), v1));
Adasum of integers and Adasum reducescatter are errors."""

import time

from conformance.device import torch

import kolo.torch as hvd
from conformance import reference as ref
from conformance.case import case

# Halves are combined in float32 with float32 coefficients and rounded back; float32 in float64.
TOL = {torch.float16: (2e-3, 2e-3), torch.bfloat16: (1e-2, 1e-2), torch.float32: (1e-5, 1e-5),
       torch.float64: (1e-10, 1e-12)}


def _vector(q, dtype, shape, kind):
    """Rank q's input of a kind: random (seeded by rank), the same on every rank, orthogonal
    across ranks, or zero on rank 1."""
    numel = max(1, torch.Size(shape).numel())
    if kind == "random":
        g = torch.Generator().manual_seed(17 * q + numel)
        x = torch.randn(numel, generator=g, dtype=torch.float64)
    elif kind == "same":
        x = torch.linspace(-1.0, 2.0, numel, dtype=torch.float64)
    elif kind == "orthogonal":
        x = torch.zeros(numel, dtype=torch.float64)
        x[q % numel::3] = q + 1.0
    else:  # zero on rank 1
        x = torch.linspace(0.5, 1.5, numel, dtype=torch.float64) * (q + 1)
        if q == 1:
            x = torch.zeros_like(x)
    return x.reshape(shape).to(dtype)


def _want(n, dtype, shape, kind, scale=1.0):
    """The reference: every rank's input (as rounded to dtype), combined in float64."""
    vs = [_vector(q, dtype, shape, kind).double().flatten() for q in range(n)]
    return (ref.adasum_tree(vs) * scale).reshape(shape).to(dtype)


def _check(ctx, got, want, dtype, what):
    rt, at = TOL[dtype]
    scale = max(1.0, float(want.double().abs().max())) if want.numel() else 1.0
    ctx.equal(got, want, what, rtol=rt, atol=at * scale)


@case()
def allreduce_matches_reference(ctx):
    """Every floating dtype, several shapes (a 0-d tensor among them) and kinds of inputs
    (random, identical: adasum(a, a) = a, orthogonal: their sum, a zero vector on one rank:
    coefficient 1 for the other side)."""
    r, n = ctx.rank, ctx.size
    for dtype in ref.FLOATS:
        for shape in ((17,), (3, 5), (2, 3, 4), ()):
            for kind in ("random", "same", "orthogonal", "zero"):
                what = "%s %s %s" % (ref.short(dtype), shape, kind)
                x = _vector(r, dtype, shape, kind)
                before = x.clone()
                got = hvd.allreduce(x, op=hvd.Adasum, name="adasum " + what)
                _check(ctx, got, _want(n, dtype, shape, kind), dtype, "Adasum " + what)
                ctx.check(torch.equal(x, before), "Adasum %s modified its input" % what)
    same = hvd.allreduce(_vector(r, torch.float64, (17,), "same"), op=hvd.Adasum)
    ctx.equal(same, _vector(r, torch.float64, (17,), "same"), "adasum of identical inputs is the input")


@case()
def in_place_async_and_empty(ctx):
    """allreduce_, allreduce_async and allreduce_async_ with op=Adasum; a tensor of no elements."""
    r, n = ctx.rank, ctx.size
    for dtype in (torch.float32, torch.float64, torch.float16):
        want = _want(n, dtype, (4, 4), "random")
        y = _vector(r, dtype, (4, 4), "random")
        out = hvd.allreduce_(y, op=hvd.Adasum, name="adasum_ " + ref.short(dtype))
        ctx.check(out is y, "allreduce_ returned another tensor")
        _check(ctx, y, want, dtype, "allreduce_ Adasum %s" % ref.short(dtype))
        got = hvd.synchronize(hvd.allreduce_async(_vector(r, dtype, (4, 4), "random"), op=hvd.Adasum))
        _check(ctx, got, want, dtype, "allreduce_async Adasum %s" % ref.short(dtype))
        y = _vector(r, dtype, (4, 4), "random")
        h = hvd.allreduce_async_(y, op=hvd.Adasum, name="adasum async_ " + ref.short(dtype))
        deadline = time.monotonic() + 5
        while not hvd.poll(h) and time.monotonic() < deadline:
            time.sleep(0.0002)
        hvd.synchronize(h)
        _check(ctx, y, want, dtype, "allreduce_async_ Adasum %s" % ref.short(dtype))
    got = hvd.allreduce(torch.zeros(0), op=hvd.Adasum)
    ctx.check(got.shape == (0,), "Adasum of an empty tensor: shape %s" % (tuple(got.shape),))


@case()
def scale_factors(ctx):
    """prescale_factor and postscale_factor multiply the inputs and the result (Adasum is
    scale-invariant, so both scale the result)."""
    r, n = ctx.rank, ctx.size
    for dtype in (torch.float32, torch.float64):
        got = hvd.allreduce(_vector(r, dtype, (9,), "random"), op=hvd.Adasum, prescale_factor=0.5, postscale_factor=3.0)
        _check(ctx, got, _want(n, dtype, (9,), "random", scale=1.5), dtype,
               "Adasum pre 0.5 post 3 %s" % ref.short(dtype))


@case()
def grouped_allreduce_per_tensor(ctx):
    """grouped_allreduce with op=Adasum combines each tensor on its own (not the concatenation)."""
    r, n = ctx.rank, ctx.size
    shapes = [(5,), (2, 3), (7,)]
    kinds = ["random", "orthogonal", "zero"]
    for dtype in ref.FLOATS:
        xs = [_vector(r, dtype, s, k) for s, k in zip(shapes, kinds)]
        got = hvd.grouped_allreduce(xs, op=hvd.Adasum, name="grouped adasum " + ref.short(dtype))
        for i, (g, s, k) in enumerate(zip(got, shapes, kinds)):
            _check(ctx, g, _want(n, dtype, s, k), dtype, "grouped Adasum %s member %d" % (ref.short(dtype), i))
        ys = [_vector(r, dtype, s, k) for s, k in zip(shapes, kinds)]
        hvd.grouped_allreduce_(ys, op=hvd.Adasum)
        for i, (y, s, k) in enumerate(zip(ys, shapes, kinds)):
            _check(ctx, y, _want(n, dtype, s, k), dtype,
                   "grouped_allreduce_ Adasum %s member %d" % (ref.short(dtype), i))
    # The test tells per tensor from the concatenation: the two differ for these inputs.
    cat = ref.adasum_tree([torch.cat([_vector(q, torch.float64, s, k).flatten() for s, k in zip(shapes, kinds)])
                           for q in range(n)])
    per = torch.cat([_want(n, torch.float64, s, k).flatten() for s, k in zip(shapes, kinds)])
    ctx.check(not torch.allclose(cat, per), "test inputs do not tell per-tensor Adasum from the concatenation's")


@case()
def autograd(ctx):
    """The gradient of an Adasum allreduce is the Adasum allreduce of the output's gradient."""
    r, n = ctx.rank, ctx.size
    x = _vector(r, torch.float64, (6,), "random").requires_grad_()
    y = hvd.allreduce(x, op=hvd.Adasum, name="adasum grad")
    w = [_vector(q, torch.float64, (6,), "orthogonal") + 0.25 for q in range(n)]
    (y * w[r]).sum().backward()
    ctx.equal(x.grad, ref.adasum_tree(w), "Adasum allreduce gradient", rtol=1e-10, atol=1e-12)


@case()
def integers_are_refused(ctx):
    """op=Adasum on an integer tensor fails with HorovodInternalError on every rank, within a
    second, naming Adasum; the next op works. (kolo fails it in negotiation.)"""
    for dtype in ref.INTS:
        for name in ("adasum int " + ref.short(dtype), None):
            ctx.raises(hvd.HorovodInternalError,
                       lambda: hvd.allreduce(torch.ones(3, dtype=dtype), op=hvd.Adasum, name=name),
                       "Adasum of %s (%s)" % (ref.short(dtype), "named" if name else "unnamed"),
                       contains=("Adasum", ref.short(dtype)), within=1.0, stop=True)
            ctx.next_op_works("Adasum of %s" % ref.short(dtype))
    ctx.raises(hvd.HorovodInternalError,
               lambda: hvd.grouped_allreduce([torch.ones(2), torch.ones(2, dtype=torch.int32)], op=hvd.Adasum),
               "grouped Adasum with an integer member", contains=("Adasum",), within=1.0, stop=True)
    ctx.next_op_works("grouped Adasum with an integer member")


@case()
def reducescatter_is_refused(ctx):
    """reducescatter and grouped_reducescatter with op=Adasum fail with HorovodInternalError on
    every rank, within a second, naming the op; the next op works."""
    n = ctx.size
    for name in ("adasum rs", None):
        ctx.raises(hvd.HorovodInternalError, lambda: hvd.reducescatter(torch.ones(2 * n), op=hvd.Adasum, name=name),
                   "reducescatter with Adasum", contains=("reducescatter", "Adasum"), within=1.0, stop=True)
        ctx.next_op_works("reducescatter with Adasum")
    ctx.raises(hvd.HorovodInternalError, lambda: hvd.grouped_reducescatter([torch.ones(n)], op=hvd.Adasum),
               "grouped_reducescatter with Adasum", contains=("reducescatter", "Adasum"), within=1.0, stop=True)
    ctx.next_op_works("grouped_reducescatter with Adasum")
