"""AReaL's turn-level GAE and per-sample lambda, restated in NumPy from areal-project/AReaL (PR #1600).

Restated from ``areal/trainer/ppo/gae.py`` (``_compute_turn_level_gae``,
``_build_gae_lambda_context``) and ``areal/trainer/ppo/lambda_fn.py``
(``vapo_length_adaptive_gae``, ``relative_position_gae_lambda``), in float32
as AReaL computes, with AReaL's own layout: padded rows ``[bs, T]``, a
float ``loss_mask``, turn ids that index T slots, a per-row
``seq_no_eos_mask`` whose rows bootstrap from ``values[:, -1]``. AReaL's
checks of the turn ids are left out (the tests restate them against
``gae_xp.turn_gae``'s own errors).
"""

from __future__ import annotations

import math

import numpy as np


def turn_level_gae(rewards, values, loss_mask, turn_ids, seq_no_eos_mask, discount, gae_lambda):
    """(advantages, returns) as AReaL computes them: a turn's reward summed into slot ``turn_id``, its value the
    value at its first loss token, one step per occupied slot from the last one down, gathered back by turn id."""
    rewards = np.asarray(rewards, dtype=np.float32)
    values = np.asarray(values, dtype=np.float32)
    loss_mask = np.asarray(loss_mask, dtype=np.float32)
    bs, length = rewards.shape
    valid = loss_mask.astype(bool)
    slots = np.clip(np.asarray(turn_ids, dtype=np.int64), 0, length - 1)
    rows = np.arange(bs)[:, None]
    turn_rewards = np.zeros((bs, length), dtype=np.float32)
    np.add.at(turn_rewards, (rows, slots), rewards * valid.astype(np.float32))
    first = np.full((bs, length), length)
    np.minimum.at(first, (rows, slots), np.where(valid, np.arange(length), length))
    occupied = first < length
    turn_values = np.take_along_axis(values, np.minimum(first, length - 1), axis=1) * occupied
    lam = np.broadcast_to(np.asarray(gae_lambda, dtype=np.float32), (bs,))
    discounted_lambda = np.float32(discount) * lam
    following = np.zeros(bs, dtype=np.float32)
    next_values = values[:, length - 1] * np.asarray(seq_no_eos_mask, dtype=np.float32)
    turn_advantages = np.zeros((bs, length), dtype=np.float32)
    for slot in reversed(range(length)):
        delta = turn_rewards[:, slot] + np.float32(discount) * next_values - turn_values[:, slot]
        advantage = delta + discounted_lambda * following
        here = occupied[:, slot]
        turn_advantages[:, slot] = np.where(here, advantage, 0)
        next_values = np.where(here, turn_values[:, slot], next_values)
        following = np.where(here, advantage, following)
    turn_returns = turn_advantages + turn_values
    advantages = np.take_along_axis(turn_advantages, slots, axis=1) * loss_mask
    returns = np.take_along_axis(turn_returns, slots, axis=1) * loss_mask + values * (1 - loss_mask)
    return advantages, returns


def lambda_context(loss_mask, turn_ids):
    """AReaL's per-row lengths: (effective_token_lengths, turn_counts), from the loss mask and the turn ids."""
    valid = np.asarray(loss_mask).astype(bool)
    length = valid.shape[1]
    slots = np.clip(np.asarray(turn_ids, dtype=np.int64), 0, length - 1)
    tokens_per_slot = np.zeros(valid.shape, dtype=np.int64)
    np.add.at(tokens_per_slot, (np.arange(valid.shape[0])[:, None], slots), valid.astype(np.int64))
    return valid.sum(axis=1), (tokens_per_slot > 0).sum(axis=1)


def vapo_length_adaptive_lambda(lengths, alpha):
    """``1 - 1 / (alpha * max(l, 1))`` clamped at 0, and 0 for an empty row, in float32."""
    lengths = np.asarray(lengths)
    adaptive = 1.0 - 1.0 / (np.float32(alpha) * np.maximum(lengths.astype(np.float32), 1.0))
    return np.where(lengths > 0, np.maximum(adaptive, 0.0), 0.0).astype(np.float32)


def relative_position_lambda(lengths, q):
    """``exp(log(q) / max(l - 1, 1))`` for l > 1, 1 for l = 1, 0 for an empty row, in float32."""
    lengths = np.asarray(lengths)
    steps = np.maximum(lengths - 1, 1).astype(np.float32)
    step_lambdas = np.exp(np.float32(math.log(q)) / steps)
    return np.where(lengths > 1, step_lambdas, np.where(lengths == 1, 1.0, 0.0)).astype(np.float32)
