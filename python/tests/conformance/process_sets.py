"""Process sets: add_process_set / remove_process_set, every collective within a set, ranks
outside a set, mismatches inside a set, hvd.init(process_sets=...).

The sets: low = ranks [0 .. size-2], high = ranks [1 .. size-1] (at 2 ranks, [0] and [1])."""

from conformance.device import torch

import kolo.torch as hvd
from conformance import reference as ref
from conformance.case import case


def _ranks(n):
    return list(range(n - 1)), list(range(1, n))


def _remove_all(*sets):
    for ps in sets:
        if ps is not None and ps.process_set_id is not None:
            hvd.remove_process_set(ps)


@case()
def registration(ctx):
    """add_process_set is collective and gives every rank the same id; size(), rank() and
    included() answer per set; process_set_by_id and process_sets() list what is registered."""
    r, n = ctx.rank, ctx.size
    lo_ranks, hi_ranks = _ranks(n)
    lo = hvd.add_process_set(lo_ranks)
    hi = hvd.add_process_set(hvd.ProcessSet(list(reversed(hi_ranks))))
    try:
        ids = hvd.allgather_object((lo.process_set_id, hi.process_set_id))
        ctx.check(ids == [ids[0]] * n, "process set ids differ across ranks: %s" % ids)
        ctx.check(lo.process_set_id not in (None, 0) and hi.process_set_id not in (None, 0, lo.process_set_id),
                  "ids %s %s" % (lo, hi))
        ctx.check(lo.ranks == lo_ranks and hi.ranks == hi_ranks, "ranks %s %s" % (lo.ranks, hi.ranks))
        ctx.check(lo.size() == n - 1 and hi.size() == n - 1, "sizes %s %s" % (lo.size(), hi.size()))
        ctx.check(lo.included() == (r in lo_ranks) and hi.included() == (r in hi_ranks), "included()")
        ctx.check(lo.rank() == (lo_ranks.index(r) if r in lo_ranks else None), "low.rank() %s" % lo.rank())
        ctx.check(hi.rank() == (hi_ranks.index(r) if r in hi_ranks else None), "high.rank() %s" % hi.rank())
        from kolo.torch import process_sets as ps_mod
        ctx.check(ps_mod.process_set_by_id(lo.process_set_id) is lo, "process_set_by_id")
        listed = [p.process_set_id for p in ps_mod.process_sets()]
        ctx.check(listed[0] == 0 and lo.process_set_id in listed and hi.process_set_id in listed,
                  "process_sets() lists %s" % listed)
    finally:
        _remove_all(lo, hi)


@case()
def every_collective_in_a_set(ctx):
    """Every collective within the high set (ranks 1..size-1) while rank 0 waits elsewhere, with
    results over the set's members only: allreduce of every dtype and op, grouped_allreduce,
    allgather, grouped_allgather, broadcast (root given as a job rank), alltoall (splits per
    member), reducescatter, grouped_reducescatter, barrier, an allreduce gradient."""
    r, n = ctx.rank, ctx.size
    lo_ranks, hi_ranks = _ranks(n)
    hi = hvd.add_process_set(hi_ranks)
    try:
        m, k = hi.rank(), hi.size()
        if hi.included():
            for dtype in ref.DTYPES:
                for opname, op in ref.OPS:
                    xs = [ref.contribution(q, dtype) for q in range(k)]
                    got = hvd.allreduce(xs[m], op=op, name="ps %s %s" % (opname, ref.short(dtype)), process_set=hi)
                    ctx.equal(got, ref.reduce_ref(op, xs, dtype),
                              "allreduce %s %s in the set" % (opname, ref.short(dtype)))
            got = hvd.grouped_allreduce([torch.ones(2), torch.full((3,), float(r))], op=hvd.Sum, process_set=hi)
            ctx.check(got[0].tolist() == [float(k)] * 2 and got[1].tolist() == [float(sum(hi_ranks))] * 3,
                      "grouped_allreduce in the set: %s" % [g.tolist() for g in got])
            got = hvd.allgather(torch.full((m + 1, 2), float(r)), name="ps ag", process_set=hi)
            want = torch.cat([torch.full((q + 1, 2), float(hi_ranks[q])) for q in range(k)])
            ctx.equal(got, want, "allgather in the set")
            got = hvd.grouped_allgather([torch.tensor([r]), torch.full((2,), float(r))], process_set=hi)
            ctx.check(got[0].tolist() == hi_ranks and got[1].tolist() == [float(q) for q in hi_ranks for _ in range(2)],
                      "grouped_allgather in the set: %s" % [g.tolist() for g in got])
            root = hi_ranks[-1]
            got = hvd.broadcast(torch.tensor([float(r)]), root, name="ps bc", process_set=hi)
            ctx.check(got.item() == root, "broadcast from job rank %d in the set: %s" % (root, got.item()))
            y = torch.tensor([r])
            hvd.broadcast_(y, hi_ranks[0], process_set=hi)
            ctx.check(y.item() == hi_ranks[0], "broadcast_ in the set: %s" % y.item())
            splits = [q + 1 for q in range(k)]  # member m sends q+1 rows to member q
            x = torch.cat([torch.full((q + 1,), float(10 * r + q)) for q in range(k)])
            out, recv = hvd.alltoall(x, splits=splits, name="ps a2a", process_set=hi)
            want = torch.cat([torch.full((m + 1,), float(10 * hi_ranks[q] + m)) for q in range(k)])
            ctx.equal(out, want, "alltoall in the set")
            ctx.check(recv.tolist() == [m + 1] * k, "alltoall received splits in the set: %s" % recv.tolist())
            shape = (2 * k + 1, 2)
            xs = [ref.contribution(q, torch.float32, shape) for q in range(k)]
            got = hvd.reducescatter(xs[m], op=hvd.Sum, name="ps rs", process_set=hi)
            ctx.equal(got, ref.share(ref.reduce_ref(hvd.Sum, xs, torch.float32), m, k), "reducescatter in the set")
            got = hvd.grouped_reducescatter([xs[m]], op=hvd.Average, process_set=hi)
            ctx.equal(got[0], ref.share(ref.reduce_ref(hvd.Average, xs, torch.float32), m, k),
                      "grouped_reducescatter in the set")
            hvd.barrier(process_set=hi)
            x = torch.ones(2, requires_grad=True)
            (hvd.allreduce(x, op=hvd.Sum, name="ps grad", process_set=hi) * (r + 1)).sum().backward()
            ctx.check(x.grad.tolist() == [float(sum(q + 1 for q in hi_ranks))] * 2,
                      "allreduce gradient in the set: %s" % x.grad.tolist())
        # Rank 0 waits here, in a global op, while the set works (sets run independently).
        hvd.broadcast_(torch.zeros(1), hi_ranks[-1], name="ps gate")
    finally:
        _remove_all(hi)


