"""The cost model (tools.cost_model): its fit on the measured H200 table, its counting (tools.sass), its page."""

from __future__ import annotations

import functools
import math
import os
import pickle
import subprocess
import sys
from pathlib import Path

import pytest

from tools import cost_model, sass

ROOT = Path(__file__).resolve().parents[1]

# ------------------------------------------------------------------------------------- the fit, on made-up rows

def _rows(rates: cost_model.Rates) -> list[cost_model.Row]:
    """Copies at four sizes and kernels of every balance between bytes and instructions, timed by ``rates``; two
    more rows held out with times no model gives."""
    rows = []
    for n, size in enumerate((2**22, 2**24, 2**26, 2**28)):
        launches = (cost_model.Launch("copy", size, 0.0),)
        rows.append(cost_model.Row("copy", (1, n), "constant", launches, rates.seconds(launches) * 1e3, True))
    for n, (moved, issued) in enumerate(((2**26, 1e9), (2**26, 1e11), (2**27, 3e11), (2**24, 1e12))):
        launches = (cost_model.Launch("kernel", moved, issued),) * (1 + n % 2)
        rows.append(cost_model.Row("kernel", (2, n), "constant", launches, rates.seconds(launches) * 1e3, True))
    for n in range(2):
        launches = (cost_model.Launch("kernel", 2**26, 1e11),)
        rows.append(cost_model.Row("kernel", (3, n), "constant", launches, 1e3 * (n + 1), False))
    return rows


@pytest.mark.parametrize("form", ["max", "sum"])
def test_the_fit_recovers_the_rates_that_made_the_rows(form):
    """Bandwidth and latency from the copies, the issue rate from the other rows fit; the held-out rows (times far
    off) change nothing, and ``choose`` picks the form that made the rows."""
    made = cost_model.Rates(4.0e12, 3.0e13, 5e-6, form)
    rows = _rows(made)
    rates, fitted = cost_model.fit(rows, form)
    assert rates.bandwidth == pytest.approx(made.bandwidth, rel=1e-9)
    assert rates.latency == pytest.approx(made.latency, rel=1e-9)
    assert rates.issue == pytest.approx(made.issue, rel=1e-6)
    assert all(abs(row.residual) < 1e-6 for row in fitted if row.calibrates)
    assert all(abs(row.residual) > 0.5 for row in fitted if not row.calibrates)
    chosen, _ = cost_model.choose(rows)
    assert chosen.form == form


def test_floor_bytes():
    assert cost_model.floor_bytes("constant", 4) == (8, 8)
    assert cost_model.floor_bytes("terminated", 4) == (9, 8)
    assert cost_model.floor_bytes("dones+mask", 2) == (6, 4)
    with pytest.raises(ValueError, match="case must be one of"):
        cost_model.floor_bytes("masked", 4)


def test_fill_replaces_between_the_markers():
    begin, end = cost_model.MARKERS["fit"]
    text = f"intro\n{begin}\nold\n{end}\noutro"
    assert cost_model.fill(text, {"fit": "new"}) == f"intro\n{begin}\nnew\n{end}\noutro"
    with pytest.raises(ValueError, match="markers of the 'predictions' table are missing"):
        cost_model.fill(text, {"predictions": "x"})


# ----------------------------------------------------------------------------------------- counting (tools.sass)

def _listing(lines: list[str]) -> tuple[tuple[int, str], ...]:
    return tuple((16 * n, line) for n, line in enumerate(lines))


def test_loops_are_read_from_backward_branches():
    """A walk (instructions 2-9) holding a scan loop with a barrier (4-6): the walk runs its trips, the scan its
    trips per trip of the walk; without scan loops (Triton) the outermost loop is the walk."""
    code = _listing(["LDC", "MOV", "LDG", "STS", "BAR.SYNC", "FADD", "BRA 0x40", "STG", "IADD", "BRA 0x20", "EXIT"])
    shape = sass.loops(code)
    assert shape == sass.Loops(total=11, walk=8, scans=(3,))
    assert sass.per_thread(shape, walk_trips=5, scan_trips=4) == 11 - 8 + 5 * (8 + 3 * 3)
    assert sass.per_step(code, items=8, scan_steps=4) == (8 + 3 * 3) / 8
    assert sass.loops(code, scan_loops=False) == sass.Loops(total=11, walk=8, scans=())
    flat = _listing(["LDG", "BAR.SYNC", "FADD", "BRA 0x10", "STG", "EXIT"])  # a scan loop, no walk around it
    assert sass.loops(flat) == sass.Loops(total=6, walk=0, scans=(3,))
    assert sass.per_thread(sass.loops(flat), walk_trips=1, scan_trips=8) == 6 + 7 * 3


# ------------------------------------------------------------------------------- the fit on the measured table

