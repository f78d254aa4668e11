"""TorchState, horovod.torch.elastic's state of a PyTorch training process, with two changes of
cost that keep Horovod's semantics:

* A commit copies into buffers. Horovod deep-copies every model and optimizer state_dict on every
  commit, allocating the whole model again each time. Here a Snapshot keeps one buffer per tensor
  of the state_dict, allocated at the first save, and later saves copy_() into it; a buffer is
  allocated again only when its tensor appears or changes shape, dtype or device. Restore loads
  the buffers back, bit for bit.
* A sync takes the state from several survivors at once. Horovod broadcasts everything from rank
  0. Here the ranks first gather how many commits each holds (-1: none, a newcomer); the ranks
  that hold the same commit as rank 0 hold the same state (data-parallel replicas step
  identically), so each tensor is broadcast from one of them, spread over them by size, all
  broadcasts in flight at once. The structure, and values that are not tensors, come from one
  root (rank 0, as in Horovod).
"""

import copy

import torch

from kolo.elastic import ObjectState
from kolo.torch import mpi_ops
from kolo.torch.elastic.sampler import ElasticSampler
from kolo.torch.functions import allgather_object, broadcast_object
from kolo.torch.mpi_ops import rank


class TorchState(ObjectState):
    """State of a PyTorch training process: a model, an optimizer and any other values, each as
    a keyword argument, kept as attributes of the state (state.model, state.epoch, ...).

    Values of a type in the handler registry (modules, optimizers, ElasticSampler; see
    set_handler_registry) are saved, restored and synced by their handler; the others as plain
    Python objects (ObjectState).
    """

    def __init__(self, model=None, optimizer=None, **kwargs):
        kwargs.update(dict(model=model, optimizer=optimizer))
        self._handlers, kwargs = _get_handlers(kwargs)
        for name, handler in self._handlers.items():
            setattr(self, name, handler.value)
        # Commits saved since the state was last synced; -1 until the first sync (a worker that
        # has never held the job's state). Equal counts mean equal state (see sync).
        self._commits = -1
        super(TorchState, self).__init__(bcast_object=broadcast_object, get_rank=rank, **kwargs)

    def save(self):
        for handler in self._handlers.values():
            handler.save()
        super(TorchState, self).save()
        self._commits += 1

    def restore(self):
        for handler in self._handlers.values():
            handler.restore()
        super(TorchState, self).restore()

    def sync(self):
        """Makes every rank's state rank 0's committed state, taking the tensors from every rank
        that holds the same commit as rank 0 (see the module's comment). A worker whose state
        rank 0 holds no commit (the job's first sync) takes everything from rank 0; if rank 0
        holds none but other ranks do, those ranks' newest commit is taken instead."""
        snapshots = {n: h for n, h in self._handlers.items() if isinstance(h, _SnapshotHandler)}
        for h in snapshots.values():
            h.save()  # the live state is what gets sent; restore() then loads what arrived
        counts = allgather_object(self._commits, name="kolo.elastic.sync.commits")
        roots = sync_roots(counts)
        if rank() not in roots:
            # Until the sync completes this rank holds no commit: a failure half-way through
            # leaves its buffers part old, part received, and it must not be a root next time.
            self._commits = -1
        _broadcast_snapshots(snapshots, roots)
        for name, h in self._handlers.items():
            if name in snapshots:
                h.restore()
            else:
                if isinstance(h, SamplerStateHandler):
                    h.sync(root_rank=roots[0])
                else:  # a handler of the script's own (set_handler_registry) syncs as it does
                    h.sync()
                h.save()  # so that a restore before the next commit gives the synced value
        if self._saved_state:
            self._saved_state = broadcast_object(self._saved_state, roots[0],
                                                 name="kolo.elastic.sync.objects")
            self._set_attrs()
        self._commits = max(counts[roots[0]], 0)

    def reset(self):
        for handler in self._handlers.values():
            handler.reset()

    def __setattr__(self, name, value):
        if hasattr(self, name) and name in self._handlers:
            self._handlers[name].set_value(value)
        super().__setattr__(name, value)


def sync_roots(counts):
    """The ranks to take the state from, given every rank's commit count (-1: holds none): the
    ranks holding rank 0's commit; when rank 0 holds none, those holding the newest; when nobody
    holds one (the job's start, where every rank's state is its own), rank 0 alone."""
    ref = counts[0] if counts[0] >= 0 else max(counts)
    if ref < 0:
        return [0]
    return [r for r, c in enumerate(counts) if c == ref]


