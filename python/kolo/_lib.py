"""Loads libkolo.so, the Go engine built with -buildmode=c-shared, and wraps its C ABI (capi/).

Framework-free: tensors are raw pointers here, the torch layer (kolo.torch.mpi_ops) turns tensors
into them. Three rules shape this module:

* A process forked after the engine started (a DataLoader worker with the fork start method) must
  never call into Go: the runtime's threads did not survive the fork, and anything that needs its
  scheduler hangs. The fork hook below swaps the library for an object whose every use raises
  KoloForkError. The topology (rank, size, ...) is cached in Python and keeps working there.
* ctypes releases the GIL for each call, but Python handles signals only between calls: waits are
  slices of WAIT_SLICE_US in a Python loop, so Ctrl-C interrupts a hung collective promptly. An op
  that completes within a slice returns at once. Joining and leaving the job wait on the other
  ranks too, so they are handles waited on the same way (_call).
* Errors of ops become KoloInternalError (HorovodInternalError is the same class), what
  horovod.torch raises and what elastic training scripts catch; an op the ranks disagreed on, its
  subclass KoloMismatchError (the engine's kolo_error_kind tells them apart).
"""

import atexit
import ctypes
import json
import os
import sys
import traceback

LIBRARY_ENV = "KOLO_LIBRARY"  # path of libkolo.so, to use another build than the package's
WAIT_SLICE_US = 50000


class KoloInternalError(RuntimeError):
    """A collective failed in the engine: a rank left or failed, ranks disagreed on an op, or the
    job was shut down. The message names the op, the ranks involved and what each sent."""


HorovodInternalError = KoloInternalError


class KoloMismatchError(KoloInternalError):
    """A collective the ranks disagreed on (its dtype, shape, reduce op, root, ...) or could not
    run as they submitted it (a rank refused its arguments): every rank needed was there, and the
    job goes on. A KoloInternalError, as horovod.torch raises HorovodInternalError for it;
    kolo.tensorflow raises tf.errors.FailedPreconditionError, as horovod.tensorflow does."""


class HostsUpdatedInterrupt(RuntimeError):
    """The launcher published a new round of an elastic job (workers added or removed), and every
    rank raised this at the same commit (kolo.elastic.State.check_host_updates). Not an error:
    hvd.elastic.run resets without restoring the committed state, and skips the state sync when
    skip_sync (the round only removed workers, so nobody needs the state)."""

    def __init__(self, skip_sync):
        super().__init__("the hosts of the elastic job changed (skip_sync=%s)" % bool(skip_sync))
        self.skip_sync = skip_sync


class KoloForkError(RuntimeError):
    """kolo was called in a process forked from one that had started the engine."""


def library_path():
    """Where the engine library is loaded from: $KOLO_LIBRARY, else the package's lib/."""
    return os.environ.get(LIBRARY_ENV) or os.path.join(
        os.path.dirname(os.path.abspath(__file__)), "lib", "libkolo.so")


class _Unavailable(object):
    """Stands in for the library where it must not be called; any use raises."""

    def __init__(self, make_error):
        self._make_error = make_error

    def __getattr__(self, name):
        raise self._make_error()


def _not_initialized():
    return ValueError("kolo has not been initialized; use hvd.init().")


# C is the loaded library (ctypes.CDLL) once init() has run; callers use C.kolo_... directly, so
# that the fork hook can replace it.
C = _Unavailable(_not_initialized)
_lib = None         # the CDLL, once loaded (it is never unloaded: Go cannot be)
_loaded_pid = None  # the process that loaded it
_topology = None    # (rank, size, local_rank, local_size, cross_rank, cross_size, homogeneous)

