"""horovod.torch's start_timeline/stop_timeline: a Chrome trace (chrome://tracing, Perfetto) of
what the engine does to each tensor. Rank 0 writes it, as in Horovod (a path containing {rank}
makes every rank write its own). `kolo run --timeline-filename PATH [--timeline-mark-cycles]`, or
KOLO_TIMELINE / HOROVOD_TIMELINE in the environment, records from init on. The work is in the
engine (timeline/, engine/timeline.go).
"""

import os

from kolo import _lib


def start_timeline(file_path, mark_cycles=False):
    """Starts writing the timeline to file_path (replacing a running one); mark_cycles adds a
    marker for each engine cycle. Call it on every rank; only rank 0 writes."""
    path = os.fsencode(file_path)
    # _lib.C raises before init and in a forked child
    if _lib.C.kolo_start_timeline(path, len(path), 1 if mark_cycles else 0) != 0:
        raise ValueError(_lib.last_error())


def stop_timeline():
    """Finishes the timeline's file (shutdown does too)."""
    if _lib.C.kolo_stop_timeline() != 0:
        raise ValueError(_lib.last_error())
