"""tests/gpu/check.sh fits one GPU run of at most 8 minutes: its structure, budgets and outputs, checked on the CPU.

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
from helpers import GPU_DIR, load_gpu_module

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
echo "========= ERROR SUMMARY: ${STUB_SANITIZER_ERRORS:-0} errors"
(( ${STUB_SANITIZER_ERRORS:-0} == 0 )) || exit 3
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
    grace = int(re.search(r"^GRACE=(\d+)$", CHECK.read_text(), re.M).group(1))
    assert list(budgets) == PARTS
    assert sum(budgets.values()) + grace * len(budgets) <= LIMIT_S  # each part killed at most GRACE s after
    # the parts run in that order, each once, each through part() (its budget, its log, its line in check.md)
    calls = re.findall(r"^part (\w+) ", CHECK.read_text(), re.M)
    assert calls == PARTS


def test_the_gpu_test_files_run_in_an_order_that_reaches_every_file():
    text = CHECK.read_text()
    line = text[text.index("\nFILES=(") + 1:].split(")", 1)[0]  # the array may continue on a second line
    files = re.findall(r"'?([\w*.]+)=(\d+)'?", line)
    names = [name for name, _ in files]
    assert names[0] == "test_routes.py"  # both routes, every structure, first
    assert names[1:3] == ["test_triton_cuda.py", "test_triton_op_cuda.py"]  # never reached on a GPU yet
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


@pytest.mark.slow  # the full matrix: it runs check.sh's parts on the CPU (10-20 s)
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
    assert [m.group(1) for m in re.finditer(r'testsuite name="(\w+)"', (out / "gpu-tests.xml").read_text())][:3] == \
        ["test_routes", "test_triton_cuda", "test_triton_op_cuda"]
    sanitizer = (out / "sanitizer.txt").read_text()
    assert "== memcheck: exit 0" in sanitizer and "== racecheck: exit 0" in sanitizer
    assert sanitizer.count("0 failed call(s)") == 2 and "FAILED" not in sanitizer
    memcheck, racecheck = sanitizer.split("== racecheck\n")
    assert memcheck.split("== memcheck\n")[1].startswith("ok triton ") and racecheck.startswith("ok numba-cuda ")
    profile = (out / "host-profile.txt").read_text()
    assert len(re.findall(r"^== (triton|triton-direct|numba-cuda|cupy-auto) at ", profile, re.M)) == 4
    assert "== triton-direct at 4x16 (dry run: the generic path on NumPy): 20 calls" in profile
    assert profile.count("-- top 15 by tottime") == profile.count("-- top 15 by cumtime") == 4
    bench = json.loads((out / "bench_gpu.json").read_text())
    assert bench["dry_run"] and bench["rows"] and bench["new_t"]
    measured = {row["path"] for row in bench["rows"] if not row["failed"]}
    assert {"copy", "gae_xp triton (torch)", "gae_xp numba-cuda (torch)"} <= measured
    verdicts = (out / "verdicts.md").read_text().splitlines()
    judged = [line for line in verdicts if re.search(r": (MET|NOT MET|NOT MEASURED) \(", line)]
    assert len(judged) == 12 and verdicts[2].startswith("- DRY RUN")
    assert check.rstrip().splitlines()[-1].startswith("- total: ")


def test_a_failing_part_does_not_stop_the_rest(tmp_path):
    done = subprocess.run(["bash", str(CHECK)], env=environment(tmp_path, stub_python=True, STUB_FAIL="profile bench",
                                                               STUB_TESTS_EXIT="1", STUB_SANITIZER_ERRORS="2"),
                          capture_output=True, text=True, timeout=120)
    out = tmp_path / "out"
    rows = part_rows(out)
    assert list(rows) == PARTS
    assert rows["tests"][1:] == (1, "failed") and rows["profile"][1:] == (3, "failed")
    assert rows["sanitizer"][1:] == (3, "failed")  # both tools ran, each reporting errors
    sanitizer = (out / "sanitizer.txt").read_text()
    assert "== memcheck: exit 3" in sanitizer and "== racecheck: exit 3" in sanitizer
    assert rows["bench"][1:] == (1, "failed") and rows["verdicts"][1:] == (0, "done")
    assert logs(out) == [f"{name}.log" for name in PARTS]
    # no JUnit from the stub pytest: every file is listed as not finished, so correctness is not measured
    assert "NOT MEASURED" in next(line for line in (out / "verdicts.md").read_text().splitlines()
                                  if "No loss of correctness" in line)
    assert done.returncode == 0  # the script's own status: it ran to its end


@pytest.mark.slow  # the full matrix: it runs check.sh's parts on the CPU (10-20 s)
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
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, process_group=0)
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


# ------------------------------------------------------------------------------------------------ report_check

@pytest.fixture(scope="module")
def report():
    return load_gpu_module("report_check")


def bench_rows(report, *, triton_ratio: float, numba_ratio: float, skip=()) -> dict:
    """A benchmark's JSON as bench_gpu.py writes it: every shape, dtype and case, the copy at 10 us."""
    rows = []
    for shape in report.ALL_SHAPES:
        for dtype in report.DTYPES:
            for case in report.CASES:
                if (shape, dtype, case) in skip:
                    continue
                for path, ratio in ((report.TRITON, triton_ratio), (report.NUMBA, numba_ratio)):
                    rows.append({"shape": list(shape), "dtype": dtype, "case": case, "path": path, "failed": "",
                                 "device_ms": 0.01 * ratio, "copy_ratio": ratio, "wall_ms": 0.05, "host_us": 25.0,
                                 "error": 1e-7, "variant": ""})
                for path in ("gae_xp auto (CuPy)", f"{report.TRITON}, CUDA-graph replay"):
                    rows.append({"shape": list(shape), "dtype": dtype, "case": case, "path": path, "failed": "",
                                 "device_ms": 0.012, "copy_ratio": 1.2, "wall_ms": 0.025, "host_us": 35.0,
                                 "error": 1e-7, "variant": ""})
                if dtype == "float32" and case in ("constant", "terminated"):
                    for path in ("rl-triton 0.1.3", "triton_gae.py, program per row"):
                        rows.append({"shape": list(shape), "dtype": dtype, "case": case, "path": path,
                                     "failed": "", "device_ms": 0.02, "copy_ratio": 2.0, "wall_ms": 0.08,
                                     "host_us": 30.0, "error": 1e-7, "variant": ""})
    new_t = [{"path": path, "shape": [1000, t], "case": case, "first_ms": 0.3, "repeat_ms": 0.1}
             for path in (report.TRITON, report.NUMBA) for t in (77, 1000) for case in report.CASES]
    new_t += [{"path": f"{report.TRITON}, after warm_up", "shape": [700, t], "case": case, "first_ms": 0.4,
               "repeat_ms": 0.1, "warm_up_s": 9.5} for t in (77, 1000, 5001) for case in report.CASES]
    return {"rows": rows, "new_t": new_t, "dry_run": False}


