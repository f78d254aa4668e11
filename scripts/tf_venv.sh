#!/usr/bin/env bash
# Makes the virtual environment kolo.tensorflow's tests run in (.venv/tf, or $KOLO_TF_VENV):
# TensorFlow, tf-keras (Keras 2), pytest and parameterized (which Horovod's Keras suite imports:
# scripts/horovod_suite.sh) from PyPI, as a user installs them. Its own
# environment, without the system's site packages: TensorFlow needs numpy 2, which Debian's
# PyTorch (the system's numpy 1) cannot load. Keras 3 comes with TensorFlow. Does nothing when the
# tested versions are there; about 3.5 minutes when not. `make test-python` runs the TensorFlow
# tests with its python (TF_PYTHON).
set -euo pipefail
cd "$(dirname "$0")/.."
venv=${KOLO_TF_VENV:-.venv/tf}
# The versions the tests passed with; the newest on PyPI when they were written.
want=("tensorflow-cpu==2.21.*" "tf-keras==2.21.*" "pytest" "parameterized")
check='import importlib.metadata as m
assert m.version("tensorflow-cpu").startswith("2.21.") and m.version("tf-keras").startswith("2.21.")
m.version("pytest"); m.version("parameterized")'
if [ -x "$venv/bin/python" ] && "$venv/bin/python" -c "$check" 2>/dev/null; then
  exit 0
fi
echo "installing ${want[*]} into $venv" >&2
/usr/bin/python3 -m venv "$venv"
"$venv/bin/python" -m pip install -q --disable-pip-version-check "${want[@]}"
"$venv/bin/python" -c "$check"
