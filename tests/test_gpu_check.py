"""tests/gpu/check.sh fits one GPU loan: its structure, budgets and outputs, checked on the CPU.

The check runs with ``GAE_XP_CHECK_DRY_RUN=1`` (every part on the CPU with
tiny stand-in work: the GPU test files collected, the sanitizer's calls, the
host profile and the benchmark on the generic path), ``nvidia-smi`` and
``compute-sanitizer`` replaced by stubs; where a part must fail, overrun its
budget or be killed, ``PYTHON`` is a stub that does so for that part's script
and hands everything else to this Python. Also: the verdicts and the docs
section of ``tests/gpu/report_check.py`` on made-up benchmark rows.
"""

from __future__ import annotations

import fnmatch
import json
import os
import re
import signal
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest

GPU_DIR = Path(__file__).parent / "gpu"
CHECK = GPU_DIR / "check.sh"
PARTS = ["install", "tests", "sanitizer", "profile", "bench", "verdicts"]
OUTPUTS = {"check.md", "gpu-tests.xml", "sanitizer.txt", "host-profile.txt", "bench_gpu.json", "bench_gpu.md",
           "verdicts.md", "logs.tar"}
#: Seconds a check may take on the GPU machine, install included.
LIMIT_S = 8 * 60

STUB_PYTHON = """#!/usr/bin/env bash
# A Python that fails, stalls or fakes the part named in STUB_* and runs everything else with the real one.
case " $* " in
  *" -m pytest "*) echo "stub pytest"; exit "${STUB_TESTS_EXIT:-0}" ;;
  *profile_host.py*) [[ ${STUB_FAIL:-} == *profile* ]] && { echo "stub: profile fails" >&2; exit 3; } ;;
  *bench_gpu.py*) [[ ${STUB_FAIL:-} == *bench* ]] && { echo "stub: bench fails" >&2; exit 1; }
                  [[ ${STUB_STALL:-} == bench ]] && { echo $$ > "$STUB_PID"; exec sleep 60; } ;;
esac
exec "%s" "$@"
"""
STUB_SANITIZER = """#!/usr/bin/env bash
# compute-sanitizer's options (--tool X --error-exitcode N) dropped, its program run, its summary printed
while [[ $1 == --* ]]; do shift 2; done
"$@"; status=$?
echo "========= ERROR SUMMARY: 0 errors"
exit $status
"""
STUB_SMI = """#!/usr/bin/env bash
echo "Stub GPU, 1024 MiB, 0.0"
"""


def stubs(folder: Path) -> dict:
    """The stub programs, written executable into ``folder``."""
    paths = {}
    for name, text in (("python", STUB_PYTHON % sys.executable), ("compute-sanitizer", STUB_SANITIZER),
                       ("nvidia-smi", STUB_SMI)):
        path = folder / name
        path.write_text(text)
        path.chmod(0o755)
        paths[name] = path
    return paths


def environment(tmp: Path, *, stub_python: bool, **extra) -> dict:
    programs = stubs(tmp)
    return {**os.environ, "GAE_XP_CHECK_DRY_RUN": "1", "OUT": str(tmp / "out"), "STUB_PID": str(tmp / "stall.pid"),
            "PYTHON": str(programs["python"] if stub_python else sys.executable),
            "COMPUTE_SANITIZER": str(programs["compute-sanitizer"]), "NVIDIA_SMI": str(programs["nvidia-smi"]),
            **extra}


def part_rows(out: Path) -> dict:
    """part -> (budget, exit, outcome) from check.md's table, in the order the parts ended."""
    rows = {}
    for line in (out / "check.md").read_text().splitlines():
        cells = [cell.strip() for cell in line.strip("|").split("|")]
        if line.startswith("| ") and cells[0] in PARTS:
            rows[cells[0]] = (int(cells[1]), int(cells[3]), cells[4])
    return rows


def logs(out: Path) -> list[str]:
    with tarfile.open(out / "logs.tar") as archive:
        return archive.getnames()


def declared_budgets() -> dict:
    line = next(line for line in CHECK.read_text().splitlines() if line.startswith("BUDGETS=("))
    return {name: int(seconds) for name, seconds in re.findall(r"(\w+)=(\d+)", line)}


# ------------------------------------------------------------------------------------------------ the structure

def test_the_declared_budgets_add_up_to_at_most_eight_minutes():
    budgets = declared_budgets()
    assert list(budgets) == PARTS
    assert sum(budgets.values()) <= LIMIT_S
    # the parts run in that order, each once, each through part() (its budget, its log, its line in check.md)
    calls = re.findall(r"^part (\w+) ", CHECK.read_text(), re.M)
    assert calls == PARTS


def test_the_gpu_test_files_run_in_an_order_that_reaches_every_file():
    line = next(line for line in CHECK.read_text().splitlines() if line.startswith("FILES=("))
    files = re.findall(r"'?([\w*.]+)=(\d+)'?", line)
    names = [name for name, _ in files]
    assert names[:2] == ["test_sync_and_graphs.py", "test_devices_and_streams.py"]  # never reached on the H200
    assert names[-1] == "test_cuda.py"  # the longest last: the others run whatever it leaves
    assert all(any(fnmatch.fnmatch(path.name, name) for name in names) for path in GPU_DIR.glob("*.py")
               if path.name.startswith("test_"))
    assert sum(int(cap) for _, cap in files) >= declared_budgets()["tests"]  # the caps leave no budget unused


