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

from kolo.torch import mpi_ops
from kolo.torch.compression import Compression
from kolo.torch.mpi_ops import Average, global_process_set


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
        if named_parameters is not None:
            named_parameters = list(named_parameters)
            if any(not isinstance(x, tuple) for x in named_parameters):
                raise ValueError("named_parameters should be a sequence of (name, parameter) "
                                 "tuples, usually model.named_parameters()")
            names = [k for k, _ in named_parameters]
            dups = sorted({k for k in names if names.count(k) > 1})
            if dups:
                raise ValueError("parameter names in named_parameters must be unique; "
                                 "repeated: %s" % ", ".join(dups))
            self._parameter_names = {v: "allreduce.%s" % k for k, v in named_parameters}
            unnamed = [i for i, p in enumerate(all_params) if p not in self._parameter_names]
            if unnamed:
                raise ValueError("named_parameters was given, but optimizer parameters %s "
                                 "(by position) are not in it" % unnamed)
        else:
            self._parameter_names = {v: "allreduce.noname.%d" % i
                                     for i, v in enumerate(all_params)}

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
        if mpi_ops.size() > 1:
            self._register_hooks()

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
        if p.grad is None:
            p.grad = torch.zeros_like(p)
        elif p.grad.is_sparse and self._sparse_as_dense:
            p.grad = p.grad.to_dense()
        return p.grad

    def _allreduce_grad_async(self, p):
        name = self._parameter_names[p]
        grad = self._dense_grad(p)
        if grad.is_sparse:
            return _sparse_allreduce_async(grad, name, self._op, self._process_set), None
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
            [t for t, _ in pairs], name="allreduce.group.%s" % self._parameter_names[group[0]],
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
        if mpi_ops.size() == 1:
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
                else:
                    self._set_grad(p, self._decompress(out, c))
        for g in self._group_counts:
            self._group_counts[g] = 0
        self._synchronized = True

    def _compress(self, p, grad):
        """Compresses grad for the wire. Casting compressors (fp16, bf16) write into a buffer kept
        per parameter: a fresh tensor per step costs a page fault per 4 KiB on first touch, and
        first touch is slow on VMs (../shared/DESIGN.md: ~100 ms per 64 MiB here)."""
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
                warnings.warn("optimizer.step() called after optimizer.synchronize() without "
                              "`with optimizer.skip_synchronize():`; gradients were allreduced "
                              "again (harmless but slow)")
            self.synchronize()
        self._synchronized = False
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


def _sparse_allreduce_async(grad, name, op, process_set):
    """Allreduces a sparse gradient by gathering every rank's indices and values; returns a
    function that waits and returns the reduced sparse tensor."""
    if op not in (mpi_ops.Average, mpi_ops.Sum):
        raise ValueError("sparse gradients support only Average and Sum, not %r" % (op,))
    grad = grad.coalesce()
    # allgather concatenates along dim 0, so indices travel as (nnz, ndim).
    indices = mpi_ops.allgather_async(grad.indices().t().contiguous(), name=name + ".indices",
                                      process_set=process_set)
    values = mpi_ops.allgather_async(grad.values().contiguous(), name=name + ".values",
                                     process_set=process_set)

    def wait():
        v = mpi_ops.synchronize(values)
        i = mpi_ops.synchronize(indices)
        if op == mpi_ops.Average:
            v = v / mpi_ops.size()
        return torch.sparse_coo_tensor(i.t(), v, grad.size()).coalesce()
    return wait


def DistributedOptimizer(optimizer, named_parameters=None, compression=Compression.none,
                         backward_passes_per_step=1, op=Average, gradient_predivide_factor=1.0,
                         num_groups=0, groups=None, sparse_as_dense=False,
                         process_set=global_process_set):
    """Wraps optimizer so that step() applies gradients averaged (by op) across ranks.

    named_parameters: model.named_parameters(); names make allreduces match across ranks by
        parameter rather than by position (recommended).
    compression: Compression.none, .fp16 or .bf16: the dtype gradients travel in.
    backward_passes_per_step: backward passes that accumulate locally before one allreduce.
    op: Average (default), Sum, Min, Max or Product.
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
    body = {k: v for k, v in _DistributedOptimizer.__dict__.items()
            if k not in ("__dict__", "__weakref__")}
    body["_kolo_base"] = base
    cls = type(base.__name__, (base,), body)
    opt = cls(optimizer.param_groups, named_parameters, compression, backward_passes_per_step,
              op, gradient_predivide_factor, groups, sparse_as_dense, process_set)
    # Carry over state the wrapped optimizer already had (e.g. loaded from a checkpoint).
    for p, s in optimizer.state.items():
        opt.state[p] = s
    return opt
