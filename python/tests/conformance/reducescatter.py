"""reducescatter and reducescatter_async: every op on every dtype, dim 0 not a multiple of the
rank count (the first dim0 % size ranks get one more row), scale factors, autograd."""

from conformance.device import torch

import kolo.torch as hvd
from conformance import reference as ref
from conformance.case import case


@case()
def every_op_every_dtype_uneven(ctx):
    """Every op and dtype, dim 0 = 2*size+1: rank 0 gets 3 rows, the others 2. Named and async
    unnamed; the input is left as it was."""
    r, n = ctx.rank, ctx.size
    shape = (2 * n + 1, 3)
    for dtype in ref.DTYPES:
        for opname, op in ref.OPS:
            what = "%s %s" % (opname, ref.short(dtype))
            want = ref.share(ref.reduced(op, n, dtype, shape), r, n)
            x = ref.contribution(r, dtype, shape)
            before = x.clone()
            ctx.equal(hvd.reducescatter(x, op=op, name="rs " + what), want, "reducescatter " + what)
            ctx.check(torch.equal(x, before), "reducescatter %s modified its input" % what)
            ctx.equal(hvd.synchronize(hvd.reducescatter_async(x, op=op)), want, "reducescatter_async " + what)


@case()
def shapes_and_dim0(ctx):
    """dim 0 from 1 to 2*size+2 (ranks past dim 0 get no rows), and 1- to 3-dimensional tensors."""
    r, n = ctx.rank, ctx.size
    for dim0 in range(1, 2 * n + 3):
        for rest in ((), (2,), (2, 3)):
            shape = (dim0,) + rest
            want = ref.share(ref.reduced(hvd.Sum, n, torch.float32, shape), r, n)
            got = hvd.reducescatter(ref.contribution(r, torch.float32, shape), op=hvd.Sum)
            ctx.equal(got, want, "reducescatter of %s" % (shape,))
    got = hvd.reducescatter(torch.zeros(0, 2), op=hvd.Sum, name="rs empty")
    ctx.equal(got, torch.zeros(0, 2), "reducescatter of no rows")


@case()
def prescale_postscale_and_default_op(ctx):
    """Scale factors on floats (Sum, Average) and integers (Sum, truncated toward zero); the
    default op is Average; integer Average truncates toward zero."""
    r, n = ctx.rank, ctx.size
    shape = (n + 1, 2)
    for dtype in ref.DTYPES:
        if dtype in ref.FLOATS:
            combos = [(hvd.Sum, 3.0, 0.5), (hvd.Average, 0.5, 4.0)]
        else:
            combos = [(hvd.Sum, 2.0, 3.0), (hvd.Sum, 0.37, 0.5)]
        for op, pre, post in combos:
            want = ref.share(ref.reduced(op, n, dtype, shape, pre, post), r, n)
            got = hvd.reducescatter(ref.contribution(r, dtype, shape), op=op, prescale_factor=pre,
                                    postscale_factor=post)
            ctx.equal(got, want, "reducescatter %s pre %s post %s" % (ref.short(dtype), pre, post))
        want = ref.share(ref.reduced(hvd.Average, n, dtype, shape), r, n)
        ctx.equal(hvd.reducescatter(ref.contribution(r, dtype, shape)), want,
                  "reducescatter default op (Average) %s" % ref.short(dtype))


@case()
def rows_of_zero_width(ctx):
    """Rows of no elements are shared out like any rows: (2*size+1, 0) gives this rank's rows."""
    r, n = ctx.rank, ctx.size
    got = hvd.reducescatter(torch.zeros(2 * n + 1, 0), op=hvd.Sum)
    want = (ref.split_counts(2 * n + 1, n)[r], 0)
    ctx.check(tuple(got.shape) == want,
              "reducescatter of (%d, 0) gave %s, want %s" % (2 * n + 1, tuple(got.shape), want))


@case()
def noncontiguous_input(ctx):
    """A transposed input is reduced by its values."""
    r, n = ctx.rank, ctx.size
    x = ref.contribution(r, torch.float32, (3, 2 * n + 1)).t()
    want = ref.share(ref.reduced(hvd.Sum, n, torch.float32, (3, 2 * n + 1)).t(), r, n)
    ctx.equal(hvd.reducescatter(x, op=hvd.Sum, name="rs nc"), want, "transposed input")


@case()
def autograd(ctx):
    """Horovod's convention: Sum's gradient is size() times the gathered output gradients,
    Average's is the gathered output gradients; scale factors multiply both."""
    r, n = ctx.rank, ctx.size
    for dim0 in (n, 2 * n + 1):
        counts = ref.split_counts(dim0, n)
        for label, kw, scale in (
                ("Sum", dict(op=hvd.Sum), n), ("Average", dict(op=hvd.Average), 1),
                ("Sum pre 2 post 1.5", dict(op=hvd.Sum, prescale_factor=2.0, postscale_factor=1.5), 3 * n)):
            x = torch.ones(dim0, 2, dtype=torch.float64, requires_grad=True)
            out = hvd.reducescatter(x, name="rs grad %s %d" % (label, dim0), **kw)
            (out * (r + 1)).sum().backward()
            want = torch.cat([torch.full((counts[q], 2), float(scale * (q + 1)), dtype=torch.float64)
                              for q in range(n)])
            ctx.equal(x.grad, want, "reducescatter gradient %s, dim 0 %d" % (label, dim0))
