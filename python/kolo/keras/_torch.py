"""kolo.keras on Keras 3's PyTorch backend: horovod.keras's names over torch tensors, without
TensorFlow or JAX.

Keras on torch runs its train step eagerly (torch autograd, then optimizer.apply under
torch.no_grad), so nothing has to cross out of a compiled program: the ops are kolo.torch's, which
hand the engine each tensor's data_ptr() (a CPU tensor is read and written where it lies; a CUDA
one staged as kolo.torch stages it). Keras variables and numpy arrays are made torch tensors
first (keras.ops.convert_to_tensor).

DistributedOptimizer is kolo._keras's Keras 3 optimizer, as on JAX: in _clip_gradients, which
Keras runs on the gradients just before the update (after its gradient accumulation, and on the
updating steps only), the gradients go to the engine as one grouped op named
"<optimizer name>.grads" (each member's shape checked across ranks) and the update uses the
reduced ones. A collective that fails reaches the script as kolo's HorovodInternalError, raised
from model.fit.
"""

import keras
import torch

from kolo import _keras, _lib
from kolo._job import (  # noqa: F401 (re-exported: the same for every binding)
    ccl_built, cross_rank, cross_size, ddl_built, gloo_built, gloo_enabled, is_homogeneous, is_initialized,
    local_rank, local_size, mpi_built, mpi_enabled, mpi_threads_supported, rank, rank_stats, rocm_built, shutdown,
    size, start_timeline, stop_timeline,
)
from kolo._lib import HorovodInternalError, KoloInternalError  # noqa: F401 (re-exported)
from kolo._objects import allgather_object, broadcast_object, broadcast_object_fn  # noqa: F401
from kolo._ops import Adasum, Average, Max, Min, Product, Sum  # noqa: F401 (re-exported)
from kolo.process_sets import (  # noqa: F401 (re-exported)
    ProcessSet, add_process_set, global_process_set, remove_process_set,
)
from kolo.torch import mpi_ops as _mpi
from kolo.torch.compression import (  # noqa: F401 (re-exported)
    BF16Compressor, Compression, Compressor, FP16Compressor, NoneCompressor,
)
from kolo.torch.mpi_ops import cuda_built, init, nccl_built  # noqa: F401 (re-exported)


def _tensor(x):
    """x (a torch tensor, a Keras variable, a numpy array or a number) as a torch tensor, without
    a copy where it is one already."""
    if isinstance(x, torch.Tensor):
        return x
    return keras.ops.convert_to_tensor(x)


# ----------------------------------------------------------------------------------------------
# The ops: kolo.torch's, with horovod.keras's signatures

def allreduce(tensor, average=None, device_dense="", device_sparse="", compression=Compression.none, op=None,
              prescale_factor=1.0, postscale_factor=1.0, name=None, process_set=global_process_set):
    """Returns tensor reduced across ranks (Average by default), as a torch tensor; differentiable
    (its gradient is the same allreduce of the output's gradient, as Horovod's). device_dense and
    device_sparse are accepted for Horovod's signature."""
    return _mpi.allreduce(_tensor(tensor), average=average, name=name, compression=compression, op=op,
                          prescale_factor=prescale_factor, postscale_factor=postscale_factor, process_set=process_set)


def grouped_allreduce(tensors, average=None, device_dense="", device_sparse="", compression=Compression.none,
                      op=None, prescale_factor=1.0, postscale_factor=1.0, name=None, process_set=global_process_set):
    """Every tensor reduced across ranks, as one grouped op (released together on every rank)."""
    return _mpi.grouped_allreduce([_tensor(t) for t in tensors], average=average, name=name, compression=compression,
                                  op=op, prescale_factor=prescale_factor, postscale_factor=postscale_factor,
                                  process_set=process_set)


def allgather(tensor, name=None, process_set=global_process_set):
    """Returns every rank's tensor concatenated along the first dimension, in rank order (the first
    dimensions may differ across ranks)."""
    return _mpi.allgather(_tensor(tensor), name=name, process_set=process_set)


def broadcast(tensor, root_rank, name=None, process_set=global_process_set):
    """Returns root_rank's tensor on every rank (root_rank is a job rank, also within a process
    set)."""
    return _mpi.broadcast(_tensor(tensor), root_rank, name=name, process_set=process_set)


def reducescatter(tensor, device_dense="", compression=Compression.none, op=Average, name=None,
                  process_set=global_process_set, prescale_factor=1.0, postscale_factor=1.0):
    """Returns this rank's share (dimension 0; the first dim0 % size ranks get one row more) of
    tensor reduced across ranks."""
    return _mpi.reducescatter(_tensor(tensor), name=name, compression=compression, op=op, process_set=process_set,
                              prescale_factor=prescale_factor, postscale_factor=postscale_factor)


def alltoall(tensor, splits=None, name=None, process_set=global_process_set):
    """Scatters tensor's first dimension to the ranks (splits rows each; equal shares without
    splits) and returns what every rank sent this one, concatenated: (output, received_splits)
    with splits, output alone without."""
    return _mpi.alltoall(_tensor(tensor), splits=splits, name=name, process_set=process_set)


def barrier(process_set=global_process_set):
    """Returns once every rank of the set has called barrier."""
    _mpi.barrier(process_set=process_set)


def join():
    """Says this rank has no more data: other ranks' allreduces go on with it contributing
    nothing until every rank joined. Returns the last rank to join."""
    return _mpi.join()


# ----------------------------------------------------------------------------------------------
# Keras

class _TorchDistributedOptimizer(_keras.Keras3DistributedOptimizer):
    """kolo._keras's Keras 3 distributed optimizer on torch: Keras calls _clip_gradients on the
    updating steps only (its accumulation is a Python branch on torch), so every call reduces."""

    def _hvd_allreduce_grads(self, grads, name, op, prescale, postscale, process_set):
        # Out of place: the inputs are the parameters' .grad (or Keras's accumulated sums), which
        # the engine reads where they lie; the outputs are fresh tensors the update consumes.
        out = _mpi.synchronize(_mpi.grouped_allreduce_async(grads, name=name, op=op, prescale_factor=prescale,
                                                            postscale_factor=postscale, process_set=process_set))
        _lib.mark_step()
        return out


_api = _keras.keras3_api(_TorchDistributedOptimizer, Compression.none, "torch")
DistributedOptimizer = _api["DistributedOptimizer"]
PartialDistributedOptimizer = _api["PartialDistributedOptimizer"]
load_model = _api["load_model"]
broadcast_global_variables = _keras.broadcast_global_variables


def broadcast_variables(variables, root_rank, process_set=global_process_set):
    """Assigns root_rank's values to variables (Keras variables) on every rank."""
    _keras.broadcast_variables(variables, root_rank, process_set)
