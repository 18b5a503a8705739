"""The bench command and the asv benchmarks: options, a tiny sweep, and clean skips."""

from __future__ import annotations

import importlib.util
import json
import pathlib
import subprocess
import sys

import numpy as np
import pytest

from gae_xp.__main__ import main
from gae_xp.bench import cli, libraries, paths, report, runner

ROOT = pathlib.Path(__file__).resolve().parents[1]


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
    (["--serial-budget", "-1"], "not positive"),
])
def test_bad_options_are_rejected_with_a_message(argv, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli.build_parser().parse_args(argv)
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


def test_main_without_a_command_prints_usage(capsys):
    assert main([]) == 2
    assert "bench" in capsys.readouterr().err


def test_tiny_sweep_writes_table_json_and_plot(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    json_path, png_path = tmp_path / "bench.json", tmp_path / "bench.png"
    code = main(["bench", "--backend", "numpy", "--T", "64,256", "--B", "2", "--chunk-size", "auto,16",
                 "--repeat", "1", "--json", str(json_path), "--plot", str(png_path)])
    assert code == 0
    out = capsys.readouterr().out
    for expected_text in ("gae_xp[xp]", "serial", "slime-chunked", "matrix", "numpy: use chunk_size="):
        assert expected_text in out
    document = json.loads(json_path.read_text())
    assert document["command"].startswith("python -m gae_xp bench")
    assert {"machine", "versions", "results"} <= set(document)
    measured = {(r["path"], r["T"], r["chunk_size"]) for r in document["results"]}
    assert ("gae_xp[xp]", 256, 16) in measured and ("serial", 64, None) in measured
    for record in document["results"]:
        assert record["median_s"] > 0
        if record["max_abs_error"] is not None:
            assert record["max_abs_error"] < 1e-4
    assert png_path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_serial_loop_is_extrapolated_past_the_budget():
    library = libraries.load("numpy")
    workload = paths.Workload(2, 4 * runner.PROBE_STEPS)
    serial = next(p for p in paths.BASELINES if p.name == "serial")
    sweep = runner.Sweep((library,), (workload,), (serial,), (None,), repeat=1, serial_budget_s=1e-6)
    (measurement,) = runner.run(sweep)
    assert measurement.extrapolated_from == runner.PROBE_STEPS
    assert measurement.max_abs_error is None
    assert report.rows([measurement])[0][5].startswith("~")


def test_unknown_library_is_reported():
    assert "unknown library" in libraries.unavailable("fortran")
    with pytest.raises(ValueError):
        libraries.load("fortran")


def test_every_path_is_exact_on_a_small_workload():
    library = libraries.load("numpy")
    workload = paths.Workload(2, 300, dtype="float64")
    exact = paths.exact_advantages(workload)
    arrays = workload.arrays()
    for path in paths.all_paths():
        if path.skip_reason(library, workload) is None:
            advantages, _ = path.run(arrays, workload, 16 if path.chunked else None, library)
            np.testing.assert_allclose(advantages, exact, rtol=1e-9, atol=1e-9, err_msg=path.name)


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


def test_asv_benchmarks_run_and_skip_cleanly():
    _load_asv_module("common")
    bench = _load_asv_module("bench_gae")
    timed = bench.TimeGAE()
    timed.setup("numpy/xp", 8, 4096)
    timed.time_gae("numpy/xp", 8, 4096)
    with pytest.raises(NotImplementedError):
        bench.TimeGAE().setup("cupy/xp" if libraries.unavailable("cupy") else "fortran/xp", 8, 4096)
    with pytest.raises(NotImplementedError):
        bench.TimeGAE().setup("numpy/numba-cuda", 8, 4096)
    with pytest.raises(NotImplementedError):
        bench.TimeBaselines().setup("numpy", "matrix", 131072)
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
