"""broadcast_parameters, broadcast_optimizer_state (fresh optimizers, options, model= for sparse
embeddings), broadcast_object, allgather_object."""

from conformance.device import on_device, torch

import kolo.torch as hvd
from conformance.case import case


class Net(torch.nn.Module):
    """Parameters of two dtypes, a BatchNorm (float buffers and an int64 counter), seeded by
    seed so that every rank can build root's copy."""

    def __init__(self, seed):
        super(Net, self).__init__()
        torch.manual_seed(seed)
        self.fc = torch.nn.Linear(3, 4)
        self.bn = torch.nn.BatchNorm1d(4)
        self.out = torch.nn.Linear(4, 2).double()
        with torch.no_grad():
            self.bn.running_mean.uniform_()
            self.bn.running_var.uniform_(1, 2)
            self.bn.num_batches_tracked.fill_(seed)
        on_device(self)

    def forward(self, x):
        return self.out(self.bn(self.fc(x)).double())


def _same(ctx, a, b, what):
    for (k, x), (_, y) in zip(sorted(a.items()), sorted(b.items())):
        ctx.check(x.dtype == y.dtype and torch.equal(x, y), "%s: %s differs from root's" % (what, k))


@case()
def broadcast_parameters(ctx):
    """A state_dict (buffers and integer counters included), named_parameters() and a list of
    tensors all become root's, in place, from each root."""
    r, n = ctx.rank, ctx.size
    for root in range(n):
        model = Net(100 + r)
        hvd.broadcast_parameters(model.state_dict(), root_rank=root)
        _same(ctx, model.state_dict(), Net(100 + root).state_dict(), "state_dict from root %d" % root)
        model = Net(200 + r)
        ids = [id(p) for p in model.parameters()]
        hvd.broadcast_parameters(model.named_parameters(), root_rank=root)
        ctx.check([id(p) for p in model.parameters()] == ids, "named_parameters were replaced, not written")
        want = dict(Net(200 + root).named_parameters())
        for k, p in model.named_parameters():
            ctx.check(torch.equal(p.detach(), want[k].detach()), "named_parameters from root %d: %s" % (root, k))
        tensors = [torch.full((3,), float(r)), torch.tensor([r], dtype=torch.int64),
                   torch.full((2, 2), r, dtype=torch.uint8)]
        hvd.broadcast_parameters(tensors, root_rank=root)
        ctx.check([t.tolist() for t in tensors] == [[float(root)] * 3, [root], [[root] * 2] * 2],
                  "list of tensors from root %d: %s" % (root, [t.tolist() for t in tensors]))


@case()
def broadcast_optimizer_state_fresh(ctx):
    """An optimizer with no state yet (its parameters have no gradient): the state is created
    (one zero-gradient step) without moving the parameters, tensors and options become root's,
    and non-tensor values keep their Python type (Adam's betas stay a tuple)."""
    r, n = ctx.rank, ctx.size
    root = n - 1
    model = Net(7)
    ctx.check(all(p.grad is None for p in model.parameters()), "a new model has gradients")
    opt = torch.optim.Adam(model.parameters(), lr=0.001 * (r + 1), betas=(0.8 + 0.01 * r, 0.999),
                           weight_decay=0.1)
    params = {k: v.detach().clone() for k, v in model.named_parameters()}
    hvd.broadcast_optimizer_state(opt, root_rank=root)
    group = opt.param_groups[0]
    ctx.check(group["lr"] == 0.001 * (root + 1), "lr %r, want root's %r" % (group["lr"], 0.001 * (root + 1)))
    ctx.check(isinstance(group["betas"], tuple) and group["betas"] == (0.8 + 0.01 * root, 0.999),
              "betas %r (%s), want root's tuple" % (group["betas"], type(group["betas"]).__name__))
    ctx.check(all(opt.state.get(p) for p in model.parameters()), "no state created")
    for k, p in model.named_parameters():
        ctx.check(torch.equal(p.detach(), params[k]), "creating the state moved %s" % k)
        ctx.check(p.grad is not None and not p.grad.any(), "%s: gradient after broadcast_optimizer_state "
                  "is not zeros (as Horovod leaves it)" % k)
    states = hvd.allgather_object({k: {s: (v.tolist() if torch.is_tensor(v) else v) for s, v in opt.state[p].items()}
                                   for k, p in model.named_parameters()})
    ctx.check(all(st == states[root] for st in states), "optimizer state differs across ranks after the broadcast")


