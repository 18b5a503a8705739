#!/usr/bin/env bash
# The GPU check: one prepared run of at most 8 minutes, install included, on a machine with an NVIDIA GPU and no
# package registry (tests/gpu/README.md). Five parts, in this order, each under its own budget (`timeout`), each
# writing its results to $OUT before the next starts, so that a run killed at any point keeps what was done:
#   tests      tests/gpu, the files in FILES' order, each under its own share of the budget (gpu-tests.xml);
#   sanitizer  compute-sanitizer memcheck and racecheck on small calls of every kernel structure (sanitizer.txt);
#   profile    cProfile of 2,000 eager calls at 38400x128 and 4096x32 per route (host-profile.txt);
#   bench      tests/gpu/bench_gpu.py: every route, baseline, case, dtype and Triton tuning variant per shape
#              (bench_gpu.json and bench_gpu.md, rewritten after every shape);
#   verdicts   one line per target of "The GPU at the copy floor" (verdicts.md).
# A failing or timed-out part does not stop the next. $OUT (or /tmp/gae_xp-gpu) holds 8 files at most: check.md
# (the machine, the packages and one line per part as it ends), the six above and logs.tar (each part's log,
# appended as the part ends).
#
# Nothing is downloaded there. The checkout is installed from itself (no network, no build isolation; where that
# fails, for want of a recent setuptools, gae_xp is imported from the checkout, whose gae_xp/backends links to
# backends/), and the Python packages the machine lacks travel as wheels in .whl/ (ignored by git), fetched where
# PyPI is reachable by tests/gpu/fetch_wheels.sh; carry .whl with the checkout. The parts run from /tmp: the
# checkout's gae_xp/ would otherwise shadow the installed package.
#
# GAE_XP_CHECK_DRY_RUN=1 runs every part on the CPU with tiny stand-in work and the checkout's own environment
# (no install): tests/test_gpu_check.py checks the script that way. PYTHON, NVIDIA_SMI and COMPUTE_SANITIZER name
# the programs used; GAE_XP_BUDGET_<PART> (e.g. GAE_XP_BUDGET_BENCH=60) shortens a part's budget; GAE_XP_COMMIT
# names the commit measured where the copy has no .git (`GAE_XP_COMMIT=$(git rev-parse --short HEAD)` here);
# GAE_XP_CHECK_FILES replaces FILES (the same "pattern=cap" words), for a rerun that picks the files a first run
# did not reach.
set -uo pipefail
repo=$(cd "$(dirname "$0")/../.." && pwd)
here=$repo/tests/gpu
site=${GAE_XP_SITE:-/tmp/gae_xp-site}
out=${OUT:-/tmp/gae_xp-gpu}
python=${PYTHON:-python3}
dry_run=${GAE_XP_CHECK_DRY_RUN:-0}
logs=$(mktemp -d)
mkdir -p "$out"
export PYTHONUNBUFFERED=1 GAE_XP_HYPOTHESIS_PROFILE=gpu
# The GPU runs compiled Triton kernels: never the interpreter that the CPU tests use (tests/conftest.py)
export TRITON_INTERPRET=0

# Seconds per part, install included; with GRACE (the seconds a part stopped at its budget has to exit before it
# is killed) after each, they fit in the 8 minutes (480 s) the check may take.
# The first H100 run (docs/gpu_runs/2026-12-06-h100) spent its tests' 115 s compiling on a fresh machine, before
# 4 of the 6 files ran, and its profile and benchmark 9 and 119 of their 40 and 180: the tests take from them.
BUDGETS=(install=30 tests=150 sanitizer=66 profile=25 bench=160 verdicts=10)
GRACE=2
# The GPU test files, in the order they run: both routes' every structure, sync-free calls, graphs and streams
# (test_routes.py), the Triton route's own two that no run has reached yet, sync and graphs, devices and streams,
# then any other file, the long test_cuda.py last; each gets at most its cap out of what is left.
FILES=(test_routes.py=45 test_triton_cuda.py=30 test_triton_op_cuda.py=25 test_sync_and_graphs.py=25
       test_devices_and_streams.py=10 'test_*.py=30' test_cuda.py=115)

budget_of() {  # the budget of part $1: GAE_XP_BUDGET_<PART> if set, else BUDGETS'
  local entry override
  override=GAE_XP_BUDGET_${1^^}
  if [[ -n ${!override:-} ]]; then echo "${!override}"; return; fi
  for entry in "${BUDGETS[@]}"; do [[ ${entry%%=*} == "$1" ]] && echo "${entry#*=}" && return; done
  echo "check.sh: no budget for part $1" >&2; exit 2
}

