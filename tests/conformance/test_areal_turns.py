"""AReaL's turn-level GAE and per-sample lambda: its own tests restated with their numbers, and its loop.

Source (areal-project/AReaL, PR #1600): ``tests/test_ppo_gae.py`` (the tests), ``areal/trainer/ppo/gae.py`` and
``areal/trainer/ppo/lambda_fn.py`` (restated in ``conformance.areal_turns_reference``). AReaL's actor shifts its
rollout by one token before GAE (``loss_mask``, ``turn_ids`` and ``logprobs`` rolled by -1, the outcome reward at
``seqlens - 2``); the tests of its actor path are restated here on the shifted arrays, with the shift written out.

gae_xp takes AReaL's arguments so: ``mask = loss_mask != 0``, ``bootstrap_value = values[:, -1] * seq_no_eos_mask``,
``lam = gae_lambda[:, None]`` for one lambda per row, and AReaL's returns at a masked token (its own value) are
``where(mask, returns, values)``. AReaL's tests that are not about GAE (its config, its interaction's turn ids, its
static-lambda fast path) are not restated.
"""

from __future__ import annotations

import numpy as np
import pytest
from conftest import load_target
from helpers import converted, to_numpy, xp_assert_close

import gae_xp
from conformance import areal_turns_reference as areal


def areal_turn_gae(library, rewards, values, loss_mask, turn_ids, seq_no_eos_mask, discount, gae_lambda):
    """gae_xp.turn_gae with AReaL's arguments and AReaL's returns at masked tokens (NumPy in and out)."""
    xp = library.xp
    mask = np.asarray(loss_mask) != 0
    lam = gae_lambda if isinstance(gae_lambda, float) else np.asarray(gae_lambda, dtype=np.float64)[:, None]
    arrays = converted(library, {"rewards": np.asarray(rewards), "values": np.asarray(values),
                                 "turn_ids": np.asarray(turn_ids), "mask": mask, "lam": lam,
                                 "bootstrap_value": np.asarray(values)[:, -1] * np.asarray(seq_no_eos_mask)})
    advantages, returns = gae_xp.turn_gae(**arrays, gamma=discount)
    return advantages, xp.where(arrays["mask"], returns, arrays["values"])


def check(actual, desired, atol=0.0):
    """actual (an array of any library) equals desired within atol."""
    got = to_numpy(actual).astype(np.float64)
    np.testing.assert_allclose(got, np.asarray(desired, dtype=np.float64), rtol=0.0, atol=atol)


# --- tests/test_ppo_gae.py, turn-level GAE ----------------------------------------------------------------------


def test_turn_level_gae_broadcasts_advantage_and_steps_once_per_turn(library):
    rewards = np.array([[0.0, 1.0, 0.0, 2.0]])
    advantages, returns = areal_turn_gae(library, rewards, np.zeros_like(rewards), np.ones_like(rewards),
                                         np.array([[0, 0, 1, 1]], dtype=np.int32), np.array([False]), 1.0, 0.5)
    check(advantages, [[2.0, 2.0, 2.0, 2.0]])
    check(returns, [[2.0, 2.0, 2.0, 2.0]])


def test_turn_level_gae_skips_gaps_and_uses_first_value_with_bootstrap(library):
    rewards = np.array([[0.0, 3.0, 0.0, 0.0, 4.0]])
    values = np.array([[1.0, 5.0, 9.0, 2.0, 8.0]])
    advantages, returns = areal_turn_gae(library, rewards, values, np.array([[1.0, 1.0, 0.0, 1.0, 1.0]]),
                                         np.array([[0, 0, -1, 2, 2]]), np.array([True]), 0.5, 0.25)
    check(advantages, [[3.75, 3.75, 0.0, 6.0, 6.0]])
    check(returns, [[4.75, 4.75, 9.0, 8.0, 8.0]])


def test_turn_level_gae_applies_one_lambda_per_sample(library):
    rewards = np.array([[0.0, 1.0, 0.0, 2.0], [0.0, 1.0, 0.0, 2.0]])
    advantages, _ = areal_turn_gae(library, rewards, np.zeros_like(rewards), np.ones_like(rewards),
                                   np.array([[0, 0, 1, 1], [0, 0, 1, 1]], dtype=np.int32), np.array([False, False]),
                                   1.0, np.array([0.5, 0.0]))
    check(advantages, [[2.0, 2.0, 2.0, 2.0], [1.0, 1.0, 2.0, 2.0]])


