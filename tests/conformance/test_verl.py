"""verl's own GAE test, restated against ``gae_xp.adapters.verl``, and the adapter against verl's loop.

Sources (volcengine/verl): tests/trainer/ppo/test_core_algos_on_cpu.py::test_multi_turn_compute_gae_advantage_return
(values in observation slots must not change anything: advantages and masked returns bitwise equal), and
verl/trainer/ppo/core_algos.py::compute_gae_advantage_return with verl/utils/torch_functional.py::masked_whiten
(restated in frameworks.verl_gae) for masks that are 0/1 floats, bool or fractional.
"""

from __future__ import annotations

import random

import numpy as np
import pytest
from helpers import like, xp_assert_close

import gae_xp
from conformance.frameworks import verl_gae, verl_masked_whiten
from gae_xp.adapters import verl


@pytest.mark.parametrize("seed", range(5))
def test_multi_turn_compute_gae_advantage_return(library, seed):
    """verl's multi-turn test: observation tokens' values are ignored (bitwise), with random gamma and lam."""
    rand = random.Random(seed)
    gamma, lam = rand.uniform(0.0, 1.0), rand.uniform(0.0, 1.0)
    rewards = np.array([[0.0, 0.0, 0.1, 0.1, 0.1, 0.0, 0.0, 0.1, 1.0, 0.0, 0.0]], dtype=np.float32)
    values1 = np.array([[rand.uniform(-100.0, 100.0), rand.random(), 4.0, 5.0, 6.0, rand.uniform(-100.0, 0),
                         rand.random(), 7.0, 9.0, 0.0, 0.0]], dtype=np.float32)
    values2 = np.array([[rand.random(), rand.uniform(-100.0, 100.0), 4.0, 5.0, 6.0, rand.random(),
                         rand.uniform(0.0, 100.0), 7.0, 9.0, 0.0, 0.0]], dtype=np.float32)
    response_mask = np.array([[0, 0, 1, 1, 1, 0, 0, 1, 1, 0, 0]], dtype=np.float32)

    adv1, ret1 = verl.compute_gae_advantage_return(library.asarray(rewards), library.asarray(values1),
                                                   library.asarray(response_mask), gamma, lam)
    adv2, ret2 = verl.compute_gae_advantage_return(library.asarray(rewards), library.asarray(values2),
                                                   library.asarray(response_mask), gamma, lam)
    np.testing.assert_array_equal(library.to_numpy(adv1), library.to_numpy(adv2))
    np.testing.assert_array_equal(library.to_numpy(ret1) * response_mask, library.to_numpy(ret2) * response_mask)
    want_adv, want_ret = verl_gae(rewards, values1, response_mask, gamma, lam)
    xp_assert_close(adv1, want_adv, like=like(library), dtype=library.xp.float32)
    xp_assert_close(ret1, want_ret, like=like(library), dtype=library.xp.float32)


