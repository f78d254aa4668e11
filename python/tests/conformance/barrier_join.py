"""barrier, join, poll and synchronize."""

import time

from conformance.device import torch

import kolo.torch as hvd
from conformance import reference as ref
from conformance.case import case


@case()
def barrier_repeated_and_with_ops_in_flight(ctx):
    """Barriers back to back, and a barrier while every rank has async ops in flight (which then
    complete with the right values)."""
    r, n = ctx.rank, ctx.size
    for _ in range(5):
        hvd.barrier()
    h1 = hvd.allreduce_async(torch.full((3,), float(r)), op=hvd.Sum, name="before barrier")
    h2 = hvd.allgather_async(torch.tensor([r]))
    h3 = hvd.broadcast_async(torch.tensor([r]), n - 1, name="before barrier")
    hvd.barrier()
    ctx.equal(hvd.synchronize(h1), torch.full((3,), float(sum(range(n)))), "allreduce across a barrier")
    ctx.equal(hvd.synchronize(h2), torch.arange(n), "allgather across a barrier")
    ctx.equal(hvd.synchronize(h3), torch.tensor([n - 1]), "broadcast across a barrier")
    hvd.barrier(process_set=hvd.global_process_set)


@case()
def barrier_waits_for_the_last_rank(ctx):
    """No rank leaves a barrier before the last one has entered it."""
    r, n = ctx.rank, ctx.size
    hvd.barrier()
    t0 = time.monotonic()
    if r == n - 1:
        time.sleep(0.3)
    hvd.barrier()
    waited = time.monotonic() - t0
    ctx.check(waited >= 0.25, "left the barrier after %.3f s, before rank %d (0.3 s late) entered it" % (waited, n - 1))


@case()
def join_returns_the_last_rank_everywhere(ctx):
    """Each rank in turn goes on alone after the others joined: its allreduces (named, unnamed,
    async and fused, grouped; the names used before join too) run with the joined ranks
    contributing zeros, Average dividing by size(). join returns that rank on every rank."""
    r, n = ctx.rank, ctx.size
    for last in range(n):
        # Names that have run with every rank before (Horovod's response cache case).
        for name in ("join.a", "join.b"):
            hvd.allreduce(torch.ones(3), name=name)
        if r != last:
            ret = hvd.join()
        else:
            for dtype in (torch.float32, torch.int32, torch.float64, torch.bfloat16):
                x = ref.contribution(r, dtype, (5, 3))
                zeros = [torch.zeros_like(x)] * (n - 1)
                ctx.equal(hvd.allreduce(x, op=hvd.Sum, name="join.a" if dtype == torch.float32 else None),
                          x, "Sum with the others joined %s" % ref.short(dtype))
                ctx.equal(hvd.allreduce(x, op=hvd.Average), ref.reduce_ref(hvd.Average, [x] + zeros, dtype),
                          "Average with the others joined %s" % ref.short(dtype))
            ha = hvd.allreduce_async(torch.full((5,), 2.0), op=hvd.Sum, name="join.b")
            hb = hvd.allreduce_async(torch.full((17, 2), 3.0), op=hvd.Sum, name="join.c")
            ctx.equal(hvd.synchronize(ha), torch.full((5,), 2.0), "fused allreduce with the others joined")
            ctx.equal(hvd.synchronize(hb), torch.full((17, 2), 3.0), "fused allreduce with the others joined")
            got = hvd.grouped_allreduce([torch.ones(2), torch.full((3,), 4.0)], op=hvd.Sum, name="join.g")
            ctx.check([g.tolist() for g in got] == [[1.0] * 2, [4.0] * 3], "grouped_allreduce with the others joined")
            ret = hvd.join()
        ctx.check(ret == last, "join returned %r when rank %d joined last" % (ret, last))
        rets = hvd.allgather_object(ret)
        ctx.check(rets == [last] * n, "join returned %s across ranks" % rets)
    ctx.check(hvd.allreduce(torch.ones(1), op=hvd.Sum).item() == n, "unnamed allreduce after joins")


@case()
def join_refuses_other_collectives(ctx):
    """While a rank has joined, allgather, broadcast, alltoall and reducescatter (and their
    grouped forms) fail with HorovodInternalError on the ranks that issued them, within a
    second, naming the op; then they join, and the job goes on."""
    r, n = ctx.rank, ctx.size
    def calls(root):
        return [("allgather", lambda: hvd.allgather(torch.ones(2, 2), name="j.ag")),
                ("allgather", lambda: hvd.allgather(torch.ones(2, 2))),
                ("allgather", lambda: hvd.grouped_allgather([torch.ones(2), torch.ones(1)], name="j.gag")),
                ("broadcast", lambda: hvd.broadcast(torch.ones(3), root, name="j.bc")),
                ("broadcast", lambda: hvd.broadcast_(torch.ones(3), root)),
                ("alltoall", lambda: hvd.alltoall(torch.ones(2 * n), name="j.a2a")),
                ("reducescatter", lambda: hvd.reducescatter(torch.ones(2 * n), name="j.rs")),
                ("reducescatter", lambda: hvd.grouped_reducescatter([torch.ones(n)]))]
    for first in range(n):
        if r == first:
            ret = hvd.join()
        else:
            for kind, call in calls((first + 1) % n):
                ctx.raises(hvd.HorovodInternalError, call, "%s while rank %d has joined" % (kind, first),
                           contains=(kind, "joined"), within=1.0)
            ret = hvd.join()
        ctx.check(ret != first or n == 1, "join returned the first rank to join (%d)" % first)
        rets = hvd.allgather_object(ret, name="j.rets")
        ctx.check(rets == [rets[0]] * n, "join returned %s across ranks" % rets)
    ctx.next_op_works("collectives refused while a rank had joined")


@case()
def poll_and_synchronize(ctx):
    """poll is False while a peer has not submitted, True once the op is done; synchronize
    returns the result; an unknown handle polls as ValueError and synchronizes as None."""
    r, n = ctx.rank, ctx.size
    if r == 0:
        h = hvd.allreduce_async(torch.ones(2), op=hvd.Sum, name="late peers")
        ctx.check(not hvd.poll(h), "poll was True before the other ranks submitted")
    else:
        time.sleep(0.5)
        h = hvd.allreduce_async(torch.ones(2), op=hvd.Sum, name="late peers")
    deadline = time.monotonic() + 5
    while not hvd.poll(h) and time.monotonic() < deadline:
        time.sleep(0.001)
    ctx.check(hvd.poll(h), "poll still False 5 s after every rank submitted")
    ctx.equal(hvd.synchronize(h), torch.full((2,), float(n)), "synchronize after poll")
    ctx.raises(ValueError, lambda: hvd.poll(h), "poll of a synchronized handle")
    ctx.check(hvd.synchronize(h) is None, "synchronize of a synchronized handle is not None")
    ctx.check(hvd.synchronize(987654321) is None, "synchronize of an unknown handle is not None")
    hs = [hvd.allreduce_async(torch.full((2,), float(i)), op=hvd.Sum, name="sync.%d" % i) for i in range(4)]
    for i in (2, 0, 3, 1):
        ctx.equal(hvd.synchronize(hs[i]), torch.full((2,), float(i * n)), "synchronize out of order #%d" % i)
