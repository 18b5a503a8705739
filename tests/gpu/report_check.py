"""The GPU check's reports: the environment, the merged JUnit XML, the verdicts, and docs/gpu.md's section.

``python tests/gpu/report_check.py COMMAND``:

* ``environment``: Markdown lines for check.md (Python, CPU, the packages'
  versions from their metadata, nothing imported but gae_xp, whose
  ``show_config()`` is printed where it exists);
* ``junit OUT.xml PART.xml...``: the per-file JUnit reports of the GPU tests
  merged into one (a file stopped at its budget writes none: it is listed as
  incomplete);
* ``verdicts OUT``: one line per target of "The GPU at the copy floor" from
  ``OUT/bench_gpu.json`` and ``OUT/gpu-tests.xml``, MET, NOT MET or NOT
  MEASURED with its figure, written to ``OUT/verdicts.md``;
* ``docs OUT [--write docs/gpu.md]``: the section "The GPU check" built from a
  run's files (date, machine, packages, verdicts, tables), printed or written
  between docs/gpu.md's markers;
* ``summary OUT``: the README's table of a run (both routes, the baseline and
  the copy at four shapes; the host time per eager call), from its
  ``bench_gpu.json``, ``host-profile.txt`` and ``check.md``.

Standard library only: it runs where the check's other parts failed.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import platform
import re
import sys
import xml.etree.ElementTree as ElementTree
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

#: Distributions whose versions check.md records (the first installed name of each tuple).
PACKAGES = [("numpy",), ("numba",), ("numba-cuda",), ("numba-cuda-mlir",), ("torch",), ("triton",),
            ("cupy-cuda13x", "cupy-cuda12x", "cupy"), ("cuda-bindings",), ("cuda-core",), ("cuda-cccl",),
            ("rl-triton",), ("array-api-compat",), ("pytest",), ("hypothesis",), ("gae-xp", "gae_xp")]
TRITON, NUMBA = "gae_xp triton (torch)", "gae_xp numba-cuda (torch)"
#: The shapes where the Triton route must be within 1.25x of the copy, and the few long rows (1.6x).
COPY_SHAPES = [(38400, 128), (4096, 32), (32768, 128), (8192, 1024), (8192, 4096), (2048, 4096), (256, 131072)]
FEW_LONG_ROWS = (16, 524288)
ALL_SHAPES = COPY_SHAPES + [FEW_LONG_ROWS]
TRAINER = (38400, 128)
CASES = ("constant", "terminated", "dones+mask")
DTYPES = ("float32", "bfloat16")
#: rl-triton 0.1.3's device time (us, float32, constant case) measured on an H200 on 2026-12-04, beside gae_xp
#: (../shared/gpu/README.md of that run): the comparison where rl-triton is not installed on the machine.
RL_TRITON_RECORDED_US = {(38400, 128): 26.9, (4096, 32): 4.7, (8192, 1024): 39.0, (8192, 4096): 180.0,
                         (256, 131072): 4489.5, (16, 524288): 1064.8}
#: Largest max |A - A64| / max(1, max |A64|) a gae_xp route may show, per dtype of its inputs.
TOLERANCE = {"float32": 1e-5, "bfloat16": 1e-2}
#: A first call that compiles takes hundreds of milliseconds; one that compiles nothing, a few.
NEW_T_LIMIT_MS = 20.0
BEGIN, END = "<!-- gpu-check:begin -->", "<!-- gpu-check:end -->"


# -------------------------------------------------------------------------------------------------- environment

def environment() -> str:
    lines = [f"- Python {platform.python_version()} on {platform.machine()}, CPU: {cpu_model()}"]
    versions = []
    for names in PACKAGES:
        for name in names:
            try:
                versions.append(f"{name} {metadata.version(name)}")
                break
            except metadata.PackageNotFoundError:
                continue
        else:
            versions.append(f"{names[0]} absent")
    lines.append(f"- packages: {', '.join(versions)}")
    try:
        import gae_xp

        lines.append(f"- gae_xp from {Path(gae_xp.__file__).parent}")
        show = getattr(gae_xp, "show_config", None)
        if callable(show):
            printed = io.StringIO()
            with contextlib.redirect_stdout(printed):
                returned = show()
            text = printed.getvalue() or (returned if isinstance(returned, str) else "")
            lines.append("- gae_xp.show_config():")
            lines += [f"  {line}" for line in text.strip().splitlines()[:40]]
    except Exception as error:  # gae_xp failing to import is itself the finding
        lines.append(f"- gae_xp: not importable ({type(error).__name__}: {str(error).splitlines()[0][:160]})")
    return "\n".join(lines)


def cpu_model() -> str:
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.partition(":")[2].strip()
    return platform.processor() or "unknown"


# -------------------------------------------------------------------------------------------------------- junit

def merge_junit(target: Path, parts: list[Path], stopped=()) -> dict:
    """The parts' test suites under one ``testsuites`` (written atomically); the totals. A part without a report
    (not run, or killed) and the parts named in ``stopped`` (interrupted at their cap: the tests they ran) are
    marked incomplete."""
    merged = ElementTree.Element("testsuites")
    for part in parts:
        try:
            root = ElementTree.parse(part).getroot()
        except (OSError, ElementTree.ParseError):
            merged.append(ElementTree.Element("testsuite", name=part.stem, tests="0", incomplete="1"))
            continue
        for suite in [root] if root.tag == "testsuite" else root.iter("testsuite"):
            suite.set("name", part.stem)
            if part.stem in stopped:
                suite.set("incomplete", "1")
            merged.append(suite)
    temporary = target.with_suffix(".tmp")
    ElementTree.ElementTree(merged).write(temporary, encoding="utf-8", xml_declaration=True)
    os.replace(temporary, target)
    return junit_totals(target)


def junit_totals(path: Path) -> dict | None:
    """tests, failures, errors, skipped and the incomplete files of a merged report; None without one."""
    try:
        root = ElementTree.parse(path).getroot()
    except (OSError, ElementTree.ParseError):
        return None
    totals = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0, "incomplete": []}
    for suite in root.iter("testsuite"):
        for key in ("tests", "failures", "errors", "skipped"):
            totals[key] += int(suite.get(key, 0))
        if suite.get("incomplete"):
            totals["incomplete"].append(suite.get("name"))
    return totals


# ----------------------------------------------------------------------------------------------------- verdicts

@dataclass
class Figure:
    """One measured figure a target judges: where it was taken, its value."""

    where: str
    value: float


def judge(target: str, figures: list[Figure], expected: int, limit: float, unit: str) -> str:
    """MET when all ``expected`` figures are measured and each is at most ``limit``; NOT MET when one measured is
    over it; NOT MEASURED otherwise. The figure shown is the worst measured."""
    if not figures:
        return f"- {target}: NOT MEASURED (no figure)"
    worst = max(figures, key=lambda f: f.value)
    over = [f for f in figures if f.value > limit]
    figure = f"worst {worst.value:.3g} {unit} at {worst.where}; {len(figures)} of {expected} measured"
    if over:
        return f"- {target}: NOT MET ({figure}; {len(over)} over {limit:g} {unit})"
    if len(figures) < expected:
        return f"- {target}: NOT MEASURED ({figure}, all within {limit:g} {unit})"
    return f"- {target}: MET ({figure})"


def _rows(bench: dict) -> dict:
    return {(tuple(row["shape"]), row["dtype"], row["case"], row["path"]): row for row in bench.get("rows", ())
            if not row.get("failed") and row.get("device_ms") is not None}


def _where(shape, dtype, case) -> str:
    return f"{shape[0]}x{shape[1]} {dtype} {case}"


def verdicts(bench: dict | None, tests: dict | None) -> list[str]:
    """One line per target of "The GPU at the copy floor"."""
    rows = _rows(bench or {})

    def figures(path, shapes, dtypes, cases, value):
        return [Figure(_where(s, d, c), value(rows[s, d, c, path])) for s in shapes for d in dtypes for c in cases
                if (s, d, c, path) in rows]

    def ratio(row):
        return row["copy_ratio"]

    combos = len(DTYPES) * len(CASES)
    out = [
        judge("Triton route, device time over the copy at the 7 shapes with >= 264 rows or T <= 4096",
              figures(TRITON, COPY_SHAPES, DTYPES, CASES, ratio), len(COPY_SHAPES) * combos, 1.25, "x copy"),
        judge("Triton route, device time over the copy at 16x524288",
              figures(TRITON, [FEW_LONG_ROWS], DTYPES, CASES, ratio), combos, 1.6, "x copy"),
        judge("Triton route faster than rl-triton 0.1.3 at every shape (its time over rl-triton's)",
              _against_rl_triton(rows), 2 * len(ALL_SHAPES), 1.0, "x rl-triton"),
        judge("Triton route faster than tests/gpu/triton_gae.py at every shape (its time over the baseline's)",
              _against(rows, "triton_gae.py, program per row"), 2 * len(ALL_SHAPES), 1.0, "x the baseline"),
        judge("Eager whole call at 38400x128, wall, torch (Triton route, float32)",
              figures(TRITON, [TRAINER], ["float32"], CASES, lambda r: 1e3 * r["wall_ms"]), len(CASES), 60, "us"),
        judge("Eager whole call at 38400x128, host, torch (Triton route, float32)",
              figures(TRITON, [TRAINER], ["float32"], CASES, lambda r: r["host_us"]), len(CASES), 30, "us"),
        judge("Eager whole call at 38400x128, host, CuPy (auto, float32)",
              figures("gae_xp auto (CuPy)", [TRAINER], ["float32"], CASES, lambda r: r["host_us"]), len(CASES), 40,
              "us"),
        judge("Whole call at 38400x128 under CUDA-graph replay, wall (Triton route, float32)",
              figures(f"{TRITON}, CUDA-graph replay", [TRAINER], ["float32"], CASES, lambda r: 1e3 * r["wall_ms"]),
              len(CASES), 30, "us"),
        judge("numba-CUDA route, device time over the copy at every shape",
              figures(NUMBA, ALL_SHAPES, DTYPES, CASES, ratio), len(ALL_SHAPES) * combos, 2.0, "x copy"),
        _correctness(bench, tests),
        judge("A first call at a new B and T compiles nothing (first call's wall ms, both torch routes)",
              [Figure(f"{e['path']} {e['shape'][0]}x{e['shape'][1]} {e['case']}", e["first_ms"])
               for e in (bench or {}).get("new_t", ()) if "first_ms" in e and "warm_up_s" not in e],
              2 * 2 * len(CASES), NEW_T_LIMIT_MS, "ms"),
        judge("The same after gae_xp.warm_up(device=\"cuda\") (first call's wall ms, a new process, Triton's cache "
              "empty)",
              [Figure(f"{e['shape'][0]}x{e['shape'][1]} {e['case']} (warm_up {e['warm_up_s']:.1f} s)", e["first_ms"])
               for e in (bench or {}).get("new_t", ()) if "warm_up_s" in e],
              3 * len(CASES), NEW_T_LIMIT_MS, "ms"),
    ]
    if bench and bench.get("dry_run"):
        out.insert(0, "- DRY RUN on the CPU: the figures below are stand-ins, nothing was measured on a GPU")
    return out


def _against(rows: dict, baseline: str) -> list[Figure]:
    """The Triton route's device time over ``baseline``'s, float32, where both ran."""
    return [Figure(_where(s, d, c), rows[s, d, c, TRITON]["device_ms"] / rows[s, d, c, baseline]["device_ms"])
            for (s, d, c, path) in rows if path == baseline and (s, d, c, TRITON) in rows]


def _against_rl_triton(rows: dict) -> list[Figure]:
    """Against rl-triton where it ran here, else against its recorded H200 figure (float32, constant case)."""
    measured = _against(rows, "rl-triton 0.1.3")
    if measured:
        return measured
    return [Figure(f"{_where(s, 'float32', 'constant')} (rl-triton's figure recorded on an H200 on 2026-12-04)",
                   1e3 * rows[s, "float32", "constant", TRITON]["device_ms"] / recorded)
            for s, recorded in RL_TRITON_RECORDED_US.items() if (s, "float32", "constant", TRITON) in rows]


def _correctness(bench: dict | None, tests: dict | None) -> str:
    target = "No loss of correctness (GPU tests; every gae_xp route of the benchmark against float64)"
    errors = [(row, row["error"]) for row in (bench or {}).get("rows", ())
              if row["path"].startswith("gae_xp") and row.get("error") is not None]
    over = [(row, error) for row, error in errors if error > TOLERANCE.get(row["dtype"], 1e-5)]
    if tests is None:
        test_text = "no GPU test report"
    else:
        test_text = (f"{tests['tests']} tests, {tests['failures']} failed, {tests['errors']} errors, "
                     f"{tests['skipped']} skipped"
                     + (f", not finished: {', '.join(tests['incomplete'])}" if tests["incomplete"] else ""))
    bench_text = f"{len(errors)} benchmark outputs checked, {len(over)} over tolerance"
    if over:
        row, error = max(over, key=lambda item: item[1])
        bench_text += f" (worst {error:.1e}: {row['path']} {_where(row['shape'], row['dtype'], row['case'])})"
    figure = f"{test_text}; {bench_text}"
    if over or (tests and (tests["failures"] or tests["errors"])):
        return f"- {target}: NOT MET ({figure})"
    if tests is None or tests["incomplete"] or tests["tests"] <= tests["skipped"] or not errors:
        return f"- {target}: NOT MEASURED ({figure})"
    return f"- {target}: MET ({figure})"


def best_variants(bench: dict | None) -> list[str]:
    """The fastest Triton tuning variant per shape and dtype (constant case), from the benchmark's rows."""
    best = {}
    for row in (bench or {}).get("rows", ()):
        if row.get("variant") and not row.get("failed") and row.get("device_ms") is not None:
            key = (tuple(row["shape"]), row["dtype"])
            if key not in best or row["device_ms"] < best[key]["device_ms"]:
                best[key] = row
    return [f"- Triton tuning, fastest at {s[0]}x{s[1]} {d}: {row['variant']} ({1e3 * row['device_ms']:.1f} us, "
            f"{row['copy_ratio']:.2f}x copy)" for (s, d), row in best.items()]


