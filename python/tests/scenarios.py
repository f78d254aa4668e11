"""What the multi-rank test workers share: a failure list, check(), and the loop that runs named
scenarios, prints "ok NAME" on rank 0 for each that passed, and exits 1 listing every failure."""

import sys
import traceback

failures = []


def check(cond, what):
    if not cond:
        failures.append(what)


def run(scenarios, rank, call, want=()):
    """Runs call(fn) for each (name, fn) in scenarios (only the names in want, if any), then
    leaves through shutdown(), imported lazily so the module does not need kolo itself."""
    import kolo.torch as hvd
    for name, fn in scenarios:
        if want and name not in want:
            continue
        before = len(failures)
        try:
            call(fn)
        except Exception:
            failures.append("%s raised:\n%s" % (name, traceback.format_exc()))
        if len(failures) == before and rank == 0:
            print("ok", name, flush=True)
    hvd.shutdown()
    if failures:
        for f in failures:
            print("rank %d FAIL: %s" % (rank, f), file=sys.stderr)
        sys.exit(1)
