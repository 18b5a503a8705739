"""The fused numba-CUDA kernels in numba's CUDA simulator, against a float64 loop that follows the contract.

Run in a process of its own with ``NUMBA_ENABLE_CUDASIM=1`` (see ``.ci/run``);
skipped otherwise. Under the simulator a tile is 4 threads of 3 steps, so the
lengths below cover one partial tile, exact tiles, several tiles and more
tiles per row than the carry kernel has threads. The oracle cuts with
selects: nothing, NaN and inf included, crosses a done step or a zero
coefficient, and a masked step is the identity.
"""

from __future__ import annotations

import numpy as np
import pytest
from cudasim import BACKEND, HOST, MARKS, float64_loop, require_simulator
from helpers import ListRefusing, make_case, xp_assert_close

import gae_xp
from gae_xp import reference

require_simulator()
pytestmark = MARKS

LENGTHS = [0, 1, 2, 11, 12, 13, 37]
OPTIONS = {
    "plain": {},
    "terminated and truncated": dict(dones=0.1),
    "mask with holes": dict(holes=0.3),
    "right padding": dict(padding=5),
    "holes, padding, dones": dict(holes=0.3, padding=4, dones=0.1),
    "per-step gamma, per-row lam": dict(per_step_gamma=True, per_row_lam=True),
    "bootstrap": dict(bootstrap=True),
    "bootstrap through holes": dict(bootstrap=True, holes=0.4, padding=3),
    "sparse mask": dict(holes=0.85, bootstrap=True, dones=0.05),
    "next values": dict(next_values=True, dones=0.1),
    "next values with holes": dict(next_values=True, holes=0.3, dones=0.1),
    "everything": dict(dones=0.1, holes=0.3, padding=4, per_step_gamma=True, per_row_lam=True, bootstrap=True),
}


@pytest.mark.parametrize("length", LENGTHS)
@pytest.mark.parametrize("option", OPTIONS)
def test_gae_matrix(option, length):
    case = make_case(np.random.default_rng(length + len(option)), (3, length), **OPTIONS[option])
    advantages, returns = gae_xp.gae(**case, backend=BACKEND)
    want_a, want_r = float64_loop(**case)
    assert advantages.dtype == np.float64
    xp_assert_close(advantages, want_a, like=HOST)
    xp_assert_close(returns, want_r, like=HOST)


@pytest.mark.parametrize("option", ["plain", "sparse mask", "everything", "next values with holes"])
def test_more_tiles_than_carry_threads(option):
    case = make_case(np.random.default_rng(7), (2, 100), **OPTIONS[option])
    for got, want in zip(gae_xp.gae(**case, backend=BACKEND), float64_loop(**case)):
        xp_assert_close(got, want, like=HOST)


@pytest.mark.parametrize("option", ["mask with holes", "holes, padding, dones", "next values with holes"])
def test_fill_masked(option):
    case = make_case(np.random.default_rng(3), (2, 37), **OPTIONS[option])
    for got, want in zip(gae_xp.gae(**case, fill_masked=True, backend=BACKEND), float64_loop(**case, fill_masked=True)):
        xp_assert_close(got, want, like=HOST)


@pytest.mark.parametrize("dtype", ["float16", "float32"])
@pytest.mark.parametrize("option", ["plain", "everything", "next values with holes"])
def test_narrow_dtypes_through_the_api(dtype, option):
    case = make_case(np.random.default_rng(5), (2, 37), **OPTIONS[option])
    narrow = {k: v.astype(dtype) if isinstance(v, np.ndarray) and v.dtype.kind == "f" else v for k, v in case.items()}
    want = float64_loop(**narrow)
    for got, exact in zip(gae_xp.gae(**narrow, backend=BACKEND), want):
        assert got.dtype == np.dtype(dtype)
        xp_assert_close(got, exact, like=HOST, dtype=np.dtype(dtype))


def narrow_problem(case, dtype):
    """A GaeProblem whose per-step arrays stay in a 16-bit dtype (as ``prepare`` leaves them for this backend)."""
    import array_api_compat.numpy as xp

    from gae_xp._problem import GaeProblem

    def narrow(name):
        value = case.get(name)
        return value.astype(dtype) if isinstance(value, np.ndarray) and value.dtype.kind == "f" else value

    return GaeProblem(xp=xp, rewards=narrow("rewards"), values=narrow("values"), gamma=case.get("gamma", 0.99),
                      lam=case.get("lam", 0.95), bootstrap=case["bootstrap_value"][:, None].astype(np.float32),
                      terminated=case.get("terminated"), truncated=case.get("truncated"), mask=case.get("mask"))


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("length", [37, 100])
@pytest.mark.parametrize("masked", [False, True])
def test_16_bit_floats_read_by_the_kernels(masked, length, dtype):
    """A problem whose arrays stay 16-bit: loads widened to float32 in registers (bfloat16 from its bits), outputs
    rounded to the problem's dtype once."""
    from gae_xp import backends

    ml_dtypes = pytest.importorskip("ml_dtypes")  # NumPy's bfloat16 (installed with jax)
    dtype = np.dtype(ml_dtypes.bfloat16) if dtype == "bfloat16" else np.dtype(dtype)
    case = make_case(np.random.default_rng(9), (2, length), holes=0.3 if masked else 0.0, dones=0.1, bootstrap=True)
    problem = narrow_problem(case, dtype)
    advantages, returns = backends.load(BACKEND).gae(problem, chunk_size=None)
    wide = {k: (problem.rewards if k == "rewards" else problem.values).astype(np.float64)
            if k in ("rewards", "values") else v for k, v in case.items()}
    want_a, want_r = float64_loop(**wide)
    assert advantages.dtype == returns.dtype == dtype
    # one rounding to the output's 8 (bfloat16) or 11 (float16) significant bits, on float32 arithmetic
    scale = 2.0 ** -7 if dtype.name == "bfloat16" else 2.0 ** -10
    for got, want in ((advantages, want_a), (returns, want_r)):
        np.testing.assert_allclose(got.astype(np.float64), want, rtol=scale, atol=scale * np.abs(want).max())