# The C ABI's signatures (capi/*.go, and the header `make lib` writes beside the library): the one
# place they are declared. _load sets every one on the library; other modules call _lib.C.kolo_...
# and declare none of their own (tests check both against the header).
_i, _i64, _d, _p, _s = ctypes.c_int, ctypes.c_int64, ctypes.c_double, ctypes.c_void_p, ctypes.c_char_p
_SIGNATURES = {
    "kolo_version": (_i, [_s, _i]),
    "kolo_last_error": (_i, [_s, _i]),
    "kolo_init_async": (_i64, [_p, _i]),  # ranks (int64s, or None for every rank), count
    "kolo_shutdown_async": (_i64, []),
    "kolo_abort": (_i, [_s, _i]),
    "kolo_report_failure": (_i, [_s, _i, _i]),  # reason, length, own (1: the program's exception)
    "kolo_mark_step": (None, []),
    "kolo_rank_stats": (_i, [_s, _i]),
    "kolo_is_initialized": (_i, []),
    "kolo_failed": (_i, []),
    "kolo_rank": (_i, []),
    "kolo_size": (_i, []),
    "kolo_local_rank": (_i, []),
    "kolo_local_size": (_i, []),
    "kolo_cross_rank": (_i, []),
    "kolo_cross_size": (_i, []),
    "kolo_is_homogeneous": (_i, []),
    # one op: a kolo_op and the arrays after it (kolo._ops.op_block builds it), its size
    "kolo_enqueue": (_i64, [_s, _i]),
    # kind, name, name length, n, ins, outs, dtypes, shapes, ndims, op, prescale, postscale,
    # process set id, device (as kolo_enqueue's), stream (-1: host memory; else the producer's
    # cudaStream_t of a group on the device path), handles (out)
    "kolo_enqueue_group": (_i, [_i, _s, _i, _i, _p, _p, _p, _p, _p, _i, _d, _d, _i, _i, _i64, _p]),
    "kolo_poll": (_i, [_i64]),
    "kolo_wait": (_i, [_i64, _i64, _i]),
    "kolo_error": (_i, [_i64, _s, _i]),
    "kolo_error_kind": (_i, [_i64]),
    # kind, name, name length, group size (0: not grouped), reason, reason length, process set id
    "kolo_refuse": (_i64, [_i, _s, _i, _i, _s, _i, _i]),
    "kolo_result": (_i64, [_i64, _p, _i]),
    "kolo_result_copy": (_i64, [_i64, _p, _i64]),
    "kolo_recv_splits": (_i, [_i64, _p, _i]),
    "kolo_join_last": (_i, [_i64]),
    "kolo_release": (None, [_i64]),
    "kolo_handles": (_i, []),
    # process sets (kolo.process_sets)
    "kolo_add_process_set": (_i64, [_p, _i]),
    "kolo_remove_process_set": (_i64, [_i]),
    "kolo_process_set_id": (_i, [_i64]),
    "kolo_process_set_ranks": (_i, [_i, _p, _i]),
    # timeline (kolo._job)
    "kolo_start_timeline": (_i, [_s, _i, _i]),
    "kolo_stop_timeline": (_i, []),
    # the GPU data path (capi/device.go): ordinal, NCCL library path, its length
    "kolo_device_setup": (_i64, [_i, _s, _i]),
    "kolo_device_decision": (_i, []),
    "kolo_device_why": (_i, [_s, _i]),
    # a kolo_op block (device addresses, device = the ordinal), its size, producer cudaStream_t
    "kolo_enqueue_device": (_i64, [_s, _i, _i64]),
    "kolo_device_wait_stream": (_i, [_i64, _i64]),  # handle, consumer cudaStream_t
    "kolo_device_sync": (_i, [_i64, _i64]),  # handle, timeout (us)
    "kolo_device_result": (_i64, [_i64, _p, _p, _i]),  # handle, address (int64 out), shape, ndim
    "kolo_device_release": (_i, [_i64, _i64]),  # handle, the stream that copied the result
    # elastic mode (kolo.elastic)
    "kolo_elastic_enabled": (_i, []),
    "kolo_elastic_round": (_i64, []),
    "kolo_elastic_update": (_i, [_p, _p]),  # newest (int64 out), removal_only (int out)
}

# Handle status, as kolo_poll and kolo_wait return it.
UNKNOWN, PENDING, OK, FAILED = -1, 0, 1, 2


_RAISE = object()


def _string(fn, *args, failed=_RAISE):
    """Calls fn(*args, buf, cap), which returns the length it needs, with a large enough buffer.
    -1 (an unknown handle) returns failed, or raises ValueError with the library's reason."""
    n = 512
    while True:
        buf = ctypes.create_string_buffer(n)
        need = fn(*args, buf, n)
        if need < 0:
            if failed is not _RAISE:
                return failed
            raise ValueError("kolo: %s" % last_error())
        if need < n:
            return buf.value.decode("utf-8", "replace")
        n = need + 1


