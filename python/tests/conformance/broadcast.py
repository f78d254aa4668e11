"""broadcast, broadcast_, broadcast_async, broadcast_async_: every dtype from every root,
scalars, empty and non-contiguous tensors, autograd."""

import time

from conformance.device import torch

import kolo.torch as hvd
from conformance import reference as ref
from conformance.case import case


@case()
def every_dtype_every_root(ctx):
    """The four forms, every dtype, each rank as root; out of place leaves the input untouched,
    in place returns the caller's tensor."""
    r, n = ctx.rank, ctx.size
    for root in range(n):
        for dtype in ref.DTYPES:
            what = "%s from %d" % (ref.short(dtype), root)
            want = ref.contribution(root, dtype)
            x = ref.contribution(r, dtype)
            before = x.clone()
            ctx.equal(hvd.broadcast(x, root, name="bc " + what), want, "broadcast " + what)
            ctx.check(torch.equal(x, before), "broadcast %s modified its input" % what)
            y = ref.contribution(r, dtype)
            out = hvd.broadcast_(y, root, name="bc_ " + what)
            ctx.check(out is y, "broadcast_ %s did not return its tensor" % what)
            ctx.equal(y, want, "broadcast_ " + what)
            ctx.equal(hvd.synchronize(hvd.broadcast_async(x, root)), want, "broadcast_async (unnamed) " + what)
            y = ref.contribution(r, dtype)
            h = hvd.broadcast_async_(y, root_rank=root, name="bc async_ " + what)
            deadline = time.monotonic() + 5
            while not hvd.poll(h) and time.monotonic() < deadline:
                time.sleep(0.0002)
            ctx.check(hvd.synchronize(h) is y, "broadcast_async_ %s: synchronize did not return the tensor" % what)
            ctx.equal(y, want, "broadcast_async_ " + what)


@case()
def shapes_scalars_and_empty(ctx):
    """1- to 3-dimensional tensors, 0-d tensors (shape kept) and tensors of no elements."""
    r, n = ctx.rank, ctx.size
    root = n - 1
    for dtype in ref.DTYPES:
        d = ref.short(dtype)
        for shape in ((17,), (17, 17), (5, 4, 17), ()):
            got = hvd.broadcast(ref.contribution(r, dtype, shape), root)
            ctx.equal(got, ref.contribution(root, dtype, shape), "broadcast %s %s" % (d, shape))
        y = ref.contribution(r, dtype, ())
        hvd.broadcast_(y, root, name="scalar_ " + d)
        ctx.equal(y, ref.contribution(root, dtype, ()), "broadcast_ 0-d %s" % d)
        for shape in ((0,), (3, 0)):
            e = torch.zeros(shape, dtype=dtype)
            ctx.equal(hvd.broadcast(e, root, name="empty %s %s" % (d, shape)), e.clone(),
                      "broadcast empty %s %s" % (d, shape))
            ctx.check(hvd.broadcast_(e, root) is e, "broadcast_ empty %s" % d)


@case()
def noncontiguous(ctx):
    """A transposed input broadcasts by its values; broadcast_ into a strided view writes the view
    and nothing else of its base."""
    r, n = ctx.rank, ctx.size
    root = n - 1
    for dtype in (torch.float32, torch.int16, torch.bfloat16):
        d = ref.short(dtype)
        x = ref.contribution(r, dtype, (4, 3)).t()
        ctx.equal(hvd.broadcast(x, root, name="t " + d), ref.contribution(root, dtype, (4, 3)).t(), "transposed %s" % d)
        base = torch.full((4, 6), 7, dtype=dtype)
        view = base[:, 1::2]
        view.copy_(ref.contribution(r, dtype, (4, 3)))
        out = hvd.broadcast_(view, root, name="view " + d)
        ctx.check(out is view, "broadcast_ of a view %s returned another tensor" % d)
        ctx.equal(view, ref.contribution(root, dtype, (4, 3)), "broadcast_ into a strided view %s" % d)
        ctx.check(bool((base[:, 0::2] == 7).all()), "broadcast_ into a view %s wrote outside it" % d)


@case()
def autograd(ctx):
    """The root's gradient is the average of every rank's output gradient; the other ranks' is
    zero (Horovod's convention)."""
    r, n = ctx.rank, ctx.size
    for root in range(n):
        for dtype in (torch.float32, torch.float64):
            x = torch.full((2, 3), float(r), dtype=dtype, requires_grad=True)
            y = hvd.broadcast(x, root, name="bc grad %d %s" % (root, ref.short(dtype)))
            w = [torch.arange(6.0, dtype=dtype).reshape(2, 3) * (q + 1) + q for q in range(n)]
            (y * w[r]).sum().backward()
            want = torch.stack(w).mean(0) if r == root else torch.zeros(2, 3, dtype=dtype)
            ctx.equal(x.grad, want, "broadcast gradient from root %d %s" % (root, ref.short(dtype)))
