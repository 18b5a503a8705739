"""The frameworks' own functions, restated in our words as plain per-step loops (NumPy, or torch where the framework's
arithmetic is torch's). Each says where the original lives. They are the oracles of tests/conformance and do not
depend on gae_xp.
"""

from __future__ import annotations

import numpy as np

# --- slime (THUDM/slime, slime/utils/ppo_utils.py) -------------------------------------------------------------

def slime_vanilla_gae(rewards, values, gamma, lambd):
    """slime's ``vanilla_gae``: t from T-1 down to 0, vectorised over the batch, value 0 after the end.

    The same float operations in the same order as slime's torch loop (bitwise equal to it on the CPU), on a
    time-major copy so that every step reads contiguous memory: B=256, T=131072 takes seconds, not minutes.
    """
    r, v = np.ascontiguousarray(np.asarray(rewards).T), np.ascontiguousarray(np.asarray(values).T)
    steps, batch = r.shape
    out = np.empty_like(r)
    last = np.zeros(batch, dtype=r.dtype)
    for t in range(steps - 1, -1, -1):
        next_value = v[t + 1] if t < steps - 1 else 0.0
        delta = r[t] + gamma * next_value - v[t]
        last = delta + gamma * lambd * last
        out[t] = last
    advantages = np.ascontiguousarray(out.T)
    return advantages, advantages + np.asarray(values)


def slime_serial_discounted_returns(rewards, discount):
    """slime's ``_serial_discounted_returns`` (tests/test_discounted_returns.py): G_t = r_t + discount G_{t+1}."""
    r = np.asarray(rewards)
    returns = np.zeros_like(r)
    running = np.zeros(r.shape[0], dtype=r.dtype)
    for t in reversed(range(r.shape[1])):
        running = r[:, t] + discount * running
        returns[:, t] = running
    return returns


# --- verl (volcengine/verl, verl/trainer/ppo/core_algos.py and verl/utils/torch_functional.py) ------------------

def verl_gae(rewards, values, mask, gamma, lam):
    """verl's ``compute_gae_advantage_return``: every step blended by the mask value, then ``masked_whiten``."""
    r, v, m = (np.asarray(a, dtype=np.float64) for a in (rewards, values, mask))
    next_values = np.zeros(r.shape[0])
    last = np.zeros(r.shape[0])
    columns = []
    for t in reversed(range(r.shape[1])):
        delta = r[:, t] + gamma * next_values - v[:, t]
        candidate = delta + gamma * lam * last
        next_values = v[:, t] * m[:, t] + (1 - m[:, t]) * next_values
        last = candidate * m[:, t] + (1 - m[:, t]) * last
        columns.append(last)
    advantages = np.stack(columns[::-1], axis=1)
    return verl_masked_whiten(advantages, m), advantages + v


def verl_masked_whiten(values, mask):
    """verl's ``masked_whiten`` with ``masked_mean`` / ``masked_var(unbiased=True)``, including its two errors."""
    total = mask.sum()
    mean = (values * mask).sum() / total
    variance = (((values - mean) ** 2) * mask).sum() / total
    if total == 0:
        raise ValueError("At least one element in the mask has to be 1.")
    if total == 1:
        raise ValueError("The sum of the mask is one, which can cause a division by zero.")
    variance = variance * (total / (total - 1))
    return (values - mean) / np.sqrt(variance + 1e-8)


# --- OpenRLHF (OpenRLHF/OpenRLHF, openrlhf/trainer/ppo_utils/experience_maker.py) --------------------------------

def openrlhf_gae(values, rewards, action_mask, gamma, lambd):
    """OpenRLHF's ``get_advantages_and_returns``: values and rewards times the mask, the plain loop, value 0 after."""
    v, r = np.asarray(values, dtype=np.float64), np.asarray(rewards, dtype=np.float64)
    if action_mask is not None:
        v, r = np.asarray(action_mask) * v, np.asarray(action_mask) * r
    last = np.zeros(r.shape[0])
    columns = []
    for t in reversed(range(r.shape[1])):
        next_values = v[:, t + 1] if t < r.shape[1] - 1 else 0.0
        last = r[:, t] + gamma * next_values - v[:, t] + gamma * lambd * last
        columns.append(last)
    advantages = np.stack(columns[::-1], axis=1)
    return advantages, advantages + v


