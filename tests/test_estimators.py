"""discounted_returns, lambda_returns, vtrace and whiten against their float64 per-step loops, on every library."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import xp_assert_close
from hypothesis import given
from hypothesis import strategies as st

import gae_xp
from gae_xp import reference


def _case(rng, shape, dones, holes, padding):
    case = {"rewards": rng.standard_normal(shape)}
    if dones:
        case["terminated"] = rng.random(shape) < dones
        case["truncated"] = rng.random(shape) < dones
    if holes or padding:
        steps = np.arange(shape[-1])
        case["mask"] = (rng.random(shape) >= holes) & (steps < shape[-1] - padding)
    return case


def _converted(library, case):
    return {k: library.asarray(v) if isinstance(v, np.ndarray) else v for k, v in case.items()}


cases = st.tuples(st.integers(0, 2**32 - 1), st.sampled_from([(1,), (3,), (2, 2)]), st.integers(0, 90),
                  st.sampled_from([0.0, 0.1, 0.5]), st.sampled_from([0.0, 0.3]), st.integers(0, 5),
                  st.one_of(st.none(), st.integers(1, 40)), st.floats(0, 1), st.floats(0, 1))


@given(cases)
def test_discounted_returns(library, backend, drawn):
    seed, batch, length, dones, holes, padding, chunk, gamma, _ = drawn
    rng = np.random.default_rng(seed)
    case = _case(rng, batch + (length,), dones, holes, padding)
    bootstrap = rng.standard_normal(batch)
    want = reference.discounted_returns_loop(**case, gamma=gamma, bootstrap_value=bootstrap)
    got = gae_xp.discounted_returns(**_converted(library, case), gamma=gamma,
                                    bootstrap_value=library.asarray(bootstrap), chunk_size=chunk, backend=backend)
    xp_assert_close(got, want, like=library.asarray(case["rewards"]))


@given(cases)
def test_lambda_returns(library, backend, drawn):
    seed, batch, length, dones, holes, padding, chunk, gamma, lam = drawn
    rng = np.random.default_rng(seed)
    case = _case(rng, batch + (length,), dones, holes, padding)
    rewards, next_values = case.pop("rewards"), rng.standard_normal(batch + (length,))
    want = reference.lambda_returns_loop(rewards, next_values, **case, gamma=gamma, lam=lam)
    got = gae_xp.lambda_returns(library.asarray(rewards), library.asarray(next_values), **_converted(library, case),
                                gamma=gamma, lam=lam, chunk_size=chunk, backend=backend)
    xp_assert_close(got, want, like=library.asarray(rewards))


@given(cases, st.sampled_from([0.5, 1.0, 2.0]), st.sampled_from(["bootstrap", "next_values"]))
def test_vtrace(library, backend, drawn, clip, boundary):
    seed, batch, length, dones, holes, padding, chunk, gamma, lam = drawn
    rng = np.random.default_rng(seed)
    shape = batch + (length,)
    case = _case(rng, shape, dones, holes, padding)
    log_rhos, values = rng.normal(0, 0.7, shape), rng.standard_normal(shape)
    extra = {"bootstrap_value": rng.standard_normal(batch)} if boundary == "bootstrap" else {
        "next_values": rng.standard_normal(shape)}
    if "truncated" in case and boundary == "bootstrap":  # random truncations, no final observations
        extra["truncated_bootstrap"] = "next_step"
    options = dict(gamma=gamma, lam=lam, clip_rho_threshold=clip, clip_c_threshold=1.0, clip_pg_rho_threshold=clip)
    want_vs, want_pg = reference.vtrace_loop(log_rhos, case["rewards"], values, **options, **extra,
                                             **{k: v for k, v in case.items() if k != "rewards"})
    arrays = _converted(library, {**case, **extra})
    rewards = arrays.pop("rewards")
    got_vs, got_pg = gae_xp.vtrace(library.asarray(log_rhos), rewards, library.asarray(values), **options, **arrays,
                                   chunk_size=chunk, backend=backend)
    xp_assert_close(got_vs, want_vs, like=rewards)
    xp_assert_close(got_pg, want_pg, like=rewards)


def test_vtrace_on_policy_equals_gae_with_lam():
    # rho = 1 everywhere: vs - V is GAE's advantage with the same lam.
    rng = np.random.default_rng(0)
    r, v = rng.standard_normal((2, 300)), rng.standard_normal((2, 300))
    vs, _ = gae_xp.vtrace(np.zeros((2, 300)), r, v, gamma=0.97, lam=0.9)
    advantages, _ = gae_xp.gae(r, v, gamma=0.97, lam=0.9)
    np.testing.assert_allclose(vs - v, advantages, rtol=1e-10, atol=1e-10)


def test_lambda_one_returns_equal_discounted_returns_with_a_bootstrap():
    rng = np.random.default_rng(1)
    r, next_values = rng.standard_normal((2, 200)), rng.standard_normal((2, 200))
    got = gae_xp.lambda_returns(r, next_values, gamma=0.9, lam=1.0)
    want = gae_xp.discounted_returns(r, gamma=0.9, bootstrap_value=0.9 * next_values[:, -1] / 0.9)
    np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("unbiased", [True, False])
@pytest.mark.parametrize("shift_mean", [True, False])
def test_whiten(library, unbiased, shift_mean):
    rng = np.random.default_rng(2)
    x = rng.normal(3.0, 2.0, (4, 50))
    mask = rng.random((4, 50)) < 0.7
    poisoned = np.where(mask, x, np.nan)
    real = x[mask]
    mean, var = real.mean(), real.var(ddof=1 if unbiased else 0)
    want = (x - mean) / np.sqrt(var + 1e-8) + (0 if shift_mean else mean)
    got = gae_xp.whiten(library.asarray(poisoned), library.asarray(mask), unbiased=unbiased, shift_mean=shift_mean)
    xp_assert_close(got, np.where(mask, want, 0.0), like=library.asarray(x))
    whole = gae_xp.whiten(library.asarray(x), unbiased=unbiased, shift_mean=shift_mean)
    full_want = (x - x.mean()) / np.sqrt(x.var(ddof=1 if unbiased else 0) + 1e-8) + (0 if shift_mean else x.mean())
    xp_assert_close(whole, full_want, like=library.asarray(x))


def test_estimator_errors():
    r = np.zeros((2, 5))
    with pytest.raises(ValueError, match="gamma"):
        gae_xp.discounted_returns(r, gamma=1.5)
    with pytest.raises(ValueError, match="next_values"):
        gae_xp.lambda_returns(r, np.zeros((2, 4)))
    with pytest.raises(ValueError, match="clip_rho_threshold"):
        gae_xp.vtrace(r, r, r, clip_rho_threshold=0)
    with pytest.raises(ValueError, match="log_rhos"):
        gae_xp.vtrace(np.zeros(3), r, r)
    with pytest.raises(TypeError, match="mask"):
        gae_xp.whiten(r, np.ones((2, 5), dtype=complex))
    with pytest.raises(ValueError, match="eps"):
        gae_xp.whiten(r, eps=-1)


def _poisoned_case(rng, shape=(2, 120)):
    case = {"rewards": rng.standard_normal(shape), "values": rng.standard_normal(shape),
            "next_values": rng.standard_normal(shape), "log_rhos": rng.normal(0, 0.5, shape),
            "terminated": rng.random(shape) < 0.05, "mask": rng.random(shape) > 0.3}
    poisoned = {k: np.where(case["mask"], v, np.nan) if v.dtype.kind == "f" else v for k, v in case.items()}
    return case, poisoned


def _estimators(library, backend, c):
    """Every estimator on the arrays of c (converted to the library), as NumPy arrays."""
    to = {k: library.asarray(v) for k, v in c.items()}
    flags = {"terminated": to["terminated"], "mask": to["mask"]}
    outputs = [gae_xp.discounted_returns(to["rewards"], gamma=0.9, **flags, backend=backend),
               gae_xp.lambda_returns(to["rewards"], to["next_values"], gamma=0.9, lam=0.8, **flags, backend=backend),
               *gae_xp.vtrace(to["log_rhos"], to["rewards"], to["values"], gamma=0.9, **flags, backend=backend),
               gae_xp.whiten(to["rewards"], to["mask"])]
    return [library.to_numpy(out) for out in outputs]


def test_nan_in_masked_slots_changes_no_estimator(library, backend):
    clean, poisoned = _poisoned_case(np.random.default_rng(5))
    for got, want in zip(_estimators(library, backend, poisoned), _estimators(library, backend, clean)):
        np.testing.assert_array_equal(got, want)


def test_the_estimators_modify_no_input(library, backend):
    case, _ = _poisoned_case(np.random.default_rng(6))
    arrays = {k: library.asarray(v) for k, v in case.items()}
    before = {k: library.to_numpy(v).copy() for k, v in arrays.items()}
    flags = {"terminated": arrays["terminated"], "mask": arrays["mask"]}
    gae_xp.discounted_returns(arrays["rewards"], gamma=0.9, **flags, backend=backend)
    gae_xp.lambda_returns(arrays["rewards"], arrays["next_values"], **flags, backend=backend)
    gae_xp.vtrace(arrays["log_rhos"], arrays["rewards"], arrays["values"], **flags, backend=backend)
    gae_xp.whiten(arrays["rewards"], arrays["mask"])
    for key, value in before.items():
        np.testing.assert_array_equal(library.to_numpy(arrays[key]), value, err_msg=f"{key} was modified")
