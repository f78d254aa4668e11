"""Broadcast and gather of model state and Python objects, as horovod.torch.functions.

Everything here is built from mpi_ops collectives; nothing talks to the engine directly.
"""

import io
import pickle

import torch

from kolo.torch import mpi_ops
from kolo.torch.mpi_ops import global_process_set

try:  # cloudpickle also pickles lambdas and closures; plain pickle is the fallback.
    import cloudpickle as _pickler
except ImportError:  # pragma: no cover - depends on the installation
    _pickler = pickle


def _dumps(obj):
    buf = io.BytesIO()
    _pickler.dump(obj, buf)
    return buf.getvalue()


def _named_tensors(params, what):
    """Normalises a state_dict, named_parameters() or a list of tensors to [(name or None, tensor)]."""
    if isinstance(params, dict):
        return sorted(params.items())
    try:
        items = list(params)
    except TypeError:
        raise ValueError("%s: invalid params of type %s (want a state_dict, named_parameters() "
                         "or a list of tensors)" % (what, type(params).__name__))
    out = []
    for item in items:
        if isinstance(item, tuple):
            if len(item) != 2 or not torch.is_tensor(item[1]):
                raise ValueError("%s: expected (name, tensor) pairs, got %r" % (what, item))
            out.append(item)
        elif torch.is_tensor(item):
            out.append((None, item))
        else:
            raise ValueError("%s: expected tensors or (name, tensor) pairs, got %s"
                             % (what, type(item).__name__))
    return out


def broadcast_parameters(params, root_rank, process_set=global_process_set):
    """Copies root_rank's tensors into every rank's tensors, in place.

    params is a model's state_dict(), named_parameters(), or a list of tensors. Named tensors are
    matched across ranks by name (as "broadcast." + name); unnamed ones by kind, shape and order.
    """
    handles = []
    for name, p in _named_tensors(params, "broadcast_parameters"):
        op_name = name  # the engine matches it as "broadcast.<name>", as Horovod does
        # state_dict() returns detached views, parameters need no_grad for an in-place write.
        with torch.no_grad():
            handles.append(mpi_ops.broadcast_async_(p, root_rank, name=op_name,
                                                    process_set=process_set))
    for h in handles:
        mpi_ops.synchronize(h)


