"""kolo.torch's side of the GPU data path, where no GPU is: which entry points of the C ABI an op
calls, and the device path's decision as the binding asks for it and keeps it. What needs a GPU
(the device path itself) runs in scripts/gpu_check.sh; the ctypes signatures of the device entry
points are checked against the header in test_lib.py.

    make lib build && /usr/bin/python3 -m pytest python/tests/test_device.py
"""

import pytest

from test_ops import single

# Records every call into the library by name; LooksLikeCUDA is a host tensor that says it is on
# CUDA device 0, so that an op takes the binding's CUDA branch without a GPU.
PRELUDE = """
    import torch, kolo.torch as hvd
    from kolo import _lib
    from kolo.torch import mpi_ops

    class Counting(object):
        def __init__(self, lib):
            self._lib, self.calls = lib, []

        def __getattr__(self, name):
            fn = getattr(self._lib, name)

            def counted(*args):
                self.calls.append(name)
                return fn(*args)
            return counted

        def device_calls(self):
            return [c for c in self.calls if c.startswith("kolo_device") or c == "kolo_enqueue_device"]

    class LooksLikeCUDA(torch.Tensor):
        is_cuda = True
        device = property(lambda self: torch.device("cuda", 0))

    hvd.init()
    lib = Counting(_lib.C)
    _lib.C = lib
"""


@pytest.mark.parametrize("nccl", ["0", "auto"])
def test_cpu_ops_never_call_the_device_path_and_cuda_ops_ask_once(nccl):
    # A CPU job's ops never reach the device entry points. An op on a CUDA tensor asks for the
    # device path's decision once (here: not used, no NCCL or KOLO_NCCL=0), the binding keeps it,
    # and every later op on that device is staged as before without asking again.
    rc, out = single(PRELUDE + """
    t = torch.arange(6.0)
    assert hvd.allreduce(t, op=hvd.Sum, name="cpu").tolist() == t.tolist()
    hvd.allreduce_(t.clone(), name="cpu_")
    assert hvd.allgather(t.view(3, 2), name="cpu.g").shape == (3, 2)
    hvd.grouped_allreduce([t, t.clone()], name="cpu.grp")
    hvd.synchronize(hvd.reducescatter_async(t, name="cpu.rs"))
    assert lib.device_calls() == [], lib.device_calls()
    assert mpi_ops._device_paths == {}, mpi_ops._device_paths

    x = torch.arange(4.0).as_subclass(LooksLikeCUDA)
    y = hvd.allreduce(x, op=hvd.Sum, name="cuda")
    assert y.as_subclass(torch.Tensor).tolist() == [0.0, 1.0, 2.0, 3.0], y
    assert lib.device_calls() == ["kolo_device_setup", "kolo_device_decision"], lib.device_calls()
    assert mpi_ops._device_paths == {0: False}, mpi_ops._device_paths
    why = _lib._string(_lib.C.kolo_device_why)
    print("why:", why)
    assert %(want)r in why, why

    lib.calls.clear()
    z = x.clone().as_subclass(LooksLikeCUDA)
    hvd.allreduce_(z, op=hvd.Sum, name="cuda_")
    hvd.grouped_allreduce([x, x.clone().as_subclass(LooksLikeCUDA)], op=hvd.Sum, name="cuda.grp")
    g = hvd.allgather(x.view(2, 2), name="cuda.g")
    assert g.shape == (2, 2), g.shape
    # Another device of the rank gets the decision made for the first (the engine sets the
    # device path up on one device per rank), without asking again.
    class OnDevice1(torch.Tensor):
        is_cuda = True
        device = property(lambda self: torch.device("cuda", 1))
    w = hvd.allreduce(torch.ones(3).as_subclass(OnDevice1), op=hvd.Sum, name="cuda1")
    assert w.as_subclass(torch.Tensor).tolist() == [1.0] * 3, w
    assert mpi_ops._device_paths == {0: False, 1: False}, mpi_ops._device_paths
    assert lib.device_calls() == [], lib.device_calls()
    assert "kolo_enqueue" in lib.calls and "kolo_enqueue_group" in lib.calls, lib.calls
    print("ok")
    """ % {"want": "KOLO_NCCL=0" if nccl == "0" else "libnccl"}, extra={"KOLO_NCCL": nccl})
    assert rc == 0 and "ok" in out, out


