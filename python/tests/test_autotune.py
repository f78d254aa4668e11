"""kolo run --autotune with real processes: the log, the closing line, and a log read back.

    make lib build && /usr/bin/python3 -m pytest python/tests/test_autotune.py
"""

import csv
import json
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


def test_autotune_under_elastic_training_retunes_each_round(tmp_path):
    # Three workers on two host names; 127.0.0.1's leaves at epoch 1, batch 2, and localhost's two
    # go on as round 2. Rank 0 of each round tunes for its own world, appending to the one log
    # with its rows tagged by round, ranks and hosts; each round's closing line names its round,
    # and the job's last one is round 2's.
    log = str(tmp_path / "autotune.csv")
    elog = str(tmp_path / "elastic.jsonl")
    rc, out = run([KOLO, "run", "--autotune", "--autotune-log-file", log, "-np", "3", "--min-np", "2",
                   "-H", "localhost:2,127.0.0.1:1", PY, os.path.join(HERE, "elastic_worker.py"), "--log", elog,
                   "--exit-schedule", '{"(1, 2)": [2]}', "--epochs", "3", "--batches-per-epoch", "120"], timeout=240)
    assert rc == 0, out
    assert "round 2: generation 2 (reset 1)" in out, out
    with open(log) as f:
        text = f.read()
    assert text.count("# kolo autotune log") == 1, text
    rs = rows(log)
    worlds = {(r["round"], r["ranks"], r["hosts"]) for r in rs}
    assert worlds == {("1", "3", "2"), ("2", "2", "1")}, text
    assert all(float(r["step_time_s"]) > 0 for r in rs if r["role"] != "chosen"), text
    # A decision, if a round reached one, is the last row of its round.
    for r in (r for r in rs if r["role"] == "chosen"):
        assert r["phase"] == "decided", text
    lines = [l.split("<stderr>:", 1)[-1] for l in out.splitlines() if "autotune, round" in l]
    assert lines and lines[-1].startswith("autotune, round 2, 2 ranks on 1 host: "), out
    assert any(l.startswith("autotune, round 1, 3 ranks on 2 hosts: ") for l in lines), out
    with open(elog) as f:
        done = [json.loads(l) for l in f if '"done"' in l]
    assert len(done) == 2 and {d["size"] for d in done} == {2}, done