@pytest.fixture(scope="module")
def dry_run(tmp_path_factory):
    """One whole dry run with the stub sanitizer and nvidia-smi: (completed process, $OUT)."""
    tmp = tmp_path_factory.mktemp("check")
    done = subprocess.run(["bash", str(CHECK)], env=environment(tmp, stub_python=False), capture_output=True,
                          text=True, timeout=240)
    return done, tmp / "out"


def test_a_dry_run_writes_the_eight_files_part_by_part(dry_run):
    done, out = dry_run
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert {path.name for path in out.iterdir()} == OUTPUTS
    rows = part_rows(out)
    assert list(rows) == PARTS
    assert all(exit_status == 0 and outcome == "done" for _, exit_status, outcome in rows.values()), rows
    assert {name: budget for name, (budget, _, _) in rows.items()} == declared_budgets()
    assert logs(out) == [f"{name}.log" for name in PARTS]
    check = (out / "check.md").read_text()
    assert "DRY RUN" in check and "Stub GPU" in check and "numpy " in check
    # the parts' own outputs
    assert [m.group(1) for m in re.finditer(r'testsuite name="(\w+)"', (out / "gpu-tests.xml").read_text())][:2] == \
        ["test_sync_and_graphs", "test_devices_and_streams"]
    sanitizer = (out / "sanitizer.txt").read_text()
    assert "== memcheck: exit 0" in sanitizer and "== racecheck: exit 0" in sanitizer
    assert sanitizer.count("0 failed call(s)") == 2 and "FAILED" not in sanitizer
    profile = (out / "host-profile.txt").read_text()
    assert len(re.findall(r"^== (triton|numba-cuda) at ", profile, re.M)) == 2
    assert profile.count("-- top 15 by tottime") == profile.count("-- top 15 by cumtime") == 2
    bench = json.loads((out / "bench_gpu.json").read_text())
    assert bench["dry_run"] and bench["rows"] and bench["new_t"]
    measured = {row["path"] for row in bench["rows"] if not row["failed"]}
    assert {"copy", "gae_xp triton (torch)", "gae_xp numba-cuda (torch)"} <= measured
    verdicts = (out / "verdicts.md").read_text().splitlines()
    judged = [line for line in verdicts if re.search(r": (MET|NOT MET|NOT MEASURED) \(", line)]
    assert len(judged) == 11 and verdicts[2].startswith("- DRY RUN")
    assert check.rstrip().splitlines()[-1].startswith("- total: ")


def test_a_failing_part_does_not_stop_the_rest(tmp_path):
    done = subprocess.run(["bash", str(CHECK)], env=environment(tmp_path, stub_python=True, STUB_FAIL="profile bench",
                                                               STUB_TESTS_EXIT="1"),
                          capture_output=True, text=True, timeout=120)
    out = tmp_path / "out"
    rows = part_rows(out)
    assert list(rows) == PARTS
    assert rows["tests"][1:] == (1, "failed") and rows["profile"][1:] == (3, "failed")
    assert rows["bench"][1:] == (1, "failed") and rows["verdicts"][1:] == (0, "done")
    assert logs(out) == [f"{name}.log" for name in PARTS]
    # no JUnit from the stub pytest: every file is listed as not finished, so correctness is not measured
    assert "NOT MEASURED" in next(line for line in (out / "verdicts.md").read_text().splitlines()
                                  if "No loss of correctness" in line)
    assert done.returncode == 0  # the script's own status: it ran to its end


def test_a_part_over_its_budget_is_stopped_and_the_next_runs(tmp_path):
    subprocess.run(["bash", str(CHECK)], env=environment(tmp_path, stub_python=True, STUB_STALL="bench",
                                                         GAE_XP_BUDGET_BENCH="3"),
                   capture_output=True, text=True, timeout=120)
    rows = part_rows(tmp_path / "out")
    assert rows["bench"] == (3, 124, "stopped at its budget")
    assert rows["verdicts"][2] == "done"
    assert "no bench_gpu.json" in (tmp_path / "out" / "verdicts.md").read_text()


def test_a_killed_run_keeps_the_files_of_the_parts_before(tmp_path):
    out = tmp_path / "out"
    check = subprocess.Popen(["bash", str(CHECK)], env=environment(tmp_path, stub_python=True, STUB_STALL="bench"),
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + 90
        while not (tmp_path / "stall.pid").exists():  # the benchmark has started: the parts before it are done
            assert time.monotonic() < deadline and check.poll() is None
            time.sleep(0.2)
    finally:
        os.killpg(check.pid, signal.SIGKILL)  # the GPU machine taken back mid-benchmark
        check.wait()
        stall = tmp_path / "stall.pid"
        if stall.exists():
            os.kill(int(stall.read_text()), signal.SIGKILL)  # the stub's sleep, in timeout's own process group
    assert {path.name for path in out.iterdir()} == {"check.md", "gpu-tests.xml", "sanitizer.txt",
                                                     "host-profile.txt", "logs.tar"}
    assert list(part_rows(out)) == PARTS[:4]
    assert logs(out) == [f"{name}.log" for name in PARTS[:4]]
    assert "-- top 15 by cumtime" in (out / "host-profile.txt").read_text()
