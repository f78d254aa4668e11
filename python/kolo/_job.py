"""This process's place in the job, what the build has, and the timeline: framework-free, the same
for every binding (kolo.torch and kolo.tensorflow re-export these under Horovod's names).

The topology comes from the engine once init has run (kolo._lib caches it, so that a forked child
still answers); every query raises before init, as Horovod's do.
"""

import os

from kolo import _lib


def shutdown():
    """Waits until every rank reaches shutdown, then leaves the job."""
    _lib.shutdown()


def is_initialized():
    return _lib.is_initialized()


def size():
    """Number of ranks in the job."""
    return _lib.topology()[1]


def rank():
    """This process's rank in the job."""
    return _lib.topology()[0]


def local_size():
    """Number of ranks on this host."""
    return _lib.topology()[3]


def local_rank():
    """This process's index among the ranks of its host."""
    return _lib.topology()[2]


def cross_size():
    """Number of hosts that run a rank with this process's local rank."""
    return _lib.topology()[5]


def cross_rank():
    """This host's index among the hosts that run a rank with this local rank."""
    return _lib.topology()[4]


def is_homogeneous():
    """Whether every host runs the same number of ranks."""
    return _lib.topology()[6]


def rank_stats():
    """This rank's figures since init, the ones kolo run's live view and end table show (kolo
    only): a dict with steps (the DistributedOptimizer's), step_median and step_p95 (seconds, over
    the last 256 steps), in_collectives and up (seconds), bytes_reduced, ops_done, ops_failed, and
    on rank 0 lateness ({rank: seconds it arrives after the median of the others}) and slowest (the
    rank the others wait for, -1 for none)."""
    return _lib.rank_stats()


# What no build of kolo has: MPI, Gloo, DDL, oneCCL or ROCm code. (NCCL and CUDA differ by binding:
# each answers nccl_built and cuda_built itself.)
def mpi_threads_supported():
    _lib.topology()  # raises before init, as Horovod's does
    return False


def mpi_enabled():
    return False


def mpi_built():
    return False


def gloo_enabled():
    return False


def gloo_built():
    return False


def ddl_built():
    return False


def ccl_built():
    return False


def rocm_built():
    return False


def start_timeline(file_path, mark_cycles=False):
    """Starts writing the engine's timeline (a Chrome trace of what it does to each tensor) to
    file_path, replacing a running one; mark_cycles adds a marker for each engine cycle. Call it on
    every rank; rank 0 writes, as in Horovod (a path containing {rank} makes every rank write its
    own). `kolo run --timeline-filename PATH`, or KOLO_TIMELINE / HOROVOD_TIMELINE, records from
    init on."""
    path = os.fsencode(file_path)
    # _lib.C raises before init and in a forked child
    if _lib.C.kolo_start_timeline(path, len(path), 1 if mark_cycles else 0) != 0:
        raise ValueError(_lib.last_error())


def stop_timeline():
    """Finishes the timeline's file (shutdown does too)."""
    if _lib.C.kolo_stop_timeline() != 0:
        raise ValueError(_lib.last_error())
