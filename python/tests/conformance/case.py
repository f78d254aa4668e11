"""What a conformance case is: a plain function of a Context, marked with @case(...).

A case runs on every rank at once. It reads ctx.rank and ctx.size, calls kolo.torch, and records
what it found wrong with ctx.check (go on) or ctx.require (stop this case on this rank). Whatever a
case raises is its failure on that rank. The runner (runner.py) gives each case a deadline, then
gathers every rank's outcome.
"""

import os
import time
import traceback

DEFAULT_DEADLINE = 20.0


def case(deadline=DEFAULT_DEADLINE, xfail=None, min_size=2):
    """Marks fn as a case. deadline: seconds it may take on any rank before the job is ended with
    a stack dump. xfail: why it is expected to fail (a kolo bug, with the evidence in the reason);
    the runner reports it as xfail while it fails and as a failure (xpass) once it passes.
    min_size: the fewest ranks it needs; with fewer it is reported as skipped."""
    def mark(fn):
        fn.conformance_case = True
        fn.deadline = deadline
        fn.xfail = xfail
        fn.min_size = min_size
        return fn
    return mark


def cases_of(module):
    """The cases of a module, in the order they are written."""
    fns = [f for f in vars(module).values() if callable(f) and getattr(f, "conformance_case", False)]
    return sorted(fns, key=lambda f: f.__code__.co_firstlineno)


class Stop(Exception):
    """Raised by Context.require: ends the case on this rank (its failure is already recorded)."""


class Context(object):
    """What a case gets: who this rank is, and where its findings go."""

    def __init__(self, name, rank, size):
        self.name = name          # "module.case"
        self.rank = rank
        self.size = size
        self.failures = []
        # How long the engine lets ranks whose calls went different ways wait (the runner's job
        # sets it to 3 s; kolo's default is 30 s).
        self.stall_crossed = float(os.environ.get("KOLO_STALL_CROSSED_TIME_SECONDS", "30"))

    # -- recording ---------------------------------------------------------------------------

    def check(self, cond, what):
        """Records what as a failure unless cond holds; returns cond, so callers may go on."""
        if not cond:
            self.failures.append(str(what))
        return bool(cond)

    def require(self, cond, what):
        """As check, but a failure stops the case on this rank (raise Stop)."""
        if not cond:
            self.failures.append(str(what))
            raise Stop(what)

    def equal(self, got, want, what, rtol=None, atol=None, stop=False):
        """Checks that tensor got has want's dtype, shape and values: exactly for integers, within
        the dtype's tolerance for floats (or rtol/atol)."""
        from conformance import reference
        why = reference.difference(got, want, rtol, atol)
        if why is None:
            return True
        msg = "%s: %s" % (what, why)
        if stop:
            self.require(False, msg)
        self.failures.append(msg)
        return False

    def raises(self, exc, fn, what, contains=(), within=None, stop=False):
        """Calls fn, which must raise exc (a class or tuple) whose message holds every string of
        contains, within `within` seconds if given. Returns the exception (None if it did not
        raise as expected). With stop, a failure ends the case."""
        t0 = time.monotonic()
        try:
            fn()
        except exc as e:
            elapsed = time.monotonic() - t0
            text = str(e)
            ok = True
            for part in contains:
                if part not in text:
                    ok = False
                    self._fail("%s: %s lacks %r: %s" % (what, type(e).__name__, part, _clip(text)), stop)
            if within is not None and elapsed >= within:
                ok = False
                self._fail("%s: %s came after %.2f s, want < %.2f s: %s"
                           % (what, type(e).__name__, elapsed, within, _clip(text)), stop)
            return e if ok else None
        except Exception as e:
            self._fail("%s: raised %s, want %s: %s" % (what, type(e).__name__, _names(exc), _clip(str(e))),
                       stop)
            return None
        self._fail("%s: returned, want %s" % (what, _names(exc)), stop)
        return None

    def _fail(self, msg, stop):
        if stop:
            self.require(False, msg)
        self.failures.append(msg)

    # -- helpers most cases need -------------------------------------------------------------

    def op_name(self, tag):
        """A name for an op of this case (names need not be unique across cases; readable ones
        make the engine's errors point at the case)."""
        return "%s.%s" % (self.name, tag)

    def next_op_works(self, after, stop=True):
        """The job still works after `after`: a named and an unnamed allreduce give the sum of
        every rank's ones. (The unnamed one checks that the ranks still number unnamed ops alike.)"""
        from conformance.device import torch
        import kolo.torch as hvd
        for name in (self.op_name("after " + after), None):
            label = "named" if name else "unnamed"
            try:
                got = hvd.allreduce(torch.ones(2), op=hvd.Sum, name=name)
            except Exception as e:
                self._fail("the %s allreduce after %s raised %s: %s"
                           % (label, after, type(e).__name__, _clip(str(e))), stop)
                return False
            if got.tolist() != [float(self.size)] * 2:
                self._fail("the %s allreduce after %s gave %s, want %s"
                           % (label, after, got.tolist(), [float(self.size)] * 2), stop)
                return False
        return True


def _names(exc):
    if isinstance(exc, tuple):
        return " or ".join(e.__name__ for e in exc)
    return exc.__name__


def _clip(text, n=400):
    text = text.replace("\n", " | ")
    return text if len(text) <= n else text[:n] + "..."


def describe(exc):
    """A failure line for an exception a case raised: its type, message and where (last frames)."""
    tb = traceback.extract_tb(exc.__traceback__)
    where = " <- ".join("%s:%d %s" % (os.path.basename(f.filename), f.lineno, f.name)
                        for f in reversed(tb[-4:]))
    return "raised %s: %s (at %s)" % (type(exc).__name__, _clip(str(exc), 800), where)