# --- torchrl (pytorch/rl, torchrl/objectives/value/functional.py) -----------------------------------------------

def torchrl_gae(gamma, lmbda, state_value, next_state_value, reward, done, terminated):
    """torchrl's ``generalized_advantage_estimate`` loop, time at -2: terminated drops V', done cuts the trace."""
    not_done, not_terminated = 1.0 - np.asarray(done, dtype=np.float64), 1.0 - np.asarray(terminated, np.float64)
    delta = reward + gamma * not_terminated * next_state_value - state_value
    advantage = np.zeros_like(np.asarray(reward, dtype=np.float64))
    following = 0.0
    for t in reversed(range(advantage.shape[-2])):
        following = delta[..., t, :] + gamma * lmbda * not_done[..., t, :] * following
        advantage[..., t, :] = following
    return advantage, advantage + state_value


def torchrl_vtrace(gamma, log_pi, log_mu, state_value, next_state_value, reward, done, terminated, rho_thresh,
                   c_thresh):
    """torchrl's ``vtrace_advantage_estimate``, time at -2."""
    not_done, not_terminated = 1.0 - np.asarray(done, dtype=np.float64), 1.0 - np.asarray(terminated, np.float64)
    rho = np.exp(log_pi - log_mu)
    clipped_rho, clipped_c = np.minimum(rho, rho_thresh), np.minimum(rho, c_thresh)
    deltas = clipped_rho * (reward + gamma * not_terminated * next_state_value - state_value)
    corrections = np.zeros_like(deltas)
    following = 0.0
    for t in reversed(range(deltas.shape[-2])):
        following = deltas[..., t, :] + gamma * not_done[..., t, :] * clipped_c[..., t, :] * following
        corrections[..., t, :] = following
    vs = corrections + state_value
    vs_next = np.concatenate([vs[..., 1:, :], next_state_value[..., -1:, :]], axis=-2)
    vs_next = np.where(np.asarray(done, dtype=bool), next_state_value, vs_next)
    return clipped_rho * (reward + gamma * not_terminated * vs_next - state_value), vs


# --- rlax (google-deepmind/rlax, rlax/_src/multistep.py and rlax/_src/vtrace.py) -------------------------------

def rlax_lambda_returns(r_t, discount_t, v_t, lambda_):
    """rlax's ``lambda_returns``: G = r + d ((1 - l) v + l G'), starting from v_t[-1]."""
    lam = np.broadcast_to(np.asarray(lambda_, dtype=np.float64), np.shape(r_t))
    returns, acc = np.zeros(len(r_t)), float(v_t[-1])
    for t in reversed(range(len(r_t))):
        acc = r_t[t] + discount_t[t] * ((1 - lam[t]) * v_t[t] + lam[t] * acc)
        returns[t] = acc
    return returns


def rlax_vtrace(v_tm1, v_t, r_t, discount_t, rho_tm1, lambda_=1.0, clip_rho_threshold=1.0, sample_mask=None,
                alpha=1.0):
    """rlax's (leaky) ``vtrace`` errors; ``sample_mask`` blends each step by 0/1, as rlax does."""
    lam = np.broadcast_to(np.asarray(lambda_, dtype=np.float64), np.shape(r_t))
    mask = np.ones(len(r_t)) if sample_mask is None else np.asarray(sample_mask, dtype=np.float64)
    c = ((1 - alpha) * rho_tm1 + alpha * np.minimum(1.0, rho_tm1)) * lam
    clipped = (1 - alpha) * rho_tm1 + alpha * np.minimum(clip_rho_threshold, rho_tm1)
    td = clipped * (r_t + discount_t * v_t - v_tm1)
    errors, acc = np.zeros(len(r_t)), 0.0
    for t in reversed(range(len(r_t))):
        acc = mask[t] * (td[t] + discount_t[t] * c[t] * acc) + (1 - mask[t]) * acc
        errors[t] = acc
    return errors


