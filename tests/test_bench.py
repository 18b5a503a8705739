"""The bench command, its harness and the asv benchmarks: options, help, a tiny sweep, the verdict rules, clean skips.

Nothing here asserts on a wall-clock time: the verdict rules are checked on
measurements made up for the purpose, the tiny sweep on its structure.
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import json
import os
import pathlib
import re
import shlex
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from gae_xp.__main__ import main
from gae_xp.bench import cli, noise, paths, report, runner
from gae_xp.testing import libraries

ROOT = pathlib.Path(__file__).resolve().parents[1]


@pytest.fixture
def quick(monkeypatch):
    """Short samples and no settling, so that a sweep takes seconds."""
    monkeypatch.setattr(runner, "MIN_SAMPLE_S", 1e-4)
    monkeypatch.setattr(runner, "WARM_UP_S", 0.0)


@pytest.fixture
def plain(monkeypatch):
    """As on a base install: no rich."""
    for name in ("rich", "rich.console", "rich.markup", "rich.table", "rich.progress"):
        monkeypatch.setitem(sys.modules, name, None)


def measurement(path="gae_xp[xp]", chunk=None, effective=32, median=1.0, spread=0.0, runs=5, library="numpy",
                T=131072, **kwargs) -> runner.Measurement:
    """A made-up measurement: median and spread (half the IQR) in seconds."""
    return runner.Measurement(library, path, 8, T, chunk, "float32", kwargs.pop("dones", 0.0),
                              kwargs.pop("holes", 0.0), median, median - spread, median + spread, runs,
                              effective_chunk=effective, **kwargs)


# ---------------------------------------------------------------------------------------------------- options, help


@pytest.mark.parametrize("argv, message", [
    (["--T", "0"], "not positive"),
    (["--T", "abc"], "not an integer"),
    (["--B", ""], "comma-separated"),
    (["--library", "fortran"], "unknown fortran"),
    (["--backend", "fortran"], "unknown fortran"),
    (["--chunk-size", "auto,-3"], "not positive"),
    (["--dones", "1.5"], "not in [0, 1)"),
    (["--mask-holes", "x"], "not a number"),
    (["--gamma", "2"], "not in [0, 1]"),
    (["--dtype", "int8"], "invalid choice"),
    (["--repeat", "0"], "not positive"),
    (["--paths", "quantum"], "unknown path"),
    (["--cases", "constant,sometimes"], "unknown case sometimes"),
    (["--serial-budget", "-1"], "not a finite positive number"),
    (["--serial-budget", "inf"], "not a finite positive number"),
    (["--serial-budget", "nan"], "not a finite positive number"),
    (["--load", "-1"], "is negative"),
    (["--threads", "0"], "not positive"),
])
def test_bad_options_are_rejected_with_a_message(argv, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli.build_parser().parse_args(argv)
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize("argv, message", [
    (["--repeat", "0"], "argument --repeat: 0 is not positive"),
    (["--B", "-1"], "argument --B: -1 is not positive"),
    (["--T", "0"], "argument --T: 0 is not positive"),
    (["--T", "many"], "argument --T: 'many' is not an integer"),
])
def test_adapters_checks_its_arguments_as_bench_does(argv, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["adapters", *argv], prog="gae-xp")
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize("argv, message", [
    (["packed", "--total", "0"], "argument --total: 0 is not positive"),
    (["packed", "--total", "10", "--sequences", "20"], "--sequences 20 is more than --total 10 steps"),
    (["cp", "--world", "8", "--length", "4"], "--length 4 is shorter than --world 8"),
    (["cp", "--repeat", "0"], "argument --repeat: 0 is not positive"),
    (["dask-ooc", "--gib", "inf"], "argument --gib: inf is not a finite positive number"),
    (["--json", "/no/such/folder/x.json", "packed"], "--json /no/such/folder/x.json: cannot write there"),
])
def test_the_scale_benchmarks_check_their_arguments_before_running(argv, message, capsys):
    from gae_xp.bench import scale

    with pytest.raises(SystemExit) as exit_info:
        scale.main(argv)
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


def test_library_is_the_option_and_backend_its_deprecated_alias(capsys):
    parser = cli.build_parser()
    assert parser.parse_args(["--library", "numpy,torch"]).library == ["numpy", "torch:cpu"]
    assert capsys.readouterr().err == ""
    assert parser.parse_args(["--backend", "numpy"]).library == ["numpy"]
    err = capsys.readouterr().err
    assert "--backend is deprecated, use --library" in err and "gae(backend=...) selects the compute path" in err


def test_load_takes_a_count_or_one_per_core():
    parser = cli.build_parser()
    assert parser.parse_args([]).load == 0
    assert parser.parse_args(["--load"]).load == cli.PER_CORE
    assert parser.parse_args(["--load", "3"]).load == 3
    assert report.load_words(0, 2).startswith("none started")
    assert report.load_words(2, 2).startswith("2 busy neighbour processes (one per usable core) spin")
    assert report.load_words(1, 2).startswith("1 busy neighbour process spin")


@pytest.fixture
def no_run(monkeypatch):
    """A bench that must stop before anything is timed: the sweep fails the test if it starts."""
    def refuse(*args, **kwargs):
        raise AssertionError("the sweep started")

    monkeypatch.setattr(runner, "run", refuse)
    monkeypatch.setattr(runner, "first_call", refuse)


@pytest.mark.parametrize("argv, message", [
    (["--cases", "dones+mask", "--paths", "lfilter"],
     "--paths lfilter matches nothing in this run (numpy: dones and masks need the general contract)"),
    (["--paths", "gae_xp[xp],gae_xp[numba-cuda]"],
     "--paths gae_xp[numba-cuda] matches nothing in this run (numpy: "),
    (["--paths", "lax.scan"], "--paths lax.scan matches nothing in this run (numpy: a JAX reference"),
])
def test_paths_matching_nothing_are_named_before_any_run(argv, message, capsys, no_run):
    assert main(["bench", "--library", "numpy", "--T", "64", *argv], prog="gae-xp") == 2
    captured = capsys.readouterr()
    assert message in captured.err
    assert captured.out == ""


def test_a_path_that_runs_on_some_cases_only_is_noted(capsys, quick, plain):
    argv = ["bench", "--library", "numpy", "--T", "64", "--B", "2", "--cases", "constant,dones+mask", "--paths",
            "gae_xp[xp],lfilter", "--chunk-size", "auto", "--repeat", "1", "--no-first-call"]
    assert main(argv, prog="gae-xp") == 0
    captured = capsys.readouterr()
    assert "note: lfilter does not run on numpy dones+mask: dones and masks need the general contract" in captured.err
    assert any(line.split()[:3] == ["numpy", "constant", "lfilter"] for line in captured.out.splitlines())


@pytest.mark.parametrize("option", ["--json", "--plot"])
@pytest.mark.parametrize("where", ["missing folder", "a folder"])
def test_an_unwritable_output_fails_before_the_run(option, where, tmp_path, capsys, no_run):
    if option == "--plot":
        pytest.importorskip("matplotlib")
    target = tmp_path / "missing" / "out.file" if where == "missing folder" else tmp_path
    assert main(["bench", "--library", "numpy", option, str(target)], prog="gae-xp") == 2
    err = capsys.readouterr().err
    assert f"{option} {target}: cannot write there" in err
    assert not (tmp_path / "missing").exists()


def test_the_output_check_leaves_no_file_behind(tmp_path):
    options = cli.build_parser().parse_args(["--json", str(tmp_path / "out.json")])
    assert cli._output_problems(options) is None
    assert not (tmp_path / "out.json").exists()


def test_profile_takes_no_json_or_plot(capsys, no_run, tmp_path):
    assert main(["bench", "--profile", "--json", str(tmp_path / "x.json")], prog="gae-xp") == 2
    assert "--profile prints a profile" in capsys.readouterr().err


def test_a_case_without_its_probability_is_refused(capsys):
    assert main(["bench", "--cases", "dones+mask", "--dones", "0"], prog="gae-xp") == 2
    assert "case dones+mask needs --dones and --mask-holes above 0" in capsys.readouterr().err


def test_main_without_a_command_prints_usage(capsys):
    assert main([], prog="gae-xp") == 2
    err = capsys.readouterr().err
    assert "usage: gae-xp" in err and "bench" in err


@pytest.mark.parametrize("prog", ["gae-xp", "python -m gae_xp"])
def test_help_lists_the_commands(prog, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["--help"], prog=prog)
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith(f"usage: {prog} ")
    assert re.search(r"^\s+bench\s+is GAE my bottleneck", out, re.M)
    assert re.search(r"^\s+adapters\s+each framework adapter", out, re.M)


def test_every_framework_the_adapters_command_runs_is_named_in_its_help_and_docs(capsys):
    """Issue 31, 8: the help texts and docs/bench.md named 4 frameworks; the command ran 8."""
    from gae_xp.bench import adapters

    frameworks = list(dict.fromkeys(row.framework for row in adapters.ROWS))
    with pytest.raises(SystemExit):
        main(["--help"], prog="gae-xp")
    top = " ".join(capsys.readouterr().out.split())
    with pytest.raises(SystemExit):
        main(["adapters", "--help"], prog="gae-xp")
    own = " ".join(capsys.readouterr().out.split())
    docs = (ROOT / "docs" / "bench.md").read_text()
    section = " ".join(docs[docs.index("### `gae-xp adapters`"):docs.index("## asv")].split())
    for name in frameworks:
        assert name in top and name in own and name in section, name


def _fake_row(name, needs=None, linear=True, per_step_s=1e-6):
    """A row whose framework call sleeps in proportion to T, and whose adapter returns at once."""
    from gae_xp.bench import adapters

    def build(library, B, T):
        return (lambda: time.sleep(T * per_step_s)), (lambda: None)

    return adapters.Row(name, name.split()[0], build, needs=needs, install=f"pip install {needs}" if needs else None,
                        linear_in_T=linear)


def test_a_slow_framework_loop_is_extrapolated_from_a_prefix():
    """Issue 31, 8: a default run took 240 s, AReaL's packed loop alone 89.7 s."""
    from gae_xp.bench import adapters

    steps = {}

    def timer(call, number):  # a loop of 1 ms per step, measured without waiting for it
        return call() * 1e-3 * number

    row = adapters.Row("X", "X", lambda library, B, T: (lambda: steps.setdefault(T, T), lambda: None))
    seconds, prefix = adapters.time_framework(row, None, 2, 8 * runner.PROBE_STEPS, timer, budget_s=1.0)
    assert prefix == 1000 and seconds == pytest.approx(8 * runner.PROBE_STEPS * 1e-3)
    assert sorted(steps) == [runner.PROBE_STEPS, 1000]  # the probe, then the prefix the budget allows
    assert adapters.time_framework(row, None, 2, 8 * runner.PROBE_STEPS, timer, budget_s=10.0)[1] is None
    flat = adapters.Row("Y", "Y", row.build, linear_in_T=False)
    assert adapters.time_framework(flat, None, 2, 8 * runner.PROBE_STEPS, timer, budget_s=1e-9)[1] is None


