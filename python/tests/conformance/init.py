"""init, shutdown, is_initialized, the topology queries, and init(comm=[ranks])."""

import os
import sys

from conformance.device import torch

import kolo.torch as hvd
from conformance.case import case


def _sum_of_ones(name=None):
    return hvd.allreduce(torch.ones(1), op=hvd.Sum, name=name).item()


@case()
def topology(ctx):
    """rank/size/local_*/cross_* on one host; *_built answer what this build has."""
    r, n = ctx.rank, ctx.size
    ctx.check(hvd.is_initialized(), "is_initialized() is False after init")
    ctx.check(hvd.size() == n and hvd.rank() == r, "size %d rank %d" % (hvd.size(), hvd.rank()))
    ctx.check(hvd.local_size() == n and hvd.local_rank() == r,
              "local_rank %d local_size %d, want %d %d" % (hvd.local_rank(), hvd.local_size(), r, n))
    ctx.check(hvd.cross_size() == 1 and hvd.cross_rank() == 0,
              "cross_rank %d cross_size %d, want 0 1" % (hvd.cross_rank(), hvd.cross_size()))
    ctx.check(hvd.is_homogeneous() is True, "is_homogeneous() %r" % (hvd.is_homogeneous(),))
    ctx.check(int(os.environ.get("HOROVOD_RANK", -1)) == r, "HOROVOD_RANK %r" % os.environ.get("HOROVOD_RANK"))
    ctx.check(hvd.global_process_set.size() == n and hvd.global_process_set.rank() == r,
              "global_process_set size %s rank %s" % (hvd.global_process_set.size(), hvd.global_process_set.rank()))
    for f in (hvd.mpi_built, hvd.mpi_enabled, hvd.gloo_built, hvd.gloo_enabled, hvd.nccl_built,
              hvd.ddl_built, hvd.ccl_built, hvd.cuda_built, hvd.rocm_built, hvd.mpi_threads_supported):
        ctx.check(not f(), "%s() = %r" % (f.__name__, f()))


@case()
def shutdown_then_init_again(ctx):
    """After shutdown nothing answers (ValueError naming hvd.init()); init joins the job again,
    twice in a row, and a second init is a no-op."""
    n = ctx.size
    for round_ in range(2):
        hvd.shutdown()
        ctx.check(not hvd.is_initialized(), "is_initialized() after shutdown")
        ctx.raises(ValueError, hvd.rank, "rank() after shutdown", contains=("hvd.init()",))
        # Before the first init this is a ValueError; after shutdown the engine answers with a
        # RuntimeError (HorovodInternalError), as Horovod's ops do (its C++ check throws).
        ctx.raises((ValueError, RuntimeError), lambda: hvd.allreduce(torch.ones(1)),
                   "allreduce after shutdown", contains=("not initialized",))
        hvd.shutdown()  # a second shutdown is a no-op
        hvd.init()
        hvd.init()      # and so is a second init
        ctx.check(hvd.is_initialized() and hvd.size() == n and hvd.rank() == ctx.rank,
                  "round %d: after init again: size %d rank %d" % (round_, hvd.size(), hvd.rank()))
        ctx.check(_sum_of_ones("reinit.%d" % round_) == n, "round %d: named allreduce after init again" % round_)
        ctx.check(_sum_of_ones() == n, "round %d: unnamed allreduce after init again" % round_)