def write_verdicts(out: Path) -> str:
    try:
        bench = json.loads((out / "bench_gpu.json").read_text())
    except (OSError, ValueError):
        bench = None
    lines = ["# Verdicts: the targets of \"The GPU at the copy floor\"", "",
             *verdicts(bench, junit_totals(out / "gpu-tests.xml")), *best_variants(bench)]
    if bench is None:
        lines.append("- (no bench_gpu.json: the benchmark wrote nothing)")
    text = "\n".join(lines) + "\n"
    (out / "verdicts.md").write_text(text)
    return text


# ------------------------------------------------------------------------------------------------------ summary

SUMMARY_SHAPES = [TRAINER, (8192, 1024), (256, 131072), FEW_LONG_ROWS]
SUMMARY_PATHS = [("Triton route", TRITON), ("numba-CUDA route", NUMBA),
                 ("triton_gae.py", "triton_gae.py, program per row")]


def summary(out: Path) -> str:
    """The README's table of a run: device us (and x the copy) per route at four shapes, float32 and bfloat16,
    the constant and dones+mask cases; then the host time per eager call that the profile measured."""
    bench = json.loads((out / "bench_gpu.json").read_text())
    rows = _rows(bench)
    check = (out / "check.md").read_text()
    started = re.search(r"started: (\S+) .*commit (\w+)", check)
    gpu = re.search(r"- GPU: ([^,\n]+)", check)
    lines = [f"Measured on an {gpu.group(1) if gpu else 'unknown GPU'} by the GPU check of "
             f"{started.group(1) if started else '?'} (commit {started.group(2) if started else '?'}); device us "
             "per call, and x the device copy of the case's floor bytes:", "",
             "| shape | dtype | case | copy | " + " | ".join(name for name, _ in SUMMARY_PATHS) + " |",
             "|---|---|---|---|" + "---|" * len(SUMMARY_PATHS)]
    for shape in SUMMARY_SHAPES:
        for dtype in DTYPES:
            for case in ("constant", "dones+mask"):
                copy = rows.get((shape, dtype, case, "copy"))
                if copy is None:
                    continue
                cells = []
                for _, path in SUMMARY_PATHS:
                    row = rows.get((shape, dtype, case, path))
                    cells.append("–" if row is None else
                                 f"{1e3 * row['device_ms']:.1f} ({row['device_ms'] / copy['device_ms']:.2f}x)")
                lines.append(f"| {_where(shape, dtype, case).replace(' ', ' | ')} | {1e3 * copy['device_ms']:.1f} | "
                             + " | ".join(cells) + " |")
    profile = out / "host-profile.txt"
    hosts = re.findall(r"^== (\S+) at (\S+): \d+ calls, ([\d.]+) us host per call", profile.read_text(), re.M) \
        if profile.is_file() else []
    if hosts:
        lines += ["", "Host time per eager call (float32, constant case; `tests/gpu/profile_host.py`): "
                  + "; ".join(f"{route} {shape} {us} us" for route, shape, us in hosts) + "."]
    return "\n".join(lines)


