"""Every collective of kolo.torch against expected values, on every rank of a real job:

    bin/kolo run -np 3 /usr/bin/python3 python/tests/ops_worker.py [SCENARIO...]

Each rank computes what every rank contributed (inputs are a function of the rank), so the
expected result needs no communication. Failed checks are collected and printed with the rank;
any failure exits 1, which fails the job. Rank 0 prints "ok SCENARIO" for each scenario passed.
"""

import os
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir))
import kolo.torch as hvd  # noqa: E402
from kolo import _lib  # noqa: E402
from kolo.torch import mpi_ops  # noqa: E402

DTYPES = [torch.uint8, torch.int8, torch.int32, torch.int64, torch.float16, torch.bfloat16,
          torch.float32, torch.float64]
FLOATS = (torch.float16, torch.bfloat16, torch.float32, torch.float64)

from scenarios import check, failures  # noqa: E402
import scenarios  # noqa: E402


def close(got, want, dtype):
    """Exact for integers; a tolerance matching the dtype's precision for floats."""
    if got.dtype != dtype or got.shape != want.shape:
        return False
    if dtype in FLOATS:
        tol = {torch.float16: 1e-2, torch.bfloat16: 2e-2}.get(dtype, 1e-6)
        return torch.allclose(got.double(), want.double(), rtol=tol, atol=tol)
    return torch.equal(got.long(), want.long())


def base(dtype, shape=(2, 3)):
    """Small non-negative values, so that a product over 3 ranks fits in int8."""
    return (torch.arange(int(torch.tensor(shape).prod())) % 3).reshape(shape).to(dtype)


def contribution(r, dtype, shape=(2, 3)):
    return (base(dtype, shape).double() * (r + 1)).to(dtype)


def expected_reduce(op, n, dtype, shape=(2, 3), pre=1.0, post=1.0):
    xs = torch.stack([contribution(r, torch.float64, shape) for r in range(n)])
    if op in (hvd.Sum, hvd.Average):
        out = (xs * pre).sum(0)
    elif op == hvd.Min:
        out = (xs * pre).min(0).values
    elif op == hvd.Max:
        out = (xs * pre).max(0).values
    else:
        out = (xs * pre).prod(0)
    if op == hvd.Average:
        out = out / n if dtype in FLOATS else torch.div(out, n, rounding_mode="trunc")
    return (out * post).to(dtype)


OPS = [("Sum", hvd.Sum), ("Average", hvd.Average), ("Min", hvd.Min), ("Max", hvd.Max),
       ("Product", hvd.Product)]


def scenario_topology(r, n):
    check(hvd.is_initialized(), "is_initialized")
    check(hvd.size() == n and 0 <= hvd.rank() < n, "size %d rank %d" % (hvd.size(), hvd.rank()))
    check(hvd.local_size() == n and hvd.local_rank() == r, "local %d/%d" % (hvd.local_rank(), hvd.local_size()))
    check(hvd.cross_size() == 1 and hvd.cross_rank() == 0, "cross %d/%d" % (hvd.cross_rank(), hvd.cross_size()))
    check(hvd.is_homogeneous(), "is_homogeneous")
    check(int(os.environ["HOROVOD_RANK"]) == r, "HOROVOD_RANK")
    check(not hvd.mpi_built() and not hvd.gloo_built() and not hvd.nccl_built() and not hvd.cuda_built()
          and not hvd.rocm_built() and not hvd.ddl_built() and not hvd.ccl_built() and not hvd.mpi_enabled()
          and not hvd.gloo_enabled() and not hvd.mpi_threads_supported(), "*_built answer truthfully")
    check(hvd.global_process_set.size() == n and hvd.global_process_set.rank() == r, "global_process_set")


