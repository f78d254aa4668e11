"""kolo.torch's conformance suite (python/tests/conformance/) at 2 and 3 ranks.

    make lib build && /usr/bin/python3 -m pytest -q python/tests/test_conformance.py
    KOLO_TEST_DEVICE=cuda KOLO_CONFORMANCE_RANKS=3 python3 -m pytest -q python/tests/test_conformance.py

KOLO_TEST_DEVICE=cuda runs every case on CUDA tensors (conformance/device.py); KOLO_CONFORMANCE_RANKS
says at which rank counts (default 2,3).

For each rank count, every case runs inside one `kolo run -np N` job (conformance/runner.py); the
job's report becomes one pytest test per (rank count, module), which fails listing each failed
case with the ranks that failed and their errors, and one test per rank count that the job ran to
its end (a case that overran its deadline ends the job: that test names the case and the rank,
with its stack dump). Cases marked xfail in the suite pass while they fail; once one passes
(XPASS) its module's test fails, so that the mark is removed.
"""

import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import time

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
KOLO = os.path.join(ROOT, "bin", "kolo")
LIB = os.path.join(ROOT, "python", "kolo", "lib", "libkolo.so")
# KOLO_PYTHON: the Python with torch, where that is not Debian's (a CUDA machine's venv).
PY = os.environ.get("KOLO_PYTHON") or ("/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable)
RUNNER = os.path.join(HERE, "conformance", "runner.py")

from conformance import runner  # noqa: E402  (stdlib only at import)

RANKS = tuple(int(n) for n in os.environ.get("KOLO_CONFORMANCE_RANKS", "2,3").split(","))
# Seconds; the runner's own deadlines end a hung job long before this. KOLO_CONFORMANCE_JOB_TIMEOUT
# shortens it where a caller has less time (scripts/gpu_check.sh).
JOB_TIMEOUT = int(os.environ.get("KOLO_CONFORMANCE_JOB_TIMEOUT", "240"))
LINE = re.compile(r"^\[(\d+)\]<stdout>:" + re.escape(runner.MARK) + r"(\{.*\})\s*$")

_jobs = {}


def env():
    e = dict(os.environ)
    e["PYTHONPATH"] = os.path.join(ROOT, "python")
    e["KOLO_STALL_CROSSED_TIME_SECONDS"] = runner.STALL_CROSSED
    e.pop("KOLO_LAUNCHER_VERSION", None)
    for k in list(e):
        if k.startswith(("KOLO_RANK", "KOLO_SIZE", "HOROVOD_RANK", "HOROVOD_SIZE", "OMPI_", "PMI_", "SLURM_")):
            del e[k]
    return e


class Job(object):
    """One runner job's outcome: exit status, output, and the parsed report."""

    def __init__(self, np, rc, out, seconds):
        self.np, self.rc, self.out, self.seconds = np, rc, out, seconds
        self.cases = []       # names, in order, from the start event
        self.results = {}     # name -> case event
        self.timeouts = []    # timeout events (any rank)
        self.sync_failures = []
        self.done = None
        self.device = None    # where the cases' tensors were, from the start event
        for line in out.splitlines():
            m = LINE.match(line)
            if not m:
                continue
            ev = json.loads(m.group(2))
            kind = ev.get("event")
            if kind == "start":
                self.cases = ev["cases"]
                self.device = ev["device"]
            elif kind == "case":
                self.results[ev["case"]] = ev
            elif kind == "timeout":
                self.timeouts.append(ev)
            elif kind == "sync_failed":
                self.sync_failures.append(ev)
            elif kind == "done":
                self.done = ev

    def why_ended(self):
        """Why the job stopped before its end, in words."""
        parts = ["case %s timed out on rank %d (%s, deadline %.0f s)"
                 % (t["case"], t["rank"], t["phase"], t["deadline"]) for t in self.timeouts]
        parts += ["ranks could not exchange outcomes after case %s (rank %d: %s)"
                  % (s["case"], s["rank"], s["error"]) for s in self.sync_failures]
        if not parts:
            parts.append("the job exited with status %s before its end" % self.rc)
        return "; ".join(parts)

    def tail(self, n=120):
        return "\n".join(self.out.splitlines()[-n:])


def job(np, *args):
    """Runs the runner at np ranks (with args) once per session."""
    key = (np,) + args
    if key in _jobs:
        return _jobs[key]
    assert os.path.exists(KOLO) and os.path.exists(LIB), "run `make lib build` first"
    t0 = time.monotonic()
    p = subprocess.Popen([KOLO, "run", "-np", str(np), PY, RUNNER] + list(args), env=env(), stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        out, _ = p.communicate(timeout=JOB_TIMEOUT)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGINT)  # kolo run stops every rank on Ctrl-C
        try:
            out, _ = p.communicate(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            out, _ = p.communicate()
        out += "\n(killed after %d s)" % JOB_TIMEOUT
    _jobs[key] = Job(np, p.returncode, out, time.monotonic() - t0)
    return _jobs[key]


def module_report(j, module):
    """The failures of module's cases in job j, as text (empty when none)."""
    lines = []
    names = [c for c in j.cases if c.split(".")[0] == module]
    if not j.cases:
        return "the job reported no cases (%s)\n%s" % (j.why_ended(), j.tail())
    if not names:
        return "module %s has no cases" % module
    for name in names:
        ev = j.results.get(name)
        if ev is None:
            lines.append("%s did not report: %s" % (name, j.why_ended()))
            continue
        if ev["status"] in ("pass", "xfail", "skip"):
            continue
        if ev["status"] == "xpass":
            lines.append("%s passed but is marked xfail (%s): remove the mark" % (name, ev["xfail"]))
            continue
        lines.append("%s failed on rank%s %s:" % (name, "s" if len(ev["failed"]) > 1 else "",
                                                   ",".join(sorted(ev["failed"], key=int))))
        for r in sorted(ev["failed"], key=int):
            lines.append("  rank %s: %s" % (r, ev["failed"][r]))
    return "\n".join(lines)


@pytest.mark.parametrize("np", RANKS)
def test_job_ran_every_case(np):
    j = job(np)
    print("conformance at %d ranks on %s tensors: %d cases in %.1f s" % (np, j.device, len(j.cases), j.seconds))
    for ev in j.results.values():
        if ev["status"] == "xfail":
            print("  xfail %s: %s" % (ev["case"], ev["xfail"]))
    if j.done is None or j.rc != 0:
        stacks = "\n".join(l for l in j.out.splitlines() if "<stdout>:" in l and runner.MARK not in l
                           and ("TIMEOUT" in l or "File " in l or "Thread " in l))
        pytest.fail("the conformance job at %d ranks did not finish: %s (exit status %s)\n%s\n--- last output ---\n%s"
                    % (np, j.why_ended(), j.rc, stacks, j.tail(60)))


@pytest.mark.parametrize("module", runner.MODULES)
@pytest.mark.parametrize("np", RANKS)
def test_module(np, module):
    failures = module_report(job(np), module)
    if failures:
        pytest.fail("conformance module %s at %d ranks:\n%s" % (module, np, failures), pytrace=False)


def test_runner_reports_failures_and_timeouts():
    # The runner itself, on cases that fail on purpose (conformance/selftest.py): each failure
    # names its case and only the ranks that failed, with their errors; an exception on one rank
    # while the others wait costs the stall deadline, not a hang; the job goes on after them; a
    # case that hangs on one rank ends the job at its deadline with that rank's stack.
    j = job(2, "--modules=selftest")
    res = j.results
    assert res["selftest.passes"]["status"] == "pass", j.tail()
    ev = res["selftest.fails_on_the_last_rank"]
    assert ev["status"] == "fail" and list(ev["failed"]) == ["1"], ev
    assert "deliberate failure on the last rank" in ev["failed"]["1"], ev
    ev = res["selftest.raises_on_rank_0_while_the_others_wait"]
    assert ev["status"] == "fail" and sorted(ev["failed"]) == ["0", "1"], ev
    assert "deliberate exception on rank 0" in ev["failed"]["0"], ev
    assert "selftest.waits" in ev["failed"]["1"], ev
    assert ev["seconds"] < float(runner.STALL_CROSSED) + 5, ev
    assert res["selftest.expected_to_fail"]["status"] == "xfail", j.tail()
    assert res["selftest.the_job_goes_on"]["status"] == "pass", res["selftest.the_job_goes_on"]
    assert "selftest.hangs_on_rank_1" not in res and "selftest.never_runs" not in res, j.tail()
    assert j.rc == runner.TIMEOUT_EXIT and j.done is None, (j.rc, j.tail())
    timeouts = [(t["case"], t["rank"], t["phase"]) for t in j.timeouts]
    assert timeouts == [("selftest.hangs_on_rank_1", 1, "case")], j.tail()
    assert "in hangs_on_rank_1" in j.out, j.tail()  # the stack dump
    want = "selftest.never_runs did not report: case selftest.hangs_on_rank_1 timed out on rank 1"
    assert want in module_report(j, "selftest"), module_report(j, "selftest")


def test_device_puts_the_cases_tensors_there():
    # KOLO_TEST_DEVICE, checked on torch's "meta" device (there is no GPU in CI): the factories
    # the cases use put tensors there unless told otherwise, random ones drawn from the host's
    # seed, models moved by on_device; kolo's own torch is untouched.
    code = textwrap.dedent("""
        import torch as real
        from conformance.device import DEVICE, on_device, torch
        assert DEVICE == "meta", DEVICE
        for t in (torch.ones(2), torch.zeros(2), torch.full((2,), 3.0), torch.tensor([1]),
                  torch.arange(3), torch.empty(1), torch.linspace(0, 1, 3), torch.eye(2),
                  torch.randn(2, generator=real.Generator().manual_seed(1)), torch.randint(0, 5, (2,))):
            assert t.device.type == "meta", t.device
        assert torch.ones(2, device="cpu").device.type == "cpu"
        assert real.ones(2).device.type == "cpu"
        assert on_device(torch.nn.Linear(2, 2)).weight.device.type == "meta"
        assert torch.Tensor is real.Tensor and torch.float16 is real.float16
        print("ok")
        """)
    p = subprocess.run([PY, "-c", code], env=dict(os.environ, KOLO_TEST_DEVICE="meta", PYTHONPATH=HERE),
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=60)
    assert p.returncode == 0 and "ok" in p.stdout, p.stdout
