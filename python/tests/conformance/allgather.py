"""allgather and allgather_async: every dtype, dim 0 differing per rank, empty and non-contiguous
tensors, many in flight, autograd."""

from conformance.device import torch

import kolo.torch as hvd
from conformance import reference as ref
from conformance.case import case


def _rows(q, dtype, shape_rest=(3, 2), rows=None):
    """Rank q's tensor: rows (default q+1) rows of q-tagged values."""
    rows = q + 1 if rows is None else rows
    x = ref.contribution(q, dtype, (rows,) + shape_rest)
    return x


@case()
def every_dtype_variable_dim0(ctx):
    """Rank r sends r+1 rows; everyone gets every rank's rows in rank order; the input is left
    as it was. Named, unnamed and async."""
    r, n = ctx.rank, ctx.size
    for dtype in ref.DTYPES:
        d = ref.short(dtype)
        x = _rows(r, dtype)
        before = x.clone()
        want = torch.cat([_rows(q, dtype) for q in range(n)])
        ctx.equal(hvd.allgather(x, name="ag " + d), want, "allgather %s" % d)
        ctx.check(torch.equal(x, before), "allgather %s modified its input" % d)
        ctx.equal(hvd.allgather(x), want, "allgather (unnamed) %s" % d)
        ctx.equal(hvd.synchronize(hvd.allgather_async(x, name="ag async " + d)), want, "allgather_async %s" % d)


@case()
def shapes_1d_to_3d(ctx):
    """1-, 2- and 3-dimensional tensors (17 wide), every dtype."""
    r, n = ctx.rank, ctx.size
    for dtype in ref.DTYPES:
        for rest in ((), (17,), (4, 17)):
            want = torch.cat([_rows(q, dtype, rest) for q in range(n)])
            ctx.equal(hvd.allgather(_rows(r, dtype, rest)), want, "allgather %s rows of %s" % (ref.short(dtype), rest))


@case()
def empty_tensors(ctx):
    """Every rank sending no rows gives no rows; one rank sending none leaves its place empty."""
    r, n = ctx.rank, ctx.size
    for dtype in (torch.float32, torch.int64, torch.float16):
        got = hvd.allgather(torch.zeros(0, 3, dtype=dtype), name="ag empty " + ref.short(dtype))
        ctx.equal(got, torch.zeros(0, 3, dtype=dtype), "allgather of empty tensors %s" % ref.short(dtype))
        x = _rows(r, dtype, (3,), rows=0 if r == 0 else 2)
        want = torch.cat([_rows(q, dtype, (3,), rows=0 if q == 0 else 2) for q in range(n)])
        ctx.equal(hvd.allgather(x), want, "allgather with rank 0 sending no rows %s" % ref.short(dtype))


@case()
def rows_of_zero_width(ctx):
    """Rows of no elements are rows too: gathering (r+1, 0) tensors gives (sum, 0)."""
    r, n = ctx.rank, ctx.size
    for shape_rest in ((0,), (0, 3)):
        got = hvd.allgather(torch.zeros((r + 1,) + shape_rest))
        want = (sum(q + 1 for q in range(n)),) + shape_rest
        ctx.check(tuple(got.shape) == want, "allgather of %s tensors gave %s, want %s"
                  % ((r + 1,) + shape_rest, tuple(got.shape), want))


@case()
def noncontiguous_input(ctx):
    """A transposed input is gathered by its values."""
    r, n = ctx.rank, ctx.size
    for dtype in (torch.float32, torch.uint8):
        x = ref.contribution(r, dtype, (3, r + 1)).t()
        want = torch.cat([ref.contribution(q, dtype, (3, q + 1)).t() for q in range(n)])
        ctx.equal(hvd.allgather(x, name="ag nc " + ref.short(dtype)), want, "transposed %s" % ref.short(dtype))


@case()
def many_in_flight(ctx):
    """Several async allgathers in flight together (fused), synchronized in reverse order."""
    r, n = ctx.rank, ctx.size
    handles = []
    for i, dtype in enumerate(ref.DTYPES):
        x = _rows(r, dtype, (i % 3 + 1,), rows=(r + i) % 3 + 1)
        want = torch.cat([_rows(q, dtype, (i % 3 + 1,), rows=(q + i) % 3 + 1) for q in range(n)])
        handles.append((hvd.allgather_async(x, name="flight.%d" % i if i % 2 else None), want, ref.short(dtype)))
    for h, want, d in reversed(handles):
        ctx.equal(hvd.synchronize(h), want, "in flight %s" % d)


@case()
def autograd(ctx):
    """The gradient of allgather is this rank's rows of the average of every rank's output
    gradient (Horovod's convention)."""
    r, n = ctx.rank, ctx.size
    total = sum(q + 1 for q in range(n))
    for dtype in (torch.float32, torch.float64):
        x = torch.full((r + 1, 2), float(r), dtype=dtype, requires_grad=True)
        g = hvd.allgather(x, name="ag grad " + ref.short(dtype))
        w = [torch.arange(float(total * 2), dtype=dtype).reshape(total, 2) * (q + 1) - q for q in range(n)]
        (g * w[r]).sum().backward()
        start = sum(q + 1 for q in range(r))
        ctx.equal(x.grad, torch.stack(w).mean(0)[start:start + r + 1], "allgather gradient %s" % ref.short(dtype))
