#!/usr/bin/env bash
# Every figure in the README and in docs/bench.md, one command each: run from the clone's root with the test
# environment active (bash docs/figures.sh [OUT]); each output lands in OUT (default bench-out/), with its wall
# time. About 35 minutes on the project's 2-core machine (the asv history alone about 15). The GPU figures come
# from tests/gpu/check.sh, on a GPU.
#
# Tracked files this script OVERWRITES (commit them, or `git checkout` them back):
#   docs/bench.png                the default sweep's plot
#   gae_xp/bench/recorded.json    the figures the bench quotes for an extra that is not installed
#   asv_bench/recorded/results/   the recorded asv history (one folder per machine; other machines' stay)
#   docs/asv/                     that history published by asv
#   docs/asv.png                  a screenshot of it (needs chromium and the npm packages named below)
#   docs/architecture.png         the package's modules and imports (docs/architecture_figure.py, matplotlib)
#   docs/scale.png                the layouts of docs/scale.md (matplotlib)
#   README.md, docs/gpu.md        the generated traffic tables between their markers
set -uo pipefail
out=${1:-bench-out}
mkdir -p "$out"
echo "overwrites docs/bench.png, gae_xp/bench/recorded.json, asv_bench/recorded/results/, docs/asv/, docs/asv.png,"
echo "  docs/architecture.png, docs/scale.png and the traffic tables in README.md and docs/gpu.md"
run() { name=$1; shift; echo "== $name: $*"; /usr/bin/time -f "%e s wall" "$@" > "$out/$name.txt" 2> "$out/$name.err"; tail -1 "$out/$name.err"; }
# the bench (README "Measured"): constant discount, dones + mask, gamma = lam = 1, small shapes, adapters
run constant     python -m gae_xp bench --library numpy,torch,jax --B 8 --T 131072 --repeat 9 --serial-budget 60 --json "$out/constant.json"
run dones-mask   python -m gae_xp bench --library numpy,torch,jax --B 8 --T 131072 --cases constant,dones+mask --chunk-size auto --paths 'gae_xp[xp],gae_xp[numba],gae_xp[jax],serial,lax.scan,lax.associative_scan' --repeat 9 --serial-budget 60 --json "$out/dones-mask.json"
run unit         python -m gae_xp bench --library numpy --B 8 --T 131072 --gamma 1 --lam 1 --chunk-size auto --paths 'gae_xp[xp],gae_xp[numba],serial' --serial-budget 60
run small        python -m gae_xp bench --library numpy,torch,jax --B 8 --T 128 --cases constant,dones+mask --chunk-size auto --repeat 9
run adapters     python -m gae_xp adapters
# a busy machine (docs/bench.md, "Under load"): the same command quiet, then with one busy process per usable core
run quiet        python -m gae_xp bench --library numpy,torch --B 8 --T 131072 --cases constant,dones+mask --paths 'gae_xp[xp],gae_xp[numba]' --chunk-size auto --repeat 9 --no-first-call
run load         python -m gae_xp bench --library numpy,torch --B 8 --T 131072 --cases constant,dones+mask --paths 'gae_xp[xp],gae_xp[numba]' --chunk-size auto --repeat 9 --no-first-call --load
# where the microseconds of a small call go (docs/bench.md, "Small calls")
run profile      python -m gae_xp bench --library numpy,torch --B 8 --T 128 --cases constant,dones+mask --profile
# float32 accuracy per chunk size and path, next to the float32 serial loop
run accuracy     python tests/conformance/float32_accuracy.py
# the GPU traffic model (predicted, no GPU needed), written between its markers, and the kernels' registers
run traffic      python -m tools.traffic --write
# the cost model (bytes and SASS instructions, calibrated on the measured H200 table): its fit and predictions
run cost-model   python -m tools.cost_model --write
run registers    python tests/test_cuda_compile.py
# beyond one device: packed sequences, context parallelism (4 gloo processes), Dask out of core and in memory
run packed       env NUMBA_NUM_THREADS=1 python -m gae_xp.bench.scale packed
run cp           python -m gae_xp.bench.scale cp
run cp-packed    python -m gae_xp.bench.scale cp-packed
run dask-graph   python -m gae_xp.bench.scale dask-graph
run dask-ooc     python -m gae_xp.bench.scale dask-ooc --gib 4 --block-mib 64
run dask-fits    python -m gae_xp.bench.scale dask-throughput
# the pictures: the package's modules and imports (read from the code with ast), the scale layouts (matplotlib)
run architecture python docs/architecture_figure.py
run scale-figure python docs/scale_figure.py
# the default sweep and its plot (tracked), and the figures the bench quotes when numba is not installed (tracked)
run default      python -m gae_xp bench --plot docs/bench.png --json "$out/default.json"
run recorded     python -m gae_xp bench --library numpy,torch --B 8 --T 131072 --cases constant,dones+mask --paths 'gae_xp[xp],gae_xp[numba]' --chunk-size auto --repeat 9 --no-first-call --json gae_xp/bench/recorded.json
# asv (docs/bench.md, "asv"): the recorded history on five commits of the first-parent history, published to
# docs/asv/ (tracked), and its screenshot (tracked). The screenshot needs `apt-get install chromium` and, in
# NODE_MODULES (default ../asv-npm/node_modules), the npm packages listed in asv_bench/offline_html.py.
run asv-history  bash asv_bench/history.sh $(git rev-list --first-parent -n 40 HEAD | awk 'NR % 10 == 1')
run asv-offline  python asv_bench/offline_html.py docs/asv "${NODE_MODULES:-../asv-npm/node_modules}" "$out/asv-offline"
run asv-shot     python asv_bench/screenshot.py "$out/asv-offline" docs/asv.png