def assign_roots(nbytes, roots):
    """Which root sends each tensor: nbytes are the tensors' sizes, in the order every rank
    lists them. Largest first, each to the root with the fewest bytes so far (ties: the earlier
    root, then the earlier tensor), so that one large tensor does not leave the other roots idle
    as a round-robin by index would. The same inputs give the same answer on every rank."""
    load = [0] * len(roots)
    out = [roots[0]] * len(nbytes)
    for i in sorted(range(len(nbytes)), key=lambda i: (-nbytes[i], i)):
        k = min(range(len(roots)), key=lambda k: (load[k], k))
        out[i] = roots[k]
        load[k] += nbytes[i]
    return out


def _broadcast_snapshots(handlers, roots):
    """Gives every rank the snapshots of roots: the structure (from roots[0]), then each tensor
    from the root assign_roots picks, every broadcast submitted before any is waited for."""
    specs = broadcast_object({n: h.snapshot.spec() for n, h in handlers.items()}, roots[0],
                             name="kolo.elastic.sync.structure")
    buffers = []
    for name in sorted(handlers):
        snapshot = handlers[name].snapshot
        snapshot.adopt(specs[name])
        buffers += [("%s.%s" % (name, path), buf) for path, buf in snapshot.buffers()]
    senders = assign_roots([b.numel() * b.element_size() for _, b in buffers], roots)
    handles = [mpi_ops.broadcast_async_(buf, root, name="kolo.elastic.sync." + name)
               for (name, buf), root in zip(buffers, senders)]
    for h in handles:
        mpi_ops.synchronize(h)


class TensorSpec(object):
    """A tensor's shape and dtype: what a snapshot's structure holds in its place when sent."""

    def __init__(self, shape, dtype):
        self.shape, self.dtype = tuple(shape), dtype

    def __repr__(self):
        return "TensorSpec(%s, %s)" % (list(self.shape), self.dtype)


_ATOMS = (int, float, bool, str, bytes, type(None), torch.dtype, torch.device)


class Snapshot(object):
    """A committed copy of a state_dict: its structure (dicts, lists, tuples, values) with every
    dense tensor replaced by a buffer of this snapshot. save() copies into the buffers it has
    and allocates only for a tensor that is new or changed shape, dtype or device; value()
    returns the copy (buffers included: load it, do not keep it)."""

    def __init__(self):
        self._tree = None
        self._buffers = {}  # path (tuple of keys) -> tensor

    def save(self, state_dict):
        kept = {}
        self._tree = self._copy(state_dict, (), kept)
        self._buffers = kept

    def value(self):
        return self._tree

    def buffers(self):
        """[(path as text, buffer)] in the order of the structure."""
        out = []
        _walk(self._tree, (), lambda path, t: out.append((".".join(map(str, path)), t)))
        return out

    def spec(self):
        """The structure with TensorSpecs in place of the dense tensors (picklable, small)."""
        return _map(self._tree, (), lambda path, t: TensorSpec(t.shape, t.dtype))

    def adopt(self, spec):
        """Takes spec's structure and values, keeping the buffers that match its TensorSpecs and
        allocating the others (on the CPU); their contents are then to be received."""
        kept = {}

        def buffer(path, s):
            buf = self._buffers.get(path)
            if buf is None or tuple(buf.shape) != s.shape or buf.dtype != s.dtype:
                buf = torch.empty(s.shape, dtype=s.dtype)
            kept[path] = buf
            return buf

        self._tree = _map(spec, (), buffer, leaf=TensorSpec)
        self._buffers = kept

    def _copy(self, obj, path, kept):
        if _dense(obj):
            buf = self._buffers.get(path)
            if (buf is None or buf.shape != obj.shape or buf.dtype != obj.dtype
                    or buf.device != obj.device):
                buf = torch.empty(obj.shape, dtype=obj.dtype, device=obj.device)
            with torch.no_grad():
                buf.copy_(obj)
            kept[path] = buf
            return buf
        if torch.is_tensor(obj):  # sparse and other layouts: a plain copy, sent with the structure
            return obj.detach().clone()
        if isinstance(obj, dict):
            out = type(obj)((k, self._copy(v, path + (k,), kept)) for k, v in obj.items())
            if hasattr(obj, "_metadata"):  # a module's state_dict carries its version here
                out._metadata = copy.deepcopy(obj._metadata)
            return out
        if isinstance(obj, list):
            return [self._copy(v, path + (i,), kept) for i, v in enumerate(obj)]
        if type(obj) is tuple:
            return tuple(self._copy(v, path + (i,), kept) for i, v in enumerate(obj))
        if isinstance(obj, _ATOMS):
            return obj
        return copy.deepcopy(obj)


