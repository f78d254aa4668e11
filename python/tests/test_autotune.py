"""kolo run --autotune with real processes: the log, the closing line, and a log read back.

    make lib build && /usr/bin/python3 -m pytest python/tests/test_autotune.py
"""

import csv
import os

from test_ops import HERE, KOLO, PY, run

WORKER = os.path.join(HERE, "autotune_worker.py")


def autotune_run(tmp_path, steps, *flags):
    log = str(tmp_path / "autotune.csv")
    rc, out = run([KOLO, "run", "-np", "2", "--autotune", "--autotune-log-file", log, *flags, PY, WORKER,
                   str(steps)], timeout=180)
    assert rc == 0 and out.count("ok autotune worker") == 2, out
    return log, out


def rows(log):
    with open(log) as f:
        lines = [l for l in f if not l.startswith("#")]
    return list(csv.DictReader(lines))


def test_a_job_that_ends_in_warmup_leaves_a_log_and_says_so(tmp_path):
    log, out = autotune_run(tmp_path, 3)
    with open(log) as f:
        head = f.readline()
    assert "lower is better" in head, head
    assert all(r["role"] != "chosen" for r in rows(log))
    assert "autotune: the job ended before a decision" in out, out


def test_a_tuning_run_decides_and_its_log_starts_the_next_run_tuned(tmp_path):
    # Samples of 2 steps, 1 warm-up sample, at most 8 samples: a decision within ~40 steps.
    log, out = autotune_run(tmp_path, 60, "--autotune-steps-per-sample", "2", "--autotune-warmup-samples", "1",
                            "--autotune-bayes-opt-max-samples", "8")
    lines = [l for l in out.splitlines() if "autotune:" in l and "decided at step" in l]
    assert lines, out
    chosen = [r for r in rows(log) if r["role"] == "chosen"]
    assert len(chosen) == 1, open(log).read()
    roles = {r["role"] for r in rows(log)}
    assert {"default", "candidate"} <= roles, roles
    # The next run reads the decision back instead of tuning, and leaves the log alone.
    before = open(log).read()
    _, out = autotune_run(tmp_path, 5)
    assert "used the settings decided by an earlier run" in out, out
    assert open(log).read() == before


def test_autotune_under_mpirun(tmp_path):
    # The same settings reach the ranks through the environment under mpirun, as under kolo run.
    import shutil
    from test_ops import run as run_cmd
    mpirun = shutil.which("mpirun")
    assert mpirun, "mpirun not found (apt-get install openmpi-bin python3-mpi4py)"
    log = str(tmp_path / "autotune.csv")
    rc, out = run_cmd([mpirun, "--allow-run-as-root", "--oversubscribe", "-np", "2", "-x", "PYTHONPATH",
                       "-x", "KOLO_AUTOTUNE=1", "-x", "KOLO_AUTOTUNE_LOG=" + log,
                       "-x", "KOLO_AUTOTUNE_STEPS_PER_SAMPLE=2", "-x", "KOLO_AUTOTUNE_WARMUP_SAMPLES=1",
                       "-x", "KOLO_AUTOTUNE_BAYES_OPT_MAX_SAMPLES=8", PY, WORKER, "60"], timeout=180)
    assert rc == 0 and out.count("ok autotune worker") == 2, out
    assert any("autotune:" in l and "decided at step" in l for l in out.splitlines()), out
    assert [r for r in rows(log) if r["role"] == "chosen"], open(log).read()
