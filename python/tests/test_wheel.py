"""The wheel is all a user needs: build it, install it offline into a fresh venv (no Go, no
compiler, no checkout on the path), and run a 2-rank allreduce with the wheel's own `kolo run`.
The opt-in extra kolo[horovod] then adds Horovod's import paths and horovodrun over the same kolo.

    /usr/bin/python3 -m pytest python/tests/test_wheel.py
"""

import glob
import os
import subprocess
import sys
import textwrap

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
# KOLO_PYTHON: the Python with torch, where that is not Debian's (a CUDA machine's venv).
PY = os.environ.get("KOLO_PYTHON") or ("/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable)

SCRIPT = textwrap.dedent("""
    import torch, kolo, kolo.torch as hvd
    hvd.init()
    x = torch.full((3,), float(hvd.rank() + 1))
    y = hvd.allreduce(x, op=hvd.Sum, name="wheel")
    assert torch.equal(y, torch.full((3,), 3.0)), y
    print("rank", hvd.rank(), "of", hvd.size(), "ok from", kolo.__file__, flush=True)
    hvd.shutdown()
""")


RUN_DRIVER = """
import kolo


def rank():
    import kolo.torch as hvd
    hvd.init()
    return hvd.rank()


if __name__ == "__main__":
    print("ranks", kolo.run(rank, np=2))
"""


def sh(cmd, cwd, env=None, timeout=900):
    p = subprocess.run(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                       timeout=timeout)
    assert p.returncode == 0, "%s failed (%d):\n%s" % (" ".join(cmd), p.returncode, p.stdout[-4000:])
    return p.stdout


HOROVOD_SCRIPT = textwrap.dedent("""
    import torch
    import horovod.torch as hvd
    import kolo.torch
    from horovod.common.exceptions import HorovodInternalError
    from horovod.runner.util.threads import in_thread
    hvd.init()
    assert hvd is kolo.torch and HorovodInternalError is kolo.HorovodInternalError
    import horovod.torch.elastic
    assert horovod.torch.elastic is kolo.torch.elastic
    y = hvd.allreduce(torch.full((2,), float(hvd.rank())), op=hvd.Sum, name="shim")
    assert torch.equal(y, torch.full((2,), 1.0)), y
    t = in_thread(lambda: None)
    t.join()
    print("rank", hvd.rank(), "horovod", __import__("horovod").__version__, flush=True)
    hvd.shutdown()
""")


def test_wheel_installs_and_runs(tmp_path):
    wheels = tmp_path / "wheels"
    sh([PY, "-m", "pip", "wheel", "--no-build-isolation", "--no-deps", "-w", str(wheels), ROOT,
        os.path.join(ROOT, "python-horovod")], cwd=ROOT)
    [whl] = glob.glob(str(wheels / "kolo-*.whl"))
    [hvd_whl] = glob.glob(str(wheels / "kolo_horovod-*.whl"))
    assert "-py3-none-any.whl" in hvd_whl, hvd_whl
    assert whl.endswith("-py3-none-linux_x86_64.whl") or "-py3-none-" in whl, whl

    venv = tmp_path / "venv"
    sh([PY, "-m", "venv", "--system-site-packages", str(venv)], cwd=str(tmp_path))  # torch from the system
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "KOLO_", "HOROVOD_"))}
    # No Go on the path: the installed package must not need it.
    env["PATH"] = "%s:/usr/bin:/bin" % (venv / "bin")
    sh([str(venv / "bin" / "pip"), "install", "--no-index", "--no-deps", whl], cwd=str(tmp_path), env=env)

    (tmp_path / "job.py").write_text(SCRIPT)
    out = sh([str(venv / "bin" / "kolo"), "run", "-np", "2", str(venv / "bin" / "python"), "job.py"],
             cwd=str(tmp_path), env=env, timeout=300)
    assert out.count(" ok from ") == 2, out
    assert str(venv) in out and ROOT + "/python" not in out, "kolo was not imported from the venv:\n" + out
    version = sh([str(venv / "bin" / "kolo"), "version"], cwd=str(tmp_path), env=env)
    assert version.split()[-1] in whl, version

    # kolo.run from the installed package finds the launcher the wheel ships, with no kolo on PATH.
    (tmp_path / "driver.py").write_text(RUN_DRIVER)
    bare = dict(env, PATH="/usr/bin:/bin")
    out = sh([str(venv / "bin" / "python"), "driver.py"], cwd=str(tmp_path), env=bare, timeout=300)
    assert "ranks [0, 1]" in out, out

    # kolo alone has no horovod package: it would shadow a real Horovod.
    py = str(venv / "bin" / "python")
    probe = subprocess.run([py, "-c", "import horovod"], cwd=str(tmp_path), env=env, stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True)
    assert probe.returncode != 0 and "No module named 'horovod'" in probe.stdout, probe.stdout
    assert not (venv / "bin" / "horovodrun").exists()

    # The opt-in extra: Horovod's imports and command, with no line of the script changed.
    sh([str(venv / "bin" / "pip"), "install", "--no-index", "--find-links", str(wheels), "kolo[horovod]"],
       cwd=str(tmp_path), env=env)
    (tmp_path / "hvd_job.py").write_text(HOROVOD_SCRIPT)
    out = sh([str(venv / "bin" / "horovodrun"), "-np", "2", "-H", "localhost:2", py, "hvd_job.py"],
             cwd=str(tmp_path), env=env, timeout=300)
    assert out.count("horovod 0.28.1+kolo.") == 2, out
    out = sh([str(venv / "bin" / "horovodrun"), "--check-build"], cwd=str(tmp_path), env=env)
    assert out.startswith("kolo v"), out
