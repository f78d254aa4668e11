"""kill -9 of one of 3 ranks inside an allreduce: the others fail within the progress deadline,
naming it (kill_worker.py). On CUDA tensors with KOLO_TEST_DEVICE=cuda (scripts/gpu_check.sh):

    make lib build && /usr/bin/python3 -m pytest -q python/tests/test_kill.py
"""

import os
import re
import signal
import subprocess
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
KOLO = os.path.join(ROOT, "bin", "kolo")
PY = os.environ.get("KOLO_PYTHON") or ("/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable)
RESULT = re.compile(r"^\[(\d+)\]<stdout>:KILL-RESULT rank=(\d+) op=(\S+) elapsed_ms=(\d+) path=(.*?) err=(.*)$")
PROGRESS = 15  # KOLO_PROGRESS_TIMEOUT_SECONDS for the job: the deadline the survivors must beat
NP, VICTIM = 3, 1


def run_until_reports(cmd, env, want, timeout):
    """Runs cmd in its own process group until `want` KILL-RESULT lines came (then stops it) or
    timeout passed; returns (results, output)."""
    p = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         start_new_session=True)
    timer = threading.Timer(timeout, os.killpg, (p.pid, signal.SIGKILL))
    timer.start()
    lines, results = [], []
    try:
        for line in p.stdout:
            lines.append(line)
            m = RESULT.match(line.rstrip("\n"))
            if m:
                results.append(m)
                if len(results) == want:
                    break
    finally:
        timer.cancel()
        try:
            os.killpg(p.pid, signal.SIGKILL)  # the victim's rank lingers on purpose
        except ProcessLookupError:
            pass
        p.wait()
    return results, "".join(lines)


def test_killed_rank_fails_the_others_naming_it():
    assert os.path.exists(KOLO), "run `make lib build` first"
    env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "python"), KOLO_PROGRESS_TIMEOUT_SECONDS=str(PROGRESS))
    t0 = time.monotonic()
    results, out = run_until_reports([KOLO, "run", "-np", str(NP), PY, os.path.join(HERE, "kill_worker.py"),
                                      "--victim", str(VICTIM)], env, NP - 1, timeout=PROGRESS + 22)
    took = time.monotonic() - t0
    assert "SIGKILL" in out, out
    got = {int(m.group(2)): m for m in results}
    assert sorted(got) == [r for r in range(NP) if r != VICTIM], "survivors that reported: %s\n%s" % (sorted(got), out)
    for r, m in sorted(got.items()):
        op, ms, path, err = m.group(3), int(m.group(4)), m.group(5), m.group(6)
        print("rank %d: op %s failed after %d ms on the %s path: %s" % (r, op, ms, path, err))
        assert op != "none", out
        assert ms < PROGRESS * 1000, "rank %d failed after %d ms, past the %d s progress deadline" % (r, ms, PROGRESS)
        assert "rank %d" % VICTIM in err, "rank %d's error does not name rank %d: %s" % (r, VICTIM, err)
    print("job ran %.1f s" % took)