def test_bfloat16_to_float32_is_exact_on_every_pattern():
    from gae_xp.backends import _cuda_kernels

    ml_dtypes = pytest.importorskip("ml_dtypes")
    bits = np.arange(2**16, dtype=np.uint32).astype(np.uint16)
    want = bits.view(ml_dtypes.bfloat16).astype(np.float32)
    got = np.array([_cuda_kernels.bfloat16_to_float32(b) for b in bits], dtype=np.float32)
    np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))


def test_float32_to_bfloat16_rounds_to_nearest_even():
    """Every bfloat16 pattern widened, and nudged by every interesting low half (ties, one ulp either side), rounds
    as ml_dtypes (torch's rule: nearest, ties to even); NaN stays NaN with its sign."""
    from gae_xp.backends import _cuda_kernels

    ml_dtypes = pytest.importorskip("ml_dtypes")
    high = np.arange(2**16, dtype=np.uint32) << np.uint32(16)
    lows = np.array([0, 1, 0x7FFF, 0x8000, 0x8001, 0xFFFF], dtype=np.uint32)
    patterns = (high[:, None] | lows[None, :]).ravel()
    floats = patterns.view(np.float32)
    want = floats.astype(ml_dtypes.bfloat16).view(np.uint16)
    got = np.array([_cuda_kernels.float32_to_bfloat16(x) for x in floats], dtype=np.uint16)
    nan = np.isnan(floats)
    np.testing.assert_array_equal(got[~nan], want[~nan])
    back = got[nan].view(ml_dtypes.bfloat16).astype(np.float32)
    assert np.isnan(back).all() and np.array_equal(np.signbit(back), np.signbit(floats[nan]))


VIEWS = {  # a view of a (40, 6) array and its time axis
    "transposed": (lambda a: a.T, -1),
    "strided": (lambda a: a[::2, ::2], 0),
    "offset": (lambda a: a[:, 1:], 0),
    "time-major": (lambda a: a, 0),
}


@pytest.mark.parametrize("view", VIEWS)
def test_strided_inputs_and_broadcast_coefficients(view):
    pick, axis = VIEWS[view]
    rng = np.random.default_rng(11)
    base = {k: rng.standard_normal((40, 6)) for k in ("rewards", "values")}
    base["terminated"] = rng.random((40, 6)) < 0.1
    base["mask"] = rng.random((40, 6)) > 0.3
    case = {k: pick(v) for k, v in base.items()}
    steps = case["rewards"].shape[axis]
    gamma_shape = [1, 1]
    gamma_shape[axis] = steps
    case["gamma"] = rng.uniform(0.5, 1.0, gamma_shape)  # broadcast over rows: a stride-0 view inside gae()
    got = gae_xp.gae(**case, axis=axis, backend=BACKEND)
    moved = {k: np.moveaxis(v, axis, -1) for k, v in case.items()}
    for out, want in zip(got, float64_loop(**moved)):
        xp_assert_close(np.moveaxis(out, axis, -1), want, like=HOST)


@pytest.mark.parametrize("gamma_view", ["strided per-step gamma", "strided per-row lam, time-major"])
def test_broadcast_views_of_strided_coefficients(gamma_view):
    """A coefficient broadcast over rows (a zero stride) whose other stride is not contiguous: the simulator
    copies it in one piece, so it is made contiguous first, the broadcast kept."""
    rng = np.random.default_rng(12)
    case = make_case(rng, (3, 20), dones=0.1)
    if gamma_view == "strided per-step gamma":
        case["gamma"] = rng.uniform(0.5, 1.0, (1, 40))[:, ::2]  # (1, 20), stride 16: broadcast to (3, 20) inside
        axis = -1
    else:
        case = {k: v.T if isinstance(v, np.ndarray) else v for k, v in case.items()}  # (20, 3), time first
        case["lam"] = rng.uniform(0.0, 1.0, (1, 6))[:, ::2]  # (1, 3) per row, stride 16
        axis = 0
    got = gae_xp.gae(**case, axis=axis, backend=BACKEND)
    moved = {k: np.moveaxis(v, axis, -1) if isinstance(v, np.ndarray) else v for k, v in case.items()}
    for out, want in zip(got, float64_loop(**moved)):
        xp_assert_close(np.moveaxis(out, axis, -1), want, like=HOST)


def test_batch_of_several_axes():
    case = make_case(np.random.default_rng(12), (2, 3, 25), axis=1, holes=0.2, dones=0.1, bootstrap=True)
    got = gae_xp.gae(**case, axis=1, backend=BACKEND)
    moved = {k: np.moveaxis(v, 1, -1) if isinstance(v, np.ndarray) and v.ndim == 3 else v for k, v in case.items()}
    for out, want in zip(got, float64_loop(**moved)):
        xp_assert_close(np.moveaxis(out, 1, -1), want, like=HOST)


