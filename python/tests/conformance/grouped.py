"""grouped_allreduce (+ _, _async, _async_), grouped_allgather (+ _async) and
grouped_reducescatter (+ _async): a list of tensors of every dtype in one call."""

import time

from conformance.device import torch

import kolo.torch as hvd
from conformance import reference as ref
from conformance.case import case

SHAPES = [(3, 4), (5,), (2, 1, 3), (), (0,), (17,), (1, 1), (4, 2), (6,)]  # one per dtype


def _members(r, shapes=SHAPES):
    return [ref.contribution(r, d, s) for d, s in zip(ref.DTYPES, shapes)]


def _wants(op, n, pre=1.0, post=1.0, shapes=SHAPES):
    return [ref.reduced(op, n, d, s, pre, post) for d, s in zip(ref.DTYPES, shapes)]


@case()
def grouped_allreduce_every_op_every_dtype(ctx):
    """One group holding a tensor of every dtype (a scalar and an empty one among them), with
    every op, in the four forms; in place returns the caller's tensors."""
    r, n = ctx.rank, ctx.size
    for opname, op in ref.OPS:
        wants = _wants(op, n)
        xs = _members(r)
        befores = [x.clone() for x in xs]
        got = hvd.grouped_allreduce(xs, op=op, name="g " + opname)
        ctx.check(isinstance(got, list) and len(got) == len(xs), "grouped_allreduce returned %r" % type(got))
        for g, w, d, x, b in zip(got, wants, ref.DTYPES, xs, befores):
            ctx.equal(g, w, "grouped_allreduce %s %s" % (opname, ref.short(d)))
            ctx.check(torch.equal(x, b), "grouped_allreduce %s %s modified its input" % (opname, ref.short(d)))
        ys = _members(r)
        out = hvd.grouped_allreduce_(ys, op=op, name="g_ " + opname)
        ctx.check(len(out) == len(ys) and all(o is y for o, y in zip(out, ys)),
                  "grouped_allreduce_ %s did not return the caller's tensors" % opname)
        for y, w, d in zip(ys, wants, ref.DTYPES):
            ctx.equal(y, w, "grouped_allreduce_ %s %s" % (opname, ref.short(d)))
        got = hvd.synchronize(hvd.grouped_allreduce_async(_members(r), op=op))
        for g, w, d in zip(got, wants, ref.DTYPES):
            ctx.equal(g, w, "grouped_allreduce_async (unnamed) %s %s" % (opname, ref.short(d)))
        ys = _members(r)
        h = hvd.grouped_allreduce_async_(ys, op=op, name="g async_ " + opname)
        deadline = time.monotonic() + 5
        while not hvd.poll(h) and time.monotonic() < deadline:
            time.sleep(0.0002)
        hvd.synchronize(h)
        for y, w, d in zip(ys, wants, ref.DTYPES):
            ctx.equal(y, w, "grouped_allreduce_async_ %s %s" % (opname, ref.short(d)))


@case()
def grouped_allreduce_scale_factors(ctx):
    """prescale/postscale apply to every member (integers truncated toward zero)."""
    r, n = ctx.rank, ctx.size
    for op, pre, post in ((hvd.Sum, 3.0, 0.5), (hvd.Average, 0.5, 4.0), (hvd.Sum, 0.37, 1.0)):
        got = hvd.grouped_allreduce(_members(r), op=op, prescale_factor=pre, postscale_factor=post)
        for g, w, d in zip(got, _wants(op, n, pre, post), ref.DTYPES):
            if d in ref.INTS and op == hvd.Average:
                continue  # integer averages with scale factors: see allreduce.prescale_postscale
            ctx.equal(g, w, "grouped pre %s post %s %s" % (pre, post, ref.short(d)))


@case()
def grouped_allreduce_autograd(ctx):
    """Each member's gradient is the allreduce (same op) of its output's gradient."""
    r, n = ctx.rank, ctx.size
    shapes = [(2, 3), (4,)]
    weights = [[torch.arange(float(torch.Size(s).numel())).reshape(s) * (q + 1) + i for i, s in enumerate(shapes)]
               for q in range(n)]
    for opname, op in (("Sum", hvd.Sum), ("Average", hvd.Average)):
        for dtype in (torch.float32, torch.float64):
            xs = [ref.contribution(r, dtype, s).requires_grad_() for s in shapes]
            outs = hvd.grouped_allreduce(xs, op=op, name="grad %s %s" % (opname, ref.short(dtype)))
            sum((o * w.to(dtype)).sum() for o, w in zip(outs, weights[r])).backward()
            for i, x in enumerate(xs):
                stack = torch.stack([weights[q][i] for q in range(n)])
                want = stack.sum(0) if op == hvd.Sum else stack.mean(0)
                ctx.equal(x.grad, want.to(dtype), "grouped_allreduce gradient %s %s member %d"
                          % (opname, ref.short(dtype), i))


