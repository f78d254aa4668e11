"""kolo.torch's training side in real processes (ranks started by bin/kolo run):
DistributedOptimizer, broadcast/gather functions, SyncBatchNorm, kolo.run, failure handling, and
the PyTorch examples.

    make lib build && /usr/bin/python3 -m pytest python/tests/test_training.py

Needs bin/kolo and python/kolo/lib/libkolo.so (`make lib build`); tests fail, not skip, without
them.
"""

import os
import re
import signal
import subprocess
import textwrap
import time
import uuid

import pytest

from test_ops import HERE, KOLO, PY, ROOT, env, run

SCENARIOS = ["optimizer", "optimizer_adam", "backward_passes", "fp16", "bf16", "groups",
             "predivide_and_sum", "sparse", "misuse", "unused_parameter", "skip_synchronize",
             "broadcast", "sync_batch_norm", "dataloader_fork"]
MNIST = "/usr/share/datasets/fashion-mnist"


@pytest.mark.parametrize("np", [1, 2, 4])
def test_training_scenarios(np):
    # One process alone has nothing to allreduce: the optimizer installs no hooks there.
    scenarios = [s for s in SCENARIOS if not (np == 1 and s == "misuse")]
    rc, out = run([KOLO, "run", "-np", str(np), PY, os.path.join(HERE, "training_worker.py")]
                  + scenarios, timeout=600)
    assert rc == 0, out
    for s in scenarios:
        assert "ok " + s in out, out


def test_a_rank_raising_fails_the_job_and_names_it():
    start = time.monotonic()
    rc, out = run([KOLO, "run", "-np", "2", PY, os.path.join(HERE, "training_failure_worker.py"),
                   "raise"], timeout=120)
    took = time.monotonic() - start
    assert rc != 0, out
    assert "rank 1 on localhost exited with code 1 (the first rank to fail)" in out, out
    assert "ValueError: rank 1 hit a bad batch at step 2" in out, out
    # Rank 0 was blocked in step() on rank 1's gradients: it fails with rank 1's error, which
    # rank 1's exception hook sent before exiting (then it exits or the launcher stops it).
    assert "rank 0 saw: rank 1 failed: ValueError: rank 1 hit a bad batch at step 2" in out, out
    assert re.search(r"rank 0 on localhost: (stopped by the launcher|exited with code 1)", out), out
    # Leaving at once, not after the shutdown barrier's timeout.
    assert took < 30, "the job took %.0f s to fail:\n%s" % (took, out)


def test_a_rank_that_ends_early_is_named():
    """A rank whose script finishes while the other still trains: the other's step fails at once,
    naming it, and kolo run names it as the rank the failure began with, from the failure
    records, though it exits 0 and the other fails first."""
    start = time.monotonic()
    rc, out = run([KOLO, "run", "-np", "2", PY, os.path.join(HERE, "training_failure_worker.py"),
                   "ended"], timeout=120)
    took = time.monotonic() - start
    assert rc != 0, out
    assert ("rank 1 on localhost ended (exited with code 0) while other ranks still needed it "
            "(the first rank to fail)") in out, out
    assert re.search(r"Rank 0 reported: ended \(blames rank 1\): .*rank 1 ended without submitting it", out), out
    assert took < 30, "the job took %.0f s to fail:\n%s" % (took, out)


def _start_hung_job(token):
    """Starts 2 ranks where rank 0 blocks in optimizer.step(); returns (process, rank 0's pid)."""
    p = subprocess.Popen([KOLO, "run", "-np", "2", PY,
                          os.path.join(HERE, "training_failure_worker.py"), "hang", token],
                         env=env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         start_new_session=True)
    deadline = time.monotonic() + 120
    lines = []
    for line in p.stdout:
        lines.append(line)
        m = re.search(r"blocked in synchronize pid=(\d+)", line)
        if m:
            time.sleep(1)  # let rank 0 get into the wait
            return p, int(m.group(1)), lines
        if time.monotonic() > deadline:
            break
    p.kill()
    raise AssertionError("rank 0 never reached synchronize:\n" + "".join(lines))


