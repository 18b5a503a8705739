"""gae() against the float64 per-step loop, on every installed array library."""

from __future__ import annotations

import numpy as np
import pytest

import gae_xp
from helpers import assert_close, expected, make_case, to_namespace

CHUNKS = [1, 2, 7, 64, 128, 256, 1024]
DISCOUNTS = [0.0, 0.5, 0.99, 1.0]


def run(ns, case, axis=-1, dtype=None, **options):
    return ns.gae(**to_namespace(ns, case, dtype), axis=axis, **options)


@pytest.mark.parametrize("chunk", CHUNKS)
@pytest.mark.parametrize("offset", [-1, 0, 1])
def test_lengths_around_the_chunk_size(xp, chunk, offset):
    rng = np.random.default_rng(chunk * 3 + offset)
    length = max(chunk + offset, 0)
    case = make_case(rng, (3, length))
    advantages, returns = run(xp, case, chunk_size=chunk)
    want_a, want_r = expected(case)
    assert_close(xp, advantages, want_a)
    assert_close(xp, returns, want_r)


@pytest.mark.parametrize("length", [0, 1, 1000])
@pytest.mark.parametrize("chunk", CHUNKS + [None])
def test_lengths_and_chunks(xp, length, chunk):
    case = make_case(np.random.default_rng(length), (2, length), dones=0.02, holes=0.1)
    want_a, want_r = expected(case)
    plain = {k: v for k, v in case.items() if k in ("rewards", "values", "gamma", "lam")}
    plain_a, plain_r = expected(plain)
    advantages, returns = run(xp, case, chunk_size=chunk)
    assert_close(xp, advantages, want_a)
    assert_close(xp, returns, want_r)
    advantages, returns = run(xp, plain, chunk_size=chunk)
    assert_close(xp, advantages, plain_a)
    assert_close(xp, returns, plain_r)


@pytest.mark.parametrize("gamma", DISCOUNTS)
@pytest.mark.parametrize("lam", DISCOUNTS)
@pytest.mark.parametrize("time_varying", [False, True])
def test_discount_grid(xp, gamma, lam, time_varying):
    rng = np.random.default_rng(int(gamma * 100 + lam * 10))
    case = make_case(rng, (2, 300), gamma=gamma, lam=lam, dones=0.03 if time_varying else 0.0)
    advantages, returns = run(xp, case, chunk_size=16)
    want_a, want_r = expected(case)
    assert_close(xp, advantages, want_a)
    assert_close(xp, returns, want_r)


@pytest.mark.parametrize("time_varying", [False, True])
def test_long_sequence(xp, time_varying):
    if xp.max_elements < 2 * 65536:
        pytest.skip(f"{xp.id} runs small arrays only (the CUDA simulator executes Python per thread)")
    case = make_case(np.random.default_rng(7), (2, 65536), dones=0.001 if time_varying else 0.0,
                     holes=0.2 if time_varying else 0.0)
    advantages, returns = run(xp, case)
    want_a, want_r = expected(case)
    assert_close(xp, advantages, want_a)
    assert_close(xp, returns, want_r)


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
}


@pytest.mark.parametrize("option", OPTIONS)
@pytest.mark.parametrize("chunk", [None, 1, 7, 64])
def test_options(xp, option, chunk):
    case = make_case(np.random.default_rng(len(option)), (3, 257), **OPTIONS[option])
    advantages, returns = run(xp, case, chunk_size=chunk)
    want_a, want_r = expected(case)
    assert_close(xp, advantages, want_a)
    assert_close(xp, returns, want_r)


@pytest.mark.parametrize("shape, axis", [((300,), -1), ((4, 300), -1), ((2, 3, 300), -1),
                                         ((300, 4), 0), ((2, 300, 3), 1), ((2, 300, 3), -2)])
def test_leading_shapes_and_axis(xp, shape, axis):
    case = make_case(np.random.default_rng(len(shape)), shape, axis=axis, dones=0.02, holes=0.1,
                     per_step_gamma=True, bootstrap=True)
    advantages, returns = run(xp, case, axis=axis, chunk_size=32)
    want_a, want_r = expected(case, axis=axis)
    assert_close(xp, advantages, want_a)
    assert_close(xp, returns, want_r)