def _dense(obj):
    return torch.is_tensor(obj) and obj.layout == torch.strided


def _map(obj, path, fn, leaf=None):
    """obj's structure with fn(path, x) in place of each dense tensor (or each instance of leaf)."""
    if (leaf is None and _dense(obj)) or (leaf is not None and isinstance(obj, leaf)):
        return fn(path, obj)
    if isinstance(obj, dict):
        out = type(obj)((k, _map(v, path + (k,), fn, leaf)) for k, v in obj.items())
        if hasattr(obj, "_metadata"):
            out._metadata = obj._metadata
        return out
    if isinstance(obj, list):
        return [_map(v, path + (i,), fn, leaf) for i, v in enumerate(obj)]
    if type(obj) is tuple:
        return tuple(_map(v, path + (i,), fn, leaf) for i, v in enumerate(obj))
    return obj


def _walk(obj, path, fn):
    _map(obj, path, lambda p, t: fn(p, t) or t)


class StateHandler(object):
    """Saves, restores and syncs one kind of value of a TorchState (see set_handler_registry)."""

    def __init__(self, value):
        self.value = value

    def save(self):
        raise NotImplementedError()

    def restore(self):
        raise NotImplementedError()

    def sync(self):
        raise NotImplementedError()

    def reset(self):
        """Adapts the value to the new world after a reset (before sync); nothing by default."""
        pass

    def set_value(self, value):
        self.value = value
        self.save()


class _SnapshotHandler(StateHandler):
    """A value saved as a Snapshot of its state_dict; TorchState.sync sends its tensors from
    several survivors."""

    def __init__(self, value):
        super().__init__(value)
        self.snapshot = Snapshot()
        self.save()

    def save(self):
        self.snapshot.save(self.value.state_dict())

    def restore(self):
        self.value.load_state_dict(self.snapshot.value())

    def sync(self):
        """Makes every rank's value rank 0's (this handler alone, as Horovod's sync does)."""
        self.save()
        _broadcast_snapshots({"value": self}, [0])
        self.restore()


class ModelStateHandler(_SnapshotHandler):
    """A torch.nn.Module: its state_dict (parameters and buffers)."""


class OptimizerStateHandler(_SnapshotHandler):
    """A torch.optim.Optimizer: its state_dict (per-parameter state such as momentum and Adam's
    step, and the param_groups' options such as the learning rate)."""

    def restore(self):
        self.value.load_state_dict(self.snapshot.value())
        # torch 1.x deep-copies what it loads; newer versions may keep the tensors given when
        # no cast is needed. A state tensor that is one of the snapshot's buffers would be
        # changed by the next step, and the commit with it: such a tensor is copied.
        own = {b.data_ptr() for _, b in self.snapshot.buffers()}
        for state in self.value.state.values():
            for k, v in state.items():
                if torch.is_tensor(v) and v.layout == torch.strided and v.data_ptr() in own:
                    state[k] = v.clone()


class SamplerStateHandler(StateHandler):
    """An ElasticSampler: its state_dict (epoch and samples processed); after a reset it splits
    what is left among the new world."""

    def __init__(self, sampler):
        super().__init__(sampler)
        self.save()

    def save(self):
        self._saved_sampler_state = copy.deepcopy(self.value.state_dict())

    def restore(self):
        self.value.load_state_dict(self._saved_sampler_state)

    def sync(self, root_rank=0):
        self.value.load_state_dict(broadcast_object(self.value.state_dict(), root_rank,
                                                    name="kolo.elastic.sync.sampler"))

    def reset(self):
        # Horovod repartitions only in sync and restore, so a reset that only removed workers
        # (no sync, no restore) kept the old world's partition: here every reset repartitions.
        self.value.reset()


_handler_registry = [
    (torch.nn.Module, ModelStateHandler),
    (torch.optim.Optimizer, OptimizerStateHandler),
    (ElasticSampler, SamplerStateHandler),
]


def get_handler_registry():
    """[(type, handler class)]: the first type a value is an instance of picks its handler."""
    return _handler_registry


def set_handler_registry(registry):
    global _handler_registry
    _handler_registry = registry


def _get_handler(v):
    for handler_type, handler_cls in _handler_registry:
        if isinstance(v, handler_type):
            return handler_cls(v)
    return None


def _get_handlers(kwargs):
    handlers, rest = {}, {}
    for k, v in kwargs.items():
        handler = _get_handler(v)
        if handler is not None:
            handlers[k] = handler
        else:
            rest[k] = v
    return handlers, rest
