"""DistributedOptimizer: gradients are the average (or op) of every rank's gradients, with
named_parameters or without, backward_passes_per_step, groups, compression, op=Sum and Adasum,
gradient_predivide_factor, process_set, unused parameters, synchronize/skip_synchronize.

Every rank's data is a function of its rank, so each rank computes every rank's local gradients
itself (on a copy of the model) and checks kolo's result against their average."""

import warnings

from conformance.device import on_device, torch

import kolo.torch as hvd
from conformance import reference as ref
from conformance.case import case

LR = 0.1


class Net(torch.nn.Module):
    """Two layers, and one more (extra) that only rank 0 uses when asked to."""

    def __init__(self):
        super(Net, self).__init__()
        torch.manual_seed(0)
        self.fc1 = torch.nn.Linear(4, 3)
        self.fc2 = torch.nn.Linear(3, 2)
        self.extra = torch.nn.Linear(4, 2)
        on_device(self.double())

    def forward(self, x, use_extra=False):
        out = self.fc2(torch.tanh(self.fc1(x)))
        return out + self.extra(x) if use_extra else out


def batch(r, step):
    g = torch.Generator().manual_seed(1000 * step + r)
    return torch.randn(5, 4, generator=g, dtype=torch.float64), torch.randn(5, 2, generator=g, dtype=torch.float64)


def backward(model, r, step, use_extra=False):
    x, y = batch(r, step)
    ((model(x, use_extra) - y) ** 2).sum().backward()


def local_grads(model, q, steps, use_extra=False):
    """Rank q's gradients at model's parameters, summed over the backward passes of steps (None
    for a parameter that got none)."""
    copy = Net()
    copy.load_state_dict(model.state_dict())
    for s in steps:
        backward(copy, q, s, use_extra and q == 0)
    return [None if p.grad is None else p.grad.clone() for p in copy.parameters()]


def combined(model, n, steps, op=hvd.Average, ranks=None, use_extra=False):
    """What the optimizer should hold as each parameter's gradient: op over ranks (default every
    rank) of their local gradients; a rank without a gradient contributes zeros."""
    ranks = list(range(n)) if ranks is None else ranks
    per_rank = [local_grads(model, q, steps, use_extra) for q in ranks]
    out = []
    for i, p in enumerate(model.parameters()):
        gs = [g[i] if g[i] is not None else torch.zeros_like(p) for g in per_rank]
        if op == hvd.Adasum:
            out.append(ref.adasum_tree(gs).reshape(p.shape))
        else:
            out.append(ref.reduce_ref(op, gs, torch.float64))
    return out


def used(model, use_extra=False):
    return [p for name, p in model.named_parameters() if use_extra or not name.startswith("extra")]


def check_step(ctx, what, model, opt, n, steps, op=hvd.Average, ranks=None, use_extra=False, tol=None):
    """Runs the backward passes of steps on this rank, synchronizes, and checks every gradient
    against the combination of every rank's; then steps and checks the parameters moved by it."""
    before = [p.detach().clone() for p in model.parameters()]
    want = combined(model, n, steps, op, ranks, use_extra)
    opt.zero_grad()
    for s in steps:
        backward(model, ctx.rank, s, use_extra and ctx.rank == 0)
    opt.synchronize()
    names = [name for name, _ in model.named_parameters()]
    for name, p, w in zip(names, model.parameters(), want):
        if name.startswith("extra") and not use_extra:
            continue
        ctx.equal(p.grad, w, "%s: gradient of %s" % (what, name), rtol=tol, atol=tol)
    with opt.skip_synchronize():
        opt.step()
    for name, p, b, w in zip(names, model.parameters(), before, want):
        if name.startswith("extra") and not use_extra:
            continue
        ctx.equal(p.detach(), b - LR * w, "%s: %s after step" % (what, name), rtol=tol, atol=tol)


def sgd(model, use_extra=False):
    return torch.optim.SGD(used(model, use_extra), lr=LR)


def named(model, use_extra=False):
    return [(k, p) for k, p in model.named_parameters() if use_extra or not k.startswith("extra")]


@case()
def gradients_are_the_average(ctx):
    """With named_parameters: p.grad is the average of every rank's gradient after
    synchronize(); step() applies it. The wrapper is still an SGD."""
    model = Net()
    opt = hvd.DistributedOptimizer(sgd(model), named_parameters=named(model))
    ctx.check(isinstance(opt, torch.optim.SGD), "DistributedOptimizer(SGD) is not an SGD")
    for step in range(3):
        check_step(ctx, "step %d" % step, model, opt, ctx.size, [step])