@pytest.mark.parametrize(("turn_ids", "message"), [
    ([-1, 0, 0, 1], "at least 0 on every real token"),
    ([0, 1, 0, 2], "must not decrease"),
])
def test_turn_level_gae_rejects_malformed_active_turn_ids(turn_ids, message):
    """AReaL raises RuntimeError from an asynchronous assert; gae_xp raises ValueError before any scan."""
    rewards = np.zeros((1, 4))
    with pytest.raises(ValueError, match=message):
        gae_xp.turn_gae(rewards, rewards, np.array([turn_ids]), mask=np.ones((1, 4), dtype=bool), gamma=1.0, lam=1.0)


def test_turn_ids_past_the_sequence_length_are_turns_like_any_other():
    """AReaL refuses ``[0, 0, 4, 4]`` at T = 4 ("smaller than the sequence length": its turns live in T slots);
    gae_xp needs no bound (a deliberate difference): the ids are two turns, as ``[0, 0, 1, 1]``."""
    rewards, values = np.array([[0.5, 1.0, 0.0, 2.0]]), np.array([[0.25, 0.0, 1.0, 3.0]])
    wide = gae_xp.turn_gae(rewards, values, np.array([[0, 0, 4, 4]]), gamma=0.9, lam=0.8)
    narrow = gae_xp.turn_gae(rewards, values, np.array([[0, 0, 1, 1]]), gamma=0.9, lam=0.8)
    for a, b in zip(wide, narrow):
        np.testing.assert_array_equal(a, b)


def test_turn_level_gae_rejects_non_integral_ids():
    """AReaL raises ValueError ("integer dtype"); gae_xp a TypeError, as for every wrong dtype."""
    rewards = np.zeros((1, 2))
    with pytest.raises(TypeError, match="integer dtype"):
        gae_xp.turn_gae(rewards, rewards, np.array([[0.0, 0.0]]), gamma=1.0, lam=1.0)


def test_turn_level_main_path_keeps_kl_token_local_and_returns_task_only(library):
    """AReaL's actor in turn mode, kl_ctl = 1: GAE sees the outcome reward only, the token KL is added after.

    Rollout: loss_mask [0, 1, 1, 1, 1], turn_ids [-1, 0, 0, 1, 1], logprobs [0, 0, 0.2, 0.4, 0], reward 2, no
    EOS. Shifted by one token: loss_mask [1, 1, 1, 1, 0], turn_ids [0, 0, 1, 1, -1], KL rewards
    -[0, 0.2, 0.4, 0, 0], the outcome reward at seqlens - 2 = 3.
    """
    outcome = np.array([[0.0, 0.0, 0.0, 2.0, 0.0]])
    kl_rewards = np.array([[0.0, -0.2, -0.4, 0.0, 0.0]])
    advantages, returns = areal_turn_gae(library, outcome, np.zeros_like(outcome),
                                         np.array([[1.0, 1.0, 1.0, 1.0, 0.0]]), np.array([[0, 0, 1, 1, -1]]),
                                         np.array([True]), 1.0, 1.0)
    check(returns, [[2.0, 2.0, 2.0, 2.0, 0.0]], atol=1e-6)
    check(to_numpy(advantages) + kl_rewards, [[2.0, 1.8, 1.6, 2.0, 0.0]], atol=1e-6)
    check(kl_rewards + outcome, [[0.0, -0.2, -0.4, 2.0, 0.0]], atol=1e-6)  # AReaL's tot_rewards


def test_turn_level_main_path_requires_turn_ids():
    rewards = np.zeros((1, 3))
    with pytest.raises(TypeError, match="turn_ids must be an array"):
        gae_xp.turn_gae(rewards, rewards, None)


# --- tests/test_ppo_gae.py, per-sample lambda --------------------------------------------------------------------


def test_token_level_gae_applies_one_lambda_per_sample(library):
    """AReaL's token-level loop with a lambda per row: gae() with ``lam`` of shape (rows, 1)."""
    rewards = np.array([[0.0, 0.0, 1.0, 0.0], [0.0, 0.0, 1.0, 0.0]])
    arrays = converted(library, {"rewards": rewards, "values": np.zeros_like(rewards),
                                 "mask": np.array([[True, True, True, False]] * 2), "lam": np.array([[0.5], [0.0]])})
    advantages, _ = gae_xp.gae(**arrays, gamma=1.0)
    check(advantages, [[0.25, 0.5, 1.0, 0.0], [0.0, 0.0, 1.0, 0.0]])


