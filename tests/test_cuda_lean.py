"""The lean numba-CUDA kernels (``backends/_cuda_lean.py``) in numba's CUDA simulator, against the float64 loop.

Run in a process of its own with ``NUMBA_ENABLE_CUDASIM=1`` (see ``.ci/run``);
skipped otherwise. Under the simulator a lean block is 4 threads of 2 steps
(a tile of 8 steps), and fewer than 4 row blocks cut rows into chunks, so the
shapes below cover T = 1, T below a tile (several rows per block, groups of
1, 2 and 4 threads), exact tiles, T not a multiple of the tile, several tiles
per row, and rows cut into 2 and 3 chunks. Every test checks that the call
took the lean kernels: the general kernels' launcher is replaced by one that
fails.
"""

from __future__ import annotations

import numpy as np
import pytest
from cudasim import BACKEND, HOST, MARKS, float64_loop, require_simulator
from helpers import make_case, xp_assert_close
from hypothesis import given
from hypothesis import strategies as st

import gae_xp

require_simulator()

from gae_xp.backends import _cuda_plan, numba_cuda  # noqa: E402  (after the simulator check)

pytestmark = MARKS

#: (rows, T): T = 1 (a block of single-step rows); T < a tile (groups of 2 and 4 threads), and T filling a group's
#: tile exactly (groups of 1 and 2 threads: the value after one group's tile must not land in the next group's
#: slots); a tile exactly; several tiles, T not a multiple; rows cut into chunks (3 rows: 2 chunks of 8; 1 row: 3
#: chunks of 16, the last partial).
SHAPES = [(5, 1), (6, 2), (5, 3), (5, 4), (3, 7), (4, 8), (4, 21), (3, 13), (1, 37), (2, 17)]
STRUCTURES = {
    "plain": {},
    "bootstrap": dict(bootstrap=True),
    "terminated and truncated": dict(dones=0.15, bootstrap=True),
    "next values": dict(next_values=True, dones=0.15),
    "per-step gamma, per-row lam": dict(per_step_gamma=True, per_row_lam=True, bootstrap=True),
    "everything": dict(per_step_gamma=True, per_row_lam=True, dones=0.15, next_values=True),
}
#: Masks, with next_values and without (the value chain: V at the next real step, across threads, tiles and chunks).
MASKED = {
    "holes": dict(holes=0.3, bootstrap=True),
    "holes, padding, dones": dict(holes=0.3, padding=2, dones=0.15, bootstrap=True),
    "sparse mask, per-step gamma": dict(holes=0.85, dones=0.05, per_step_gamma=True, per_row_lam=True,
                                        bootstrap=True),
    "holes with next values": dict(holes=0.4, next_values=True, dones=0.15),
}
#: Shapes of every plan kind for the fill_masked tests: groups of several rows, several tiles, 3 and 2 chunks.
FEW_SHAPES = [(5, 3), (4, 21), (1, 37), (2, 17)]


@pytest.fixture(autouse=True)
def general_kernels_refused(monkeypatch):
    """The general kernels' launcher fails: a test passes only through the lean kernels."""
    def refuse(*args, **kwargs):
        raise AssertionError("the general kernels ran where the lean kernels serve the problem")

    monkeypatch.setattr(numba_cuda, "_launch_forward", refuse)


def check(case, dtype=np.float64, **options):
    """gae() on the lean kernels against the float64 loop; inputs kept, outputs new (``options``: fill_masked)."""
    before = {k: v.copy() for k, v in case.items() if isinstance(v, np.ndarray)}
    got = gae_xp.gae(**case, **options, backend=BACKEND)
    for name, value in before.items():
        np.testing.assert_array_equal(case[name], value, err_msg=f"{name} was modified")
    assert not np.shares_memory(got[0], got[1])
    assert not any(np.shares_memory(out, v) for out in got for v in before.values())
    for out, want in zip(got, float64_loop(**case, **options)):
        xp_assert_close(out, want, like=HOST, dtype=np.dtype(dtype))