def test_only_per_step_loops_are_extrapolated_from_a_prefix():
    """Issue 44, 4: slime's chunked_gae read ~292.9 ms, extrapolated from a prefix, where T=131072 took 84-105 ms."""
    from gae_xp.bench import adapters

    chunked = next(row for row in adapters.ROWS if row.label.startswith("slime chunked_gae"))
    assert not chunked.linear_in_T
    loops = [row for row in adapters.ROWS if row.label.startswith(("verl", "slime vanilla", "AReaL", "CleanRL"))]
    assert loops and all(row.linear_in_T for row in loops)
    ran = []

    def timer(call, number):
        return call() * 1e-3 * number

    row = adapters.Row("C", "C", lambda library, B, T: (lambda: ran.append(T) or T, lambda: None),
                       linear_in_T=chunked.linear_in_T)
    assert adapters.time_framework(row, None, 2, 8 * runner.PROBE_STEPS, timer, budget_s=1e-9)[1] is None
    assert ran == [8 * runner.PROBE_STEPS]


def test_a_cold_first_call_is_not_extrapolated_to_the_whole_sequence():
    """A probe's first call pays torch's set-up (54 ms against 0.3 ms here): scaled by T/512 it read 4 s for 0.2 s."""
    from gae_xp.bench import adapters

    calls = []

    def timer(call, number):  # 1 us per step, and the process's first call 50 ms more
        calls.append(call())
        return (calls[-1] * 1e-6 + (0.05 if len(calls) == 1 else 0.0)) * number

    row = adapters.Row("X", "X", lambda library, B, T: ((lambda: T), lambda: None))
    seconds, prefix = adapters.time_framework(row, None, 2, 256 * runner.PROBE_STEPS, timer, budget_s=1.0)
    assert prefix is None and seconds == pytest.approx(256 * runner.PROBE_STEPS * 1e-6)


def test_adapters_marks_extrapolated_rows_and_names_the_rows_left_out(monkeypatch, capsys, quick):
    from gae_xp.bench import adapters

    if libraries.unavailable("torch:cpu"):
        pytest.skip(libraries.unavailable("torch:cpu"))
    rows = (_fake_row("slow loop", per_step_s=2e-6), _fake_row("absent loop", needs="no_such_framework_gae_xp"))
    monkeypatch.setattr(adapters, "ROWS", rows)
    assert main(["adapters", "--B", "2", "--T", "4096", "--repeat", "1", "--serial-budget", "0.002"],
                prog="gae-xp") == 0
    out = capsys.readouterr().out
    (slow,) = [line for line in out.splitlines() if line.startswith("slow loop")]
    assert re.fullmatch(r"slow loop +~ *[\d.]+ ms +[\d.]+ ms +\d+% +~ *\d+x", slow), slow
    assert adapters.LEGEND in out
    assert "left out, 1 of 2 rows (their framework is not installed here):" in out
    assert "absent loop: no_such_framework_gae_xp is not installed (pip install no_such_framework_gae_xp)" in out
    assert not any(line.startswith("absent loop ") for line in out.splitlines())
    assert re.search(r"^took [\d.]+ s; load average ", out, re.M)


def test_adapter_cases_serve_asv_with_every_row_that_can_run():
    from gae_xp.bench import adapters

    if libraries.unavailable("torch:cpu"):
        pytest.skip(libraries.unavailable("torch:cpu"))
    cases = adapters.adapter_cases(libraries.load("torch:cpu"), 2, 64)  # their numbers: tests/conformance
    assert [label for label, _, _ in cases] == [row.label for row in adapters.ROWS if row.unavailable() is None]
    assert all(callable(framework) and callable(ours) for _, framework, ours in cases)


@pytest.mark.parametrize("prog", ["gae-xp", "python -m gae_xp"])
def test_bench_help_names_itself_and_documents_every_default(prog, capsys):
    with pytest.raises(SystemExit):
        main(["bench", "--help"], prog=prog)
    out = capsys.readouterr().out
    assert out.startswith(f"usage: {prog} bench ")
    parser = cli.build_parser()
    documented = " ".join(out.split())
    for action in parser._actions:
        if action.dest == "help":
            continue
        assert action.help and "(default: " in action.help, action.dest
        assert action.option_strings[0] in out
    assert "(default: 4096,32768,131072)" in documented and "(default: auto,8,16,32,64,128)" in documented
    assert not re.search(r"\(default: \(", documented), "a default printed as a Python tuple"
    assert "(default: None" not in documented


def test_the_program_name_follows_the_invocation(monkeypatch):
    import gae_xp.__main__ as entry

    monkeypatch.setattr(sys, "argv", ["/usr/bin/gae-xp", "bench"])
    assert entry._prog() == "gae-xp"
    monkeypatch.setattr(sys, "argv", [str(ROOT / "gae_xp" / "__main__.py"), "bench"])
    assert entry._prog() == "python -m gae_xp"


# ---------------------------------------------------------------------------------------------------- a tiny sweep


