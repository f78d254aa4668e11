"""Errors: ranks that disagree about an op, arguments wrong on one rank, duplicate names, calls
that went different ways, unsupported dtypes.

The contract (docs/pytorch.md, mpi_ops.py): ranks that submit the same op with different shapes,
dimensions, dtypes, reduce ops, roots or scale factors all raise HorovodInternalError (a
RuntimeError) within a second, naming the op, and the next op works. An argument wrong on one
rank only raises ValueError there, at the call; the other ranks' submissions fail with
HorovodInternalError saying "rank R refused it: <why>". Ranks whose calls went different ways
(one skipped a call the others made) all raise within KOLO_STALL_CROSSED_TIME_SECONDS (+2 s
here), the error saying what the other ranks wait on. Each check below stops its case at the
first failure (the ranks would only disagree further)."""

import time

from conformance.device import torch

import kolo.torch as hvd
from conformance.case import case

WITHIN = 1.0  # seconds every rank may take to raise for a mismatch or a refusal


def _mismatch(ctx, kind, label, call):
    """call(name) is an op the ranks disagree about: named and unnamed, every rank raises
    HorovodInternalError within WITHIN naming the op, and the job goes on."""
    for name in ("mm.%s.%s" % (kind, label), None):
        what = "%s %s mismatch (%s)" % (kind, label, "named" if name else "unnamed")
        ctx.raises(hvd.HorovodInternalError, lambda: call(name), what,
                   contains=(kind, name or "noname"), within=WITHIN, stop=True)
        ctx.next_op_works(what)


def _per_rank(r, *choices):
    return choices[r % len(choices)]


@case()
def mismatch_allreduce(ctx):
    """allreduce: shape, number of dimensions, dtype, reduce op (Adasum too), prescale, postscale."""
    r = ctx.rank
    dtype = _per_rank(r, torch.float32, torch.int32, torch.float64)
    op = _per_rank(r, hvd.Sum, hvd.Max, hvd.Min)
    adasum = _per_rank(r, hvd.Adasum, hvd.Average)
    for label, call in (
            ("shape", lambda name: hvd.allreduce(torch.zeros(2 + r), name=name)),
            ("ndim", lambda name: hvd.allreduce(torch.zeros((2,) * (1 + r % 2)), name=name)),
            ("dtype", lambda name: hvd.allreduce(torch.zeros(2, dtype=dtype), name=name)),
            ("op", lambda name: hvd.allreduce(torch.zeros(2), op=op, name=name)),
            ("op Adasum", lambda name: hvd.allreduce(torch.zeros(2), op=adasum, name=name)),
            ("prescale", lambda name: hvd.allreduce(torch.zeros(2), op=hvd.Sum, prescale_factor=1.0 + r, name=name)),
            ("postscale", lambda name: hvd.allreduce_(torch.zeros(2), op=hvd.Sum, postscale_factor=1.0 + r, name=name)),
            ("async shape", lambda name: hvd.synchronize(hvd.allreduce_async(torch.zeros(3, 1 + r), name=name)))):
        _mismatch(ctx, "allreduce", label, call)


@case()
def mismatch_grouped_allreduce(ctx):
    """grouped_allreduce: a member's shape or dtype, the reduce op, the scale factors."""
    r = ctx.rank
    dtype = _per_rank(r, torch.float32, torch.float64)
    op = _per_rank(r, hvd.Sum, hvd.Product)
    for label, call in (
            ("member shape", lambda name: hvd.grouped_allreduce([torch.ones(2), torch.ones(2 + r)], name=name)),
            ("member dtype",
             lambda name: hvd.grouped_allreduce([torch.ones(2), torch.ones(2, dtype=dtype)], name=name)),
            ("op", lambda name: hvd.grouped_allreduce([torch.ones(2)], op=op, name=name)),
            ("prescale", lambda name: hvd.grouped_allreduce_([torch.ones(2)], prescale_factor=1.0 + r, name=name))):
        _mismatch(ctx, "allreduce", label, call)


