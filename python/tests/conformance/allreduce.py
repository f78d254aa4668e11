"""allreduce, allreduce_, allreduce_async, allreduce_async_: every dtype, every op, scale
factors, scalars, empty and non-contiguous tensors, autograd."""

import time
import warnings

from conformance.device import torch

import kolo.torch as hvd
from conformance import reference as ref
from conformance.case import case


@case()
def every_op_every_dtype(ctx):
    """The four forms on every dtype with every op; out of place leaves the input untouched, in
    place returns the caller's tensor; async forms complete through poll/synchronize."""
    r, n = ctx.rank, ctx.size
    for dtype in ref.DTYPES:
        for opname, op in ref.OPS:
            what = "%s %s" % (opname, ref.short(dtype))
            want = ref.reduced(op, n, dtype)
            x = ref.contribution(r, dtype)
            before = x.clone()
            ctx.equal(hvd.allreduce(x, op=op, name="oop " + what), want, "allreduce " + what)
            ctx.check(torch.equal(x, before), "allreduce %s modified its input" % what)
            y = ref.contribution(r, dtype)
            ptr = y.data_ptr()
            out = hvd.allreduce_(y, op=op, name="inplace " + what)
            ctx.check(out is y and y.data_ptr() == ptr, "allreduce_ %s did not return its tensor" % what)
            ctx.equal(y, want, "allreduce_ " + what)
            h = hvd.allreduce_async(x, op=op)
            ctx.equal(hvd.synchronize(h), want, "allreduce_async (unnamed) " + what)
            ctx.check(torch.equal(x, before), "allreduce_async %s modified its input" % what)
            y = ref.contribution(r, dtype)
            h = hvd.allreduce_async_(y, op=op, name="async_ " + what)
            deadline = time.monotonic() + 5
            while not hvd.poll(h) and time.monotonic() < deadline:
                time.sleep(0.0002)
            out = hvd.synchronize(h)
            ctx.check(out is y, "allreduce_async_ %s: synchronize did not return the tensor" % what)
            ctx.equal(y, want, "allreduce_async_ " + what)


@case()
def shapes_1d_to_3d(ctx):
    """Sum of 1-, 2- and 3-dimensional tensors of 17 per dimension, every dtype."""
    r, n = ctx.rank, ctx.size
    for dtype in ref.DTYPES:
        for dims in (1, 2, 3):
            shape = (17,) * dims
            got = hvd.allreduce(ref.contribution(r, dtype, shape), op=hvd.Sum)
            ctx.equal(got, ref.reduced(hvd.Sum, n, dtype, shape), "Sum %s %s" % (ref.short(dtype), shape))


@case()
def integer_average_truncates_toward_zero(ctx):
    """Average of integers divides the sum by the rank count, truncating toward zero as Horovod's
    division does (not flooring)."""
    r, n = ctx.rank, ctx.size
    pattern = torch.tensor([-1, 1, -3, 5, 7, -7, 2, 0], dtype=torch.int64)
    nudge = torch.tensor([0, 1, 2, -1, 0, 1, -2, 1], dtype=torch.int64)  # added on rank 0 only
    for dtype in ref.INTS:
        if dtype == torch.uint8:
            xs = [pattern.abs() * (s + 1) + (nudge.abs() if s == 0 else 0) for s in range(n)]
        else:
            xs = [pattern * (s + 1) + (nudge if s == 0 else 0) for s in range(n)]
        xs = [x.to(dtype) for x in xs]
        total = torch.stack([x.long() for x in xs]).sum(0)
        want = torch.div(total, n, rounding_mode="trunc").to(dtype)
        if dtype != torch.uint8:  # the inputs must tell truncation from flooring
            ctx.check(not torch.equal(want.long(), torch.div(total, n, rounding_mode="floor")),
                      "test inputs do not tell truncation from flooring")
        ctx.equal(hvd.allreduce(xs[r], op=hvd.Average, name="avg " + ref.short(dtype)), want,
                  "Average %s" % ref.short(dtype))
        ctx.equal(hvd.allreduce(xs[r], average=True), want, "average=True %s" % ref.short(dtype))