def rlax_vtrace_td_error_and_advantage(v_tm1, v_t, r_t, discount_t, rho_tm1, lambda_=1.0, clip_rho_threshold=1.0,
                                       clip_pg_rho_threshold=1.0, sample_mask=None, alpha=1.0):
    """rlax's (leaky) ``vtrace_td_error_and_advantage``: (errors, pg_advantage, q_estimate)."""
    lam = np.broadcast_to(np.asarray(lambda_, dtype=np.float64), np.shape(r_t))
    errors = rlax_vtrace(v_tm1, v_t, r_t, discount_t, rho_tm1, lam, clip_rho_threshold, sample_mask, alpha)
    targets = errors + v_tm1
    q_bootstrap = np.concatenate([lam[:-1] * targets[1:] + (1 - lam[:-1]) * v_tm1[1:], v_t[-1:]])
    q = r_t + discount_t * q_bootstrap
    clipped_pg = (1 - alpha) * rho_tm1 + alpha * np.minimum(clip_pg_rho_threshold, rho_tm1)
    return errors, clipped_pg * (q - v_tm1), q


def categorical_importance_ratios(target_logits, behaviour_logits, actions):
    """pi(a) / mu(a) from logits (rlax's ``categorical_importance_sampling_ratios``), via log-softmax."""
    def log_softmax(z):
        z = z - z.max(axis=-1, keepdims=True)
        return z - np.log(np.exp(z).sum(axis=-1, keepdims=True))

    log_pi = np.take_along_axis(log_softmax(target_logits), actions[..., None], axis=-1)[..., 0]
    log_mu = np.take_along_axis(log_softmax(behaviour_logits), actions[..., None], axis=-1)[..., 0]
    return np.exp(log_pi - log_mu)


# --- AReaL (areal-project/AReaL, realhf/impl/model/utils/ppo_functional.py and areal/trainer/ppo/gae.py) -------

def areal_pygae1d_nolp_misalign(rewards, values, cu_seqlens, bootstrap, gamma, lam):
    """AReaL's ``pygae1d_nolp_misalign``: packed 1-D sequences, one extra value slot per sequence.

    Sequence i owns rewards ``[o_i, o_{i+1})`` and values ``[o_i + i, o_{i+1} + i + 1)``: its last value slot is
    the value after its last step, multiplied by ``bootstrap[i]``. Each sequence runs t from its end down to 0 in
    the inputs' dtype; an empty sequence (a repeated offset) has no step and only its extra slot. AReaL's
    ``nextvalues *= bootstrap[i]`` writes into ``values``; here into a copy.
    """
    r, v, offsets = np.asarray(rewards), np.array(values), np.asarray(cu_seqlens)
    count = len(offsets) - 1
    assert v.shape[0] == r.shape[0] + count
    advantages, returns = np.zeros_like(r), np.zeros_like(r)
    for i in reversed(range(count)):
        start, end, value_start = offsets[i], offsets[i + 1], offsets[i] + i
        last = 0
        for t in reversed(range(end - start)):
            next_value = v[value_start + t + 1]
            if t == end - start - 1:
                next_value = next_value * bootstrap[i]
            delta = r[start + t] + gamma * next_value - v[value_start + t]
            last = delta + gamma * lam * last
            advantages[start + t] = last
            returns[start + t] = last + v[value_start + t]
    return advantages, returns


