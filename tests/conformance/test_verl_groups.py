"""verl's outcome-reward estimators (GRPO, Dr.GRPO, RLOO, REINFORCE++, REINFORCE++-baseline): verl's own tests
restated against ``gae_xp.adapters.verl``, the adapters against verl's code restated (frameworks.verl_*) on random
cases with uid strings and singletons, and verl's known bugs, where gae_xp gives the float64 answer.

Sources (verl-project/verl 1dda039b): tests/trainer/ppo/test_core_algos_on_cpu.py (test_grpo_and_vectorized_
equivalence, test_rloo_and_vectorized_equivalence, test_grpo_vectorized_matches_original_for_low_variance_
rewards), tests/trainer/ppo/test_reinforce_pp_multiturn_on_cpu.py (PR #7300), tests/utils/test_groupwise.py.
"""

from __future__ import annotations

import random
from types import SimpleNamespace

import numpy as np
import pytest
from helpers import like, xp_assert_close
from hypothesis import given
from hypothesis import strategies as st

from conformance import frameworks
from conformance.group_cases import exact_group_advantages, labelled_scores, token_rewards
from gae_xp.adapters import verl

torch = pytest.importorskip("torch")


def _make_group_index(batch_size, num_groups):
    """verl's helper: every group at least 2 rows, the rest spread at random, shuffled; int64 ids."""
    counts = [2] * num_groups
    for _ in range(batch_size - 2 * num_groups):
        counts[random.randrange(num_groups)] += 1
    index = [gid for gid, c in enumerate(counts) for _ in range(c)]
    random.shuffle(index)
    return np.asarray(index, dtype=np.int64)


def _rand_mask(batch_size, seq_len):
    mask = torch.randint(0, 2, (batch_size, seq_len), dtype=torch.int64).float()
    mask[(mask.sum(dim=-1) == 0).nonzero(as_tuple=True)[0], -1] = 1.0
    return mask


@pytest.mark.parametrize("batch_size,seq_len,num_groups,seed", [(64, 128, 5, 0), (128, 256, 8, 1)])
@pytest.mark.parametrize("estimator", ["grpo", "rloo"])
def test_equivalence_with_verl_loop(batch_size, seq_len, num_groups, seed, estimator):
    """verl's test_{grpo,rloo}_and_vectorized_equivalence, with the adapter in the vectorised version's place."""
    torch.manual_seed(seed)
    random.seed(seed)
    index = _make_group_index(batch_size, num_groups)
    response_mask = _rand_mask(batch_size, seq_len)
    token_level_rewards = torch.randn(batch_size, seq_len, dtype=torch.float32) * response_mask
    theirs = {"grpo": frameworks.verl_grpo, "rloo": frameworks.verl_rloo}[estimator]
    ours = {"grpo": verl.compute_grpo_outcome_advantage, "rloo": verl.compute_rloo_outcome_advantage}[estimator]
    adv1, ret1 = theirs(token_level_rewards.clone(), response_mask, index)
    adv2, ret2 = ours(token_level_rewards=token_level_rewards, response_mask=response_mask, index=index)
    assert adv2.shape == ret2.shape == (batch_size, seq_len) and adv2.dtype == torch.float32
    assert torch.allclose(adv1, adv2, rtol=1e-5, atol=1e-6)
    assert torch.allclose(ret1, ret2, rtol=1e-5, atol=1e-6)


def test_grpo_matches_verl_for_low_variance_rewards():
    """verl's test_grpo_vectorized_matches_original_for_low_variance_rewards (the regression test of #6348)."""
    token_level_rewards = torch.tensor([[1.0], [1.00001], [2.0], [2.00001]], dtype=torch.float32)
    response_mask = torch.ones_like(token_level_rewards)
    index = np.array(["prompt-a", "prompt-a", "prompt-b", "prompt-b"], dtype=object)
    adv1, ret1 = frameworks.verl_grpo(token_level_rewards.clone(), response_mask, index)
    adv2, ret2 = verl.compute_grpo_outcome_advantage(token_level_rewards, response_mask, index)
    assert torch.allclose(adv1, adv2, rtol=1e-5, atol=1e-6)
    assert torch.allclose(ret1, ret2, rtol=1e-5, atol=1e-6)