def test_mask_all_false_gives_zeros(xp):
    case = make_case(np.random.default_rng(0), (2, 50))
    case["mask"] = np.zeros((2, 50), dtype=bool)
    advantages, returns = run(xp, case)
    assert np.all(xp.to_numpy(advantages) == 0) and np.all(xp.to_numpy(returns) == 0)


VIEWS = {  # a view of a (300, 8) array, and its time axis
    "transposed": (lambda a: a.T, -1),
    "strided": (lambda a: a[::2, ::2], 0),
    "offset": (lambda a: a[:, 1:], 0),
}


@pytest.mark.parametrize("view", VIEWS)
def test_non_contiguous_inputs(xp, view):
    pick, axis = VIEWS[view]
    rng = np.random.default_rng(3)
    base_r, base_v = rng.standard_normal((300, 8)), rng.standard_normal((300, 8))
    advantages, returns = xp.gae(pick(xp.asarray(base_r)), pick(xp.asarray(base_v)), axis=axis, chunk_size=16)
    want_a, want_r = expected({"rewards": pick(base_r), "values": pick(base_v)}, axis=axis)
    assert_close(xp, advantages, want_a)
    assert_close(xp, returns, want_r)


@pytest.mark.parametrize("dones", [0.0, 0.05])
def test_nan_in_masked_slots_changes_nothing(xp, dones):
    rng = np.random.default_rng(11)
    case = make_case(rng, (3, 200), holes=0.3, padding=10, dones=dones, bootstrap=True)
    clean_a, clean_r = run(xp, case)
    poisoned = dict(case)
    hole = ~case["mask"]
    for key, bad in (("rewards", np.nan), ("values", np.inf)):
        poisoned[key] = np.where(hole, bad, case[key])
    dirty_a, dirty_r = run(xp, poisoned)
    np.testing.assert_array_equal(xp.to_numpy(dirty_a), xp.to_numpy(clean_a))
    np.testing.assert_array_equal(xp.to_numpy(dirty_r), xp.to_numpy(clean_r))


@pytest.mark.parametrize("time_varying", [False, True])
@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_non_finite_travels_only_backwards_in_time(xp, time_varying, bad):
    rng = np.random.default_rng(5)
    case = make_case(rng, (2, 300), dones=0.02 if time_varying else 0.0)
    case["rewards"][0, 150] = bad
    advantages, returns = run(xp, case, chunk_size=64)
    want_a, want_r = expected(case)
    got = xp.to_numpy(advantages)
    assert np.all(np.isfinite(got[0, 151:])) and np.all(np.isfinite(got[1]))
    assert not np.isfinite(got[0, 150])
    assert_close(xp, advantages, want_a)
    assert_close(xp, returns, want_r)


def test_inputs_are_not_modified(xp):
    case = make_case(np.random.default_rng(2), (3, 150), dones=0.1, holes=0.2, per_step_gamma=True,
                     next_values=True)
    converted = to_namespace(xp, case)
    before = {k: xp.to_numpy(v).copy() for k, v in converted.items() if not isinstance(v, float)}
    for chunk in (None, 1, 16):
        for kwargs in (converted, {k: v for k, v in converted.items() if k in ("rewards", "values")}):
            xp.gae(**kwargs, chunk_size=chunk)
            xp.discounted_cumsum(kwargs["rewards"], 0.9, chunk_size=chunk)
    for key, value in before.items():
        np.testing.assert_array_equal(xp.to_numpy(converted[key]), value, err_msg=f"{key} was modified")


@pytest.mark.parametrize("backend", ["auto", "xp"])
def test_auto_and_generic_dispatch(xp, backend):
    case = make_case(np.random.default_rng(4), (2, 500), dones=0.02, holes=0.1)
    advantages, returns = gae_xp.gae(**to_namespace(xp, case), backend=backend)
    want_a, want_r = expected(case)
    assert_close(xp, advantages, want_a)
    assert_close(xp, returns, want_r)