@case()
def grouped_allgather_every_dtype(ctx):
    """Every dtype in one group, each member's dim 0 differing per rank and per member."""
    r, n = ctx.rank, ctx.size

    def member(q, i, d):
        return torch.full((q + 1 + i % 3, 2), q * 10 + i).to(d)
    xs = [member(r, i, d) for i, d in enumerate(ref.DTYPES)]
    wants = [torch.cat([member(q, i, d) for q in range(n)]) for i, d in enumerate(ref.DTYPES)]
    got = hvd.grouped_allgather(xs, name="gg")
    for g, w, d in zip(got, wants, ref.DTYPES):
        ctx.equal(g, w, "grouped_allgather %s" % ref.short(d))
    got = hvd.synchronize(hvd.grouped_allgather_async(xs))
    for g, w, d in zip(got, wants, ref.DTYPES):
        ctx.equal(g, w, "grouped_allgather_async %s" % ref.short(d))


@case()
def grouped_allgather_autograd(ctx):
    """Each member's gradient: this rank's rows of the average of every rank's output gradient."""
    r, n = ctx.rank, ctx.size
    rows = [[q + 1, 2 * q + 1] for q in range(n)]  # member i of rank q has rows[q][i] rows
    xs = [torch.full((rows[r][i], 2), float(r), requires_grad=True) for i in range(2)]
    outs = hvd.grouped_allgather(xs, name="gg grad")
    ws = [torch.arange(float(o.numel())).reshape(o.shape) * (r + 1) for o in outs]
    sum((o * w).sum() for o, w in zip(outs, ws)).backward()
    for i, x in enumerate(xs):
        total = sum(rows[q][i] for q in range(n))
        mean_w = torch.stack([torch.arange(float(total * 2)).reshape(total, 2) * (q + 1) for q in range(n)]).mean(0)
        start = sum(rows[q][i] for q in range(r))
        ctx.equal(x.grad, mean_w[start:start + rows[r][i]], "grouped_allgather gradient member %d" % i)


@case()
def grouped_reducescatter_every_op_every_dtype(ctx):
    """Every dtype in one group with every op, dim 0 not a multiple of the rank count (the first
    dim0 % size ranks get one more row); the async form; scale factors."""
    r, n = ctx.rank, ctx.size
    shapes = [(2 * n + 1 + i % 3, 2) for i in range(len(ref.DTYPES))]
    for opname, op in ref.OPS:
        got = hvd.grouped_reducescatter(_members(r, shapes), op=op, name="grs " + opname)
        for g, w, d in zip(got, _wants(op, n, shapes=shapes), ref.DTYPES):
            ctx.equal(g, ref.share(w, r, n), "grouped_reducescatter %s %s" % (opname, ref.short(d)))
    got = hvd.synchronize(hvd.grouped_reducescatter_async(_members(r, shapes), op=hvd.Sum))
    for g, w, d in zip(got, _wants(hvd.Sum, n, shapes=shapes), ref.DTYPES):
        ctx.equal(g, ref.share(w, r, n), "grouped_reducescatter_async Sum %s" % ref.short(d))
    got = hvd.grouped_reducescatter(_members(r, shapes), op=hvd.Sum, prescale_factor=2.0, postscale_factor=0.5)
    for g, w, d in zip(got, _wants(hvd.Sum, n, 2.0, 0.5, shapes), ref.DTYPES):
        ctx.equal(g, ref.share(w, r, n), "grouped_reducescatter pre 2 post 0.5 %s" % ref.short(d))
    got = hvd.grouped_reducescatter([ref.contribution(r, torch.float32, (n, 3))])  # default op
    ctx.equal(got[0], ref.share(ref.reduced(hvd.Average, n, torch.float32, (n, 3)), r, n),
              "grouped_reducescatter default op is Average")


@case()
def grouped_reducescatter_autograd(ctx):
    """Horovod's convention: Sum's gradient is size() times the gathered output gradients,
    Average's is the gathered output gradients."""
    r, n = ctx.rank, ctx.size
    shapes = [(2 * n + 1, 2), (n, 3)]
    for opname, op, scale in (("Sum", hvd.Sum, n), ("Average", hvd.Average, 1)):
        xs = [torch.ones(s, requires_grad=True) for s in shapes]
        outs = hvd.grouped_reducescatter(xs, op=op, name="grs grad " + opname)
        (sum((o * (r + 1)).sum() for o in outs)).backward()
        for i, (x, s) in enumerate(zip(xs, shapes)):
            counts = ref.split_counts(s[0], n)
            want = torch.cat([torch.full((counts[q],) + s[1:], float(scale * (q + 1))) for q in range(n)])
            ctx.equal(x.grad, want, "grouped_reducescatter %s gradient member %d" % (opname, i))


@case()
def empty_group(ctx):
    """A group of no tensors is a ValueError."""
    for f in (hvd.grouped_allreduce, hvd.grouped_allreduce_, hvd.grouped_allgather, hvd.grouped_reducescatter):
        ctx.raises(ValueError, lambda: f([]), "%s([])" % f.__name__)
    ctx.next_op_works("empty groups")