def last_error():
    """Why the last call into the library that returned -1 failed (capi's kolo_last_error); "" when
    there is none to read: before the library is loaded, or in a forked child, which cannot call
    into it (and made no call of its own that failed). Callers read it while reporting an error:
    it never raises, so that it cannot hide the error being reported."""
    if _lib is None or _forked():
        return ""
    return _string(C.kolo_last_error, failed="")


def _fork_error():
    return KoloForkError(
        "kolo: this process (pid %d) was forked from pid %d after it started kolo's engine, and a "
        "forked child cannot call into it (the Go runtime's threads do not survive fork). Run "
        "collectives in the parent only; DataLoader workers may read hvd.rank()/hvd.size(). If a "
        "child needs kolo, start it with multiprocessing's 'spawn' or 'forkserver' method."
        % (os.getpid(), _loaded_pid))


def _after_fork_in_child():
    global C
    if _lib is not None:
        C = _Unavailable(_fork_error)


os.register_at_fork(after_in_child=_after_fork_in_child)


def _forked():
    return _lib is not None and os.getpid() != _loaded_pid


def _load():
    global _lib, _loaded_pid, C
    if _lib is not None:
        if _forked():
            raise _fork_error()
        return _lib
    path = library_path()
    if not os.path.exists(path):
        raise ImportError(
            "kolo: engine library not found at %s. Build it with `make lib` in a kolo checkout "
            "(needs Go), install a kolo wheel, or point %s at a libkolo.so." % (path, LIBRARY_ENV))
    lib = ctypes.CDLL(path)
    for name, (restype, argtypes) in _SIGNATURES.items():
        fn = getattr(lib, name)
        fn.restype, fn.argtypes = restype, argtypes
    from kolo import __version__
    have = _string(lib.kolo_version)
    if have != __version__:
        raise ImportError(
            "kolo: the engine library %s is version %s but the Python package is %s; rebuild it "
            "(`make lib`) or reinstall kolo" % (path, have, __version__))
    _lib, _loaded_pid = lib, os.getpid()
    C = lib
    return lib


def library_version():
    """The version of the engine library (loading it if needed)."""
    return _string(_load().kolo_version)


# (handle, "init" or "shutdown"): a call whose wait Ctrl-C interrupted. It goes on in the engine,
# and the next init() or shutdown() waits for it before doing anything else.
_pending = None


def _call(start, what):
    """Runs a blocking engine call (init, shutdown: they wait for the other ranks) that start()
    begins and returns a handle for, waiting for it in slices as synchronize() does, so that
    Ctrl-C interrupts the wait. Raises KoloInternalError if the call failed."""
    global _pending
    h = start()
    if h < 0:
        raise take_error(-h)
    _pending = (h, what)
    err = _finish_pending()[1]
    if err is not None:
        raise err


def _finish_pending():
    """Waits (in slices) for the pending call and returns (what, its KoloInternalError or None);
    (None, None) when there is none. KeyboardInterrupt leaves it pending."""
    global _pending
    if _pending is None:
        return None, None
    h, what = _pending
    st = wait(h)
    _pending = None
    if st == FAILED:
        return what, take_error(h)
    C.kolo_release(h)
    return what, None


def init(ranks=None):
    """Joins the job (idempotent, as Horovod's init is); with ranks, a world of only those ranks
    of the launcher's job (kolo.WithRanks). After the engine stopped on an error (a lost or
    failed rank), init() joins a new world with the ranks that call it again. Ctrl-C interrupts
    the wait for the other ranks; joining goes on in the engine, and calling init() again waits
    for it. Returns whether it joined a world (False: already in one)."""
    global _topology
    lib = _load()
    # An init or shutdown that Ctrl-C interrupted: its outcome is the engine's state. An init that
    # then failed fails this call with its error, rather than losing it to a fresh init that waits
    # for the ranks again (up to a whole setup timeout); after that, the next init() starts anew.
    what, err = _finish_pending()
    if what == "init" and err is not None:
        raise err
    joined = False
    if not lib.kolo_is_initialized() or lib.kolo_failed():
        # Not yet, or the engine stopped on an error (a lost rank, a failed collective): join a
        # new world, with the ranks that call init() again.
        _topology = None
        arr = None if ranks is None else (ctypes.c_int64 * max(len(ranks), 1))(*ranks)
        n = 0 if ranks is None else len(ranks)
        _call(lambda: lib.kolo_init_async(arr, n), "init")
        joined = True
    if _topology is None:
        _topology = (lib.kolo_rank(), lib.kolo_size(), lib.kolo_local_rank(), lib.kolo_local_size(),
                     lib.kolo_cross_rank(), lib.kolo_cross_size(), lib.kolo_is_homogeneous() == 1)
    _install_excepthook()
    return joined