def _finish(p, lines, timeout):
    try:
        out, _ = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        out, _ = p.communicate()
        raise AssertionError("the job did not stop within %d s:\n%s" % (timeout, "".join(lines) + out))
    return "".join(lines) + out


def _leftovers(token):
    """PIDs of processes whose command line carries token."""
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open("/proc/%s/cmdline" % pid, "rb") as f:
                if token.encode() in f.read():
                    found.append(int(pid))
        except OSError:
            pass
    return found


def test_ctrl_c_during_synchronize_stops_the_job():
    """Ctrl-C in the terminal (SIGINT to the launcher's process group) while a rank waits in
    synchronize(): every rank stops and kolo run exits 130."""
    token = "kolo-test-" + uuid.uuid4().hex
    p, _, lines = _start_hung_job(token)
    os.killpg(p.pid, signal.SIGINT)
    out = _finish(p, lines, 30)
    assert p.returncode == 130, out
    assert "interrupted: stopped every rank" in out, out
    time.sleep(0.5)
    assert _leftovers(token) == [], out


def test_ctrl_c_to_a_rank_in_synchronize():
    """SIGINT to the rank itself (Ctrl-C under a launcher that forwards it): KeyboardInterrupt is
    raised inside synchronize(), the rank exits, and the launcher stops the others."""
    token = "kolo-test-" + uuid.uuid4().hex
    p, pid0, lines = _start_hung_job(token)
    os.kill(pid0, signal.SIGINT)
    out = _finish(p, lines, 30)
    assert p.returncode != 0, out
    assert "KeyboardInterrupt" in out and "synchronize" in out, out
    assert re.search(r"rank 0 on localhost (exited|killed by signal 2).*the first rank to fail", out), out
    time.sleep(0.5)
    assert _leftovers(token) == [], out


def test_step_again_after_ctrl_c():
    rc, out = run([KOLO, "run", "-np", "2", PY, os.path.join(HERE, "training_failure_worker.py"),
                   "retry"], timeout=120)
    assert rc == 0 and "ok retry" in out, out


def _driver(code, timeout=180):
    """Runs a driver script (a file, so its functions can be imported by the workers)."""
    path = os.path.join(os.environ.get("TMPDIR", "/tmp"), "kolo_run_%s.py" % uuid.uuid4().hex)
    with open(path, "w") as f:
        f.write(textwrap.dedent(code))
    try:
        return run([PY, path], timeout=timeout)
    finally:
        os.remove(path)


def test_kolo_run_returns_every_ranks_result():
    rc, out = _driver("""
        import kolo

        def work(scale, offset=0):
            import torch, kolo.torch as hvd
            hvd.init()
            total = hvd.allreduce(torch.tensor([float(hvd.rank())]), op=hvd.Sum, name="t")
            print("rank %d says hi" % hvd.rank(), end="")  # no newline: the result still parses
            return {"rank": hvd.rank(), "value": hvd.rank() * scale + offset, "sum": total.item()}

        if __name__ == "__main__":
            got = kolo.run(work, args=(10,), kwargs={"offset": 1}, np=3)
            assert got == [{"rank": r, "value": 10 * r + 1, "sum": 3.0} for r in range(3)], got
            print("ok run")
    """)
    assert rc == 0 and "ok run" in out, out
    assert "rank 2 says hi" in out, out