def areal_token_level_gae(rewards, values, loss_mask, seq_no_eos_mask, discount, gae_lambda):
    """AReaL's padded block (``PPOActor._compute_advantages``, now ``_compute_token_level_gae``), time last.

    The last position is never a step: its advantage is 0 and its value is the bootstrap of rows without EOS
    (``values[:, -1] * seq_no_eos_mask``). Steps T-2 .. 0 blend by the loss mask as verl does (a masked token keeps
    the next real token's advantage and passes its value on). ``gae_lambda`` is a number or one per row; AReaL
    starts from float32 zeros, so the results are at least float32.
    """
    r, v, m = np.asarray(rewards), np.asarray(values), np.asarray(loss_mask)
    dtype = np.result_type(r, v, np.float32)
    batch, length = r.shape
    advantages = np.zeros((batch, length), dtype=dtype)
    last = np.zeros(batch, dtype=np.float32)
    next_values = v[:, length - 1] * np.asarray(seq_no_eos_mask)
    # AReaL's lambda is a Python float or a float32 tensor of one value per row (``.detach().float()``).
    discounted_lambda = discount * (gae_lambda if isinstance(gae_lambda, float) else np.asarray(gae_lambda, np.float32))
    for t in reversed(range(length - 1)):
        delta = r[:, t] + discount * next_values - v[:, t]
        candidate = delta + discounted_lambda * last
        next_values = next_values * (1 - m[:, t]) + v[:, t] * m[:, t]
        last = last * (1 - m[:, t]) + candidate * m[:, t]
        advantages[:, t] = last
    return advantages, advantages + v


# --- CleanRL (vwxyzjn/cleanrl, cleanrl/ppo.py and cleanrl/ppo_continuous_action.py) -----------------------------

def cleanrl_gae(rewards, values, dones, next_value, next_done, gamma, gae_lambda):
    """CleanRL's loop: time-major [num_steps, num_envs]; ``dones[t]`` says that ``obs[t]`` starts a new episode.

    So step t's own done flag is ``dones[t + 1]`` (``next_done`` for the last step), and ``1 - done`` both drops the
    bootstrap and cuts the trace (a truncation counts as a termination). ``next_value`` is V(next_obs), shaped
    (1, num_envs) as ``agent.get_value(next_obs).reshape(1, -1)`` gives it. Computed in the inputs' dtype.
    """
    r, v, d = np.asarray(rewards), np.asarray(values), np.asarray(dones)
    num_steps = r.shape[0]
    advantages = np.zeros_like(r)
    last = 0
    for t in reversed(range(num_steps)):
        if t == num_steps - 1:
            next_nonterminal = 1.0 - np.asarray(next_done)
            next_values = np.asarray(next_value)
        else:
            next_nonterminal = 1.0 - d[t + 1]
            next_values = v[t + 1]
        delta = r[t] + gamma * next_values * next_nonterminal - v[t]
        advantages[t] = last = delta + gamma * gae_lambda * next_nonterminal * last
    return advantages, advantages + v


def cleanrl_normalize(mb_advantages):
    """CleanRL's ``norm_adv``: ``(x - x.mean()) / (x.std() + 1e-8)``, torch's std being Bessel-corrected."""
    x = np.asarray(mb_advantages, dtype=np.float64)
    return (x - x.mean()) / (x.std(ddof=1) + 1e-8)


# --- TRL (huggingface/trl, trl/experimental/ppo/ppo_trainer.py) --------------------------------------------------

def trl_masked_mean(values, mask, axis=None):
    """TRL's ``masked_mean``: ``(values * mask).sum(axis) / mask.sum(axis)``."""
    v, m = np.asarray(values, dtype=np.float64), np.asarray(mask, dtype=np.float64)
    return (v * m).sum(axis=axis) / m.sum(axis=axis)


def trl_masked_var(values, mask, unbiased=True):
    """TRL's ``masked_var``: the masked mean of the squared deviations, times ``n / (n - 1)``; n = 0 raises."""
    m = np.asarray(mask, dtype=np.float64)
    centred = np.asarray(values, dtype=np.float64) - trl_masked_mean(values, mask)
    variance = trl_masked_mean(centred ** 2, mask)
    if unbiased:
        total = m.sum()
        if total == 0:
            raise ValueError("The sum of the mask is zero, which can happen when `mini_batch_size=1`;"
                             "try increase the `mini_batch_size` or `gradient_accumulation_steps`")
        with np.errstate(divide="ignore", invalid="ignore"):
            variance = variance * (total / (total - 1))
    return variance