def test_tiny_sweep_prints_header_table_legend_verdict_and_duration(tmp_path, capsys, quick, plain):
    pytest.importorskip("matplotlib")
    json_path, png_path = tmp_path / "bench.json", tmp_path / "bench.png"
    argv = ["bench", "--library", "numpy", "--T", "64,256", "--B", "2", "--chunk-size", "auto,8,16,64",
            "--cases", "constant,dones+mask", "--repeat", "3", "--json", str(json_path), "--plot", str(png_path)]
    assert main(argv, prog="gae-xp") == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    # what is measured comes first
    assert lines[0].startswith("gae_xp bench: ")
    head = "\n".join(lines[:10])
    for expected in ("shapes  B=2, T=64,256 (time last), float32, gamma=0.99, lam=0.95",
                     "cases   constant, dones+mask (dones 0.01, mask holes 0.2)",
                     "chunk sizes auto,8,16,64", "timing  median of 3 samples", "machine ", "cores usable",
                     "threads: ", "GPU: none in this run", "load    none started", "versions gae_xp ", "numpy ",
                     "routes  triton ", "; numba-cuda ", "; xp yes"):
        assert expected in head, expected
    # the plain table, then its legend
    table = [re.split(r"\s{2,}", line.strip()) for line in lines if line.startswith("numpy ")]
    assert table and all(len(row) == len(report.COLUMNS) for row in table)
    for name in ("gae_xp[xp]", "serial", "slime-chunked", "copy"):
        assert any(row[2] == name for row in table), name
    assert not any(row[2] == "matrix" for row in table)  # opt-in: it costs more than it tells
    # one copy floor per shape and case, its own yardstick; every other row a multiple of it
    copies = [row for row in table if row[2] == "copy"]
    assert len(copies) == 4 and all(row[8] == "1x" and row[9] == "-" for row in copies)
    assert all(row[8].endswith("x") for row in table)
    # the small call against the bare numba loop, each contender a multiple of it
    if importlib.util.find_spec("numba") is not None:
        small = out[out.index("the small call against a bare numba loop"):]
        assert "bare numba loop" in small and small.count("x the bare loop") >= 2
    for symbol in ("~ ", "spread ", "x floor ", "vs loop ", "C "):
        assert any(line.startswith(symbol) for line in lines), symbol
    numba = libraries.target_unavailable("numpy/numba") is None
    xp_256 = [row for row in table if row[1] == "constant" and row[2] == "gae_xp[xp]" and row[4] == "256"]
    verdict = out[out.index("verdict"):out.index("first call in a fresh process")]
    if numba:
        # the numba kernel has no chunks: one row per shape and case, never a chunk size; and since auto runs it,
        # no chunk size is swept or advised on the generic path either (it would change nothing in the user's call)
        numba_rows = [row for row in table if row[2] == "gae_xp[numba]"]
        assert len(numba_rows) == 4 and all(row[5] == "-" for row in numba_rows)
        assert "gae_xp[numba], what backend='auto' runs, has no chunks" in verdict
        assert "set chunk_size" not in verdict and "gae_xp[xp]: keep the default" not in verdict
        assert [row[5] for row in xp_256] == ["auto (32)"]
    else:
        # a constant discount's kernel is at most 32 wide: 64 runs what auto runs, and is timed once
        assert sorted(row[5] for row in xp_256) == ["16", "8", "auto (32)"]
        assert "chunk_size 64 runs C=32 like auto: timed once" in out
        assert re.search(r"gae_xp\[xp\]: (keep the default chunk_size=None|set chunk_size=\d+)", verdict)
    # the verdict at the user's shape: loop against gae_xp, the copy floor, per case; every shape compared
    assert "numpy, B=2, T=256, constant: backend='auto' runs gae_xp[" in verdict
    assert "numpy, B=2, T=256, dones+mask: " in verdict
    assert re.search(r"per call = [\d.]+x the copy floor \([^)]* to copy the same bytes, [\d.]+ GB/s", verdict)
    assert "the serial loop, what you have now" in verdict
    assert re.search(r"per PPO step|no measurable difference|too noisy to tell|gae_xp is slower here", verdict)
    assert re.search(r"(ahead of the fastest baseline timed at every shape \(B=2, T=64, 256\)|"
                     r"(behind|no measurable difference|too noisy to tell) at B=2, T=64: )", verdict)
    assert "dones+mask against the constant discount: gae_xp[xp]" in verdict
    # the first call of a fresh process: its own lines, one per library and case, at the largest shape
    first = out[out.index("first call in a fresh process"):]
    for case in ("constant", "dones+mask"):
        assert re.search(rf"numpy, B=2, T=256, {re.escape(case)}, backend='auto': [\d.]+ m?s, then ", first), case
    assert lines[-1].startswith("took ") and "gae-xp bench --library numpy" in lines[-1]
    # the JSON file and the plot
    document = json.loads(json_path.read_text())
    assert document["command"].startswith("gae-xp bench --library numpy")
    assert {"machine", "versions", "results", "date", "elapsed_s", "load", "first_calls"} <= set(document)
    assert document["load"] == 0 and len(document["first_calls"]) == 2
    assert all(record["first_s"] > 0 for record in document["first_calls"])
    measured = {(r["path"], r["T"], r["case"], r["chunk_size"]) for r in document["results"]}
    assert ("gae_xp[xp]", 256, "dones+mask", None) in measured and ("serial", 64, "constant", None) in measured
    assert ("copy", 64, "constant", None) in measured
    for record in document["results"]:
        assert record["median_s"] > 0 and record["floor_ratio"] > 0
        if record["max_abs_error"] is not None:
            assert record["max_abs_error"] < 1e-4
    assert png_path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_serial_loop_is_extrapolated_past_the_budget(quick):
    library = libraries.load("numpy")
    workload = paths.Workload(2, 4 * runner.PROBE_STEPS)
    serial = next(p for p in paths.BASELINES if p.name == "serial")
    sweep = runner.Sweep((library,), (workload,), (serial,), (None,), repeat=1, serial_budget_s=1e-6)
    measurement_, floor = runner.run(sweep)
    assert floor.path == runner.COPY and floor.extrapolated_from is None
    assert measurement_.extrapolated_from == runner.PROBE_STEPS
    assert measurement_.max_abs_error is None
    assert report.rows([measurement_])[0][6].startswith("~")


def test_chunk_sizes_are_swept_at_the_largest_shape_on_chunked_paths_only():
    library = libraries.load("numpy")
    small, large = paths.Workload(2, 64), paths.Workload(2, 512)
    chosen = tuple(p for p in paths.all_paths() if p.name in ("gae_xp[xp]", "gae_xp[numba]", "slime-chunked"))
    sweep = runner.Sweep((library,), (small, large), chosen, (None, 8, 16, 32, 64, 128))
    cases = [(w.T, p.name, c) for _, w, p, c in sweep.cases()]
    assert [(t, c) for t, name, c in cases if name == "gae_xp[xp]"] == [(64, None), (512, None), (512, 8),
                                                                         (512, 16)]
    assert [c for t, name, c in cases if name == "gae_xp[numba]"] in ([], [None, None])
    assert [(t, c) for t, name, c in cases if name == "slime-chunked"] == [(64, 128)] + [(512, c) for c in
                                                                                     (8, 16, 32, 64, 128)]
    assert sweep.count() == len(cases) + 2  # a copy floor per workload


def test_of_gae_xp_paths_only_the_one_auto_runs_is_swept():
    library = libraries.load("numpy")
    large = paths.Workload(2, 512)
    chosen = tuple(p for p in paths.all_paths() if p.name in ("gae_xp[xp]", "gae_xp[numba]", "slime-chunked"))
    sizes = (None, 8, 16)
    on_numba = runner.Sweep((library,), (large,), chosen, sizes, swept={"numpy": "gae_xp[numba]"})
    assert [c for _, _, p, c in on_numba.cases() if p.name == "gae_xp[xp]"] == [None]
    assert [c for _, _, p, c in on_numba.cases() if p.name == "slime-chunked"] == [8, 16]  # baselines: all sizes
    on_xp = runner.Sweep((library,), (large,), chosen, sizes, swept={"numpy": "gae_xp[xp]"})
    assert [c for _, _, p, c in on_xp.cases() if p.name == "gae_xp[xp]"] == [None, 8, 16]


# ---------------------------------------------------------------------------------------------------- verdict rules


def test_a_chunk_size_within_the_spread_is_not_recommended():
    auto = measurement(median=10e-3, spread=0.5e-3)
    close = measurement(chunk=16, effective=16, median=9.2e-3, spread=0.4e-3)
    assert report.recommend_chunk(auto, [close]) is None
    line = report.chunk_verdict([auto, close], "gae_xp[xp]")
    assert "keep the default chunk_size=None" in line and "less than the measured spread" in line


def test_a_chunk_size_faster_by_more_than_the_spread_is_recommended():
    auto = measurement(median=10e-3, spread=0.2e-3)
    fast = measurement(chunk=16, effective=16, median=8e-3, spread=0.2e-3)
    slow = measurement(chunk=8, effective=8, median=12e-3, spread=0.1e-3)
    assert report.recommend_chunk(auto, [slow, fast]) is fast
    assert report.chunk_verdict([auto, slow, fast], "gae_xp[xp]").startswith("gae_xp[xp]: set chunk_size=16")


