"""The bench command, its harness and the asv benchmarks: options, help, a tiny sweep, the verdict rules, clean skips.

Nothing here asserts on a wall-clock time: the verdict rules are checked on
measurements made up for the purpose, the tiny sweep on its structure.
"""

from __future__ import annotations

import importlib.util
import json
import pathlib
import re
import subprocess
import sys

import numpy as np
import pytest

from gae_xp.__main__ import main
from gae_xp.bench import cli, paths, report, runner
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
    (["--backend", "fortran"], "unknown fortran"),
    (["--chunk-size", "auto,-3"], "not positive"),
    (["--dones", "1.5"], "not in [0, 1)"),
    (["--mask-holes", "x"], "not a number"),
    (["--gamma", "2"], "not in [0, 1]"),
    (["--dtype", "int8"], "invalid choice"),
    (["--repeat", "0"], "not positive"),
    (["--paths", "quantum"], "unknown path"),
    (["--cases", "constant,sometimes"], "unknown case sometimes"),
    (["--serial-budget", "-1"], "not positive"),
])
def test_bad_options_are_rejected_with_a_message(argv, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli.build_parser().parse_args(argv)
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


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
    argv = ["bench", "--backend", "numpy", "--T", "64,256", "--B", "2", "--chunk-size", "auto,8,16,64",
            "--cases", "constant,dones+mask", "--repeat", "3", "--json", str(json_path), "--plot", str(png_path)]
    assert main(argv, prog="gae-xp") == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    # what is measured comes first
    assert lines[0].startswith("gae_xp bench: ")
    head = "\n".join(lines[:9])
    for expected in ("shapes  B=2, T=64,256 (time last), float32, gamma=0.99, lam=0.95",
                     "cases   constant, dones+mask (dones 0.01, mask holes 0.2)",
                     "chunk sizes auto,8,16,64", "timing  median of 3 samples", "machine ", "cores usable",
                     "threads: ", "GPU: none in this run", "versions gae_xp ", "numpy "):
        assert expected in head, expected
    # the plain table, then its legend
    table = [line.split() for line in lines if line.startswith("numpy ")]
    assert table and all(len(row) >= 11 for row in table)
    for name in ("gae_xp[xp]", "serial", "slime-chunked", "matrix"):
        assert any(row[2] == name for row in table), name
    for symbol in ("~ ", "spread ", "vs loop ", "C "):
        assert any(line.startswith(symbol) for line in lines), symbol
    # the numba kernel has no chunks: one row per shape and case, never a chunk size
    if libraries.target_unavailable("numpy/numba") is None:
        numba_rows = [row for row in table if row[2] == "gae_xp[numba]"]
        assert len(numba_rows) == 4 and all(row[5] == "-" for row in numba_rows)
        assert "gae_xp[numba] has no chunks" in out
        assert not re.search(r"gae_xp\[numba\]: set chunk_size", out)
    # a constant discount's kernel is at most 32 wide: 64 runs what auto runs, and is timed once
    constant_xp_256 = [row for row in table if row[1] == "constant" and row[2] == "gae_xp[xp]" and row[4] == "256"]
    assert sorted(" ".join(row[5:7]) if row[5] == "auto" else row[5] for row in constant_xp_256) == \
        ["16", "8", "auto (32)"]
    assert "chunk_size 64 runs C=32 like auto: timed once" in out
    # the verdict at the user's shape: loop against gae_xp, per case
    verdict = out[out.index("verdict"):]
    assert "numpy, B=2, T=256, constant: backend='auto' runs gae_xp[" in verdict
    assert "numpy, B=2, T=256, dones+mask: " in verdict
    assert "the serial loop, what you have now" in verdict and "per PPO step" in verdict
    assert re.search(r"gae_xp\[xp\]: (keep the default chunk_size=None|set chunk_size=\d+)", verdict)
    assert "dones+mask against the constant discount: gae_xp[xp]" in verdict
    assert lines[-1].startswith("took ") and "gae-xp bench --backend numpy" in lines[-1]
    # the JSON file and the plot
    document = json.loads(json_path.read_text())
    assert document["command"].startswith("gae-xp bench --backend numpy")
    assert {"machine", "versions", "results", "date", "elapsed_s"} <= set(document)
    measured = {(r["path"], r["T"], r["case"], r["chunk_size"]) for r in document["results"]}
    assert ("gae_xp[xp]", 256, "constant", 16) in measured and ("serial", 64, "constant", None) in measured
    for record in document["results"]:
        assert record["median_s"] > 0
        if record["max_abs_error"] is not None:
            assert record["max_abs_error"] < 1e-4
    assert png_path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_serial_loop_is_extrapolated_past_the_budget(quick):
    library = libraries.load("numpy")
    workload = paths.Workload(2, 4 * runner.PROBE_STEPS)
    serial = next(p for p in paths.BASELINES if p.name == "serial")
    sweep = runner.Sweep((library,), (workload,), (serial,), (None,), repeat=1, serial_budget_s=1e-6)
    (measurement_,) = runner.run(sweep)
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
    assert any("gae_xp[numba] has no chunks" in line for line in lines)


def test_the_step_verdict_compares_the_loop_with_what_auto_runs():
    results = [measurement("gae_xp[numba]", effective=None, median=2e-3),
               measurement("gae_xp[xp]", median=6e-3), measurement("serial", effective=None, median=1.202)]
    line = report.verdicts(results, {"numpy": "gae_xp[numba]"})[0]
    assert line.startswith("numpy, B=8, T=131072, constant: backend='auto' runs gae_xp[numba]: 2 ms")
    assert "1.2 s per call (601x): 1.2 s saved per PPO step" in line
    assert "was not timed" in report.verdicts(results[:2], {"numpy": "gae_xp[numba]"})[0]
    assert "which was not timed" in report.verdicts(results[1:], {"numpy": "gae_xp[numba]"})[0]


def test_the_numba_kernel_is_compared_with_the_bare_numba_loop():
    results = [measurement("gae_xp[numba]", effective=None, median=2e-3),
               measurement("numba-bare", effective=None, median=1e-3)]
    lines = "\n".join(report.verdicts(results, {"numpy": "gae_xp[numba]"}))
    assert "gae_xp[numba] 2 ms ±0% against a bare numba loop's 1 ms ±0% (2x its time" in lines


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
    assert "lax.scan under jax.jit, what you have now: 30 ms per call (10x)" in lines
    assert "gae_xp[jax] has no chunks" in lines
    assert "lax.associative_scan under jax.jit: 12 ms" in lines
    assert "torch CPU tensors on the numba kernel: 2.2 ms ±0%; NumPy arrays on the same kernel: 2 ms" in lines


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
    assert "measured by this project on CPU X, 2 cores" in line and "(3x faster)" in line
    assert report.extra_hints(["numba"], ["jax:cpu"], recorded) == []
    (gpu,) = report.extra_hints(["numba-cuda"], ["cupy"], {"results": []})
    assert "has not recorded" in gpu
    assert report.load_recorded() is None or "results" in report.load_recorded()


def test_legend_and_table_without_rich(plain, capsys):
    report.print_report([measurement(extrapolated_from=512, median=2.0, spread=0.1)])
    out = capsys.readouterr().out
    assert "~2 s" in out and "±5%" in out
    for line in report.LEGEND:
        assert line in out


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


def test_asv_check_passes():
    if importlib.util.find_spec("asv") is None:
        pytest.skip("asv is not installed (pip install 'gae_xp[bench]')")
    done = subprocess.run([sys.executable, "-m", "asv", "check", "--python=same"], cwd=ROOT / "asv_bench",
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