TESTS_PASSED = {"tests": 200, "failures": 0, "errors": 0, "skipped": 3, "incomplete": []}


def verdict(lines: list[str], start: str) -> str:
    return next(line for line in lines if line.startswith(f"- {start}"))


def test_every_target_met(report):
    lines = report.verdicts(bench_rows(report, triton_ratio=1.1, numba_ratio=1.9), TESTS_PASSED)
    assert len(lines) == 12 and all(": MET (" in line for line in lines), lines
    assert "worst 1.1 x copy at 38400x128 float32 constant; 42 of 42 measured" in lines[0]


def test_a_target_missed_is_not_met_with_its_worst_figure(report):
    bench = bench_rows(report, triton_ratio=1.1, numba_ratio=1.9)
    slow = next(row for row in bench["rows"] if row["path"] == report.TRITON and row["shape"] == [16, 524288]
                and row["dtype"] == "bfloat16" and row["case"] == "dones+mask")
    slow["copy_ratio"], slow["device_ms"] = 1.7, 0.017
    bench["new_t"][0]["first_ms"] = 450.0  # a compile
    bench["rows"].append({**bench["rows"][0], "path": report.TRITON, "error": 3e-4})  # over float32's tolerance
    lines = report.verdicts(bench, TESTS_PASSED)
    assert verdict(lines, "Triton route, device time over the copy at 16x524288") == (
        "- Triton route, device time over the copy at 16x524288: NOT MET (worst 1.7 x copy at 16x524288 bfloat16 "
        "dones+mask; 6 of 6 measured; 1 over 1.6 x copy)")
    assert ": NOT MET (worst 450 ms at gae_xp triton (torch) 1000x77 constant" in verdict(lines, "A first call")
    assert verdict(lines, "The same after gae_xp.warm_up").endswith(
        ": MET (worst 0.4 ms at 700x77 constant (warm_up 9.5 s); 9 of 9 measured)")
    assert "NOT MET" in verdict(lines, "No loss of correctness") and "worst 3.0e-04" in verdict(
        lines, "No loss of correctness")
    assert ": MET (" in verdict(lines, "Triton route, device time over the copy at the 7 shapes")