class TestReinforcePPMultiTurn:
    """verl's regression tests of #7278 (PR #7300), as written there, with the adapter."""

    @staticmethod
    def returns(rewards, mask, gamma=1.0):
        return verl.compute_reinforce_plus_plus_outcome_advantage(rewards, mask, config=SimpleNamespace(gamma=gamma))[1]

    def test_observation_span_does_not_block_returns(self):
        compact = self.returns(torch.tensor([[0.0, 0.0, 0.0, 1.0]]), torch.ones(1, 4))
        expanded_mask = torch.tensor([[1.0, 1.0, 0.0, 0.0, 1.0, 1.0]])
        expanded = self.returns(torch.tensor([[0.0, 0.0, 0.0, 0.0, 0.0, 1.0]]), expanded_mask)
        torch.testing.assert_close(compact[torch.ones(1, 4).bool()], expanded[expanded_mask.bool()])

    def test_observation_positions_have_zero_returns(self):
        returns = self.returns(torch.tensor([[0.0, 0.0, 0.0, 0.0, 0.0, 1.0]]),
                               torch.tensor([[1.0, 1.0, 0.0, 0.0, 1.0, 1.0]]))
        assert returns[0, 2].item() == 0.0 and returns[0, 3].item() == 0.0

    def test_trailing_padding_stays_zero(self):
        returns = self.returns(torch.tensor([[0.0, 0.0, 1.0, 0.0, 0.0]]), torch.tensor([[1.0, 1.0, 1.0, 0.0, 0.0]]))
        assert returns[0].tolist() == [1.0, 1.0, 1.0, 0.0, 0.0]

    def test_gamma_discount_across_observation_span(self):
        returns = self.returns(torch.tensor([[0.0, 0.0, 0.0, 0.0, 2.0]]), torch.tensor([[1.0, 1.0, 0.0, 0.0, 1.0]]),
                               gamma=0.5)
        assert returns[0, 4].item() == 2.0 and returns[0, 2].item() == 0.0 and returns[0, 3].item() == 0.0
        assert returns[0, 1].item() == pytest.approx(1.0) and returns[0, 0].item() == pytest.approx(0.5)

    def test_batch_dimension(self):
        mask = torch.tensor([[1.0, 0.0, 1.0, 1.0], [1.0, 1.0, 1.0, 0.0]])
        returns = self.returns(torch.tensor([[0.0, 0.0, 0.0, 1.0], [0.0, 0.0, 1.0, 0.0]]), mask)
        assert returns.tolist() == [[1.0, 0.0, 1.0, 1.0], [1.0, 1.0, 1.0, 0.0]]

    def test_no_observation_tokens_unchanged(self):
        assert self.returns(torch.tensor([[0.0, 0.0, 0.0, 0.0, 3.0]]), torch.ones(1, 5))[0].tolist() == [3.0] * 5


# --- the adapters against verl's code, restated, on random cases --------------------------------------------

ESTIMATORS = {
    "grpo": (verl.compute_grpo_outcome_advantage, frameworks.verl_grpo, {}),
    "dr_grpo": (verl.compute_grpo_outcome_advantage, frameworks.verl_grpo, {"norm_adv_by_std_in_grpo": False}),
    "rloo": (verl.compute_rloo_outcome_advantage, frameworks.verl_rloo, {}),
    "reinforce_plus_plus_baseline": (verl.compute_reinforce_plus_plus_baseline_outcome_advantage,
                                     frameworks.verl_reinforce_plus_plus_baseline, {}),
}


@pytest.mark.parametrize("name", ESTIMATORS)
@given(case=labelled_scores(), seed=st.integers(0, 2**16))
def test_against_verl_on_uid_strings_and_singletons(library, name, case, seed):
    scores, uids = case
    rewards, mask = token_rewards(scores, 5, np.random.default_rng(seed))
    ours, theirs, options = ESTIMATORS[name]
    if name == "reinforce_plus_plus_baseline" and mask.sum() == 1:
        for call in (lambda: theirs(torch.asarray(rewards), torch.asarray(mask), uids),
                     lambda: ours(library.asarray(rewards), library.asarray(mask), uids)):
            with pytest.raises(ValueError, match="sum of the mask is one"):
                call()
        return
    want_adv, want_ret = theirs(torch.asarray(rewards), torch.asarray(mask), uids, **options)
    got_adv, got_ret = ours(library.asarray(rewards), library.asarray(mask), uids, config=None, **options)
    xp_assert_close(got_adv, want_adv.numpy(), like=like(library))
    xp_assert_close(got_ret, want_ret.numpy(), like=like(library))


@given(case=labelled_scores(rows=6), seed=st.integers(0, 2**16), gamma=st.sampled_from([1.0, 0.99, 0.5, 0.0]),
       kind=st.sampled_from(["float", "bool", "int", "fractional"]))