def _llm_batch(rng, batch=3, length=300, fractional=False):
    rewards, values = rng.standard_normal((batch, length)), rng.standard_normal((batch, length))
    lengths = rng.integers(length // 2, length + 1, batch)
    mask = ((np.arange(length) < lengths[:, None]) & (rng.random((batch, length)) > 0.15)).astype(np.float64)
    if fractional:
        mask = mask * rng.choice([0.25, 0.5, 1.0], size=mask.shape)
    return rewards, values, mask


@pytest.mark.parametrize("kind", ["float", "bool", "fractional"])
@pytest.mark.parametrize("seed", range(2))
def test_against_verl_loop(library, kind, seed):
    rewards, values, mask = _llm_batch(np.random.default_rng(seed), fractional=kind == "fractional")
    want_adv, want_ret = verl_gae(rewards, values, mask, 0.99, 0.95)
    given = mask != 0 if kind == "bool" else mask
    got_adv, got_ret = verl.compute_gae_advantage_return(library.asarray(rewards), library.asarray(values),
                                                         library.asarray(given), 0.99, 0.95)
    xp_assert_close(got_adv, want_adv, like=like(library))
    xp_assert_close(got_ret, want_ret, like=like(library))


def test_fractional_mask_as_verl():
    """The issue's case: mask [1, .5, 1, 1] is blended by its value, as verl does (not read as all real)."""
    rewards, values = np.array([[0.5, -1.0, 2.0, 0.0]]), np.array([[0.3, 0.1, -0.4, 1.2]])
    mask = np.array([[1.0, 0.5, 1.0, 1.0]])
    want = verl_gae(rewards, values, mask, 0.9, 0.8)
    got = verl.compute_gae_advantage_return(rewards, values, mask, 0.9, 0.8)
    np.testing.assert_allclose(got[0], want[0], rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(got[1], want[1], rtol=1e-12, atol=1e-12)
    all_real = verl_gae(rewards, values, np.ones_like(mask), 0.9, 0.8)
    assert np.abs(got[0] - all_real[0]).max() > 1e-3


@pytest.mark.parametrize("mask,message", [([[0, 1, 0]], "sum of the mask is one"),
                                          ([[0, 0, 0]], "At least one element"),
                                          ([[0.5, 0.5, 0]], "sum of the mask is one")])
def test_too_few_real_tokens_raise_as_verl(library, mask, message):
    """verl's masked_var raises for a mask summing to 0 or 1; the adapter raises the same error."""
    mask = np.array(mask, dtype=np.float64)
    with pytest.raises(ValueError, match=message):
        verl_masked_whiten(np.zeros_like(mask), mask)
    zeros = library.asarray(np.zeros((1, 3)))
    with pytest.raises(ValueError, match=message):
        verl.compute_gae_advantage_return(zeros, zeros, library.asarray(mask), 0.99, 0.95)


def test_nan_in_a_masked_slot_does_not_leak():
    """Deliberate difference: verl multiplies a masked NaN by 0 and gets NaN everywhere; the adapter ignores it."""
    rewards, values, mask = _llm_batch(np.random.default_rng(7))
    poisoned_values = np.where(mask == 0, np.nan, values)
    poisoned_rewards = np.where(mask == 0, np.inf, rewards)
    want_adv, want_ret = verl_gae(rewards, values, mask, 0.99, 0.95)
    got_adv, got_ret = verl.compute_gae_advantage_return(poisoned_rewards, poisoned_values, mask, 0.99, 0.95)
    np.testing.assert_allclose(got_adv, want_adv, rtol=1e-10, atol=1e-10)
    real = mask != 0
    np.testing.assert_allclose(got_ret[real], want_ret[real], rtol=1e-10, atol=1e-10)


def test_torch_no_grad_as_verl():
    torch = pytest.importorskip("torch")
    values = torch.randn(2, 6, dtype=torch.float64, requires_grad=True)
    advantages, returns = verl.compute_gae_advantage_return(torch.randn(2, 6, dtype=torch.float64), values,
                                                            torch.ones(2, 6), 0.99, 0.95)
    assert not advantages.requires_grad and not returns.requires_grad


@pytest.mark.parametrize("unbiased", [True, False])
def test_whiten_takes_weights_as_verl_masked_mean(library, unbiased):
    """gae_xp.whiten with a numeric mask weights each entry by it, as verl's masked_mean / masked_var do."""
    rng = np.random.default_rng(3)
    x = rng.normal(2.0, 3.0, (4, 30))
    weights = rng.choice([0.0, 0.5, 1.0], size=x.shape)
    total = weights.sum()
    mean = (x * weights).sum() / total
    var = (((x - mean) ** 2) * weights).sum() / total * (total / (total - 1) if unbiased else 1.0)
    want = (x - mean) / np.sqrt(var + 1e-8)
    got = gae_xp.whiten(library.asarray(np.where(weights == 0, np.nan, x)), library.asarray(weights), unbiased=unbiased)
    xp_assert_close(got, np.where(weights == 0, 0.0, want), like=like(library))
    got_all = gae_xp.whiten(library.asarray(x), library.asarray(weights), unbiased=unbiased, masked_fill=None)
    xp_assert_close(got_all, want, like=like(library))
    as_bool = gae_xp.whiten(library.asarray(x), library.asarray(weights != 0), unbiased=unbiased)
    as_float = gae_xp.whiten(library.asarray(x), library.asarray((weights != 0).astype(np.float64)), unbiased=unbiased)
    xp_assert_close(as_float, library.to_numpy(as_bool), like=like(library))
