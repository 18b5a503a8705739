"""rlax's own multistep and V-trace tests, restated against ``gae_xp.adapters.rlax`` with their hand-computed values.

Sources (google-deepmind/rlax, 0.1.9): rlax/_src/multistep_test.py (LambdaReturnsTest, DiscountedReturnsTest,
TDErrorTest, TruncatedGeneralizedAdvantageEstimationTest) and rlax/_src/vtrace_test.py (VTraceTest), with their
inputs, expected values and tolerances; rlax itself is not needed. rlax's tests vmap over the batch: here each row is
one call on every namespace, and JAX also runs them under jax.vmap and jax.jit as rlax's ``chex.all_variants`` does.
NStepBootstrappedReturnsTest is not restated: n-step returns are not a prefix scan and have no adapter. The last
test compares with rlax itself where it is installed.
"""

from __future__ import annotations

import functools

import numpy as np
import pytest

from conformance.frameworks import (
    categorical_importance_ratios,
    rlax_lambda_returns,
    rlax_vtrace,
    rlax_vtrace_td_error_and_advantage,
)
from gae_xp.adapters import rlax as adapter

R_T = np.array([[1.0, 0.0, -1.0, 0.0, 1.0], [0.5, 0.8, -0.7, 0.0, 2.1]])
DISCOUNT_T = np.array([[0.5, 0.9, 1.0, 0.5, 0.8], [0.9, 0.5, 0.3, 0.8, 0.7]])
V_T = np.array([[3.0, 1.0, 5.0, -5.0, 3.0], [-1.7, 1.2, 2.3, 2.2, 2.7]])


def _rows(library, fn, *batched, **kwargs):
    """fn on each row of the batched arguments (arrays of the namespace under test), stacked back to NumPy."""
    return np.stack([library.to_numpy(fn(*(library.asarray(a[i]) for a in batched), **kwargs))
                     for i in range(batched[0].shape[0])])


def _jax_variants(fn):
    """rlax's variants for JAX: vmap over the batch, with and without jit."""
    jax = pytest.importorskip("jax")
    return [jax.vmap(fn), jax.jit(jax.vmap(fn))]


# --- multistep_test.py -----------------------------------------------------------------------------------------

LAMBDA_RETURNS = np.array([[1.6460547, 0.72281253, 0.7375001, 0.6500001, 3.4],
                           [0.7866317, 0.9913063, 0.1101501, 2.834, 3.99]])


def test_lambda_returns_batch(library):
    """LambdaReturnsTest.test_lambda_returns_batch: lambda 0.75, rtol 1e-5."""
    got = _rows(library, adapter.lambda_returns, R_T, DISCOUNT_T, V_T, lambda_=0.75)
    np.testing.assert_allclose(LAMBDA_RETURNS, got, rtol=1e-5)


def test_lambda_returns_batch_jax_variants():
    for variant in _jax_variants(functools.partial(adapter.lambda_returns, lambda_=0.75)):
        np.testing.assert_allclose(LAMBDA_RETURNS, variant(R_T, DISCOUNT_T, V_T), rtol=1e-5)


DISCOUNTED_RETURNS = np.array([[1.315, 0.63000005, 0.70000005, 1.7, 3.4],
                               [1.33592, 0.9288, 0.2576, 3.192, 3.9899998]])


def test_discounted_returns_batch(library):
    """DiscountedReturnsTest.test_discounted_returns_batch: a scalar bootstrap and a value sequence, rtol 1e-5."""
    bootstrap_v = V_T[:, -1]
    scalar = np.stack([library.to_numpy(adapter.discounted_returns(
        library.asarray(R_T[i]), library.asarray(DISCOUNT_T[i]), float(bootstrap_v[i]))) for i in range(2)])
    vector = _rows(library, adapter.discounted_returns, R_T, DISCOUNT_T, V_T)
    np.testing.assert_allclose(DISCOUNTED_RETURNS, scalar, rtol=1e-5)
    np.testing.assert_allclose(DISCOUNTED_RETURNS, vector, rtol=1e-5)
    for variant in _jax_variants(adapter.discounted_returns) if library.name == "jax:cpu" else []:
        np.testing.assert_allclose(DISCOUNTED_RETURNS, variant(R_T, DISCOUNT_T, bootstrap_v), rtol=1e-5)


