"""hvd.init(comm=...): a world of a subset of the job's ranks, then the whole job again.

Run with 3 ranks, by mpirun (argv[1] == "mpi": comm is an mpi4py communicator) or by kolo run
(comm is a list of ranks). Ranks 0 and 1 join a world of their own and shut it down; then every
rank joins the whole job (comm = every rank) and checks the sizes and an allreduce in each.
"""

import sys

import torch

import kolo.torch as hvd

mode = sys.argv[1]
if mode == "mpi":
    from mpi4py import MPI
    world = MPI.COMM_WORLD
    me = world.Get_rank()
    sub = world.Split(0 if me < 2 else 1, me)
    comm_sub, comm_all = sub, world
else:
    import os
    me = int(os.environ["KOLO_RANK"])
    comm_sub, comm_all = [0, 1], [0, 1, 2]


def fail(msg):
    sys.stderr.write("rank %d FAIL: %s\n" % (me, msg))
    sys.exit(1)


if me < 2:
    hvd.init(comm=comm_sub)
    if (hvd.rank(), hvd.size()) != (me, 2):
        fail("sub-world rank/size %s" % ((hvd.rank(), hvd.size()),))
    got = hvd.allreduce(torch.tensor([float(me + 1)]), op=hvd.Sum).item()
    if got != 3.0:
        fail("sub-world allreduce %s" % got)
    hvd.shutdown()
else:
    try:
        hvd.init(comm=[0, 1])
        fail("init with a comm this rank is not in did not raise")
    except ValueError as e:
        if "not one of them" not in str(e):
            fail("wrong error: %s" % e)
if mode == "mpi":
    world.Barrier()
hvd.init(comm=comm_all)
if (hvd.rank(), hvd.size()) != (me, 3):
    fail("whole-job rank/size %s" % ((hvd.rank(), hvd.size()),))
got = hvd.allreduce(torch.tensor([1.0]), op=hvd.Sum).item()
if got != 3.0:
    fail("whole-job allreduce %s" % got)
hvd.shutdown()
print("ok init comm rank %d" % me)