@pytest.mark.parametrize("where", [3, 12, 13, 25])
def test_nothing_crosses_a_termination(where):
    """r = [0 ... inf ...], terminated just before it, values 0: only the inf step is non-finite (the brief's
    example, [0, 0, 0, inf, 0, 0], placed inside a tile and at tile edges)."""
    rewards = np.zeros((1, 37))
    rewards[0, where] = np.inf
    terminated = np.zeros((1, 37), bool)
    terminated[0, where - 1] = True
    advantages, returns = gae_xp.gae(rewards, np.zeros((1, 37)), terminated=terminated, backend=BACKEND)
    want = np.zeros((1, 37))
    want[0, where] = np.inf
    np.testing.assert_array_equal(advantages, want)
    np.testing.assert_array_equal(returns, want)


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
@pytest.mark.parametrize("option", ["terminated and truncated", "holes, padding, dones", "next values with holes"])
@pytest.mark.parametrize("field", ["rewards", "values"])
def test_poison_stays_in_its_episode(bad, option, field):
    rng = np.random.default_rng(13)
    case = make_case(rng, (2, 37), **OPTIONS[option])
    real = case.get("mask", np.ones((2, 37), bool))
    for row in range(2):  # one poisoned real step per row
        steps = np.flatnonzero(real[row])
        case[field][row, steps[len(steps) // 2]] = bad
    for got, want in zip(gae_xp.gae(**case, backend=BACKEND), float64_loop(**case)):
        assert np.isfinite(want).any(), "the case should keep finite episodes"
        xp_assert_close(got, want, like=HOST)


def test_nan_in_masked_slots_changes_nothing():
    case = make_case(np.random.default_rng(17), (3, 37), holes=0.3, padding=4, dones=0.1, bootstrap=True,
                     next_values=False)
    clean = gae_xp.gae(**case, backend=BACKEND)
    hole = ~case["mask"]
    poisoned = dict(case, rewards=np.where(hole, np.nan, case["rewards"]),
                    values=np.where(hole, np.inf, case["values"]))
    for got, want in zip(gae_xp.gae(**poisoned, backend=BACKEND), clean):
        np.testing.assert_array_equal(got, want)


def test_nan_travels_as_far_back_as_the_serial_loop():
    """gamma * lam = 0.01: the products over a tile underflow float32, yet a NaN at the end reaches the start (only a
    true zero cuts), as in the serial loop."""
    rewards = np.zeros((1, 37), np.float32)
    rewards[0, -1] = np.nan
    advantages, _ = gae_xp.gae(rewards, np.zeros((1, 37), np.float32), gamma=0.1, lam=0.1, backend=BACKEND)
    assert np.isnan(advantages).all()


def test_inputs_are_kept_and_outputs_are_new():
    case = make_case(np.random.default_rng(19), (2, 37), holes=0.3, dones=0.1, next_values=True, per_step_gamma=True)
    before = {k: v.copy() for k, v in case.items() if isinstance(v, np.ndarray)}
    outputs = gae_xp.gae(**case, backend=BACKEND)
    for key, value in before.items():
        np.testing.assert_array_equal(case[key], value, err_msg=f"{key} was modified")
        assert not any(np.shares_memory(out, case[key]) for out in outputs)


@pytest.mark.parametrize("option", ["plain", "holes, padding, dones", "next values with holes", "bootstrap"])
def test_repeated_calls_of_a_layout_are_served_by_its_bound_plan(option):
    """The second call of a layout on the kernels binds its arrays into the first call's problem
    (``gae_xp._plans.BoundLayoutPlan``, no ``prepare``): the loop's numbers, the uncached call's bits."""
    from contextlib import nullcontext
    from unittest import mock

    from gae_xp import _plans, _prepare

    rng = np.random.default_rng(23)
    _plans.PLANS.clear()
    for served in (False, True):
        case = make_case(rng, (3, 13), **OPTIONS[option])
        with mock.patch.object(_prepare, "prepare", side_effect=AssertionError("prepare ran")) if served \
                else nullcontext():
            got = gae_xp.gae(**case, backend=BACKEND)
        for out, want in zip(got, float64_loop(**case)):
            xp_assert_close(out, want, like=HOST)
    (plan,) = _plans.PLANS._plans.values()
    assert type(plan) is _plans.BoundLayoutPlan
    with mock.patch.object(_plans, "gae_key", lambda *args: (None, None)):
        fresh = gae_xp.gae(**case, backend=BACKEND)
    for out, again in zip(got, fresh):
        np.testing.assert_array_equal(out, again)


@pytest.mark.parametrize("reverse", [True, False])
@pytest.mark.parametrize("kind", ["float", "per-step", "per-row", "with zeros", "negative"])
@pytest.mark.parametrize("length", [0, 1, 13, 37, 100])
def test_discounted_cumsum(reverse, kind, length):
    rng = np.random.default_rng(length)
    x = rng.standard_normal((2, length))
    discount = {
        "float": 0.97,
        "per-step": rng.uniform(0, 1, length),
        "per-row": rng.uniform(0, 1, (2, 1)),
        "with zeros": np.where(rng.random((2, length)) < 0.2, 0.0, 0.9),
        "negative": rng.uniform(-1, 1, (2, length)),
    }[kind]
    initial = rng.standard_normal(2)
    want = reference.discounted_cumsum_loop(x, discount, reverse=reverse, initial=initial)
    got = gae_xp.discounted_cumsum(x, discount, reverse=reverse, initial=initial, backend=BACKEND)
    xp_assert_close(got, want, like=HOST)


@pytest.mark.parametrize("reverse", [True, False])
def test_scan_cuts_non_finite_values_at_zero_coefficients(reverse):
    x = np.random.default_rng(23).standard_normal((2, 37))
    x[0, 20], x[1, 5] = np.inf, np.nan
    discount = np.where(np.arange(37) % 9 == 0, 0.0, 0.95)
    xp_assert_close(gae_xp.discounted_cumsum(x, discount, reverse=reverse, backend=BACKEND),
                    reference.discounted_cumsum_loop(x, discount, reverse=reverse), like=HOST)


def test_float16_scan_on_the_kernels():
    import array_api_compat.numpy as xp

    from gae_xp import backends

    x = np.random.default_rng(29).standard_normal((2, 37)).astype(np.float16)
    y = backends.load(BACKEND).scan(xp, x, 0.9, reverse=True, chunk_size=None)
    assert y.dtype == np.float16
    want = reference.discounted_cumsum_loop(x.astype(np.float64), 0.9, reverse=True)
    xp_assert_close(y, want, like=HOST, dtype=np.float16)


def test_estimators_on_the_scan_kernels():
    rng = np.random.default_rng(31)
    case = make_case(rng, (2, 37), holes=0.2, dones=0.1)
    flags = {k: case[k] for k in ("terminated", "truncated", "mask")}
    next_values = rng.standard_normal((2, 37))
    log_rhos = rng.normal(0, 0.3, (2, 37))
    xp_assert_close(gae_xp.discounted_returns(case["rewards"], gamma=0.9, **flags, backend=BACKEND),
                    reference.discounted_returns_loop(case["rewards"], gamma=0.9, **flags), like=HOST)
    xp_assert_close(gae_xp.lambda_returns(case["rewards"], next_values, gamma=0.9, lam=0.8, **flags, backend=BACKEND),
                    reference.lambda_returns_loop(case["rewards"], next_values, gamma=0.9, lam=0.8, **flags),
                    like=HOST)
    nearby = {"gamma": 0.9, "truncated_bootstrap": "next_step"}  # random truncations, no final observations
    for got, want in zip(gae_xp.vtrace(log_rhos, case["rewards"], case["values"], **nearby, **flags, backend=BACKEND),
                         reference.vtrace_loop(log_rhos, case["rewards"], case["values"], **nearby, **flags)):
        xp_assert_close(got, want, like=HOST)


# --- float32: the common dtype, computed in float32 -----------------------------------------------------------------


@pytest.mark.parametrize("length", [1, 13, 37, 100])
@pytest.mark.parametrize("option", ["plain", "holes, padding, dones", "next values with holes", "everything"])
def test_float32_matrix(option, length):
    case = make_case(np.random.default_rng(length), (3, length), dtype=np.float32, **OPTIONS[option])
    case = {k: v.astype(np.float32) if isinstance(v, np.ndarray) and v.dtype.kind == "f" else v
            for k, v in case.items()}
    advantages, returns = gae_xp.gae(**case, backend=BACKEND)
    want_a, want_r = float64_loop(**case)
    assert advantages.dtype == np.float32
    xp_assert_close(advantages, want_a, like=HOST, dtype=np.float32)
    xp_assert_close(returns, want_r, like=HOST, dtype=np.float32)


# --- tiles: whole rows per tile (one launch) and rows over many tiles (three) ------------------------------------


@pytest.mark.parametrize("shape", [(7, 1), (5, 2), (4, 5), (3, 12), (2, 13), (2, 40)])
def test_rows_share_tiles_or_span_them(shape):
    """A tile of the general kernels is 12 steps under the simulator: T = 1, 2, 5 put several rows in one tile
    (and a thread's steps cross rows), T = 12 one row per tile, T = 13 and 40 a row over 2 and 4 tiles. A
    critic_lam keeps the call on the general kernels (the lean kernels take the others)."""
    from gae_xp.backends import _cuda_plan

    plan = _cuda_plan.plan(*shape)
    assert plan.long_rows == (shape[1] > _cuda_plan.THREADS * _cuda_plan.ITEMS)
    case = make_case(np.random.default_rng(sum(shape)), shape, holes=0.3, dones=0.1, bootstrap=True, critic_lam=0.8)
    for got, want in zip(gae_xp.gae(**case, backend=BACKEND), float64_loop(**case)):
        xp_assert_close(got, want, like=HOST)


# --- packed sequences ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("case_name", ["plain", "empty sequences", "dones+holes", "per-step gamma", "next_values"])
@pytest.mark.parametrize("total, count", [(30, 6), (100, 9)])
@pytest.mark.parametrize("host", [False, True])
def test_packed_sequences(case_name, total, count, host):
    """Sequences ending inside tiles and spanning several, empty ones, per-sequence bootstrap values; the offsets
    given as an array or as a list (host offsets)."""
    from test_packed import CASES, make_packed, per_sequence

    offsets, case = make_packed(np.random.default_rng(total + count), (2,), total, count, **CASES[case_name])
    cu_seqlens = offsets.tolist() if host else offsets
    got = gae_xp.gae(**case, cu_seqlens=cu_seqlens, backend=BACKEND)
    for out, want in zip(got, per_sequence(reference.gae_loop, offsets, case)):
        xp_assert_close(out, want, like=HOST)


# --- every estimator on the fused kernels ----------------------------------------------------------------------


@pytest.mark.parametrize("length", [5, 37, 100])
@pytest.mark.parametrize("option", ["plain", "holes, padding, dones", "next values with holes"])
def test_vtrace_fused(option, length):
    rng = np.random.default_rng(length)
    case = make_case(rng, (2, length), bootstrap=option == "plain", **{k: v for k, v in OPTIONS[option].items()})
    log_rhos = rng.normal(0, 0.5, (2, length))
    keys = ("gamma", "lam", "terminated", "truncated", "mask", "next_values", "bootstrap_value", "truncated_bootstrap")
    kw = {k: case[k] for k in keys if k in case}
    kw["lam"] = 0.9
    got = gae_xp.vtrace(log_rhos, case["rewards"], case["values"], clip_rho_threshold=1.2, clip_c_threshold=0.9,
                        clip_pg_rho_threshold=1.1, **kw, backend=BACKEND)
    want = reference.vtrace_loop(log_rhos, case["rewards"], case["values"], clip_rho_threshold=1.2,
                                 clip_c_threshold=0.9, clip_pg_rho_threshold=1.1, **kw)
    for out, exact in zip(got, want):
        xp_assert_close(out, exact, like=HOST)


@pytest.mark.parametrize("length", [1, 13, 37, 100])
@pytest.mark.parametrize("option", ["plain", "holes, padding, dones", "per-step gamma, per-row lam"])
def test_lambda_and_discounted_returns_fused(option, length):
    rng = np.random.default_rng(length + 1)
    case = make_case(rng, (2, length), **OPTIONS[option])
    flags = {k: case[k] for k in ("gamma", "terminated", "truncated", "mask") if k in case}
    next_values = rng.standard_normal((2, length))
    bootstrap = rng.standard_normal(2)
    xp_assert_close(gae_xp.discounted_returns(case["rewards"], **flags, bootstrap_value=bootstrap, backend=BACKEND),
                    reference.discounted_returns_loop(case["rewards"], **flags, bootstrap_value=bootstrap), like=HOST)
    lam = case.get("lam", 0.8)
    xp_assert_close(gae_xp.lambda_returns(case["rewards"], next_values, lam=lam, **flags, backend=BACKEND),
                    reference.lambda_returns_loop(case["rewards"], next_values, lam=lam, **flags), like=HOST)


@pytest.mark.parametrize("holes", [0.0, 0.3])
def test_packed_estimators_fused(holes):
    from test_packed import make_packed, per_sequence

    offsets, case = make_packed(np.random.default_rng(3), (2,), 100, 9, holes=holes, dones=0.03, next_values=True)
    flags = {k: case[k] for k in ("terminated", "truncated", "mask") if k in case}
    bootstrap = np.random.default_rng(4).standard_normal((2, 9))
    got = gae_xp.discounted_returns(case["rewards"], gamma=0.9, **flags, bootstrap_value=bootstrap,
                                    cu_seqlens=offsets, backend=BACKEND)
    want = per_sequence(reference.discounted_returns_loop, offsets,
                        dict(rewards=case["rewards"], gamma=0.9, **flags, bootstrap_value=bootstrap))[0]
    xp_assert_close(got, want, like=HOST)
    got = gae_xp.lambda_returns(case["rewards"], case["next_values"], **flags, cu_seqlens=offsets, backend=BACKEND)
    want = per_sequence(reference.lambda_returns_loop, offsets,
                        dict(rewards=case["rewards"], next_values=case["next_values"], **flags))[0]
    xp_assert_close(got, want, like=HOST)


@pytest.mark.parametrize("length", [5, 37, 100])
@pytest.mark.parametrize("option", ["plain", "holes, padding, dones", "everything"])
@pytest.mark.parametrize("per_step", [False, True])
def test_critic_lam_in_the_same_launches(option, length, per_step):
    rng = np.random.default_rng(length + 2)
    case = make_case(rng, (2, length), **OPTIONS[option])
    critic_lam = rng.uniform(0.5, 1.0, (2, length)) if per_step else 1.0
    got = gae_xp.gae(**case, critic_lam=critic_lam, backend=BACKEND)
    for out, want in zip(got, reference.gae_loop(**case, critic_lam=critic_lam)):
        xp_assert_close(out, want, like=HOST)


# --- pieces: summaries and the fix-up ---------------------------------------------------------------------------


def prepared(case, cu_seqlens=None):
    from gae_xp import _prepare

    return _prepare.prepare(**case, cu_seqlens=cu_seqlens, backend=BACKEND).problem


@pytest.mark.parametrize("cuts", [None, [0, 5, 5, 20, 37], [0, 1, 2, 3, 30, 30, 37], [0, 0, 37, 37]])
@pytest.mark.parametrize("option", ["plain", "holes, padding, dones", "next values with holes", "sparse mask"])
@pytest.mark.parametrize("length", [8, 37])
def test_piece_summaries_and_fix_up(option, cuts, length):
    """Each segment's five numbers equal the generic path's (read off its scan); the fix-up with (b, c) entering
    every segment equals the float64 loop on each segment with those boundary values, whether it reruns all
    three launches (``gae`` with a carry) or only the last (``pieces(...).finish``)."""
    from gae_xp import _pieces, backends

    if cuts is not None and cuts[-1] != length:
        cuts = [min(c, length) for c in cuts]
    rng = np.random.default_rng(length + len(option))
    case = make_case(rng, (2, length), **OPTIONS[option])
    case.pop("bootstrap_value", None)
    p = prepared(case, cuts)
    kernels = backends.load(BACKEND)
    summary = kernels.summarize(p)
    xp_assert_close(summary, _pieces._summarize_on_scan(p, backends.load("xp").scan, None), like=HOST)
    n = summary.shape[-2]
    b, c = rng.standard_normal((2, n)), rng.standard_normal((2, n))
    offsets = np.array([0, length] if cuts is None else cuts)
    want = piecewise_loop(case, offsets, b, c)
    for got in (kernels.gae(p.replace(bootstrap=b, carry=c)), kernels.pieces(p).finish(b, c)):
        for out, exact in zip(got, want):
            xp_assert_close(out, exact, like=HOST)


@pytest.mark.parametrize("length", [0, 37])
def test_summaries_and_pieces_copy_no_list_to_the_device(length):
    """The summary starts from the identity map made on the device: asarray of a list would block torch CUDA."""
    from gae_xp import backends

    case = make_case(np.random.default_rng(length), (2, length), **OPTIONS["holes, padding, dones"])
    case.pop("bootstrap_value", None)
    p = prepared(case, [0, length // 3, length])
    kernels, refusing = backends.load(BACKEND), p.replace(xp=ListRefusing(p.xp))
    xp_assert_close(kernels.summarize(refusing), kernels.summarize(p), like=HOST)
    b, c = np.ones((2, 2)), np.zeros((2, 2))
    for got, want in zip(kernels.pieces(refusing).finish(b, c), kernels.pieces(p).finish(b, c)):
        xp_assert_close(got, want, like=HOST)


def piecewise_loop(case, offsets, bootstrap, carry):
    """The float64 loop per segment with its bootstrap value b and incoming advantage c. The loop has no carry, so
    one real step is appended to the segment: value b (so the segment's last real step sees V = b after it) and
    reward c + b with nothing after it (its delta, so its advantage, is c); with next_values, value 0 and reward c."""
    outputs = [np.zeros(case["rewards"].shape) for _ in range(2)]
    length = case["rewards"].shape[-1]
    for i in range(len(offsets) - 1):
        lo, hi = offsets[i], offsets[i + 1]
        if lo == hi:
            continue
        with_next = "next_values" in case
        appended = {"rewards": carry[:, i:i + 1] + (0.0 if with_next else bootstrap[:, i:i + 1]),
                    "values": np.zeros((2, 1)) if with_next else bootstrap[:, i:i + 1], "mask": np.ones((2, 1), bool)}
        piece = {key: np.concatenate([value[:, lo:hi], appended.get(key, np.zeros((2, 1), value.dtype))], axis=1)
                 if isinstance(value, np.ndarray) and value.shape[-1] == length else value
                 for key, value in case.items()}
        for out, part in zip(outputs, reference.gae_loop(**piece)):
            out[:, lo:hi] = part[:, :-1]
    return outputs


# --- the adjoint: gradients on the fused kernels ---------------------------------------------------------------

BACKWARD_CASES = {
    "plain": (None, {}),
    "dones and holes": (None, dict(holes=0.3, dones=0.1)),
    "packed, empty sequences": ([0, 5, 5, 20, 37], dict(holes=0.3, dones=0.1)),
    "next values": (None, dict(next_values=True, holes=0.3, dones=0.1)),
    "per-step gamma": ([0, 1, 2, 3, 30, 30, 37], dict(per_step_gamma=True, holes=0.2)),
    "fill_masked": (None, dict(holes=0.4, fill=True)),
    "critic_lam": (None, dict(holes=0.3, dones=0.1, critic=True)),
    "carry": ([0, 10, 37], dict(carry=True, holes=0.2)),
}


@pytest.mark.parametrize("length", [11, 37])
@pytest.mark.parametrize("name", BACKWARD_CASES)
def test_gae_backward_equals_autograd_through_the_generic_path(name, length):
    """gae_backward against torch.autograd through backend="xp" (float64, torch CPU): every input's gradient."""
    torch = pytest.importorskip("torch")
    from gae_xp import _prepare, backends
    from gae_xp.backends import solve_gae

    cuts, options = BACKWARD_CASES[name]
    options = dict(options)
    critic, fill, with_carry = (options.pop(key, False) for key in ("critic", "fill", "carry"))
    cuts = None if cuts is None else [min(c, length) for c in cuts]
    rng = np.random.default_rng(length + len(name))
    case = make_case(rng, (2, length), **options)
    count = 1 if cuts is None else len(cuts) - 1
    if "next_values" not in case:
        case["bootstrap_value"] = rng.standard_normal((2, count) if cuts else (2,))
    keywords = dict(cu_seqlens=cuts, fill_masked=fill, critic_lam=0.6 if critic else None)
    p = _prepare.prepare(**case, **keywords, backend=BACKEND).problem
    carry = rng.standard_normal((2, count)) if with_carry else None
    p = p.replace(carry=carry)
    upstream = rng.standard_normal((2, length)), rng.standard_normal((2, length))
    got = backends.load(BACKEND).gae_backward(p, *upstream)

    leaves = {k: torch.tensor(v, requires_grad=True) for k, v in case.items()
              if k in ("rewards", "values", "next_values", "bootstrap_value")}
    tensors = {k: torch.from_numpy(v) if isinstance(v, np.ndarray) else v for k, v in case.items()}
    generic = _prepare.prepare(**{**tensors, **leaves}, **keywords, backend="xp").problem
    if with_carry:
        leaves["carry"] = torch.tensor(carry, requires_grad=True)
        generic = generic.replace(carry=leaves["carry"])
    advantages, returns = solve_gae(generic, backends.load("xp"), None)
    ((advantages * torch.tensor(upstream[0])).sum() + (returns * torch.tensor(upstream[1])).sum()).backward()
    for mine, theirs in (("rewards", "rewards"), ("values", "values"), ("next_values", "next_values"),
                         ("bootstrap", "bootstrap_value"), ("carry", "carry")):
        if theirs in leaves:
            want = leaves[theirs].grad.numpy()
            xp_assert_close(np.reshape(got[mine], want.shape), want, like=HOST)
    assert {name for name, value in got.items() if value is not None} == {"rewards", "values", "bootstrap"} | (
        {"next_values"} & set(leaves)) | ({"carry"} if with_carry else set())


@pytest.mark.parametrize("name", ["dones and holes", "packed, empty sequences", "next values"])
def test_gradcheck_on_the_simulator(name):
    """torch.autograd.gradcheck (float64) of a torch Function whose forward is the kernels' gae and whose backward
    is their gae_backward: finite differences agree with the adjoint."""
    torch = pytest.importorskip("torch")
    from gae_xp import _prepare, backends

    kernels = backends.load(BACKEND)
    cuts, options = BACKWARD_CASES[name]
    rng = np.random.default_rng(len(name))
    length = 14  # two tiles under the simulator: the carries between tiles are differentiated too
    cuts = None if cuts is None else [min(c, length) for c in cuts]
    case = make_case(rng, (1, length), **options)
    count = 1 if cuts is None else len(cuts) - 1
    differentiable = ["rewards", "values", "next_values" if "next_values" in case else "bootstrap_value"]
    if "next_values" not in case:
        case["bootstrap_value"] = rng.standard_normal((1, count) if cuts else (1,))

    def problem(arrays):
        return _prepare.prepare(**{**case, **arrays}, cu_seqlens=cuts, backend=BACKEND).problem

    class Gae(torch.autograd.Function):
        @staticmethod
        def forward(ctx, *tensors):
            arrays = dict(zip(differentiable, (t.detach().numpy() for t in tensors)))
            ctx.arrays = arrays
            return tuple(torch.from_numpy(np.ascontiguousarray(out)) for out in kernels.gae(problem(arrays)))

        @staticmethod
        def backward(ctx, grad_a, grad_r):
            p = problem(ctx.arrays)
            grads = kernels.gae_backward(p, grad_a.numpy(), grad_r.numpy())
            names = {"bootstrap_value": "bootstrap"}
            return tuple(torch.from_numpy(np.reshape(grads[names.get(k, k)], ctx.arrays[k].shape).copy())
                         for k in differentiable)

    inputs = tuple(torch.tensor(case[k], requires_grad=True) for k in differentiable)
    assert torch.autograd.gradcheck(Gae.apply, inputs, fast_mode=True)


@pytest.mark.parametrize("offsets", [[0, 5, 13], [2, 5, 13], [0, 5, 9], [0, 5, 1000], [0, 9, 4, 13], [0, -3, 13]])
def test_unread_device_offsets_are_checked_on_the_device(offsets):
    """Device offsets that nobody read (``host_offsets`` None: traced, or given to the operator directly) are
    checked by the kernels' caller on the device: valid ones exact, others NaN in every output and gradient, and
    no kernel reads or writes outside its arrays (issue 30, case 1)."""
    from gae_xp import backends
    from gae_xp._problem import GaeProblem

    xp = gae_xp._prepare.namespace_of({"x": np.zeros(1)})
    rng = np.random.default_rng(len(offsets))
    r, v = rng.standard_normal((2, 13)), rng.standard_normal((2, 13))
    problem = GaeProblem(xp=xp, rewards=r, values=v, gamma=0.9, lam=0.8, bootstrap=np.zeros((2, len(offsets) - 1)),
                         offsets=np.asarray(offsets, dtype=np.int64))
    backend = backends.load(BACKEND)
    advantages, returns = backend.gae(problem, chunk_size=None)
    grads = backend.gae_backward(problem, np.ones_like(r), np.ones_like(r))
    valid = offsets[0] == 0 and offsets[-1] == 13 and all(a <= b for a, b in zip(offsets, offsets[1:]))
    if not valid:
        for out in (advantages, returns, grads["rewards"], grads["values"], grads["bootstrap"]):
            assert np.all(np.isnan(out))
        return
    for row in range(2):
        want = [np.concatenate(parts) for parts in zip(*(reference.gae_loop(r[row, lo:hi], v[row, lo:hi], gamma=0.9,
                                                                             lam=0.8)
                                                        for lo, hi in zip(offsets, offsets[1:])))]
        np.testing.assert_allclose(advantages[row], want[0], rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(returns[row], want[1], rtol=1e-12, atol=1e-12)


def test_group_moments_kernels_equal_the_segmented_sums():
    """backends/_cuda_groups.py's two launches (group_advantages' moments on CUDA arrays) against the library's
    segmented sums: shuffled hostile ids, NaN scores, equal groups exactly (v, 0), an index outside skipped."""
    import array_api_compat.numpy as xp

    from gae_xp import _segments

    rng = np.random.default_rng(61)
    for dtype in (np.float64, np.float32):
        scores = rng.normal(0, 1, 300).astype(dtype)
        scores[rng.random(300) < 0.1] = np.nan
        scores[:40] = dtype(0.1)  # one group of equal scores
        ids = np.concatenate([np.full(40, 2**62), rng.choice(np.array([-(2**40), -1, 0, 7, 2**31]), 260)])
        index = _segments.dense_index(xp, ids)
        got = _segments.cuda_group_moments(xp, scores, index, 300)
        want = _segments.generic_group_moments(xp, scores, index, 300, xp.float64)
        for a, b in zip(got, want):
            np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-12)
        equal = index[0]
        assert got[1][equal] == np.float64(dtype(0.1)) and got[2][equal] == 0.0
    count, _, _ = _segments.cuda_group_moments(xp, np.ones(4), np.array([0, -1, 5, 1]), 2)
    assert count.tolist() == [1.0, 1.0]


def test_consecutive_advantages_kernels_equal_the_float64_loop():
    """backends/_cuda_consecutive.py (group_advantages(scores, k) on CUDA arrays: one launch, two for
    scale="batch") against the float64 loop, every baseline x scale x unbiased: NaN scores, an equal group and
    a group of NaN exactly 0, groups of one, more groups than a block has threads (the batch's partials merged)."""
    import itertools

    import array_api_compat.numpy as xp

    from gae_xp.backends import _cuda_consecutive

    rng = np.random.default_rng(62)
    for k, groups, dtype in [(3, 300, np.float64), (1, 7, np.float64), (5, 40, np.float32)]:
        scores = rng.normal(0, 1, k * groups).astype(dtype)
        scores[rng.random(k * groups) < 0.1] = np.nan
        scores[:k] = dtype(0.1)  # a group of equal scores
        scores[-k:] = np.nan  # a group of NaN scores
        for baseline, scale, unbiased in itertools.product(gae_xp.groups.BASELINES, gae_xp.groups.SCALES,
                                                           [True, False]):
            options = dict(baseline=baseline, scale=scale, eps=1e-6, unbiased=unbiased)
            got = _cuda_consecutive.advantages(xp, scores, k, device="cpu", **options)
            want = reference.group_advantages_loop(scores.astype(np.float64), np.arange(k * groups) // k, **options)
            assert got.dtype == dtype
            rtol = 1e-12 if dtype == np.float64 else 1e-6
            np.testing.assert_allclose(got, want, rtol=rtol, atol=rtol, err_msg=str(options))
            assert np.all(got[-k:] == 0), options
            if baseline is not None and (k > 1 or scale != "batch"):
                assert np.all(got[:k] == 0), options


def test_consecutive_batch_scale_of_equal_scores_is_exactly_zero():
    """All N scores equal (0.1, not dyadic) over several blocks: the batch's M2 is exactly 0, so every baseline
    gives exactly 0 under scale="batch", as on every other route."""
    import array_api_compat.numpy as xp

    from gae_xp.backends import _cuda_consecutive

    for dtype in (np.float32, np.float64):
        scores = np.full(2 * 600, 0.1, dtype=dtype)
        for baseline in gae_xp.groups.BASELINES:
            got = _cuda_consecutive.advantages(xp, scores, 2, baseline=baseline, scale="batch", eps=1e-6,
                                               unbiased=True, device="cpu")
            assert np.all(got == 0), (dtype, baseline)


def test_consecutive_route_widens_float16_and_casts_back():
    """groups._cuda_consecutive (what group_advantages(scores, k) calls on CUDA arrays): float16 scores computed
    in float32 by the kernels, the answer float16, the input untouched and not shared."""
    from gae_xp import groups

    scores = np.random.default_rng(63).normal(0, 1, 4 * 9).astype(np.float16)
    scores[5] = np.nan
    before = scores.copy()
    options = dict(baseline="leave_one_out", scale="group", eps=1e-6, unbiased=True)
    got = groups._cuda_consecutive(groups._Call.prepare(scores, 4), **options)
    want = reference.group_advantages_loop(scores.astype(np.float64), np.arange(36) // 4, **options)
    assert got.dtype == np.float16 and not np.shares_memory(got, scores)
    np.testing.assert_array_equal(scores, before)
    np.testing.assert_allclose(got, want, rtol=2e-3, atol=2e-3)


def test_consecutive_route_on_infinite_scores_is_the_librarys():
    """An infinite score: the kernels give what the library's own route gives (NaN where it gives NaN), every
    baseline x scale."""
    import itertools

    import array_api_compat.numpy as xp

    from gae_xp.backends import _cuda_consecutive

    scores = np.array([1.0, np.inf, 0.5, 2.0, -np.inf, 3.0, 0.25, np.nan])
    for baseline, scale in itertools.product(gae_xp.groups.BASELINES, gae_xp.groups.SCALES):
        options = dict(baseline=baseline, scale=scale, eps=1e-6, unbiased=True)
        got = _cuda_consecutive.advantages(xp, scores, 2, device="cpu", **options)
        np.testing.assert_allclose(got, gae_xp.group_advantages(scores, 2, **options), rtol=1e-12, atol=1e-12,
                                   err_msg=str(options))


def test_consecutive_kernels_property():
    """Any k, any number of groups, scores drawn from few values (ties, equal groups) with NaN, any options: the
    kernels equal the float64 loop (hypothesis, few examples: the simulator runs every thread in Python)."""
    import array_api_compat.numpy as xp
    from hypothesis import given, settings
    from hypothesis import strategies as st

    from gae_xp.backends import _cuda_consecutive

    values = st.sampled_from([0.1, -0.1, 7.77, 1e6 + 0.5, 0.0, float("nan")])

    @settings(max_examples=15, deadline=None, database=None)
    @given(k=st.integers(1, 5), data=st.data(), baseline=st.sampled_from(gae_xp.groups.BASELINES),
           scale=st.sampled_from(gae_xp.groups.SCALES), unbiased=st.booleans(), eps=st.sampled_from([0.0, 1e-6]))
    def check(k, data, baseline, scale, unbiased, eps):
        groups = data.draw(st.integers(1, 12))
        scores = np.array(data.draw(st.lists(values, min_size=k * groups, max_size=k * groups)))
        options = dict(baseline=baseline, scale=scale, eps=eps, unbiased=unbiased)
        got = _cuda_consecutive.advantages(xp, scores, k, device="cpu", **options)
        want = reference.group_advantages_loop(scores, np.arange(k * groups) // k, **options)
        np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-9, err_msg=str(options))

    check()


# --- the arrays' own device: every allocation and launch of a call inside its context ---------------------------


def test_every_allocation_is_made_on_the_arrays_device(monkeypatch):
    """CuPy (and torch) allocate on their *current* device, whatever ``device=`` says once array-api-compat has
    checked it: a CuPy array on device 1 with device 0 current must get its outputs and scratch on device 1. A
    stand-in CuPy array (a NumPy subclass whose ``.device`` is a stand-in ``cupy.cuda.Device``) and a stand-in
    namespace record the current device at every allocation of every entry point."""
    import array_api_compat.numpy as base

    from gae_xp import _prepare
    from gae_xp.backends import numba_cuda

    current = ["device 0"]

    class Device:  # a stand-in cupy.cuda.Device: a context manager that makes it current
        def __init__(self, name):
            self.name = name

        def __enter__(self):
            self.saved, current[0] = current[0], self.name
            return self

        def __exit__(self, *exc):
            current[0] = self.saved

    class OnDevice1(np.ndarray):  # a stand-in CuPy array on device 1
        @property
        def device(self):
            return Device("device 1")

    allocations = []
    MAKERS = {"empty", "zeros", "ones", "full", "asarray", "empty_like", "zeros_like", "ones_like", "full_like",
              "astype", "concat", "stack", "where", "reshape"}

    class Recording:  # the namespace, recording the current device at every call that makes an array
        def __getattr__(self, name):
            function = getattr(base, name)
            if name not in MAKERS:
                return function

            def recorded(*args, **kwargs):
                allocations.append((name, current[0]))
                return function(*args, **kwargs)

            return recorded

    monkeypatch.setattr(numba_cuda, "is_cupy_array", lambda a: isinstance(a, OnDevice1))
    rng = np.random.default_rng(5)
    case = make_case(rng, (2, 37), holes=0.2, dones=0.1, bootstrap=True)
    p = _prepare.prepare(**case, critic_lam=0.5, backend=BACKEND).problem
    p = p.replace(xp=Recording(), rewards=p.rewards.view(OnDevice1), critic_lam=None)
    kernels = numba_cuda.BACKEND
    grads = rng.standard_normal((2, 2, 37))
    calls = {
        "gae": lambda: kernels.gae(p),
        "pieces": lambda: kernels.pieces(p).finish(rng.standard_normal((2, 1)), rng.standard_normal((2, 1))),
        "vtrace": lambda: kernels.solve_vtrace(p.replace(extra={"log_rhos": np.zeros((2, 37))}), clip_rho_threshold=1.0,
                                               clip_c_threshold=1.0, clip_pg_rho_threshold=1.0),
        "gae_backward with critic_lam": lambda: kernels.gae_backward(p.replace(critic_lam=0.5), *grads),
        "forward scan": lambda: kernels.scan(Recording(), p.rewards, rng.uniform(0, 1, (2, 37)), reverse=False),
    }
    for name, call in calls.items():
        allocations.clear()
        call()
        assert allocations, name
        assert all(where == "device 1" for _, where in allocations), (name, allocations)
        assert current[0] == "device 0", name  # the caller's current device is given back


def test_pieces_finish_waits_for_the_summary_and_keeps_its_maps(monkeypatch):
    """Pieces.finish may run on another stream than summarize: summarize records an event after its last launch,
    finish's launches wait on it first, and the maps they read are handed over as in use on the reading stream. The
    simulator has one stream, so stand-ins record the calls and their order."""
    from gae_xp import _prepare
    from gae_xp.backends import numba_cuda

    calls = []
    launch_kernel = numba_cuda._Launch.__call__
    monkeypatch.setattr(numba_cuda._Launch, "record", lambda self: calls.append("record") or "summary event")
    monkeypatch.setattr(numba_cuda._Launch, "wait", lambda self, event: calls.append(("wait", event)))
    monkeypatch.setattr(numba_cuda._Launch, "__call__",
                        lambda self, *args: calls.append("launch") or launch_kernel(self, *args))
    monkeypatch.setattr(numba_cuda, "_release_after_reading",
                        lambda owner, stream: calls.append(("release", owner is pieces._owner, stream)))
    case = make_case(np.random.default_rng(6), (2, 37), holes=0.2, dones=0.1)
    case.pop("truncated_bootstrap"), case.pop("truncated")
    p = _prepare.prepare(**case, backend=BACKEND).problem
    pieces = numba_cuda.BACKEND.pieces(p)
    assert calls == ["launch", "launch", "record"]  # tiles, carries, then the event
    calls.clear()
    b, c = np.zeros((2, 1)), np.zeros((2, 1))
    got = pieces.finish(b, c)
    assert calls == [("wait", "summary event"), "launch", ("release", True, 0)]
    for out, want in zip(got, numba_cuda.BACKEND.gae(p.replace(bootstrap=b, carry=c))):
        xp_assert_close(out, want, like=HOST)