def trl_masked_whiten(values, mask, shift_mean=True):
    """TRL's ``masked_whiten``: ``(values - mean) * rsqrt(var + 1e-8)`` (+ mean again unless ``shift_mean``)."""
    mean, variance = trl_masked_mean(values, mask), trl_masked_var(values, mask)
    with np.errstate(invalid="ignore"):
        whitened = (np.asarray(values, dtype=np.float64) - mean) / np.sqrt(variance + 1e-8)
    return whitened if shift_mean else whitened + mean


def trl_ppo_advantages(rewards, values, padding_mask, gamma, lam):
    """PPOTrainer's step 6: the plain loop over the whole response (value 0 after it), returns = A + V, then the
    advantages whitened over the real tokens (``~padding_mask``) and set to 0 on padding."""
    r, v = np.asarray(rewards, dtype=np.float64), np.asarray(values, dtype=np.float64)
    last = 0.0
    columns = []
    for t in reversed(range(r.shape[1])):
        next_values = v[:, t + 1] if t < r.shape[1] - 1 else 0.0
        last = r[:, t] + gamma * next_values - v[:, t] + gamma * lam * last
        columns.append(last)
    advantages = np.stack(columns[::-1], axis=1)
    returns = advantages + v
    padding = np.asarray(padding_mask, dtype=bool)
    return np.where(padding, 0.0, trl_masked_whiten(advantages, ~padding)), returns


# --- OpenRLHF, the normalisation (openrlhf/trainer/ppo_utils/experience_maker.py, compute_advantages_and_returns) -

def openrlhf_normalize(advantages, action_masks, no_std_norm=False):
    """The experiences' advantages normalised together: the mean over every real token of every experience; the
    biased variance clamped at 1e-8 (``var.clamp(min=1e-8).rsqrt()``), or no division with ``no_std_norm``. Every
    position is shifted and scaled, masked ones included. Lists in, lists out."""
    flat = np.concatenate([np.asarray(a, dtype=np.float64).ravel() for a in advantages])
    masks = np.concatenate([np.asarray(m, dtype=np.float64).ravel() for m in action_masks])
    count = masks.sum()
    mean = (flat * masks).sum() / count
    scale = 1.0 if no_std_norm else 1.0 / np.sqrt(max(((flat - mean) ** 2 * masks).sum() / count, 1e-8))
    return [(np.asarray(a, dtype=np.float64) - mean) * scale for a in advantages]


# --- Group-relative advantages (issue 28): the frameworks' outcome-reward estimators, in torch ------------------
# These are restated in torch, in the frameworks' own dtype and order of operations, because the bugs they carry
# are float32 rounding: a float64 restatement would hide them. Commits read:
#   verl      verl-project/verl 1dda039b9c6311889a9c9a26040677e1254814f9 (2026-08-22), verl/trainer/ppo/core_algos.py,
#             verl/utils/groupwise.py, verl/utils/torch_functional.py; the vectorised GRPO before #6348 as of
#             volcengine/verl b178a3cd56f58b2d502255daba591e92833930a7 (2026-01-29), REINFORCE++ before #7300 ditto;
#   TRL       huggingface/trl f2cd57710ae345ea6428ae95363267fcf38a3dc8 (2026-07-24), trl/trainer/grpo_trainer.py
#             (_generate_and_score_completions, "sum_then_normalize") and trl/trainer/utils.py (nanstd); the
#             scale_rewards branches before #3992 as of edbe8234bc7e528f72ac76607de9d3e4753e2709 (TRL #3991);
#   OpenRLHF  OpenRLHF/OpenRLHF 3c3be6234e0cb353e76bb8019947db9dfe99fca7 (2026-08-13),
#             openrlhf/trainer/ppo_utils/experience_maker.py (compute_advantages_and_returns, "reward shaping").

def _torch():
    import torch

    return torch


def _verl_groups(index, scores):
    """verl's grouping: a dict from each uid (any hashable: verl's NumPy object array of uid strings) to the
    list of its rows' 0-d scores, in the order the rows come."""
    groups = {}
    for i in range(scores.shape[0]):
        groups.setdefault(index[i], []).append(scores[i])
    return groups