@pytest.mark.parametrize("auto_runs, other_runs, other_median", [(2, 5, 5e-3), (5, 1, 5e-3), (5, 5, 9.7e-3)])
def test_no_recommendation_from_few_samples_or_a_tiny_gain(auto_runs, other_runs, other_median):
    auto = measurement(median=10e-3, runs=auto_runs)
    other = measurement(chunk=16, effective=16, median=other_median, runs=other_runs)
    assert report.recommend_chunk(auto, [other]) is None
    assert "keep the default" in report.chunk_verdict([auto, other], "gae_xp[xp]")


def test_a_size_that_runs_what_auto_runs_is_never_recommended():
    auto = measurement(median=10e-3)
    same = measurement(chunk=64, effective=32, median=5e-3)
    assert report.recommend_chunk(auto, [same]) is None


def test_paths_without_chunks_get_no_chunk_advice():
    numba = [measurement("gae_xp[numba]", effective=None, median=2e-3),
             measurement("serial", effective=None, median=1.2)]
    lines = report.verdicts(numba, {"numpy": "gae_xp[numba]"})
    assert not any("set chunk_size" in line for line in lines)
    assert any("gae_xp[numba], what backend='auto' runs, has no chunks" in line for line in lines)


def test_no_chunk_advice_for_a_path_that_auto_does_not_run():
    """Issue 25, 3: torch arrays, auto runs the numba kernel: sizes 16 and 8 on the generic path change nothing."""
    results = [measurement("gae_xp[numba]", library="torch:cpu", effective=None, median=2e-3),
               measurement("gae_xp[xp]", library="torch:cpu", median=20e-3),
               measurement("gae_xp[xp]", library="torch:cpu", chunk=16, effective=16, median=10e-3),
               measurement("gae_xp[xp]", library="torch:cpu", chunk=8, effective=8, median=12e-3)]
    on_numba = "\n".join(report.verdicts(results, {"torch:cpu": "gae_xp[numba]"}))
    assert "chunk size: gae_xp[xp]" not in on_numba
    assert "gae_xp[numba], what backend='auto' runs, has no chunks" in on_numba
    # sizes on another path are swept only when the user names it (--paths): then said for what they are
    assert ("chunk size, for calls that force backend='xp' only (auto runs gae_xp[numba], where chunk_size changes "
            "nothing): gae_xp[xp]: set chunk_size=16") in on_numba
    on_xp = "\n".join(report.verdicts(results, {"torch:cpu": "gae_xp[xp]"}))
    assert "chunk size: gae_xp[xp]: set chunk_size=16" in on_xp and "force backend" not in on_xp


def test_the_step_verdict_compares_the_loop_with_what_auto_runs():
    results = [measurement("gae_xp[numba]", effective=None, median=2e-3),
               measurement("gae_xp[xp]", median=6e-3), measurement("serial", effective=None, median=1.202)]
    line = report.verdicts(results, {"numpy": "gae_xp[numba]"})[0]
    assert line.startswith("numpy, B=8, T=131072, constant: backend='auto' runs gae_xp[numba]: 2 ms")
    assert "1.2 s ±0% per call (601x): 1.2 s saved per PPO step" in line
    assert "was not timed" in report.verdicts(results[:2], {"numpy": "gae_xp[numba]"})[0]
    assert "which was not timed" in report.verdicts(results[1:], {"numpy": "gae_xp[numba]"})[0]


def test_the_numba_kernel_is_compared_with_the_bare_numba_loop():
    results = [measurement("gae_xp[numba]", effective=None, median=2e-3),
               measurement("numba-bare", effective=None, median=1e-3)]
    lines = "\n".join(report.verdicts(results, {"numpy": "gae_xp[numba]"}))
    assert "gae_xp[numba] 2 ms ±0% against a bare numba loop's 1 ms ±0% (2x the bare loop's time" in lines


def test_jax_is_compared_with_lax_scan_and_torch_cpu_with_numpy_on_the_numba_kernel():
    results = [measurement("gae_xp[xp]", library="jax:cpu", median=6e-3),
               measurement("gae_xp[jax]", library="jax:cpu", effective=None, median=3e-3),
               measurement("lax.scan", library="jax:cpu", effective=None, median=30e-3),
               measurement("lax.associative_scan", library="jax:cpu", effective=None, median=12e-3),
               measurement("gae_xp[numba]", effective=None, median=2e-3),
               measurement("gae_xp[numba]", library="torch:cpu", effective=None, median=2.2e-3)]
    lines = "\n".join(report.verdicts(results, {"jax:cpu": "gae_xp[jax]", "numpy": "gae_xp[numba]",
                                                "torch:cpu": "gae_xp[numba]"}))
    assert "jax:cpu, B=8, T=131072, constant: backend='auto' runs gae_xp[jax] under jax.jit: 3 ms" in lines
    assert "lax.scan under jax.jit, what you have now: 30 ms ±0% per call (10x)" in lines
    assert "gae_xp[jax], what backend='auto' runs, has no chunks" in lines
    assert "lax.associative_scan under jax.jit: 12 ms ±0% (4x gae_xp[jax]'s time)" in lines
    assert "torch CPU tensors on the numba kernel: 2.2 ms ±0%; NumPy arrays on the same kernel: 2 ms" in lines


def test_a_difference_within_the_spread_of_both_is_no_measurable_difference():
    """Issue 25, 2: the same JAX command said "1.07x: 612 us saved", then "0.938x: slower by 660 us"."""
    ours = measurement("gae_xp[jax]", library="jax:cpu", effective=None, median=9.4e-3, spread=0.5e-3)
    for loop_median in (10.05e-3, 8.8e-3):  # 1.07x, 0.936x: both within 0.5 + 0.4 ms
        loop = measurement("lax.scan", library="jax:cpu", effective=None, median=loop_median, spread=0.4e-3)
        line = report.verdicts([ours, loop], {"jax:cpu": "gae_xp[jax]"})[0]
        assert "what you have now: " in line and line.endswith(
            "per call: no measurable difference (the medians differ by less than the spread of both)")
        assert "saved" not in line and "slower" not in line
    loop = measurement("lax.scan", library="jax:cpu", effective=None, median=11e-3, spread=0.4e-3)
    assert "(1.17x): 1.6 ms saved per PPO step" in report.verdicts([ours, loop], {"jax:cpu": "gae_xp[jax]"})[0]
    loop = measurement("lax.scan", library="jax:cpu", effective=None, median=8e-3, spread=0.4e-3)
    assert "(0.851x): gae_xp is slower here by 1.4 ms per call" in report.verdicts(
        [ours, loop], {"jax:cpu": "gae_xp[jax]"})[0]


@pytest.mark.parametrize("other, tie", [(1.05e-3, True), (2e-3, False)])
def test_every_comparison_takes_the_same_rule(other, tie):
    ours = measurement(median=1e-3, spread=0.05e-3)
    base = measurement(median=other, spread=0.05e-3)
    assert report.measurably_different(ours, base) is not tie
    assert report.relative(base, ours, "X") == ("no measurable difference from X" if tie else "2x X")
    results = [measurement("gae_xp[numba]", effective=None, median=1e-3, spread=0.05e-3),
               measurement("numba-bare", effective=None, median=other, spread=0.05e-3),
               measurement("gae_xp[numba]", library="torch:cpu", effective=None, median=other, spread=0.05e-3),
               measurement("gae_xp[numba]", effective=None, median=other, spread=0.05e-3, dones=0.01, holes=0.2)]
    lines = "\n".join(report.verdicts(results, {"numpy": "gae_xp[numba]", "torch:cpu": "gae_xp[numba]"}))
    for words, ratio in (("the bare loop's time", "0.5x"), ("NumPy's time", "2x"), ("its constant time", "2x")):
        assert (f"no measurable difference from {words}" if tie else f"{ratio} {words}") in lines, words