def test_vapo_gae_lambda_uses_selected_token_lengths_per_sample(library):
    loss_mask = np.array([[1, 1, 1, 1, 0], [1, 1, 0, 0, 0], [0, 0, 0, 0, 0]]) != 0
    lam = gae_xp.length_adaptive_lambda(1.0, mask=library.asarray(loss_mask))
    check(lam, [[0.75], [0.5], [0.0]])


def test_vapo_gae_lambda_uses_selected_turn_counts_per_sample(library):
    loss_mask = np.array([[1, 1, 0, 1, 1], [1, 1, 1, 1, 0], [0, 0, 0, 0, 0]]) != 0
    turn_ids = np.array([[0, 0, -1, 2, 2], [0, 0, 0, 0, -1], [-1, -1, -1, -1, -1]], dtype=np.int32)
    counts = gae_xp.turn_counts(library.asarray(turn_ids), mask=library.asarray(loss_mask))
    check(gae_xp.length_adaptive_lambda(1.0, lengths=counts), [[0.5], [0.0], [0.0]])


def test_relative_position_gae_lambda_preserves_endpoints_and_relative_positions(library):
    q = 0.3
    lengths = np.array([10, 19])
    lam = to_numpy(gae_xp.relative_position_lambda(q, lengths=library.asarray(lengths)))
    np.testing.assert_allclose(lam ** (lengths - 1.0), [q, q], rtol=1e-6, atol=1e-7)
    # step 5 of 10 and step 9 of 19 are both at relative position 4 / 9
    np.testing.assert_allclose(lam ** np.array([5.0, 10.0]), [q ** (5.0 / 9.0)] * 2, rtol=1e-6, atol=1e-7)


def test_relative_position_gae_lambda_handles_empty_and_single_step_trajectories(library):
    lam = gae_xp.relative_position_lambda(0.3, lengths=library.asarray(np.array([0, 1, 2])))
    check(lam, [0.0, 1.0, 0.3], atol=1e-7)


@pytest.mark.parametrize("q", [True, -0.1, 0.0, 1.1, float("nan"), float("inf")])
def test_relative_position_gae_lambda_rejects_invalid_q(q):
    """AReaL raises ValueError for each; gae_xp a TypeError for the bool (not a number), ValueError for the rest."""
    expected = r"q must be (a real number|above 0\.0 and at most 1\.0)"
    with pytest.raises(TypeError if q is True else ValueError, match=expected):
        gae_xp.relative_position_lambda(q, lengths=np.array([2]))


def test_relative_position_gae_lambda_main_path_without_turn_ids(library):
    """AReaL's actor, token mode: 10 generated tokens, the outcome reward 1 on the last, discount 1, no values.

    Shifted by one token: loss_mask [1] * 10 + [0], the reward at seqlens - 2 = 9; no EOS (bootstrap from a value
    of 0). Advantages and returns: ``q ** ((10 - k) / 9)`` at step k = 1..10, then 0.
    """
    q, length = 0.3, 10
    rewards = np.zeros((1, length + 1))
    rewards[0, length - 1] = 1.0
    mask = np.arange(length + 1)[None] < length
    lam = gae_xp.relative_position_lambda(q, mask=library.asarray(mask))
    arrays = converted(library, {"rewards": rewards, "values": np.zeros_like(rewards), "mask": mask})
    advantages, returns = gae_xp.gae(**arrays, gamma=1.0, lam=lam)
    want = [q ** ((length - step) / (length - 1)) for step in range(1, length + 1)] + [0.0]
    check(advantages, [want], atol=1e-7)
    check(returns, [want], atol=1e-7)


def test_relative_position_gae_lambda_turn_mode_uses_effective_turn_count(library):
    q = 0.3
    turn_ids = np.array([[0, 0, 1, 1, 2, 2], [0, 0, 0, 0, 0, 0]], dtype=np.int32)
    counts = gae_xp.turn_counts(library.asarray(turn_ids), mask=library.asarray(np.ones((2, 6), dtype=bool)))
    lam = gae_xp.relative_position_lambda(q, lengths=counts)
    check(lam, [[q ** 0.5], [1.0]], atol=1e-7)


