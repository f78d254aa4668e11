"""Process sets, as horovod.common.process_sets: ops limited to a subset of the ranks (shared by
kolo.torch and kolo.tensorflow: framework-free).

Every op takes ``process_set=global_process_set`` and passes ``process_set.process_set_id`` to the
engine (0 is the global set). Register a set with ``add_process_set(ranks)`` on every rank (it is
collective, like Horovod's with HOROVOD_DYNAMIC_PROCESS_SETS=1, which kolo needs no setting for),
or with ``hvd.init(process_sets=[...])``. Ops of different sets run independently; only members may
submit to a set. Within a set, broadcast's root_rank is a job rank (as in Horovod), alltoall splits
are per member. The logic lives in the engine (internal/engine/processsets.go); this module only converts.
"""

import ctypes

from kolo import _lib


def _engine_ranks(process_set_id):
    """The job ranks of a registered set, or None if the engine has no such set. (_lib.C raises
    before init and in a forked child.)"""
    f = _lib.C.kolo_process_set_ranks
    n = f(process_set_id, None, 0)
    if n < 0:
        return None
    buf = (ctypes.c_int * n)()
    f(process_set_id, buf, n)
    return list(buf)


class ProcessSet(object):
    """A set of ranks that run collectives among themselves.

    ``process_set_id`` is the engine's id for the set (None until it is registered, and again
    after it is removed)."""

    def __init__(self, ranks):
        self.ranks = sorted(int(r) for r in ranks)
        self.process_set_id = None

    def _is_global(self):
        return self.process_set_id == 0

    def size(self):
        """Number of ranks in the set; None if it is not registered."""
        if self._is_global():
            return _lib.topology()[1]
        return len(self.ranks) if self.process_set_id is not None else None

    def rank(self):
        """This process's index in the set; None if it is not in it or the set is not registered."""
        if self._is_global():
            return _lib.topology()[0]
        if self.process_set_id is None:
            return None
        r = _lib.topology()[0]
        return self.ranks.index(r) if r in self.ranks else None

    def included(self):
        """Whether this process is in the set."""
        return self._is_global() or _lib.topology()[0] in self.ranks

    def invalidate(self):
        """Forgets the registration (remove_process_set does this)."""
        self.process_set_id = None

    def __str__(self):
        return "ProcessSet(process_set_id=%s, ranks=%s)" % (
            self.process_set_id, "all" if self._is_global() else self.ranks)

    __repr__ = __str__


global_process_set = ProcessSet([])
global_process_set.process_set_id = 0

# id -> the ProcessSet objects registered under it, as Horovod keeps them.
_by_id = {0: [global_process_set]}


def _collective(h):
    """Waits (in slices, so Ctrl-C works) for a process set change's handle and releases it;
    returns the handle's kolo_process_set_id."""
    if h < 0:
        raise ValueError(_lib.take_error(-h).args[0])
    if _lib.wait(h) == _lib.FAILED:
        raise ValueError(_lib.take_error(h).args[0])
    psid = _lib.C.kolo_process_set_id(h)
    _lib.C.kolo_release(h)
    return psid


def add_process_set(process_set):
    """Registers process_set (a ProcessSet, or a list of job ranks) on every rank and returns the
    ProcessSet, now with its process_set_id. Collective: every rank calls it with the same ranks,
    in the same order as its other add/remove calls. Raises ValueError if the ranks differ across
    ranks (the message says what each rank sent), if a set with those ranks exists already, or if
    they are all the ranks (that is global_process_set)."""
    if not isinstance(process_set, ProcessSet):
        process_set = ProcessSet(process_set)
    if process_set.process_set_id is not None:
        raise ValueError("%s is registered already" % (process_set,))
    ranks = process_set.ranks
    arr = (ctypes.c_int * max(len(ranks), 1))(*ranks)
    process_set.process_set_id = _collective(_lib.C.kolo_add_process_set(arr, len(ranks)))
    _by_id.setdefault(process_set.process_set_id, []).append(process_set)
    return process_set


def remove_process_set(process_set):
    """Removes process_set on every rank (collectively, as add_process_set) and invalidates it and
    every ProcessSet registered under its id. Returns False, doing nothing, for the global set or
    a set that is not registered; True once removed. Ops of the set still pending fail."""
    psid = process_set.process_set_id
    if psid is None or psid == 0 or _engine_ranks(psid) is None:
        return False
    _collective(_lib.C.kolo_remove_process_set(psid))
    for ps in _by_id.pop(psid, [process_set]):
        ps.invalidate()
    process_set.invalidate()
    return True


def process_set_by_id(process_set_id):
    """The registered ProcessSet with process_set_id."""
    sets = _by_id.get(process_set_id)
    if sets:
        return sets[0]
    ranks = _engine_ranks(process_set_id)
    if ranks is None:
        raise ValueError("no process set with id %s" % (process_set_id,))
    ps = ProcessSet(ranks)
    ps.process_set_id = process_set_id
    _by_id[process_set_id] = [ps]
    return ps


def process_sets():
    """Every registered ProcessSet, by id (the global set first)."""
    return [_by_id[i][0] for i in sorted(_by_id)]


def _init_process_sets(process_sets):
    """hvd.init(process_sets=...): registers each set, in order, on every rank. "dynamic" (Horovod's
    switch for add_process_set after init) needs nothing in kolo."""
    if isinstance(process_sets, str):
        if process_sets != "dynamic":
            raise ValueError("init(process_sets=%r): want a list of ProcessSet or \"dynamic\"" % (process_sets,))
        return
    for ps in process_sets:
        if isinstance(ps, ProcessSet) and ps.process_set_id == 0:
            continue
        add_process_set(ps)
