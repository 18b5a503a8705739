"""The fused numba-CUDA kernels in numba's CUDA simulator, against a float64 loop that follows the contract.

Run in a process of its own with ``NUMBA_ENABLE_CUDASIM=1`` (see ``.ci/run``);
skipped otherwise. Under the simulator a tile is 4 threads of 3 steps, so the
lengths below cover one partial tile, exact tiles, several tiles and more
tiles per row than the carry kernel has threads. The oracle cuts with
selects: nothing, NaN and inf included, crosses a done step or a zero
coefficient, and a masked step is the identity.
"""

from __future__ import annotations

import os
from types import SimpleNamespace

import numpy as np
import pytest
from helpers import make_case, xp_assert_close

import gae_xp
from gae_xp import reference

if os.environ.get("NUMBA_ENABLE_CUDASIM") != "1":
    pytest.skip("needs NUMBA_ENABLE_CUDASIM=1 before numba is imported (its own pytest run: .ci/run)",
                allow_module_level=True)

pytestmark = [
    pytest.mark.cudasim,
    pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning"),  # inf - inf in poisoned rows
]

BACKEND = "numba-cuda"
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


HOST = np.zeros(())  # results are NumPy arrays in host memory (the simulator's arrays)


def float64_loop(fill_masked=False, **case):
    """The float64 oracle on the case's values, whatever their dtype."""
    wide = {k: v.astype(np.float64) if isinstance(v, np.ndarray) and v.dtype.kind == "f" else v
            for k, v in case.items()}
    return reference.gae_loop(**wide, fill_masked=fill_masked)


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


@pytest.mark.parametrize("masked", [False, True])
def test_float16_in_float16_out_on_the_kernels(masked):
    """A problem whose arrays stay float16 (duck-typed, as the backend takes it): loads widened to float32 in
    registers, outputs rounded to float16 once."""
    import array_api_compat.numpy as xp

    from gae_xp import backends

    case = make_case(np.random.default_rng(9), (2, 37), holes=0.3 if masked else 0.0, dones=0.1, bootstrap=True)
    half = {k: v.astype(np.float16) if isinstance(v, np.ndarray) and v.dtype.kind == "f" else v
            for k, v in case.items()}
    problem = SimpleNamespace(xp=xp, rewards=half["rewards"], values=half["values"], gamma=0.99, lam=0.95,
                              bootstrap=half["bootstrap_value"][:, None], next_values=None,
                              terminated=case["terminated"], truncated=case["truncated"], mask=case.get("mask"),
                              fill_masked=False, extra={})
    advantages, returns = backends.load(BACKEND).gae(problem, chunk_size=None)
    want_a, want_r = float64_loop(**half)
    assert advantages.dtype == returns.dtype == np.float16
    xp_assert_close(advantages, want_a, like=HOST, dtype=np.float16)
    xp_assert_close(returns, want_r, like=HOST, dtype=np.float16)


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
    for got, want in zip(gae_xp.vtrace(log_rhos, case["rewards"], case["values"], gamma=0.9, **flags, backend=BACKEND),
                         reference.vtrace_loop(log_rhos, case["rewards"], case["values"], gamma=0.9, **flags)):
        xp_assert_close(got, want, like=HOST)