@case()
def mismatch_allgather(ctx):
    """allgather and grouped_allgather: dimensions past the first, number of dimensions, dtype."""
    r = ctx.rank
    dtype = _per_rank(r, torch.int64, torch.uint8, torch.bfloat16)
    member = _per_rank(r, torch.float32, torch.int8)
    for label, call in (
            ("shape", lambda name: hvd.allgather(torch.ones(2, 1 + r), name=name)),
            ("ndim", lambda name: hvd.allgather(torch.ones((2,) * (1 + r % 2)), name=name)),
            ("dtype", lambda name: hvd.allgather(torch.ones(2, dtype=dtype), name=name)),
            ("grouped member dtype",
             lambda name: hvd.grouped_allgather([torch.ones(1), torch.ones(1, dtype=member)], name=name)),
            ("grouped member shape", lambda name: hvd.grouped_allgather([torch.ones(1, 1 + r)], name=name))):
        _mismatch(ctx, "allgather", label, call)


@case()
def mismatch_broadcast(ctx):
    """broadcast: shape, number of dimensions, dtype, root rank."""
    r = ctx.rank
    dtype = _per_rank(r, torch.float16, torch.int16)
    for label, call in (
            ("shape", lambda name: hvd.broadcast(torch.ones(2 + r), 0, name=name)),
            ("ndim", lambda name: hvd.broadcast_(torch.ones((2,) * (1 + r % 2)), 0, name=name)),
            ("dtype", lambda name: hvd.broadcast(torch.ones(2, dtype=dtype), 0, name=name)),
            ("root", lambda name: hvd.broadcast(torch.ones(2), r, name=name))):
        _mismatch(ctx, "broadcast", label, call)


@case()
def mismatch_alltoall(ctx):
    """alltoall: dimensions past the first, number of dimensions, dtype."""
    r, n = ctx.rank, ctx.size
    dtype = _per_rank(r, torch.float32, torch.int32)
    for label, call in (
            ("shape", lambda name: hvd.alltoall(torch.ones(2 * n, 1 + r), name=name)),
            ("ndim", lambda name: hvd.alltoall(torch.ones((2 * n,) + (2,) * (r % 2)), name=name)),
            ("dtype", lambda name: hvd.alltoall(torch.ones(2 * n, dtype=dtype), name=name)),
            ("dtype with splits", lambda name: hvd.alltoall(torch.ones(n, dtype=dtype), splits=[1] * n, name=name))):
        _mismatch(ctx, "alltoall", label, call)


@case()
def mismatch_reducescatter(ctx):
    """reducescatter and grouped_reducescatter: shape (dim 0 too), number of dimensions, dtype,
    reduce op, prescale, postscale."""
    r, n = ctx.rank, ctx.size
    dtype = _per_rank(r, torch.float32, torch.float16)
    op = _per_rank(r, hvd.Sum, hvd.Average)
    for label, call in (
            ("dim 0", lambda name: hvd.reducescatter(torch.ones(2 * n + r, 2), name=name)),
            ("shape", lambda name: hvd.reducescatter(torch.ones(2 * n, 1 + r), name=name)),
            ("ndim", lambda name: hvd.reducescatter(torch.ones((2 * n,) + (2,) * (r % 2)), name=name)),
            ("dtype", lambda name: hvd.reducescatter(torch.ones(2 * n, dtype=dtype), name=name)),
            ("op", lambda name: hvd.reducescatter(torch.ones(2 * n), op=op, name=name)),
            ("prescale", lambda name: hvd.reducescatter(torch.ones(2 * n), prescale_factor=1.0 + r, name=name)),
            ("postscale", lambda name: hvd.reducescatter(torch.ones(2 * n), postscale_factor=1.0 + r, name=name)),
            ("grouped member shape",
             lambda name: hvd.grouped_reducescatter([torch.ones(n), torch.ones(n + r)], name=name))):
        _mismatch(ctx, "reducescatter", label, call)


