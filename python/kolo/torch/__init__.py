"""horovod.torch's API on kolo's Go engine: change ``import horovod.torch as hvd`` to
``import kolo.torch as hvd`` and start the script with ``kolo run -np N python train.py``.

Nothing here links against libtorch: tensors reach the engine as pointers, so one build serves
every torch version.
"""

from kolo._lib import HorovodInternalError, KoloForkError, KoloInternalError  # noqa: F401
from kolo.torch.mpi_ops import (  # noqa: F401
    Adasum, Average, Max, Min, Product, Sum,
    allgather, allgather_async, allreduce, allreduce_, allreduce_async, allreduce_async_, alltoall,
    alltoall_async, barrier, broadcast, broadcast_, broadcast_async, broadcast_async_, ccl_built,
    cross_rank, cross_size, cuda_built, ddl_built, gloo_built, gloo_enabled, grouped_allgather,
    grouped_allgather_async, grouped_allreduce, grouped_allreduce_, grouped_allreduce_async,
    grouped_allreduce_async_, grouped_reducescatter, grouped_reducescatter_async, init,
    is_homogeneous, is_initialized, join, local_rank, local_size, mpi_built, mpi_enabled,
    mpi_threads_supported, nccl_built, poll, rank, rank_stats, reducescatter, reducescatter_async, rocm_built,
    sparse_allreduce_async,
    shutdown, size, synchronize,
)
from kolo.torch.compression import Compression  # noqa: F401
from kolo.torch.functions import (  # noqa: F401
    allgather_object, broadcast_object, broadcast_optimizer_state, broadcast_parameters,
)
from kolo.torch.optimizer import DistributedOptimizer  # noqa: F401
from kolo.torch.process_sets import (  # noqa: F401
    ProcessSet, add_process_set, global_process_set, remove_process_set,
)
from kolo.torch.sync_batch_norm import SyncBatchNorm  # noqa: F401
from kolo.torch.timeline import start_timeline, stop_timeline  # noqa: F401

from kolo.torch import elastic  # noqa: F401  (hvd.elastic.run, TorchState, ...)
