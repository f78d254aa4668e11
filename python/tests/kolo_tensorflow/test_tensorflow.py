"""kolo.tensorflow at 2 ranks under bin/kolo run, with the TensorFlow of the interpreter running
pytest (make test-python runs it twice: with $(TF_PYTHON), the newest TensorFlow kolo supports, and
$(TF_OLDEST_PYTHON), the oldest; the virtual environments scripts/deps.sh makes):

    make build lib && .venv/tf/bin/python -m pytest -q python/tests/kolo_tensorflow
    .venv/tf-oldest/bin/python -m pytest -q python/tests/kolo_tensorflow

Nine jobs: tf_ops_worker.py (every op eagerly and in tf.function, gradients, process sets, the
tape and the optimizer training to the same weights, shape mismatches), tf_kill_worker.py (kill -9
of a rank inside an allreduce), and on each of the interpreter's two Keras (KERAS_MODES):
tf_keras_worker.py (model.fit with the optimizer and the callbacks), tf_keras_optimizer_worker.py
(the optimizer's gradients: reduced once, backward_passes_per_step, local variables, KerasState and
the elastic callbacks) and tf_keras_elastic_worker.py (an elastic model.fit losing a worker);
tf_elastic_worker.py (an elastic training loop losing a worker). Where TensorFlow does not import
the tests skip, unless KOLO_REQUIRE_TESTBEDS=1 (CI), where they fail.
"""

import importlib.metadata
import importlib.util
import os
import re
import signal
import subprocess
import sys
import threading
import time

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(HERE)))
KOLO = os.path.join(ROOT, "bin", "kolo")
PROGRESS = 15  # KOLO_PROGRESS_TIMEOUT_SECONDS of the kill job: the deadline the survivor must beat

# (the directory is not named tensorflow: pytest puts python/tests on sys.path, where it would pass
# for TensorFlow as a namespace package)
_spec = importlib.util.find_spec("tensorflow")
if _spec is None or _spec.origin in (None, "namespace"):
    why = "TensorFlow does not import in %s (make deps creates .venv/tf and .venv/tf-oldest; run with their python)" % sys.executable
    if os.environ.get("KOLO_REQUIRE_TESTBEDS") == "1":
        raise RuntimeError(why + "; KOLO_REQUIRE_TESTBEDS=1 forbids skipping")
    pytest.skip(why, allow_module_level=True)

# The Keras jobs' modes, the two Keras this TensorFlow has: standalone Keras (``import keras``)
# through kolo.keras, "keras3" where it is Keras 3 (TensorFlow 2.16 on) or "keras2" where it is
# Keras 2 (TensorFlow before 2.16, whose keras package is its tf.keras), and "tf-keras", Keras 2 as
# tf.keras through kolo.tensorflow.keras (the tf-keras package from TensorFlow 2.16 on, which
# tf_venv.sh installs; TensorFlow's own Keras before). Standalone Keras is one or the other, so
# each interpreter collects one of keras3 and keras2, never skips the other.
KERAS_MODES = ["keras%s" % importlib.metadata.version("keras").split(".")[0], "tf-keras"]
assert KERAS_MODES[0] in ("keras2", "keras3"), KERAS_MODES


def _env(**kw):
    env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "python"), TF_CPP_MIN_LOG_LEVEL="2", **kw)
    return env


def _run(cmd, env, timeout, stop_after=None):
    """Runs cmd in its own process group until it exits, timeout passes, or stop_after lines
    matching it came; returns (returncode or None, output)."""
    p = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         start_new_session=True)
    timer = threading.Timer(timeout, os.killpg, (p.pid, signal.SIGKILL))
    timer.start()
    lines, seen = [], 0
    try:
        for line in p.stdout:
            lines.append(line)
            if stop_after and stop_after[0].search(line):
                seen += 1
                if seen == stop_after[1]:
                    break
    finally:
        timer.cancel()
        if stop_after:
            try:
                os.killpg(p.pid, signal.SIGKILL)  # the victim's rank lingers on purpose
            except ProcessLookupError:
                pass
        rc = p.wait()
    return rc, "".join(lines)


def test_ops_gradients_training_and_mismatch():
    assert os.path.exists(KOLO), "run `make build lib` first"
    rc, out = _run([KOLO, "run", "-np", "2", sys.executable, os.path.join(HERE, "tf_ops_worker.py")], _env(),
                   timeout=420)
    ok = re.findall(r"TF-OPS-OK rank=(\d+) checks=(\d+)", out)
    assert rc == 0 and sorted(int(r) for r, _ in ok) == [0, 1], out[-6000:]
    assert all(int(n) > 500 for _, n in ok), ok
    # the mismatch failed on both ranks, and the message says what each sent
    assert len(re.findall(r"mismatch: .*rank 0 sent \[2\].*rank 1 sent \[3\]", out)) == 2, out[-3000:]