@case()
def mismatch_kind_unnamed(ctx):
    """Unnamed ops are matched by call order: one rank's allreduce meeting the others' allgather
    (or broadcast) is a mismatch every rank gets within a second."""
    r = ctx.rank
    for other, call in (("allgather", lambda: hvd.allgather(torch.ones(2))),
                        ("broadcast", lambda: hvd.broadcast(torch.ones(2), 0))):
        what = "allreduce on rank 0 against %s" % other
        ctx.raises(hvd.HorovodInternalError, (lambda: hvd.allreduce(torch.ones(2))) if r == 0 else call, what,
                   contains=("noname", "allreduce", other), within=WITHIN, stop=True)
        ctx.next_op_works(what)


def _refused(ctx, what, culprit, bad, good, why):
    """bad() on rank culprit is wrong on that rank only: it raises ValueError there at the call
    (saying why), and the others' good() fails with HorovodInternalError naming the culprit and
    why, all within WITHIN; then the job goes on."""
    if ctx.rank == culprit:
        ctx.raises(ValueError, bad, "%s on this rank" % what, contains=(why,), within=WITHIN, stop=True)
    else:
        ctx.raises(hvd.HorovodInternalError, good, "%s on rank %d" % (what, culprit),
                   contains=("rank %d refused it" % culprit, why), within=WITHIN, stop=True)
    ctx.next_op_works(what)


def _refusals(n):
    """(what, bad call, good call, words of the reason) of arguments wrong on one rank; calls
    take the op's name (None: unnamed)."""
    def a2a(splits, rows=n):
        return lambda name: hvd.alltoall(torch.ones(rows), splits=splits, name=name)

    def grouped(f, odd, member=torch.ones(n)):
        """f(a group whose second member is odd) and f(a group of two good members)."""
        return (lambda name: f([member, odd], name=name)), (lambda name: f([member, member], name=name))
    bool_member = grouped(hvd.grouped_allreduce, torch.ones(n, dtype=torch.bool))
    scalar_gather = grouped(hvd.grouped_allgather, torch.tensor(2.0))
    scalar_scatter = grouped(hvd.grouped_reducescatter, torch.tensor(1.0))
    int32 = torch.ones(n, dtype=torch.int32)
    return [
        ("allreduce of bool", lambda name: hvd.allreduce(torch.zeros(2, dtype=torch.bool), name=name),
         lambda name: hvd.allreduce(torch.zeros(2), name=name), "not supported"),
        ("allreduce_ of complex64", lambda name: hvd.allreduce_(torch.zeros(2, dtype=torch.complex64), name=name),
         lambda name: hvd.allreduce_(torch.zeros(2), name=name), "not supported"),
        ("grouped_allreduce with a bool member",) + bool_member + ("not supported",),
        ("allgather of a 0-d tensor", lambda name: hvd.allgather(torch.tensor(1.0), name=name),
         lambda name: hvd.allgather(torch.ones(1), name=name), "at least one dimension"),
        ("allgather of bool", lambda name: hvd.allgather(torch.ones(1, dtype=torch.bool), name=name),
         lambda name: hvd.allgather(torch.ones(1), name=name), "not supported"),
        ("grouped_allgather with a 0-d member",) + scalar_gather + ("at least one dimension",),
        ("broadcast from root size()", lambda name: hvd.broadcast(torch.ones(2), n, name=name),
         lambda name: hvd.broadcast(torch.ones(2), 0, name=name), "root %d" % n),
        ("broadcast of complex128", lambda name: hvd.broadcast_(torch.ones(2, dtype=torch.complex128), 0, name=name),
         lambda name: hvd.broadcast_(torch.ones(2), 0, name=name), "not supported"),
        ("alltoall splits summing past dim 0", a2a([2] * n), a2a([1] * n), "sum to"),
        ("alltoall splits as a float tensor", a2a(torch.ones(n)), a2a(int32), "32-bit integer"),
        ("alltoall splits as a 2-d tensor", a2a(torch.ones(1, n, dtype=torch.int32)), a2a([1] * n), "1D splits"),
        ("alltoall with size()+1 splits", a2a([1] * (n + 1), rows=n + 1), a2a([1] * n), "splits for"),
        ("alltoall with a negative split", a2a([-1] + [1] * (n - 1)), a2a([1] * n), "negative"),
        ("alltoall splits of strings", a2a(["x"] * n), a2a([1] * n), "sequence of integers"),
        ("alltoall even split of size()+1 rows", lambda name: hvd.alltoall(torch.ones(n + 1), name=name),
         lambda name: hvd.alltoall(torch.ones(2 * n), name=name), "not divisible"),
        ("reducescatter of a 0-d tensor", lambda name: hvd.reducescatter(torch.tensor(1.0), name=name),
         lambda name: hvd.reducescatter(torch.ones(n), name=name), "at least one dimension"),
        ("reducescatter of bool", lambda name: hvd.reducescatter(torch.ones(n, dtype=torch.bool), name=name),
         lambda name: hvd.reducescatter(torch.ones(n), name=name), "not supported"),
        ("grouped_reducescatter with a 0-d member",) + scalar_scatter + ("at least one dimension",),
    ]