def test_importance_corrected_td_errors_batch(library):
    """TDErrorTest: the recursion on deltas equals rho (lambda return with lambda_t = rho_{t+1}) - v; rho up to 2."""
    rho_tm1 = np.array([[0.5, 0.9, 1.3, 0.2, 0.8], [2., 0.1, 1., 0.4, 1.7]])
    values = np.array([[3.0, 1.0, 5.0, -5.0, 3.0, 1.], [-1.7, 1.2, 2.3, 2.2, 2.7, 2.]])
    td_direct = _rows(library, adapter.importance_corrected_td_errors, R_T, DISCOUNT_T, rho_tm1,
                      np.ones_like(DISCOUNT_T), values)
    ls_ = np.concatenate((rho_tm1[:, 1:], [[1.], [1.]]), axis=1)
    td_from_returns = rho_tm1 * (_rows(library, adapter.lambda_returns, R_T, DISCOUNT_T, values[:, 1:], ls_)
                                 - values[:, :-1])
    np.testing.assert_allclose(td_direct, td_from_returns, rtol=1e-5)


GAE_R_T = np.array([[0., 0., 1., 0., -0.5], [0., 0., 0., 0., 1.]])
GAE_V_T = np.array([[1., 4., -3., -2., -1., -1.], [-3., -2., -1., 0.0, 5., -1.]])
GAE_DISCOUNT_T = np.array([[0.99, 0.99, 0.99, 0.99, 0.99], [0.9, 0.9, 0.9, 0.0, 0.9]])
GAE_EXPECTED = {
    1.0: np.array([[-1.45118, -4.4557, 2.5396, 0.5249, -0.49], [3., 2., 1., 0., -4.9]]),
    0.7: np.array([[-0.676979, -5.248167, 2.4846, 0.6704, -0.49], [2.2899, 1.73, 1., 0., -4.9]]),
    0.4: np.array([[0.56731, -6.042, 2.3431, 0.815, -0.49], [1.725, 1.46, 1., 0., -4.9]]),
}


@pytest.mark.parametrize("lambda_", [1.0, 0.7, 0.4])
def test_truncated_gae(library, lambda_):
    """TruncatedGeneralizedAdvantageEstimationTest.test_truncated_gae: atol 1e-3."""
    got = _gae_rows(library, lambda_)
    np.testing.assert_allclose(GAE_EXPECTED[lambda_], got, atol=1e-3)


def _gae_rows(library, lambda_):
    return np.stack([library.to_numpy(adapter.truncated_generalized_advantage_estimation(
        library.asarray(GAE_R_T[i]), library.asarray(GAE_DISCOUNT_T[i]), lambda_, library.asarray(GAE_V_T[i])))
        for i in range(2)])


def test_truncated_gae_array_lambda(library):
    """TruncatedGeneralizedAdvantageEstimationTest.test_array_lambda: scalar 0.9 = an array of 0.9."""
    scalar = _gae_rows(library, 0.9)
    array = _rows(library, adapter.truncated_generalized_advantage_estimation, GAE_R_T, GAE_DISCOUNT_T,
                  np.full((2, 5), 0.9), GAE_V_T)
    np.testing.assert_allclose(scalar, array, atol=1e-3)


@pytest.mark.parametrize("lambda_", [1.0, 0.7, 0.4])
def test_gae_as_special_case_of_importance_corrected_td_errors(library, lambda_):
    """TruncatedGeneralizedAdvantageEstimationTest: GAE = importance-corrected TD errors with ratios 1."""
    gae = _gae_rows(library, lambda_)
    ictd = _rows(library, adapter.importance_corrected_td_errors, GAE_R_T, GAE_DISCOUNT_T, np.ones((2, 5)),
                 np.full((2, 5), lambda_), GAE_V_T)
    np.testing.assert_allclose(gae, ictd, atol=1e-3)


# --- vtrace_test.py ---------------------------------------------------------------------------------------------

BEHAVIOUR_LOGITS = np.array([[[8.9, 0.7], [5.0, 1.0], [0.6, 0.1], [-0.9, -0.1]],
                             [[0.3, -5.0], [1.0, -8.0], [0.3, 1.7], [4.7, 3.3]]], dtype=np.float32)
TARGET_LOGITS = np.array([[[0.4, 0.5], [9.2, 8.8], [0.7, 4.4], [7.9, 1.4]],
                          [[1.0, 0.9], [1.0, -1.0], [-4.3, 8.7], [0.8, 0.3]]], dtype=np.float32)
ACTIONS = np.array([[0, 1, 0, 0], [1, 0, 0, 1]])
RHO_TM1 = categorical_importance_ratios(TARGET_LOGITS.astype(np.float64), BEHAVIOUR_LOGITS.astype(np.float64),
                                        ACTIONS)
