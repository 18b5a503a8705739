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