@case()
def refused_on_one_rank(ctx):
    """Every argument error above on one rank (rank 0 and the last rank in turn), named and
    unnamed."""
    n = ctx.size
    for i, (what, bad, good, why) in enumerate(_refusals(n)):
        for j, name in enumerate(("refused.%d" % i, None)):
            culprit = (0, n - 1)[(i + j) % 2]
            _refused(ctx, "%s (%s)" % (what, "named" if name else "unnamed"), culprit,
                     lambda: bad(name), lambda: good(name), why)


@case()
def refused_negative_root(ctx):
    """broadcast with root -1 on one rank: ValueError there, 'rank R refused it' elsewhere."""
    n = ctx.size
    _refused(ctx, "broadcast from root -1 (unnamed)", n - 1, lambda: hvd.broadcast(torch.ones(2), -1),
             lambda: hvd.broadcast(torch.ones(2), 0), "root")


@case()
def unsupported_dtypes_everywhere(ctx):
    """bool and complex tensors raise ValueError at the call on every rank, for every collective."""
    n = ctx.size
    for dtype in (torch.bool, torch.complex64, torch.complex128):
        t = torch.zeros(n, dtype=dtype)
        for what, call in (("allreduce", lambda: hvd.allreduce(t)),
                           ("allreduce_", lambda: hvd.allreduce_(t.clone())),
                           ("allreduce_async", lambda: hvd.allreduce_async(t)),
                           ("grouped_allreduce", lambda: hvd.grouped_allreduce([t])),
                           ("allgather", lambda: hvd.allgather(t)),
                           ("grouped_allgather", lambda: hvd.grouped_allgather([t])),
                           ("broadcast", lambda: hvd.broadcast(t, 0)),
                           ("broadcast_", lambda: hvd.broadcast_(t.clone(), 0)),
                           ("alltoall", lambda: hvd.alltoall(t)),
                           ("reducescatter", lambda: hvd.reducescatter(t)),
                           ("grouped_reducescatter", lambda: hvd.grouped_reducescatter([t]))):
            ctx.raises(ValueError, call, "%s of %s" % (what, dtype), contains=("not supported",), within=WITHIN)
    ctx.next_op_works("unsupported dtypes")


@case()
def invalid_arguments_everywhere(ctx):
    """Arguments no rank could use: ValueError at the call, the job goes on."""
    ctx.raises(ValueError, lambda: hvd.allreduce(torch.ones(1), op=7), "op=7")
    ctx.raises(ValueError, lambda: hvd.allreduce(torch.ones(1), op=hvd.Sum, average=True), "op and average together")
    ctx.raises(ValueError, lambda: hvd.allreduce(torch.ones(1), process_set=hvd.ProcessSet([0])),
               "an unregistered process set", contains=("not registered",))
    ctx.raises(ValueError, lambda: hvd.poll(987654321), "poll of an unknown handle")
    ctx.check(hvd.synchronize(987654321) is None, "synchronize of an unknown handle")
    ctx.next_op_works("invalid arguments")