def _sub_world(ctx, comm, others_sit_out):
    """Leaves the job's world; the ranks in comm form a world of their own in which each is ranked
    by its position in comm. The other ranks either sit it out (they must not call
    init(comm=...) with it: trying raises ValueError) or form a world of their own
    (init(comm=others)). Then every rank rejoins the whole job, where the outcome exchange runs."""
    r, n = ctx.rank, ctx.size
    others = [x for x in range(n) if x not in comm]
    hvd.shutdown()
    try:
        if r not in comm and others_sit_out:
            ctx.raises(ValueError, lambda: hvd.init(comm=comm), "init(comm=%s) on rank %d" % (comm, r),
                       contains=("not one of them",))
            return
        mine = comm if r in comm else others
        hvd.init(comm=mine)
        want_rank, want_size = mine.index(r), len(mine)
        ctx.check(hvd.size() == want_size and hvd.rank() == want_rank, "in init(comm=%s): rank %d size %d, want %d %d"
                  % (mine, hvd.rank(), hvd.size(), want_rank, want_size))
        if len(mine) > 1:  # a world of one is init_comm_world_of_one's
            ctx.check(hvd.local_size() == want_size and hvd.local_rank() == want_rank,
                      "in init(comm=%s): local_rank %d local_size %d" % (mine, hvd.local_rank(), hvd.local_size()))
            ctx.check(hvd.cross_size() == 1 and hvd.cross_rank() == 0,
                      "in init(comm=%s): cross_rank %d cross_size %d" % (mine, hvd.cross_rank(), hvd.cross_size()))
        ctx.check(hvd.global_process_set.size() == want_size, "global_process_set.size() in the sub-world")
        got = hvd.allreduce(torch.tensor([float(r)]), op=hvd.Sum, name="subworld").item()
        ctx.check(got == float(sum(mine)), "sum of job ranks in init(comm=%s): %s" % (mine, got))
        got = hvd.allgather(torch.tensor([r]))
        ctx.check(got.tolist() == mine, "allgather of job ranks in init(comm=%s): %s" % (mine, got.tolist()))
        got = hvd.broadcast(torch.tensor([r]), 0, name="subworld.root").item()
        ctx.check(got == mine[0], "broadcast from rank 0 of init(comm=%s) gave job rank %d" % (mine, got))
        hvd.shutdown()
    finally:
        if hvd.is_initialized():
            hvd.shutdown()
        hvd.init()
        ctx.check(hvd.size() == n and hvd.rank() == r, "back in the job: size %d rank %d" % (hvd.size(), hvd.rank()))
        ctx.check(_sum_of_ones("after.subworld") == n, "allreduce in the job after the sub-world")


@case()
def init_comm_subset(ctx):
    """init(comm=[0 .. n-2]): a world of the first n-1 ranks (at 3 ranks [0, 1]), sizes and
    ranks as in that world; the last rank sits it out and joins the whole job again with the
    others afterwards."""
    _sub_world(ctx, list(range(ctx.size - 1)), others_sit_out=True)


@case()
def init_comm_order(ctx):
    """init(comm=[1, 0]): ranks are numbered by their position in comm (at 3 ranks, rank 2 forms
    a world of its own meanwhile)."""
    _sub_world(ctx, [1, 0], others_sit_out=False)


@case()
def init_comm_every_rank(ctx):
    """init(comm=[0 .. n-1]) is the whole job."""
    _sub_world(ctx, list(range(ctx.size)), others_sit_out=True)


@case()
def init_comm_world_of_one(ctx):
    """init(comm=[r]) on every rank: each is rank 0 of a world of one, on one host."""
    r, n = ctx.rank, ctx.size
    hvd.shutdown()
    try:
        hvd.init(comm=[r])
        got = (hvd.rank(), hvd.size(), hvd.local_rank(), hvd.local_size(), hvd.cross_rank(),
               hvd.cross_size(), hvd.is_homogeneous())
        ctx.check(got == (0, 1, 0, 1, 0, 1, True),
                  "init(comm=[%d]): (rank, size, local_rank, local_size, cross_rank, cross_size, "
                  "is_homogeneous) = %s, want (0, 1, 0, 1, 0, 1, True)" % (r, got))
        ctx.check(hvd.allreduce(torch.tensor([r + 1.0]), op=hvd.Sum).item() == r + 1,
                  "allreduce in a world of one")
    finally:
        hvd.shutdown()
        hvd.init()
    ctx.check(hvd.size() == n and _sum_of_ones() == n, "back in the job")


@case()
def init_comm_invalid(ctx):
    """init(comm=...) with something that is not a list of ranks raises ValueError before it
    does anything (the job goes on), without importing mpi4py.MPI: that initializes MPI, which
    aborts the process where no MPI runtime can start (it did on a GPU machine)."""
    had_mpi = "mpi4py.MPI" in sys.modules
    for comm in ([], ["a"], object()):
        ctx.raises(ValueError, lambda: hvd.init(comm=comm), "init(comm=%r)" % (comm,))
    ctx.check(had_mpi or "mpi4py.MPI" not in sys.modules, "init(comm=object()) imported mpi4py.MPI")
    ctx.check(_sum_of_ones() == ctx.size, "allreduce after invalid init(comm=...)")
