#!/usr/bin/env bash
# The figures of docs/bench.md (the README's Measured section), one command each: run from the clone's root
# with the test environment active (bash docs/bench_figures.sh [OUT]); each output lands in OUT (default bench-out/).
set -uo pipefail
out=${1:-bench-out}
mkdir -p "$out"
run() { name=$1; shift; echo "== $name: $*"; /usr/bin/time -f "%e s wall" "$@" > "$out/$name.txt" 2> "$out/$name.err"; tail -1 "$out/$name.err"; }
run default      python -m gae_xp bench --plot "$out/bench.png" --json "$out/default.json"
run constant     python -m gae_xp bench --backend numpy,torch,jax --B 8 --T 131072 --repeat 9 --serial-budget 60 --json "$out/constant.json"
run dones-mask   python -m gae_xp bench --backend numpy,torch,jax --B 8 --T 131072 --cases constant,dones+mask --chunk-size auto --paths 'gae_xp[xp],gae_xp[numba],serial,lax.scan,lax.associative_scan' --repeat 9 --serial-budget 60 --json "$out/dones-mask.json"
run unit         python -m gae_xp bench --backend numpy --B 8 --T 131072 --gamma 1 --lam 1 --chunk-size auto --paths 'gae_xp[xp],gae_xp[numba],serial' --serial-budget 60
run small        python -m gae_xp bench --backend numpy,torch,jax --B 8 --T 128 --cases constant,dones+mask --chunk-size auto --repeat 9
run adapters     python -m gae_xp adapters
# the figures the bench quotes when numba is not installed (shipped in the package)
run recorded     python -m gae_xp bench --backend numpy,torch --B 8 --T 131072 --cases constant,dones+mask --paths 'gae_xp[xp],gae_xp[numba]' --chunk-size auto --repeat 9 --json gae_xp/bench/recorded.json