REWARDS = np.array([[-1.3, -1.3, 2.3, 42.0], [1.3, 5.3, -3.3, -5.0]], dtype=np.float32)
DISCOUNTS = np.array([[0., 0.89, 0.85, 0.99], [0.88, 1., 0.83, 0.95]], dtype=np.float32)
VALUES = np.array([[2.1, 1.1, -3.1, 0.0], [3.1, 0.1, -1.1, 7.4]], dtype=np.float32)
BOOTSTRAP = np.array([8.4, -1.2], dtype=np.float32)
V_NEXT = np.concatenate([VALUES[:, 1:], BOOTSTRAP[:, None]], axis=1)
EXPECTED_TD = np.array([[-1.6155143, -3.4973226, 1.8670533, 5.0316002e1],
                        [1.4662437, 3.6116405, -8.3327293e-5, -1.3540000e1]])
EXPECTED_PG = np.array([[-1.6155143, -3.4973226, 1.8670534, 5.0316002e1],
                        [1.4662433, 3.6116405, -8.3369283e-05, -1.3540000e+1]])


def _vtrace_outputs(library, **kwargs):
    rows = [adapter.vtrace_td_error_and_advantage(*(library.asarray(a[i]) for a in (VALUES, V_NEXT, REWARDS, DISCOUNTS,
                                                                                RHO_TM1.astype(np.float32))),
                                                  **kwargs) for i in range(2)]
    return [np.stack([library.to_numpy(r[k]) for r in rows]) for k in range(3)]


def test_vtrace_td_error_and_advantage(library):
    """VTraceTest.test_vtrace_td_error_and_advantage: clip_rho_threshold 1, lambda 1, rtol 1e-3."""
    errors, pg_advantage, _ = _vtrace_outputs(library, clip_rho_threshold=1.0, lambda_=1.0)
    np.testing.assert_allclose(EXPECTED_TD, errors, rtol=1e-3)
    np.testing.assert_allclose(EXPECTED_PG, pg_advantage, rtol=1e-3)


def test_vtrace_td_error_and_advantage_jax_variants():
    fn = functools.partial(adapter.vtrace_td_error_and_advantage, clip_rho_threshold=1.0, lambda_=1.0)
    for variant in _jax_variants(fn):
        out = variant(VALUES, V_NEXT, REWARDS, DISCOUNTS, RHO_TM1.astype(np.float32))
        np.testing.assert_allclose(EXPECTED_TD, out.errors, rtol=1e-3)
        np.testing.assert_allclose(EXPECTED_PG, out.pg_advantage, rtol=1e-3)


@pytest.mark.parametrize("discount_t,lambda_", [
    (np.array([0., 1., 1., 0., 0., 1., 1., 1.]), 1.0),
    (np.array([0., 1., 1., 0., 0., 1., 1., 1.]), np.ones(8)),
    (np.array([0., 1., 1., 1., 0., 1., 1., 1.]), np.array([1., 1., 1., 0., 1., 1., 1., 1.])),
], ids=["scalar_lambda", "vector_lambda", "vector_lambda_truncation"])
def test_vtrace_lambda_multiple_episodes_per_trace(library, discount_t, lambda_):
    """VTraceTest.test_vtrace_lambda_multiple_episodes_per_trace: a zero discount (or lambda) at step 3 splits the
    trace; the two halves computed apart equal the whole (rlax's test slices its size-1 batch axis, which makes the
    halves the whole; here the time axis is split, as the test's name says). rtol 1e-3."""
    rng = np.random.default_rng(0)
    r_t, rho_tm1, v_tm1 = rng.random((3, 8))
    v_t = np.concatenate([v_tm1[1:], [10.0]])
    lam = lambda_ if isinstance(lambda_, float) else library.asarray(lambda_)

    def run(part):
        lam_part = lam if isinstance(lam, float) else library.asarray(lambda_[part])
        arrays = (library.asarray(a[part]) for a in (v_tm1, v_t, r_t, discount_t, rho_tm1))
        return library.to_numpy(adapter.vtrace(*arrays, lam_part, clip_rho_threshold=1.0))

    whole = run(slice(None))
    np.testing.assert_allclose(whole[:4], run(slice(None, 4)), rtol=1e-3)
    np.testing.assert_allclose(whole[4:], run(slice(4, None)), rtol=1e-3)
    np.testing.assert_allclose(whole, rlax_vtrace(v_tm1, v_t, r_t, discount_t, rho_tm1, lambda_), rtol=1e-6)