def test_kolo_run_carries_arguments_larger_than_an_environment_variable():
    rc, out = _driver("""
        import glob, os, tempfile
        import kolo
        from kolo import runner

        def size(blob):
            import kolo.torch as hvd
            hvd.init()
            return len(blob) + hvd.rank()

        if __name__ == "__main__":
            blob = os.urandom(400 << 10)  # ~530 KiB once pickled and base64-encoded
            before = set(glob.glob(os.path.join(tempfile.gettempdir(), "kolo-run-*")))
            assert kolo.run(size, args=(blob,), np=2) == [len(blob), len(blob) + 1]
            left = set(glob.glob(os.path.join(tempfile.gettempdir(), "kolo-run-*"))) - before
            assert not left, left
            try:
                runner._payload_env("x" * (runner._MAX_PAYLOAD + 1), local=False)
            except ValueError as e:
                assert "other hosts" in str(e), e
                print("ok remote refused")
            print("ok large")
    """)
    assert rc == 0 and "ok large" in out and "ok remote refused" in out, out


def test_kolo_run_raises_the_failing_ranks_error():
    rc, out = _driver("""
        import kolo

        class Custom(Exception):
            pass

        def boom():
            import torch, kolo.torch as hvd
            hvd.init()
            if hvd.rank() == 1:
                raise Custom("rank one exploded")
            hvd.allreduce(torch.ones(1), name="never")

        if __name__ == "__main__":
            try:
                kolo.run(boom, np=2)
            except RuntimeError as e:
                assert e.rank == 1, e.rank
                assert "rank 1 raised Custom: rank one exploded" in str(e), e
                assert isinstance(e.__cause__, Custom), repr(e.__cause__)
                print("ok raised")
            try:
                import cloudpickle  # noqa: F401 (with it, lambdas travel by value)
                assert kolo.run(lambda: 1, np=1) == [1]
                print("ok lambda")
            except ImportError:
                try:
                    kolo.run(lambda: 1, np=1)
                except ValueError as e:
                    assert "pickle" in str(e), e
                    print("ok lambda")
    """)
    assert rc == 0 and "ok raised" in out and "ok lambda" in out, out


def _mnist(np, *flags, timeout=600):
    rc, out = run([KOLO, "run", "-np", str(np), PY, os.path.join(ROOT, "examples", "pytorch_mnist.py")]
                  + list(flags), timeout=timeout)
    assert rc == 0, out
    m = re.search(r"final: ranks=%d .*test_accuracy=([\d.]+)" % np, out)
    assert m, out
    return float(m.group(1)), out


@pytest.mark.skipif(not os.path.isdir(MNIST), reason="needs Debian's dataset-fashion-mnist")
def test_mnist_example_same_accuracy_on_1_2_4_ranks():
    """Short runs with one global batch: every -np sees the same batches, so test accuracy
    agrees (the full runs are in docs/pytorch.md)."""
    flags = ["--epochs", "1", "--max-steps", "40", "--global-batch-size", "64",
             "--max-test-samples", "2000", "--lr", "0.002"]
    accs = {np: _mnist(np, *flags)[0] for np in (1, 2, 4)}
    assert accs[1] > 55, accs  # it learned something in 40 steps
    for np in (2, 4):
        assert abs(accs[np] - accs[1]) <= 0.5, accs


@pytest.mark.skipif(not os.path.isdir(MNIST), reason="needs Debian's dataset-fashion-mnist")
def test_mnist_example_with_forked_loader_workers_and_fp16():
    acc, out = _mnist(2, "--epochs", "1", "--max-steps", "20", "--workers", "2",
                      "--fp16-allreduce", "--max-test-samples", "500")
    assert "training on 2 rank(s)" in out, out


def test_synthetic_benchmark():
    rc, out = run([KOLO, "run", "-np", "2", PY,
                   os.path.join(ROOT, "examples", "pytorch_synthetic_benchmark.py"),
                   "--mlp-sizes", "64,128,10", "--num-warmup-batches", "2", "--num-iters", "3",
                   "--num-batches-per-iter", "3"], timeout=180)
    assert rc == 0, out
    assert re.search(r"Total samples/sec on 2 rank\(s\): [\d.]+ \+-[\d.]+", out), out