@case()
def broadcast_optimizer_state_after_steps(ctx):
    """After steps on different data each rank's momentum differs; broadcast_optimizer_state
    makes every rank's root's (and a DistributedOptimizer's state too)."""
    r, n = ctx.rank, ctx.size
    root = 1 % n
    model = Net(11)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    for step in range(2):
        opt.zero_grad()
        g = torch.Generator().manual_seed(10 * r + step)
        model(torch.randn(5, 3, generator=g)).sum().backward()
        opt.step()
    mine = {k: opt.state[p]["momentum_buffer"].clone() for k, p in model.named_parameters()}
    roots = hvd.broadcast_object(mine, root_rank=root, name="momentum of root")
    dist = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters())
    hvd.broadcast_optimizer_state(dist, root_rank=root)
    for k, p in model.named_parameters():
        ctx.check(torch.equal(dist.state[p]["momentum_buffer"], roots[k]), "momentum of %s is not root's" % k)


@case()
def broadcast_optimizer_state_model_with_sparse_embedding(ctx):
    """model= tells which parameters are sparse embeddings: a fresh SGD's state is created with
    sparse gradients for them (so that training with sparse gradients goes on), and every rank
    ends with root's state."""
    r, n = ctx.rank, ctx.size

    class Emb(torch.nn.Module):
        def __init__(self):
            super(Emb, self).__init__()
            torch.manual_seed(3)
            self.emb = torch.nn.Embedding(10, 3, sparse=True)
            self.fc = torch.nn.Linear(3, 1)

        def forward(self, idx):
            return self.fc(self.emb(idx))
    model = on_device(Emb())
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    hvd.broadcast_optimizer_state(opt, root_rank=0, model=model)
    ctx.check(all(opt.state.get(p) for p in model.parameters()), "no state created")
    dist = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters())
    for step in range(2):
        dist.zero_grad()
        model(torch.tensor([r, r + 1, 5])).sum().backward()
        ctx.check(model.emb.weight.grad.is_sparse, "the embedding's gradient is not sparse")
        dist.step()
    weights = hvd.allgather_object([p.detach().tolist() for p in model.parameters()])
    ctx.check(all(w == weights[0] for w in weights), "parameters differ across ranks after training")


@case()
def broadcast_object(ctx):
    """Any picklable object from each root (others pass something else, even None or another
    type); a large one; a named one."""
    r, n = ctx.rank, ctx.size
    for root in range(n):
        obj = {"hello": 123, 0: [1, 2], "root": root, "t": torch.arange(3)} if r == root else (None if r % 2 else [r])
        got = hvd.broadcast_object(obj, root_rank=root)
        ok = isinstance(got, dict) and got["root"] == root and got[0] == [1, 2]
        ctx.check(ok and torch.equal(got["t"], torch.arange(3)), "broadcast_object from root %d: %r" % (root, got))
    big = list(range(50000)) if r == 0 else None
    ctx.check(hvd.broadcast_object(big, name="big") == list(range(50000)), "a large object")
    ctx.check(hvd.broadcast_object(("a", r), root_rank=n - 1, name="tuple") == ("a", n - 1), "a named tuple broadcast")


@case()
def allgather_object(ctx):
    """Every rank's object, in rank order, whatever their types and sizes."""
    r, n = ctx.rank, ctx.size

    def obj(q):
        return [None, {"rank": q}, "x" * (q * 1000), (q, q + 0.5)][q % 4]
    got = hvd.allgather_object(obj(r))
    ctx.check(got == [obj(q) for q in range(n)], "allgather_object: %r" % (got,))
    got = hvd.allgather_object(torch.full((r + 1,), r), name="tensors")
    ctx.check([t.tolist() for t in got] == [[q] * (q + 1) for q in range(n)], "allgather_object of tensors")