@case()
def sets_run_independently(ctx):
    """The two sets run ops of the same names at the same time; each gets its own members' sum."""
    r, n = ctx.rank, ctx.size
    lo_ranks, hi_ranks = _ranks(n)
    lo = hvd.add_process_set(lo_ranks)
    hi = hvd.add_process_set(hi_ranks)
    try:
        handles = []
        for i in range(5):
            for ps in (lo, hi):
                if ps.included():
                    handles.append((hvd.allreduce_async(torch.tensor([float(r + 1)]), op=hvd.Sum, name="same.%d" % i,
                                                        process_set=ps), float(sum(q + 1 for q in ps.ranks))))
        for h, want in handles:
            ctx.check(hvd.synchronize(h).item() == want, "allreduce in a set gave the wrong sum")
    finally:
        _remove_all(lo, hi)


@case()
def ranks_outside_a_set_get_value_error(ctx):
    """A rank not in a set that calls a collective on it gets ValueError at once; the members
    are not disturbed."""
    r, n = ctx.rank, ctx.size
    lo_ranks, _ = _ranks(n)
    lo = hvd.add_process_set(lo_ranks)
    try:
        if not lo.included():
            for what, call in (("allreduce", lambda: hvd.allreduce(torch.ones(1), process_set=lo)),
                               ("allreduce_", lambda: hvd.allreduce_(torch.ones(1), name="x", process_set=lo)),
                               ("grouped_allreduce", lambda: hvd.grouped_allreduce([torch.ones(1)], process_set=lo)),
                               ("allgather", lambda: hvd.allgather(torch.ones(1), process_set=lo)),
                               ("broadcast", lambda: hvd.broadcast(torch.ones(1), 0, process_set=lo)),
                               ("alltoall", lambda: hvd.alltoall(torch.ones(n - 1), process_set=lo)),
                               ("reducescatter", lambda: hvd.reducescatter(torch.ones(n - 1), process_set=lo)),
                               ("barrier", lambda: hvd.barrier(process_set=lo))):
                ctx.raises(ValueError, call, "%s on a set this rank is not in" % what,
                           contains=("not in process set",), within=1.0)
        else:
            got = hvd.allreduce(torch.ones(1), op=hvd.Sum, name="members", process_set=lo)
            ctx.check(got.item() == len(lo_ranks), "members' allreduce: %s" % got.item())
    finally:
        _remove_all(lo)
    ctx.next_op_works("calls on a set from outside it")


