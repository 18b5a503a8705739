#!/usr/bin/env bash
# Record the asv history that docs/asv/ shows, and publish it there.
#
#   bash asv_bench/history.sh COMMIT...     (the test environment active: numpy, numba, torch, jax, asv)
#
# Each COMMIT is exported from git, installed without dependencies into a folder of its own (the active
# environment brings them, the same for every commit), put first on PYTHONPATH, and timed by this checkout's
# benchmarks with `asv run --python=same --set-commit-hash COMMIT` on the CPU targets (B=8, T=131072: TimeGAE
# and TrackCopyFloor, constant and dones+mask). The results go to asv_bench/recorded/results/<machine>/
# (tracked); then `asv publish` writes docs/asv/ (tracked: this script overwrites it). The pages show the
# commits of the checkout's first-parent history (`git rev-list --first-parent HEAD`): pick COMMITs from it.
# About 3 minutes per commit on the project's 2-core machine. ASV_BENCH overrides the selection (a regular
# expression, as asv's -b).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(dirname "$here")
[ $# -ge 1 ] || { echo "usage: $0 COMMIT... (e.g. \$(git rev-list --first-parent -n 5 HEAD))" >&2; exit 2; }
targets='(numpy/xp|numpy/numba|torch:cpu/xp|torch:cpu/numba|jax:cpu/xp|jax:cpu/jax)'
bench=${ASV_BENCH:-"^bench_gae\.(TimeGAE\.time_gae\('$targets', 8, 131072\)|TrackCopyFloor\.track_x_copy_floor\('$targets', '(constant|dones\+mask)'\))"}
config=recorded/asv.conf.json
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$here"
asv machine --yes --config "$config" > /dev/null
for commit in "$@"; do
  hash=$(git -C "$root" rev-parse --verify "$commit^{commit}")
  echo "== $commit ($hash)"
  mkdir "$work/$hash"
  git -C "$root" archive "$hash" | tar -x -C "$work/$hash"
  python -m pip install --quiet --no-deps --no-build-isolation --target "$work/$hash/site" "$work/$hash"
  PYTHONPATH="$work/$hash/site" python -c "import gae_xp, sys; sys.exit(not gae_xp.__file__.startswith('$work'))" \
    || { echo "the installed $hash is not the gae_xp that imports" >&2; exit 1; }
  PYTHONPATH="$work/$hash/site" asv run --config "$config" --python=same --set-commit-hash "$hash" \
    --attribute rounds=1 --show-stderr -b "$bench"
done
asv publish --config "$config"
echo "wrote $root/docs/asv (open docs/asv/index.html through a web server: python -m http.server -d docs/asv)"
