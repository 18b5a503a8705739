"""gae() against the float64 per-step loop, on every installed library and every backend that serves it."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import converted, expected, make_case, to_numpy, xp_assert_close

import gae_xp

CHUNKS = [1, 2, 7, 64, 128, 256, 1024]
DISCOUNTS = [0.0, 0.5, 0.99, 1.0]


def check(library, backend, case, *, axis=-1, dtype=None, **options):
    """gae() on the library's copies of the case, forced onto ``backend``, equals the float64 loop."""
    arrays = converted(library, case, dtype)
    advantages, returns = gae_xp.gae(**arrays, axis=axis, backend=backend, **options)
    want_a, want_r = expected(case, axis)
    xp_assert_close(advantages, want_a, like=arrays["rewards"])
    xp_assert_close(returns, want_r, like=arrays["rewards"])
    return advantages, returns


@pytest.mark.parametrize("chunk", CHUNKS)
@pytest.mark.parametrize("offset", [-1, 0, 1])
def test_lengths_around_the_chunk_size(library, backend, chunk, offset):
    length = max(chunk + offset, 0)
    check(library, backend, make_case(np.random.default_rng(chunk * 3 + offset), (3, length)), chunk_size=chunk)


@pytest.mark.parametrize("length", [0, 1, 1000])
@pytest.mark.parametrize("chunk", CHUNKS + [None])
def test_lengths_and_chunks(library, backend, length, chunk):
    case = make_case(np.random.default_rng(length), (2, length), dones=0.02, holes=0.1)
    check(library, backend, case, chunk_size=chunk)
    plain = {k: v for k, v in case.items() if k in ("rewards", "values", "gamma", "lam")}
    check(library, backend, plain, chunk_size=chunk)


@pytest.mark.parametrize("gamma", DISCOUNTS)
@pytest.mark.parametrize("lam", DISCOUNTS)
@pytest.mark.parametrize("time_varying", [False, True])
def test_discount_grid(library, backend, gamma, lam, time_varying):
    rng = np.random.default_rng(int(gamma * 100 + lam * 10))
    case = make_case(rng, (2, 300), gamma=gamma, lam=lam, dones=0.03 if time_varying else 0.0)
    check(library, backend, case, chunk_size=16)


@pytest.mark.parametrize("time_varying", [False, True])
def test_long_sequence(target, library, backend, time_varying):
    if target.max_elements < 2 * 65536:
        pytest.skip(f"{target} runs small arrays only (the CUDA simulator executes Python per thread)")
    case = make_case(np.random.default_rng(7), (2, 65536), dones=0.001 if time_varying else 0.0,
                     holes=0.2 if time_varying else 0.0)
    check(library, backend, case)


OPTIONS = {
    "terminated and truncated": dict(dones=0.05),
    "mask with holes": dict(holes=0.3),
    "right padding": dict(padding=40),
    "holes and padding and dones": dict(holes=0.2, padding=17, dones=0.05),
    "per-step gamma": dict(per_step_gamma=True),
    "per-row lam": dict(per_row_lam=True),
    "bootstrap value": dict(bootstrap=True),
    "bootstrap with holes": dict(bootstrap=True, holes=0.3, padding=5),
    "next values": dict(next_values=True, dones=0.05),
    "everything": dict(dones=0.05, holes=0.2, padding=9, per_step_gamma=True, per_row_lam=True, bootstrap=True),
    "decoupled lambda": dict(critic_lam=1.0, dones=0.05, holes=0.2),
    "per-step critic lambda": dict(per_step_critic_lam=True, per_row_lam=True, next_values=True, holes=0.1),
}


@pytest.mark.parametrize("option", OPTIONS)
@pytest.mark.parametrize("chunk", [None, 1, 7, 64])
def test_options(library, backend, option, chunk):
    check(library, backend, make_case(np.random.default_rng(len(option)), (3, 257), **OPTIONS[option]),
          chunk_size=chunk)


@pytest.mark.parametrize("shape, axis", [((300,), -1), ((4, 300), -1), ((2, 3, 300), -1),
                                         ((300, 4), 0), ((2, 300, 3), 1), ((2, 300, 3), -2)])
def test_leading_shapes_and_axis(library, backend, shape, axis):
    case = make_case(np.random.default_rng(len(shape)), shape, axis=axis, dones=0.02, holes=0.1,
                     per_step_gamma=True, bootstrap=True)
    check(library, backend, case, axis=axis, chunk_size=32)