def scenario_allreduce(r, n):
    for dtype in DTYPES:
        for opname, op in OPS:
            what = "allreduce %s %s" % (opname, dtype)
            want = expected_reduce(op, n, dtype)
            x = contribution(r, dtype)
            before = x.clone()
            got = hvd.allreduce(x, op=op, name=what)
            check(close(got, want, dtype), "%s: got %s want %s" % (what, got.tolist(), want.tolist()))
            check(torch.equal(x, before), what + ": input modified")
            y = contribution(r, dtype)
            ptr = y.data_ptr()
            out = hvd.allreduce_(y, op=op, name=what + " in place")
            check(out is y and y.data_ptr() == ptr and close(y, want, dtype), what + " in place: %s" % y.tolist())
            h = hvd.allreduce_async(contribution(r, dtype), op=op, name=what + " async")
            check(close(hvd.synchronize(h), want, dtype), what + " async")
            y = contribution(r, dtype)
            h = hvd.allreduce_async_(y, op=op, name=what + " async_")
            while not hvd.poll(h):
                time.sleep(0.0005)
            check(hvd.synchronize(h) is y and close(y, want, dtype), what + " async_")
        if dtype in FLOATS:
            want = expected_reduce(hvd.Sum, n, dtype, pre=3.0, post=0.5)
            got = hvd.allreduce(contribution(r, dtype), op=hvd.Sum, prescale_factor=3.0, postscale_factor=0.5)
            check(close(got, want, dtype), "prescale/postscale %s: %s vs %s" % (dtype, got.tolist(), want.tolist()))
    # The handle keeps a temporary input alive until synchronize: drop every other reference and
    # churn the allocator while the op may still be in flight.
    import gc
    h = hvd.allreduce_async(contribution(r, torch.float64, (64, 64)), op=hvd.Sum, name="lifetime")
    gc.collect()
    junk = [torch.full((64, 64), -1.0, dtype=torch.float64) for _ in range(8)]
    got = hvd.synchronize(h)
    check(close(got, expected_reduce(hvd.Sum, n, torch.float64, (64, 64)), torch.float64) and len(junk) == 8,
          "async input kept alive until synchronize")
    # Default op is Average; the deprecated average= still works.
    got = hvd.allreduce(contribution(r, torch.float32), name="default op")
    check(close(got, expected_reduce(hvd.Average, n, torch.float32), torch.float32), "default op is Average")
    got = hvd.allreduce(contribution(r, torch.float32), average=False, name="average=False")
    check(close(got, expected_reduce(hvd.Sum, n, torch.float32), torch.float32), "average=False is Sum")
    # Empty and scalar tensors.
    check(hvd.allreduce(torch.zeros(0), name="empty").shape == (0,), "empty allreduce")
    got = hvd.allreduce(torch.tensor(float(r + 1)), op=hvd.Sum, name="scalar")
    check(got.shape == () and got.item() == n * (n + 1) / 2, "scalar allreduce %s" % got)


def scenario_noncontiguous(r, n):
    want = expected_reduce(hvd.Sum, n, torch.float32, shape=(3, 2)).t()
    x = contribution(r, torch.float32, (3, 2)).t()  # (2, 3), not contiguous
    assert not x.is_contiguous()
    got = hvd.allreduce(x, op=hvd.Sum, name="nc")
    check(close(got, want, torch.float32), "non-contiguous allreduce")
    ptr = x.data_ptr()
    out = hvd.allreduce_(x, op=hvd.Sum, name="nc in place")
    check(out is x and x.data_ptr() == ptr and not x.is_contiguous() and close(x, want, torch.float32),
          "non-contiguous allreduce_ writes into the caller's tensor: %s" % x.tolist())
    y = torch.zeros(4, 3)[:, 1]  # a strided view: the write must land in the base tensor
    y.fill_(r + 1)
    hvd.broadcast_(y, 0, name="nc bcast")
    check(torch.equal(y, torch.ones(4)), "non-contiguous broadcast_")
    g = hvd.allgather(contribution(r, torch.float32, (3, 2)).t(), name="nc gather")
    want = torch.cat([contribution(s, torch.float32, (3, 2)).t() for s in range(n)])
    check(torch.equal(g, want), "non-contiguous allgather")


