#!/usr/bin/env bash
# The GPU check: one prepared run of at most 8 minutes on a machine with an NVIDIA GPU (tests/gpu/README.md):
#   1. tests/gpu: CuPy and torch CUDA against the float64 reference (at most 150 s);
#   2. tests/gpu/bench_gpu.py: every shape and baseline of the GPU benchmark (no new shape after 240 s, killed at
#      300 s), results as bench_gpu.json and bench_gpu.md.
# A failing test does not stop the benchmark; a baseline that cannot run says why in its row. Logs, JSON and
# Markdown go to $OUT (or /tmp/gae_xp-gpu).
#
# Nothing is downloaded there. The checkout is installed from itself (no network, no build isolation:
# setuptools must be there), and the Python packages the machine lacks travel as wheels in .whl/ (ignored by
# git), fetched here by tests/gpu/fetch_wheels.sh; carry .whl with the checkout.
# The tests run from outside the checkout: its gae_xp/ would shadow the installed package, whose
# gae_xp.backends is mapped from backends/ at install.
set -uo pipefail
repo=$(cd "$(dirname "$0")/../.." && pwd)
site=${GAE_XP_SITE:-/tmp/gae_xp-site}
out=${OUT:-/tmp/gae_xp-gpu}
python=${PYTHON:-python3}
mkdir -p "$out"
export PYTHONUNBUFFERED=1
started=$(date +%s)

nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.mem --format=csv,noheader || true
install=(-m pip install --quiet --no-index --no-deps --no-cache-dir --upgrade --target "$site")
if compgen -G "$repo/.whl/*.whl" >/dev/null; then
  "$python" "${install[@]}" --no-compile "$repo"/.whl/*.whl || exit 1
else
  echo "no wheels in $repo/.whl: run tests/gpu/fetch_wheels.sh where PyPI is reachable and carry .whl" >&2
fi
"$python" "${install[@]}" --no-build-isolation "$repo" || exit 1
export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
cd /tmp || exit 1
"$python" - <<'PY' || exit 1
import importlib
import gae_xp
from gae_xp.backends import _cuda_import
print("gae_xp", gae_xp.__file__, "| kernels compiled by", _cuda_import.NAME)
for name in ("numba_cuda", "numba", "torch", "cupy", "triton", "cuda.compute", "numba_cuda_mlir"):
    try:
        print(f"  {name} {getattr(importlib.import_module(name), '__version__', '?')}")
    except Exception as error:  # absent, or failing to load: say which
        print(f"  {name}: not loaded ({type(error).__name__}: {str(error).splitlines()[0][:100]})")
from numba import cuda
print("GPU visible to numba:", cuda.is_available())
PY

echo "== GPU tests"
# -o addopts=: the project's own (--dist loadfile) need pytest-xdist, which that machine may lack
timeout 150 "$python" -m pytest "$repo/tests/gpu" --rootdir "$repo" -c "$repo/pyproject.toml" -o addopts= -m gpu -q -rs \
  -p no:cacheprovider --junitxml "$out/gpu-tests.xml" 2>&1 | tee "$out/gpu-tests.log"
tests_status=${PIPESTATUS[0]}

echo "== GPU benchmark"
timeout 300 "$python" "$repo/tests/gpu/bench_gpu.py" --budget 240 --out "$out" 2>&1 | tee "$out/bench_gpu.log"
bench_status=${PIPESTATUS[0]}
echo "== check.sh took $(( $(date +%s) - started )) s (tests: exit $tests_status, benchmark: exit $bench_status)"
exit $(( tests_status != 0 ? tests_status : bench_status ))