def test_mask_all_false_gives_zeros(library, backend):
    case = make_case(np.random.default_rng(0), (2, 50))
    case["mask"] = np.zeros((2, 50), dtype=bool)
    advantages, returns = check(library, backend, case)
    assert np.all(to_numpy(advantages) == 0) and np.all(to_numpy(returns) == 0)


@pytest.mark.parametrize("time_varying", [False, True])
def test_fill_masked_gives_the_next_real_steps_advantage(library, backend, time_varying):
    case = make_case(np.random.default_rng(8), (2, 120), holes=0.3, padding=6, dones=0.05 if time_varying else 0.0)
    arrays = converted(library, case)
    advantages, returns = gae_xp.gae(**arrays, backend=backend, fill_masked=True)
    want_a, _ = expected(case)
    # A masked step carries the advantage of the next real step (0 after the last one), returns = that + V.
    want = np.zeros_like(want_a)
    for row in range(2):
        following = 0.0
        for t in reversed(range(120)):
            following = want_a[row, t] if case["mask"][row, t] else following
            want[row, t] = following
    xp_assert_close(advantages, want, like=arrays["rewards"])
    xp_assert_close(returns, want + case["values"], like=arrays["rewards"])


VIEWS = {  # a view of a (300, 8) array, and its time axis
    "transposed": (lambda a: a.T, -1),
    "strided": (lambda a: a[::2, ::2], 0),
    "offset": (lambda a: a[:, 1:], 0),
}


@pytest.mark.parametrize("view", VIEWS)
def test_non_contiguous_inputs(library, backend, view):
    pick, axis = VIEWS[view]
    rng = np.random.default_rng(3)
    base_r, base_v = rng.standard_normal((300, 8)), rng.standard_normal((300, 8))
    r, v = pick(library.asarray(base_r)), pick(library.asarray(base_v))
    advantages, returns = gae_xp.gae(r, v, axis=axis, chunk_size=16, backend=backend)
    want_a, want_r = expected({"rewards": pick(base_r), "values": pick(base_v)}, axis=axis)
    xp_assert_close(advantages, want_a, like=r)
    xp_assert_close(returns, want_r, like=r)


@pytest.mark.parametrize("dones", [0.0, 0.05])
def test_nan_in_masked_slots_changes_nothing(library, backend, dones):
    case = make_case(np.random.default_rng(11), (3, 200), holes=0.3, padding=10, dones=dones, bootstrap=True)
    clean_a, clean_r = check(library, backend, case)
    poisoned = dict(case)
    hole = ~case["mask"]
    for key, bad in (("rewards", np.nan), ("values", np.inf)):
        poisoned[key] = np.where(hole, bad, case[key])
    dirty_a, dirty_r = gae_xp.gae(**converted(library, poisoned), backend=backend)
    np.testing.assert_array_equal(to_numpy(dirty_a), to_numpy(clean_a))
    np.testing.assert_array_equal(to_numpy(dirty_r), to_numpy(clean_r))


@pytest.mark.parametrize("time_varying", [False, True])
@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_non_finite_travels_only_backwards_in_time(library, backend, time_varying, bad):
    case = make_case(np.random.default_rng(5), (2, 300), dones=0.02 if time_varying else 0.0)
    case["rewards"][0, 150] = bad
    advantages, _ = check(library, backend, case, chunk_size=64)
    got = to_numpy(advantages)
    assert np.all(np.isfinite(got[0, 151:])) and np.all(np.isfinite(got[1]))
    assert not np.isfinite(got[0, 150])


def test_inputs_are_not_modified(library, backend):
    case = make_case(np.random.default_rng(2), (3, 150), dones=0.1, holes=0.2, per_step_gamma=True,
                     next_values=True)
    arrays = converted(library, case)
    before = {k: to_numpy(v).copy() for k, v in arrays.items() if not isinstance(v, float)}
    for chunk in (None, 1, 16):
        for kwargs in (arrays, {k: v for k, v in arrays.items() if k in ("rewards", "values")}):
            gae_xp.gae(**kwargs, chunk_size=chunk, backend=backend)
            gae_xp.discounted_cumsum(kwargs["rewards"], 0.9, chunk_size=chunk, backend=backend)
    for key, value in before.items():
        np.testing.assert_array_equal(to_numpy(arrays[key]), value, err_msg=f"{key} was modified")


def test_auto_dispatch(library):
    check(library, "auto", make_case(np.random.default_rng(4), (2, 500), dones=0.02, holes=0.1))