def comm_ranks(comm):
    """The job ranks of a binding's init(comm=...) (None: every rank): a list of ranks, or an
    mpi4py communicator, read for its members' world ranks."""
    if comm is None:
        return None
    if isinstance(comm, (list, tuple)):
        try:
            ranks = [int(r) for r in comm]
        except (TypeError, ValueError):
            raise ValueError("init(comm=...): a list of ranks must hold integers, got %r" % (comm,))
        if not ranks:
            raise ValueError("init(comm=[]): the list of ranks is empty")
        return ranks
    # An mpi4py communicator: map its members to MPI_COMM_WORLD ranks, which are the launcher's
    # ranks under mpirun (kolo's ranks are the world ranks there).
    # Not imported here: importing mpi4py.MPI initializes MPI, which aborts the process where no
    # MPI runtime can start; a caller holding a communicator has imported it already.
    MPI = sys.modules.get("mpi4py.MPI")
    if MPI is None:
        raise ValueError("init(comm=%r): comm is neither a list of ranks nor an mpi4py "
                         "communicator (mpi4py.MPI is not imported)" % (comm,))
    if not isinstance(comm, MPI.Comm):
        raise ValueError("init(comm=...): want a list of ranks or an mpi4py communicator, got %s"
                         % type(comm).__name__)
    group = comm.Get_group()
    try:
        world = MPI.COMM_WORLD.Get_group()
        try:
            return list(MPI.Group.Translate_ranks(group, list(range(group.Get_size())), world))
        finally:
            world.Free()
    finally:
        group.Free()


def abort(reason):
    """Tells every rank that this one failed, and why: their ops fail with "rank N failed: <reason>"
    instead of "rank N lost". A no-op when not initialized."""
    if _topology is None or _lib is None or _forked():
        return
    b = reason.encode("utf-8", "replace")
    _lib.kolo_abort(b, len(b))


def mark_step():
    """Tells kolo that one training step ended (the autotuner times the job by these marks). A
    no-op when not initialized."""
    if _topology is None or _lib is None or _forked():
        return
    _lib.kolo_mark_step()


def rank_stats():
    """This rank's figures since init, as its reports give kolo run's live view and end table (a
    dict; times in seconds): steps, step_median, step_p95, in_collectives, up, bytes_reduced,
    ops_done, ops_failed, and on rank 0 lateness ({rank: seconds after the median of the others})
    and slowest (the rank the others wait for, -1 for none)."""
    topology()  # ValueError before init
    if _forked():
        raise _fork_error()
    d = json.loads(_string(C.kolo_rank_stats))
    d["lateness"] = {int(k): v for k, v in (d.get("lateness") or {}).items()}
    return d


_previous_excepthook = None


def _install_excepthook():
    """Chains sys.excepthook so that an uncaught exception on any rank reaches the others as the
    reason their ops fail. Once per process; a hook installed later by the script still runs ours
    if it calls the one it replaced."""
    global _previous_excepthook
    if _previous_excepthook is not None:
        return
    _previous_excepthook = sys.excepthook
    sys.excepthook = _excepthook


def _excepthook(tp, value, tb):
    report_failure(value)
    _previous_excepthook(tp, value, tb)


def report_failure(exc):
    """Tells kolo run that this rank is leaving on exception exc, in a failure record the engine
    library builds (kolo_report_failure): for the program's own exception, every other rank's ops
    also fail with "rank N failed: <exc's last line>"; for kolo's own error, the record says which
    rank it traces back to. Not for Ctrl-C and exits (the launcher reports those); a no-op when not
    initialized. Used by the exception hook and by kolo.run's workers. Never raises: it runs while
    exc is being reported, and must not mask it."""
    try:
        if isinstance(exc, (KeyboardInterrupt, SystemExit)) or _topology is None or _forked():
            return
        what = "".join(traceback.format_exception_only(type(exc), exc)).strip().splitlines()
        b = (what[-1] if what else type(exc).__name__).encode("utf-8", "replace")
        _lib.kolo_report_failure(b, len(b), 0 if isinstance(exc, KoloInternalError) else 1)
    except Exception:
        pass


