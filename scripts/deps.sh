#!/usr/bin/env bash
# Installs the Debian packages that kolo's demo and tests use, if any is missing: PyTorch (the binding,
# its tests and examples); the peers and test beds (OpenMPI, sshd in network namespaces, a one-node
# Slurm; a Prometheus server that scrapes kolo run --metrics-addr; iptables lets the namespaces'
# traffic through a FORWARD policy Docker set to DROP); the
# example's data; the Python packaging tools; and the C compiler cgo needs to build the library Python
# loads (go build -buildmode=c-shared). Then, from PyPI, NCCL and the CUDA runtime (scripts/nvidia_deps.sh) and
# TensorFlow's virtual environments, the newest TensorFlow and the oldest (scripts/tf_venv.sh), and
# those of Keras 3's JAX and PyTorch backends (scripts/jax_venv.sh, scripts/keras_torch_venv.sh).
# Does nothing when all are there.
set -euo pipefail
pkgs=(gcc libc6-dev iproute2 iptables make python3-torch python3-numpy python3-pytest python3-yaml python3-setuptools
      python3-wheel python3-pip python3-venv openmpi-bin python3-mpi4py openssh-server
      openssh-client slurm-wlm munge dataset-fashion-mnist prometheus)
need=()
for p in "${pkgs[@]}"; do
  # A test on the output, not "| grep -q": under pipefail grep -q's early exit can fail the pipe.
  # db:Status-Status is "installed" once per installed architecture, so compare its first word.
  st=$(dpkg-query -W -f='${db:Status-Status} ' "$p" 2>/dev/null || true)
  [ "${st%% *}" = installed ] || need+=("$p")
done
if [ ${#need[@]} -gt 0 ]; then
  if [ "$(id -u)" -ne 0 ]; then
    echo "kolo needs these Debian packages: ${need[*]}" >&2
    echo "install them with: sudo apt-get install ${need[*]}" >&2
    exit 1
  fi
  echo "installing ${need[*]}" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq "${need[@]}" >/dev/null
fi
# From PyPI: JAX and Keras in a virtual environment of their own, for kolo.keras's tests on the JAX
# backend (scripts/jax_venv.sh; does nothing when its versions are there).
"$(dirname "$0")/jax_venv.sh"
# From PyPI: torch 2.15 and Keras in another, for kolo.keras's tests on the PyTorch backend
# (scripts/keras_torch_venv.sh; about 3 GB, torch's CUDA libraries, which it needs to import even on
# a CPU-only machine; does nothing when its versions are there).
"$(dirname "$0")/keras_torch_venv.sh"
# Then from PyPI: NCCL's and the CUDA runtime's headers and libraries, for internal/gpu/nccl's tests
# (scripts/nvidia_deps.sh), and TensorFlow and Keras in virtual environments of their own, the newest
# and the oldest TensorFlow kolo supports, for kolo.tensorflow's (scripts/tf_venv.sh). Each does
# nothing when its versions are there.
"$(dirname "$0")/nvidia_deps.sh"
"$(dirname "$0")/tf_venv.sh" newest
"$(dirname "$0")/tf_venv.sh" oldest