def test_a_target_partly_measured_is_not_measured(report):
    bench = bench_rows(report, triton_ratio=1.1, numba_ratio=1.9, skip={((2048, 4096), "bfloat16", "terminated")})
    lines = report.verdicts(bench, {**TESTS_PASSED, "incomplete": ["test_cuda"]})
    assert verdict(lines, "Triton route, device time over the copy at the 7").endswith(
        ": NOT MEASURED (worst 1.1 x copy at 38400x128 float32 constant; 41 of 42 measured, all within 1.25 x copy)")
    assert "NOT MEASURED" in verdict(lines, "numba-CUDA route")
    assert "NOT MEASURED (200 tests, 0 failed, 0 errors, 3 skipped, not finished: test_cuda" in verdict(
        lines, "No loss of correctness")
    nothing = report.verdicts(None, None)
    assert len(nothing) == 12 and all("NOT MEASURED" in line for line in nothing)


def test_rl_triton_absent_compares_with_its_recorded_figures(report):
    bench = bench_rows(report, triton_ratio=1.1, numba_ratio=1.9)
    bench["rows"] = [row for row in bench["rows"] if row["path"] != "rl-triton 0.1.3"]
    line = verdict(report.verdicts(bench, TESTS_PASSED), "Triton route faster than rl-triton")
    # 11 us against the recorded 4.7 us at 4096x32: slower there; two of the eight shapes were never recorded
    assert "NOT MET (worst 2.34 x rl-triton at 4096x32 float32 constant (rl-triton's figure recorded" in line
    assert f"{len(report.RL_TRITON_RECORDED_US)} of 16 measured" in line


def test_junit_parts_merge_and_a_missing_one_is_incomplete(report, tmp_path):
    part = tmp_path / "test_sync_and_graphs.xml"
    part.write_text('<testsuites><testsuite name="pytest" tests="5" failures="1" errors="0" skipped="2">'
                    '<testcase name="a"/></testsuite></testsuites>')
    totals = report.merge_junit(tmp_path / "gpu-tests.xml", [part, tmp_path / "test_cuda.xml"])
    assert totals == {"tests": 5, "failures": 1, "errors": 0, "skipped": 2, "incomplete": ["test_cuda"]}
    assert report.junit_totals(tmp_path / "absent.xml") is None


@pytest.mark.slow  # the full matrix: it runs check.sh's parts on the CPU (10-20 s)
def test_the_docs_section_says_nothing_is_measured_until_a_run_fills_it(report, dry_run, tmp_path):
    empty = report.section(None)
    assert "no figure in this section is measured" in empty and "|" in empty
    assert empty.startswith(report.BEGIN) and empty.endswith(report.END)
    document = tmp_path / "gpu.md"
    document.write_text("# GPU\n\ntext\n\n" + empty + "\n\n## After\n")
    _, out = dry_run
    report.write_section(document, report.section(out))
    text = document.read_text()
    assert text.count(report.BEGIN) == 1 and text.startswith("# GPU\n\ntext\n") and text.rstrip().endswith("## After")
    assert "### The last run" in text and "DRY RUN" in text and "| bench | 160 |" in text
    assert "- Triton route, device time over the copy at 16x524288: NOT MEASURED" in text
    assert "ERROR SUMMARY: 0 errors" in text and "numpy " in text