@case(min_size=3)
def mismatch_inside_a_set(ctx):
    """Members of a set that disagree (shape, dtype, op) all get HorovodInternalError within a
    second naming the op; the set's next op works; rank 0, outside, is not involved."""
    r, n = ctx.rank, ctx.size
    _, hi_ranks = _ranks(n)
    hi = hvd.add_process_set(hi_ranks)
    try:
        if hi.included():
            m = hi.rank()
            f = torch.float64 if m else torch.float32
            i = torch.int32 if m else torch.int64
            for what, call in (
                    ("shape", lambda name: hvd.allreduce(torch.ones(2 + m), name=name, process_set=hi)),
                    ("dtype", lambda name: hvd.allreduce(torch.ones(2, dtype=f), name=name, process_set=hi)),
                    ("op", lambda name: hvd.allreduce(torch.ones(2), op=hvd.Max if m else hvd.Sum, name=name,
                                                      process_set=hi)),
                    ("allgather dtype", lambda name: hvd.allgather(torch.ones(1, dtype=i), name=name, process_set=hi))):
                for name in ("set mismatch " + what, None):
                    ctx.raises(hvd.HorovodInternalError, lambda: call(name),
                               "%s mismatch in the set (%s)" % (what, name or "unnamed"),
                               contains=(name or "noname",), within=1.0, stop=True)
                    got = hvd.allreduce(torch.ones(1), op=hvd.Sum, process_set=hi)
                    ctx.require(got.item() == hi.size(),
                                "the set's next op after a %s mismatch: %s" % (what, got.item()))
    finally:
        _remove_all(hi)
    ctx.next_op_works("mismatches inside a set")


@case()
def remove_and_add_again(ctx):
    """remove_process_set invalidates the set (ops on it raise ValueError), a second remove and
    removing the global set return False, and the same ranks can be added again."""
    r, n = ctx.rank, ctx.size
    lo_ranks, _ = _ranks(n)
    lo = hvd.add_process_set(lo_ranks)
    ctx.check(not hvd.remove_process_set(hvd.global_process_set), "removed the global process set")
    ctx.check(hvd.remove_process_set(lo), "remove_process_set returned False")
    ctx.check(lo.process_set_id is None, "a removed set keeps its id %s" % lo.process_set_id)
    ctx.check(not hvd.remove_process_set(lo), "removed a set twice")
    ctx.raises(ValueError, lambda: hvd.allreduce(torch.ones(1), process_set=lo), "allreduce on a removed set",
               contains=("not registered",))
    again = hvd.add_process_set(lo_ranks)
    try:
        ctx.check(again.process_set_id is not None, "adding the ranks again gave no id")
        if again.included():
            got = hvd.allreduce(torch.ones(1), op=hvd.Sum, process_set=again)
            ctx.check(got.item() == len(lo_ranks), "allreduce on the set added again: %s" % got.item())
    finally:
        _remove_all(again)
    ctx.next_op_works("removing and adding a set")


@case()
def add_process_set_errors(ctx):
    """add_process_set raises ValueError on every rank when ranks pass different sets, for a set
    that exists, for all the ranks (the global set), and for a ProcessSet already registered."""
    r, n = ctx.rank, ctx.size
    lo_ranks, hi_ranks = _ranks(n)
    ctx.raises(ValueError, lambda: hvd.add_process_set(lo_ranks if r == 0 else hi_ranks),
               "ranks passing different sets", within=1.0)
    lo = hvd.add_process_set(lo_ranks)
    try:
        ctx.raises(ValueError, lambda: hvd.add_process_set(list(reversed(lo_ranks))), "a set that exists",
                   contains=("already",))
        ctx.raises(ValueError, lambda: hvd.add_process_set(list(range(n))), "every rank", contains=("global",))
        ctx.raises(ValueError, lambda: hvd.add_process_set(lo), "a registered ProcessSet", contains=("registered",))
    finally:
        _remove_all(lo)
    ctx.next_op_works("add_process_set errors")


@case()
def init_with_process_sets(ctx):
    """hvd.init(process_sets=[...]) registers the sets at start-up, with the same ids on every rank."""
    r, n = ctx.rank, ctx.size
    lo_ranks, hi_ranks = _ranks(n)
    lo, hi = hvd.ProcessSet(lo_ranks), hvd.ProcessSet(hi_ranks)
    hvd.shutdown()
    hvd.init(process_sets=[lo, hi])
    try:
        ids = hvd.allgather_object((lo.process_set_id, hi.process_set_id))
        ctx.check(ids == [ids[0]] * n and None not in ids[0], "ids after init(process_sets=...): %s" % ids)
        for ps in (lo, hi):
            if ps.included():
                got = hvd.allreduce(torch.ones(1), op=hvd.Sum, name="init sets", process_set=ps)
                ctx.check(got.item() == n - 1, "allreduce on a set from init: %s" % got.item())
        hvd.barrier()
    finally:
        _remove_all(lo, hi)
    ctx.next_op_works("init(process_sets=...)")
