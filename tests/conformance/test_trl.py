"""TRL's own tests of its masked statistics, restated against ``gae_xp.adapters.trl``, and PPOTrainer's advantage
block against its loop.

Sources (huggingface/trl): tests/experimental/test_ppo_trainer.py, class TestCore (test_masked_mean and
test_masked_var compare exactly with torch's mean and var of the unmasked entries; test_masked_whiten within
1e-5 of a plain whitening; input [1, 2, 3, 4], mask [0, 1, 1, 0]); trl/experimental/ppo/ppo_trainer.py, step 6 of
``PPOTrainer.train`` with ``masked_mean``, ``masked_var`` and ``masked_whiten`` (restated in frameworks.trl_*).
The rollouts here are built as PPOTrainer builds them: values 0 past ``sequence_length + 1``, the score added at
the last real token, a bool ``padding_mask``.
"""

from __future__ import annotations

import numpy as np
import pytest
from helpers import like, xp_assert_close

from conformance.frameworks import trl_masked_mean, trl_masked_var, trl_masked_whiten, trl_ppo_advantages
from gae_xp.adapters import trl


class TestCore:
    """TRL's TestCore, as written there, with the adapter's functions."""

    def setup_method(self):
        self.torch = pytest.importorskip("torch")
        self.test_input = self.torch.Tensor([1, 2, 3, 4])
        self.test_mask = self.torch.Tensor([0, 1, 1, 0])
        self.test_input_unmasked = self.test_input[1:3]

    def test_masked_mean(self):
        assert self.torch.mean(self.test_input_unmasked) == trl.masked_mean(self.test_input, self.test_mask)

    def test_masked_var(self):
        assert self.torch.var(self.test_input_unmasked) == trl.masked_var(self.test_input, self.test_mask)

    def test_masked_whiten(self):
        def whiten(values):
            mean, var = self.torch.mean(values), self.torch.var(values)
            return (values - mean) * self.torch.rsqrt(var + 1e-8)

        whiten_unmasked = whiten(self.test_input_unmasked)
        whiten_masked = trl.masked_whiten(self.test_input, self.test_mask)[1:3]
        diffs = (whiten_unmasked - whiten_masked).sum()
        assert abs(diffs.item()) < 0.00001


def _rollout(rng, batch, length, dtype=np.float64):
    """PPOTrainer's arrays before step 6: per-token KL rewards plus the score, values cut after length + 1."""
    sequence_lengths = rng.integers(-1, length, batch)  # first pad index - 1: -1 for an empty response
    steps = np.arange(length)
    padding_mask = steps > sequence_lengths[:, None]
    padding_mask_p1 = steps > (sequence_lengths + 1)[:, None]
    values = np.where(padding_mask_p1, 0.0, rng.standard_normal((batch, length)))
    rewards = -0.05 * rng.standard_normal((batch, length))
    actual_end = np.where(sequence_lengths + 1 < length, sequence_lengths + 1, sequence_lengths)
    rewards[np.arange(batch), actual_end] += rng.standard_normal(batch)
    if not (~padding_mask).any():
        padding_mask[0, 0] = False
    return rewards.astype(dtype), values.astype(dtype), padding_mask


@pytest.mark.parametrize("shape", [(4, 53), (1, 1), (3, 1), (2, 2), (8, 300)])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("gamma,lam", [(1.0, 0.95), (0.99, 0.9)])
def test_ppo_block_against_trl_loop(library, shape, dtype, gamma, lam):
    rewards, values, padding_mask = _rollout(np.random.default_rng(shape[1]), *shape, dtype)
    want_adv, want_ret = trl_ppo_advantages(rewards, values, padding_mask, gamma, lam)
    got_adv, got_ret = trl.compute_advantages_and_returns(library.asarray(rewards), library.asarray(values),
                                                          library.asarray(padding_mask), gamma, lam)
    expect = library.asarray(np.zeros((), dtype))
    xp_assert_close(got_adv, want_adv, like=expect)
    xp_assert_close(got_ret, want_ret, like=expect)


@pytest.mark.parametrize("kind", ["bool", "float", "fractional"])
@pytest.mark.parametrize("shift_mean", [True, False])
def test_masked_statistics_against_trl(library, kind, shift_mean):
    rng = np.random.default_rng(11)
    values = rng.normal(1.5, 2.0, (5, 40))
    real = rng.random((5, 40)) > 0.4
    mask = {"bool": real, "float": real.astype(np.float64),
            "fractional": real * rng.choice([0.25, 1.0], size=real.shape)}[kind]
    v, m = library.asarray(values), library.asarray(mask)
    xp_assert_close(trl.masked_mean(v, m), trl_masked_mean(values, mask), like=like(library))
    xp_assert_close(trl.masked_mean(v, m, axis=1), trl_masked_mean(values, mask, axis=1), like=like(library))
    xp_assert_close(trl.masked_mean(v, m, axis=0), trl_masked_mean(values, mask, axis=0), like=like(library))
    for unbiased in (True, False):
        xp_assert_close(trl.masked_var(v, m, unbiased), trl_masked_var(values, mask, unbiased), like=like(library))
    xp_assert_close(trl.masked_whiten(v, m, shift_mean), trl_masked_whiten(values, mask, shift_mean),
                    like=like(library))


def test_zero_mask_raises_as_trl(library):
    zeros = library.asarray(np.zeros((2, 3)))
    with pytest.raises(ValueError, match="sum of the mask is zero"):
        trl_masked_var(np.zeros((2, 3)), np.zeros((2, 3)))
    for call in (lambda: trl.masked_var(zeros, zeros), lambda: trl.masked_whiten(zeros, zeros),
                 lambda: trl.compute_advantages_and_returns(zeros, zeros, library.asarray(np.ones((2, 3), bool)))):
        with pytest.raises(ValueError, match="sum of the mask is zero"):
            call()
    np.testing.assert_array_equal(np.isnan(library.to_numpy(trl.masked_var(zeros, zeros, unbiased=False))), True)


def test_nan_in_padding_does_not_leak():
    """Deliberate difference: TRL multiplies masked entries by 0 (NaN * 0 = NaN); the adapter leaves them out."""
    values = np.array([[1.0, 2.0, 3.0, np.nan]])
    mask = np.array([[1.0, 1.0, 1.0, 0.0]])
    assert np.isnan(trl_masked_mean(values, mask))
    np.testing.assert_allclose(trl.masked_mean(values, mask), 2.0)
    np.testing.assert_allclose(trl.masked_var(values, mask), 1.0)
    whitened = trl.masked_whiten(values, mask)
    np.testing.assert_allclose(whitened[0, :3], np.array([-1.0, 0.0, 1.0]) / np.sqrt(1.0 + 1e-8))


def test_torch_no_grad_as_trl():
    torch = pytest.importorskip("torch")
    values = torch.randn(2, 6, dtype=torch.float64, requires_grad=True)
    advantages, returns = trl.compute_advantages_and_returns(torch.randn(2, 6, dtype=torch.float64), values,
                                                             torch.zeros(2, 6, dtype=torch.bool))
    assert not advantages.requires_grad and not returns.requires_grad
