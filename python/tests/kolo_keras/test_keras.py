"""kolo.keras on Keras 3's JAX and PyTorch backends at 2 ranks under bin/kolo run, with the backend
and the Keras of the interpreter running pytest: make test-python runs these tests once with
$(JAX_PYTHON) and once with $(KERAS_TORCH_PYTHON), the virtual environments scripts/jax_venv.sh and
scripts/keras_torch_venv.sh make. KERAS_BACKEND picks the backend where both import.

    make build lib && .venv/jax/bin/python -m pytest -q python/tests/kolo_keras
    make build lib && .venv/keras-torch/bin/python -m pytest -q python/tests/kolo_keras

Three jobs of the backend's worker (jax_keras_worker.py, torch_keras_worker.py): train (the ops,
at once and, on JAX, inside jax.jit; model.fit with the DistributedOptimizer and the callbacks,
from different weights on different data shards, against a single-process reference; gradient
accumulation; worker-local layers; compression or run_eagerly; load_model), mismatch (ranks whose
models differ fail with the shapes each sent) and kill (a rank SIGKILLed mid-fit fails the other,
naming it, well before the progress deadline). Two jobs of workers written for both backends: an
elastic model.fit that loses one of 3 workers and finishes on the 2 survivors from the last commit
(keras_elastic_worker.py), and SyncBatchNormalization against BatchNormalization over the global
batch (keras_sync_bn_worker.py). Where the backend or Keras
does not import the tests skip, unless KOLO_REQUIRE_TESTBEDS=1 (CI), where they fail.
"""

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

# What differs between the backends: the worker (and the tag its lines carry), how many checks its
# train job makes at least, the error class a mismatch raises there, and the environment with it.
BACKENDS = {
    "jax": dict(worker="jax_keras_worker.py", tag="JAX", checks=60, mismatch="JaxRuntimeError", venv=".venv/jax"),
    # hvd.HorovodInternalError is KoloInternalError's alias.
    "torch": dict(worker="torch_keras_worker.py", tag="TORCH", checks=55, mismatch="KoloInternalError",
                  venv=".venv/keras-torch"),
}
BACKEND = os.environ.get("KERAS_BACKEND") or next((b for b in BACKENDS if importlib.util.find_spec(b)), "jax")
if BACKEND not in BACKENDS:
    raise RuntimeError("KERAS_BACKEND=%s: kolo.keras's tests run on %s" % (BACKEND, " or ".join(BACKENDS)))
B = BACKENDS[BACKEND]
WORKER = os.path.join(HERE, B["worker"])

_missing = [m for m in (BACKEND, "keras") if importlib.util.find_spec(m) is None]
if _missing:
    why = "%s does not import in %s (make deps creates %s; run with %s/bin/python)" % (
        " and ".join(_missing), sys.executable, B["venv"], B["venv"])
    if os.environ.get("KOLO_REQUIRE_TESTBEDS") == "1":
        raise RuntimeError(why + "; KOLO_REQUIRE_TESTBEDS=1 forbids skipping")
    pytest.skip(why, allow_module_level=True)


def _env(**kw):
    return dict(os.environ, PYTHONPATH=os.path.join(ROOT, "python"), KERAS_BACKEND=BACKEND, **kw)


def _run(cmd, env, timeout, stop_after=None, cwd=None):
    """Runs cmd in its own process group until it exits, timeout passes, or a line matching
    stop_after came; returns (returncode or None, output)."""
    p = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         start_new_session=True, cwd=cwd)
    timer = threading.Timer(timeout, os.killpg, (p.pid, signal.SIGKILL))
    timer.start()
    lines = []
    try:
        for line in p.stdout:
            lines.append(line)
            if stop_after and stop_after.search(line):
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


def test_fit_matches_the_single_process_reference(tmp_path):
    assert os.path.exists(KOLO), "run `make build lib` first"
    rc, out = _run([KOLO, "run", "-np", "2", sys.executable, WORKER, "train"], _env(), timeout=420, cwd=tmp_path)
    ok = re.findall(B["tag"] + r"-KERAS-OK rank=(\d+) checks=(\d+)", out)
    assert rc == 0 and sorted(int(r) for r, _ in ok) == [0, 1], out[-6000:]
    assert all(int(n) >= B["checks"] for _, n in ok), ok


def test_mismatched_models_fail_on_both_ranks_with_the_shapes(tmp_path):
    assert os.path.exists(KOLO), "run `make build lib` first"
    rc, out = _run([KOLO, "run", "-np", "2", sys.executable, WORKER, "mismatch"], _env(), timeout=240,
                   cwd=tmp_path)
    got = re.findall(B["tag"] + r"-MISMATCH rank=(\d+) type=(\S+) err=(.*)$", out, re.M)
    assert sorted(r for r, _, _ in got) == ["0", "1"], out[-6000:]
    for _, typ, err in got:
        assert typ == B["mismatch"], got
        assert re.search(r"mismatched shapes: rank 0 sent \[4 8\].*rank 1 sent \[4 9\]", err), err