def scenario_grouped(r, n):
    dts = [torch.float32, torch.int64, torch.bfloat16]
    shapes = [(2, 3), (4,), (1, 1)]
    want = [expected_reduce(hvd.Sum, n, d, s) for d, s in zip(dts, shapes)]
    xs = [contribution(r, d, s) for d, s in zip(dts, shapes)]
    got = hvd.grouped_allreduce(xs, op=hvd.Sum, name="grp")
    check(all(close(g, w, d) for g, w, d in zip(got, want, dts)), "grouped_allreduce")
    got = hvd.synchronize(hvd.grouped_allreduce_async([contribution(r, d, s) for d, s in zip(dts, shapes)],
                                                      op=hvd.Sum))
    check(all(close(g, w, d) for g, w, d in zip(got, want, dts)), "grouped_allreduce_async (unnamed)")
    ys = [contribution(r, d, s) for d, s in zip(dts, shapes)]
    out = hvd.grouped_allreduce_(ys, op=hvd.Sum, name="grp_")
    check(all(o is y and close(y, w, d) for o, y, w, d in zip(out, ys, want, dts)), "grouped_allreduce_")
    ys = [contribution(r, d, s) for d, s in zip(dts, shapes)]
    h = hvd.grouped_allreduce_async_(ys, op=hvd.Sum, name="grp async_")
    hvd.synchronize(h)
    check(all(close(y, w, d) for y, w, d in zip(ys, want, dts)), "grouped_allreduce_async_")

    parts = [torch.full((r + 1, 2), r, dtype=torch.int32), torch.full((1,), r + 0.5, dtype=torch.float64)]
    got = hvd.grouped_allgather(parts, name="gg")
    want0 = torch.cat([torch.full((s + 1, 2), s, dtype=torch.int32) for s in range(n)])
    want1 = torch.tensor([s + 0.5 for s in range(n)], dtype=torch.float64)
    check(torch.equal(got[0], want0) and torch.equal(got[1], want1), "grouped_allgather")
    got = hvd.synchronize(hvd.grouped_allgather_async(parts))
    check(torch.equal(got[0], want0) and torch.equal(got[1], want1), "grouped_allgather_async")

    rows = 2 * n + 1
    ts = [contribution(r, torch.float32, (rows, 2)), contribution(r, torch.int32, (rows,))]
    got = hvd.grouped_reducescatter(ts, op=hvd.Sum, name="grs")
    for g, t, d in zip(got, ts, [torch.float32, torch.int32]):
        full = expected_reduce(hvd.Sum, n, d, tuple(t.shape))
        check(close(g, share(full, r, n), d), "grouped_reducescatter %s" % d)
    got = hvd.synchronize(hvd.grouped_reducescatter_async(ts, op=hvd.Average))
    full = expected_reduce(hvd.Average, n, torch.float32, (rows, 2))
    check(close(got[0], share(full, r, n), torch.float32), "grouped_reducescatter_async Average")


