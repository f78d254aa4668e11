"""SyncBatchNorm, as horovod.torch.SyncBatchNorm: batch normalization whose statistics are those
of the global batch (every rank's samples), not of this rank's share.

Forward gathers each rank's (count, mean, sum of squared deviations) in one allgather and combines
them with the parallel-variance formula (stable, and correct when ranks hold different numbers of
samples). Backward needs two per-channel sums over the global batch, summed in one allreduce.
Written with plain tensor ops so it runs on any device and torch version.
"""

import torch
import torch.nn.functional as F
from torch.nn.modules.batchnorm import _BatchNorm

from kolo.torch import mpi_ops


class SyncBatchNorm(_BatchNorm):
    """Applies synchronous batch normalization over N-D inputs (N, C, ...), for 1d, 2d or 3d.

    Arguments match torch.nn.BatchNorm*: num_features, eps, momentum (None for a cumulative
    average), affine, track_running_stats. Outside training, or with one rank, it is plain batch
    norm. Every rank must call forward on the same layers in the same order while training.
    """

    def __init__(self, num_features, eps=1e-5, momentum=0.1, affine=True,
                 track_running_stats=True):
        super().__init__(num_features, eps, momentum, affine, track_running_stats)

    def _check_input_dim(self, input):
        if input.dim() < 2:
            raise ValueError("expected at least 2D input (got %dD input)" % input.dim())

    def forward(self, input):
        self._check_input_dim(input)
        exponential_average_factor = 0.0 if self.momentum is None else self.momentum
        if self.training and self.track_running_stats:
            self.num_batches_tracked.add_(1)
            if self.momentum is None:
                exponential_average_factor = 1.0 / float(self.num_batches_tracked)
        if not self.training or mpi_ops.size() == 1:
            return F.batch_norm(
                input, self.running_mean, self.running_var, self.weight, self.bias,
                self.training or not self.track_running_stats, exponential_average_factor,
                self.eps)
        return _SyncBatchNormFunction.apply(
            input, self.weight, self.bias, self.running_mean, self.running_var, self.eps,
            exponential_average_factor)

    @classmethod
    def convert_sync_batchnorm(cls, module):
        """Returns module with every torch BatchNorm*d layer replaced by a SyncBatchNorm that
        holds the same parameters and buffers."""
        out = module
        if isinstance(module, _BatchNorm) and not isinstance(module, cls):
            out = cls(module.num_features, module.eps, module.momentum, module.affine,
                      module.track_running_stats)
            if module.affine:
                with torch.no_grad():
                    out.weight = module.weight
                    out.bias = module.bias
            out.running_mean = module.running_mean
            out.running_var = module.running_var
            out.num_batches_tracked = module.num_batches_tracked
            out.train(module.training)
        for name, child in module.named_children():
            out.add_module(name, cls.convert_sync_batchnorm(child))
        return out


def _channel_view(t, dim):
    """Reshapes a per-channel vector to broadcast against an input of dim dimensions."""
    return t.view([1, -1] + [1] * (dim - 2))


class _SyncBatchNormFunction(torch.autograd.Function):

    @staticmethod
    def forward(ctx, input, weight, bias, running_mean, running_var, eps, momentum):
        input = input.contiguous()
        c = input.size(1)
        dims = [0] + list(range(2, input.dim()))
        # Statistics in float32 at least, so half-precision inputs do not lose the variance.
        stat_dtype = torch.promote_types(input.dtype, torch.float32)
        x = input.to(stat_dtype)
        count = input.numel() // c if c else 0
        if count > 0:
            mean = x.mean(dims)
            m2 = (x - _channel_view(mean, x.dim())).pow(2).sum(dims)
        else:  # a rank with an empty batch still takes part in the collective
            mean = x.new_zeros(c)
            m2 = x.new_zeros(c)
        local = torch.cat([x.new_tensor([float(count)]), mean, m2]).unsqueeze(0)
        stats = mpi_ops.allgather(local, name=None)  # (ranks, 1 + 2c)
        counts, means, m2s = stats[:, :1], stats[:, 1:1 + c], stats[:, 1 + c:]
        total = counts.sum()
        if total.item() <= 1:
            raise ValueError("SyncBatchNorm: expected more than 1 value per channel in the "
                             "global batch, got %d" % int(total.item()))
        g_mean = (counts * means).sum(0) / total
        g_m2 = (m2s + counts * (means - g_mean).pow(2)).sum(0)
        g_var = g_m2 / total
        invstd = torch.rsqrt(g_var + eps)

        if running_mean is not None:
            with torch.no_grad():
                unbiased = g_m2 / (total - 1)
                running_mean.mul_(1 - momentum).add_(g_mean.to(running_mean.dtype), alpha=momentum)
                running_var.mul_(1 - momentum).add_(unbiased.to(running_var.dtype), alpha=momentum)

        xhat = (x - _channel_view(g_mean, x.dim())) * _channel_view(invstd, x.dim())
        out = xhat
        if weight is not None:
            out = out * _channel_view(weight.to(stat_dtype), x.dim()) + \
                _channel_view(bias.to(stat_dtype), x.dim())
        ctx.save_for_backward(xhat, invstd, weight)
        ctx.total = total
        ctx.input_dtype = input.dtype
        ctx.has_weight = weight is not None
        return out.to(input.dtype)

    @staticmethod
    def backward(ctx, grad_output):
        xhat, invstd, weight = ctx.saved_tensors
        dims = [0] + list(range(2, xhat.dim()))
        dy = grad_output.contiguous().to(xhat.dtype)
        sum_dy = dy.sum(dims)
        sum_dy_xhat = (dy * xhat).sum(dims)
        c = sum_dy.numel()
        both = mpi_ops.allreduce(torch.cat([sum_dy, sum_dy_xhat]), name=None, op=mpi_ops.Sum)
        g_sum_dy, g_sum_dy_xhat = both[:c], both[c:]
        scale = invstd if weight is None else invstd * weight.to(xhat.dtype)
        grad_input = _channel_view(scale, xhat.dim()) * (
            dy - _channel_view(g_sum_dy / ctx.total, xhat.dim())
            - xhat * _channel_view(g_sum_dy_xhat / ctx.total, xhat.dim()))
        grad_weight = grad_bias = None
        if ctx.has_weight:
            # This rank's share; DistributedOptimizer averages it like any other gradient.
            grad_weight = sum_dy_xhat.to(weight.dtype)
            grad_bias = sum_dy.to(weight.dtype)
        return grad_input.to(ctx.input_dtype), grad_weight, grad_bias, None, None, None, None