# --------------------------------------------------------------------------------------------------------- docs

NO_RUN = """No run of this check is recorded here yet: **no figure in this section is measured**. A run adds "The
last run" below: its date, commit, GPU, CPU and package versions, the table of parts as they ended, a verdict
line per target, bench_gpu.md's tables, the host time per eager call and the sanitizer's summaries, written by
`python tests/gpu/report_check.py docs $OUT --write docs/gpu.md` from the run's files."""
#: What each part of check.sh does, in its order.
PARTS = {"install": "the carried wheels and the checkout, installed without a registry; the versions",
         "tests": "tests/gpu file by file (test_routes.py, test_triton_cuda.py, test_triton_op_cuda.py, "
                  "test_sync_and_graphs.py, test_devices_and_streams.py, any other, test_cuda.py), 3 hypothesis "
                  "examples per property",
         "sanitizer": "`tests/gpu/sanitize_calls.py` under memcheck, then racecheck",
         "profile": "`tests/gpu/profile_host.py`",
         "bench": "`tests/gpu/bench_gpu.py`, no new shape in its last 40 s",
         "verdicts": "`tests/gpu/report_check.py verdicts`"}
TARGETS = ["the Triton route's device time: at most 1.25x the copy at the seven shapes with at least 264 rows or "
           "T <= 4096, at most 1.6x at 16x524288, faster than rl-triton 0.1.3 and than tests/gpu/triton_gae.py at "
           "every shape (float32 and bfloat16; constant, terminated, dones+mask)",
           "the eager whole call at 38400x128: at most 60 us wall, 30 us of host time on torch, 40 us on CuPy; at "
           "most 30 us under CUDA-graph replay",
           "the numba-CUDA route: at most 2x the copy at every shape",
           "no loss of correctness (the GPU tests; every route's output against float64); a first call at a new "
           "B and T compiles nothing"]