started=$SECONDS
{
  echo "# GPU check"
  echo
  # GAE_XP_COMMIT names the commit where the copy on the GPU machine has no .git
  echo "- started: $(date -u '+%Y-%m-%d %H:%M UTC'), commit ${GAE_XP_COMMIT:-$(git -C "$repo" rev-parse --short HEAD \
    2>/dev/null || echo 'unknown (no .git: set GAE_XP_COMMIT)')}"
  [[ $dry_run == 1 ]] && echo "- DRY RUN: tiny stand-in work on the CPU, nothing measured"
  echo "- budgets (s): ${BUDGETS[*]}"
  gpu=$("${NVIDIA_SMI:-nvidia-smi}" --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null)
  echo "- GPU: ${gpu:-none found by ${NVIDIA_SMI:-nvidia-smi}}"
} > "$out/check.md"

part() {  # part NAME COMMAND...: COMMAND under NAME's budget, its output in NAME.log (appended to logs.tar)
  local name=$1 budget status began=$SECONDS outcome
  shift
  budget=$(budget_of "$name")
  echo "== $name (budget $budget s, $(( SECONDS - started )) s so far)"
  timeout -k "$GRACE" "$budget" "$@" 2>&1 | tee "$logs/$name.log"
  status=${PIPESTATUS[0]}
  case $status in
    0) outcome=done ;;
    124|137) outcome="stopped at its budget" ;;
    *) outcome=failed ;;
  esac
  grep -q '^| part |' "$out/check.md" || printf '\n| part | budget s | took s | exit | outcome |\n|---|---|---|---|---|\n' \
    >> "$out/check.md"
  echo "| $name | $budget | $(( SECONDS - began )) | $status | $outcome |" >> "$out/check.md"
  tar -rf "$out/logs.tar" -C "$logs" "$name.log"
  echo "== $name: $outcome (exit $status) in $(( SECONDS - began )) s"
}