@case()
def without_named_parameters(ctx):
    """Without names, parameters are matched by position."""
    model = Net()
    opt = hvd.DistributedOptimizer(sgd(model))
    for step in range(2):
        check_step(ctx, "unnamed step %d" % step, model, opt, ctx.size, [step])


@case()
def backward_passes_per_step(ctx):
    """backward_passes_per_step=2: two passes accumulate locally, then one average;
    set_backward_passes_per_step(3) changes it."""
    model = Net()
    opt = hvd.DistributedOptimizer(sgd(model), named_parameters=named(model), backward_passes_per_step=2)
    check_step(ctx, "2 passes", model, opt, ctx.size, [0, 1])
    opt.set_backward_passes_per_step(3)
    check_step(ctx, "3 passes", model, opt, ctx.size, [2, 3, 4])


@case()
def groups(ctx):
    """groups=2 and groups=[[fc1.weight, fc1.bias], [fc2.weight]] (fc2.bias alone) give the same
    averages."""
    model = Net()
    opt = hvd.DistributedOptimizer(sgd(model), named_parameters=named(model), groups=2)
    check_step(ctx, "groups=2", model, opt, ctx.size, [0])
    model = Net()
    opt = hvd.DistributedOptimizer(sgd(model), named_parameters=named(model),
                                   groups=[[model.fc1.weight, model.fc1.bias], [model.fc2.weight]])
    check_step(ctx, "groups as lists", model, opt, ctx.size, [1])


@case()
def compression(ctx):
    """Compression.fp16 / .bf16: gradients travel in half precision (results within its
    precision) and come back in the parameters' dtype."""
    for comp, tol in ((hvd.Compression.fp16, 4e-3), (hvd.Compression.bf16, 3e-2)):
        model = Net()
        opt = hvd.DistributedOptimizer(sgd(model), named_parameters=named(model), compression=comp)
        check_step(ctx, comp.__name__, model, opt, ctx.size, [0], tol=tol)
        ctx.check(all(p.grad.dtype == torch.float64 for p in used(model)), "%s: gradient dtype changed" % comp.__name__)


@case()
def op_sum_and_predivide(ctx):
    """op=Sum sums the gradients; gradient_predivide_factor splits the average's division
    around the sum (same result)."""
    model = Net()
    opt = hvd.DistributedOptimizer(sgd(model), named_parameters=named(model), op=hvd.Sum)
    check_step(ctx, "op=Sum", model, opt, ctx.size, [0], op=hvd.Sum)
    model = Net()
    opt = hvd.DistributedOptimizer(sgd(model), named_parameters=named(model), gradient_predivide_factor=2.0)
    check_step(ctx, "gradient_predivide_factor=2", model, opt, ctx.size, [1])


@case()
def op_adasum(ctx):
    """op=Adasum, as Horovod's delta optimizer: each rank steps the wrapped optimizer on its own
    gradient, and the ranks' updates (new minus old parameters) are combined with Adasum
    (adasum.py's reference tree) and added to the old parameters. SGD with momentum, whose state
    evolves on each rank from its own gradients, over 2 steps. synchronize() does nothing;
    skip_synchronize() is refused."""
    n = ctx.size

    def make(params):
        return torch.optim.SGD(params, lr=LR, momentum=0.9)
    model = Net()
    opt = hvd.DistributedOptimizer(make(used(model)), named_parameters=named(model), op=hvd.Adasum)
    shadows = [Net() for _ in range(n)]  # each rank's local optimizer, replayed here
    shadow_opts = [make(used(m)) for m in shadows]
    for step in range(2):
        before = [p.detach().clone() for p in used(model)]
        deltas = []
        for q in range(n):
            shadows[q].load_state_dict(model.state_dict())
            shadows[q].zero_grad()
            backward(shadows[q], q, step)
            shadow_opts[q].step()
            deltas.append([m.detach() - b for m, b in zip(used(shadows[q]), before)])
        opt.zero_grad()
        backward(model, ctx.rank, step)
        opt.synchronize()
        opt.step()
        for i, (name, p) in enumerate(named(model)):
            want = before[i] + ref.adasum_tree([d[i].flatten() for d in deltas]).reshape(p.shape)
            ctx.equal(p.detach(), want, "op=Adasum step %d: %s" % (step, name), rtol=1e-9, atol=1e-12)
    ctx.raises(AssertionError, lambda: opt.skip_synchronize().__enter__(), "skip_synchronize() with op=Adasum")


