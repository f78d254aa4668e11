"""Scenarios for DistributedOptimizer, the broadcast/gather functions and SyncBatchNorm, run on
every rank of a real job:

    bin/kolo run -np 2 /usr/bin/python3 python/tests/training_worker.py SCENARIO...

Each scenario checks what every rank holds against a reference that one process computes alone on
the concatenated (global) batch, asserts, and prints "ok SCENARIO" on rank 0. Any failed check
raises, which fails the job.
"""

import os
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir))
import kolo.torch as hvd  # noqa: E402

LOCAL_BATCH = 6


def model_fn():
    torch.manual_seed(7)
    return nn.Sequential(nn.Linear(5, 16), nn.Tanh(), nn.Linear(16, 8), nn.Tanh(), nn.Linear(8, 3))


def global_batch(step, n):
    g = torch.Generator()
    g.manual_seed(1000 + step)
    return torch.randn(n, 5, generator=g), torch.randint(0, 3, (n,), generator=g)


def same_on_every_rank(tensors, what):
    """Asserts every rank holds bitwise the same tensors."""
    mine = [t.detach().clone().reshape(-1) for t in tensors]
    flat = torch.cat(mine).unsqueeze(0)
    every = hvd.allgather(flat, name="check." + what)
    for r in range(hvd.size()):
        if not torch.equal(every[r], every[0]):
            raise AssertionError("%s: rank %d differs from rank 0 by up to %g" % (
                what, r, (every[r] - every[0]).abs().max().item()))


def assert_close(got, want, what, rtol, atol):
    for i, (g, w) in enumerate(zip(got, want)):
        if not torch.allclose(g, w, rtol=rtol, atol=atol):
            raise AssertionError("%s: tensor %d differs from the one-process reference by up to %g"
                                 % (what, i, (g - w).abs().max().item()))


def train(steps, passes=1, compression=hvd.Compression.none, groups=None, predivide=1.0,
          op=hvd.Average, opt_cls=torch.optim.SGD, opt_kw=None):
    """Trains with DistributedOptimizer and, beside it, one plain model on the global batch;
    returns (distributed params, reference params)."""
    opt_kw = opt_kw or {"lr": 0.1, "momentum": 0.9}
    size, rank = hvd.size(), hvd.rank()
    model, ref = model_fn(), model_fn()
    opt = hvd.DistributedOptimizer(opt_cls(model.parameters(), **opt_kw),
                                   named_parameters=model.named_parameters(),
                                   compression=compression, backward_passes_per_step=passes,
                                   groups=groups, gradient_predivide_factor=predivide, op=op)
    ref_opt = opt_cls(ref.parameters(), **opt_kw)
    for step in range(steps):
        opt.zero_grad()
        ref_opt.zero_grad()
        for micro in range(passes):
            x, y = global_batch(step * passes + micro, LOCAL_BATCH * size)
            mine = slice(rank * LOCAL_BATCH, (rank + 1) * LOCAL_BATCH)
            F.cross_entropy(model(x[mine]), y[mine]).backward()
            # Each rank's loss is a mean over its share; averaging over ranks gives the mean over
            # the global batch (Sum instead of Average gives size times it).
            scale = float(size) if op == hvd.Sum else 1.0
            (scale * F.cross_entropy(ref(x), y)).backward()
        opt.step()
        ref_opt.step()
    return list(model.parameters()), list(ref.parameters())


def scenario_optimizer():
    got, want = train(steps=5)
    same_on_every_rank(got, "optimizer")
    assert_close(got, want, "optimizer", rtol=1e-5, atol=1e-6)


def scenario_optimizer_adam():
    got, want = train(steps=5, opt_cls=torch.optim.Adam, opt_kw={"lr": 0.01})
    same_on_every_rank(got, "adam")
    assert_close(got, want, "adam", rtol=1e-4, atol=1e-5)


def scenario_backward_passes():
    got, want = train(steps=3, passes=3)
    same_on_every_rank(got, "backward_passes")
    assert_close(got, want, "backward_passes_per_step=3", rtol=1e-5, atol=1e-6)


