"""alltoall and alltoall_async: even split, splits as a list and as an int32 tensor, splits
summing to less than dim 0, received splits, empty and non-contiguous tensors, autograd."""

from conformance.device import torch

import kolo.torch as hvd
from conformance import reference as ref
from conformance.case import case


def block(src, dst, count, dtype, rest=(2,)):
    """The rows rank src sends rank dst: value 10*src + dst + 30*k in row k (fits int8)."""
    k = torch.arange(count, dtype=torch.float64).reshape((count,) + (1,) * len(rest))
    return ((10 * src + dst + 30 * k) * torch.ones((count,) + rest, dtype=torch.float64)).to(dtype)


def sent(r, splits, dtype, rest=(2,)):
    return torch.cat([block(r, d, c, dtype, rest) for d, c in enumerate(splits)])


def received(r, all_splits, dtype, rest=(2,)):
    return torch.cat([block(s, r, all_splits[s][r], dtype, rest) for s in range(len(all_splits))])


@case()
def even_split_every_dtype(ctx):
    """No splits: dim 0 is split evenly; the result alone (no splits) is returned. Named,
    unnamed, async (whose synchronize gives (output, received_splits)), 2- and 3-dim tensors."""
    r, n = ctx.rank, ctx.size
    for dtype in ref.DTYPES:
        d = ref.short(dtype)
        for rest in ((2,), (2, 3)):
            even = [[2] * n for _ in range(n)]
            x = sent(r, even[r], dtype, rest)
            before = x.clone()
            want = received(r, even, dtype, rest)
            ctx.equal(hvd.alltoall(x, name="a2a %s %s" % (d, rest)), want, "alltoall %s %s" % (d, rest))
            ctx.check(torch.equal(x, before), "alltoall %s modified its input" % d)
            ctx.equal(hvd.alltoall(x), want, "alltoall (unnamed) %s %s" % (d, rest))
            out, splits = hvd.synchronize(hvd.alltoall_async(x, name="a2a async %s %s" % (d, rest)))
            ctx.equal(out, want, "alltoall_async %s %s" % (d, rest))
            ctx.check(splits.tolist() == [2] * n, "alltoall_async %s received splits %s" % (d, splits.tolist()))


def _uneven(n):
    """Rank s sends (s + d) % 3 rows to rank d: some ranks send some others nothing."""
    return [[(s + d) % 3 for d in range(n)] for s in range(n)]


@case()
def splits_as_list_every_dtype(ctx):
    """splits as a list of ints: rank r sends splits[d] rows to rank d and gets (output,
    received_splits) with received_splits[s] = rows from rank s, an int32 tensor."""
    r, n = ctx.rank, ctx.size
    splits = _uneven(n)
    want_splits = [splits[s][r] for s in range(n)]
    for dtype in ref.DTYPES:
        d = ref.short(dtype)
        out, got_splits = hvd.alltoall(sent(r, splits[r], dtype), splits=splits[r], name="a2a list " + d)
        ctx.equal(out, received(r, splits, dtype), "alltoall with splits %s" % d)
        ctx.check(got_splits.dtype == torch.int32 and got_splits.tolist() == want_splits,
                  "received splits %s %s, want int32 %s" % (got_splits.dtype, got_splits.tolist(), want_splits))
    out, got_splits = hvd.synchronize(hvd.alltoall_async(sent(r, splits[r], torch.int64), splits=splits[r]))
    ctx.equal(out, received(r, splits, torch.int64), "alltoall_async with splits")
    ctx.check(got_splits.tolist() == want_splits, "alltoall_async received splits %s" % got_splits.tolist())


@case()
def splits_as_int32_tensor(ctx):
    """splits as an int32 tensor: the same, received splits an int32 tensor."""
    r, n = ctx.rank, ctx.size
    splits = _uneven(n)
    for dtype in (torch.float32, torch.int8, torch.bfloat16):
        out, got_splits = hvd.alltoall(sent(r, splits[r], dtype), splits=torch.tensor(splits[r], dtype=torch.int32),
                                       name="a2a tensor " + ref.short(dtype))
        ctx.equal(out, received(r, splits, dtype), "alltoall with an int32 splits tensor %s" % ref.short(dtype))
        ctx.check(got_splits.dtype == torch.int32 and got_splits.tolist() == [splits[s][r] for s in range(n)],
                  "received splits %s %s" % (got_splits.dtype, got_splits.tolist()))