def test_lambda_q_estimate(library):
    """VTraceTest.test_lambda_q_estimate: vs = v + clipped rho (q - v) with lambda 0.8, rtol 1e-3."""
    errors, _, q_estimate = _vtrace_outputs(library, clip_rho_threshold=1.0, lambda_=0.8)
    expected_vs = errors + VALUES
    vs_from_q = VALUES + np.minimum(1.0, RHO_TM1) * (q_estimate - VALUES)
    np.testing.assert_allclose(expected_vs, vs_from_q, rtol=1e-3)


def test_leaky_and_non_leaky_vtrace(library):
    """VTraceTest.test_leaky_and_non_leaky_vtrace: alpha 1 is V-trace, rtol 1e-3."""
    inputs = (VALUES, V_NEXT, REWARDS, DISCOUNTS, RHO_TM1.astype(np.float32))
    plain = _rows(library, functools.partial(adapter.vtrace, lambda_=1.0), *inputs)
    leaky = _rows(library, functools.partial(adapter.leaky_vtrace, alpha_=1.0, lambda_=1.0), *inputs)
    np.testing.assert_allclose(plain, leaky, rtol=1e-3)


# --- the cases and rlax's conventions ---------------------------------------------------------------

def test_lambda_mixes_into_the_policy_gradient_target(library):
    """r=[0,0], v_tm1=[0,1], v_t=[1,0], discount 1, rho 1, lambda .5: rlax's advantage is [0.5, -1]."""
    a = [library.asarray(np.array(x)) for x in ([0.0, 1.0], [1.0, 0.0], [0.0, 0.0], [1.0, 1.0], [1.0, 1.0])]
    out = adapter.vtrace_td_error_and_advantage(*a, lambda_=0.5)
    np.testing.assert_allclose(library.to_numpy(out.pg_advantage), [0.5, -1.0], rtol=1e-12, atol=1e-12)


def test_bootstrap_values_apart_from_v_tm1(library):
    """v_t=[2,0] differs from v_tm1 shifted; lambda 1: rlax's advantage is [0, -1] (vs of the next step, not v_t)."""
    a = [library.asarray(np.array(x)) for x in ([0.0, 1.0], [2.0, 0.0], [0.0, 0.0], [1.0, 1.0], [1.0, 1.0])]
    out = adapter.vtrace_td_error_and_advantage(*a, lambda_=1.0)
    np.testing.assert_allclose(library.to_numpy(out.pg_advantage), [0.0, -1.0], rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(library.to_numpy(out.errors), [1.0, -1.0], rtol=1e-12, atol=1e-12)


def _sequence(rng, steps=60):
    return {"v_tm1": rng.standard_normal(steps), "v_t": rng.standard_normal(steps), "r_t": rng.standard_normal(steps),
            "discount_t": np.where(rng.random(steps) < 0.1, 0.0, rng.uniform(0.8, 1.0, steps)),
            "rho_tm1": rng.uniform(0.0, 2.5, steps), "sample_mask": rng.random(steps) > 0.2,
            "lambda_": rng.uniform(0.5, 1.6, steps)}


@pytest.mark.parametrize("alpha", [1.0, 0.4])
def test_vtrace_with_mask_and_lambda_above_one(library, alpha):
    """sample_mask skips steps (they keep the next error); lambda above 1 as rlax accepts it; against rlax's loop."""
    c = _sequence(np.random.default_rng(11))
    want = rlax_vtrace_td_error_and_advantage(c["v_tm1"], c["v_t"], c["r_t"], c["discount_t"], c["rho_tm1"],
                                              c["lambda_"], 0.9, 1.3, c["sample_mask"], alpha)
    args = [library.asarray(c[k]) for k in ("v_tm1", "v_t", "r_t", "discount_t", "rho_tm1")]
    got = adapter.leaky_vtrace_td_error_and_advantage(*args, alpha, library.asarray(c["lambda_"]), 0.9, 1.3,
                                                      sample_mask=library.asarray(c["sample_mask"]))
    for g, w in zip(got, want):
        np.testing.assert_allclose(library.to_numpy(g), w, rtol=1e-9, atol=1e-9)


def test_lambda_returns_lambda_above_one(library):
    c = _sequence(np.random.default_rng(12))
    want = rlax_lambda_returns(c["r_t"], c["discount_t"], c["v_t"], c["lambda_"])
    got = adapter.lambda_returns(library.asarray(c["r_t"]), library.asarray(c["discount_t"]), library.asarray(c["v_t"]),
                                 library.asarray(c["lambda_"]))
    np.testing.assert_allclose(library.to_numpy(got), want, rtol=1e-9, atol=1e-9)


def test_nan_in_a_masked_step_does_not_leak():
    """Deliberate difference: rlax multiplies a masked step's NaN by 0 (NaN); the adapter leaves the step out."""
    c = _sequence(np.random.default_rng(13))
    mask = c["sample_mask"]
    poisoned = np.where(mask, c["r_t"], np.nan)
    args = (c["v_tm1"], c["v_t"], poisoned, c["discount_t"], c["rho_tm1"])
    got = adapter.vtrace(*args, lambda_=0.9, sample_mask=mask)
    want = rlax_vtrace(c["v_tm1"], c["v_t"], c["r_t"], c["discount_t"], c["rho_tm1"], 0.9, 1.0, mask)
    np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-10)