def scenario_fp16():
    got, want = train(steps=3, compression=hvd.Compression.fp16)
    same_on_every_rank(got, "fp16")
    assert_close(got, want, "fp16 compression", rtol=1e-2, atol=2e-3)
    # And fp16 really went over the wire: a value fp16 cannot hold comes back rounded.
    t = torch.tensor([1.0 + 2.0 ** -12])
    c, ctx = hvd.Compression.fp16.compress(t)
    assert c.dtype == torch.float16 and hvd.Compression.fp16.decompress(c, ctx).dtype == torch.float32
    assert hvd.Compression.fp16.decompress(c, ctx).item() == 1.0


def scenario_bf16():
    got, want = train(steps=3, compression=hvd.Compression.bf16)
    same_on_every_rank(got, "bf16")
    assert_close(got, want, "bf16 compression", rtol=5e-2, atol=1e-2)


def scenario_groups():
    got, want = train(steps=3, groups=2)
    same_on_every_rank(got, "groups=2")
    assert_close(got, want, "groups=2", rtol=1e-5, atol=1e-6)
    model = model_fn()
    ps = list(model.parameters())
    got, want = train(steps=3, groups=[[ps[0], ps[1]]])  # params of another model: not grouped
    assert_close(got, want, "groups=[[...]]", rtol=1e-5, atol=1e-6)


def scenario_predivide_and_sum():
    got, want = train(steps=3, predivide=float(hvd.size()))
    same_on_every_rank(got, "predivide")
    assert_close(got, want, "gradient_predivide_factor", rtol=1e-5, atol=1e-6)
    got, want = train(steps=3, op=hvd.Sum, opt_kw={"lr": 0.02})
    same_on_every_rank(got, "sum")
    assert_close(got, want, "op=Sum", rtol=1e-5, atol=1e-6)


def scenario_sparse():
    """Sparse embedding gradients, reduced by gathering indices and values, and densified."""
    size, rank = hvd.size(), hvd.rank()
    for as_dense in (False, True):
        def make():
            torch.manual_seed(9)
            return nn.Sequential(nn.Embedding(20, 4, sparse=True), nn.Flatten(), nn.Linear(8, 3))
        model, ref = make(), make()
        opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.5),
                                       named_parameters=model.named_parameters(),
                                       sparse_as_dense=as_dense)
        ref_opt = torch.optim.SGD(ref.parameters(), lr=0.5)
        for step in range(3):
            g = torch.Generator()
            g.manual_seed(50 + step)
            x = torch.randint(0, 20, (LOCAL_BATCH * size, 2), generator=g)
            y = torch.randint(0, 3, (LOCAL_BATCH * size,), generator=g)
            mine = slice(rank * LOCAL_BATCH, (rank + 1) * LOCAL_BATCH)
            opt.zero_grad()
            F.cross_entropy(model(x[mine]), y[mine]).backward()
            opt.step()
            ref_opt.zero_grad()
            F.cross_entropy(ref(x), y).backward()
            ref_opt.step()
        what = "sparse_as_dense=%s" % as_dense
        same_on_every_rank(list(model.parameters()), what)
        assert_close(list(model.parameters()), list(ref.parameters()), what, 1e-5, 1e-6)


def scenario_unused_parameter():
    """A parameter that gets no gradient on some ranks (its hook never fires) is still reduced,
    in synchronize(), so no rank waits for it forever."""
    torch.manual_seed(3)
    a, b = nn.Linear(4, 4), nn.Linear(4, 4)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(list(a.parameters()) + list(b.parameters()),
                                                   lr=0.1),
                                   named_parameters=[("a." + k, v) for k, v in a.named_parameters()]
                                   + [("b." + k, v) for k, v in b.named_parameters()])
    for step in range(3):
        opt.zero_grad()
        x = torch.ones(2, 4) * (step + 1)
        out = a(x) if hvd.rank() == 0 else b(a(x))
        out.sum().backward()
        opt.step()
    same_on_every_rank(list(a.parameters()) + list(b.parameters()), "unused")


