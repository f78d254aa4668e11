"""Runs the conformance cases on every rank of one job and reports each case's outcome:

    KOLO_STALL_CROSSED_TIME_SECONDS=3 PYTHONPATH=python bin/kolo run -np 3 /usr/bin/python3 \\
        python/tests/conformance/runner.py [MODULE | MODULE.CASE ...] [--modules=M1,M2]

KOLO_TEST_DEVICE=cuda puts every case's tensors on the GPU (conformance/device.py).

Every rank runs the same cases in the same order. A watchdog thread gives each case its deadline:
a rank that overruns prints which case timed out with a stack dump of its threads, and ends the
job (exit TIMEOUT_EXIT), so a hang costs a deadline, not CI's patience. After each case the ranks
exchange their outcomes with an allgather named after the case; rank 0 prints one line per case
(PASS / FAIL with each failing rank and its errors / XFAIL / XPASS / SKIP) and the same as a
"CONFORMANCE {json}" line that ../test_conformance.py parses. A case that raised on one rank
while the others wait in a collective costs KOLO_STALL_CROSSED_TIME_SECONDS (the engine then fails
the ops of ranks whose calls went different ways; this job wants it at 3 s), and the report still
comes: the outcome exchange is retried under the same name until the ranks meet in it.

Exit status: 0 when every case reported (whatever the outcomes), TIMEOUT_EXIT when a case or an
outcome exchange overran its deadline, SYNC_EXIT when the ranks could not exchange outcomes.
"""

import faulthandler
import importlib
import json
import os
import sys
import threading
import time

# The case modules, in the order they run. init first: it re-initializes the world.
MODULES = ("init", "allreduce", "grouped", "allgather", "broadcast", "alltoall", "reducescatter",
           "barrier_join", "process_sets", "optimizer", "functions", "sparse", "adasum", "errors")
MARK = "CONFORMANCE "
TIMEOUT_EXIT = 97
SYNC_EXIT = 98
SYNC_DEADLINE = 30.0   # seconds for the outcome exchange after a case, retries included
SYNC_TRIES = 6
STALL_CROSSED = "3"    # KOLO_STALL_CROSSED_TIME_SECONDS unless the environment says otherwise


def emit(event):
    """Prints one machine-readable report line."""
    sys.stdout.write(MARK + json.dumps(event, sort_keys=True) + "\n")
    sys.stdout.flush()


class Watchdog(threading.Thread):
    """Ends the job when what it is armed for overruns its deadline, with a stack dump."""

    def __init__(self, rank):
        threading.Thread.__init__(self, name="conformance-watchdog", daemon=True)
        self.rank = rank
        self.lock = threading.Lock()
        self.what = None
        self.phase = None
        self.seconds = 0.0
        self.deadline = None

    def arm(self, what, phase, seconds):
        with self.lock:
            self.what, self.phase, self.seconds = what, phase, seconds
            self.deadline = time.monotonic() + seconds

    def disarm(self):
        with self.lock:
            self.deadline = None

    def run(self):
        while True:
            time.sleep(0.1)
            with self.lock:
                late = self.deadline is not None and time.monotonic() > self.deadline
                what, phase, seconds = self.what, self.phase, self.seconds
            if late:
                self.fire(what, phase, seconds)

    def fire(self, what, phase, seconds):
        try:
            emit({"event": "timeout", "case": what, "phase": phase, "rank": self.rank,
                  "deadline": seconds})
            sys.stdout.write("TIMEOUT %s on rank %d: %s still running after %.0f s; its threads:\n"
                             % (what, self.rank, phase, seconds))
            sys.stdout.flush()
            faulthandler.dump_traceback(file=sys.stdout, all_threads=True)
            sys.stdout.flush()
        finally:
            os._exit(TIMEOUT_EXIT)


def load_cases(modules, selection):
    """[(name, fn)] of every case of modules (or of the selected modules / module.case names)."""
    from conformance.case import cases_of
    out = []
    for m in modules:
        if selection and m not in selection and not any(s.startswith(m + ".") for s in selection):
            continue
        mod = importlib.import_module("conformance." + m)
        for fn in cases_of(mod):
            name = "%s.%s" % (m, fn.__name__)
            if selection and m not in selection and name not in selection:
                continue
            out.append((name, fn))
    return out


def restore_world(hvd, size):
    """A case that shut kolo down, or left this rank in a world of another size, gets the job's
    world back before the outcome exchange."""
    if hvd.is_initialized() and hvd.size() == size:
        return None
    try:
        if hvd.is_initialized():
            hvd.shutdown()
        hvd.init()
    except Exception as e:  # reported with the case; the exchange will tell whether it matters
        return "could not restore the job's world: %s: %s" % (type(e).__name__, e)
    return "left kolo %s" % ("in another world" if hvd.is_initialized() else "shut down")


def drain(mpi_ops):
    """Waits for the ops a case left unsynchronized (so that they cannot collide with the next
    case's); returns how many there were."""
    handles = list(mpi_ops._handle_map)
    for h in handles:
        try:
            mpi_ops.synchronize(h)
        except Exception:
            pass
    mpi_ops._handle_map.clear()
    return len(handles)


