"""The measuring scripts of the generic path's figures run, print their tables and leave nothing behind."""

from __future__ import annotations

import psutil
import pytest

from gae_xp.bench import load, small_calls


@pytest.mark.filterwarnings("error::pytest.PytestUnraisableExceptionWarning")  # a worker's pipe left open
def test_load_prints_every_setting_and_stops_its_processes(capsys):
    argv = ["--targets", "numpy/xp", "--cases", "constant,dones+mask", "--B", "2", "--T", "64", "--repeat", "2",
            "--sample-ms", "1", "--busy", "1"]
    before = {child.pid for child in psutil.Process().children(recursive=True)}  # the suite's own, if any
    assert load.main(argv) == 0
    out = capsys.readouterr().out
    rows = [line.split("|")[1:-1] for line in out.splitlines() if line.startswith(("| copy ", "| numpy/xp "))]
    assert len(rows) == 4 + 8  # the copy and each case, by threads (default, 1) and load (no load, load)
    settings = {(cells[1].strip(), cells[2].strip(), cells[3].strip()) for cells in rows}
    assert settings >= {(case, threads, load_) for case in ("constant", "dones+mask") for threads in ("default", "1")
                        for load_ in ("no load", "load")}
    for cells in rows:
        assert cells[4].strip().endswith(" ms") and float(cells[6]) > 0 and float(cells[7]) > 0
    assert "python -m gae_xp.bench.load " + " ".join(argv) in out
    left = [child for child in psutil.Process().children(recursive=True) if child.pid not in before]
    assert not left  # load's workers and busy processes are gone


def test_small_calls_prints_each_stage(capsys):
    assert small_calls.main(["--number", "5", "--repeat", "1"]) == 0
    out = capsys.readouterr().out
    for stage in ("gae() auto", "prepare: all of it", "backend chosen", "restore x2", "the rest"):
        assert out.count(stage) == 2  # constant and dones+mask
    assert small_calls.main(["--calls", "3"]) == 0


@pytest.mark.slow
def test_small_calls_times_a_first_call_on_an_empty_cache_and_then_on_the_written_one(capsys):
    pytest.importorskip("numba")
    assert small_calls.main(["--first-call", "--cases", "constant"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("CPU: ") and "load average" in out[0]
    rows = [line.split() for line in out[2:]]
    states = (["empty", "cache"], ["cache", "written"])
    assert [row[:5] for row in rows] == [[f"T={length}", "constant", contender, *state]
                                         for length in small_calls.FIRST_CALL_LENGTHS
                                         for contender in small_calls.CONTENDERS for state in states]
    for row in rows:
        wall, call, warm_up, cpu = float(row[5]), float(row[8]), float(row[14]), float(row[-2])
        assert 0 < call < wall and cpu > 0 and (warm_up > 0) == (row[2] == "warm_up") and call + warm_up < wall