def test_stop_target_gradients():
    jax = pytest.importorskip("jax")
    import jax.numpy as jnp

    c = {k: jnp.asarray(v) for k, v in _sequence(np.random.default_rng(14), steps=6).items()}
    args = lambda v: (v, c["v_t"], c["r_t"], c["discount_t"], c["rho_tm1"])  # noqa: E731
    stopped = jax.grad(lambda v: adapter.vtrace(*args(v)).sum())(c["v_tm1"])
    np.testing.assert_allclose(stopped, -np.ones(6))  # errors = stop(targets) - v_tm1
    flowing = jax.grad(lambda v: adapter.vtrace(*args(v), stop_target_gradients=False).sum())(c["v_tm1"])
    assert np.abs(np.asarray(flowing) + 1).max() > 1e-3
    returns = jax.grad(lambda v: adapter.lambda_returns(c["r_t"], c["discount_t"], v, 0.9, True).sum())(c["v_t"])
    np.testing.assert_allclose(returns, 0.0)


def test_errors_as_rlax():
    x = np.zeros(4)
    with pytest.raises(AssertionError):
        adapter.lambda_returns(np.zeros((2, 4)), np.zeros((2, 4)), np.zeros((2, 4)))
    with pytest.raises(ValueError):
        adapter.vtrace(x, x, x, x, np.zeros(3))
    with pytest.raises(AssertionError):
        adapter.truncated_generalized_advantage_estimation(x, x, 0.9, x)
    with pytest.raises(TypeError):
        adapter.vtrace(x, x, x, x, x, sample_mask=np.ones(4))


def test_against_rlax_itself():
    """Where rlax is installed: every adapted function on random sequences, lambda above 1 and masks included."""
    rlax = pytest.importorskip("rlax")
    multistep = pytest.importorskip("rlax._src.multistep")
    c = {k: np.asarray(v, dtype=np.float32) if v.dtype != bool else v
         for k, v in _sequence(np.random.default_rng(15), steps=40).items()}
    values = np.concatenate([c["v_tm1"], c["v_t"][-1:]])
    vt = (c["v_tm1"], c["v_t"], c["r_t"], c["discount_t"], c["rho_tm1"])
    for lam in (0.8, c["lambda_"]):
        pairs = [
            (adapter.lambda_returns(c["r_t"], c["discount_t"], c["v_t"], lam),
             rlax.lambda_returns(c["r_t"], c["discount_t"], c["v_t"], lam)),
            (adapter.truncated_generalized_advantage_estimation(c["r_t"], c["discount_t"], lam, values),
             rlax.truncated_generalized_advantage_estimation(c["r_t"], c["discount_t"], lam, values)),
            (adapter.importance_corrected_td_errors(c["r_t"], c["discount_t"], c["rho_tm1"], lam, values),
             multistep.importance_corrected_td_errors(c["r_t"], c["discount_t"], c["rho_tm1"], lam, values)),
            (adapter.vtrace(*vt, lam, 0.9, sample_mask=c["sample_mask"]),
             rlax.vtrace(*vt, lam, 0.9, sample_mask=c["sample_mask"])),
            *zip(adapter.vtrace_td_error_and_advantage(*vt, lam, 0.9, 1.4, sample_mask=c["sample_mask"]),
                 rlax.vtrace_td_error_and_advantage(*vt, lam, 0.9, 1.4, sample_mask=c["sample_mask"])),
            *zip(adapter.leaky_vtrace_td_error_and_advantage(*vt, 0.3, lam, 0.9, 1.4),
                 rlax.leaky_vtrace_td_error_and_advantage(*vt, 0.3, lam, 0.9, 1.4)),
        ]
        for got, want in pairs:
            np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(adapter.discounted_returns(c["r_t"], c["discount_t"], 1.5),
                               rlax.discounted_returns(c["r_t"], c["discount_t"], 1.5), rtol=1e-5, atol=1e-5)