def budgets() -> dict:
    """check.sh's declared budget per part, in seconds."""
    line = next(line for line in (Path(__file__).parent / "check.sh").read_text().splitlines()
                if line.startswith("BUDGETS=("))
    return {name: int(seconds) for name, seconds in re.findall(r"(\w+)=(\d+)", line)}


def section(out: Path | None) -> str:
    """docs/gpu.md's section "The GPU check": what the check writes, and a run's results where ``out`` holds one."""
    lines = [BEGIN, "## The GPU check", "",
             "`bash tests/gpu/check.sh` (tests/gpu/README.md) runs in at most 8 minutes on a GPU machine without a",
             "package registry and writes, part by part, at most 8 files to `$OUT`:", "",
             "| file | part | what |", "|---|---|---|",
             "| `check.md` | all | date, commit, GPU, packages; one line per part (budget, time taken, exit) |",
             "| `gpu-tests.xml` | tests | JUnit of `tests/gpu`, file by file |",
             "| `sanitizer.txt` | sanitizer | compute-sanitizer memcheck and racecheck on every kernel structure |",
             "| `host-profile.txt` | profile | cProfile of 2,000 eager calls per route at 38400x128 and 4096x32 |",
             "| `bench_gpu.json`, `bench_gpu.md` | bench | every route, baseline, case, dtype and Triton variant |",
             "| `verdicts.md` | verdicts | one line per target: MET, NOT MET or NOT MEASURED, with its figure |",
             "| `logs.tar` | all | each part's log |", "",
             f"The parts, in order, each under its budget ({sum(budgets().values())} s in all; a part that fails "
             "or overruns does not stop the next):", "", "| part | budget s | what |", "|---|---|---|",
             *[f"| {name} | {seconds} | {PARTS[name]} |" for name, seconds in budgets().items()], "",
             "The verdicts judge the targets of \"The GPU at the copy floor\" (NOT MEASURED where a figure is "
             "missing):", "", *[f"- {target}" for target in TARGETS], ""]
    check = _read(out, "check.md")
    if check is None:
        lines += [NO_RUN, END]
        return "\n".join(lines)
    header = [line for line in check.splitlines() if line.startswith("- ")]
    parts = [line for line in check.splitlines() if line.startswith("|")]
    lines += ["### The last run", "", *header, "", *parts, "", "#### Verdicts", ""]
    lines += [line for line in (_read(out, "verdicts.md") or "").splitlines() if line.startswith("- ")] or \
        ["- (no verdicts.md)"]
    bench = _read(out, "bench_gpu.md")
    lines += ["", "#### Benchmark (bench_gpu.md)", "", bench.strip() if bench else "(no bench_gpu.md)"]
    profile = _read(out, "host-profile.txt")
    lines += ["", "#### Host time per eager call (host-profile.txt)", ""]
    lines += [f"- {line[3:]}" for line in (profile or "").splitlines() if line.startswith("== ")] or \
        ["- (no host-profile.txt)"]
    sanitizer = _read(out, "sanitizer.txt")
    lines += ["", "#### compute-sanitizer (sanitizer.txt)", ""]
    lines += [f"- {line}" for line in (sanitizer or "").splitlines()
              if re.search(r"ERROR SUMMARY|RACECHECK SUMMARY|not found|failed call|^== ", line)] or \
        ["- (no sanitizer.txt)"]
    return "\n".join([*lines, END])