def scenario_misuse():
    model = model_fn()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   named_parameters=model.named_parameters())
    x, y = global_batch(0, LOCAL_BATCH)
    F.cross_entropy(model(x), y).backward()
    # Every gradient's allreduce started during backward, before step().
    n = len(list(model.parameters()))
    started = [k for k, (h, _) in opt._handles.items() if h is not None]
    assert len(started) == n, "%d of %d allreduces started in backward" % (len(started), n)
    try:
        opt.zero_grad()
    except AssertionError as e:
        assert "zero_grad" in str(e)
    else:
        raise AssertionError("zero_grad between backward and step was allowed")
    try:
        F.cross_entropy(model(x), y).backward()
    except AssertionError as e:
        assert "backward_passes_per_step" in str(e), e
    else:
        raise AssertionError("a second backward before step() was allowed")
    opt.synchronize()
    opt.zero_grad()


def scenario_skip_synchronize():
    got_model, ref = model_fn(), model_fn()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(got_model.parameters(), lr=0.1),
                                   named_parameters=got_model.named_parameters())
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1)
    size, rank = hvd.size(), hvd.rank()
    x, y = global_batch(0, LOCAL_BATCH * size)
    mine = slice(rank * LOCAL_BATCH, (rank + 1) * LOCAL_BATCH)
    F.cross_entropy(got_model(x[mine]), y[mine]).backward()
    opt.synchronize()
    torch.nn.utils.clip_grad_norm_(got_model.parameters(), 0.05)
    with opt.skip_synchronize():
        opt.step()
    F.cross_entropy(ref(x), y).backward()
    torch.nn.utils.clip_grad_norm_(ref.parameters(), 0.05)
    ref_opt.step()
    assert_close(list(got_model.parameters()), list(ref.parameters()), "skip_synchronize",
                 rtol=1e-5, atol=1e-6)


def scenario_broadcast():
    torch.manual_seed(100 + hvd.rank())  # every rank starts different
    model = nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4))
    model(torch.randn(8, 4))  # running stats and num_batches_tracked (int64) differ too
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    same_on_every_rank([t.double() for t in model.state_dict().values()], "broadcast_parameters")
    hvd.broadcast_parameters(list(model.named_parameters()), root_rank=hvd.size() - 1)
    same_on_every_rank(list(model.parameters()), "broadcast_parameters named")

    # Optimizer state: rank 0 trained with its own lr and betas; others are fresh.
    opt = torch.optim.Adam(model.parameters(), lr=0.001, betas=(0.8, 0.9))
    if hvd.rank() == 0:
        opt.param_groups[0]["lr"] = 0.125
        opt.param_groups[0]["betas"] = (0.5, 0.75)
        for _ in range(2):
            opt.zero_grad()
            model(torch.randn(8, 4)).sum().backward()
            opt.step()
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(opt, root_rank=0)
    group = opt.param_groups[0]
    assert group["lr"] == 0.125 and group["betas"] == (0.5, 0.75), group
    assert isinstance(group["betas"], tuple)
    state = [v.double().reshape(-1) for p in model.parameters()
             for _, v in sorted(opt.state[p].items())]
    same_on_every_rank(state, "broadcast_optimizer_state")

    # A fresh optimizer with weight decay: creating its state must not move the parameters.
    torch.manual_seed(5)
    lin = nn.Linear(3, 3)
    before = [p.detach().clone() for p in lin.parameters()]
    hvd.broadcast_optimizer_state(torch.optim.SGD(lin.parameters(), lr=0.5, momentum=0.9,
                                                  weight_decay=0.5), root_rank=0)
    assert_close(list(lin.parameters()), before, "parameters after broadcast_optimizer_state",
                 0, 0)

    # Objects.
    root = hvd.size() - 1
    obj = {"rank": hvd.rank(), "nested": [1, (2, "x")]} if hvd.rank() == root else None
    got = hvd.broadcast_object(obj, root_rank=root)
    assert got == {"rank": root, "nested": [1, (2, "x")]}, got
    got = hvd.allgather_object({"r": hvd.rank(), "pad": "y" * (hvd.rank() * 100)})
    assert got == [{"r": r, "pad": "y" * (r * 100)} for r in range(hvd.size())], got


