"""Process sets through kolo.torch on every rank of a 3-rank job:

    bin/kolo run -np 3 /usr/bin/python3 python/tests/process_sets_worker.py [init]

Sets {0,1} and {1,2}: each runs while the rank outside it is blocked elsewhere, every op takes
process_set=, errors are clear, removal is collective. With "init", the sets come from
hvd.init(process_sets=[...]). Rank 0 prints "ok SCENARIO" per scenario passed; any failure exits 1.
"""

import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir))
import kolo.torch as hvd  # noqa: E402
from kolo import _lib  # noqa: E402

from scenarios import check, failures  # noqa: E402
import scenarios  # noqa: E402


def raises(exc, fn, want):
    try:
        fn()
    except exc as e:
        check(want in str(e), "%s: %r lacks %r" % (exc.__name__, str(e), want))
        return
    failures.append("no %s (%s)" % (exc.__name__, want))


def scenario_registered(r, a, b):
    check(a.process_set_id not in (None, 0) and b.process_set_id not in (None, 0, a.process_set_id),
          "ids %s %s" % (a, b))
    check(a.ranks == [0, 1] and b.ranks == [1, 2], "ranks %s %s" % (a, b))
    check(a.included() == (r != 2) and b.included() == (r != 0), "included")
    check(a.size() == 2 and b.size() == 2, "size")
    check(b.rank() == (None if r == 0 else r - 1), "rank in b: %s" % b.rank())
    check(hvd.global_process_set.size() == 3 and hvd.global_process_set.rank() == r, "global set")


def scenario_independent(r, a, b):
    # Set a runs while rank 2 waits in a global broadcast that rank 0 joins only afterwards.
    gate = torch.zeros(1)
    if r != 2:
        for i in range(10):
            got = hvd.allreduce(torch.tensor([float(r + 1)]), op=hvd.Sum, name="x%d" % i, process_set=a)
            check(got.item() == 3, "set a allreduce: %s" % got)
    hvd.broadcast_(gate, 0, name="gate.a")
    # Set b, with the same names, while rank 0 waits in a global broadcast rank 1 joins afterwards.
    if r != 0:
        for i in range(10):
            got = hvd.allreduce(torch.tensor([float(r + 1)]), op=hvd.Sum, name="x%d" % i, process_set=b)
            check(got.item() == 5, "set b allreduce: %s" % got)
    hvd.broadcast_(gate, 1, name="gate.b")


def scenario_ops(r, a, b):
    if b.included():
        me = b.rank()
        got = hvd.allreduce(torch.tensor([float(r)]), process_set=b)  # Average over the set
        check(got.item() == 1.5, "average in b: %s" % got)
        got = hvd.broadcast(torch.tensor([float(r)]), 2, process_set=b)
        check(got.item() == 2, "broadcast from job rank 2 in b: %s" % got)
        got = hvd.allgather(torch.full((me + 1, 2), float(r)), process_set=b)
        check(got.tolist() == [[1, 1], [2, 2], [2, 2]], "allgather in b: %s" % got.tolist())
        out, splits = hvd.alltoall(torch.tensor([10.0 * r, 10.0 * r + 1, 10.0 * r + 2]), splits=[1, 2], process_set=b)
        want = [[10.0, 20.0], [11.0, 12.0, 21.0, 22.0]][me]
        check(out.tolist() == want and splits.tolist() == [1, 2][me:me + 1] * 2, "alltoall in b: %s %s" % (out.tolist(), splits.tolist()))
        got = hvd.reducescatter(torch.tensor([1.0, 2.0, 3.0]), op=hvd.Sum, process_set=b)
        check(got.tolist() == [[2.0, 4.0], [6.0]][me], "reducescatter in b: %s" % got.tolist())
        gs = hvd.grouped_allreduce([torch.ones(2), torch.full((3,), float(r))], op=hvd.Sum, process_set=b)
        check(gs[0].tolist() == [2, 2] and gs[1].tolist() == [3, 3, 3], "grouped in b: %s" % gs)
        x = torch.ones(2, requires_grad=True)
        (hvd.allreduce(x, op=hvd.Sum, name="grad", process_set=b) * (r + 1)).sum().backward()
        check(x.grad.tolist() == [5, 5], "allreduce gradient in b: %s" % x.grad.tolist())
        hvd.barrier(process_set=b)
    if a.included():
        got = hvd.broadcast(torch.tensor([float(r)]), 1, name="bc", process_set=a)
        check(got.item() == 1, "broadcast from job rank 1 in a: %s" % got)
        # unnamed ops are named per set: ranks 0 and 1 agree though rank 1 also names b's ops
        got = hvd.allreduce(torch.ones(3), op=hvd.Sum, process_set=a)
        check(got.tolist() == [2, 2, 2], "unnamed allreduce in a: %s" % got.tolist())
    else:
        # as Horovod: a rank outside the set passed an invalid argument
        raises(ValueError, lambda: hvd.allreduce(torch.ones(1), process_set=a),
               "this rank is not in process set %d" % a.process_set_id)


def scenario_errors(r, a, b):
    raises(ValueError, lambda: hvd.add_process_set([0, 2] if r == 0 else [1, 2]),
           "rank 0 sent add process set [0 2]; ranks 1,2 sent add process set [1 2]")
    raises(ValueError, lambda: hvd.add_process_set([1, 0]), "already has these ranks")
    raises(ValueError, lambda: hvd.add_process_set([0, 1, 2]), "use the global process set")
    raises(ValueError, lambda: hvd.add_process_set(a), "registered already")
    got = hvd.allreduce(torch.ones(1), op=hvd.Sum, name="after errors")
    check(got.item() == 3, "the job goes on: %s" % got)


def scenario_remove(r, a, b):
    check(not hvd.remove_process_set(hvd.global_process_set), "removed the global set")
    check(hvd.remove_process_set(a) and hvd.remove_process_set(b), "remove failed")
    check(a.process_set_id is None and b.process_set_id is None, "removed sets still have ids")
    check(not hvd.remove_process_set(b), "removed twice")
    raises(ValueError, lambda: hvd.allreduce(torch.ones(1), process_set=b), "not registered")
    c = hvd.add_process_set([0, 2])
    if c.included():
        got = hvd.allreduce(torch.ones(1), op=hvd.Sum, process_set=c)
        check(got.item() == 2, "set added after removals: %s" % got)
    check(hvd.remove_process_set(c), "remove c")


def scenario_leaks(r, a, b):
    from kolo.torch import mpi_ops
    check(not mpi_ops._handle_map, "handle map not empty")
    check(_lib.C.kolo_handles() == 0, "engine holds %d handles" % _lib.C.kolo_handles())


SCENARIOS = [
    ("registered", scenario_registered),
    ("independent", scenario_independent),
    ("ops", scenario_ops),
    ("errors", scenario_errors),
    ("remove", scenario_remove),
    ("leaks", scenario_leaks),
]


def main():
    if "init" in sys.argv[1:]:
        a, b = hvd.ProcessSet([0, 1]), hvd.ProcessSet([2, 1])
        hvd.init(process_sets=[a, b])
    else:
        hvd.init()
        a = hvd.add_process_set([1, 0])
        b = hvd.add_process_set(hvd.ProcessSet([2, 1]))
    r = hvd.rank()
    if hvd.size() != 3:
        sys.exit("needs 3 ranks")
    scenarios.run(SCENARIOS, r, lambda fn: fn(r, a, b))


if __name__ == "__main__":
    main()