def test_every_shape_where_gae_xp_is_not_ahead_is_reported():
    """Issue 25, 4: the base install behind slime's chunk scan at T=4096 and 32768; the verdict spoke of 131072 only."""
    rows_ = []
    for T, ours, slime, loop in ((4096, 5.47e-3, 1.09e-3, 20e-3), (32768, 12e-3, 9e-3, 160e-3),
                                 (131072, 9e-3, 35e-3, 640e-3)):
        rows_ += [measurement("gae_xp[xp]", T=T, median=ours, spread=0.1e-3),
                  measurement("slime-chunked", T=T, chunk=128, effective=128, median=slime, spread=0.1e-3),
                  measurement("serial", T=T, effective=None, median=loop, spread=0.1e-3),
                  measurement(runner.COPY, T=T, effective=None, median=ours / 10, spread=0.0)]
    lines = report.verdicts(rows_, {"numpy": "gae_xp[xp]"})
    assert lines[0].startswith("numpy, B=8, T=131072, constant:")
    behind = [line.strip() for line in lines if "behind at" in line]
    assert behind == [
        "behind at B=8, T=4096: gae_xp[xp] 5.47 ms ±2% against slime-chunked (C=128)'s 1.09 ms ±9%, the fastest "
        "baseline there (5.02x its time)",
        "behind at B=8, T=32768: gae_xp[xp] 12 ms ±1% against slime-chunked (C=128)'s 9 ms ±1%, the fastest "
        "baseline there (1.33x its time)"]
    assert not any("copy" in line for line in behind)  # the floor is a yardstick, not a baseline
    rows_[5] = measurement("slime-chunked", T=32768, chunk=128, effective=128, median=11.9e-3, spread=0.1e-3)
    text = "\n".join(report.verdicts(rows_, {"numpy": "gae_xp[xp]"}))
    assert "no measurable difference at B=8, T=32768: gae_xp[xp] 12 ms ±1% against slime-chunked (C=128)'s" in text
    ahead = [m for m in rows_ if m.T == 131072]
    assert "ahead of the fastest baseline timed at every shape (B=8, T=131072)" in "\n".join(
        report.verdicts(ahead, {"numpy": "gae_xp[xp]"}))


QUIET = noise.Conditions(load_average=0.4, cores=2)
BUSY = noise.Conditions(load_average=5.2, cores=2)


def test_a_busy_machine_has_more_runnable_threads_than_cores():
    assert BUSY.busy and not QUIET.busy and not noise.Conditions().busy
    assert noise.Conditions(2.5, 2).busy and not noise.Conditions(2.0, 2).busy
    assert BUSY.words() == "load average 5.2 on 2 usable cores"
    assert noise.Conditions(4.1, 2, neighbours=2).words() == ("load average 4.1 on 2 usable cores, 2 of them started "
                                                              "by --load")


def test_a_wide_tie_is_too_noisy_to_tell_not_no_difference():
    """Issue 31, 7: 54.3 ms ±69% against 12.2 ms ±52% (4.5x) read "no measurable difference"."""
    results = [measurement("gae_xp[xp]", median=12.2e-3, spread=0.52 * 12.2e-3),
               measurement("gae_xp[xp]", median=54.3e-3, spread=0.69 * 54.3e-3, dones=0.01, holes=0.2)]
    for conditions in (None, QUIET, BUSY):
        text = "\n".join(report.verdicts(results, {"numpy": "gae_xp[xp]"}, conditions=conditions))
        assert "no measurable difference" not in text
        line = next(line for line in text.splitlines() if "against the constant discount" in line)
        assert line.startswith("  dones+mask against the constant discount: gae_xp[xp] 54.3 ms ±69% against 12.2 ms "
                               "±52%, too noisy to tell from its constant time: spreads ±69% and ±52%; ")
        assert line.endswith("rerun with --repeat 15 or at a quieter moment")
        assert ("busy machine, load average 5.2 on 2 usable cores" in line) is (conditions is BUSY)


@pytest.mark.parametrize("conditions, words", [
    (QUIET, "no measurable difference from X"),
    (None, "no measurable difference from X"),
    (BUSY, "too noisy to tell from X: busy machine, load average 5.2 on 2 usable cores; rerun with --repeat 15 or at "
           "a quieter moment"),
])
def test_a_narrow_tie_is_no_difference_only_on_a_machine_that_was_not_busy(conditions, words):
    ours, base = measurement(median=1e-3, spread=0.05e-3), measurement(median=1.05e-3, spread=0.05e-3)
    assert report.relative(ours, base, "X", conditions) == words


@pytest.mark.parametrize("spread, conditions, words", [
    (0.05e-3, QUIET, "2x X"),
    (0.05e-3, BUSY, "2x X"),  # the busy machine is said once, at the top of the verdict
    (0.6e-3, QUIET, "2x X, rough: spreads ±30% and ±5%"),
])
def test_a_difference_beyond_the_spread_is_given_and_marked_rough_on_noisy_samples(spread, conditions, words):
    ours, base = measurement(median=2e-3, spread=spread), measurement(median=1e-3, spread=0.05e-3)
    assert report.relative(ours, base, "X", conditions) == words


def test_the_step_verdict_and_every_shape_say_too_noisy_to_tell():
    ours = measurement("gae_xp[jax]", library="jax:cpu", effective=None, median=9.4e-3, spread=4e-3)
    loop = measurement("lax.scan", library="jax:cpu", effective=None, median=12e-3, spread=3e-3)
    lines = report.verdicts([ours, loop], {"jax:cpu": "gae_xp[jax]"}, conditions=QUIET)
    assert lines[0].startswith("noisy measurements: 2 of 2 rows have a spread above ±20% (widest ±43%: jax:cpu "
                               "gae_xp[jax] T=131072)")
    assert lines[1].endswith("per call: too noisy to tell (the medians differ by less than the spread of both; "
                             "spreads ±43% and ±25%; rerun with --repeat 15 or at a quieter moment)")
    assert ("  too noisy to tell at B=8, T=131072: gae_xp[jax] 9.4 ms ±43% against lax.scan's 12 ms ±25%, the fastest "
            "baseline there; spreads ±43% and ±25%; rerun with --repeat 15 or at a quieter moment") in lines
    assert "no measurable difference" not in "\n".join(lines)


def test_a_quiet_narrow_run_gets_no_noise_line_and_a_busy_one_does():
    results = [measurement("gae_xp[numba]", effective=None, median=2e-3, spread=0.02e-3),
               measurement("serial", effective=None, median=1.2, spread=0.01)]
    assert not report.verdicts(results, {"numpy": "gae_xp[numba]"}, conditions=QUIET)[0].startswith("noisy")
    first = report.verdicts(results, {"numpy": "gae_xp[numba]"}, conditions=BUSY)[0]
    assert first.startswith("noisy measurements: the machine was busy: load average 5.2 on 2 usable cores (the "
                            "highest 1-minute figure seen during the run)")
    assert first.endswith("rerun with --repeat 15 or at a quieter moment")


def test_a_chunk_size_within_a_wide_spread_is_too_noisy_to_tell():
    auto = measurement(median=10e-3, spread=3e-3)
    other = measurement(chunk=16, effective=16, median=9e-3, spread=2e-3)
    line = report.chunk_verdict([auto, other], "gae_xp[xp]", QUIET)
    assert line.endswith("is faster by less than the measured spread, too noisy to tell: spreads ±30% and ±22%; "
                         "rerun with --repeat 15 or at a quieter moment")


def test_the_verdict_says_how_far_the_call_is_from_the_copy_floor():
    results = [measurement("gae_xp[numba]", effective=None, median=5.6e-3),
               measurement(runner.COPY, effective=None, median=0.91e-3),
               measurement("serial", effective=None, median=1.2)]
    runner.add_ratios(results)
    assert results[0].floor_ratio == pytest.approx(5.6 / 0.91) and results[1].floor_ratio == 1
    assert results[1].speedup_vs_serial is None  # the floor is not a GAE
    line = report.verdicts(results, {"numpy": "gae_xp[numba]"})[0]
    # 4 arrays of float32 at B=8, T=131072 in 0.91 ms: 18.4 GB/s
    assert "5.6 ms ±0% per call = 6.15x the copy floor (910 us to copy the same bytes, 18.4 GB/s" in line
    row = report.rows(results)[0]
    assert row[report.COLUMNS.index("x floor")] == "6.15x"


def test_the_copy_floor_copies_the_same_bytes_into_arrays_of_its_own():
    workload = paths.Workload(2, 100, dones=0.1)
    ran = 0
    for name in ("numpy", "torch:cpu", "jax:cpu"):
        if libraries.unavailable(name):
            continue
        library = libraries.load(name)
        arrays = {k: library.asarray(v) for k, v in workload.arrays().items()}
        advantages, returns = paths.copy_floor(library, arrays)()
        for got, source in ((advantages, arrays["rewards"]), (returns, arrays["values"])):
            got_np, source_np = library.to_numpy(got), library.to_numpy(source)
            np.testing.assert_array_equal(got_np, source_np)
            assert got_np.dtype == np.float32 and not np.shares_memory(got_np, source_np)
        ran += 1
    assert ran >= 1


