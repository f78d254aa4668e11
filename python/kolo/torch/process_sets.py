"""horovod.torch.process_sets: kolo.process_sets, which every binding shares (a set is registered
in the engine once, whichever framework's ops then use it)."""

from kolo.process_sets import (  # noqa: F401
    ProcessSet, _by_id, _collective, _engine_ranks, _init_process_sets, add_process_set, global_process_set,
    process_set_by_id, process_sets, remove_process_set,
)