def shutdown():
    """Waits for every rank to reach shutdown, then leaves the job. A no-op when not initialized.
    Ctrl-C interrupts the wait; the engine goes on leaving, and calling shutdown() (or init())
    again waits for it."""
    global _topology
    if _lib is None or (_topology is None and _pending is None):
        return
    if _forked():
        raise _fork_error()
    _topology = None
    what, err = _finish_pending()
    if what == "shutdown":  # an interrupted shutdown, now complete
        if err is not None:
            raise err
        return
    if _lib.kolo_is_initialized():
        _call(_lib.kolo_shutdown_async, "shutdown")


def _shutdown_at_exit():
    # As shutdown() decides: an init or shutdown that Ctrl-C interrupted (_pending) still owes the
    # other ranks the shutdown barrier, though _topology is None.
    if _lib is None or (_topology is None and _pending is None) or _forked():
        return
    if getattr(sys, "last_value", None) is not None:
        # Exiting on an uncaught exception (the hook sent its failure record): the shutdown
        # barrier would wait for ranks that are themselves waiting on this one. Leave at once,
        # so that peers see it lost now rather than after the timeout.
        return
    try:
        shutdown()
    except Exception as e:  # the process is exiting: report, do not mask its real exit status
        sys.stderr.write("kolo: shutdown at exit: %s\n" % e)


atexit.register(_shutdown_at_exit)


def is_initialized():
    return _topology is not None


def elastic_enabled():
    """Whether this process is a worker of an elastic `kolo run` job (loads the library; answers
    before init)."""
    return _load().kolo_elastic_enabled() == 1


def elastic_round():
    """The elastic round this worker is in (1, 2, ...); 0 when not elastic or not initialized."""
    if _topology is None or _forked():
        return 0
    return _lib.kolo_elastic_round()


def elastic_update():
    """(newest, removal_only) when the launcher has published a round newer than this worker's,
    else None: removal_only when that round only removed workers. ValueError when not
    initialized."""
    if _topology is None:
        raise _not_initialized()
    newest, removal_only = ctypes.c_int64(0), ctypes.c_int(0)
    got = C.kolo_elastic_update(ctypes.byref(newest), ctypes.byref(removal_only))
    if got < 0:
        raise ValueError("kolo: %s" % last_error())
    return (newest.value, removal_only.value == 1) if got == 1 else None


def topology():
    """(rank, size, local_rank, local_size, cross_rank, cross_size, homogeneous); ValueError
    before init. Cached, so it also answers in forked children."""
    if _topology is None:
        raise _not_initialized()
    return _topology


def error(h):
    """The error text of a failed op."""
    return _string(C.kolo_error, h)


def wait(h, release=0):
    """Waits for handle h in slices, so that signals are handled; returns OK or FAILED. With
    release, a handle that completed successfully is released."""
    kolo_wait = C.kolo_wait
    st = kolo_wait(h, WAIT_SLICE_US, release)
    while st == PENDING:
        st = kolo_wait(h, WAIT_SLICE_US, release)
    if st == UNKNOWN:
        raise ValueError("kolo: %s (already synchronized or released?)" % last_error())
    return st


# kolo_error_kind: how an op failed (capi/ops.go); ERROR_UNAVAILABLE: a device op the GPU data path
# cannot run, which the binding stages through host memory instead.
ERROR_FAILED, ERROR_ARGUMENT, ERROR_UNAVAILABLE, ERROR_MISMATCH = 1, 2, 3, 4


def take_error(h):
    """The exception of failed handle h, which it releases: ValueError for arguments this rank
    refused (as Horovod raises for invalid arguments: the other ranks' submissions of the op fail
    with the reason, as a KoloMismatchError), KoloMismatchError for an op the ranks disagreed on,
    KoloInternalError (HorovodInternalError) for an op that failed otherwise (a rank lost, ended
    or stalled)."""
    msg = error(h)
    kind = C.kolo_error_kind(h)
    C.kolo_release(h)
    if kind == ERROR_ARGUMENT:
        return ValueError(msg)
    if kind == ERROR_MISMATCH:
        return KoloMismatchError(msg)
    return KoloInternalError(msg)
