"""horovod.runner.common.util.env's rank lookup, which Horovod's process-set tests import."""

import os


def get_env_rank_and_size():
    """(rank, size) from the launcher's variables: HOROVOD_* (kolo run sets them), then OpenMPI's,
    then PMI's; (0, 1) when none is set."""
    for rank_var, size_var in (("HOROVOD_RANK", "HOROVOD_SIZE"), ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"),
                               ("PMI_RANK", "PMI_SIZE")):
        rank, size = os.environ.get(rank_var), os.environ.get(size_var)
        if rank is not None and size is not None:
            return int(rank), int(size)
        if rank is not None or size is not None:
            raise RuntimeError("cannot tell this process's rank and size: only one of %s and %s is set"
                               % (rank_var, size_var))
    return 0, 1