install() {  # the carried wheels and the checkout into $site (a dry run uses the checkout's own environment)
  local status=0
  if [[ $dry_run == 1 ]]; then echo "dry run: no install"; else
    local pip=(-m pip install --quiet --no-index --no-deps --no-cache-dir --upgrade --target "$site")
    if compgen -G "$repo/.whl/*.whl" >/dev/null; then
      "$python" "${pip[@]}" --no-compile "$repo"/.whl/*.whl || status=1
    else
      echo "no wheels in $repo/.whl: run tests/gpu/fetch_wheels.sh where PyPI is reachable and carry .whl" >&2
    fi
    if ! "$python" "${pip[@]}" --no-build-isolation "$repo"; then  # an old or absent setuptools, say
      status=1
      touch "$logs/use-the-checkout"
      echo "- the checkout could not be installed: gae_xp imported from $repo itself" >> "$out/check.md"
      export PYTHONPATH=$PYTHONPATH:$repo
    fi
  fi
  "$python" "$here/report_check.py" environment >> "$out/check.md" || status=1
  return $status
}

run_tests() {  # each file of FILES under min(its cap, what is left of the part's budget); JUnit merged as they end
  local budget=$1 left entry pattern cap file files code status=0 ran=() xml=() stopped=()
  local began=$SECONDS
  read -ra files <<< "$FILES_LIST"
  local flags=(-o addopts= -m gpu -q -rs -p no:cacheprovider --durations=10)
  [[ $dry_run == 1 ]] && flags+=(--collect-only)
  for entry in "${files[@]}"; do
    pattern=${entry%%=*} cap=${entry#*=}
    for file in "$here"/$pattern; do
      [[ $pattern == *'*'* && " $FILES_LIST " == *" $(basename "$file")="* ]] && continue
      [[ -f $file && " ${ran[*]} " != *" $file "* ]] || continue
      ran+=("$file")
      left=$(( budget - GRACE - 5 - (SECONDS - began) ))  # 5: pytest's time to write its report after SIGINT
      xml+=("$logs/$(basename "$file" .py).xml")  # none written for a file not run: listed as not finished
      if (( left > 2 * GRACE )); then
        echo "== $(basename "$file") (at most $(( cap < left ? cap : left )) s)"
        # SIGINT at the cap: pytest stops as on Ctrl-C and still writes the JUnit of the tests it ran.
        # -o addopts=: the project's own (--dist loadfile) need pytest-xdist, which that machine may lack.
        timeout -s INT -k 5 $(( cap < left ? cap : left )) "$python" -m pytest "$file" --rootdir "$repo" \
          -c "$repo/pyproject.toml" "${flags[@]}" --junitxml "${xml[-1]}"
        code=$?
        echo "== $(basename "$file"): exit $code"
        (( code == 124 || code == 137 )) && stopped+=("$(basename "$file" .py)")
        (( code == 0 || code == 5 )) || status=$code  # 5: every test deselected (no -m gpu test in the file)
      else
        echo "== $(basename "$file"): not run, the part's budget is spent"
        status=124
      fi
      "$python" "$here/report_check.py" junit "$out/gpu-tests.xml" "${xml[@]}" --stopped "${stopped[*]}"
    done
  done
  return $status
}

sanitize() {  # memcheck and racecheck on tests/gpu/sanitize_calls.py, half of the part's budget each
  local budget=$1 tool sanitizer=${COMPUTE_SANITIZER:-} candidate
  local flags=()
  [[ $dry_run == 1 ]] && flags+=(--dry-run)
  if [[ -z $sanitizer ]]; then  # PATH, the CUDA toolkit's folders, then the nvidia wheels (cuda-sanitizer-api)
    local wheels
    wheels=$("$python" -c 'import nvidia; print(*nvidia.__path__)' 2>/dev/null)
    for candidate in "$(command -v compute-sanitizer)" /usr/local/cuda*/bin/compute-sanitizer \
        /usr/local/cuda*/compute-sanitizer/compute-sanitizer /opt/nvidia/*/compute-sanitizer/compute-sanitizer \
        $( [[ -n $wheels ]] && find $wheels -maxdepth 4 -name compute-sanitizer -type f 2>/dev/null); do
      [[ -x $candidate ]] && sanitizer=$candidate && break
    done
  fi
  if [[ -z $sanitizer || ! -x $sanitizer ]]; then
    echo "compute-sanitizer: not found (PATH, /usr/local/cuda*/bin, the nvidia wheels): memcheck and racecheck" \
      "did not run" | tee "$out/sanitizer.txt"
    return 1
  fi
  echo "compute-sanitizer: $sanitizer" > "$out/sanitizer.txt"
  local status=0 routes=triton,numba-cuda
  for tool in memcheck racecheck; do  # the routes in turn first, so that a tool stopped at its budget saw both
    echo "== $tool" | tee -a "$out/sanitizer.txt"
    timeout -k "$GRACE" $(( budget / 2 - GRACE )) "$sanitizer" --tool "$tool" --error-exitcode 3 "$python" \
      "$here/sanitize_calls.py" --routes "$routes" "${flags[@]}" 2>&1 | tee -a "$out/sanitizer.txt"
    local code=${PIPESTATUS[0]}
    routes=numba-cuda,triton
    echo "== $tool: exit $code" | tee -a "$out/sanitizer.txt"
    (( code == 0 )) || status=$code
  done
  return $status
}

profile() {
  local flags=()
  [[ $dry_run == 1 ]] && flags+=(--dry-run)
  "$python" "$here/profile_host.py" --out "$out/host-profile.txt" "${flags[@]}"
}

bench() {  # no new shape after the budget less 40 s: the largest shape's rows take about that
  local flags=(--budget $(( $1 > 80 ? $1 - 40 : $1 / 2 )) --out "$out")
  [[ $dry_run == 1 ]] && flags+=(--dry-run)
  "$python" "$here/bench_gpu.py" "${flags[@]}"
}

verdicts() {
  "$python" "$here/report_check.py" verdicts "$out"
}

FILES_LIST="${GAE_XP_CHECK_FILES:-${FILES[*]}}"
export repo here site out python dry_run logs FILES_LIST GRACE
export -f install run_tests sanitize profile bench verdicts
[[ $dry_run == 1 ]] || export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
cd /tmp || exit 1
part install bash -c install
# the checkout imports itself from its root (gae_xp/backends is a link to backends/) where it could not be installed
[[ -f $logs/use-the-checkout ]] && export PYTHONPATH=$PYTHONPATH:$repo
# the tests read the profile named by GAE_XP_HYPOTHESIS_PROFILE: gpu draws 3 examples per property
part tests bash -c "run_tests $(budget_of tests)"
part sanitizer bash -c "sanitize $(budget_of sanitizer)"
part profile bash -c profile
part bench bash -c "bench $(budget_of bench)"
part verdicts bash -c verdicts
echo "- total: $(( SECONDS - started )) s" >> "$out/check.md"
rm -rf "$logs"
echo "== check.sh took $(( SECONDS - started )) s; results in $out: $(ls "$out" | tr '\n' ' ')"
