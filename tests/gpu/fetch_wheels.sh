#!/usr/bin/env bash
# The wheels tests/gpu/check.sh needs on a bare GPU machine without a package registry (Python 3.12, x86_64, CUDA 13,
# with torch, Triton, CuPy, numba and numba-cuda already there), downloaded into .whl/ where PyPI is reachable.
# .whl/ is ignored by git: carry it with the checkout (tests/gpu/README.md).
set -euo pipefail
cd "$(dirname "$0")/../.."
mkdir -p .whl
wheels=(
  array-api-compat==1.16.0  # gae_xp's one dependency beyond NumPy
  cuda-cccl==1.0.0          # cuda.compute for the CUB scan baseline (1.0 compiles its operators with numba-cuda)
)
platforms=()
for tag in manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_26_x86_64 manylinux_2_17_x86_64 \
           manylinux2014_x86_64; do
  platforms+=(--platform "$tag")
done
python3 -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  "${platforms[@]}" -d .whl "${wheels[@]}"
ls -l .whl