@pytest.fixture(scope="module")
def compilable():
    """Skipped where the kernels cannot be compiled, a failure under GAE_XP_REQUIRE_PTX=1 (CI, once the toolkit
    wheels are in)."""
    reason = _unavailable()
    if reason is not None:
        if os.environ.get("GAE_XP_REQUIRE_PTX") == "1":
            pytest.fail(f"GAE_XP_REQUIRE_PTX=1, but {reason}")
        pytest.skip(f"{reason}; the model needs triton and {cost_model._needs()}")


def compiled_apart(expression: str, directory: Path):
    """``expression`` of ``tools.cost_model`` evaluated in a process of its own without ``TRITON_INTERPRET`` (its
    value pickled through a file in ``directory``): the test run sets it (tests/conftest.py), and the kernels the
    model compiles (``tests/triton_ptx.py`` drops it) would otherwise be imported here as compiled ones, leaving
    the tests after this one without their interpreter."""
    environment = {key: value for key, value in os.environ.items() if key != "TRITON_INTERPRET"}
    path = directory / "value.pickle"
    script = (f"import pickle; from tools import cost_model; value = {expression}; "
              f"open({str(path)!r}, 'wb').write(pickle.dumps(value))")
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, env=environment, capture_output=True, text=True,
                          timeout=1800)
    assert done.returncode == 0, done.stderr[-3000:]
    return pickle.loads(path.read_bytes())


@pytest.fixture(scope="module")
def measured(compilable, tmp_path_factory):
    """Every measured row with its kernels compiled (about two minutes on a shared 2-core machine)."""
    return compiled_apart("cost_model.measured_rows()", tmp_path_factory.mktemp("measured"))


#: asked once per process (it compiles a one-line kernel)
_unavailable = functools.cache(cost_model.unavailable)


def test_the_calibration_reproduces_the_rows_it_was_fit_on(measured):
    """Every row the issue rate was fit on is modelled within ``FIT_RESIDUAL``, the copies within 2 %, and the
    rates are physical: a bandwidth below the H200's 4.8 TB/s, an issue rate within 2x of its peak (the count is
    static, so not exactly it). The held-out rows are modelled and reported, not fit."""
    rates, rows = cost_model.choose(measured)
    fitted = [row for row in rows if row.calibrates and row.path != "copy"]
    assert {row.path for row in fitted} == {"fused numba-CUDA (general kernels)", "tests/gpu/triton_gae.py"}
    for row in fitted:
        assert abs(row.residual) <= cost_model.FIT_RESIDUAL, (row.path, row.shape, row.case, row.residual)
    for row in rows:
        if row.path == "copy" and row.calibrates:
            assert abs(row.residual) <= 0.02, row
    peak = 132 * 4 * 32 * 1.98e9
    assert 3e12 < rates.bandwidth < 4.8e12 and peak / 2 < rates.issue < 2 * peak and 0 < rates.latency < 2e-5
    held = [row for row in rows if not row.calibrates]
    assert len(held) == len(rows) - len(fitted) - sum(row.path == "copy" and row.calibrates for row in rows)
    assert all(math.isfinite(row.model_ms) for row in held)
    table = cost_model.fit_table(rates, rows, cost_model.fit(measured, "sum" if rates.form == "max" else "max"))
    assert table.count("| held out |") == len(held) and table.count("| fit |") == len(rows) - len(held)


def test_the_general_kernels_are_modelled_by_their_instructions(measured):
    """The measured fused kernels were 7-12x a copy: in the model their instructions, not their bytes, set the
    time (what the bytes-only traffic model missed), and a T > 2048 row issues its steps twice (tiles, final)."""
    rates, rows = cost_model.choose(measured)
    for row in rows:
        if row.path.startswith("fused"):
            moved = sum(launch.bytes for launch in row.launches) / rates.bandwidth
            issued = sum(launch.instructions for launch in row.launches) / rates.issue
            assert issued > 3 * moved, row
    by = {(row.shape, row.case): row for row in rows if row.path.startswith("fused")}
    short, long = by[(8192, 2048), "constant"], by[(8192, 4096), "constant"]
    assert [len(short.launches), len(long.launches)] == [1, 3]


@pytest.mark.slow  # compiles every route's kernels at every target shape (minutes); CI's full matrix runs it
def test_committed_page_holds_the_generated_tables(compilable, tmp_path):
    """docs/gpu.md quotes `python -m tools.cost_model --write` of this commit (the tables made apart, as the rows
    are)."""
    tables = compiled_apart("cost_model.pages()", tmp_path)
    text = (ROOT / cost_model.DOCUMENT).read_text()
    assert cost_model.fill(text, tables) == text, "docs/gpu.md is stale: python -m tools.cost_model --write"
