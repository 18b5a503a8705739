#!/usr/bin/env bash
# Every figure in the README, one command each: run from the clone's root with the test environment active
# (bash docs/figures.sh [OUT]); each output lands in OUT (default bench-out/), with its wall time.
# About 15 minutes on the project's 2-core machine. The GPU figures come from tests/gpu/check.sh, on a GPU.
set -uo pipefail
out=${1:-bench-out}
mkdir -p "$out"
run() { name=$1; shift; echo "== $name: $*"; /usr/bin/time -f "%e s wall" "$@" > "$out/$name.txt" 2> "$out/$name.err"; tail -1 "$out/$name.err"; }
# the bench (README "Measured"): constant discount, dones + mask, gamma = lam = 1, small shapes, adapters
run constant     python -m gae_xp bench --backend numpy,torch,jax --B 8 --T 131072 --repeat 9 --serial-budget 60 --json "$out/constant.json"
run dones-mask   python -m gae_xp bench --backend numpy,torch,jax --B 8 --T 131072 --cases constant,dones+mask --chunk-size auto --paths 'gae_xp[xp],gae_xp[numba],gae_xp[jax],serial,lax.scan,lax.associative_scan' --repeat 9 --serial-budget 60 --json "$out/dones-mask.json"
run unit         python -m gae_xp bench --backend numpy --B 8 --T 131072 --gamma 1 --lam 1 --chunk-size auto --paths 'gae_xp[xp],gae_xp[numba],serial' --serial-budget 60
run small        python -m gae_xp bench --backend numpy,torch,jax --B 8 --T 128 --cases constant,dones+mask --chunk-size auto --repeat 9
run adapters     python -m gae_xp adapters
# float32 accuracy per chunk size and path, next to the float32 serial loop
run accuracy     python tests/conformance/float32_accuracy.py
# the GPU traffic model (predicted, no GPU needed) and the kernels' registers (compiled on the CPU)
run traffic      python -m gae_xp.bench.traffic
run registers    python tests/test_cuda_compile.py
# beyond one device: packed sequences, context parallelism (4 gloo processes), Dask out of core and in memory
run packed       env NUMBA_NUM_THREADS=1 python -m gae_xp.bench.scale packed
run cp           python -m gae_xp.bench.scale cp
run cp-packed    python -m gae_xp.bench.scale cp-packed
run dask-graph   python -m gae_xp.bench.scale dask-graph
run dask-ooc     python -m gae_xp.bench.scale dask-ooc --gib 4 --block-mib 64
run dask-fits    python -m gae_xp.bench.scale dask-throughput
# the default sweep, its plot, and the figures the bench quotes when numba is not installed (shipped in the package)
run default      python -m gae_xp bench --plot docs/bench.png --json "$out/default.json"
run recorded     python -m gae_xp bench --backend numpy,torch --B 8 --T 131072 --cases constant,dones+mask --paths 'gae_xp[xp],gae_xp[numba]' --chunk-size auto --repeat 9 --json gae_xp/bench/recorded.json
