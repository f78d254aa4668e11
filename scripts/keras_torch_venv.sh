#!/usr/bin/env bash
# Makes the virtual environment kolo.keras's PyTorch-backend tests run in (.venv/keras-torch, or
# $KOLO_KERAS_TORCH_VENV): torch 2.15, standalone Keras 3, numpy and pytest from PyPI, as a user
# installs them. Its own environment, without the system's site packages (Debian's PyTorch is 1.13
# with numpy 1), and no TensorFlow or JAX in it, so the tests also show that kolo.keras on torch
# imports neither. Does nothing when the tested versions are there.
#
# PyPI's only Linux build of torch 2.15 is the CUDA one: its wheel (540 MB) requires the CUDA 13
# libraries as wheels (cudnn 520 MB, cublas 400 MB, cusolver, cufft, nccl, cusparselt, cusparse,
# nvshmem, ...; triton 290 MB), about 3 GB downloaded and 5.5 GB installed (nvidia/ 3.0 GB, triton
# 1.0 GB, torch 1.2 GB), 2.5 minutes here. They are needed on a CPU-only machine too: libtorch_cpu
# and libtorch_python are linked against libcudart, libcupti, libcublas, libcudnn and the others,
# and `import torch` fails without them (torch --no-deps alone: "libcudart.so.13: cannot open
# shared object file"). torch then runs on the CPU (torch.cuda.is_available() is False).
set -euo pipefail
cd "$(dirname "$0")/.."
venv=${KOLO_KERAS_TORCH_VENV:-.venv/keras-torch}
# The versions the tests passed with: the newest on PyPI when they were written.
want=("torch==2.15.*" "keras==3.15.*" "numpy" "pytest")
check='import importlib.metadata as m
assert m.version("torch").startswith("2.15.") and m.version("keras").startswith("3.15.")
m.version("numpy"); m.version("pytest")
import torch'
if [ -x "$venv/bin/python" ] && "$venv/bin/python" -c "$check" 2>/dev/null; then
  exit 0
fi
echo "installing ${want[*]} into $venv (about 3 GB from PyPI: torch's CUDA libraries)" >&2
mkdir -p "$(dirname "$venv")"
/usr/bin/python3 -m venv "$venv"
"$venv/bin/python" -m pip install -q --disable-pip-version-check "${want[@]}"
"$venv/bin/python" -c "$check"