def _read(out: Path | None, name: str) -> str | None:
    if out is None:
        return None
    try:
        return (out / name).read_text()
    except OSError:
        return None


def write_section(document: Path, text: str):
    """Replace the section between the markers (or append it) in ``document``."""
    current = document.read_text()
    pattern = re.compile(re.escape(BEGIN) + r".*?" + re.escape(END), re.S)
    updated = pattern.sub(lambda _: text, current) if pattern.search(current) else current.rstrip() + "\n\n" + text
    document.write_text(updated.rstrip() + "\n")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("environment")
    junit = commands.add_parser("junit")
    junit.add_argument("target", type=Path)
    junit.add_argument("parts", type=Path, nargs="+")
    junit.add_argument("--stopped", default="", help="space-separated names of the parts stopped at their cap")
    judged = commands.add_parser("verdicts")
    judged.add_argument("out", type=Path)
    docs = commands.add_parser("docs")
    docs.add_argument("out", type=Path, nargs="?")
    docs.add_argument("--write", type=Path, default=None, help="the document whose section is replaced")
    commands.add_parser("summary").add_argument("out", type=Path)
    options = parser.parse_args(argv)
    if options.command == "environment":
        print(environment())
    elif options.command == "junit":
        totals = merge_junit(options.target, options.parts, options.stopped.split())
        print(f"GPU tests so far: {totals}")
    elif options.command == "verdicts":
        print(write_verdicts(options.out), end="")
    elif options.command == "summary":
        print(summary(options.out))
    else:
        text = section(options.out)
        if options.write:
            write_section(options.write, text)
        else:
            print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
