"""The GPU benchmark's baselines and bookkeeping, checked on the CPU against the float64 loop.

* the Triton program-per-row GAE (``tests/gpu/triton_gae.py``) under Triton's
  interpreter (``TRITON_INTERPRET=1``, torch CPU tensors);
* the thread-per-row numba-CUDA kernel (``tests/gpu/row_gae.py``) in numba's CUDA
  simulator (its own process: ``NUMBA_ENABLE_CUDASIM=1 python -m pytest -m cudasim
  tests/test_gpu_baselines.py``);
* the struct operator and the layout of the ``cuda.compute`` scan
  (``tests/gpu/cccl_gae.py``): cuda.compute itself cannot load without libcuda,
  so the scan is run here as a Python loop over the same pairs with the same
  operator;
* the benchmark's timing and reporting helpers (``tests/gpu/bench_gpu.py``).
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys

import numpy as np
import pytest
from helpers import load_gpu_module as load
from hypothesis import given, settings
from hypothesis import strategies as st

from gae_xp import reference

GAMMA, LAM = 0.99, 0.95


def expected(rewards, values, terminated=None):
    advantages, returns = reference.gae_loop(np.asarray(rewards, np.float64), np.asarray(values, np.float64),
                                             gamma=GAMMA, lam=LAM, terminated=terminated)
    return advantages, returns


def random_case(rows: int, length: int, seed: int, dones: bool):
    rng = np.random.default_rng(seed)
    rewards = rng.standard_normal((rows, length)).astype(np.float32)
    values = rng.standard_normal((rows, length)).astype(np.float32)
    terminated = rng.random((rows, length)) < 0.2 if dones else None
    return rewards, values, terminated


# ------------------------------------------------------------------------------------------------- Triton, per row

@pytest.fixture(scope="module")
def triton_gae():
    pytest.importorskip("torch")
    if importlib.util.find_spec("triton") is None and os.environ.get("GAE_XP_REQUIRE_PTX") != "1":
        pytest.skip("triton is not installed (pip install triton): its interpreter runs the kernel on the CPU")
    saved = os.environ.get("TRITON_INTERPRET")
    os.environ["TRITON_INTERPRET"] = "1"
    try:
        yield load("triton_gae")
    finally:
        if saved is None:
            os.environ.pop("TRITON_INTERPRET")
        else:
            os.environ["TRITON_INTERPRET"] = saved


@pytest.mark.parametrize("rows, length, block", [(1, 1, 16), (3, 16, 16), (2, 50, 16), (4, 37, 64), (2, 200, 32)])
@pytest.mark.parametrize("dones", [False, True])
def test_triton_per_row_matches_the_loop(triton_gae, rows, length, block, dones):
    import torch

    rewards, values, terminated = random_case(rows, length, rows * 1000 + length, dones)
    advantages, returns = triton_gae.gae(torch.from_numpy(rewards), torch.from_numpy(values), GAMMA, LAM,
                                         None if terminated is None else torch.from_numpy(terminated), block=block)
    want_a, want_r = expected(rewards, values, terminated)
    np.testing.assert_allclose(advantages.numpy(), want_a, rtol=1e-5, atol=2e-5)
    np.testing.assert_allclose(returns.numpy(), want_r, rtol=1e-5, atol=2e-5)


@settings(max_examples=8, deadline=None)
@given(rows=st.integers(1, 3), length=st.integers(1, 90), seed=st.integers(0, 2**16), dones=st.booleans())
def test_triton_per_row_property(triton_gae, rows, length, seed, dones):
    import torch

    rewards, values, terminated = random_case(rows, length, seed, dones)
    advantages, _ = triton_gae.gae(torch.from_numpy(rewards), torch.from_numpy(values), GAMMA, LAM,
                                   None if terminated is None else torch.from_numpy(terminated), block=16)
    np.testing.assert_allclose(advantages.numpy(), expected(rewards, values, terminated)[0], rtol=1e-5, atol=2e-5)


@pytest.mark.parametrize("rows, length, tile", [(1, 1, 16), (5, 16, 64), (7, 37, 256), (3, 200, 1024),
                                               (2, 2048, 1024)])
@pytest.mark.parametrize("dones", [False, True])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_triton_tiles_match_the_loop(triton_gae, rows, length, tile, dones, dtype):
    """Several rows a program (``tile // block``; a last program with fewer rows than its tile), float32 and
    bfloat16 stored, float32 computed: against the loop on the rounded inputs."""
    import torch

    rewards, values, terminated = random_case(rows, length, rows * 1000 + length, dones)
    rewards_t, values_t = (torch.from_numpy(x).to(getattr(torch, dtype)) for x in (rewards, values))
    advantages, returns = triton_gae.gae_tiles(rewards_t, values_t, GAMMA, LAM,
                                               None if terminated is None else torch.from_numpy(terminated), tile)
    assert advantages.dtype == returns.dtype == rewards_t.dtype
    want_a, want_r = expected(rewards_t.double().numpy(), values_t.double().numpy(), terminated)
    tolerance = {"float32": 2e-5, "bfloat16": 2e-2}[dtype] * max(1.0, float(np.abs(want_a).max(initial=0)))
    np.testing.assert_allclose(advantages.double().numpy(), want_a, rtol=0, atol=tolerance)
    np.testing.assert_allclose(returns.double().numpy(), want_r, rtol=0, atol=tolerance)


def test_triton_refuses_what_it_cannot_read(triton_gae):
    import torch

    with pytest.raises(ValueError, match="rewards must be a C-contiguous float32"):
        triton_gae.gae(torch.zeros((2, 4), dtype=torch.float64), torch.zeros((2, 4), dtype=torch.float64))
    with pytest.raises(ValueError, match="rows of at most 2048 steps, got 2049"):
        triton_gae.gae_tiles(torch.zeros((2, 2049)), torch.zeros((2, 2049)))
    with pytest.raises(ValueError, match="C-contiguous float32, bfloat16 or float16"):
        triton_gae.gae_tiles(torch.zeros((4, 2)).T, torch.zeros((2, 4)))


# -------------------------------------------------------------------------------------------- thread per row (sim)

@pytest.mark.cudasim
@pytest.mark.skipif(os.environ.get("NUMBA_ENABLE_CUDASIM") != "1", reason="needs NUMBA_ENABLE_CUDASIM=1 (own process)")
@pytest.mark.parametrize("rows, length", [(1, 1), (3, 9), (5, 17)])
@pytest.mark.parametrize("dones", [False, True])
def test_thread_per_row_matches_the_loop(rows, length, dones):
    pytest.importorskip("numba")
    row_gae = load("row_gae")
    rewards, values, terminated = random_case(rows, length, rows + 7 * length, dones)
    advantages, returns = row_gae.gae(rewards, values, GAMMA, LAM, terminated)
    want_a, want_r = expected(rewards, values, terminated)
    np.testing.assert_allclose(advantages, want_a, rtol=1e-5, atol=2e-5)
    np.testing.assert_allclose(returns, want_r, rtol=1e-5, atol=2e-5)


# ------------------------------------------------------------------------------------------- cuda.compute's operator

class Map:
    """A Python stand-in for the gpu_struct Pair: two fields, built positionally as compose builds it."""

    def __init__(self, a, b):
        self.a, self.b = float(a), float(b)


@settings(max_examples=50, deadline=None)
@given(st.lists(st.tuples(st.floats(-2, 2), st.floats(-10, 10)), min_size=3, max_size=3))
def test_cccl_operator_is_associative(triple):
    cccl_gae = load("cccl_gae")
    x, y, z = (Map(a, b) for a, b in triple)
    left = cccl_gae.compose(cccl_gae.compose(x, y), z)
    right = cccl_gae.compose(x, cccl_gae.compose(y, z))
    assert left.a == pytest.approx(right.a, rel=1e-9, abs=1e-9)
    assert left.b == pytest.approx(right.b, rel=1e-9, abs=1e-9)


@pytest.mark.parametrize("rows, length", [(1, 1), (3, 5), (4, 33)])
def test_cccl_layout_and_scan_give_gae(rows, length):
    """The pairs in scan order, scanned with the operator from the identity (as cuda.compute's inclusive scan
    does), unpacked: GAE for every row, nothing crossing from one row into the next."""
    torch = pytest.importorskip("torch")
    cccl_gae = load("cccl_gae")
    rewards, values, _ = random_case(rows, length, rows * 31 + length, False)
    coefficients, deltas = cccl_gae.pair_arrays(torch.from_numpy(rewards).double(),
                                                torch.from_numpy(values).double(), GAMMA, LAM)
    state, scanned = Map(1.0, 0.0), []
    for a, b in zip(coefficients.tolist(), deltas.tolist()):
        state = cccl_gae.compose(state, Map(a, b))
        scanned.append(state.b)
    advantages = cccl_gae.unpack(torch.tensor(scanned, dtype=torch.float64), rows, length)
    np.testing.assert_allclose(advantages.numpy(), expected(rewards, values)[0], rtol=1e-10, atol=1e-10)


# --------------------------------------------------------------------------------------------- the bench's helpers

@pytest.fixture(scope="module")
def bench():
    return load("bench_gpu")


@pytest.fixture
def on_the_cpu(bench, monkeypatch):
    """The benchmark's code run on the CPU (its dry run: the generic path stands in for the gae_xp routes)."""
    monkeypatch.setattr(bench.DEVICE, "name", "cpu")
    return bench


@pytest.fixture
def fake_triton(monkeypatch):
    """A stand-in ``gae_xp.backends.triton`` with two tuning variants; ``entered`` lists the settings of every
    ``tuned()`` block as it is entered."""
    import contextlib
    import types

    module = types.ModuleType("gae_xp.backends.triton")
    module.TUNING_VARIANTS = {"block 1024, 4 warps": {"block": 1024, "num_warps": 4, "num_stages": 2},
                              "block 4096, 8 warps": {"block": 4096, "num_warps": 8, "num_stages": 3}}
    module.entered = []

    @contextlib.contextmanager
    def tuned(**settings):
        module.entered.append(settings)
        yield

    module.tuned = tuned
    monkeypatch.setitem(sys.modules, "gae_xp.backends.triton", module)
    return module


def test_floor_bytes_agree_with_the_traffic_model(bench):
    from tools import traffic

    assert bench.FLOOR_BYTES["constant"] == traffic.FLOOR_BYTES == bench.floor_bytes("constant", "float32")
    assert bench.FLOOR_BYTES["dones+mask"] == traffic.FLOOR_BYTES + 2  # one byte per bool flag
    assert bench.floor_bytes("dones+mask", "bfloat16") == 4 * 2 + 2
    assert set(traffic.CASES) <= set(bench.CASES)


def test_spin_and_samples(bench):
    assert bench.spin_cycles(1e-6) == int(20e-6 * bench.SPIN_CLOCK_HZ)  # at least 20 us of spin
    assert bench.spin_cycles(1e-3) == int(2e-3 * bench.SPIN_CLOCK_HZ)  # twice the host's time
    assert bench.spin_cycles(10.0) == int(0.1 * bench.SPIN_CLOCK_HZ)  # capped
    assert bench.runs_for(1e-6) == 50 and bench.runs_for(1.0) == 3 and bench.runs_for(0.01) == 10


def test_shapes_are_the_issues(bench):
    """Issue 41's targets: 1.25x the copy at seven shapes, 1.6x at the few long rows; the trainer's shape first."""
    assert sorted(bench.SHAPES) == sorted([(38400, 128), (4096, 32), (32768, 128), (8192, 1024), (8192, 4096),
                                           (2048, 4096), (256, 131072), (16, 524288)])
    assert sorted(bench.TRAINER + bench.SHORT + bench.GRID + bench.SLIME) == sorted(bench.SHAPES)
    assert bench.SHAPES[0] == (38400, 128) and bench.FEW_LONG_ROWS in bench.SHAPES
    assert set(bench.COMPILE_SHAPES) <= set(bench.SHAPES)
    assert bench.DTYPES == ("float32", "bfloat16") and bench.CASES == ("constant", "terminated", "dones+mask")


def test_without_a_triton_route_there_are_no_variants_and_its_rows_say_why(on_the_cpu, monkeypatch):
    from gae_xp import backends
    from gae_xp.backends import _fallback

    bench = on_the_cpu
    monkeypatch.setitem(sys.modules, "gae_xp.backends.triton", None)  # importing it raises ImportError
    monkeypatch.delitem(backends._LOADED, "triton", raising=False)  # as in a process that never loaded it
    # the route's failure to import is remembered for the process: here, for this test only (the Triton tests
    # after it in this worker import the real module)
    monkeypatch.setattr(_fallback, "_BROKEN", {})
    monkeypatch.setattr(_fallback, "_ERRORS", {})
    assert bench.triton_variants() == {}
    assert not [path for path in bench.paths() if path.variant]
    inputs = bench.make_inputs((2, 8), "float32")
    monkeypatch.setattr(bench.DEVICE, "name", "cuda")  # the route itself, not the dry run's stand-in
    triton = next(path for path in bench.paths() if path.name == bench.TRITON_ROUTE)
    row = bench.measure((2, 8), "constant", "float32", triton, inputs, None, 1.0)
    assert row.device_ms is None and row.copy_ratio is None  # the row says why; the run goes on
    assert "import of gae_xp.backends.triton halted" in row.failed, row.failed
    assert "not run: " + row.failed in bench.markdown([row])


def test_each_tuning_variant_is_timed_inside_its_settings(on_the_cpu, fake_triton):
    bench = on_the_cpu
    assert bench.triton_variants() == fake_triton.TUNING_VARIANTS
    variants = [path for path in bench.paths() if path.variant]
    assert [path.variant for path in variants] == list(fake_triton.TUNING_VARIANTS)
    assert all(path.cases == ("constant",) and path.name.startswith(bench.TRITON_ROUTE) for path in variants)
    inputs = bench.make_inputs((3, 16), "float32")
    expected = bench.reference(inputs, "constant")
    copy = bench.copy_row((3, 16), "constant", "float32")
    rows = [bench.measure((3, 16), "constant", "float32", path, inputs, expected, copy.device_ms)
            for path in variants]
    assert all(not row.failed and row.error < 1e-6 and row.variant for row in rows), rows
    # every call of a variant, its warm-ups included, ran inside tuned() with that variant's settings
    seen = {tuple(sorted(settings.items())) for settings in fake_triton.entered}
    assert seen == {tuple(sorted(s.items())) for s in fake_triton.TUNING_VARIANTS.values()}
    assert len(fake_triton.entered) >= sum(2 + row.runs for row in rows)


def test_the_fastest_variant_per_shape_is_reported(bench):
    rows = [bench.Row((8192, 1024), "constant", f"{bench.TRITON_ROUTE} [a]", "float32", 0.040, variant="a",
                      copy_ratio=1.2),
            bench.Row((8192, 1024), "constant", f"{bench.TRITON_ROUTE} [b]", "float32", 0.035, variant="b",
                      copy_ratio=1.05),
            bench.Row((8192, 1024), "constant", bench.TRITON_ROUTE, "float32", 0.045, copy_ratio=1.3),
            bench.Row((8192, 1024), "constant", f"{bench.TRITON_ROUTE} [c]", "float32", failed="compile error",
                      variant="c")]
    best = bench.best_variants(rows)
    assert list(best) == [((8192, 1024), "float32")]
    fastest, default = best[(8192, 1024), "float32"]
    assert fastest.variant == "b" and default.device_ms == 0.045
    table = bench.markdown(rows)
    assert "| 8192x1024 | float32 | b | 35.0 | 1.05 | 45.0 |" in table


def test_markdown_lists_every_row_the_first_calls_and_the_skipped_shapes(bench):
    rows = [bench.Row((4096, 32), "constant", "copy", "float32", 0.002, 0.01, 5.0, 30, 1.0),
            bench.Row((4096, 32), "constant", bench.TRITON_ROUTE, "bfloat16", 0.0025, 0.03, 20.0, 10, 1.25,
                      error=1e-3),
            bench.Row((4096, 32), "terminated", "thread per row (numba-cuda)", failed="row_gae: ImportError")]
    new_t = [{"path": bench.TRITON_ROUTE, "shape": [1000, 77], "case": "constant", "first_ms": 0.5,
              "repeat_ms": 0.1}, {"path": bench.NUMBA_ROUTE, "shape": [1000, 77], "case": "constant",
                                  "failed": "ValueError: no GPU"}]
    table = bench.markdown(rows, skipped=[(32768, 128)], header="header", new_t=new_t)
    body = [line for line in table.splitlines() if line.startswith("| 4096x32 ")]
    assert len(body) == len(rows)
    assert "| 4096x32 | bfloat16 | constant | gae_xp triton (torch) | 2.5 | 1.25 | 30.0 | 20.0 | 1.0e-03 |" in table
    assert "not run: row_gae: ImportError" in table
    assert "| gae_xp triton (torch) | 1000x77 | constant | 0.50 | 0.10 |" in table
    assert "| gae_xp numba-cuda (torch) | 1000x77 | constant | not run: ValueError: no GPU | |" in table
    assert "Not run (over the time budget): 32768x128." in table


def test_a_dry_run_writes_its_tables_after_every_shape(on_the_cpu, fake_triton, tmp_path, monkeypatch):
    bench = on_the_cpu
    written = []
    real_write = bench.write
    monkeypatch.setattr(bench, "write", lambda out, info, rows, *rest: (written.append(len(rows)),
                                                                         real_write(out, info, rows, *rest)))
    assert bench.main(["--dry-run", "--shapes", "2x8,3x5", "--out", str(tmp_path)]) == 0
    assert len(written) == 3 and 0 < written[0] < written[1] == written[2]  # after each shape, then at the end
    result = json.loads((tmp_path / "bench_gpu.json").read_text())
    assert result["dry_run"] and result["skipped"] == [] and result["environment"]["triton variants"] == sorted(
        fake_triton.TUNING_VARIANTS)
    variant_rows = [row for row in result["rows"] if row["variant"]]
    assert len(variant_rows) == 2 * 2 * len(fake_triton.TUNING_VARIANTS)  # 2 shapes x 2 dtypes, constant case
    assert "DRY RUN" in (tmp_path / "bench_gpu.md").read_text()
