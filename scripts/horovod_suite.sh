#!/bin/bash
# Runs Horovod's own PyTorch test suite (test/parallel/test_torch.py) under kolo, its import line
# changed and nothing else. Horovod's files are read from a checkout outside this repository and
# copied to a temporary folder; nothing of Horovod is kept here.
#
#   make lib build
#   scripts/horovod_suite.sh /path/to/horovod [NP] [PYTEST_ARGS...]
#
# NP defaults to 2 (Horovod runs the suite at 2 ranks and more). The suite needs pytest and
# packaging (Debian: python3-pytest python3-packaging); where mock or cloudpickle is not installed,
# common.py, which imports them for helpers test_torch.py does not use, does without.
# KOLO_PYTHON names the Python with torch (default /usr/bin/python3). Where torch sees fewer GPUs
# than NP ranks, the ranks share them: the tests put rank r's tensors on cuda:r (its local rank), and
# a sitecustomize on the ranks' path maps that index onto the GPUs there are.
set -euo pipefail
hvd=${1:?usage: $0 HOROVOD_CHECKOUT [NP] [PYTEST_ARGS...]}
shift
np=2
if [ $# -gt 0 ]; then
	np=$1
	shift
fi
root=$(cd "$(dirname "$0")/.." && pwd)
py=${KOLO_PYTHON:-/usr/bin/python3}
for f in test/parallel/test_torch.py test/utils/common.py; do
	[ -f "$hvd/$f" ] || { echo "$0: $hvd/$f not found: give a Horovod checkout" >&2; exit 2; }
done
[ -x "$root/bin/kolo" ] || { echo "$0: $root/bin/kolo not built: run make lib build" >&2; exit 2; }

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
sed 's/^import horovod.torch as hvd$/import kolo.torch as hvd/' "$hvd/test/parallel/test_torch.py" >"$tmp/test_torch.py"
grep -q '^import kolo.torch as hvd$' "$tmp/test_torch.py" || { echo "$0: no 'import horovod.torch as hvd' line to change" >&2; exit 2; }
# common.py imports Horovod's runner for one helper that test_torch.py does not use.
sed 's/^from horovod.runner.util.threads import in_thread$/in_thread = None/' "$hvd/test/utils/common.py" >"$tmp/common.py"
if ! "$py" -c 'import mock' 2>/dev/null; then
	echo 'from unittest.mock import *  # noqa: F401,F403  (the old mock package, which common.py imports)' >"$tmp/mock.py"
fi
if ! "$py" -c 'import cloudpickle' 2>/dev/null; then
	# common.py pickles functions for its in_thread helpers only, which test_torch.py does not call.
	# (No stand-in module: kolo.torch would take it for cloudpickle.)
	sed -i 's/^import cloudpickle$/cloudpickle = None/' "$tmp/common.py"
fi
path="$root/python:$tmp"
if "$py" -c "import sys, torch; sys.exit(not (torch.cuda.is_available() and torch.cuda.device_count() < $np))"; then
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
# --oversubscribe: NP may exceed the CPUs (a small machine, or a GPU box with few cores).
PYTHONPATH="$path" "$root/bin/kolo" run -np "$np" --oversubscribe "$py" -m pytest -q -p no:cacheprovider -rfs "$@" "$tmp/test_torch.py"
