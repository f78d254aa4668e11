"""Which libnccl kolo.torch hands the engine to load first: the one PyTorch has loaded, else the
copy torch's wheel depends on (pip's nvidia-nccl-cu12, site-packages/nvidia/nccl/lib), so that
torch and kolo use one NCCL. Needs no GPU and no libkolo.

    /usr/bin/python3 -m pytest python/tests/test_torch_nccl.py
"""

import os

from kolo.torch import mpi_ops


def wheel(tmp_path, name):
    lib = tmp_path / name / "nvidia" / "nccl" / "lib"
    lib.mkdir(parents=True)
    (lib / "libnccl.so.2").write_bytes(b"")
    return str(tmp_path / name), str(lib / "libnccl.so.2")


def test_loaded_copy_first(tmp_path):
    site, _ = wheel(tmp_path, "site")
    maps = tmp_path / "maps"
    maps.write_text("7f00-7f10 r-xp 00000000 08:01 42 /opt/torch/lib/libnccl.so.2.21.5\n")
    assert mpi_ops._torch_nccl(str(maps), [site]) == b"/opt/torch/lib/libnccl.so.2.21.5"


def test_wheel_copy_when_none_is_loaded(tmp_path):
    os.makedirs(tmp_path / "empty")
    empty = str(tmp_path / "empty")
    site, lib = wheel(tmp_path, "site")
    maps = tmp_path / "maps"
    maps.write_text("7f00-7f10 r-xp 00000000 08:01 42 /usr/lib/libc.so.6\n")
    assert mpi_ops._torch_nccl(str(maps), [empty, site]) == lib.encode()


def test_none_without_either(tmp_path):
    assert mpi_ops._torch_nccl(str(tmp_path / "no-maps"), [str(tmp_path)]) is None
