"""DistributedOptimizer, as horovod.torch.DistributedOptimizer.

It wraps a torch optimizer: a hook on each parameter's gradient accumulator starts that gradient's
allreduce the moment backward has produced it, so communication overlaps the rest of backward;
``step()`` (or ``synchronize()``) waits for every allreduce, writes the averaged gradients back and
then runs the wrapped optimizer's step. Fusion of many small gradients into one transfer is the
engine's job, not this file's.
"""

import contextlib
import warnings

import torch

from kolo import _lib
from kolo._lib import KoloInternalError
from kolo.torch import mpi_ops
from kolo.torch.compression import Compression
from kolo.torch.mpi_ops import Average, global_process_set


def _forget(handles):
    """Drops an abandoned step's allreduces (handles: key -> (handle, ctx)): each is waited for
    if still running, so the engine no longer writes into the gradients, and released."""
    for h, _ in handles.values():
        if h is not None:
            try:
                mpi_ops.synchronize(h)
            except KoloInternalError:
                pass  # the failure that abandoned the step
    handles.clear()


class _DistributedOptimizer(torch.optim.Optimizer):
    # These methods are copied into a class derived from the user's optimizer class (see
    # DistributedOptimizer), so isinstance(opt, torch.optim.SGD) still holds and the wrapped
    # class's own step() runs unchanged. _kolo_base is that class.
    _kolo_base = None

    def __init__(self, params, named_parameters, compression, backward_passes_per_step, op,
                 gradient_predivide_factor, groups, sparse_as_dense, process_set):
        self._kolo_base.__init__(self, params)
        self._compression = compression
        self._wire = {}  # param -> persistent buffer its gradient travels in (cast compressors)
        self._op = op
        self._process_set = process_set
        self._sparse_as_dense = sparse_as_dense
        if op == Average:
            # Divide by the factor before the sum and by size/factor after: with factor = size
            # the whole average happens before the sum (guards against fp16 overflow).
            self._prescale = 1.0 / gradient_predivide_factor
            self._postscale = gradient_predivide_factor
        else:
            self._prescale = self._postscale = 1.0

        all_params = [p for group in self.param_groups for p in group["params"]]
        # The engine scopes names by kind: these travel as "allreduce.<name>", as Horovod's.
        self._parameter_names = _parameter_names(self.param_groups, named_parameters)

        self.backward_passes_per_step = backward_passes_per_step
        self._allreduce_delay = {p: backward_passes_per_step for p in all_params}
        self._requires_update = [p for p in all_params if p.requires_grad]
        self._groups = self._make_groups(groups)
        self._group_counts = {g: 0 for g in set(self._groups.values())}
        self._handles = {}  # param or tuple of params -> (handle, ctx)
        self._grad_accs = []
        self._hook_handles = []
        self._synchronized = False
        self._should_synchronize = True
        # In an elastic job a world of one may grow: the hooks must be there when it does.
        if process_set.included() and (mpi_ops.size() > 1 or _lib.elastic_enabled()):
            self._register_hooks()

    def load_state_dict(self, *args, **kwargs):
        # Loading a state (hvd.elastic's restore after a lost rank, a checkpoint) starts a new
        # step: the allreduces in flight belong to the step abandoned, as in Horovod.
        _forget(self._handles)
        self._synchronized = False
        self._should_synchronize = True
        for p in self._allreduce_delay:
            self._allreduce_delay[p] = self.backward_passes_per_step
        return self._kolo_base.load_state_dict(self, *args, **kwargs)

    def _make_groups(self, groups):
        """Maps each parameter that is allreduced as part of a group to that group (a tuple)."""
        if groups is None or groups == 0:
            return {}
        params = self._requires_update
        if not params:
            return {}
        if isinstance(groups, int):
            if groups < 0:
                raise ValueError("groups must be a non-negative int or a list of lists of "
                                 "parameters, got %d" % groups)
            k = min(groups, len(params))
            size, extra = divmod(len(params), k)
            lists, start = [], 0
            for i in range(k):
                n = size + (1 if i < extra else 0)
                lists.append(params[start:start + n])
                start += n
        else:
            lists = [list(g) for g in groups]
        by_param = {}
        for group in lists:
            group = tuple(p for p in group if p.requires_grad)
            for p in group:
                if p in by_param:
                    raise ValueError("a parameter appears in more than one group")
                by_param[p] = group
        return {p: g for p, g in by_param.items() if len(g) > 0}

    def _register_hooks(self):
        for p in self._requires_update:
            if hasattr(p, "register_post_accumulate_grad_hook"):  # torch >= 2.1
                self._hook_handles.append(p.register_post_accumulate_grad_hook(self._make_hook(p)))
            else:
                # The gradient accumulator is the node that writes p.grad; a hook on it runs
                # right after p's gradient for this backward pass is complete.
                grad_acc = p.expand_as(p).grad_fn.next_functions[0][0]
                self._hook_handles.append(grad_acc.register_hook(self._make_hook(p)))
                self._grad_accs.append(grad_acc)  # the hook lives only as long as the node

    def _make_hook(self, p):
        def hook(*ignore):
            # The delay is reset only by synchronize(): at zero this gradient was already
            # submitted this step (alone or in its group, whose handle is not under p).
            if self._allreduce_delay[p] <= 0:
                raise AssertionError(
                    "gradients were computed more than backward_passes_per_step times before "
                    "the call to step(); increase backward_passes_per_step to accumulate "
                    "gradients locally")
            if p.grad.requires_grad:
                raise AssertionError("DistributedOptimizer does not support backward with "
                                     "create_graph=True")
            self._allreduce_delay[p] -= 1
            if self._allreduce_delay[p] > 0:
                self._handles[p] = (None, None)
                return
            group = self._groups.get(p)
            if group is None:
                self._handles[p] = self._allreduce_grad_async(p)
                return
            self._handles[p] = (None, None)
            self._group_counts[group] += 1
            if self._group_counts[group] == len(group):
                for gp in group:
                    self._handles.pop(gp, None)
                self._handles[group] = self._grouped_allreduce_grad_async(group)
                self._group_counts[group] = 0
        return hook

    def _dense_grad(self, p):
        """p's gradient as it travels: a parameter with no gradient (unused in this pass) gets
        zeros, so that every rank submits the same set; with sparse_as_dense a sparse gradient
        travels dense (p.grad stays sparse: synchronize() writes the result back sparse)."""
        if p.grad is None:
            p.grad = torch.zeros_like(p)
        elif p.grad.is_sparse and self._sparse_as_dense:
            return p.grad.to_dense()
        return p.grad

    def _allreduce_grad_async(self, p):
        name = self._parameter_names[p]
        grad = self._dense_grad(p)
        if grad.is_sparse:
            return mpi_ops.sparse_allreduce_async(grad, name, self._op, self._process_set), None
        compressed, ctx = self._compress(p, grad)
        handle = mpi_ops.allreduce_async_(
            compressed, name=name, op=self._op, prescale_factor=self._prescale,
            postscale_factor=self._postscale, process_set=self._process_set)
        return handle, ctx

    def _grouped_allreduce_grad_async(self, group):
        grads = [self._dense_grad(p) for p in group]
        if any(g.is_sparse for g in grads):
            raise ValueError("sparse gradients cannot be allreduced in groups; pass "
                             "sparse_as_dense=True or leave the parameter out of groups")
        pairs = [self._compress(p, g) for p, g in zip(group, grads)]
        handle = mpi_ops.grouped_allreduce_async_(
            [t for t, _ in pairs], name="group.%s" % self._parameter_names[group[0]],
            op=self._op, prescale_factor=self._prescale, postscale_factor=self._postscale,
            process_set=self._process_set)
        return handle, [c for _, c in pairs]

    def set_backward_passes_per_step(self, passes):
        """Changes how many backward passes accumulate before gradients are allreduced."""
        self.backward_passes_per_step = passes
        for p in self._allreduce_delay:
            self._allreduce_delay[p] = passes

    def synchronize(self):
        """Waits for every gradient's allreduce and writes the results into p.grad.

        Gradients whose hook did not fire (parameters unused in this pass, or fewer backward passes
        than backward_passes_per_step) are allreduced here, so every rank submits the same set.
        """
        if not self._process_set.included() or (mpi_ops.size() == 1 and not self._handles):
            # Alone there is nothing to average, unless the hooks started allreduces anyway
            # (an elastic job's world of one): those are waited for below like any.
            self._synchronized = True
            return
        done = set()
        for key in self._handles:
            done.update(key if isinstance(key, tuple) else (key,))
        for p in self._requires_update:
            if p not in done:
                self._handles[p] = (None, None)
        for key, (handle, ctx) in list(self._handles.items()):
            if handle is None:
                # A parameter of a group that never completed (some member had no gradient)
                # is reduced alone, under its own name, on every rank alike.
                self._handles[key] = self._allreduce_grad_async(key)
        # Each handle leaves the table once waited for. Ctrl-C leaves the one being waited for
        # and the rest in place (the engine may still write into them), so synchronize() can be
        # called again; a failed op is consumed by the error it raised.
        for key in list(self._handles):
            handle, ctx = self._handles[key]
            try:
                if isinstance(key, tuple):
                    outputs = mpi_ops.synchronize(handle)
                elif callable(handle):  # sparse
                    outputs = [handle()]
                else:
                    outputs = [mpi_ops.synchronize(handle)]
            except KeyboardInterrupt:
                raise
            except BaseException:
                del self._handles[key]
                raise
            del self._handles[key]
            params, ctxs = (key, ctx) if isinstance(key, tuple) else ((key,), (ctx,))
            for p, out, c in zip(params, outputs, ctxs):
                self._allreduce_delay[p] = self.backward_passes_per_step
                if out.is_sparse:
                    p.grad = out
                elif p.grad.is_sparse:  # sparse_as_dense: back to the sparse form p.grad had
                    p.grad = self._decompress(out, c).to_sparse()
                else:
                    self._set_grad(p, self._decompress(out, c))
        for g in self._group_counts:
            self._group_counts[g] = 0
        self._synchronized = True

    def _compress(self, p, grad):
        """Compresses grad for the wire. Casting compressors (fp16, bf16) write into a buffer kept
        per parameter: a fresh tensor per step costs a page fault per 4 KiB on first touch, and
        first touch is slow on VMs (~100 ms per 64 MiB on a 2-vCPU VM)."""
        wire = getattr(self._compression, "wire_dtype", None)
        if wire is None or not grad.dtype.is_floating_point or grad.dtype == wire:
            return self._compression.compress(grad)
        buf = self._wire.get(p)
        if buf is None or buf.shape != grad.shape or buf.device != grad.device:
            buf = self._wire[p] = torch.empty(grad.shape, dtype=wire, device=grad.device)
        buf.copy_(grad)
        return buf, _CAST_BACK

    def _decompress(self, out, ctx):
        # _CAST_BACK: _set_grad's copy_ into p.grad converts the dtype in place.
        return out if ctx is _CAST_BACK else self._compression.decompress(out, ctx)

    @staticmethod
    def _set_grad(p, value):
        if value is not p.grad and value.data_ptr() != p.grad.data_ptr():
            p.grad.copy_(value)

    @contextlib.contextmanager
    def skip_synchronize(self):
        """Lets step() run without synchronizing, after an explicit synchronize() (for example
        to clip the averaged gradients in between)."""
        self._should_synchronize = False
        try:
            yield
        finally:
            self._should_synchronize = True

    def step(self, closure=None):
        if self._should_synchronize:
            if self._synchronized:
                # Horovod's words: scripts and tests match on them.
                warnings.warn("optimizer.step() called without optimizer.skip_synchronize() "
                              "context after optimizer.synchronize(). This can cause training "
                              "slowdown. You may want to consider using optimizer.skip_synchronize() "
                              "context if you use optimizer.synchronize() in your code.")
            self.synchronize()
        self._synchronized = False
        _lib.mark_step()  # the autotuner times the job by these marks (kolo run --autotune)
        return self._kolo_base.step(self, closure)

    def _kolo_unwrapped_step(self, closure=None):
        """The wrapped optimizer's step with no allreduce (broadcast_optimizer_state uses it)."""
        return self._kolo_base.step(self, closure)

    def zero_grad(self, *args, **kwargs):
        if any(h is not None for h, _ in self._handles.values()):
            raise AssertionError(
                "optimizer.zero_grad() was called after loss.backward() but before "
                "optimizer.step() or optimizer.synchronize(); that would race with the "
                "gradients' allreduce")
        return self._kolo_base.zero_grad(self, *args, **kwargs)