def scenario_sync_batch_norm():
    """SyncBatchNorm on each rank's share equals BatchNorm on the global batch: outputs, input
    gradients, averaged weight gradients and running statistics; uneven shares too."""
    size, rank = hvd.size(), hvd.rank()
    for shape, counts in (((3, 4), [3] * size), ((2, 3, 5, 5), [2] * size),
                          ((4, 3, 7), [1 + r for r in range(size)])):
        c = shape[1]
        torch.manual_seed(11)
        total = sum(counts)
        x = torch.randn((total, c) + tuple(shape[2:]))
        x = x * 3 + 1
        dy = torch.randn_like(x)
        start = sum(counts[:rank])
        mine = slice(start, start + counts[rank])

        sbn = hvd.SyncBatchNorm(c, momentum=0.3)
        ref = nn.BatchNorm1d(c, momentum=0.3) if x.dim() <= 3 else nn.BatchNorm2d(c, momentum=0.3)
        with torch.no_grad():
            for m in (sbn, ref):
                m.weight.copy_(torch.linspace(0.5, 1.5, c))
                m.bias.copy_(torch.linspace(-1, 1, c))
        xs = x[mine].clone().requires_grad_()
        out = sbn(xs)
        # The per-rank loss weights each sample as the global loss does.
        (out * dy[mine]).sum().backward()
        xr = x.clone().requires_grad_()
        ref_out = ref(xr)
        (ref_out * dy).sum().backward()

        what = "SyncBatchNorm %s counts %s" % (shape, counts)
        assert_close([out], [ref_out[mine]], what + " output", 1e-4, 1e-5)
        assert_close([xs.grad], [xr.grad[mine]], what + " input grad", 1e-4, 1e-5)
        assert_close([sbn.running_mean, sbn.running_var], [ref.running_mean, ref.running_var],
                     what + " running stats", 1e-4, 1e-5)
        # Weight and bias gradients are this rank's share; summed over ranks they are the global.
        gw = hvd.allreduce(torch.cat([sbn.weight.grad, sbn.bias.grad]), op=hvd.Sum,
                           name="check.sbn.%d" % len(shape))
        assert_close([gw], [torch.cat([ref.weight.grad, ref.bias.grad])], what + " weight grad",
                     1e-4, 1e-4)
        sbn.eval()
        ref.eval()
        assert_close([sbn(x[mine])], [ref(x)[mine]], what + " eval", 1e-4, 1e-5)


def scenario_dataloader_fork():
    """A DataLoader with forked workers trains without hanging: workers only index tensors; one
    that calls into kolo gets a clear error instead of a hang."""
    import multiprocessing as mp
    data = torch.utils.data.TensorDataset(torch.randn(64, 5), torch.randint(0, 3, (64,)))
    loader = torch.utils.data.DataLoader(
        data, batch_size=8, num_workers=2,
        multiprocessing_context=mp.get_context("fork"))
    model = model_fn()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   named_parameters=model.named_parameters())
    for epoch in range(2):
        for x, y in loader:
            opt.zero_grad()
            F.cross_entropy(model(x), y).backward()
            opt.step()
    same_on_every_rank(list(model.parameters()), "dataloader")

    class Bad(torch.utils.data.Dataset):
        def __len__(self):
            return 2

        def __getitem__(self, i):
            return hvd.allreduce(torch.ones(1), name="from.child")

    bad = torch.utils.data.DataLoader(Bad(), batch_size=1, num_workers=1,
                                      multiprocessing_context=mp.get_context("fork"))
    try:
        next(iter(bad))
    except Exception as e:
        assert "fork" in str(e).lower(), "unclear error in a forked child: %r" % e
    else:
        raise AssertionError("a forked DataLoader worker called into kolo and got no error")


def main():
    hvd.init()
    torch.set_num_threads(1)
    scenarios = sys.argv[1:]
    for name in scenarios:
        fn = globals().get("scenario_" + name)
        if fn is None:
            raise SystemExit("unknown scenario %r" % name)
        fn()
        if hvd.rank() == 0:
            print("ok " + name, flush=True)


if __name__ == "__main__":
    main()