def exchange(hvd, name, outcome):
    """Every rank's outcome of case name, by rank. A rank that raised in a case may reach this
    allgather while others still wait in the case's collective; the engine fails both after
    KOLO_STALL_CROSSED_TIME_SECONDS, and retrying under the same name meets the others here."""
    last = None
    for _ in range(SYNC_TRIES):
        try:
            return hvd.allgather_object(outcome, name="conformance." + name)
        except hvd.HorovodInternalError as e:
            last = e
    raise last


def verdict(name, fn, outcomes):
    """The report line of a case: status and the failing ranks' errors."""
    failed = {str(r): text for r, (ok, text, _) in enumerate(outcomes) if not ok}
    if fn.xfail:
        status = "xfail" if failed else "xpass"
    else:
        status = "fail" if failed else "pass"
    return {"event": "case", "case": name, "status": status, "failed": failed,
            "xfail": fn.xfail or None, "seconds": max(secs for _, _, secs in outcomes)}


def main():
    selection = set(a for a in sys.argv[1:] if not a.startswith("-"))
    modules = MODULES
    for a in sys.argv[1:]:
        if a.startswith("--modules="):  # other case modules (test_conformance's self-test)
            modules = tuple(m for m in a.split("=", 1)[1].split(",") if m)
    os.environ.setdefault("KOLO_STALL_CROSSED_TIME_SECONDS", STALL_CROSSED)
    import torch
    torch.set_num_threads(1)
    import kolo.torch as hvd
    from kolo.torch import mpi_ops
    from conformance.case import Context, Stop, describe
    from conformance.device import DEVICE

    if DEVICE == "cuda":
        # Rank r on GPU r, as a training script places its ranks, before kolo starts; ranks share
        # GPUs where there are fewer GPUs than ranks.
        torch.cuda.set_device(int(os.environ.get("KOLO_LOCAL_RANK", "0")) % torch.cuda.device_count())
    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    cases = load_cases(modules, selection)
    if rank == 0:
        emit({"event": "start", "size": size, "cases": [n for n, _ in cases], "device": DEVICE,
              "stall_crossed": os.environ["KOLO_STALL_CROSSED_TIME_SECONDS"]})
    dog = Watchdog(rank)
    dog.start()
    job_start = time.monotonic()
    for name, fn in cases:
        if size < fn.min_size:
            if rank == 0:
                emit({"event": "case", "case": name, "status": "skip", "failed": {},
                      "xfail": fn.xfail or None, "why": "needs %d ranks" % fn.min_size})
                print("SKIP  %s (needs %d ranks)" % (name, fn.min_size), flush=True)
            continue
        ctx = Context(name, rank, size)
        t0 = time.monotonic()
        dog.arm(name, "case", fn.deadline)
        try:
            fn(ctx)
        except Stop:
            pass
        except Exception as e:
            ctx.failures.append(describe(e))
        broken = restore_world(hvd, size)
        if broken:
            ctx.failures.append(broken)
        left = drain(mpi_ops)
        if left and not ctx.failures:
            ctx.failures.append("left %d ops unsynchronized" % left)
        seconds = time.monotonic() - t0
        text = "; ".join(ctx.failures)
        if len(text) > 3000:
            text = text[:3000] + "... (%d failures)" % len(ctx.failures)
        dog.arm(name, "outcome exchange", SYNC_DEADLINE)
        try:
            outcomes = exchange(hvd, name, (not ctx.failures, text, round(seconds, 3)))
        except Exception as e:
            emit({"event": "sync_failed", "case": name, "rank": rank, "error": str(e)[:2000]})
            sys.stdout.flush()
            os._exit(SYNC_EXIT)
        report = verdict(name, fn, outcomes)
        if report["failed"]:
            # A case that failed may leave the ranks numbering unnamed ops differently; a join
            # (every rank, as every rank saw the same outcomes) restarts the numbering.
            hvd.join()
        dog.disarm()
        if rank == 0:
            emit(report)
            line = "%-5s %s (%.2f s)" % (report["status"].upper(), name, report["seconds"])
            if fn.xfail:
                line += "\n      expected to fail: %s" % fn.xfail
            for r, t in sorted(report["failed"].items(), key=lambda kv: int(kv[0])):
                line += "\n      rank %s: %s" % (r, t)
            print(line, flush=True)
    if rank == 0:
        emit({"event": "done", "cases": len(cases), "seconds": round(time.monotonic() - job_start, 3)})
    dog.arm("shutdown", "shutdown", SYNC_DEADLINE)
    hvd.shutdown()
    dog.disarm()


def _fix_path():
    """Run as a script, this file's directory is sys.path[0]: replace it by python/tests (for the
    conformance package) so that module names like "functions" or "errors" shadow nothing, and
    put python/ (the kolo package) last, behind any PYTHONPATH that says which kolo to test."""
    here = os.path.dirname(os.path.abspath(__file__))
    tests = os.path.dirname(here)
    if sys.path and os.path.abspath(sys.path[0] or ".") == here:
        sys.path[0] = tests
    elif tests not in sys.path:
        sys.path.insert(0, tests)
    python = os.path.dirname(tests)
    if python not in sys.path:
        sys.path.append(python)


if __name__ == "__main__":
    _fix_path()
    main()