def share(full, r, n):
    """Rank r's rows of full when split as Horovod splits: the first dim0 % n ranks get one more."""
    d0 = full.shape[0]
    counts = [d0 // n + (1 if s < d0 % n else 0) for s in range(n)]
    start = sum(counts[:r])
    return full[start:start + counts[r]]


def scenario_allgather(r, n):
    for dtype in DTYPES:
        x = torch.full((r + 1, 2), r + 1).to(dtype)
        want = torch.cat([torch.full((s + 1, 2), s + 1).to(dtype) for s in range(n)])
        check(torch.equal(hvd.allgather(x, name="ag %s" % dtype), want), "allgather %s" % dtype)
        check(torch.equal(hvd.synchronize(hvd.allgather_async(x)), want), "allgather_async unnamed %s" % dtype)
    got = hvd.allgather(torch.zeros(0, 3), name="ag empty")
    check(got.shape == (0, 3), "allgather of empty tensors: %s" % (got.shape,))
    # Rank 0 sends no rows, the others do.
    x = torch.full((0 if r == 0 else 2, 1), r, dtype=torch.int64)
    want = torch.cat([torch.full((0 if s == 0 else 2, 1), s, dtype=torch.int64) for s in range(n)])
    check(torch.equal(hvd.allgather(x), want), "allgather with an empty rank")


def scenario_broadcast(r, n):
    root = n - 1
    for dtype in DTYPES:
        x = contribution(r, dtype)
        want = contribution(root, dtype)
        before = x.clone()
        check(torch.equal(hvd.broadcast(x, root, name="bc %s" % dtype), want) and torch.equal(x, before),
              "broadcast %s" % dtype)
        y = contribution(r, dtype)
        check(hvd.broadcast_(y, root, name="bc_ %s" % dtype) is y and torch.equal(y, want), "broadcast_ %s" % dtype)
        check(torch.equal(hvd.synchronize(hvd.broadcast_async(x, root)), want), "broadcast_async %s" % dtype)
        y = contribution(r, dtype)
        hvd.synchronize(hvd.broadcast_async_(y, root))
        check(torch.equal(y, want), "broadcast_async_ %s" % dtype)


def scenario_alltoall(r, n):
    for dtype in DTYPES:
        # Even split: 2 rows for each destination d, holding 10*r + d.
        x = torch.tensor([[10 * r + d] * 3 for d in range(n) for _ in range(2)]).to(dtype)
        got = hvd.alltoall(x, name="a2a %s" % dtype)
        want = torch.tensor([[10 * s + r] * 3 for s in range(n) for _ in range(2)]).to(dtype)
        check(torch.equal(got, want), "alltoall %s" % dtype)
    # Uneven splits: rank r sends d+1 rows to rank d, so it receives r+1 rows from everyone.
    x = torch.cat([torch.full((d + 1,), 10 * r + d, dtype=torch.float32) for d in range(n)])
    got, recv = hvd.alltoall(x, splits=[d + 1 for d in range(n)], name="a2a splits")
    want = torch.cat([torch.full((r + 1,), 10 * s + r, dtype=torch.float32) for s in range(n)])
    check(torch.equal(got, want), "alltoall with splits: %s" % got.tolist())
    check(recv.dtype == torch.int32 and recv.tolist() == [r + 1] * n, "received splits %s" % recv)
    out, recv = hvd.synchronize(hvd.alltoall_async(x, splits=torch.tensor([d + 1 for d in range(n)])))
    check(torch.equal(out, want) and recv.tolist() == [r + 1] * n, "alltoall_async with a splits tensor")


def scenario_reducescatter(r, n):
    for dtype in DTYPES:
        for opname, op in OPS:
            shape = (2 * n + 1, 2)
            full = expected_reduce(op, n, dtype, shape)
            got = hvd.reducescatter(contribution(r, dtype, shape), op=op, name="rs %s %s" % (opname, dtype))
            check(close(got, share(full, r, n), dtype), "reducescatter %s %s: %s" % (opname, dtype, got.tolist()))
    full = expected_reduce(hvd.Sum, n, torch.float64, (n, 3), pre=2.0, post=0.25)
    got = hvd.synchronize(hvd.reducescatter_async(contribution(r, torch.float64, (n, 3)), op=hvd.Sum,
                                                  prescale_factor=2.0, postscale_factor=0.25))
    check(close(got, share(full, r, n), torch.float64), "reducescatter_async with scale factors")
    got = hvd.reducescatter(contribution(r, torch.float32, (2 * n, 2)))
    check(close(got, share(expected_reduce(hvd.Average, n, torch.float32, (2 * n, 2)), r, n), torch.float32),
          "reducescatter defaults to Average")


def scenario_barrier_join(r, n):
    for _ in range(3):
        hvd.barrier()
    # Rank 0 has one more batch than the others: its allreduce goes on with the joined ranks
    # contributing nothing, and every rank learns that rank 0 joined last.
    if r == 0:
        got = hvd.allreduce(torch.full((3,), 5.0), op=hvd.Sum, name="after others joined")
        check(torch.equal(got, torch.full((3,), 5.0)), "allreduce while others joined: %s" % got.tolist())
    last = hvd.join()
    check(last == 0, "join returned %r, want 0" % (last,))
    got = hvd.allreduce(torch.ones(1), op=hvd.Sum, name="after join")
    check(got.item() == n, "allreduce after join")


def scenario_autograd(r, n):
    x = contribution(r, torch.float64).requires_grad_()
    y = hvd.allreduce(x, op=hvd.Sum, name="ag.allreduce")
    (y * (torch.arange(6.0, dtype=torch.float64).reshape(2, 3))).sum().backward()
    # d/dx of sum(w * allreduce_sum(x)) is allreduce_sum(w) = n * w (every rank has the same w).
    check(torch.allclose(x.grad, n * torch.arange(6.0, dtype=torch.float64).reshape(2, 3)), "allreduce grad")

    x = torch.full((r + 1, 2), float(r)).requires_grad_()
    g = hvd.allgather(x, name="ag.allgather")
    w = torch.arange(float(g.numel())).reshape(g.shape)
    (g * w).sum().backward()
    offset = sum(s + 1 for s in range(r))
    check(torch.allclose(x.grad, w[offset:offset + r + 1]), "allgather grad: %s" % x.grad.tolist())

    x = torch.full((3,), float(r)).requires_grad_()
    b = hvd.broadcast(x, 0, name="ag.broadcast")
    (b * 2).sum().backward()
    want = torch.full((3,), 2.0) if r == 0 else torch.zeros(3)
    check(torch.allclose(x.grad, want), "broadcast grad on rank %d: %s" % (r, x.grad.tolist()))

    xs = [torch.ones(2, requires_grad=True), torch.ones(3, dtype=torch.float64, requires_grad=True)]
    outs = hvd.grouped_allreduce(xs, op=hvd.Average, name="ag.grouped")
    sum(o.sum() for o in outs).backward()
    check(all(torch.allclose(t.grad, torch.ones_like(t)) for t in xs), "grouped_allreduce grad")

    x = torch.arange(float(2 * n)).requires_grad_()
    out = hvd.alltoall(x, name="ag.alltoall")
    (out * (r + 1)).sum().backward()
    # Row 2d+k went to rank d, whose loss weighs it by d+1.
    want = torch.tensor([float(d + 1) for d in range(n) for _ in range(2)])
    check(torch.allclose(x.grad, want), "alltoall grad: %s" % x.grad.tolist())

    x = torch.ones(n, 2, requires_grad=True)
    out = hvd.reducescatter(x, op=hvd.Sum, name="ag.reducescatter")
    (out * (r + 1)).sum().backward()
    # Horovod's convention, as for allreduce: the gradient of a Sum is the set's size times the
    # gathered output gradient (an Average's is the gathered gradient itself).
    want = torch.tensor([[float(n * (s + 1))] * 2 for s in range(n)])
    check(torch.allclose(x.grad, want), "reducescatter Sum grad: %s" % x.grad.tolist())
    x = torch.ones(n, 2, requires_grad=True)
    out = hvd.reducescatter(x, op=hvd.Average, name="ag.reducescatter.avg")
    (out * (r + 1)).sum().backward()
    want = torch.tensor([[float(s + 1)] * 2 for s in range(n)])
    check(torch.allclose(x.grad, want), "reducescatter Average grad: %s" % x.grad.tolist())


def scenario_errors(r, n):
    # Ranks disagree on a shape: every rank gets a catchable HorovodInternalError naming the op,
    # and the job goes on.
    try:
        hvd.allreduce(torch.zeros(2 + r), name="mismatch")
        check(n == 1, "mismatched shapes did not raise")
    except hvd.HorovodInternalError as e:
        check("mismatch" in str(e), "error does not name the op: %s" % e)
        check(isinstance(e, RuntimeError) and isinstance(e, hvd.KoloInternalError), "error class")
        # The engine says the ranks disagreed (kolo_error_kind), which kolo.tensorflow raises as
        # Horovod's precondition error; to torch it is the HorovodInternalError it always was.
        check(isinstance(e, _lib.KoloMismatchError), "a mismatch is not a KoloMismatchError: %r" % e)
    got = hvd.allreduce(torch.ones(1), op=hvd.Sum, name="after mismatch")
    check(got.item() == n, "allreduce after a failed op")
    # Arguments wrong on this rank raise ValueError at the call, as Horovod's invalid arguments do.
    for bad, exc in [(lambda: hvd.allreduce(torch.zeros(2, dtype=torch.bool)), ValueError),
                     (lambda: hvd.allreduce(torch.zeros(2, dtype=torch.complex64)), ValueError),
                     (lambda: hvd.reducescatter(torch.zeros(2 * n), op=hvd.Adasum), hvd.HorovodInternalError),
                     (lambda: hvd.allreduce(torch.zeros(2), op=hvd.Sum, average=True), ValueError),
                     (lambda: hvd.allgather(torch.tensor(1.0)), ValueError),
                     (lambda: hvd.broadcast(torch.zeros(1), n), ValueError),
                     (lambda: hvd.alltoall(torch.zeros(n + 1), splits=[1] * (n + 1)), ValueError)]:
        try:
            bad()
            failures.append("no %s from a bad call" % exc.__name__)
        except exc:
            pass
    check(hvd.synchronize(123456789) is None, "synchronize of an unknown handle returns None")


def scenario_leaks(r, n):
    check(not mpi_ops._handle_map, "handle map not empty: %s" % mpi_ops._handle_map)
    check(_lib.C.kolo_handles() == 0, "engine holds %d handles" % _lib.C.kolo_handles())


SCENARIOS = [
    ("topology", scenario_topology),
    ("allreduce", scenario_allreduce),
    ("noncontiguous", scenario_noncontiguous),
    ("grouped", scenario_grouped),
    ("allgather", scenario_allgather),
    ("broadcast", scenario_broadcast),
    ("alltoall", scenario_alltoall),
    ("reducescatter", scenario_reducescatter),
    ("autograd", scenario_autograd),
    ("errors", scenario_errors),
    ("barrier_join", scenario_barrier_join),
    ("leaks", scenario_leaks),
]


def main():
    want = set(sys.argv[1:])
    hvd.init()
    r, n = hvd.rank(), hvd.size()
    scenarios.run(SCENARIOS, r, lambda fn: fn(r, n), want)


if __name__ == "__main__":
    main()
