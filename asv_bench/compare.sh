#!/usr/bin/env bash
# Gate a change on speed: asv_bench/compare.sh BASE HEAD
#
# Builds both commits in asv's own environments (asv.conf.json: numpy, scipy, numba, torch, jax) and compares
# the CPU targets at B=8, T=131072 (TimeGAE, TimeGAETimeVarying dones+mask, TrackCopyFloor) with
# `asv continuous --factor 1.1`, in interleaved rounds. Exits 1 when a benchmark got worse by more than 10% and
# asv finds the change significant (beyond the noise of its samples), 0 otherwise; 2 on bad arguments, such as
# two names of one commit (on a fresh clone of main, `main HEAD` is one commit: compare HEAD~1 HEAD).
# Run from anywhere; the first run builds the environments (minutes), later runs reuse them.
set -euo pipefail
cd "$(dirname "$0")"
[ $# -eq 2 ] || { echo "usage: $0 BASE HEAD (two commits, e.g. main HEAD on a branch, or HEAD~1 HEAD)" >&2; exit 2; }
base=$(git rev-parse --verify --quiet "$1^{commit}") || { echo "$0: $1 is not a commit" >&2; exit 2; }
head=$(git rev-parse --verify --quiet "$2^{commit}") || { echo "$0: $2 is not a commit" >&2; exit 2; }
[ "$base" != "$head" ] || { echo "$0: $1 and $2 are the same commit ($base): nothing to compare" >&2; exit 2; }
targets='(numpy/xp|numpy/numba|torch:cpu/xp|torch:cpu/numba|jax:cpu/xp|jax:cpu/jax)'
asv machine --yes > /dev/null
exec asv continuous --factor 1.1 --split --interleave-rounds --show-stderr \
  -b "^bench_gae\.TimeGAE\.time_gae\('$targets', 8, 131072\)" \
  -b "^bench_gae\.TimeGAETimeVarying\.time_gae\('$targets', 'dones\+mask'\)" \
  -b "^bench_gae\.TrackCopyFloor\.track_x_copy_floor\('$targets', '(constant|dones\+mask)'\)" \
  "$base" "$head"