def verl_grpo(token_level_rewards, response_mask, index, epsilon=1e-6, norm_adv_by_std_in_grpo=True):
    """verl's ``compute_grpo_outcome_advantage`` (the reference loop): score = the row's sum of token rewards;
    per uid the mean and the unbiased std of the stacked scores (a uid of one row: mean 0, std 1); each row's
    (score - mean) / (std + epsilon), or score - mean without the std; times the response mask. (adv, adv)."""
    torch = _torch()
    scores = token_level_rewards.sum(dim=-1)
    with torch.no_grad():
        means, stds = {}, {}
        for uid, members in _verl_groups(index, scores).items():
            if len(members) == 1:
                means[uid], stds[uid] = torch.tensor(0.0), torch.tensor(1.0)
            else:
                means[uid], stds[uid] = torch.mean(torch.stack(members)), torch.std(torch.stack(members))
        for i in range(scores.shape[0]):
            centred = scores[i] - means[index[i]]
            scores[i] = centred / (stds[index[i]] + epsilon) if norm_adv_by_std_in_grpo else centred
        scores = scores.unsqueeze(-1) * response_mask
    return scores, scores


def verl_grpo_vectorized(token_level_rewards, response_mask, index, epsilon=1e-6, norm_adv_by_std_in_grpo=True,
                         before_6348=False):
    """verl's ``compute_grpo_vectorized_outcome_advantage`` (PR #3635) with ``group_mean_std``: uids factorised
    (np.unique's inverse), per-group count and sum by ``index_add_`` in float32, mean = sum / count, the variance
    two-pass (sum of squared deviations from the group mean) over max(count - 1, 1), std = sqrt(max(var, 0));
    singletons mean 0, std 1; the scalars (s - mean) / (std + epsilon), times the mask.

    ``before_6348``: the code verl #6348 fixed: the variance as (sum2 - sum^2 / count) / max(count - 1, 1) and
    floored at epsilon (``group_mean_std(eps=epsilon)``), so a near-constant group's std is at least sqrt(1e-6).
    """
    torch = _torch()
    with torch.no_grad():
        scores = token_level_rewards.sum(dim=-1)
        g = torch.from_numpy(np.unique(np.asarray(index), return_inverse=True)[1].reshape(-1).astype(np.int64))
        s = scores.reshape(-1).to(torch.float32)
        size = int(g.max()) + 1
        count = torch.zeros(size).index_add_(0, g, torch.ones_like(s))
        total = torch.zeros(size).index_add_(0, g, s)
        mean = total / count.clamp_min(1.0)
        if before_6348:
            squares = torch.zeros(size).index_add_(0, g, s * s)
            variance = (squares - total * total / count.clamp_min(1.0)) / (count - 1.0).clamp_min(1.0)
            std = torch.sqrt(torch.clamp(variance, min=epsilon))
        else:
            deviations = torch.zeros(size).index_add_(0, g, (s - mean[g]) ** 2)
            std = torch.sqrt(torch.clamp(deviations / (count - 1.0).clamp_min(1.0), min=0.0))
        single = count <= 1.0
        mean, std = torch.where(single, 0.0, mean), torch.where(single, 1.0, std)
        scalars = (scores - mean[g]) / (std[g] + epsilon) if norm_adv_by_std_in_grpo else scores - mean[g]
        advantages = scalars.unsqueeze(-1) * response_mask
    return advantages, advantages


def verl_rloo(token_level_rewards, response_mask, index):
    """verl's ``compute_rloo_outcome_advantage`` (the loop): per uid of n > 1 rows, s n/(n-1) - mean n/(n-1);
    a uid of one row keeps its score as it is; times the mask. (adv, adv)."""
    torch = _torch()
    scores = token_level_rewards.sum(dim=-1)
    with torch.no_grad():
        groups = _verl_groups(index, scores)
        means = {uid: torch.mean(torch.stack(m)) if len(m) > 1 else torch.tensor(0.0) for uid, m in groups.items()}
        for i in range(scores.shape[0]):
            n = len(groups[index[i]])
            if n > 1:
                scores[i] = scores[i] * n / (n - 1) - means[index[i]] * n / (n - 1)
        scores = scores.unsqueeze(-1) * response_mask
    return scores, scores