def test_custom_token_gae_lambda_uses_lengths_without_turn_ids(library):
    lam = gae_xp.length_adaptive_lambda(1.0, mask=library.asarray(np.array([[True, True], [True, False]])))
    check(lam, [[0.5], [0.0]])


def test_vapo_gae_lambda_rejects_non_positive_alpha():
    with pytest.raises(ValueError, match=r"alpha must be above 0\.0"):
        gae_xp.length_adaptive_lambda(0.0, lengths=np.array([0]))


def test_main_path_lambda_context_counts_shifted_training_tokens_including_eos(library):
    """Rollout loss_mask [0, 1, 1, 1, 0] (the EOS at 3), turn_ids [-1, 0, 0, 0, -1]; shifted: [1, 1, 1, 0, 0] and
    [0, 0, 0, -1, -1]: 3 tokens, 1 turn."""
    mask = library.asarray(np.array([[True, True, True, False, False]]))
    ids = library.asarray(np.array([[0, 0, 0, -1, -1]], dtype=np.int32))
    check(gae_xp.length_adaptive_lambda(1.0, mask=mask), [[1.0 - 1.0 / 3.0]], atol=1e-7)
    check(gae_xp.turn_counts(ids, mask=mask), [[1]])


# --- AReaL's loops on random rollouts ---------------------------------------------------------------------------


def _rollout(rng, bs, length, holes):
    """AReaL's layout: a float loss mask, turn ids rising along each row below T, -1 off the loss mask."""
    loss_mask = (rng.random((bs, length)) >= holes).astype(np.float32)
    turn_ids = np.minimum(np.cumsum(rng.random((bs, length)) < 0.25, axis=1), length - 1)
    return {"rewards": rng.standard_normal((bs, length)).astype(np.float32),
            "values": rng.standard_normal((bs, length)).astype(np.float32), "loss_mask": loss_mask,
            "turn_ids": np.where(loss_mask != 0, turn_ids, -1).astype(np.int32),
            "seq_no_eos_mask": rng.random(bs) < 0.5}


#: AReaL is a PyTorch framework: its random rollouts run on NumPy and torch (every library runs tests/test_turns.py).
ROLLOUT_LIBRARIES = ["numpy", "torch:cpu"]


@pytest.mark.parametrize("name", ROLLOUT_LIBRARIES)
@pytest.mark.parametrize(("seed", "per_sample"), [(0, False), (1, True), (2, True)])
def test_against_areal_turn_level_loop(name, seed, per_sample):
    library = load_target(f"{name}/auto").library
    rng = np.random.default_rng(seed)
    rollout = _rollout(rng, 4, 64, holes=0.3)
    lam = rng.uniform(0.0, 1.0, 4).astype(np.float32) if per_sample else 0.95
    want = areal.turn_level_gae(**rollout, discount=0.99, gae_lambda=lam)
    got = areal_turn_gae(library, **rollout, discount=0.99, gae_lambda=lam)
    for actual, desired in zip(got, want):
        xp_assert_close(actual, desired, like=library.asarray(np.zeros((), dtype=np.float32)))


@pytest.mark.parametrize("name", ROLLOUT_LIBRARIES)
@pytest.mark.parametrize("seed", range(2))
def test_lambdas_against_areal_lambda_fn(name, seed):
    library = load_target(f"{name}/auto").library
    rng = np.random.default_rng(seed)
    rollout = _rollout(rng, 6, 40, holes=rng.uniform(0.0, 1.0))
    rollout["loss_mask"][0] = 0  # an empty row
    tokens, turns = areal.lambda_context(rollout["loss_mask"], rollout["turn_ids"])
    mask = library.asarray(rollout["loss_mask"] != 0)
    counts = gae_xp.turn_counts(library.asarray(rollout["turn_ids"]), mask=mask)
    np.testing.assert_array_equal(to_numpy(counts)[:, 0], turns)
    for alpha in (0.05, 0.5, 1.0):
        check(gae_xp.length_adaptive_lambda(alpha, mask=mask),
              areal.vapo_length_adaptive_lambda(tokens, alpha)[:, None], atol=1e-6)
        check(gae_xp.length_adaptive_lambda(alpha, lengths=counts),
              areal.vapo_length_adaptive_lambda(turns, alpha)[:, None], atol=1e-6)
    for q in (0.01, 0.3, 1.0):
        check(gae_xp.relative_position_lambda(q, mask=mask), areal.relative_position_lambda(tokens, q)[:, None],
              atol=1e-6)