_CAST_BACK = object()  # ctx of a gradient sent in a wire buffer: copy it back into p.grad


class _DistributedAdasumOptimizer(torch.optim.Optimizer):
    """DistributedOptimizer(op=Adasum), as Horovod's: each rank takes the wrapped optimizer's step
    from its own gradient, and the ranks combine the resulting parameter updates (not the
    gradients) with Adasum, which adapts the sum to how much the updates agree.

    For each parameter, as soon as backward has produced its gradient (the same hook as the
    averaging optimizer), the wrapped optimizer steps that parameter alone; the update (new value
    minus old) is then Adasum-allreduced while backward goes on, and step() adds the combined
    update to the old value. synchronize() does nothing and skip_synchronize() is refused, as in
    Horovod: the update exists only once the local step has run."""

    _kolo_base = None

    def __init__(self, params, named_parameters, compression, backward_passes_per_step,
                 process_set):
        self._kolo_base.__init__(self, params)
        self._compression = compression
        self._process_set = process_set
        self._parameter_names = _parameter_names(self.param_groups, named_parameters)
        self.backward_passes_per_step = backward_passes_per_step
        all_params = [p for group in self.param_groups for p in group["params"]]
        self._allreduce_delay = {p: backward_passes_per_step for p in all_params}
        self._requires_update = [p for p in all_params if p.requires_grad]
        self._start = {}    # param -> its value before this step's local update
        self._handles = {}  # param -> (handle of its update's allreduce, compression ctx)
        self._hook_handles = []
        self._grad_accs = []
        if process_set.included():
            for p in self._requires_update:
                grad_acc = p.expand_as(p).grad_fn.next_functions[0][0]
                self._hook_handles.append(grad_acc.register_hook(self._make_hook(p)))
                self._grad_accs.append(grad_acc)

    def set_backward_passes_per_step(self, passes):
        self.backward_passes_per_step = passes
        for p in self._allreduce_delay:
            self._allreduce_delay[p] = passes

    def load_state_dict(self, *args, **kwargs):
        # As _DistributedOptimizer.load_state_dict: the step in flight is abandoned.
        _forget(self._handles)
        self._start.clear()
        for p in self._allreduce_delay:
            self._allreduce_delay[p] = self.backward_passes_per_step
        return self._kolo_base.load_state_dict(self, *args, **kwargs)

    def _make_hook(self, p):
        def hook(*ignore):
            if self._allreduce_delay[p] <= 0:
                raise AssertionError(
                    "gradients were computed more than backward_passes_per_step times before "
                    "the call to step(); increase backward_passes_per_step to accumulate "
                    "gradients locally")
            self._allreduce_delay[p] -= 1
            if self._allreduce_delay[p] == 0:
                self._handles[p] = self._update_async(p)
        return hook

    def _update_async(self, p):
        """Steps p alone with the wrapped optimizer and starts the Adasum allreduce of its update,
        in place in p (which holds the update until step() adds it to the old value)."""
        start = self._start.get(p)
        if start is None:
            start = self._start[p] = torch.empty_like(p, requires_grad=False)
        if p.grad is None:
            p.grad = torch.zeros_like(p)
        with torch.no_grad():
            start.copy_(p)
        stashed = [group["params"] for group in self.param_groups]
        try:
            for group in self.param_groups:
                group["params"] = [p] if any(p is q for q in group["params"]) else []
            self._kolo_base.step(self)
        finally:
            for group, params in zip(self.param_groups, stashed):
                group["params"] = params
        with torch.no_grad():
            p.sub_(start)
        wire, ctx = self._compression.compress(p.data)
        handle = mpi_ops.allreduce_async_(wire, name=self._parameter_names[p], op=mpi_ops.Adasum,
                                          process_set=self._process_set)
        return handle, ctx

    def synchronize(self):
        """Nothing to do: the updates are combined in step(), as in Horovod."""

    @contextlib.contextmanager
    def skip_synchronize(self):
        raise AssertionError("skipping synchronization is not supported with op=Adasum")
        yield  # pragma: no cover - makes this a generator

    def step(self, closure=None):
        loss = closure() if closure is not None else None
        if not self._process_set.included():
            return loss
        for p in self._requires_update:
            if p not in self._handles:
                self._handles[p] = self._update_async(p)
        for p in list(self._handles):
            handle, ctx = self._handles.pop(p)
            delta = self._compression.decompress(mpi_ops.synchronize(handle), ctx)
            start = self._start[p]
            with torch.no_grad():
                start.add_(delta)
                p.copy_(start)
            self._allreduce_delay[p] = self.backward_passes_per_step
        _lib.mark_step()
        return loss

    def zero_grad(self, *args, **kwargs):
        if self._handles:
            raise AssertionError(
                "optimizer.zero_grad() was called after loss.backward() but before "
                "optimizer.step(); that would race with the updates' allreduce")
        return self._kolo_base.zero_grad(self, *args, **kwargs)