@case()
def process_set(ctx):
    """process_set=the low set (ranks 0..size-2): members average among themselves; the rank
    outside it steps on its own gradient."""
    r, n = ctx.rank, ctx.size
    lo = hvd.add_process_set(list(range(n - 1)))
    try:
        model = Net()
        opt = hvd.DistributedOptimizer(sgd(model), named_parameters=named(model), process_set=lo)
        ranks = lo.ranks if lo.included() else [r]
        check_step(ctx, "process_set %s" % lo.ranks, model, opt, n, [0], ranks=ranks)
        hvd.barrier()
    finally:
        hvd.remove_process_set(lo)


@case()
def unused_parameters(ctx):
    """A parameter only rank 0 uses gets zeros from the others (no rank waits for it)."""
    model = Net()
    opt = hvd.DistributedOptimizer(sgd(model, True), named_parameters=named(model, True))
    for step in range(2):
        check_step(ctx, "step %d with extra used on rank 0" % step, model, opt, ctx.size, [step], use_extra=True)


@case()
def synchronize_clip_and_skip_synchronize(ctx):
    """synchronize(), clip the averaged gradients, then step() inside skip_synchronize() steps
    with the clipped ones and warns nothing; step() after synchronize() without it warns."""
    n = ctx.size
    model = Net()
    opt = hvd.DistributedOptimizer(sgd(model), named_parameters=named(model))
    before = [p.detach().clone() for p in used(model)]
    want = combined(model, n, [0])[:4]
    backward(model, ctx.rank, 0)
    opt.synchronize()
    torch.nn.utils.clip_grad_norm_(used(model), 0.01)
    total = torch.sqrt(sum((w ** 2).sum() for w in want))
    clipped = [w * min(1.0, 0.01 / (float(total) + 1e-6)) for w in want]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with opt.skip_synchronize():
            opt.step()
    ctx.check(not caught, "step() in skip_synchronize() warned: %s" % [str(w.message) for w in caught])
    for p, b, c in zip(used(model), before, clipped):
        ctx.equal(p.detach(), b - LR * c, "step with clipped gradients", rtol=1e-9, atol=1e-12)
    opt.zero_grad()
    backward(model, ctx.rank, 1)
    opt.synchronize()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        opt.step()
    ctx.check(any("skip_synchronize" in str(w.message) for w in caught),
              "step() after synchronize() did not warn: %s" % [str(w.message) for w in caught])


@case()
def zero_grad_before_step_is_refused(ctx):
    """zero_grad() between backward() and step() raises AssertionError (it would race the
    allreduce); step() afterwards completes as usual."""
    model = Net()
    opt = hvd.DistributedOptimizer(sgd(model), named_parameters=named(model))
    want = combined(model, ctx.size, [0])
    backward(model, ctx.rank, 0)
    ctx.raises(AssertionError, opt.zero_grad, "zero_grad() before step()")
    opt.synchronize()
    for p, w in zip(used(model), want):
        ctx.equal(p.grad, w, "gradient after the refused zero_grad()")
    with opt.skip_synchronize():
        opt.step()


@case()
def argument_errors(ctx):
    """Repeated or missing names, gradient_predivide_factor with an op other than Average, and
    backward_passes_per_step < 1 raise ValueError."""
    model = Net()
    ps = named(model)
    ctx.raises(ValueError, lambda: hvd.DistributedOptimizer(sgd(model), named_parameters=ps + ps[:1]),
               "a repeated name")
    ctx.raises(ValueError, lambda: hvd.DistributedOptimizer(sgd(model), named_parameters=ps[1:]), "a missing name")
    ctx.raises(ValueError, lambda: hvd.DistributedOptimizer(sgd(model), op=hvd.Sum, gradient_predivide_factor=2.0),
               "gradient_predivide_factor with op=Sum")
    ctx.raises(ValueError, lambda: hvd.DistributedOptimizer(sgd(model), backward_passes_per_step=0),
               "backward_passes_per_step=0")
    ctx.next_op_works("optimizer argument errors")