def verl_rloo_vectorized(token_level_rewards, response_mask, index):
    """verl's ``compute_rloo_vectorized_outcome_advantage``: (c s - S) / max(c - 1, 1) per row, times (c > 1):
    a uid of one row gets 0 here (the loop above leaves its score)."""
    torch = _torch()
    scores = token_level_rewards.sum(dim=-1)
    with torch.no_grad():
        inv = torch.from_numpy(np.unique(np.asarray(index), return_inverse=True)[1].reshape(-1))
        c = torch.bincount(inv)[inv].to(scores.dtype)
        adv = ((c * scores - torch.bincount(inv, weights=scores)[inv]) / (c - 1).clamp_min(1)) * (c > 1)
        adv = adv.unsqueeze(-1) * response_mask
    return adv, adv


def verl_torch_masked_whiten(values, mask):
    """verl's current ``masked_whiten``: masked_mean is sum(values * mask) / (sum(mask) + 1e-8); masked_var the
    masked mean of squared deviations times sum(mask) / (sum(mask) - 1) (a sum of 0 or 1 raises verl's error);
    (values - mean) * rsqrt(var + 1e-8), every position."""
    torch = _torch()
    total = mask.sum()
    mean = (values * mask).sum() / (total + 1e-8)
    variance = ((values - mean) ** 2 * mask).sum() / (total + 1e-8)
    if total == 0:
        raise ValueError("At least one element in the mask has to be 1.")
    if total == 1:
        raise ValueError("The sum of the mask is one, which can cause a division by zero.")
    variance = variance * (total / (total - 1))
    return (values - mean) * torch.rsqrt(variance + 1e-8)


def verl_reinforce_plus_plus_baseline(token_level_rewards, response_mask, index):
    """verl's ``compute_reinforce_plus_plus_baseline_outcome_advantage``: s - mean per uid (a uid of one row: mean
    0), tiled over the response and times the mask, ``masked_whiten`` over the mask, times the mask. (adv, adv)."""
    torch = _torch()
    length = token_level_rewards.shape[-1]
    scores = token_level_rewards.sum(dim=-1)
    with torch.no_grad():
        groups = _verl_groups(index, scores)
        means = {uid: torch.mean(torch.stack(m)) if len(m) > 1 else torch.tensor(0.0) for uid, m in groups.items()}
        for i in range(scores.shape[0]):
            scores[i] = scores[i] - means[index[i]]
        scores = scores.unsqueeze(-1).tile([1, length]) * response_mask
        scores = verl_torch_masked_whiten(scores, response_mask) * response_mask
    return scores, scores


def verl_reinforce_plus_plus(token_level_rewards, response_mask, gamma, before_7300=False):
    """verl's ``compute_reinforce_plus_plus_outcome_advantage``, t from T-1 down, then ``masked_whiten`` of the
    returns over the mask, times the mask. (advantages, returns).

    Since #7300 (issue #7278): G = r_t + gamma run; returns_t = G m_t; run = G m_t + run (1 - m_t): a masked
    token (tool output, padding) passes the running return through untouched and has return 0.
    ``before_7300``: returns_t = r_t + gamma run, then run = returns_t m_t: the running return was reset to 0
    after every masked token, so a reward after an observation span never reached the earlier turns.
    """
    torch = _torch()
    with torch.no_grad():
        returns = torch.zeros_like(token_level_rewards)
        running = 0
        for t in reversed(range(token_level_rewards.shape[1])):
            m = response_mask[:, t]
            candidate = token_level_rewards[:, t] + gamma * running
            if before_7300:
                returns[:, t] = candidate
                running = candidate * m
            else:
                returns[:, t] = candidate * m
                running = candidate * m + running * (1 - m)
        advantages = verl_torch_masked_whiten(returns, response_mask) * response_mask
    return advantages, returns