def test_required_device_path_that_cannot_serve_raises():
    # KOLO_NCCL=1 where NCCL cannot serve (no GPU, no library): the first op on a CUDA tensor raises
    # the engine's reason instead of staging it; host ops are untouched.
    rc, out = single(PRELUDE + """
    assert hvd.allreduce(torch.ones(2), op=hvd.Sum, name="cpu").tolist() == [1.0, 1.0]
    x = torch.arange(4.0).as_subclass(LooksLikeCUDA)
    try:
        hvd.allreduce(x, op=hvd.Sum, name="cuda")
        raise SystemExit("no error")
    except (ValueError, hvd.HorovodInternalError) as e:
        assert "nccl" in str(e).lower(), e
        print("raised:", e)
    assert lib.device_calls()[:1] == ["kolo_device_setup"], lib.device_calls()
    assert "kolo_enqueue_device" not in lib.calls, lib.calls
    print("ok")
    """, extra={"KOLO_NCCL": "1"})
    assert rc == 0 and "ok" in out, out


def test_ops_the_engine_refuses_on_its_device_path_are_staged():
    # The binding believes the device path is in use (as on a GPU) while the engine has decided
    # to stage: every device submission is then refused as one to stage (kolo_error_kind 3), after
    # the engine has parsed the op's block. Each op must come back staged, correct, with scale
    # factors applied once (the binding's own scaling is for the device path only), in groups too.
    rc, out = single(PRELUDE + """
    import types
    x = torch.arange(4.0).as_subclass(LooksLikeCUDA)
    assert mpi_ops._device_path(0) is False
    mpi_ops._device_paths[0] = True
    torch.cuda.current_stream = lambda device=None: types.SimpleNamespace(cuda_stream=0)
    lib.calls.clear()

    plain = lambda t: t.as_subclass(torch.Tensor).tolist()
    assert plain(hvd.allreduce(x, op=hvd.Sum, name="a")) == [0.0, 1.0, 2.0, 3.0]
    assert plain(hvd.allreduce(x, name="avg", prescale_factor=2.0, postscale_factor=3.0)) == [0.0, 6.0, 12.0, 18.0]
    z = x.clone().as_subclass(LooksLikeCUDA)
    hvd.allreduce_(z, op=hvd.Sum, name="a_", prescale_factor=0.5)
    assert plain(z) == [0.0, 0.5, 1.0, 1.5], z
    assert plain(hvd.broadcast(x, root_rank=0, name="b")) == [0.0, 1.0, 2.0, 3.0]
    assert hvd.allgather(x.view(2, 2), name="g").shape == (2, 2)
    assert plain(hvd.reducescatter(x, op=hvd.Sum, name="rs")) == [0.0, 1.0, 2.0, 3.0]
    got, splits = hvd.alltoall(x, splits=torch.tensor([4]), name="at")
    assert plain(got) == [0.0, 1.0, 2.0, 3.0] and splits.tolist() == [4], (got, splits)
    outs = hvd.grouped_allreduce([x, z], op=hvd.Sum, name="grp", postscale_factor=2.0)
    assert [plain(o) for o in outs] == [[0.0, 2.0, 4.0, 6.0], [0.0, 1.0, 2.0, 3.0]], outs
    n = lib.calls.count("kolo_enqueue_device")
    assert n == 9, (n, lib.calls)  # every op tried the device path, and each group member on its own
    # The group tried the device path first, as one group (kolo_enqueue_group with a stream).
    assert lib.calls.count("kolo_enqueue_group") == 1, lib.calls
    assert lib.calls.count("kolo_error_kind") == n + 1, lib.calls
    assert not mpi_ops._handle_map and _lib.C.kolo_handles() == 0, (mpi_ops._handle_map, _lib.C.kolo_handles())
    print("ok")
    """)
    assert rc == 0 and "ok" in out, out
