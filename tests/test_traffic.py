"""The traffic model: bytes per element of the fused numba-CUDA path and of the generic path (recorded on torch)."""

from __future__ import annotations

import functools
import math
import os
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from tools import traffic


@pytest.mark.parametrize("case, bound, launches", [("constant", 24, 2), ("dones+mask", 28, 2)])
def test_fused_path_moves_at_most_the_bound(case, bound, launches):
    """Reads of r and V (and the flags) in launches 1 and 3, writes of A and R: 24 B/element, 28 with a bool
    terminated and mask. The per-chunk maps add a few bytes per row on top. Both cases take the lean kernels: 256
    rows are cut into chunks, read by the chunks' maps and the final pass (two launches)."""
    row = traffic.fused_row(case)
    assert row.launches == launches
    assert row.streamed_per_element <= bound
    assert row.bytes_per_element <= bound + 0.05
    assert row.predicted_ms == pytest.approx(row.bytes_per_element * math.prod(traffic.SHAPE) / 4.8e12 * 1e3)


def test_short_rows_take_one_launch():
    row = traffic.fused_row("dones+mask", shape=(1024, 2048))
    assert row.launches == 1
    assert row.streamed_per_element == 10 + 8  # one read of r, V and the two flags; the two outputs


def test_broadcast_coefficients_count_their_stored_bytes():
    shape = (256, 4096)
    rewards = np.empty(shape, np.float32)
    problem = SimpleNamespace(rewards=rewards, values=rewards, next_values=None,
                              gamma=np.broadcast_to(np.empty((1, 4096), np.float32), shape),
                              lam=0.95, terminated=None, truncated=None, mask=None)
    with_gamma = sum(streamed for streamed, _ in traffic.fused_launches(problem).values())
    problem.gamma = 0.99
    without = sum(streamed for streamed, _ in traffic.fused_launches(problem).values())
    assert with_gamma - without == 2 * 4096 * 4  # one row, read by launches 1 and 3


def test_recording_rule():
    torch = pytest.importorskip("torch")
    a, b = torch.ones(1000), torch.ones(1000)
    assert traffic.record_torch(lambda: a + b) == (1, 12_000, 0)
    assert traffic.record_torch(lambda: a.view(10, 100).t()) == (0, 0, 0)
    row = torch.ones(1, 100)
    assert traffic.record_torch(lambda: row.expand(10, 100) * 2.0) == (1, 400 + 4000, 0)
    assert traffic.record_torch(lambda: float(a.sum())) == (1, 4004, 1)


def test_report_compares_the_paths():
    pytest.importorskip("torch")
    rows = traffic.report(record_shape=(2, 8192))
    by = {(row.path, row.case): row for row in rows}
    for case in traffic.CASES:
        fused = by["numba-cuda (fused)", case]
        generic = by["xp (generic, on a GPU's route)", case]
        assert traffic.FLOOR_BYTES < fused.bytes_per_element < generic.bytes_per_element
        assert fused.launches <= 3 < generic.launches  # the fused path: at most three launches, whatever the options
    assert "not a measurement" in traffic.markdown(rows)


# ------------------------------------------------------------------------------------------ traffic read from the PTX

@pytest.fixture
def _ptx():
    """Skips a test that reads PTX where NVVM cannot compile (asked when the test runs, not at collection, which
    would import numba); GAE_XP_REQUIRE_PTX=1 (CI, once the toolkit wheels are in) turns the skip into a failure."""
    reason = _ptx_unavailable()
    if reason is not None:
        reason = f"{reason}; the PTX needs {traffic.PTX_NEEDS}"
        if os.environ.get("GAE_XP_REQUIRE_PTX") == "1":
            pytest.fail(f"GAE_XP_REQUIRE_PTX=1, but {reason}")
        pytest.skip(reason)


needs_ptx = pytest.mark.usefixtures("_ptx")
#: asked once per process (it compiles a one-line kernel)
_ptx_unavailable = functools.cache(traffic.ptx_unavailable)


def _strided_double():
    """The kernel y[i] = 2 x[2 i] (numba is imported here, not when the tests are collected)."""
    from gae_xp.backends._cuda_import import cuda

    def kernel(x, y, n):
        i = cuda.grid(1)
        if i < n:
            y[i] = x[i * 2] * 2.0
    return kernel


