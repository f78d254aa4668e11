#!/bin/bash
# Trains Horovod's own TensorFlow 2 examples under kolo, their imports changed and nothing else:
# examples/tensorflow2/tensorflow2_mnist.py (DistributedGradientTape in tf.function) and
# tensorflow2_keras_mnist.py (Keras fit with kolo's DistributedOptimizer and callbacks); and
# examples/keras/keras_mnist_advanced.py, written for TensorFlow 1, in its port to TensorFlow 2 and
# Keras 3 (scripts/keras_mnist_advanced_tf2.patch, shown in docs/tensorflow.md). Horovod's files are
# read from a checkout outside this repository and copied to a temporary folder.
#
#   make lib build
#   scripts/horovod_examples.sh /path/to/horovod [kolo|mpirun] [EXAMPLE...]
#   EXAMPLE_ARGS="--epochs 1" scripts/horovod_examples.sh /path/to/horovod kolo keras_mnist_advanced.py
#
# kolo (default): `kolo run -np 2`; mpirun: OpenMPI's `mpirun -np 2` with no kolo run (kolo's ranks
# meet through mpirun's environment). The examples load MNIST with
# `tf.keras.datasets.mnist.load_data(path='mnist-<rank>.npz')`, which nothing here can download: the
# script writes that cache (HOME/.keras/datasets, HOME a temporary folder) from Debian's
# Fashion-MNIST (dataset-fashion-mnist; same shapes and classes), and a sitecustomize on the ranks'
# path lets Keras accept a cached file whose checksum is not MNIST's. Keras: the tensorflow2
# examples are written for Keras 2 (`opt.variables()`, `compile(experimental_run_tf_function=...)`),
# so they run with TF_USE_LEGACY_KERAS=1 over tf-keras, as on any TensorFlow from 2.16 on; the
# ported keras_mnist_advanced.py runs on Keras 3. EXAMPLE_ARGS are given to every example.
# KOLO_PYTHON names the Python (default: the repository's .venv/tf).
set -euo pipefail
hvd=${1:?usage: $0 HOROVOD_CHECKOUT [kolo|mpirun] [EXAMPLE...]}
shift
how=kolo
if [ $# -gt 0 ]; then
	how=$1
	shift
fi
examples=("$@")
[ ${#examples[@]} -gt 0 ] || examples=(tensorflow2_mnist.py tensorflow2_keras_mnist.py keras_mnist_advanced.py)
read -r -a args <<<"${EXAMPLE_ARGS:-}"
root=$(cd "$(dirname "$0")/.." && pwd)
py=${KOLO_PYTHON:-$root/.venv/tf/bin/python}
data=${FASHION_MNIST:-/usr/share/datasets/fashion-mnist}
[ -x "$root/bin/kolo" ] || { echo "$0: $root/bin/kolo not built: run make lib build" >&2; exit 2; }
[ -f "$data/train-images-idx3-ubyte.gz" ] || { echo "$0: no Fashion-MNIST in $data (Debian: dataset-fashion-mnist)" >&2; exit 2; }

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/home/.keras/datasets" "$tmp/site" "$tmp/run"
"$py" - "$data" "$tmp/home/.keras/datasets" <<'EOF'
import gzip, os, sys
import numpy as np

src, dst = sys.argv[1], sys.argv[2]


def idx(name, offset):
    with gzip.open(os.path.join(src, name)) as f:
        return np.frombuffer(f.read(), np.uint8, offset=offset)


x_train = idx("train-images-idx3-ubyte.gz", 16).reshape(-1, 28, 28)
y_train = idx("train-labels-idx1-ubyte.gz", 8)
x_test = idx("t10k-images-idx3-ubyte.gz", 16).reshape(-1, 28, 28)
y_test = idx("t10k-labels-idx1-ubyte.gz", 8)
np.savez(os.path.join(dst, "mnist.npz"), x_train=x_train, y_train=y_train, x_test=x_test, y_test=y_test)
for rank in range(8):
    np.savez(os.path.join(dst, "mnist-%d.npz" % rank), x_train=x_train, y_train=y_train, x_test=x_test, y_test=y_test)
EOF
cat >"$tmp/site/sitecustomize.py" <<'EOF'
# Keras checks a cached dataset against MNIST's checksum and downloads it again when they differ;
# the cache here is Fashion-MNIST, written by scripts/horovod_examples.sh, and nothing can be
# downloaded. Files under this HOME's Keras cache are taken as they are.
import os

_cache = os.path.join(os.path.expanduser("~"), ".keras")


def _accepting(validate):
    def validate_file(fpath, file_hash, algorithm="auto", chunk_size=65535):
        if os.path.abspath(fpath).startswith(_cache + os.sep):
            return True
        return validate(fpath, file_hash, algorithm, chunk_size)
    return validate_file


def _patch():
    import importlib
    for mod in ("tf_keras.src.utils.data_utils", "keras.src.utils.file_utils"):
        try:
            m = importlib.import_module(mod)
        except ImportError:
            continue
        m.validate_file = _accepting(m.validate_file)


_patch()
EOF
for ex in "${examples[@]}"; do
	legacy=1
	case $ex in
	keras_mnist_advanced.py)
		src=$hvd/examples/keras/$ex
		[ -f "$src" ] || { echo "$0: $src not found" >&2; exit 2; }
		cp "$src" "$tmp/run/$ex"
		patch -s "$tmp/run/$ex" "$root/scripts/keras_mnist_advanced_tf2.patch"
		legacy=0 ;;
	*)
		src=$hvd/examples/tensorflow2/$ex
		[ -f "$src" ] || { echo "$0: $src not found" >&2; exit 2; }
		sed -E 's/^import horovod$/import kolo as horovod/;
		        s/^import horovod\.(tensorflow|keras|torch)((\.[a-z_]+)*) as /import kolo.\1\2 as /' "$src" >"$tmp/run/$ex" ;;
	esac
	echo "== $ex under $how: lines changed from Horovod's:"
	diff "$src" "$tmp/run/$ex" | sed 's/^/    /' || true
	env=(HOME="$tmp/home" TF_USE_LEGACY_KERAS=$legacy TF_CPP_MIN_LOG_LEVEL=2 CUDA_VISIBLE_DEVICES=-1
	     PYTHONPATH="$root/python:$tmp/site")
	start=$SECONDS
	case $how in
	kolo) (cd "$tmp/run" && env "${env[@]}" "$root/bin/kolo" run -np 2 "$py" "$ex" "${args[@]}") ;;
	mpirun)
		command -v mpirun >/dev/null || { echo "$0: no mpirun (Debian: openmpi-bin)" >&2; exit 2; }
		(cd "$tmp/run" && env "${env[@]}" mpirun -np 2 --oversubscribe --allow-run-as-root \
			-x HOME -x TF_USE_LEGACY_KERAS -x TF_CPP_MIN_LOG_LEVEL -x CUDA_VISIBLE_DEVICES -x PYTHONPATH "$py" "$ex" "${args[@]}") ;;
	*) echo "$0: kolo or mpirun, not $how" >&2; exit 2 ;;
	esac
	echo "== $ex under $how: done in $((SECONDS - start)) s"
done
