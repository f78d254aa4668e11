"""sparse_allreduce_async, and DistributedOptimizer over a sparse embedding with SparseAdam
(sparse_as_dense False and True)."""

from conformance.device import on_device, torch

import kolo.torch as hvd
from conformance import reference as ref
from conformance.case import case


def _sparse(q, shape):
    """Rank q's sparse tensor: nonzero rows q, q+1 and the last row (so ranks overlap), with a
    different number of nonzeros per rank."""
    dense = torch.zeros(shape, dtype=torch.float64)
    rows = sorted({q % shape[0], (q + 1) % shape[0], shape[0] - 1} | ({2} if q % 2 else set()))
    for i in rows:
        dense[i] = torch.arange(1.0, 1.0 + dense[i].numel(), dtype=torch.float64).reshape(dense[i].shape) * (q + 1) + i
    return dense.to_sparse(1)


@case()
def sparse_allreduce_async(ctx):
    """Sum and Average of sparse tensors whose nonzeros differ per rank equal the dense allreduce;
    the result is a coalesced sparse tensor; 1-D and 2-D values."""
    r, n = ctx.rank, ctx.size
    for shape in ((7, 3), (9,)):
        for opname, op in (("Sum", hvd.Sum), ("Average", hvd.Average)):
            wait = hvd.sparse_allreduce_async(_sparse(r, shape), name="sparse %s %s" % (opname, shape), op=op)
            got = wait()
            ctx.check(got.is_sparse and got.is_coalesced(),
                      "%s %s: result is not a coalesced sparse tensor" % (opname, shape))
            want = ref.reduce_ref(op, [_sparse(q, shape).to_dense() for q in range(n)], torch.float64)
            ctx.equal(got.to_dense(), want, "sparse_allreduce_async %s %s" % (opname, shape))


@case()
def sparse_allreduce_async_arguments(ctx):
    """Ops other than Average and Sum, and dense tensors, are ValueErrors."""
    x = _sparse(ctx.rank, (4, 2))
    for op in (hvd.Min, hvd.Max, hvd.Product, hvd.Adasum):
        ctx.raises(ValueError, lambda: hvd.sparse_allreduce_async(x, name="bad op", op=op), "op %d" % op)
    ctx.raises(ValueError, lambda: hvd.sparse_allreduce_async(x.to_dense(), name="dense", op=hvd.Sum), "a dense tensor")
    ctx.next_op_works("sparse_allreduce_async argument errors")


def _sparse_adam(ctx, sparse_as_dense):
    """Embedding(10, 4, sparse=True) with SparseAdam through DistributedOptimizer, 3 steps on
    per-rank indices: every rank's embedding equals a reference trained on the average of the
    ranks' gradients, and the gradient stays sparse."""
    r, n = ctx.rank, ctx.size

    def make():
        torch.manual_seed(5)
        return on_device(torch.nn.Embedding(10, 4, sparse=True).double())

    def indices(q, step):
        return torch.tensor([q, (q + step) % 10, 9, (3 * q + step) % 10])

    def loss(m, q, step):
        w = torch.arange(1.0, 5.0, dtype=torch.float64) * (q + 1)
        return (m(indices(q, step)) * w).sum()
    model, reference = make(), make()
    opt = hvd.DistributedOptimizer(torch.optim.SparseAdam(list(model.parameters()), lr=0.1),
                                   named_parameters=model.named_parameters(), sparse_as_dense=sparse_as_dense)
    ref_opt = torch.optim.SparseAdam(list(reference.parameters()), lr=0.1)
    for step in range(3):
        grads = []
        for q in range(n):
            copy = make()
            copy.load_state_dict(reference.state_dict())
            loss(copy, q, step).backward()
            grads.append(copy.weight.grad.to_dense())
        reference.weight.grad = (torch.stack(grads).mean(0)).to_sparse(1)
        ref_opt.step()
        opt.zero_grad()
        loss(model, r, step).backward()
        opt.synchronize()
        ctx.check(model.weight.grad.is_sparse, "step %d: the gradient is not sparse after synchronize()" % step)
        ctx.equal(model.weight.grad.to_dense(), torch.stack(grads).mean(0), "step %d: averaged gradient" % step)
        with opt.skip_synchronize():
            opt.step()
        ctx.equal(model.weight.detach(), reference.weight.detach(), "step %d: embedding after SparseAdam" % step,
                  rtol=1e-9, atol=1e-12)


@case()
def sparse_adam(ctx):
    """SparseAdam with sparse_as_dense=False: sparse gradients reduced by gathering indices and
    values."""
    _sparse_adam(ctx, False)


@case()
def sparse_adam_sparse_as_dense(ctx):
    """SparseAdam with sparse_as_dense=True: sparse gradients travel dense, come back sparse."""
    _sparse_adam(ctx, True)