@needs_ptx
def test_the_ptx_runner_executes_a_kernel():
    """y[i] = 2 x[2 i] on 64 threads, 60 of them inside: every y written with the right value, x read at every
    other element, and the warps' requests: y coalesced (4 sectors for 32 floats), x over twice as many."""
    from gae_xp.backends import _cuda_import
    from tools import ptx

    source = _cuda_import.compile_ptx(_strided_double(), "void(float32[:], float32[:], int64)", (9, 0))
    x, y = np.zeros(128, np.float32), np.zeros(60, np.float32)
    program = ptx.load(source, [("x", x), ("y", y), ("n", 60)], fill={"x": lambda index: float(index)})
    accesses = ptx.run_block(program, (0, 0, 0), (64, 1, 1), (1, 1, 1))
    written = program.memory.regions[1].written
    assert {offset // 4: value for offset, value in written.items()} == {i: 4.0 * i for i in range(60)}
    moved = ptx.bytes_by_argument(accesses)
    assert moved["x"] == {"requested": 240, "read": 240, "written": 0, "widths": (4,)}
    assert moved["y"] == {"requested": 240, "read": 0, "written": 240, "widths": (4,)}
    sectors = ptx.sectors_per_request(accesses)
    assert sectors["y"][0] == sectors["y"][1]  # coalesced
    assert sectors["x"] == ((8 + 7) / 2, 4.0)  # stride 2: twice the sectors (7 for the 28 lanes of warp 2)


@needs_ptx
def test_the_ptx_runner_refuses_an_access_outside_every_argument():
    from gae_xp.backends import _cuda_import
    from tools import ptx

    source = _cuda_import.compile_ptx(_strided_double(), "void(float32[:], float32[:], int64)", (9, 0))
    program = ptx.load(source, [("x", np.zeros(8, np.float32)), ("y", np.zeros(8, np.float32)), ("n", 8)])
    with pytest.raises(ValueError, match="outside every argument"):  # x[2 i] runs past x's 8 elements
        ptx.run_block(program, (0, 0, 0), (8, 1, 1), (1, 1, 1))
    with pytest.raises(ValueError, match="parameter values"):
        ptx.load(source, [("x", np.zeros(8, np.float32)), ("n", 8)])


@needs_ptx
@pytest.mark.parametrize("case", traffic.CASES)
def test_ptx_traffic_matches_the_model(case):
    """Per launch, the bytes the compiled kernels move equal the hand-written model's, within the per-tile
    edges (the middle block stands for all here); each streamed array moves its itemsize per element."""
    length = 8192
    launches = traffic.ptx_launches(case, length=length, samples="middle")
    arrays = traffic.case_arrays(case, (1, length))
    problem = SimpleNamespace(rewards=arrays["rewards"], values=arrays["values"], next_values=None, gamma=0.99,
                              lam=0.95, terminated=arrays.get("terminated"), truncated=None, mask=arrays.get("mask"))
    model = traffic.fused_launches(problem)
    assert [launch.kernel.split("[")[0].split("_")[-1] for launch in launches] == list(model)
    for launch, (streamed, per_tile) in zip(launches, model.values()):
        assert launch.bytes_per_element == pytest.approx((streamed + per_tile) / length, abs=0.01)
        for name in ("rewards", "values", "advantages", "returns", "terminated", "mask"):
            moved = launch.read.get(name, 0) + launch.written.get(name, 0)
            if moved:
                assert moved / length == pytest.approx(arrays.get(name, arrays["rewards"]).itemsize, abs=0.01)


@needs_ptx
def test_ptx_of_a_short_row_is_one_launch():
    launches = traffic.ptx_launches("constant", length=1024, samples="middle")
    assert [launch.kernel for launch in launches] == ["lean_final[plain]"]
    assert launches[0].bytes_per_element == pytest.approx(16, abs=0.01)


def test_the_command_without_the_toolkit_says_what_to_install():
    """``python -m tools.traffic`` where the CUDA toolkit's libraries cannot be found (cuda.pathfinder, which
    numba-cuda loads them through, raising as it does without the toolkit wheels): one line naming what to
    install, and a non-zero exit, instead of the loader's traceback."""
    pytest.importorskip("cuda.pathfinder")
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[1]
    script = ("from cuda import pathfinder\n"
              "def missing(name):\n"
              "    raise pathfinder.DynamicLibNotFoundError(f'Failure finding lib{name}.so')\n"
              "pathfinder.load_nvidia_dynamic_lib = missing\n"
              "import runpy, sys\n"
              "sys.argv = ['tools.traffic']\n"
              "runpy.run_module('tools.traffic', run_name='__main__', alter_sys=True)\n")
    environment = {key: value for key, value in os.environ.items() if key != "NUMBA_ENABLE_CUDASIM"}
    done = subprocess.run([sys.executable, "-c", script], cwd=root, capture_output=True, text=True, timeout=300,
                          env=environment)
    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr and done.stdout == ""
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert 'pip install "numba-cuda[cu12]"' in lines[0] and "DynamicLibNotFoundError" in lines[0]


def test_fill_replaces_between_the_markers():
    begin, end = traffic.MARKERS["summary"]
    text = f"intro\n{begin}\nold table\n{end}\noutro"
    assert traffic.fill(text, {"summary": "new"}, ["summary"]) == f"intro\n{begin}\nnew\n{end}\noutro"
    with pytest.raises(ValueError, match="markers of the 'ptx' table are missing"):
        traffic.fill(text, {"ptx": "x"}, ["ptx"])


@needs_ptx
@pytest.mark.slow  # regenerates every table (tens of seconds); CI's full matrix runs it
def test_committed_pages_hold_the_generated_tables():
    """README.md and docs/gpu.md quote `python -m tools.traffic --write` of this commit (about a minute:
    the generic path is recorded on torch, the fused path's PTX run on the CPU)."""
    pytest.importorskip("torch")
    root = Path(__file__).resolve().parents[1]
    tables = traffic.pages()
    for document, names in traffic.DOCUMENTS.items():
        text = (root / document).read_text()
        assert traffic.fill(text, tables, names) == text, f"{document} is stale: python -m tools.traffic --write"


# ------------------------------------------------------------------ group_advantages' moments (backends/_cuda_groups)

@pytest.mark.parametrize("io", ["float32", "float64"])
@pytest.mark.parametrize("layout", ["consecutive", "ids"])
@needs_ptx
def test_group_ptx_traffic_matches_the_model(layout, io):
    """Every block of both launches run from their PTX: each argument moves exactly the model's distinct bytes
    (scores and index once per launch, each group's float64 slots once, read and written by the atomics)."""
    from tools import group_traffic

    n, k = 2048, 16
    launches = group_traffic.ptx_launches(layout, n, k=k, io=io)
    model = group_traffic.model(n, n // k, np.dtype(io).itemsize)
    assert [launch.kernel for launch in launches] == [f"groups_{name}[{io}]" for name in model]
    for launch, arguments in zip(launches, model.values()):
        assert set(launch.read) | set(launch.written) == set(arguments)
        assert {name: (launch.read.get(name, 0), launch.written.get(name, 0)) for name in arguments} == arguments


def test_group_model_counts_scores_index_and_slots():
    from tools import group_traffic

    model = group_traffic.model(16384, 1024)
    assert list(model) == ["count_and_sum", "centred_sums"]
    per_score = {launch: sum(r + w for r, w in arguments.values()) / 16384 for launch, arguments in model.items()}
    assert per_score == {"count_and_sum": 4 + 8 + 4 * 8 * 1024 / 16384, "centred_sums": 4 + 8 + 6 * 8 * 1024 / 16384}


def test_group_routes_count_their_launches():
    """The consecutive layout is exactly its fused launches (one; two for scale="batch"), no library operator;
    the arbitrary-ids route makes the two kernel launches (recorded, not run) besides its library operators;
    none reads a value back to the host."""
    pytest.importorskip("torch")
    pytest.importorskip("numba.cuda", reason="the routes import backends/_cuda_*.py (numba-cuda)")
    from tools import group_traffic

    consecutive, batch, ids = (group_traffic.route_row(layout, 4096) for layout in
                               ("consecutive", "consecutive-batch", "ids"))
    assert (consecutive.launches, consecutive.kernels, batch.launches, batch.kernels) == (1, 1, 2, 2)
    assert consecutive.bytes_per_element == 8  # float32 scores read once, advantages written once
    assert batch.bytes_per_element == 8 + 4 + 16 * 2 / 16 + 48 / 4096  # scores twice, (n, mean) per group
    assert (ids.kernels, consecutive.host_syncs, batch.host_syncs, ids.host_syncs) == (2, 0, 0, 0)
    assert ids.launches > ids.kernels
    assert ids.bytes_per_element > 2 * (4 + 8)  # both launches read the scores and the index


@pytest.mark.parametrize("scale", ["group", pytest.param("batch", marks=pytest.mark.slow)])
@needs_ptx
def test_consecutive_ptx_traffic_matches_the_model(scale):
    """Every block of the consecutive route's launches run from their PTX, more groups than a block has threads:
    each argument moves exactly the model's distinct bytes (the scores once per launch, the advantages written
    once, each group's (n, mean) and each block's partials once)."""
    from tools import group_traffic

    n, k = 600, 2
    launches = group_traffic.consecutive_ptx_launches(n, k, scale=scale)
    model = group_traffic.consecutive_model(n, k, 4, scale)
    assert [launch.kernel for launch in launches] == [f"groups_consecutive_{name}[float32]" for name in model]
    for launch, arguments in zip(launches, model.values()):
        got = {name: (launch.read.get(name, 0), launch.written.get(name, 0)) for name in arguments}
        assert got == arguments and set(launch.read) | set(launch.written) == set(arguments)
