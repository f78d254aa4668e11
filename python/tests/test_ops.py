"""kolo.torch's ops and basics, each test in real processes (ranks started by bin/kolo run).

    make lib build && /usr/bin/python3 -m pytest python/tests/test_ops.py

Needs bin/kolo and python/kolo/lib/libkolo.so (`make lib build`); tests fail, not skip, without
them.
"""

import os
import subprocess
import sys
import textwrap

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
KOLO = os.path.join(ROOT, "bin", "kolo")
LIB = os.path.join(ROOT, "python", "kolo", "lib", "libkolo.so")
# KOLO_PYTHON: the Python with torch, where that is not Debian's (a CUDA machine's venv).
PY = os.environ.get("KOLO_PYTHON") or ("/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable)


def env():
    e = dict(os.environ)
    e["PYTHONPATH"] = os.path.join(ROOT, "python")
    e.pop("KOLO_LAUNCHER_VERSION", None)
    for k in list(e):
        if k.startswith(("KOLO_RANK", "KOLO_SIZE", "HOROVOD_RANK", "HOROVOD_SIZE", "OMPI_", "PMI_", "SLURM_")):
            del e[k]
    return e


def run(cmd, timeout=300, extra=None):
    assert os.path.exists(KOLO) and os.path.exists(LIB), "run `make lib build` first"
    e = env()
    e.update(extra or {})
    p = subprocess.run(cmd, env=e, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=timeout)
    return p.returncode, p.stdout


@pytest.mark.parametrize("np", [1, 2, 3])
def test_every_op(np):
    rc, out = run([KOLO, "run", "-np", str(np), PY, os.path.join(HERE, "ops_worker.py")])
    assert rc == 0, out
    for scenario in ("allreduce", "grouped", "allgather", "broadcast", "alltoall", "reducescatter",
                     "autograd", "errors", "barrier_join", "leaks"):
        assert "ok " + scenario in out, out


def test_ctrl_c_interrupts_a_hung_collective():
    rc, out = run([KOLO, "run", "-np", "2", PY, os.path.join(HERE, "interrupt_worker.py"), "collective"],
                  timeout=120)
    assert rc == 0 and "ok interrupted allreduce" in out, out


@pytest.mark.parametrize("mode", ["shutdown", "init", "exit"])
def test_ctrl_c_interrupts_init_and_shutdown_waiting_for_a_peer(mode):
    # Rank 0 waits in init()/shutdown() for rank 1, which comes 8 s late: Ctrl-C must interrupt
    # the wait at once, and calling it again must finish what the engine started. In "exit" rank 0
    # exits instead: the shutdown at exit must still wait for rank 1 (else rank 1's shutdown fails).
    rc, out = run([KOLO, "run", "-np", "2", PY, os.path.join(HERE, "interrupt_worker.py"), mode],
                  timeout=120)
    call = "init" if mode == "init" else "shutdown"
    assert rc == 0 and "ok interrupted %s" % call in out, out
    assert "ok %s rank 0" % mode in out and "ok %s rank 1" % mode in out, out


def single(code, extra=None, timeout=120):
    """Runs code in a fresh interpreter without a launcher (a job of one rank)."""
    return run([PY, "-c", textwrap.dedent(code)], timeout=timeout, extra=extra)


def test_before_init():
    rc, out = single("""
        import torch, kolo.torch as hvd
        assert not hvd.is_initialized()
        for f in (hvd.rank, hvd.size, hvd.local_rank, lambda: hvd.allreduce(torch.ones(1))):
            try:
                f()
                raise SystemExit("no error before init")
            except ValueError as e:
                assert "hvd.init()" in str(e), e
        hvd.init(); hvd.init()  # idempotent, as Horovod's
        assert hvd.is_initialized() and hvd.size() == 1 and hvd.rank() == 0
        hvd.shutdown()
        assert not hvd.is_initialized()
        print("ok")
    """)
    assert rc == 0 and "ok" in out, out


def test_forked_child_gets_a_clear_error():
    rc, out = single("""
        import os, torch, kolo.torch as hvd
        from kolo import _lib
        hvd.init()
        pid = os.fork()
        if pid == 0:
            code = 1
            try:  # read while reporting an error: it answers, rather than raise over that error
                if _lib.last_error() != "":
                    os._exit(4)
            except BaseException:
                os._exit(5)
            try:
                assert hvd.rank() == 0 and hvd.size() == 1  # cached: works in the child
                hvd.allreduce(torch.ones(1))
            except hvd.KoloForkError as e:
                code = 0 if "forked" in str(e) else 2
            except BaseException:
                code = 3
            os._exit(code)
        _, status = os.waitpid(pid, 0)
        assert os.WEXITSTATUS(status) == 0, status
        assert hvd.allreduce(torch.ones(1)).item() == 1  # the parent is unaffected
        print("ok")
    """)
    assert rc == 0 and "ok" in out, out


def test_launcher_version_mismatch_is_refused():
    rc, out = single("""
        import kolo, kolo.torch as hvd
        try:
            hvd.init()
            raise SystemExit("init accepted another launcher version")
        except hvd.HorovodInternalError as e:
            assert "9.9.9" in str(e) and kolo.__version__ in str(e), e
        print("ok")
    """, extra={"KOLO_LAUNCHER_VERSION": "9.9.9"})
    assert rc == 0 and "ok" in out, out


def test_library_matches_package():
    rc, out = single("""
        import kolo
        from kolo import _lib
        assert _lib.library_version() == kolo.__version__
        print("ok")
    """)
    assert rc == 0 and "ok" in out, out


def test_cuda_tensors_are_staged():
    rc, out = single("""
        import torch, kolo.torch as hvd
        if not torch.cuda.is_available():
            print("skip: no CUDA"); raise SystemExit(0)
        hvd.init()
        x = torch.arange(6.0, device="cuda")
        y = hvd.allreduce(x, op=hvd.Sum)
        assert y.is_cuda and torch.equal(y.cpu(), torch.arange(6.0))
        z = x.clone(); hvd.allreduce_(z, op=hvd.Sum)
        assert z.is_cuda and torch.equal(z, x)
        g = hvd.allgather(x.view(3, 2))
        assert g.is_cuda and g.shape == (3, 2)
        print("ok")
    """)
    if "skip: no CUDA" in out:
        pytest.skip("no CUDA device")
    assert rc == 0 and "ok" in out, out


def test_cpu_and_gpu_tensors_across_ranks_fail_every_rank():
    # What Horovod's test_horovod_allreduce_cpu_gpu_error checks, without a GPU: rank 1 says its
    # (host) tensors are a GPU's, as the binding says of a staged CUDA tensor. The op fails on both
    # ranks naming the devices, a group mixing the two on one rank is refused on both, and the
    # job goes on. With a GPU, Horovod's own test runs it (docs/pytorch.md, "CUDA tensors").
    code = textwrap.dedent("""
        import torch, kolo.torch as hvd
        from kolo.torch import mpi_ops
        hvd.init()
        r = hvd.rank()
        real = mpi_ops._device_id
        if r == 1:
            mpi_ops._device_id = lambda t: 0
        for call in (lambda: hvd.allreduce(torch.ones(17), name="x"),
                     lambda: hvd.allgather(torch.ones(2, 3)),
                     lambda: hvd.broadcast(torch.ones(3), root_rank=0)):
            try:
                call()
                raise SystemExit("rank %d: no error" % r)
            except hvd.HorovodInternalError as e:  # a RuntimeError, as Horovod's test expects
                assert "mismatched devices" in str(e) and "GPU" in str(e), e
        mpi_ops._device_id = real
        class LooksLikeCUDA(torch.Tensor):  # a host tensor that says it is a CUDA one
            is_cuda = True
        g = [torch.ones(2), torch.ones(3)]
        if r == 0:
            g[1] = g[1].as_subclass(LooksLikeCUDA)
        try:
            hvd.grouped_allreduce(g, name="grp")
            raise SystemExit("rank %d: grouped, no error" % r)
        except RuntimeError as e:  # as Horovod's test: this rank's refusal and the others' error
            assert "must all be in host memory or all on GPUs" in str(e), e
        y = hvd.allreduce(torch.ones(4) * (r + 1), op=hvd.Sum, name="after")
        assert y.tolist() == [3.0] * 4, y
        print("ok devices", flush=True)
    """)
    rc, out = run([KOLO, "run", "-np", "2", PY, "-c", code], timeout=120)
    assert rc == 0 and out.count("ok devices") == 2, out


def test_init_shutdown_init():
    code = textwrap.dedent("""
        import torch, kolo.torch as hvd
        for i in range(3):
            hvd.init()
            y = hvd.allreduce(torch.ones(2), op=hvd.Sum, name="x")
            assert y[0].item() == hvd.size(), y
            hvd.shutdown()
        print("ok reinit", flush=True)
    """)
    rc, out = run([KOLO, "run", "-np", "2", PY, "-c", code], timeout=120)
    assert rc == 0 and out.count("ok reinit") == 2, out


def test_dataloader_workers_forked_after_init():
    # DataLoader workers fork after the engine started; they read hvd.rank() (cached), never call
    # into Go, and the parent's collectives go on.
    code = textwrap.dedent("""
        import torch, kolo.torch as hvd
        from torch.utils.data import DataLoader, Dataset
        hvd.init()
        class D(Dataset):
            def __len__(self): return 64
            def __getitem__(self, i): return torch.tensor([float(i + hvd.rank())])
        tot = torch.zeros(1)
        for epoch in range(2):
            for b in DataLoader(D(), batch_size=8, num_workers=2):
                tot += hvd.allreduce(b.sum(0), op=hvd.Sum, name="b")
        assert tot.item() == 2 * (2 * sum(range(64)) + 64), tot
        print("ok loader", flush=True)
    """)
    rc, out = run([KOLO, "run", "-np", "2", PY, "-c", code], timeout=180)
    assert rc == 0 and out.count("ok loader") == 2, out


def test_init_comm_ranks():
    # hvd.init(comm=[0, 1]) under kolo run: a world of ranks 0 and 1, then the whole job.
    rc, out = run([KOLO, "run", "-np", "3", PY, os.path.join(HERE, "init_comm_worker.py"), "ranks"],
                  timeout=120)
    assert rc == 0 and out.count("ok init comm") == 3, out


def test_init_comm_mpi4py():
    # hvd.init(comm=<mpi4py communicator>) under mpirun, as Horovod scripts do.
    import shutil
    mpirun = shutil.which("mpirun")
    assert mpirun, "mpirun not found (apt-get install openmpi-bin python3-mpi4py)"
    rc, out = run([mpirun, "--allow-run-as-root", "--oversubscribe", "-np", "3",
                   "-x", "PYTHONPATH", PY, os.path.join(HERE, "init_comm_worker.py"), "mpi"],
                  timeout=120)
    assert rc == 0 and out.count("ok init comm") == 3, out


@pytest.mark.parametrize("np", [2, 3])
def test_calls_that_went_different_ways(np):
    # Every rank fails within the crossed-calls deadline, and the job (unnamed ops included) works
    # afterwards.
    rc, out = run([KOLO, "run", "-np", str(np), PY, os.path.join(HERE, "crossed_worker.py"), "2"],
                  timeout=120, extra={"KOLO_STALL_CROSSED_TIME_SECONDS": "2"})
    assert rc == 0 and out.count("ok crossed") == np, out


def test_init_after_a_failure_joins_a_new_world():
    rc, out = run([KOLO, "run", "-np", "3", PY, os.path.join(HERE, "reinit_worker.py")], timeout=120)
    assert rc == 0 and out.count("ok reinit") == 3, out


def test_rank_stats():
    """hvd.rank_stats() gives a script the figures of kolo run's end table: rank 0, whose
    coordinator sees every rank arrive, names the rank slowed by a sleep in its steps. Of two
    ranks one is named only if last in more than 9 of 10 steps (straggle.Threshold): the sleep is
    0.1 s so that this machine's scheduling delays under load (steps' p95 above 0.1 s seen) do
    not make the other rank last often enough to hide it."""
    code = textwrap.dedent("""
        import time, torch, kolo.torch as hvd
        hvd.init()
        model = torch.nn.Linear(8, 2)
        opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                       named_parameters=model.named_parameters())
        for _ in range(30):
            if hvd.rank() == 1:
                time.sleep(0.1)
            opt.zero_grad()
            model(torch.ones(4, 8)).sum().backward()
            opt.step()
        s = hvd.rank_stats()
        assert s["steps"] == 30 and s["ops_done"] >= 30 and s["ops_failed"] == 0, s
        assert 0 < s["in_collectives"] < s["up"] and s["bytes_reduced"] > 0, s
        if hvd.rank() == 0:
            assert s["slowest"] == 1 and s["lateness"][1] > 0.02 > s["lateness"][0], s
        else:
            assert s["slowest"] == -1 and s["lateness"] == {}, s
            assert s["step_median"] > 0.03, s
        hvd.shutdown()
        print("ok", hvd.__name__)
    """)
    rc, out = run([KOLO, "run", "-np", "2", PY, "-c", code])
    assert rc == 0 and out.count("ok kolo.torch") == 2, out