def test_reinforce_plus_plus_against_verl(library, case, seed, gamma, kind):
    rng = np.random.default_rng(seed)
    batch, length = case[0].shape[0], 7
    rewards = rng.standard_normal((batch, length))
    mask = (rng.random((batch, length)) > 0.3).astype(np.float64)
    mask[0, :2] = 1.0
    if kind == "fractional":
        mask = mask * rng.choice([0.5, 1.0], size=mask.shape)
    want_adv, want_ret = frameworks.verl_reinforce_plus_plus(torch.asarray(rewards), torch.asarray(mask), gamma)
    given_mask = library.asarray({"bool": mask != 0, "int": mask.astype(np.int64)}.get(kind, mask))
    got_adv, got_ret = verl.compute_reinforce_plus_plus_outcome_advantage(
        library.asarray(rewards), given_mask, config=SimpleNamespace(gamma=gamma), index=case[1])
    xp_assert_close(got_adv, want_adv.numpy(), like=like(library))
    xp_assert_close(got_ret, want_ret.numpy(), like=like(library))


def test_reinforce_plus_plus_before_and_after_7300():
    """The difference PR #7300 made: a hole in the mask used to cut the return; right padding alone never did."""
    rewards = torch.tensor([[0.0, 0.5, 0.0, 0.0, 1.0, 0.0], [0.0, 0.0, 1.0, 0.0, 0.0, 0.0]], dtype=torch.float64)
    padded = torch.tensor([[1.0, 1.0, 1.0, 1.0, 1.0, 0.0], [1.0, 1.0, 1.0, 0.0, 0.0, 0.0]], dtype=torch.float64)
    holed = torch.tensor([[1.0, 1.0, 0.0, 0.0, 1.0, 0.0], [1.0, 1.0, 1.0, 0.0, 0.0, 0.0]], dtype=torch.float64)
    for mask, same in ((padded, True), (holed, False)):
        new = frameworks.verl_reinforce_plus_plus(rewards, mask, 1.0)
        old = frameworks.verl_reinforce_plus_plus(rewards, mask, 1.0, before_7300=True)
        ours = verl.compute_reinforce_plus_plus_outcome_advantage(rewards, mask, gamma=1.0)
        for got, want in zip(ours, new):
            torch.testing.assert_close(got, want)
        assert torch.equal(old[1] * mask, new[1] * mask) is same
    assert ours[1][0].tolist() == [1.5, 1.5, 0.0, 0.0, 1.0, 0.0]      # the reward at t=4 reaches t=0 and t=1


# --- verl's known bugs: gae_xp gives the float64 answer ---------------------------------------------------

@pytest.mark.parametrize("value,size", [(1e6 + 0.5, 12), (7.77, 12), (7.77, 5)])
def test_equal_non_dyadic_scores_give_zero(value, size):
    """A group of equal float32 scores: verl's float32 mean is one rounding unit off, its std one unit, and
    (s - mean) / (std + 1e-6) lands far from the 0 that is right."""
    rewards = torch.zeros(size + 2, 3)
    rewards[:size, -1] = value
    rewards[size:, -1] = torch.tensor([0.0, 1.0])
    index = np.array(["same"] * size + ["other", "other"], dtype=object)
    mask = torch.ones_like(rewards)
    theirs, _ = frameworks.verl_grpo(rewards.clone(), mask, index)
    ours, _ = verl.compute_grpo_outcome_advantage(rewards, mask, index)
    want = exact_group_advantages(rewards.sum(-1).double().numpy(), list(index))
    assert want[:size].tolist() == [0.0] * size
    assert theirs[:size].abs().max() > 0.3
    assert ours[:size].abs().max() == 0
    xp_assert_close(ours[:, 0], want, like=torch.zeros((), dtype=torch.float32))


def test_near_constant_std_6348():
    """verl #6348: the vectorised GRPO's E[x^2] - E[x]^2 variance, floored at epsilon, gave a near-constant group
    a std of 1e-3 and advantages of +-0.005 instead of +-0.7071 (the loop's and the float64 answer)."""
    rewards = torch.tensor([[1.0], [1.00001], [2.0], [2.00001]], dtype=torch.float32)
    mask = torch.ones_like(rewards)
    index = np.array(["prompt-a", "prompt-a", "prompt-b", "prompt-b"], dtype=object)
    want = exact_group_advantages(rewards[:, 0].double().numpy(), list(index))
    broken, _ = frameworks.verl_grpo_vectorized(rewards, mask, index, before_6348=True)
    fixed, _ = frameworks.verl_grpo_vectorized(rewards, mask, index)
    ours, _ = verl.compute_grpo_outcome_advantage(rewards, mask, index)
    assert broken.abs().max() < 0.01
    np.testing.assert_allclose(fixed[:, 0].numpy(), want, rtol=2e-3)
    np.testing.assert_allclose(ours[:, 0].numpy(), want, rtol=2e-5)
    big = torch.full((8, 1), 1e6) + torch.arange(8.0)[:, None] * 1e-3 * 64   # 1e6 plus steps of float32's unit
    ours, _ = verl.compute_grpo_outcome_advantage(big, torch.ones_like(big), np.array(["p"] * 8, dtype=object))
    np.testing.assert_allclose(ours[:, 0].numpy(), exact_group_advantages(big[:, 0].double().numpy(), ["p"] * 8),
                               rtol=1e-5, atol=1e-6)