def test_killed_rank_fails_the_other_naming_it(tmp_path):
    assert os.path.exists(KOLO), "run `make build lib` first"
    result = re.compile(B["tag"] + r"-KILL-RESULT rank=(\d+) elapsed_ms=(\d+) type=(\S+) err=(.*)$", re.M)
    t0 = time.monotonic()
    _, out = _run([KOLO, "run", "-np", "2", sys.executable, WORKER, "kill"],
                  _env(KOLO_PROGRESS_TIMEOUT_SECONDS=str(PROGRESS)), timeout=PROGRESS + 120, stop_after=result,
                  cwd=tmp_path)
    got = result.findall(out)
    assert "SIGKILL" in out and len(got) == 1, out[-4000:]
    r, ms, typ, err = got[0]
    print("rank %s: failed %s ms after its batch began: %s (job %.1f s)" % (r, ms, err, time.monotonic() - t0))
    assert r == "0" and typ != "none", out[-4000:]
    assert int(ms) < PROGRESS * 1000, "failed after %s ms, past the %d s progress deadline" % (ms, PROGRESS)
    assert "rank 1" in err, "the error does not name rank 1: %s" % err


def test_elastic_fit_loses_a_worker_and_finishes_on_the_survivors_from_the_commit(tmp_path):
    """hvd.elastic.run around model.fit with a KerasState and the elastic callbacks, 3 workers on two
    host names (keras_elastic_worker.py): the one on 127.0.0.1 is SIGKILLed at the end of batch 2
    of epoch 1, one batch after the last commit; the two survivors keep their processes, restore
    that commit (epoch 1, batch 1: the variables bit for bit as committed, batch 2's update
    undone), re-form as 2 ranks and fit the remaining 2 epochs: 6 + 2 steps before, 12 after,
    and the same model and optimizer variables on both at the end."""
    assert os.path.exists(KOLO), "run `make build lib` first"
    t0 = time.monotonic()
    rc, out = _run([KOLO, "run", "-np", "3", "--min-np", "2", "--max-np", "3", "-H", "localhost:2,127.0.0.1:1",
                    sys.executable, os.path.join(HERE, "keras_elastic_worker.py")], _env(), timeout=300, cwd=tmp_path)
    print("elastic job: %.1f s" % (time.monotonic() - t0))
    done = re.findall(r"KERAS-ELASTIC-DONE start_rank=(\d+) size=(\d+) epoch=(\d+) resets=(\d+) restored=(\S+) "
                      r"restored_equal=(\S+) iterations=(\d+) checksum=(\S+)", out)
    assert rc == 0 and "round 2: generation 2 (reset 1): lost 127.0.0.1[0] (failed); 2 ranks on 1 host" in out, \
        out[-6000:]
    assert sorted(d[:7] for d in done) == [(r, "2", "3", "1", "1.1", "OK", "20") for r in ("0", "1")], done
    assert done[0][7] == done[1][7], "the survivors' variables differ: %s" % done


def test_sync_batch_normalization_matches_batch_normalization_over_the_global_batch(tmp_path):
    """hvd.SyncBatchNormalization at 2 ranks holding 3 and 5 samples of one batch
    (keras_sync_bn_worker.py): outputs, moving statistics and gradients (the input's rows, gamma's
    and beta's summed across ranks) equal keras.layers.BatchNormalization's over the whole batch in
    one process, eagerly and (JAX) inside jax.jit; model.fit with the layer leaves the same
    weights and moving statistics on both ranks."""
    assert os.path.exists(KOLO), "run `make build lib` first"
    t0 = time.monotonic()
    rc, out = _run([KOLO, "run", "-np", "2", sys.executable, os.path.join(HERE, "keras_sync_bn_worker.py")], _env(),
                   timeout=300, cwd=tmp_path)
    print("SyncBatchNormalization job: %.1f s" % (time.monotonic() - t0))
    ok = re.findall(r"KERAS-SYNCBN-OK rank=(\d+) checks=(\d+)", out)
    assert rc == 0 and sorted(r for r, _ in ok) == ["0", "1"], out[-6000:]
    assert all(int(n) >= 15 for _, n in ok), ok


def test_kolo_keras_picks_the_backends_binding_and_no_other_framework():
    others = sorted({"tensorflow", "jax", "torch"} - {BACKEND})
    code = ("import sys, kolo.keras as hvd; print(hvd.DistributedOptimizer.__module__, "
            "sorted(m for m in %r if m in sys.modules))" % (others,))
    p = subprocess.run([sys.executable, "-c", code], env=_env(), capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr[-2000:]
    assert p.stdout.split()[0] == "kolo.keras._" + BACKEND and p.stdout.strip().endswith("[]"), p.stdout


def test_unsupported_backend_says_so():
    """A backend kolo.keras does not serve is an ImportError naming it, not a half-working module.
    (Keras's own numpy backend stands for one: Keras is told it runs on it, as it would say with
    KERAS_BACKEND=numpy where scipy is installed.)"""
    code = "import keras; keras.backend.backend = lambda: 'numpy'; import kolo.keras"
    p = subprocess.run([sys.executable, "-c", code], env=_env(), capture_output=True, text=True, timeout=120)
    assert p.returncode != 0 and "ImportError" in p.stderr and "'numpy'" in p.stderr, p.stderr[-2000:]