@case()
def splits_summing_to_less_than_dim0(ctx):
    """Rows past the sum of the splits are not sent."""
    r, n = ctx.rank, ctx.size
    splits = [[1 + (s == d) for d in range(n)] for s in range(n)]
    for dtype in (torch.float64, torch.int32):
        x = torch.cat([sent(r, splits[r], dtype), torch.full((3, 2), 99).to(dtype)])
        out, got_splits = hvd.alltoall(x, splits=splits[r], name="a2a short " + ref.short(dtype))
        ctx.equal(out, received(r, splits, dtype), "alltoall with 3 rows past the splits %s" % ref.short(dtype))
        ctx.check(got_splits.tolist() == [splits[s][r] for s in range(n)], "received splits %s" % got_splits.tolist())


@case()
def empty_tensors(ctx):
    """A tensor of no rows, with and without splits; every rank sending everything to one rank."""
    r, n = ctx.rank, ctx.size
    for dtype in (torch.float32, torch.uint8):
        ctx.equal(hvd.alltoall(torch.zeros(0, 2, dtype=dtype)), torch.zeros(0, 2, dtype=dtype), "alltoall of no rows")
        out, got = hvd.alltoall(torch.zeros(0, 2, dtype=dtype), splits=[0] * n)
        ctx.equal(out, torch.zeros(0, 2, dtype=dtype), "alltoall of no rows with zero splits")
        ctx.check(got.tolist() == [0] * n, "received splits of no rows %s" % got.tolist())
    splits = [[2 if d == 0 else 0 for d in range(n)] for s in range(n)]  # everything to rank 0
    out, got = hvd.alltoall(sent(r, splits[r], torch.float32), splits=splits[r], name="a2a to 0")
    ctx.equal(out, received(r, splits, torch.float32), "alltoall of everything to rank 0")
    ctx.check(got.tolist() == ([2] * n if r == 0 else [0] * n), "received splits %s" % got.tolist())


@case()
def rows_of_zero_width(ctx):
    """Rows of no elements travel like any rows: the output has as many as were received (here
    every rank sends its 2 rows to rank 0)."""
    r, n = ctx.rank, ctx.size
    splits = [[2 if d == 0 else 0 for d in range(n)] for s in range(n)]
    out, got = hvd.alltoall(torch.zeros(sum(splits[r]), 0), splits=splits[r])
    want = sum(splits[s][r] for s in range(n))
    ctx.check(got.tolist() == [splits[s][r] for s in range(n)], "received splits %s" % got.tolist())
    ctx.check(tuple(out.shape) == (want, 0), "alltoall of (%d, 0) gave %s, want %s"
              % (sum(splits[r]), tuple(out.shape), (want, 0)))


@case()
def noncontiguous_input(ctx):
    """A transposed input is sent by its values."""
    r, n = ctx.rank, ctx.size
    even = [[2] * n for _ in range(n)]
    x = sent(r, even[r], torch.float32, (3,)).t().contiguous().t()  # same values, column-major
    ctx.require(not x.is_contiguous(), "test input is contiguous")
    ctx.equal(hvd.alltoall(x, name="a2a nc"), received(r, even, torch.float32, (3,)), "transposed input")


@case()
def autograd(ctx):
    """The gradient goes back the way the rows came: each sent row's gradient is the gradient of
    the row it became on its destination."""
    r, n = ctx.rank, ctx.size
    for label, splits in (("even", None), ("splits", _uneven(n))):
        counts = splits[r] if splits else [2] * n
        x = torch.zeros(sum(counts), 3, dtype=torch.float64, requires_grad=True)
        res = hvd.alltoall(x, splits=counts if splits else None, name="a2a grad " + label)
        out = res[0] if splits else res
        (out * (r + 1)).sum().backward()
        want = torch.cat([torch.full((c, 3), float(d + 1), dtype=torch.float64) for d, c in enumerate(counts)])
        ctx.equal(x.grad, want, "alltoall gradient (%s)" % label)
