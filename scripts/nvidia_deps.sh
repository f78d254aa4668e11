#!/usr/bin/env bash
# Installs NCCL's and the CUDA runtime's headers and libraries from PyPI's nvidia wheels into
# .venv/nvidia at the repository's root (git-ignored), for internal/gpu/nccl's tests against the real ones
# (no GPU needed): nccl.h, cuda_runtime_api.h, libnccl.so.2, libcudart.so.12. nccl.h includes the
# CUDA runtime's headers, which need nvcc's crt/ and CCCL's nv/ headers: from their wheels too.
# Does nothing when the pinned versions are there. Needs python3 with pip (scripts/deps.sh).
set -euo pipefail
dir="$(cd "$(dirname "$0")/.." && pwd)/.venv/nvidia"
pkgs=(nvidia-nccl-cu12==2.32.3 nvidia-cuda-runtime-cu12==12.9.79 nvidia-cuda-nvcc-cu12==12.9.86
      nvidia-cuda-cccl-cu12==12.9.27)
stamp="$dir/.installed"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "${pkgs[*]}" ]; then
  exit 0
fi
echo "installing ${pkgs[*]} into $dir" >&2
# Into a fresh directory, moved in place when complete: an interrupted install leaves no stamp.
rm -rf "$dir.new"
python3 -m pip install -q --disable-pip-version-check --root-user-action=ignore --no-deps \
  --target "$dir.new" "${pkgs[@]}"
echo "${pkgs[*]}" >"$dir.new/.installed"
rm -rf "$dir"
mv "$dir.new" "$dir"
