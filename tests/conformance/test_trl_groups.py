"""TRL's GRPO advantages (``GRPOTrainer._generate_and_score_completions``): ``gae_xp.adapters.trl.grpo_advantages``
against TRL's code restated (frameworks.trl_grpo_advantages) for every ``scale_rewards`` TRL accepts, with NaN
rewards; TRL's own ``nanstd`` tests through it; and TRL's known bugs, where gae_xp gives the float64 answer.

Sources (huggingface/trl f2cd5771): trl/trainer/grpo_trainer.py, trl/trainer/utils.py (nanstd),
trl/trainer/grpo_config.py (True -> "group", False -> "none"), tests/test_utils.py::TestNanStd; TRL #3991 (fixed
by #3992) as of edbe8234.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from helpers import like, xp_assert_close
from hypothesis import given

from conformance import frameworks
from conformance.group_cases import consecutive_scores, exact_group_advantages
from gae_xp.adapters import trl

torch = pytest.importorskip("torch")

SCALE_REWARDS = ["group", "batch", "none", True, False]


@pytest.mark.parametrize("scale_rewards", SCALE_REWARDS)
@given(case=consecutive_scores(nan=True))
def test_against_trl_for_every_scale_rewards(library, scale_rewards, case):
    rewards, k = case
    want = frameworks.trl_grpo_advantages(torch.asarray(rewards), k, scale_rewards).numpy()
    got = trl.grpo_advantages(library.asarray(rewards), k, scale_rewards)
    # TRL's nanstd takes Bessel's count / (count - 1) in torch's default float32, float64 rewards too: its float64
    # advantages are off in the 8th digit (gae_xp's are float64 throughout).
    xp_assert_close(got, want, like=like(library), scale=1e3 * max(1.0, np.abs(want).max()))


@pytest.mark.parametrize("scale_rewards", SCALE_REWARDS)
def test_float32_and_one_generation(scale_rewards):
    rng = np.random.default_rng(3)
    rewards = torch.asarray(rng.standard_normal(48).astype(np.float32))
    rewards[[5, 17]] = math.nan
    for k in (1, 8, 48):
        want = frameworks.trl_grpo_advantages(rewards, k, scale_rewards)
        got = trl.grpo_advantages(rewards, k, scale_rewards)
        assert got.dtype == torch.float32
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert trl.grpo_advantages(rewards, 1, scale_rewards).abs().max() == 0    # one generation: 0


def test_nanstd_through_the_advantages():
    """TRL's TestNanStd, through the advantages: [1, 2, 3, nan] has nanstd 1; [1, nan] has NaN (one reward: 0s)."""
    x = torch.tensor([1.0, 2.0, 3.0, float("nan")])
    torch.testing.assert_close(frameworks.trl_nanstd(x), torch.tensor(1.0))
    torch.testing.assert_close(trl.grpo_advantages(x, 4), torch.tensor([-1.0, 0.0, 1.0, 0.0]) / (1 + 1e-4))
    pair = torch.tensor([1.0, float("nan"), 3.0, 5.0])
    assert torch.isnan(frameworks.trl_nanstd(pair.view(2, 2), dim=1)[0])
    torch.testing.assert_close(trl.grpo_advantages(pair, 2),
                               torch.tensor([0.0, 0.0, -1.0, 1.0]) / (2.0 ** 0.5 + 1e-4))
    assert trl.grpo_advantages(torch.full((4,), float("nan")), 2).tolist() == [0.0] * 4


# --- TRL's known bugs: gae_xp gives the float64 answer ---------------------------------------------------

@pytest.mark.parametrize("scale_rewards", ["group", "none"])
def test_equal_non_dyadic_rewards_give_zero(scale_rewards):
    """12 rewards of 1e6 + 0.5 in float32: TRL's nanmean is one rounding unit off, and with "group" the advantages
    reach +-0.96 where 0 is right (with "none" they are the unit itself, 0.06)."""
    rewards = torch.cat([torch.full((12,), 1e6 + 0.5), torch.arange(12.0)])
    want = exact_group_advantages(rewards.double().numpy(), [i // 12 for i in range(24)], eps=1e-4,
                                  scale=None if scale_rewards == "none" else "group")
    theirs = frameworks.trl_grpo_advantages(rewards, 12, scale_rewards)
    ours = trl.grpo_advantages(rewards, 12, scale_rewards)
    assert want[:12].tolist() == [0.0] * 12
    assert theirs[:12].abs().max() > (0.9 if scale_rewards == "group" else 0.05)
    assert ours[:12].abs().max() == 0
    xp_assert_close(ours, want, like=torch.zeros((), dtype=torch.float32))


def test_batch_scale_is_the_batch_std_3991():
    """TRL #3991: before #3992, scale_rewards="batch" divided by each group's std (and "group" by none at all).
    "batch" is the group's mean over the batch's std."""
    rewards = torch.tensor([0.0, 1.0, 0.0, 10.0, 5.0, 7.0], dtype=torch.float64)
    groups = [i // 2 for i in range(6)]
    want = np.array([r - np.mean(rewards.numpy()[2 * (i // 2): 2 * (i // 2) + 2]) for i, r in enumerate(rewards)])
    want = want / (np.std(rewards.numpy(), ddof=1) + 1e-4)
    np.testing.assert_allclose(want, exact_group_advantages(rewards.numpy(), groups, scale="batch", eps=1e-4))
    broken = frameworks.trl_grpo_advantages_before_3992(rewards, 2, "batch")
    assert np.abs(broken.numpy() - want).max() > 0.5
    np.testing.assert_allclose(frameworks.trl_grpo_advantages(rewards, 2, "batch").numpy(), want, rtol=1e-7)
    np.testing.assert_allclose(trl.grpo_advantages(rewards, 2, "batch").numpy(), want, rtol=1e-12)
    np.testing.assert_allclose(trl.grpo_advantages(rewards.float(), 2, "batch").numpy(), want, rtol=2e-6)


def test_trl_errors_name_the_argument():
    rewards = torch.randn(6)
    with pytest.raises(ValueError, match="Invalid value for scale_rewards"):
        trl.grpo_advantages(rewards, 3, "std")
    with pytest.raises(ValueError, match="num_generations"):
        trl.grpo_advantages(rewards, 4)
    with pytest.raises(ValueError, match="num_generations"):
        trl.grpo_advantages(rewards, 0)
    with pytest.raises(ValueError, match="rewards"):
        trl.grpo_advantages(rewards.view(2, 3), 3)