def test_the_readme_holds_the_summary_of_the_run_it_names(report):
    """README.md's GPU table is ``report_check.py summary`` of the run its marker names, as the script prints it."""
    readme = (Path(__file__).parent.parent / "README.md").read_text()
    marker = re.search(r"<!-- gpu:summary \(python tests/gpu/report_check.py summary (\S+)\) -->\n(.*?)\n"
                       r"<!-- gpu:summary end -->", readme, re.S)
    assert marker, "README.md has no gpu:summary markers"
    assert marker.group(2) == report.summary(Path(__file__).parent.parent / marker.group(1))


def test_docs_gpu_md_holds_the_section_as_the_script_writes_it(report):
    """docs/gpu.md's section is the script's, written from the newest run kept in docs/gpu_runs (its raw files)."""
    docs = Path(__file__).parent.parent / "docs"
    runs = sorted(path for path in (docs / "gpu_runs").iterdir() if (path / "check.md").is_file())
    assert report.section(runs[-1] if runs else None) in (docs / "gpu.md").read_text()


# ------------------------------------------------------------------------------------ the sanitizer's calls (sim)

@pytest.mark.cudasim
@pytest.mark.skipif(os.environ.get("NUMBA_ENABLE_CUDASIM") != "1", reason="needs NUMBA_ENABLE_CUDASIM=1 (own process)")
def test_the_sanitizers_calls_run_on_the_numba_cuda_route_and_match_float64():
    """Every call ``sanitize_calls.py`` hands compute-sanitizer is one the numba-CUDA route takes, with the answer
    of the generic path in float64 (the simulator, NumPy arrays, a tiny shape)."""

    import numpy as np

    import gae_xp

    calls = load_gpu_module("sanitize_calls")
    library = calls.Library(dry_run=True)  # NumPy arrays: the simulator's
    given = library.convert(calls.inputs(np.random.default_rng(5), (2, 20)), "float32")
    widened = library.widen(given)
    references = calls.calls(gae_xp, "xp")
    for name, call in calls.calls(gae_xp, "numba-cuda").items():
        got, want = call(given), references[name](widened)
        assert len(got) == len(want)
        for x, y in zip(got, want):
            assert calls.relative_error(x, y) <= calls.TOLERANCE["float32"], name


def test_gpu_test_files_past_the_parts_budget_are_listed_as_not_finished(tmp_path):
    subprocess.run(["bash", str(CHECK)], env=environment(tmp_path, stub_python=True, STUB_FAIL="profile bench",
                                                         GAE_XP_BUDGET_TESTS="8"),
                   capture_output=True, text=True, timeout=120)
    out = tmp_path / "out"
    assert part_rows(out)["tests"] == (8, 124, "stopped at its budget")
    suites = re.findall(r'<testsuite name="(\w+)" tests="0" incomplete="1"', (out / "gpu-tests.xml").read_text())
    assert suites[:3] == ["test_routes", "test_triton_cuda", "test_triton_op_cuda"]
    assert suites[-1] == "test_cuda"
    with tarfile.open(out / "logs.tar") as archive:
        log = archive.extractfile("tests.log").read().decode()
    assert log.count("not run, the part's budget is spent") == len(suites)


def test_the_sanitizers_torch_calls_run_on_torch_cpu_tensors():
    """sanitize_calls.py's torch code (conversions to every dtype, the float64 reference on the host, the backward
    pass) on torch CPU tensors with the generic path standing in for a GPU route: every call within tolerance."""

    import gae_xp

    pytest.importorskip("torch")
    calls = load_gpu_module("sanitize_calls")
    lines = list(calls.run_route(gae_xp, calls.Library(dry_run=False, device="cpu"), "xp", "xp"))
    assert not [line for line in lines if not line.startswith(("ok ", "backward "))], lines
    expected = sum(len(calls.calls(gae_xp, "xp")) if dtype == "float32" else len(calls.OTHER_DTYPE_CALLS)
                   for dtypes in calls.DTYPES.values() for dtype in dtypes)
    assert sum(line.startswith("ok ") for line in lines) == expected
    assert sum(line.startswith("backward (terminated, mask): max rel. error") for line in lines) == 2
    assert {line.split()[3] for line in lines if line.startswith("ok ")} == {"float32", "float64", "float16",
                                                                              "bfloat16"}
