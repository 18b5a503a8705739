#!/usr/bin/env bash
# The GPU check: on a machine with an NVIDIA GPU and the project's dependencies
# installed (CuPy and/or a CUDA build of torch, numba-cuda), run the GPU tests
# and the GPU benchmark, and print one table. No network needed; a few minutes.
set -uo pipefail
cd "$(dirname "$0")/../.."
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
python -m pytest tests/gpu -m gpu -q -rs -p no:cacheprovider
tests_status=$?
python tests/gpu/bench_gpu.py
exit $tests_status