def test_the_verdict_names_the_path_auto_takes_on_each_library():
    loaded = [libraries.load(n) for n in ("numpy", "jax:cpu") if libraries.unavailable(n) is None]
    chosen = cli.auto_paths(loaded, "float32")
    numba_serves = libraries.target_unavailable("numpy/numba") is None
    assert chosen["numpy"] == ("gae_xp[numba]" if numba_serves else "gae_xp[xp]")
    if "jax:cpu" in chosen:
        assert chosen["jax:cpu"] == "gae_xp[jax]"


def test_an_extra_that_is_not_installed_is_named_with_what_it_gave_here():
    recorded = {"command": "gae-xp bench --paths gae_xp[xp],gae_xp[numba]", "machine": {"cpu": "CPU X", "cpus": 2},
                "results": [measurement("gae_xp[xp]", median=6e-3).as_dict(),
                            measurement("gae_xp[numba]", effective=None, median=2e-3).as_dict()]}
    (line,) = report.extra_hints(["numba"], ["numpy", "jax:cpu"], recorded)
    assert line.startswith("numba is not installed: pip install 'gae_xp[numba]'")
    assert ("measured by this project on another machine, not this one (CPU X, 2 cores), with "
            "`gae-xp bench --paths gae_xp[xp],gae_xp[numba]`: ") in line
    assert "2 ms ±0% against the generic path's 6 ms ±0% (3x faster)" in line
    assert report.extra_hints(["numba"], ["jax:cpu"], recorded) == []
    (gpu,) = report.extra_hints(["numba-cuda"], ["cupy"], {"results": []})
    assert "has not recorded" in gpu
    assert report.load_recorded() is None or "results" in report.load_recorded()


def test_a_recorded_gain_within_the_spread_is_no_speed_up():
    """Issue 31, 6-7: the hint said "1.1x faster" for 10.6 ms ±16% against 11.3 ms ±55% on a busy machine."""
    recorded = {"command": "gae-xp bench", "machine": {"cpu": "CPU X", "cpus": 2, "usable_cpus": 2,
                                                       "load_average_highest": 12.9},
                "results": [measurement("gae_xp[xp]", median=11.3e-3, spread=0.55 * 11.3e-3).as_dict(),
                            measurement("gae_xp[numba]", effective=None, median=10.6e-3, spread=1.7e-3).as_dict()]}
    (line,) = report.extra_hints(["numba"], ["numpy"], recorded)
    assert "another machine, not this one (CPU X, 2 cores, load average 13 during the run: a busy machine's figures)" \
        in line
    assert line.endswith("10.6 ms ±16% against the generic path's 11.3 ms ±55% (too noisy to tell: spreads ±16% and "
                         "±55%; busy machine, load average 13 on 2 usable cores)")
    assert "faster" not in line


def _bench_commands():
    """Every ``gae-xp bench`` command the project quotes: README.md and docs/*.md in backticks, docs/figures.sh,
    and the command that made recorded.json (which the bench's advice quotes)."""
    texts = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    quoted = [m.group(1) for path in texts
              for m in re.finditer(r"`((?:python -m gae_xp|gae-xp) bench[^`]*)`", path.read_text())]
    script = [line.split(None, 2)[2] for line in (ROOT / "docs" / "figures.sh").read_text().splitlines()
              if re.match(r"run \S+ +python -m gae_xp bench", line)]
    return [command for command in (*quoted, *script, report.load_recorded()["command"]) if "--help" not in command]


def test_every_quoted_bench_command_parses_without_a_deprecation():
    """Issue 31, 6: the bench's advice quoted `--backend`, deprecated."""
    from gae_xp.__main__ import build_parser

    commands = _bench_commands()
    assert len(commands) >= 8
    for command in commands:
        words = shlex.split(command)
        words = words[3:] if words[0] == "python" else words[1:]
        error = io.StringIO()
        with contextlib.redirect_stderr(error):
            options = build_parser("gae-xp").parse_args(words)
        assert options.command == "bench", command
        assert error.getvalue() == "", (command, error.getvalue())


def test_the_readme_quotes_the_recorded_figures_the_bench_advises_with():
    """Issue 31, 6: the advice quoted one machine's figures, the README another's: both now quote recorded.json."""
    recorded = report.load_recorded()
    machine = recorded["machine"]
    readme = " ".join((ROOT / "README.md").read_text().split())
    assert f"`{recorded['command']}`" in readme
    assert f"{machine['cpu']} ({machine['cpus']} cores" in readme
    assert f"load average {machine['load_average_highest']:.2g}" in readme
    for r in recorded["results"]:
        if r["path"] in ("gae_xp[numba]", "gae_xp[xp]"):
            assert report.seconds(r["median_s"]) in readme, r
    # the machine that recorded them is named (above) whichever machine runs this test: CI's CPU varies
    assert machine["cpu"] and machine["cpus"] >= 1


def test_legend_and_table_without_rich(plain, capsys):
    report.print_report([measurement(extrapolated_from=512, median=2.0, spread=0.1)])
    out = capsys.readouterr().out
    assert "~2 s" in out and "±5%" in out
    for line in report.LEGEND:
        assert line in out


def test_an_empty_table_prints_without_rich(plain, capsys):
    report.print_report([])
    out = capsys.readouterr().out
    assert out.splitlines()[0].split() == [word for column in report.COLUMNS for word in column.split()]


def test_every_path_in_the_table_is_defined_in_the_legend(plain, capsys):
    """Issue 31, 10: "matrix" and "slime-chunked" were never defined."""
    names = [p.name for p in paths.all_paths()] + [runner.COPY]
    report.print_report([measurement(name, effective=None) for name in names])
    out = capsys.readouterr().out
    legend = out[out.index("path       what each row runs:"):out.index("verdict")]
    for name in names:
        assert re.search(rf"^  {re.escape(name)} +\S", legend, re.MULTILINE), name
    assert "slime's published chunk scan" in legend and "O(T^2)" in legend
    assert all(p.description for p in paths.all_paths())


@pytest.fixture
def sweep_seen(monkeypatch):
    """The sweep a command would time: recorded, nothing timed."""
    seen = []

    def record(sweep, **kwargs):
        seen.append(sweep)
        return []

    monkeypatch.setattr(runner, "run", record)
    return seen


@pytest.mark.parametrize("extra, matrix", [([], False), (["--all-paths"], True), (["--paths", "matrix"], True)])
def test_the_costly_matrix_baseline_is_opt_in(extra, matrix, sweep_seen, capsys):
    """Issue 31, 10: the matrix baseline cost 776 ms and 272 MiB at T=4096 in a default run."""
    assert main(["bench", "--library", "numpy", "--T", "64", "--no-first-call", *extra], prog="gae-xp") == 0
    (sweep,) = sweep_seen
    assert any(path.name == "matrix" for path in sweep.paths) is matrix
    out = capsys.readouterr().out
    if not extra:
        assert "all that apply but matrix (O(T^2) time and memory" in out and "opt in with --all-paths" in out


def test_the_first_calls_print_no_line_before_the_table(monkeypatch, capsys, sweep_seen):
    """Issue 31, 10: a stray "first call: numpy constant" came before the table."""
    pytest.importorskip("rich")
    record = {"import_gae_xp_s": 0.1, "import_library_s": 0.1, "first_s": 0.5, "second_s": 0.01}
    monkeypatch.setattr(runner, "first_call", lambda *args, **kwargs: dict(record))
    assert main(["bench", "--library", "numpy", "--T", "64"], prog="gae-xp") == 0
    captured = capsys.readouterr()
    assert captured.err == ""
    before_table = captured.out[:captured.out.index("┏")]
    assert "first call" not in before_table
    assert "numpy, B=8, T=64, constant, backend='auto': 500 ms" in captured.out