@case()
def prescale_postscale(ctx):
    """prescale_factor multiplies each input before the reduction, postscale_factor the result
    (integers: in float64, truncated toward zero, as Horovod)."""
    r, n = ctx.rank, ctx.size
    for dtype in ref.DTYPES:
        if dtype in ref.FLOATS:
            combos = [(hvd.Sum, 3.0, 0.5), (hvd.Average, 0.5, 4.0), (hvd.Sum, 1.0, 0.25), (hvd.Average, 2.0, 1.0)]
        else:
            combos = [(hvd.Sum, 2.0, 3.0), (hvd.Sum, 0.37, 1.0), (hvd.Sum, 1.0, 0.5), (hvd.Sum, 0.37, 0.5)]
        for op, pre, post in combos:
            what = "%s %s pre %s post %s" % (ref.short(dtype), "Sum" if op == hvd.Sum else "Average", pre, post)
            want = ref.reduced(op, n, dtype, pre=pre, post=post)
            x = ref.contribution(r, dtype)
            ctx.equal(hvd.allreduce(x, op=op, prescale_factor=pre, postscale_factor=post, name=what),
                      want, what)
            y = ref.contribution(r, dtype)
            hvd.allreduce_(y, op=op, prescale_factor=pre, postscale_factor=post)
            ctx.equal(y, want, "allreduce_ " + what)


@case()
def scalars_and_empty_tensors(ctx):
    """0-d tensors keep their shape; tensors of no elements (shapes (0,), (2, 0, 3)) come back
    empty, in place and out of place, every dtype."""
    r, n = ctx.rank, ctx.size
    for dtype in ref.DTYPES:
        d = ref.short(dtype)
        x = ref.contribution(r, dtype, ())
        want = ref.reduced(hvd.Sum, n, dtype, ())
        got = hvd.allreduce(x, op=hvd.Sum, name="scalar " + d)
        ctx.equal(got, want, "0-d allreduce %s" % d)
        y = ref.contribution(r, dtype, ())
        hvd.allreduce_(y, op=hvd.Max)
        ctx.equal(y, ref.reduced(hvd.Max, n, dtype, ()), "0-d allreduce_ Max %s" % d)
        for shape in ((0,), (2, 0, 3)):
            e = torch.zeros(shape, dtype=dtype)
            ctx.equal(hvd.allreduce(e, op=hvd.Sum, name="empty %s %s" % (d, shape)), e.clone(),
                      "empty %s allreduce %s" % (shape, d))
            out = hvd.allreduce_(e, op=hvd.Average)
            ctx.check(out is e and out.shape == shape, "empty %s allreduce_ %s" % (shape, d))
            ctx.equal(hvd.synchronize(hvd.allreduce_async(e)), e.clone(), "empty allreduce_async %s" % d)


@case()
def noncontiguous_inputs(ctx):
    """Transposed and strided inputs: out of place gives the right values and leaves them
    untouched; in place writes into the caller's view (and nothing else of its base)."""
    r, n = ctx.rank, ctx.size
    for dtype in (torch.float32, torch.int32, torch.bfloat16, torch.uint8):
        d = ref.short(dtype)
        want = ref.reduced(hvd.Sum, n, dtype, (4, 3)).t()
        x = ref.contribution(r, dtype, (4, 3)).t()
        before = x.clone()
        ctx.require(not x.is_contiguous(), "test input is contiguous")
        ctx.equal(hvd.allreduce(x, op=hvd.Sum, name="t " + d), want, "transposed %s" % d)
        ctx.check(torch.equal(x, before), "transposed %s: input modified" % d)
        out = hvd.allreduce_(x, op=hvd.Sum, name="t_ " + d)
        ctx.check(out is x and not x.is_contiguous(), "allreduce_ of a transposed %s returned another tensor" % d)
        ctx.equal(x, want, "allreduce_ transposed %s" % d)
        base = torch.full((5, 6), 100, dtype=dtype)
        view = base[1:4, ::2]  # (3, 3), strided
        view.copy_(ref.contribution(r, dtype, (3, 3)))
        hvd.allreduce_(view, op=hvd.Sum, name="view " + d)
        ctx.equal(view, ref.reduced(hvd.Sum, n, dtype, (3, 3)), "allreduce_ of a strided view %s" % d)
        outside = torch.ones(5, 6, dtype=torch.bool)
        outside[1:4, ::2] = False
        ctx.check(bool((base[outside] == 100).all()), "allreduce_ of a view %s wrote outside it" % d)