def test_rloo_singletons_follow_the_loop_not_the_vectorised_version():
    """A uid of one row: verl's rloo loop keeps its score; its rloo_vectorized gives 0. The adapter is the loop."""
    rewards = torch.tensor([[1.0], [0.0], [5.0]])
    mask = torch.ones_like(rewards)
    index = np.array(["a", "a", "alone"], dtype=object)
    loop, _ = frameworks.verl_rloo(rewards.clone(), mask, index)
    vectorised, _ = frameworks.verl_rloo_vectorized(rewards, mask, index)
    ours, _ = verl.compute_rloo_outcome_advantage(rewards, mask, index)
    assert loop[:, 0].tolist() == ours[:, 0].tolist() == [1.0, -1.0, 5.0]
    assert vectorised[2, 0].item() == 0.0


# --- verl's calling conventions --------------------------------------------------------------------------

def test_verl_dtypes_shapes_kwargs_and_no_grad():
    rewards = torch.randn(6, 5, requires_grad=True)
    mask = torch.ones(6, 5, dtype=torch.int64)
    index = np.array(["a", "b", "a", "b", "c", "a"], dtype=object)
    extra = {"config": SimpleNamespace(gamma=1.0), "reward_baselines": torch.zeros(6), "epsilon": 1e-6}
    for function in (verl.compute_grpo_outcome_advantage, verl.compute_rloo_outcome_advantage,
                     verl.compute_reinforce_plus_plus_baseline_outcome_advantage):
        advantages, returns = function(token_level_rewards=rewards, response_mask=mask, index=index, **extra)
        assert advantages is returns and advantages.dtype == torch.float32 and advantages.shape == (6, 5)
        assert not advantages.requires_grad
    del extra["epsilon"]
    advantages, returns = verl.compute_reinforce_plus_plus_outcome_advantage(rewards, mask, index=index, **extra)
    assert advantages.dtype == returns.dtype == torch.float32 and not returns.requires_grad
    assert verl.compute_grpo_outcome_advantage(rewards.double(), mask.float(), index)[0].dtype == torch.float64


def test_verl_errors_name_the_argument():
    rewards, mask = torch.randn(4, 3), torch.ones(4, 3)
    with pytest.raises(ValueError, match="index"):
        verl.compute_grpo_outcome_advantage(rewards, mask, np.array(["a", "b"], dtype=object))
    with pytest.raises(ValueError, match="gamma"):
        verl.compute_reinforce_plus_plus_outcome_advantage(rewards, mask)
    with pytest.raises(ValueError, match="gamma"):
        verl.compute_reinforce_plus_plus_outcome_advantage(rewards, mask, gamma=1.5)
    with pytest.raises(ValueError, match="sum of the mask is one"):
        verl.compute_reinforce_plus_plus_outcome_advantage(rewards, torch.eye(4, 3)[:1].expand(4, 3) * 0
                                                           + torch.nn.functional.one_hot(torch.tensor([0]), 12)
                                                           .reshape(4, 3).float(), gamma=1.0)
    with pytest.raises(ValueError, match="eps"):
        verl.compute_grpo_outcome_advantage(rewards, mask, np.array(["a"] * 4, dtype=object), epsilon=-1.0)


@pytest.mark.parametrize("k", [1, 4])
@pytest.mark.parametrize("name", ESTIMATORS)
def test_consecutive_uids_as_verl_repeats_them(name, k):
    """verl's rollout repeats each uid k times in a row: the adapter passes k to the core (a reshape, no sort);
    the same rows shuffled take the ids' route; both equal verl's code."""
    rng = np.random.default_rng(k)
    uids = np.repeat(np.array([f"uid-{i}" for i in range(6)], dtype=object), k)
    rewards, mask = token_rewards(rng.integers(-8, 9, uids.shape[0]) / 4, 5, rng)
    ours, theirs, options = ESTIMATORS[name]
    order = rng.permutation(uids.shape[0])
    for rows in (np.arange(uids.shape[0]), order):
        want, _ = theirs(torch.asarray(rewards[rows]), torch.asarray(mask[rows]), uids[rows], **options)
        got, _ = ours(torch.asarray(rewards[rows]), torch.asarray(mask[rows]), uids[rows], **options)
        xp_assert_close(got, want.numpy(), like=torch.zeros((), dtype=torch.float64))
