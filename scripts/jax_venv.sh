#!/usr/bin/env bash
# Makes the virtual environment kolo.keras's JAX-backend tests run in (.venv/jax, or $KOLO_JAX_VENV):
# JAX for the CPU (jax[cpu]: jax and jaxlib, no CUDA), standalone Keras 3, numpy and pytest from
# PyPI, as a user installs them. Its own environment, without the system's site packages: JAX
# needs numpy 2 (Debian's PyTorch has numpy 1), and no TensorFlow is in it, so the tests also show
# that kolo.keras on JAX never imports TensorFlow. Does nothing when the tested versions are there;
# about 2 minutes and 700 MB when not (jaxlib 350 MB; scipy, which jax needs, 140 MB). `make
# test-python` runs the JAX tests with its python (JAX_PYTHON).
set -euo pipefail
cd "$(dirname "$0")/.."
venv=${KOLO_JAX_VENV:-.venv/jax}
# The versions the tests passed with: the newest on PyPI when they were written that install on
# Debian 12's Python 3.11 (jax 0.11 and later need Python 3.12).
want=("jax[cpu]==0.10.*" "keras==3.15.*" "numpy" "pytest")
check='import importlib.metadata as m
assert m.version("jax").startswith("0.10.") and m.version("keras").startswith("3.15.")
m.version("jaxlib"); m.version("numpy"); m.version("pytest")'
if [ -x "$venv/bin/python" ] && "$venv/bin/python" -c "$check" 2>/dev/null; then
  exit 0
fi
echo "installing ${want[*]} into $venv" >&2
mkdir -p "$(dirname "$venv")"
/usr/bin/python3 -m venv "$venv"
"$venv/bin/python" -m pip install -q --disable-pip-version-check "${want[@]}"
"$venv/bin/python" -c "$check"
