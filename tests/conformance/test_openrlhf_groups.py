"""OpenRLHF's reward shaping for its critic-free estimators (``compute_advantages_and_returns``):
``gae_xp.adapters.openrlhf.group_advantages`` against OpenRLHF's code restated (frameworks.openrlhf_group_rewards)
for every estimator, and OpenRLHF's known bugs, where gae_xp gives the float64 answer. OpenRLHF's tests/ hold no
test of these lines.

Source (OpenRLHF/OpenRLHF 3c3be623): openrlhf/trainer/ppo_utils/experience_maker.py.
"""

from __future__ import annotations

import numpy as np
import pytest
from helpers import like, xp_assert_close
from hypothesis import given

from conformance import frameworks
from conformance.group_cases import consecutive_scores, exact_group_advantages
from gae_xp.adapters import openrlhf

torch = pytest.importorskip("torch")

ESTIMATORS = ["group_norm", "dr_grpo", "rloo", "reinforce_baseline"]


@pytest.mark.parametrize("estimator", ESTIMATORS)
@given(case=consecutive_scores(sizes=(2, 3, 4, 6, 12)))
def test_against_openrlhf_for_every_estimator(library, estimator, case):
    rewards, n = case
    want = frameworks.openrlhf_group_rewards(torch.asarray(rewards), n, estimator)
    got = openrlhf.group_advantages(library.asarray(rewards), n, estimator)
    xp_assert_close(got, want.numpy(), like=like(library))


@pytest.mark.parametrize("estimator", ESTIMATORS)
def test_float32(estimator):
    rewards = torch.asarray(np.random.default_rng(5).standard_normal(64).astype(np.float32))
    got = openrlhf.group_advantages(rewards, 8, estimator)
    assert got.dtype == torch.float32
    torch.testing.assert_close(got, frameworks.openrlhf_group_rewards(rewards, 8, estimator), rtol=1e-5, atol=1e-5)


@pytest.mark.filterwarnings("ignore:std.*degrees of freedom:UserWarning")
@pytest.mark.parametrize("estimator", ESTIMATORS)
def test_one_sample_per_prompt_gives_zero(estimator):
    """Deliberate difference: OpenRLHF's group_norm (the std of one sample) and rloo (a division by n - 1 = 0) give
    NaN with one sample per prompt; there is nothing to compare a lone sample with, so gae_xp gives 0."""
    rewards = torch.tensor([1.0, -2.0, 0.5])
    theirs = frameworks.openrlhf_group_rewards(rewards, 1, estimator)
    assert bool(torch.isnan(theirs).all()) is (estimator in ("group_norm", "rloo"))
    assert openrlhf.group_advantages(rewards, 1, estimator).tolist() == [0.0] * 3


@pytest.mark.parametrize("value,size", [(0.1, 16), (7.77, 12), (1e6 + 0.5, 12)])
def test_equal_non_dyadic_rewards_give_zero(value, size):
    """Equal float32 rewards: OpenRLHF's mean is one rounding unit off, its std one unit, and with its eps of 1e-9
    group_norm gives +-0.86 to +-0.96 where 0 is right."""
    rewards = torch.cat([torch.full((size,), value), torch.arange(float(size))])
    want = exact_group_advantages(rewards.double().numpy(), [i // size for i in range(2 * size)], eps=1e-9)
    theirs = frameworks.openrlhf_group_rewards(rewards, size, "group_norm")
    ours = openrlhf.group_advantages(rewards, size, "group_norm")
    assert theirs[:size].abs().max() > 0.8
    assert ours[:size].abs().max() == 0
    xp_assert_close(ours, want, like=torch.zeros((), dtype=torch.float32))


def test_openrlhf_errors_name_the_argument():
    rewards = torch.randn(6)
    with pytest.raises(ValueError, match="advantage_estimator"):
        openrlhf.group_advantages(rewards, 3, "gae")
    with pytest.raises(ValueError, match="n_samples_per_prompt"):
        openrlhf.group_advantages(rewards, 4, "rloo")
    with pytest.raises(ValueError, match="rewards"):
        openrlhf.group_advantages(rewards.view(2, 3), 3, "rloo")
