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
import os
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gae_xp import reference

GPU_DIR = Path(__file__).parent / "gpu"
GAMMA, LAM = 0.99, 0.95


def load(name: str):
    """A module of tests/gpu, imported afresh (Triton reads TRITON_INTERPRET when it decorates a kernel)."""
    spec = importlib.util.spec_from_file_location(f"gpu_{name}", GPU_DIR / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


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


def test_triton_refuses_what_it_cannot_read(triton_gae):
    import torch

    with pytest.raises(ValueError, match="rewards must be a C-contiguous float32"):
        triton_gae.gae(torch.zeros((2, 4), dtype=torch.float64), torch.zeros((2, 4), dtype=torch.float64))


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


def test_floor_bytes_agree_with_the_traffic_model(bench):
    from tools import traffic

    assert bench.FLOOR_BYTES["constant"] == traffic.FLOOR_BYTES
    assert bench.FLOOR_BYTES["dones+mask"] == traffic.FLOOR_BYTES + 2  # one byte per bool flag
    assert set(traffic.CASES) <= set(bench.CASES)


def test_spin_and_samples(bench):
    assert bench.spin_cycles(1e-6) == int(20e-6 * bench.SPIN_CLOCK_HZ)  # at least 20 us of spin
    assert bench.spin_cycles(1e-3) == int(2e-3 * bench.SPIN_CLOCK_HZ)  # twice the host's time
    assert bench.spin_cycles(10.0) == int(0.1 * bench.SPIN_CLOCK_HZ)  # capped
    assert bench.runs_for(1e-6) == 50 and bench.runs_for(1.0) == 3 and bench.runs_for(0.01) == 30


def test_shapes_are_the_issues(bench):
    assert bench.GRID == [(8192, 1024), (8192, 2048), (8192, 4096), (2048, 4096), (16, 524288)]
    assert bench.SLIME == [(256, 131072)]
    assert bench.TRAINER == [(38400, 128)] and bench.SHAPES[0] == (38400, 128)  # issue 29's whole-call shape
    assert sorted(bench.SHORT) == sorted((b, t) for b in (4096, 32768) for t in (8, 32, 128))
    assert set(bench.COMPILE_SHAPES) <= set(bench.SHAPES)


def synthetic_rows(bench, fused_ms: float, triton_ms: float):
    rows = []
    for shape in bench.GRID + bench.SLIME:
        elements = shape[0] * shape[1]
        bandwidth = 4.0e12
        moved = 24 * elements / (fused_ms * 1e-3) / bandwidth
        rows.append(bench.Row(shape, "constant", "gae_xp fused (torch)", fused_ms, fused_ms + 0.01, 9.0, 10,
                              moved_share=moved))
        rows.append(bench.Row(shape, "constant", "triton, program per row", triton_ms, triton_ms, 5.0, 10))
    rows.append(bench.Row((256, 131072), "dones+mask", "gae_xp fused (torch)", 0.25, 0.26, 9.0, 10))
    rows.append(bench.Row((4096, 8), "constant", "gae_xp fused (torch)", 0.004, 0.030, 20.0, 10))
    rows.append(bench.Row((4096, 32), "constant", "thread per row (numba-cuda)", failed="row_gae: ImportError"))
    return rows


def test_verdicts_say_met_and_missed(bench):
    verdicts = bench.verdicts(synthetic_rows(bench, fused_ms=0.1, triton_ms=1.0))
    text = "\n".join(verdicts)
    assert "256x131072 constant fused: 0.100 ms (target <= 0.2 ms): met" in text
    assert "256x131072 dones+mask fused: 0.250 ms (target <= 0.23 ms): MISSED" in text
    assert "slime's published 18.4 ms / fused: 184x (target >= 90x): met" in text
    assert "16x524288 fused vs Triton per row: 10.00x (target >= 5x): met" in text
    assert "4096x8 fused full call: 30.0 us wall (target <= 25 us): MISSED" in text
    slow = "\n".join(bench.verdicts(synthetic_rows(bench, fused_ms=1.0, triton_ms=0.5)))
    assert "8192x1024 fused vs Triton per row: 0.50x (target > 1x): MISSED" in slow


def test_markdown_lists_every_row_and_the_skipped_shapes(bench):
    rows = synthetic_rows(bench, fused_ms=0.1, triton_ms=1.0)
    table = bench.markdown(rows, skipped=[(32768, 128)], header="header")
    body = [line for line in table.splitlines() if line.startswith("| ") and "---" not in line][1:]
    assert len(body) == len(rows)
    assert "not run: row_gae: ImportError" in table
    assert "Not run (over the time budget): 32768x128." in table
