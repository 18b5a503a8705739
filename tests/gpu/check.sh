#!/usr/bin/env bash
# The GPU check: one prepared run of at most 8 minutes on a machine with an
# NVIDIA GPU, numba-cuda and CuPy and/or a CUDA build of torch:
#   1. tests/gpu (CuPy and torch CUDA against the float64 reference, on the
#      fused kernels and the generic path; a busy non-default stream the
#      kernels must queue on; torch's sync-debug mode and patched copy and
#      synchronize functions: no host synchronization, no device-to-host copy);
#   2. tests/gpu/bench_gpu.py at B=256, T=131072: the fused path, the generic
#      path, slime's chunk scan and the serial loop (time and bandwidth).
# A failing test does not stop the benchmark, and a failing benchmark case
# prints its error in its row. Logs and JSON go to $OUT (or /tmp/gae_xp-gpu).
#
# Nothing can be downloaded on the GPU machine. The checkout is installed from
# itself (no network, no build isolation: setuptools must be there), and a
# Python package the machine lacks travels as a wheel in .whl/ (ignored by
# git), e.g. array-api-compat, which the GPU image of this workplace lacks:
#   here:   echo /.whl/ >> .git/info/exclude
#           python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 \
#               --implementation cp --platform manylinux2014_x86_64 -d .whl array-api-compat==1.16.0
#   there:  bash tests/gpu/check.sh        (with .whl carried along with the checkout)
# The tests run from outside the checkout: its gae_xp/ would shadow the
# installed package, whose gae_xp.backends is mapped from backends/ at install.
set -uo pipefail
repo=$(cd "$(dirname "$0")/../.." && pwd)
site=${GAE_XP_SITE:-/tmp/gae_xp-site}
out=${OUT:-/tmp/gae_xp-gpu}
python=${PYTHON:-python3}
mkdir -p "$out"
export PYTHONUNBUFFERED=1

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
install=(-m pip install --quiet --no-index --no-deps --no-cache-dir --upgrade --target "$site")
if compgen -G "$repo/.whl/*.whl" >/dev/null; then
  "$python" "${install[@]}" --no-compile "$repo"/.whl/*.whl || exit 1
fi
"$python" "${install[@]}" --no-build-isolation "$repo" || exit 1
export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
cd /tmp || exit 1
"$python" -c 'import gae_xp, numba_cuda, numba.cuda as c; print("gae_xp", gae_xp.__file__, "| numba-cuda",
  numba_cuda.__version__, "| GPU visible to numba:", c.is_available())' || exit 1

echo "== GPU tests"
timeout 330 "$python" -m pytest "$repo/tests/gpu" --rootdir "$repo" -c "$repo/pyproject.toml" -m gpu -q -rs \
  -p no:cacheprovider --junitxml "$out/gpu-tests.xml" 2>&1 | tee "$out/gpu-tests.log"
tests_status=${PIPESTATUS[0]}

echo "== GPU benchmark"
timeout 120 "$python" "$repo/tests/gpu/bench_gpu.py" --json "$out/bench_gpu.json" 2>&1 | tee "$out/bench_gpu.log"
bench_status=${PIPESTATUS[0]}
exit $(( tests_status != 0 ? tests_status : bench_status ))