@case()
def errors_are_runtime_errors(ctx):
    """HorovodInternalError is kolo's KoloInternalError, a RuntimeError, under every name."""
    import kolo
    ctx.check(hvd.HorovodInternalError is hvd.KoloInternalError is kolo.HorovodInternalError, "one class")
    ctx.check(issubclass(hvd.HorovodInternalError, RuntimeError), "not a RuntimeError")
    e = ctx.raises(RuntimeError, lambda: hvd.allreduce(torch.zeros(1 + ctx.rank), name="runtime"), "a mismatch",
                   within=WITHIN, stop=True)
    ctx.check(isinstance(e, hvd.HorovodInternalError), "a mismatch raised %s" % type(e).__name__)
    ctx.next_op_works("a mismatch caught as RuntimeError")


def _submitters(n):
    return [("allreduce", lambda name: hvd.allreduce_async(torch.ones(2), op=hvd.Sum, name=name), [float(n)] * 2),
            ("allgather", lambda name: hvd.allgather_async(torch.ones(1), name=name), [1.0] * n),
            ("broadcast", lambda name: hvd.broadcast_async(torch.ones(2), 0, name=name), [1.0] * 2),
            ("alltoall", lambda name: hvd.alltoall_async(torch.ones(n), name=name), [1.0] * n),
            ("reducescatter", lambda name: hvd.reducescatter_async(torch.ones(n), op=hvd.Sum, name=name), [float(n)]),
            ("grouped allreduce", lambda name: hvd.grouped_allreduce_async([torch.ones(2)], name=name), None)]


@case()
def duplicate_name_in_flight(ctx):
    """A second submission of a name whose op is still in flight on this rank raises ValueError at
    the call (the first goes on and completes). Each op is held in flight by the order of calls:
    ranks 0..n-2 submit 'a' and the last rank 'b', each submits its name again, then each
    submits the other name."""
    r, n = ctx.rank, ctx.size
    last = n - 1
    for kind, submit, want in _submitters(n):
        a, b = "dup.%s.a" % kind, "dup.%s.b" % kind
        mine, theirs = (b, a) if r == last else (a, b)
        h1 = submit(mine)
        ctx.raises(ValueError, lambda: submit(mine), "%s %r again while in flight" % (kind, mine),
                   contains=("duplicate",), within=WITHIN)
        hvd.barrier()  # every rank has tried its duplicate while both ops wait for the others
        h2 = submit(theirs)
        for h in (h1, h2):
            out = hvd.synchronize(h)
            out = out[0] if isinstance(out, (tuple, list)) else out
            if want is not None:
                ctx.check(out.tolist() == want,
                          "%s after the refused duplicate: %s, want %s" % (kind, out.tolist(), want))
    ctx.next_op_works("duplicate names")


@case()
def same_name_different_kinds(ctx):
    """Names are scoped by kind: an allreduce, a broadcast, an allgather, an alltoall and a
    reducescatter named 'k' may be in flight together, and each completes."""
    r, n = ctx.rank, ctx.size
    if r == 0:
        time.sleep(0.2)  # so that the others' ops named 'k' are in flight when they submit the next
    handles = [(kind, submit("k"), want) for kind, submit, want in _submitters(n) if want is not None]
    for kind, h, want in handles:
        out = hvd.synchronize(h)
        out = out[0] if isinstance(out, tuple) else out
        ctx.check(out.tolist() == want, "%s named k: %s, want %s" % (kind, out.tolist(), want))


def _crossed(ctx, what, call, waits_on):
    """call() raises HorovodInternalError within KOLO_STALL_CROSSED_TIME_SECONDS + 2 s, saying
    what the other ranks wait on."""
    limit = ctx.stall_crossed + 2
    ctx.raises(hvd.HorovodInternalError, call, what, contains=("went different ways",) + waits_on,
               within=limit, stop=True)


@case(deadline=30)
def calls_went_different_ways_named(ctx):
    """Rank 0 skips the named allreduce 'skipped' and calls 'next'; the others call 'skipped'.
    Every rank raises within the stall deadline, rank 0 told that the others wait on 'skipped',
    the others that rank 0 waits on 'next'; then named and unnamed ops work."""
    skipped, after = ctx.op_name("skipped"), ctx.op_name("next")
    if ctx.rank == 0:
        _crossed(ctx, "rank 0's 'next'", lambda: hvd.allreduce(torch.ones(1), name=after),
                 ("allreduce.%s" % skipped,))
    else:
        _crossed(ctx, "the others' 'skipped'", lambda: hvd.allreduce(torch.ones(1), name=skipped),
                 ("rank 0 waits on", "allreduce.%s" % after))
    ctx.next_op_works("calls that went different ways")