def test_killed_rank_fails_the_other_naming_it():
    assert os.path.exists(KOLO), "run `make build lib` first"
    result = re.compile(r"TF-KILL-RESULT rank=(\d+) op=(\S+) elapsed_ms=(\d+) unknown=(\d) err=(.*)$", re.M)
    t0 = time.monotonic()
    _, out = _run([KOLO, "run", "-np", "2", sys.executable, os.path.join(HERE, "tf_kill_worker.py")],
                  _env(KOLO_PROGRESS_TIMEOUT_SECONDS=str(PROGRESS)), timeout=PROGRESS + 60,
                  stop_after=(result, 1))
    got = result.findall(out)
    assert "SIGKILL" in out and len(got) == 1, out[-4000:]
    r, op, ms, unknown, err = got[0]
    print("rank %s: op %s failed after %s ms: %s (job %.1f s)" % (r, op, ms, err, time.monotonic() - t0))
    assert r == "0" and op != "none", out[-4000:]
    assert int(ms) < PROGRESS * 1000, "failed after %s ms, past the %d s progress deadline" % (ms, PROGRESS)
    assert "rank 1" in err, "the error does not name rank 1: %s" % err
    assert unknown == "1", "the lost rank's error is not a tf.errors.UnknownError: %s" % err


@pytest.mark.parametrize("mode", KERAS_MODES)
def test_keras_fit_with_callbacks(mode):
    """kolo.keras on standalone Keras (3, or 2 before TensorFlow 2.16), kolo.tensorflow.keras on
    Keras 2 as tf.keras: model.fit with the DistributedOptimizer and the callbacks, the same
    weights and metrics on both ranks."""
    assert os.path.exists(KOLO), "run `make build lib` first"
    rc, out = _run([KOLO, "run", "-np", "2", sys.executable, os.path.join(HERE, "tf_keras_worker.py"), mode], _env(),
                   timeout=300)
    ok = re.findall(r"TF-KERAS-OK rank=(\d+) mode=(\S+)", out)
    assert rc == 0 and sorted(ok) == [("0", mode), ("1", mode)], out[-6000:]


@pytest.mark.parametrize("mode", KERAS_MODES)
def test_keras_optimizer_gradients(mode):
    """The distributed Keras optimizer at 2 ranks: gradients reduced once whether
    _compute_gradients or apply_gradients reduces them, backward_passes_per_step (eagerly and in
    tf.function), worker-local variables, model.fit with aggregation, KerasState and the elastic
    callbacks (tf_keras_optimizer_worker.py)."""
    assert os.path.exists(KOLO), "run `make build lib` first"
    rc, out = _run([KOLO, "run", "-np", "2", sys.executable, os.path.join(HERE, "tf_keras_optimizer_worker.py"), mode],
                   _env(), timeout=420)
    ok = re.findall(r"TF-KERAS-OPT-OK rank=(\d+) mode=(\S+) checks=(\d+)", out)
    assert rc == 0 and sorted((r, m) for r, m, _ in ok) == [("0", mode), ("1", mode)], out[-6000:]
    assert all(int(n) >= 200 for _, _, n in ok), ok


@pytest.mark.parametrize("mode", KERAS_MODES)
def test_elastic_keras_fit_survives_a_killed_worker(mode):
    """hvd.elastic.run around model.fit with a KerasState and the elastic callbacks: the worker
    started as rank 1 is SIGKILLed after batch 2 of epoch 1, the survivor restores the commit of
    that batch, resets, and fits the remaining epochs alone (tf_keras_elastic_worker.py)."""
    assert os.path.exists(KOLO), "run `make build lib` first"
    rc, out = _run([KOLO, "run", "-np", "2", "--min-np", "1", "-H", "localhost:1,127.0.0.1:1", sys.executable,
                    os.path.join(HERE, "tf_keras_elastic_worker.py"), mode], _env(), timeout=240)
    done = re.findall(r"TF-KERAS-ELASTIC-DONE start_rank=(\d+) size=(\d+) epoch=(\d+) resets=(\d+) restored=(\S+)",
                      out)
    assert rc == 0 and done == [("0", "1", "3", "1", "1.2")], out[-6000:]


def test_elastic_keras_state_survives_a_killed_worker():
    """hvd.elastic.run with a TensorFlowKerasState: the worker started as rank 1 is SIGKILLed
    inside the loop (its ops in tf.function), the survivor restores its last commit, resets and
    trains alone to the end."""
    assert os.path.exists(KOLO), "run `make build lib` first"
    rc, out = _run([KOLO, "run", "-np", "2", "--min-np", "1", "-H", "localhost:1,127.0.0.1:1", sys.executable,
                    os.path.join(HERE, "tf_elastic_worker.py")], _env(), timeout=240)
    done = re.findall(r"TF-ELASTIC-DONE start_rank=(\d+) size=(\d+) step=(\d+) resets=(\d+)", out)
    assert rc == 0 and done == [("0", "1", "12", "1")], out[-6000:]