@pytest.mark.parametrize("libraries_", [["numpy"], ["numpy", "torch:cpu", "jax:cpu"]])
@pytest.mark.parametrize("cases", [["constant"], ["constant", "dones+mask"]])
def test_the_plot_keeps_its_title_inside_and_its_legend_off_the_data(libraries_, cases):
    """Issue 31, 9: with one library the 450x360 PNG clipped its title and drew the legend over the data."""
    pytest.importorskip("matplotlib")
    import matplotlib.pyplot as plt

    results = []
    for library in libraries_:
        for case in cases:
            holes = 0.2 if case != "constant" else 0.0
            for T in (4096, 32768, 131072):
                for name, median in (("gae_xp[xp]", 2e-4), ("serial", 1e-2), ("slime-chunked", 6e-4),
                                     ("lfilter", 2e-4), ("numba-bare", 4e-4), (runner.COPY, 1e-5)):
                    results.append(measurement(name, library=library, T=T, median=median * T / 4096, holes=holes,
                                               extrapolated_from=512 if name == "serial" and T > 4096 else None))
    figure = report.plot_figure(results)
    try:
        figure.canvas.draw()
        renderer = figure.canvas.get_renderer()
        page = figure.bbox
        title = figure._suptitle.get_window_extent(renderer)
        assert page.x0 <= title.x0 and title.x1 <= page.x1 and title.y1 <= page.y1, (title, page)
        (legend,) = figure.legends
        box = legend.get_window_extent(renderer)
        assert page.x0 <= box.x0 and box.x1 <= page.x1 and page.y0 <= box.y0
        assert len(legend.get_texts()) == len({(m.path, m.case) for m in results})
        for ax in figure.axes:
            assert not box.overlaps(ax.get_window_extent(renderer)), ax.get_title()
            assert not title.overlaps(ax.get_window_extent(renderer)), ax.get_title()
            assert ax.get_legend() is None
    finally:
        plt.close(figure)


def test_first_call_lines():
    records = [{"library": "numpy", "B": 8, "T": 131072, "case": "constant", "import_gae_xp_s": 0.05,
                "import_library_s": 0.1, "first_s": 0.85, "second_s": 2e-3, "numba": True},
               {"library": "torch:cpu", "B": 8, "T": 131072, "case": "dones+mask", "error": "ImportError: no"}]
    first, failed = report.first_call_lines(records)
    assert first == ("numpy, B=8, T=131072, constant, backend='auto': 850 ms, then 2 ms for the second call "
                     "(numba compiling its kernels or loading them from its cache, once per process); before it, "
                     "import gae_xp took 50 ms and numpy 100 ms")
    assert failed == "torch:cpu, B=8, T=131072, dones+mask, backend='auto': not measured (ImportError: no)"


def test_a_first_call_without_numba_claims_no_compilation():
    """Issue 44, 2: without numba, the first-call line said "(compilation or a cache load, ...)"."""
    record = {"library": "numpy", "B": 8, "T": 4096, "case": "constant", "import_gae_xp_s": 0.05,
              "import_library_s": 0.1, "first_s": 0.02, "second_s": 2e-3}
    (without,) = report.first_call_lines([{**record, "numba": False}])
    assert "(one-time set-up, nothing compiled by gae_xp, once per process)" in without
    assert "compil" not in without.replace("nothing compiled", "")
    (jax,) = report.first_call_lines([{**record, "library": "jax:cpu", "numba": False}])
    assert "(JAX tracing and compiling, once per process)" in jax


def test_a_recorded_quiet_machine_is_called_quiet():
    recorded = {"command": "gae-xp bench", "machine": {"cpu": "CPU Y", "cpus": 2, "usable_cpus": 2,
                                                       "load_average_highest": 0.4},
                "results": [measurement("gae_xp[xp]", median=6e-3).as_dict(),
                            measurement("gae_xp[numba]", effective=None, median=2e-3).as_dict()]}
    (line,) = report.extra_hints(["numba"], ["numpy"], recorded)
    assert "another machine, not this one (CPU Y, 2 cores, load average 0.4 during the run: a quiet machine's " \
           "figures)" in line


# ---------------------------------------------------------------------------------------------------- the harness


def test_the_harness_calibrates_and_takes_samples_in_turns():
    order = []

    def fake(name, seconds):
        def timer(call, number):
            order.append((name, number))
            return seconds * number

        return timer

    fast = runner.Candidate(lambda: None, fake("fast", 1e-4), repeat=3)
    slow = runner.Candidate(lambda: None, fake("slow", 1.0), repeat=2, scale=4.0)
    timings = runner.time_side_by_side({"fast": fast, "slow": slow}, warmup=1, min_sample_s=5e-3)
    assert timings["fast"].number >= 50 and timings["slow"].number == 1
    assert timings["fast"].samples == pytest.approx((1e-4,) * 3)
    assert timings["slow"].samples == pytest.approx((4.0, 4.0))
    sampled = [name for name, number in order if number == timings[name].number][-5:]
    assert sampled == ["fast", "slow", "fast", "slow", "fast"]
    assert runner.time_call(lambda: None, timer=fake("one", 1e-2), repeat=2).median == pytest.approx(1e-2)


def test_busy_neighbours_spin_while_the_block_runs_and_are_gone_after():
    with runner.busy_neighbours(2) as spinners:
        assert len(spinners) == 2 and all(spinner.poll() is None for spinner in spinners)
    assert all(spinner.poll() is not None for spinner in spinners)


def test_a_busy_neighbour_outlives_no_bench_killed_outright():
    """A bench killed without its cleanup (SIGKILL, os._exit) leaves no spinner behind: each one watches its parent."""
    script = ("import os, sys; from gae_xp.bench import runner\n"
              "spinners = runner.busy_neighbours(1).__enter__()\n"
              "print(spinners[0].pid, flush=True); os._exit(0)")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=ROOT, timeout=60)
    pid = int(done.stdout.split()[0])
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.1)
    os.kill(pid, signal.SIGKILL)
    pytest.fail("the busy neighbour outlived its parent")


def test_a_first_call_that_fails_says_why():
    record = runner.first_call("no-such-library", paths.Workload(2, 16))
    assert set(record) == {"error"} and "unknown library 'no-such-library'" in record["error"]


def test_the_profile_adds_up_to_the_call_time():
    def call():
        return sorted(range(300), key=lambda x: -x)

    timing, profiled, lines = runner.profile(call, seconds=0.05)
    assert profiled > 0 and lines
    assert sum(line.seconds for line in lines) == pytest.approx(timing.median, rel=1e-9)
    assert any(line.function.endswith("(<lambda>)") and line.calls == 300 for line in lines)
    text = report.profile_lines("title", timing, profiled, lines, top=2)
    assert text[0].startswith("title: ") and "per call without the profiler" in text[0]
    assert "by module" in text[1] and "by function (own time)" in "\n".join(text)
    assert text[-1].endswith(f"{len(lines) - 2} other functions")


def test_bench_profile_says_where_the_time_of_a_call_goes(capsys, plain):
    assert main(["bench", "--library", "numpy", "--B", "2", "--T", "16", "--profile"], prog="gae-xp") == 0
    out = capsys.readouterr().out
    assert "gae_xp bench: profile of backend='auto' on numpy" in out
    assert re.search(r"numpy, B=2, T=16, constant: backend='auto' runs gae_xp\[numba\]: [\d.]+ (us|ms|s) ", out)
    modules = out[out.index("by module"):out.index("by function")]
    functions = out[out.index("by function"):]
    # the steady state of a training loop: the untimed first call made a plan, so every profiled call is the
    # key's look-up and numba's plan, never the checks and the layout of the full path (gae_xp/_prepare.py)
    assert "gae_xp/_plans.py" in modules and "gae_xp/estimators.py" in modules
    assert "gae_xp/backends/_numba_plan.py" in modules and "gae_xp/_prepare.py" not in modules
    assert re.search(r"gae_xp/_plans\.py:\d+\(gae_key\)", functions)
    assert re.search(r"gae_xp/backends/_numba_plan\.py:\d+\(__call__\)", functions)


# ---------------------------------------------------------------------------------------------------- paths


@pytest.mark.parametrize("case", ["constant", "dones+mask"])
@pytest.mark.parametrize("name", ["numpy", "jax:cpu", "torch:cpu"])
def test_every_path_is_exact_on_a_small_workload(name, case):
    if libraries.unavailable(name):
        pytest.skip(libraries.unavailable(name))
    library = libraries.load(name)
    workload = paths.Workload(2, 300, "float64", *paths.case_probabilities(case, 0.05, 0.2))
    exact = paths.exact_advantages(workload)
    arrays = {k: library.asarray(v) for k, v in workload.arrays().items()}
    ran = []
    for path in paths.all_paths():
        if path.skip_reason(library, workload) is None:
            advantages, _ = path.run(arrays, workload, 16 if path.chunked else None, library)
            np.testing.assert_allclose(library.to_numpy(advantages), exact, rtol=1e-9, atol=1e-9, err_msg=path.name)
            ran.append(path.name)
    assert "gae_xp[xp]" in ran
    if name == "jax:cpu":
        assert {"lax.scan", "lax.associative_scan"} <= set(ran) and "serial" not in ran