def broadcast_optimizer_state(optimizer, root_rank, model=None, process_set=global_process_set):
    """Copies root_rank's optimizer state (per-parameter state and param_groups options such as
    the learning rate) into every rank's optimizer.

    Tensors in the state are broadcast in place; everything else (scalars, tuples such as Adam's
    betas) travels as one pickled object, so its Python type survives. model (optional, as in
    Horovod) identifies parameters of sparse embeddings, whose state an SGD optimizer creates
    from sparse gradients.
    """
    if isinstance(optimizer, torch.optim.LBFGS):
        raise ValueError("cannot broadcast torch.optim.LBFGS state")
    params = [p for group in optimizer.param_groups for p in group["params"]]
    sparse = set()
    if model is not None:
        for m in model.modules():
            if isinstance(m, torch.nn.Embedding) and m.sparse:
                sparse.update(id(p) for p in m.parameters())
    if not any(optimizer.state.get(p) for p in params):
        # A new optimizer has no state yet; take one step with zero gradients to create it, so
        # every rank has the same structure to receive into. A DistributedOptimizer steps its
        # wrapped class directly so no allreduce runs here. As in Horovod, the parameters that
        # require a gradient keep the zero gradient (scripts read p.grad after this); their
        # values are put back, since with weight decay even a zero gradient moves them and
        # broadcast_parameters may already have run.
        saved = {}
        for p in params:
            if p.requires_grad:
                saved[p] = p.detach().clone()
                p.grad = torch.zeros_like(p)
                if isinstance(optimizer, torch.optim.SparseAdam) or (
                        isinstance(optimizer, torch.optim.SGD) and id(p) in sparse):
                    p.grad = p.grad.to_sparse()
        step = getattr(optimizer, "_kolo_unwrapped_step", None) or optimizer.step
        step()
        with torch.no_grad():
            for p, data in saved.items():
                p.copy_(data)

    scalars = {}
    handles = []
    sparse_state = []  # (index, key, dense copy, sparse_dim) of sparse state tensors
    for index, p in enumerate(params):
        state = optimizer.state.get(p)
        if not state:
            continue
        for key in sorted(state, key=str):
            value = state[key]
            if torch.is_tensor(value):
                if value.is_sparse:
                    # SGD's momentum of a sparse embedding (model=) is a sparse tensor, which
                    # has no buffer to broadcast into: it travels dense and is made sparse again.
                    dense = value.to_dense()
                    sparse_state.append((index, key, dense, value.sparse_dim()))
                    value = dense
                handles.append(mpi_ops.broadcast_async_(
                    value, root_rank, name="optimizer.state.%d.%s" % (index, key),
                    process_set=process_set))
            else:
                scalars[(index, key)] = value
    options = [{k: v for k, v in group.items() if k != "params"}
               for group in optimizer.param_groups]
    for h in handles:
        mpi_ops.synchronize(h)
    for index, key, dense, sparse_dim in sparse_state:
        optimizer.state[params[index]][key] = dense.to_sparse(sparse_dim)
    scalars, options = broadcast_object((scalars, options), root_rank,
                                        name="optimizer.options", process_set=process_set)
    for (index, key), value in scalars.items():
        optimizer.state[params[index]][key] = value
    if len(options) != len(optimizer.param_groups):
        raise ValueError("broadcast_optimizer_state: rank %d has %d param groups, root rank %d has %d"
                         % (mpi_ops.rank(), len(optimizer.param_groups), root_rank, len(options)))
    for group, opts in zip(optimizer.param_groups, options):
        group.update(opts)


def broadcast_object(obj, root_rank=0, name=None, process_set=global_process_set):
    """Returns root_rank's obj on every rank (pickled; obj on other ranks is ignored).

    The default name is the same on every rank ("broadcast_object"), not the type of obj as in
    Horovod, where a root passing a dict and others passing None never match.
    """
    if name is None:
        name = "broadcast_object"
    if mpi_ops.rank() == root_rank:
        payload = _dumps(obj)
        sz = torch.tensor([len(payload)], dtype=torch.int64, device="cpu")
    else:
        sz = torch.zeros(1, dtype=torch.int64, device="cpu")
    mpi_ops.broadcast_(sz, root_rank, name=name + ".sz", process_set=process_set)
    if mpi_ops.rank() == root_rank:
        t = torch.frombuffer(bytearray(payload), dtype=torch.uint8)
    else:
        t = torch.zeros(int(sz.item()), dtype=torch.uint8, device="cpu")
    mpi_ops.broadcast_(t, root_rank, name=name + ".t", process_set=process_set)
    if mpi_ops.rank() == root_rank:
        return obj
    return pickle.loads(t.numpy().tobytes())


def allgather_object(obj, name=None, process_set=global_process_set):
    """Returns the list of every rank's obj, in rank order (pickled). The default name is
    "allgather_object" on every rank, whatever the type of obj."""
    if name is None:
        name = "allgather_object"
    payload = _dumps(obj)
    sz = torch.tensor([len(payload)], dtype=torch.int64, device="cpu")
    sizes = mpi_ops.allgather(sz, name=name + ".sz", process_set=process_set).tolist()
    t = torch.frombuffer(bytearray(payload), dtype=torch.uint8)
    gathered = mpi_ops.allgather(t, name=name + ".t", process_set=process_set).numpy().tobytes()
    out, start = [], 0
    for n in sizes:
        out.append(pickle.loads(gathered[start:start + n]))
        start += n
    return out