@case(deadline=30)
def calls_went_different_ways_unnamed(ctx):
    """Rank 0 skips an unnamed allreduce and calls a named broadcast; the others call the unnamed
    allreduce. Every rank raises within the stall deadline; then the ranks number their unnamed
    ops alike again (the next unnamed op works)."""
    after = ctx.op_name("next")
    if ctx.rank == 0:
        _crossed(ctx, "rank 0's broadcast", lambda: hvd.broadcast(torch.ones(1), 0, name=after),
                 ("allreduce \"noname.",))
    else:
        _crossed(ctx, "the others' unnamed allreduce", lambda: hvd.allreduce(torch.ones(1)),
                 ("rank 0 waits on", "broadcast.%s" % after))
    ctx.next_op_works("unnamed calls that went different ways")


@case(deadline=30)
def calls_went_different_ways_kinds(ctx):
    """Named ops are scoped by kind: rank 0's broadcast 'x' and the others' allgather 'x' are
    different ops, which fail as calls that went different ways."""
    name = ctx.op_name("x")
    if ctx.rank == 0:
        _crossed(ctx, "rank 0's broadcast", lambda: hvd.broadcast(torch.ones(1), 0, name=name),
                 ("allgather.%s" % name,))
    else:
        _crossed(ctx, "the others' allgather", lambda: hvd.allgather(torch.ones(1), name=name),
                 ("rank 0 waits on", "broadcast.%s" % name))
    ctx.next_op_works("ops of different kinds under one name")


@case(deadline=30, min_size=3)
def mismatch_process_set(ctx):
    """Ranks that disagree on an op's process set (ranks 0..n-2 submit allreduce 'x' to the
    global set, the last rank to the set [1..n-1]): every rank raises HorovodInternalError within
    a second, naming the op. (Should no rank raise within the stall deadline, the case completes
    both ops itself, so that the job goes on.)"""
    r, n = ctx.rank, ctx.size
    high = hvd.add_process_set(list(range(1, n)))
    try:
        name = ctx.op_name("x")
        ps = high if r == n - 1 else hvd.global_process_set
        t0 = time.monotonic()
        h = hvd.allreduce_async(torch.ones(1), op=hvd.Sum, name=name, process_set=ps)
        limit = ctx.stall_crossed + 2
        while not hvd.poll(h) and time.monotonic() - t0 < limit:
            time.sleep(0.005)
        elapsed = time.monotonic() - t0
        everyone = hvd.allgather_object(hvd.poll(h), name=ctx.op_name("done"))
        if not any(everyone):
            ctx.check(False, "no rank raised within %.0f s: ranks 0..%d wait on global allreduce %r, rank %d "
                      "on the same name in set %s" % (limit, n - 2, name, n - 1, high.ranks))
            extra = None
            if r == n - 1:
                extra = hvd.allreduce_async(torch.ones(1), op=hvd.Sum, name=name)
            elif r == 1:
                extra = hvd.allreduce_async(torch.ones(1), op=hvd.Sum, name=name, process_set=high)
            for hh in (h, extra):
                if hh is not None:
                    hvd.synchronize(hh)
            return
        ctx.raises(hvd.HorovodInternalError, lambda: hvd.synchronize(h), "allreduce %r in different sets" % name,
                   contains=(name,))
        ctx.check(elapsed < WITHIN, "the error came after %.2f s, want < %.1f s" % (elapsed, WITHIN))
    finally:
        hvd.remove_process_set(high)
    ctx.next_op_works("ops in different process sets")


@case()
def mismatch_group_length(ctx):
    """grouped_allreduce of 2 tensors on rank 0 and 3 on the others: every rank raises within a
    second, and the next op works."""
    n = 2 if ctx.rank == 0 else 3
    _mismatch(ctx, "allreduce", "group length", lambda name: hvd.grouped_allreduce([torch.ones(2)] * n, name=name))