# ---------------------------------------------------------------------------------------------------- asv


def _load_asv_module(name):
    spec = importlib.util.spec_from_file_location(
        f"asv_benchmarks.{name}", ROOT / "asv_bench" / "benchmarks" / f"{name}.py",
        submodule_search_locations=None)
    package = importlib.util.spec_from_file_location(
        "asv_benchmarks", ROOT / "asv_bench" / "benchmarks" / "__init__.py",
        submodule_search_locations=[str(ROOT / "asv_bench" / "benchmarks")])
    sys.modules.setdefault("asv_benchmarks", importlib.util.module_from_spec(package))
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_asv_takes_its_targets_from_the_registry_and_skips_cleanly():
    common = _load_asv_module("common")
    bench = _load_asv_module("bench_gae")
    assert set(common.TARGETS) == set(libraries.TARGETS) - {"numpy/numba-cuda"}
    assert {"numpy/xp", "numpy/numba", "torch:cpu/xp", "torch:cpu/numba", "jax:cpu/xp"} <= set(common.TARGETS)
    timed = bench.TimeSmallShapes()
    timed.setup("numpy/xp", "dones+mask")
    timed.time_gae("numpy/xp", "dones+mask")
    with pytest.raises(NotImplementedError):
        bench.TimeGAE().setup("cupy/xp" if libraries.unavailable("cupy") else "fortran/xp", 8, 4096)
    with pytest.raises(NotImplementedError):
        bench.TimeGAE().setup("numpy/numba-cuda", 8, 4096)
    with pytest.raises(NotImplementedError):
        bench.TimeBaselines().setup("numpy", "matrix", 131072)
    with pytest.raises(NotImplementedError):
        bench.TimeBaselines().setup("numpy", "lax.scan", 4096)
    if libraries.unavailable("torch:cuda"):
        with pytest.raises(NotImplementedError):
            bench.TrackGPUMemory().setup("torch:cuda", "constant")
    accuracy = bench.TrackAccuracy()
    accuracy.setup("numpy/xp", "gamma=0.99 lam=0.95")
    accuracy.workload = paths.Workload(2, 1000)
    accuracy.arrays = accuracy.workload.arrays()
    assert 0 <= accuracy.track_max_abs_error("numpy/xp", "gamma=0.99 lam=0.95") < 1e-4


def test_asv_without_gae_xp_gives_every_benchmark_parameters_to_skip_on(monkeypatch):
    """asv's runner strips sys.path: in an environment without gae_xp the registry's import fails. Every
    parameter list must still be non-empty (asv rejects an empty one: "Invalid benchmark parameter permutation
    index: 0") and each benchmark's setup must skip (NotImplementedError) at its first permutation."""
    for name in ("gae_xp", "gae_xp.bench", "gae_xp.bench.paths", "gae_xp.bench.libraries", "gae_xp.testing",
                 "gae_xp.testing.libraries", "gae_xp.bench.groups"):
        monkeypatch.setitem(sys.modules, name, None)
    checked = 0
    for module_name in ("common", "bench_gae", "bench_groups", "bench_small_calls"):
        monkeypatch.setitem(sys.modules, f"asv_benchmarks.{module_name}", None)
        module = _load_asv_module(module_name)
        for benchmark in vars(module).values():
            if not (isinstance(benchmark, type) and benchmark.__module__ == module.__name__
                    and hasattr(benchmark, "params")):
                continue
            params = benchmark.params if isinstance(benchmark.params[0], list) else [benchmark.params]
            assert all(len(values) > 0 for values in params), (benchmark.__name__, params)
            with pytest.raises(NotImplementedError):
                benchmark().setup(*(values[0] for values in params))
            checked += 1
    assert checked >= 10


def test_asv_tracks_gae_as_a_multiple_of_a_copy_of_the_same_bytes():
    common = _load_asv_module("common")
    bench = _load_asv_module("bench_gae")
    library = libraries.load("numpy")
    arrays = {k: library.asarray(v) for k, v in paths.Workload(2, 1000).arrays().items()}
    copied = common.copy_floor(library, arrays)()
    for got, source in zip(copied, (arrays["rewards"], arrays["values"])):
        np.testing.assert_array_equal(got, source)
    calls = []
    slow = common.ratio_to_floor(lambda: calls.append(time.sleep(2e-3)), lambda: None, lambda result: None,
                                 rounds=3, min_sample_s=1e-3)
    assert slow > 10 and len(calls) >= 4  # a warm-up, the calibration, three rounds
    tracked = bench.TrackCopyFloor()
    assert tracked.unit == "x copy floor"
    tracked.setup("numpy/xp", "dones+mask")
    tracked.workload = paths.Workload(2, 1000, dones=0.01, holes=0.2)
    tracked.arrays = {k: library.asarray(v) for k, v in tracked.workload.arrays().items()}
    tracked.floor = common.copy_floor(library, tracked.arrays)
    assert tracked.track_x_copy_floor("numpy/xp", "dones+mask") > 0


def _asv_config(name):
    text = (ROOT / "asv_bench" / name).read_text()
    return json.loads("\n".join(line for line in text.splitlines() if not line.lstrip().startswith("//")))


@pytest.mark.parametrize("name", ["asv.conf.json", "recorded/asv.conf.json"])
def test_asv_configurations_link_to_pages_that_exist(name):
    config = _asv_config(name)
    folder = (ROOT / "asv_bench" / name).parent
    html = (folder / config["html_dir"]).resolve()
    assert (html / config["project_url"]).resolve() == ROOT / "docs" / "bench.md"
    assert (ROOT / "docs" / "bench.md").is_file()
    assert (folder / config["benchmark_dir"]).resolve() == ROOT / "asv_bench" / "benchmarks"
    assert (folder / config["repo"]).resolve() == ROOT


def test_the_recorded_history_is_published_to_docs():
    config = _asv_config("recorded/asv.conf.json")
    assert (ROOT / "asv_bench" / "recorded" / config["html_dir"]).resolve() == ROOT / "docs" / "asv"
    assert (ROOT / "docs" / "asv" / "index.html").is_file()
    assert any((ROOT / "asv_bench" / "recorded" / config["results_dir"]).glob("*/machine.json"))


@pytest.mark.parametrize("argv, message", [
    ([], "usage: "), (["HEAD"], "usage: "), (["HEAD", "HEAD"], "are the same commit"),
    (["no-such-commit", "HEAD"], "no-such-commit is not a commit"),
])
def test_compare_refuses_what_compares_nothing(argv, message):
    if not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    done = subprocess.run(["bash", str(ROOT / "asv_bench" / "compare.sh"), *argv], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 2 and message in done.stderr


def test_the_asv_smoke_run_selects_every_benchmark_function():
    """CI's `bash asv_bench/smoke.sh` runs each benchmark function once: a class added later is not left out."""
    bench = _load_asv_module("bench_gae")
    script = (ROOT / "asv_bench" / "smoke.sh").read_text()
    selected = re.findall(r'-b "\^bench_gae\\.(\w+)\\.(\w+)', script)
    functions = {(name, attribute) for name, cls in vars(bench).items() if isinstance(cls, type)
                 and cls.__module__ == bench.__name__ for attribute in vars(cls)
                 if attribute.startswith(("time_", "track_", "peakmem_", "mem_"))}
    assert functions and set(selected) == functions


def test_figures_sh_names_every_tracked_file_it_overwrites():
    script = (ROOT / "docs" / "figures.sh").read_text()
    header = script[:script.index("set -uo pipefail")]
    written = set(re.findall(r"--(?:plot|json) ((?:docs|gae_xp)/[\w./]+)", script))
    written |= {"asv_bench/recorded/results/", "docs/asv/"} if "asv_bench/history.sh" in script else set()
    written |= set(re.findall(r"screenshot\.py \S+ ((?:docs)/[\w./]+)", script))
    assert written >= {"docs/bench.png", "gae_xp/bench/recorded.json", "docs/asv/", "docs/asv.png"}
    for path in written:
        assert path in header, path


def test_asv_check_passes():
    if importlib.util.find_spec("asv") is None:
        pytest.skip("asv is not installed (pip install 'gae_xp[bench]')")
    done = subprocess.run([sys.executable, "-m", "asv", "check", "--python=same"], cwd=ROOT / "asv_bench",
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