@case()
def autograd(ctx):
    """The gradient of allreduce is the allreduce of the output's gradient with the same op and
    scale factors (Sum: the sum of every rank's gradient; Average: their mean)."""
    r, n = ctx.rank, ctx.size
    weights = [torch.arange(6, dtype=torch.float64).reshape(2, 3) * (s + 1) - s for s in range(n)]
    cases = [("Sum", dict(op=hvd.Sum), torch.stack(weights).sum(0)),
             ("Average", dict(op=hvd.Average), torch.stack(weights).mean(0)),
             ("default op", dict(), torch.stack(weights).mean(0)),
             ("average=False", dict(average=False), torch.stack(weights).sum(0)),
             ("Sum pre 2 post 0.25", dict(op=hvd.Sum, prescale_factor=2.0, postscale_factor=0.25),
              torch.stack(weights).sum(0) * 0.5)]
    for dtype in (torch.float32, torch.float64):
        for what, kw, want in cases:
            x = ref.contribution(r, dtype, (2, 3)).requires_grad_()
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", DeprecationWarning)
                y = hvd.allreduce(x, name="grad %s %s" % (what, ref.short(dtype)), **kw)
            (y * weights[r].to(dtype)).sum().backward()
            ctx.equal(x.grad, want.to(dtype), "allreduce gradient, %s, %s" % (what, ref.short(dtype)))


@case()
def compression(ctx):
    """compression=Compression.fp16 / .bf16: the values travel in half precision, the result has
    the input's dtype."""
    r, n = ctx.rank, ctx.size
    for comp, tol in ((hvd.Compression.fp16, 4e-3), (hvd.Compression.bf16, 2e-2), (hvd.Compression.none, 1e-6)):
        x = ref.contribution(r, torch.float32, (4, 5))
        got = hvd.allreduce(x, op=hvd.Average, compression=comp, name="compress %s" % comp.__name__)
        ctx.equal(got, ref.reduced(hvd.Average, n, torch.float32, (4, 5)), "compression %s" % comp.__name__,
                  rtol=tol, atol=tol)


@case()
def many_in_flight(ctx):
    """Many async allreduces of several dtypes in flight at once (fused by the engine),
    synchronized in reverse order."""
    r, n = ctx.rank, ctx.size
    handles = []
    for i, dtype in enumerate(ref.DTYPES * 2):
        shape = (i % 4 + 1, 3)
        name = "flight.%d" % i if i % 2 else None
        handles.append((hvd.allreduce_async(ref.contribution(r, dtype, shape), op=hvd.Sum, name=name),
                        ref.reduced(hvd.Sum, n, dtype, shape), "#%d %s" % (i, ref.short(dtype))))
    for h, want, what in reversed(handles):
        ctx.equal(hvd.synchronize(h), want, "in flight " + what)


@case()
def default_op_and_average_argument(ctx):
    """op defaults to Average; the deprecated average= still works (with a DeprecationWarning);
    giving op and average together is a ValueError."""
    r, n = ctx.rank, ctx.size
    x = ref.contribution(r, torch.float32)
    ctx.equal(hvd.allreduce(x), ref.reduced(hvd.Average, n, torch.float32), "default op")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ctx.equal(hvd.allreduce(x, average=False), ref.reduced(hvd.Sum, n, torch.float32), "average=False")
        ctx.equal(hvd.allreduce(x, average=True), ref.reduced(hvd.Average, n, torch.float32), "average=True")
    ctx.check(any(issubclass(w.category, DeprecationWarning) for w in caught), "average= gave no DeprecationWarning")
    ctx.raises(ValueError, lambda: hvd.allreduce(x, average=True, op=hvd.Sum), "op and average together")
    ctx.next_op_works("op and average together")
