#!/usr/bin/env bash
# Installs the Debian packages that kolo's demo and tests use, if any is missing: PyTorch (the binding,
# its tests and examples), the peers and test beds (OpenMPI, sshd in network namespaces, a one-node
# Slurm), the example's data and the Python packaging tools. Does nothing when all are there.
set -euo pipefail
pkgs=(iproute2 make python3-torch python3-numpy python3-pytest python3-yaml python3-setuptools
      python3-wheel python3-pip python3-venv openmpi-bin python3-mpi4py openssh-server
      openssh-client slurm-wlm munge dataset-fashion-mnist)
need=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || need+=("$p")
done
[ ${#need[@]} -eq 0 ] && exit 0
if [ "$(id -u)" -ne 0 ]; then
  echo "kolo needs these Debian packages: ${need[*]}" >&2
  echo "install them with: sudo apt-get install ${need[*]}" >&2
  exit 1
fi
echo "installing ${need[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq "${need[@]}" >/dev/null
