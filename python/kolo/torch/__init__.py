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
    mpi_threads_supported, nccl_built, poll, rank, reducescatter, reducescatter_async, rocm_built,
    sparse_allreduce_async,
    shutdown, size, synchronize,
)
from kolo.torch.process_sets import ProcessSet, global_process_set  # noqa: F401


def _optional(module, names):
    """Re-exports names from a sibling module that may not exist yet in a partial checkout; an
    import error inside an existing module is raised, not hidden."""
    import importlib
    full = "kolo.torch." + module
    try:
        mod = importlib.import_module(full)
    except ModuleNotFoundError as e:
        if e.name != full:
            raise
        return
    for n in names:
        if hasattr(mod, n):
            globals()[n] = getattr(mod, n)


_optional("process_sets", ["add_process_set", "remove_process_set"])
_optional("compression", ["Compression"])
_optional("optimizer", ["DistributedOptimizer"])
_optional("functions", ["broadcast_parameters", "broadcast_optimizer_state", "broadcast_object",
                        "allgather_object"])
_optional("sync_batch_norm", ["SyncBatchNorm"])
_optional("timeline", ["start_timeline", "stop_timeline"])
del _optional

from kolo.torch import elastic  # noqa: E402,F401  (hvd.elastic.run, TorchState, ...)