def trl_nanstd(tensor, dim=None):
    """TRL's ``nanstd``: the nan-mean of the squared deviations from the nan-mean, times count / (count - 1) where
    count > 1 (NaN where count <= 1), square-rooted."""
    torch = _torch()
    mean = torch.nanmean(tensor, dim=dim, keepdim=True)
    variance = torch.nanmean((tensor - mean) ** 2, dim=dim, keepdim=True)
    count = torch.sum(~torch.isnan(tensor), dim=dim, keepdim=True)
    variance = variance * torch.where(count > 1, count / (count - 1), torch.full_like(variance, float("nan")))
    std = torch.sqrt(variance)
    return std.squeeze() if dim is None else std.squeeze(dim)


def trl_grpo_advantages(rewards, num_generations, scale_rewards="group"):
    """GRPOTrainer's advantages (``_generate_and_score_completions``, multi_objective_aggregation
    "sum_then_normalize"): consecutive groups of ``num_generations``; the group's nan-mean as baseline; scaled by
    the group's ``nanstd`` ("group"; 0 when num_generations is 1), the batch's ``nanstd`` ("batch"; 0 for one
    reward) or not at all ("none"), dividing by std + 1e-4; NaN advantages (unscorable completions) set to 0.
    GRPOConfig maps True to "group" and False to "none"."""
    torch = _torch()
    scale_rewards = {True: "group", False: "none"}.get(scale_rewards, scale_rewards)
    grouped = rewards.view(-1, num_generations)
    mean = torch.nanmean(grouped, dim=1).repeat_interleave(num_generations, dim=0)
    if scale_rewards in ("group", "none"):
        if num_generations > 1:
            std = trl_nanstd(grouped, dim=1).repeat_interleave(num_generations, dim=0)
        else:
            std = torch.zeros_like(rewards)
    elif scale_rewards == "batch":
        std = trl_nanstd(rewards).expand_as(rewards) if rewards.numel() > 1 else torch.zeros_like(rewards)
    else:
        raise ValueError(f"Invalid value for scale_rewards: {scale_rewards}. Must be one of 'batch', 'group', or "
                         "'none'.")
    advantages = rewards - mean
    if scale_rewards != "none":
        advantages = advantages / (std + 1e-4)
    return torch.nan_to_num(advantages, nan=0.0)


def trl_grpo_advantages_before_3992(rewards, num_generations, scale_rewards="group"):
    """The same block before TRL #3992 (the bug of #3991), as of edbe823: plain mean and std (no NaN handling),
    and the branches swapped: "batch" and "none" computed the group std, "group" the batch std, and "batch" and
    "none" divided by it (so "batch" scaled by the group std, "none" scaled too, "group" not at all)."""
    grouped = rewards.view(-1, num_generations)
    advantages = rewards - grouped.mean(dim=1).repeat_interleave(num_generations, dim=0)
    if scale_rewards in ("batch", "none"):
        std = grouped.std(dim=1).repeat_interleave(num_generations, dim=0)
    elif scale_rewards == "group":
        std = rewards.std().expand_as(rewards)
    else:
        raise ValueError(f"Invalid value for scale_rewards: {scale_rewards}.")
    if scale_rewards in ("batch", "none"):
        advantages = advantages / (std + 1e-4)
    return advantages


def openrlhf_group_rewards(rewards, n_samples_per_prompt, advantage_estimator):
    """OpenRLHF's reward shaping in ``compute_advantages_and_returns``, on the rewards in prompt order reshaped to
    (-1, n): rloo r - (S - r) / (n - 1); reinforce_baseline and dr_grpo r - mean; group_norm (r - mean) /
    (std + 1e-9), torch's unbiased std; anything else unchanged. Flattened back to (N,)."""
    grouped = rewards.reshape(-1, n_samples_per_prompt)
    if advantage_estimator == "rloo":
        grouped = grouped - (grouped.sum(-1, keepdim=True) - grouped) / (n_samples_per_prompt - 1)
    elif advantage_estimator in ("reinforce_baseline", "dr_grpo"):
        grouped = grouped - grouped.mean(-1, keepdim=True)
    elif advantage_estimator == "group_norm":
        grouped = (grouped - grouped.mean(-1, keepdim=True)) / (grouped.std(-1, keepdim=True) + 1e-9)
    return grouped.reshape(-1)