def test_the_shapes_cover_groups_tiles_and_chunks():
    """What SHAPES claims about the simulator's plans (so that a change of the constants cannot hollow the tests)."""
    plans = {shape: _cuda_plan.lean_plan(*shape) for shape in SHAPES}
    assert {p.threads // p.groups for p in plans.values()} >= {1, 2, 4}
    assert any(p.chunks == 1 and p.groups == 1 and p.length % (p.threads * _cuda_plan.LEAN_ITEMS) for p in
               plans.values())
    assert {p.chunks for p in plans.values()} >= {1, 2, 3}
    assert {p.threads // p.groups for p in plans.values() if p.groups > 1 and p.length == p.threads // p.groups
            * _cuda_plan.LEAN_ITEMS} >= {1, 2}


@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("structure", ["plain", "terminated and truncated", "everything"])
def test_every_shape(structure, shape):
    check(make_case(np.random.default_rng(sum(shape) + len(structure)), shape, **STRUCTURES[structure]))


@pytest.mark.parametrize("shape", [(5, 3), (4, 21), (1, 37)], ids=str)
@pytest.mark.parametrize("structure", STRUCTURES)
def test_every_structure(structure, shape):
    check(make_case(np.random.default_rng(sum(shape) + len(structure) + 1), shape, **STRUCTURES[structure]))


@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("structure", MASKED)
def test_masks(structure, shape):
    """A masked step is skipped (outputs 0, no discount across it) and, without next_values, V at the next real
    step bootstraps a step: the value chain, across threads, tiles and chunks (a chunk's map leaves the value
    entering it open until its last real step)."""
    check(make_case(np.random.default_rng(sum(shape) + len(structure) + 2), shape, **MASKED[structure]))


@pytest.mark.parametrize("shape", FEW_SHAPES, ids=str)
@pytest.mark.parametrize("structure", MASKED)
def test_fill_masked(structure, shape):
    """fill_masked: a masked step shows the advantage of the next real step (0 after the last one), and returns
    that plus its own value."""
    check(make_case(np.random.default_rng(sum(shape) + len(structure) + 3), shape, **MASKED[structure]),
          fill_masked=True)


@pytest.mark.parametrize("next_values", [False, True])
@pytest.mark.parametrize("masked", [slice(0, 16), slice(16, 32), slice(32, 37), slice(16, 37), slice(3, 34),
                                    slice(0, 37)], ids=str)
def test_whole_chunks_masked(masked, next_values):
    """(1, 37) is three chunks of 16, 16 and 5 steps: chunks with no real step (their map the identity, the value
    entering them passed through), a real step only in the first or the last chunk, a row with none."""
    case = make_case(np.random.default_rng(masked.start + masked.stop), (1, 37), dones=0.1,
                     next_values=next_values, bootstrap=not next_values)
    case["mask"] = np.ones((1, 37), dtype=bool)
    case["mask"][0, masked] = False
    assert _cuda_plan.lean_plan(1, 37).chunks == 3
    check(case)
    check(case, fill_masked=True)


@pytest.mark.parametrize("fill_masked", [False, True])
@pytest.mark.parametrize("shape", [(6, 2), (5, 3), (4, 8), (4, 21), (1, 37), (2, 17)], ids=str)
def test_the_value_chain_scans_only_where_a_thread_holds_no_real_step(shape, fill_masked):
    """The value chain's block scan runs only in a tile where a thread holding steps of it holds no real one (the
    block votes): masks real everywhere (no tile scans); a masked first step, and every third step from the middle
    (no scan but where a partial tile's or chunk's last thread holds that step alone); a masked last step (a scan
    where a partial tile's last thread holds it alone); a run of masked steps over one row's last tile but its
    last step, and over the middle of a row (threads with no real step: the block scans, its other rows all
    real)."""
    rows, length = shape
    rng = np.random.default_rng(rows * 100 + length)
    case = make_case(rng, shape, dones=0.1, bootstrap=True)
    case["mask"] = np.ones(shape, dtype=bool)
    check(case, fill_masked=fill_masked)
    tile = _cuda_plan.LEAN_THREADS * _cuda_plan.LEAN_ITEMS
    for row, masked in [(0, slice(0, 1)), (0, slice(length - 1, length)), (rows // 2, slice(length // 2, None, 3)),
                        (rows - 1, slice(max(length - tile, 0), length - 1)),
                        (rows // 2, slice(length // 3, length // 3 + 2 * _cuda_plan.LEAN_ITEMS + 1))]:
        case["mask"] = np.ones(shape, dtype=bool)
        case["mask"][row, masked] = False
        check(case, fill_masked=fill_masked)


@pytest.mark.parametrize("shape", [(4, 21), (1, 37)], ids=str)
def test_masked_steps_hold_nan_and_inf_unread(shape):
    case = make_case(np.random.default_rng(6), shape, holes=0.3, dones=0.1, bootstrap=True)
    case["rewards"] = np.where(case["mask"], case["rewards"], np.nan)
    case["values"] = np.where(case["mask"], case["values"], np.inf)
    advantages, returns = gae_xp.gae(**case, backend=BACKEND)
    assert np.isfinite(advantages).all() and np.isfinite(returns).all()
    assert (advantages[~case["mask"]] == 0).all() and (returns[~case["mask"]] == 0).all()
    check(case)


@pytest.mark.parametrize("dtype", ["float16", "float32"])
@pytest.mark.parametrize("structure", ["terminated and truncated", "everything"])
@pytest.mark.parametrize("shape", [(5, 3), (1, 37)], ids=str)
def test_narrow_dtypes(shape, structure, dtype):
    case = make_case(np.random.default_rng(4), shape, **STRUCTURES[structure])
    narrow = {k: v.astype(dtype) if isinstance(v, np.ndarray) and v.dtype.kind == "f" else v for k, v in case.items()}
    check(narrow, dtype)


@pytest.mark.parametrize("shape", [(4, 21), (1, 37), (2, 17)], ids=str)
def test_per_step_and_per_row_coefficients_of_every_step(shape):
    """gamma and lam given for every (row, step), and gamma per row: no broadcast view."""
    rng = np.random.default_rng(8)
    case = make_case(rng, shape, dones=0.1, bootstrap=True)
    case["gamma"] = rng.uniform(0.0, 1.0, shape)
    case["lam"] = rng.uniform(0.0, 1.0, shape)
    check(case)
    case["gamma"] = rng.uniform(0.0, 1.0, (shape[0], 1))
    check(case)


@pytest.mark.parametrize("next_values", [False, True])
@pytest.mark.parametrize("cut", [7, 8, 15, 16, 30])
def test_nan_and_inf_stop_at_a_cut(cut, next_values):
    """NaN and inf behind a terminated step (at a tile's or a chunk's edge, or inside one) never reach the steps
    before it; a NaN in front of it travels back as in the serial loop, through tiles and chunks."""
    rng = np.random.default_rng(cut)
    case = make_case(rng, (1, 37), next_values=next_values)
    case["terminated"] = np.zeros((1, 37), dtype=bool)
    case["terminated"][0, cut] = True
    case["truncated"] = np.zeros((1, 37), dtype=bool)
    case["truncated"][0, cut // 2] = True
    case["rewards"][0, cut + 1] = np.nan
    case["values"][0, cut + 1:] = np.inf
    if next_values:
        case["next_values"][0, cut:] = -np.inf
    else:
        case["truncated_bootstrap"] = "next_step"
    advantages, _ = gae_xp.gae(**case, backend=BACKEND)
    assert np.isfinite(advantages[0, :cut + 1]).all()
    check(case)
    case["rewards"][0, cut - 3] = np.nan  # behind the truncation at cut // 2 for small cuts, else before the cut
    check(case)


def test_a_zero_coefficient_cuts_and_an_underflow_does_not():
    """gamma lam = 0 at a step drops the NaN after it; products of coefficients that underflow float32 keep it."""
    case = make_case(np.random.default_rng(2), (1, 37), dtype=np.float32)
    case["rewards"][0, 36] = np.nan
    case["gamma"] = np.full((1, 37), 1e-10, dtype=np.float32)
    check(case, np.float32)
    case["gamma"][0, 20] = 0.0
    check(case, np.float32)


@given(rows=st.integers(1, 5), length=st.integers(1, 40), dones=st.sampled_from([0.0, 0.2]),
       next_values=st.booleans(), per_step=st.booleans(), bootstrap=st.booleans(),
       holes=st.sampled_from([0.0, 0.05, 0.3, 0.9]), fill_masked=st.booleans(), seed=st.integers(0, 2**16),
       dtype=st.sampled_from(["float32", "float64"]))
def test_property_against_the_float64_loop(rows, length, dones, next_values, per_step, bootstrap, holes, fill_masked,
                                           seed, dtype):
    case = make_case(np.random.default_rng(seed), (rows, length), dones=dones, next_values=next_values,
                     per_step_gamma=per_step, per_row_lam=per_step, bootstrap=bootstrap and not next_values,
                     holes=holes)
    check({k: v.astype(dtype) if isinstance(v, np.ndarray) and v.dtype.kind == "f" else v for k, v in case.items()},
          dtype, **({"fill_masked": True} if fill_masked and holes else {}))


def test_critic_lam_keeps_the_general_kernels(monkeypatch):
    """critic_lam (a second chain): lean_serves says no, and the general kernels solve it."""
    monkeypatch.undo()  # the general kernels allowed
    original = numba_cuda._launch_forward
    calls = []
    monkeypatch.setattr(numba_cuda, "_launch_forward", lambda *a, **k: calls.append(1) or original(*a, **k))
    case = make_case(np.random.default_rng(1), (2, 9), critic_lam=0.5)
    got = gae_xp.gae(**case, backend=BACKEND)
    assert calls
    for out, want in zip(got, float64_loop(**case)):
        xp_assert_close(out, want, like=HOST)
