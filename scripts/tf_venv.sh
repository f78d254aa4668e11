#!/usr/bin/env bash
# Makes a virtual environment kolo.tensorflow's tests run in, for one of the two TensorFlows they
# are run with:
#
#   scripts/tf_venv.sh [newest]   # .venv/tf:        TensorFlow 2.21, Keras 3 and tf-keras 2.21
#   scripts/tf_venv.sh oldest     # .venv/tf-oldest: TensorFlow 2.12 and its Keras 2.12 (numpy 1)
#
# (KOLO_TF_VENV names another directory.) TensorFlow (CPU), its Keras, pytest and parameterized
# (which Horovod's Keras suite imports: scripts/horovod_suite.sh) from PyPI, as a user installs
# them, in an environment of its own, without the system's site packages: TensorFlow 2.21 needs
# numpy 2, which Debian's PyTorch (the system's numpy 1) cannot load. Does nothing when the wanted
# versions are there; when not, 3.5 to 10 minutes (newest) or about 4 (oldest) on 2 busy cores.
# `make test-python` runs the TensorFlow tests with both (TF_PYTHON and TF_OLDEST_PYTHON).
set -euo pipefail
cd "$(dirname "$0")/.."
case "${1:-newest}" in
  # The newest on PyPI when the tests were written; tf-keras is tf.keras where TF_USE_LEGACY_KERAS=1.
  newest) tf=2.21 keras=tf-keras venv=.venv/tf ;;
  # The oldest with a wheel for Debian 12's Python 3.11 (no TensorFlow before 2.12 has a cp311
  # wheel). Its Keras 2.12 comes with it (the keras package, tf.keras); tf-keras starts at 2.14.
  oldest) tf=2.12 keras=keras venv=.venv/tf-oldest ;;
  *) echo "usage: $0 [newest|oldest]" >&2; exit 2 ;;
esac
venv=${KOLO_TF_VENV:-$venv}
want=("tensorflow-cpu==$tf.*" "$keras==$tf.*" "pytest" "parameterized")
check="import importlib.metadata as m
assert m.version('tensorflow-cpu').startswith('$tf.') and m.version('$keras').startswith('$tf.')
m.version('pytest'); m.version('parameterized')"
if [ -x "$venv/bin/python" ] && "$venv/bin/python" -c "$check" 2>/dev/null; then
  exit 0
fi
echo "installing ${want[*]} into $venv" >&2
/usr/bin/python3 -m venv "$venv"
"$venv/bin/python" -m pip install -q --disable-pip-version-check "${want[@]}"
"$venv/bin/python" -c "$check"
