#!/bin/bash
# Runs one of Horovod's own test suites (test/parallel/*.py) under kolo. Horovod's files are read from
# a checkout outside this repository and copied to a temporary folder; nothing of Horovod is kept here.
#
#   make lib build
#   scripts/horovod_suite.sh /path/to/horovod [NP] [PYTEST_ARGS...]
#   SUITE=test_tensorflow.py scripts/horovod_suite.sh /path/to/horovod 2
#   UNCHANGED=1 SUITE=test_torch.py scripts/horovod_suite.sh /path/to/horovod 2
#
# SUITE: the file in test/parallel (default test_torch.py; test_tensorflow.py,
# test_tensorflow2_keras.py, test_tensorflow_keras.py, test_keras.py,
# test_tensorflow_process_sets.py, ...). NP defaults to 2 (Horovod runs its suites at 2 ranks and
# more).
#
# Two ways, both with kolo-horovod's helper modules (python-horovod/: horovod.common.util,
# horovod.runner.common.util.env, horovod.runner.util.threads) on the path for the few helpers
# Horovod's tests import from outside the frameworks:
#  - default: the suite's imports of Horovod's frameworks changed to kolo's and nothing else
#    (`import horovod.torch as hvd` -> `import kolo.torch as hvd`, `from horovod.tensorflow.util
#    import` -> `from kolo.tensorflow.util import`, ...);
#  - UNCHANGED=1: no line changed, run with `horovodrun` over the kolo-horovod package
#    (`pip install kolo[horovod]`), where horovod.torch and friends are kolo's.
#
# The suites need pytest and packaging; where mock or cloudpickle is not installed, test/utils/common.py,
# which imports them for helpers these suites do not use, does without (mock: unittest.mock in its
# place; cloudpickle: its import line becomes `cloudpickle = None`: test/utils is not the suite). KOLO_PYTHON names the Python (default: /usr/bin/python3
# for PyTorch suites, the repository's .venv/tf for TensorFlow and Keras ones). Where torch sees fewer
# GPUs than NP ranks, the ranks share them: the tests put rank r's tensors on cuda:r (its local rank),
# and a sitecustomize on the ranks' path maps that index onto the GPUs there are.
set -euo pipefail
hvd=${1:?usage: $0 HOROVOD_CHECKOUT [NP] [PYTEST_ARGS...]}
shift
np=2
if [ $# -gt 0 ]; then
	np=$1
	shift
fi
root=$(cd "$(dirname "$0")/.." && pwd)
suite=${SUITE:-test_torch.py}
case $suite in
*torch*) default_py=/usr/bin/python3 ;;
*) default_py=$root/.venv/tf/bin/python ;;
esac
py=${KOLO_PYTHON:-$default_py}
for f in "test/parallel/$suite" test/utils/common.py; do
	[ -f "$hvd/$f" ] || { echo "$0: $hvd/$f not found: give a Horovod checkout" >&2; exit 2; }
done
[ -x "$root/bin/kolo" ] || { echo "$0: $root/bin/kolo not built: run make lib build" >&2; exit 2; }

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# The suite and the test/parallel files it imports (base_test_tensorflow.py, ...).
cp "$hvd"/test/parallel/*.py "$tmp/"
cp "$hvd/test/utils/common.py" "$tmp/common.py"
if [ "${UNCHANGED:-0}" != 1 ]; then
	# Only the imports of Horovod's frameworks change: `import horovod.X[.Y] as Z` and
	# `from horovod.X[.Y] import ...` for X in torch, tensorflow, keras.
	for f in "$tmp"/*.py; do
		sed -i -E 's/^(\s*)import horovod\.(torch|tensorflow|keras)((\.[a-z_]+)*) as /\1import kolo.\2\3 as /;
		           s/^(\s*)from horovod\.(torch|tensorflow|keras)((\.[a-z_]+)*) import /\1from kolo.\2\3 import /' "$f"
	done
	grep -qE '^\s*import kolo\.' "$tmp/$suite" || { echo "$0: no 'import horovod.<framework> as hvd' line in $suite to change" >&2; exit 2; }
fi
if ! "$py" -c 'import mock' 2>/dev/null; then
	# version_info: parameterized (test_tensorflow2_keras.py) reads the backport's version; unittest.mock
	# has what mock 4 fixed.
	printf '%s\n' 'from unittest.mock import *  # noqa: F401,F403  (the old mock package, which common.py imports)' \
		'version_info = (4, 0, 0)' >"$tmp/mock.py"
fi
if ! "$py" -c 'import cloudpickle' 2>/dev/null; then
	# common.py pickles functions for its in_thread helpers only, which these suites do not call.
	# (No stand-in module: kolo.torch would take it for cloudpickle.)
	sed -i 's/^import cloudpickle$/cloudpickle = None/' "$tmp/common.py"
fi
path="$root/python:$root/python-horovod:$tmp"
if [[ $suite == *torch* ]] && "$py" -c "import sys, torch; sys.exit(not (torch.cuda.is_available() and torch.cuda.device_count() < $np))"; then
	mkdir "$tmp/share"
	cat >"$tmp/share/sitecustomize.py" <<'EOF'
import torch

_cuda = torch.Tensor.cuda


def _shared(self, device=None, *args, **kwargs):
    if isinstance(device, int) and torch.cuda.device_count():
        device = device % torch.cuda.device_count()
    return _cuda(self, device, *args, **kwargs)


torch.Tensor.cuda = _shared
EOF
	path="$path:$tmp/share"
fi
launcher=("$root/bin/kolo" run)
[ "${UNCHANGED:-0}" = 1 ] && launcher=("$py" -m horovod.runner.launch)  # horovodrun, as kolo-horovod installs it
# --oversubscribe: NP may exceed the CPUs (a small machine, or a GPU box with few cores).
cd "$tmp"
PYTHONPATH="$path" "${launcher[@]}" -np "$np" --oversubscribe "$py" -m pytest -q -p no:cacheprovider -rfs "$@" "$tmp/$suite"