def _parameter_names(param_groups, named_parameters):
    """param -> the name its allreduce goes by: its name in named_parameters, or its position."""
    all_params = [p for group in param_groups for p in group["params"]]
    if named_parameters is None:
        return {v: "allreduce.noname.%d" % i for i, v in enumerate(all_params)}
    named_parameters = list(named_parameters)
    if any(not isinstance(x, tuple) for x in named_parameters):
        raise ValueError("named_parameters should be a sequence of (name, parameter) "
                         "tuples, usually model.named_parameters()")
    names = [k for k, _ in named_parameters]
    dups = sorted({k for k in names if names.count(k) > 1})
    if dups:
        raise ValueError("parameter names in named_parameters must be unique; "
                         "repeated: %s" % ", ".join(dups))
    out = {v: k for k, v in named_parameters}
    unnamed = [i for i, p in enumerate(all_params) if p not in out]
    if unnamed:
        raise ValueError("named_parameters was given, but optimizer parameters %s "
                         "(by position) are not in it" % unnamed)
    return out


def DistributedOptimizer(optimizer, named_parameters=None, compression=Compression.none,
                         backward_passes_per_step=1, op=Average, gradient_predivide_factor=1.0,
                         num_groups=0, groups=None, sparse_as_dense=False,
                         process_set=global_process_set):
    """Wraps optimizer so that step() applies gradients averaged (by op) across ranks.

    named_parameters: model.named_parameters(); names make allreduces match across ranks by
        parameter rather than by position (recommended).
    compression: Compression.none, .fp16 or .bf16: the dtype gradients travel in.
    backward_passes_per_step: backward passes that accumulate locally before one allreduce.
    op: Average (default), Sum, Min, Max or Product; or Adasum, which combines each rank's
        parameter update (the wrapped optimizer's step from its own gradient) with Adasum, as
        Horovod's delta optimizer does.
    gradient_predivide_factor: with Average, divide gradients by this before the sum and by
        size/factor after.
    groups: an int (split the parameters into that many groups) or a list of lists of
        parameters; a group is allreduced in one call once all its gradients are ready.
    sparse_as_dense: turn sparse gradients dense before the allreduce.
    """
    if gradient_predivide_factor != 1.0 and op != Average:
        raise ValueError("gradient_predivide_factor is supported only with op=Average")
    if backward_passes_per_step < 1:
        raise ValueError("backward_passes_per_step must be at least 1, got %r"
                         % (backward_passes_per_step,))
    if num_groups:
        warnings.warn("num_groups is deprecated; use groups", DeprecationWarning)
        if groups is None:
            groups = num_groups
    base = optimizer.__class__
    adasum = op == mpi_ops.Adasum and mpi_ops.size() > 1
    impl = _DistributedAdasumOptimizer if adasum else _DistributedOptimizer
    body = {k: v for k, v in impl.__dict__.items() if k not in ("__dict__", "__weakref__")}
    body["_kolo_base"] = base
    cls = type(base.__name__, (base,), body)
    if adasum:
        opt = cls(optimizer.param_groups, named_parameters, compression, backward_passes_per_step,
                  process_set)
    else:
        opt = cls(optimizer.param_groups, named_parameters, compression, backward_passes_per_step,
                  op, gradient_predivide_factor, groups, sparse_as_dense, process_set)
    # Carry over state the wrapped optimizer already had (e.g. loaded from a checkpoint).
    for p, s in optimizer.state.items():
        opt.state[p] = s
    return opt
