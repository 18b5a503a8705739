#!/usr/bin/env bash
# Every asv benchmark function once, on one cheap parameter set each (the CPU's, mostly NumPy's: the other
# targets' paths are the tests' business), in the active environment: a benchmark whose code breaks fails the
# run (`asv run` exits 2 on a failed benchmark; --quick times once and saves nothing). 35 s on the project's
# 2-core machine while other work ran. For CI:
#
#   bash asv_bench/smoke.sh
#
# Each function of benchmarks/bench_gae.py is selected below (tests/test_bench.py checks that none is left out);
# a target that cannot run here skips with its reason, as in a full run (TrackGPUMemory without a GPU).
set -euo pipefail
cd "$(dirname "$0")"
asv machine --yes > /dev/null
exec asv run --python=same --quick --show-stderr \
  -b "^bench_gae\.TimeGAE\.time_gae\('numpy/xp', 8, 4096\)" \
  -b "^bench_gae\.TimeGAETimeVarying\.time_gae\('numpy/xp', 'dones\+mask'\)" \
  -b "^bench_gae\.TimeGAEChunkSize\.time_gae\('numpy/xp', 'dones\+mask', 16\)" \
  -b "^bench_gae\.TimeSmallShapes\.time_gae\('numpy/xp', 'dones\+mask'\)" \
  -b "^bench_gae\.TimeBaselines\.time_baseline\('numpy', 'slime-chunked-128', 4096\)" \
  -b "^bench_gae\.TimeJAXReferencesTimeVarying\.time_baseline\('jax:cpu', 'lax\.scan'\)" \
  -b "^bench_gae\.TimeAdapters\.time_call\('torch:cpu', 'slime vanilla_gae', 'gae_xp'\)" \
  -b "^bench_gae\.PeakMemGAE\.peakmem_gae\('numpy', 'dones\+mask'\)" \
  -b "^bench_gae\.TrackGPUMemory\.track_device_peak_bytes\('torch:cuda', 'constant'\)" \
  -b "^bench_gae\.TrackAccuracy\.track_max_abs_error\('numpy/xp', 'gamma=1 lam=1'\)" \
  -b "^bench_gae\.TrackCopyFloor\.track_x_copy_floor\('numpy/xp', 'constant'\)"
