"""The benchmarks' baselines: the loops and the chunk scan that gae_xp replaces, as their authors write them.

* ``slime_serial_gae``: slime's loop over t, vectorised over the batch;
* ``slime_chunked_gae``: slime's published chunk scan, with a Python loop
  over the chunks for the carry;
* ``gae_matrix``: the fully parallel O(T^2) form ``A = delta @ W`` with
  ``W[k, t] = (gamma lam)^(k - t)`` for k >= t (constant coefficient only);
* ``verl_gae_loop``, ``openrlhf_gae_loop``, ``areal_packed_gae_loop``,
  ``areal_padded_gae_loop``, ``cleanrl_gae_loop``, ``trl_gae_loop``: the
  frameworks' GAE loops, for the adapter benchmark (torchrl's own functions
  are timed when installed);
* ``jax_scan_gae``, ``jax_associative_scan_gae``: what JAX users write
  instead (``lax.scan``, ``lax.associative_scan``), full contract, to run
  under ``jax.jit``.

They compute in the inputs' dtype in any array namespace and share nothing
with gae_xp's implementation (each builds its own decay matrix). They are
not the test oracle: that is ``gae_xp.reference``.
"""

from __future__ import annotations

import functools
import math

from gae_xp._compat import array_namespace, device_of


def gae_matrix(rewards, values, *, gamma=0.99, lam=0.95, bootstrap_value=0.0):
    """The O(T^2) matrix method for a constant gamma and lam, time last: ``A = delta @ W``."""
    xp = array_namespace(rewards, values)
    tail = xp.full((*rewards.shape[:-1], 1), float(bootstrap_value), dtype=values.dtype, device=device_of(values))
    delta = rewards + gamma * xp.concat([values[..., 1:], tail], axis=-1) - values
    advantages = delta @ _decay_matrix(xp, float(gamma * lam), rewards.shape[-1], delta, reverse=True)
    return advantages, advantages + values


def slime_serial_gae(rewards, values, gamma, lam):
    """slime's loop: t from T-1 down to 0, vectorised over the batch, V after the last step 0. Time last."""
    xp = array_namespace(rewards, values)
    length = rewards.shape[-1]
    last = xp.zeros(rewards.shape[:-1], dtype=values.dtype, device=device_of(values))
    reversed_advantages = []
    for t in reversed(range(length)):
        next_value = values[..., t + 1] if t < length - 1 else xp.zeros_like(last)
        delta = rewards[..., t] + gamma * next_value - values[..., t]
        last = delta + gamma * lam * last
        reversed_advantages.append(last)
    advantages = _stack_reversed(xp, reversed_advantages, rewards)
    return advantages, advantages + values


def slime_chunked_gae(rewards, values, gamma, lam, chunk_size=128):
    """slime's published chunk scan: flip, pad, one matmul per chunk batch, then a Python loop over chunks."""
    xp = array_namespace(rewards, values)
    length, size, w = rewards.shape[-1], chunk_size, gamma * lam
    tail = xp.zeros((*rewards.shape[:-1], 1), dtype=values.dtype, device=device_of(values))
    delta = xp.flip(rewards + gamma * xp.concat([values[..., 1:], tail], axis=-1) - values, axis=-1)
    n = math.ceil(length / size)
    pad = xp.zeros((*delta.shape[:-1], n * size - length), dtype=delta.dtype, device=device_of(delta))
    chunks = xp.reshape(xp.concat([delta, pad], axis=-1), (*delta.shape[:-1], n, size))
    local = chunks @ _decay_matrix(xp, w, size, delta, reverse=False)
    steps = xp.arange(1, size + 1, dtype=delta.dtype, device=device_of(delta))
    decay = xp.pow(xp.asarray(w, dtype=delta.dtype, device=device_of(delta)), steps)
    carry = xp.zeros(delta.shape[:-1], dtype=delta.dtype, device=device_of(delta))
    pieces = []
    for c in range(n):
        piece = local[..., c, :] + carry[..., None] * decay
        carry = piece[..., -1]
        pieces.append(piece)
    advantages = xp.flip(xp.concat(pieces, axis=-1)[..., :length], axis=-1)
    return advantages, advantages + values


def verl_gae_loop(rewards, values, response_mask, gamma, lam):
    """verl's loop: masked tokens skipped (mixed in by multiplication), masked whitening. [B, T]."""
    xp = array_namespace(rewards, values)
    mask = xp.astype(response_mask, values.dtype)
    next_value = last = xp.zeros(rewards.shape[:-1], dtype=values.dtype, device=device_of(values))
    columns = []
    for t in reversed(range(rewards.shape[-1])):
        delta = rewards[..., t] + gamma * next_value - values[..., t]
        candidate = delta + gamma * lam * last
        next_value = values[..., t] * mask[..., t] + (1 - mask[..., t]) * next_value
        last = candidate * mask[..., t] + (1 - mask[..., t]) * last
        columns.append(last)
    advantages = _stack_reversed(xp, columns, rewards)
    returns = advantages + values
    count = xp.sum(mask)
    mean = xp.sum(advantages * mask) / count
    var = xp.sum((advantages - mean) ** 2 * mask) / count * (count / (count - 1))
    return (advantages - mean) / xp.sqrt(var + 1e-8), returns


def openrlhf_gae_loop(values, rewards, action_mask, gamma, lam):
    """OpenRLHF's loop: values and rewards multiplied by the mask, value 0 after the end. [B, T]."""
    xp = array_namespace(rewards, values)
    mask = xp.astype(action_mask, values.dtype)
    advantages, _ = slime_serial_gae(rewards * mask, values * mask, gamma, lam)
    return advantages, advantages + values * mask


def areal_packed_gae_loop(rewards, values, cu_seqlens, bootstrap, gamma, lam):
    """AReaL's ``pygae1d_nolp_misalign``: a Python loop over the sequences and their tokens, one 0-d array each.

    1-D rewards of ``total`` tokens, values of ``total + N`` (one extra slot per sequence, multiplied by its
    bootstrap flag), N + 1 offsets; the extra slots are read, not written (AReaL multiplies in place).
    """
    xp = array_namespace(rewards, values)
    offsets = [int(o) for o in cu_seqlens]
    advantages, returns = [], []
    for i in reversed(range(len(offsets) - 1)):
        start, length, value_start = offsets[i], offsets[i + 1] - offsets[i], offsets[i] + i
        last = 0.0
        for t in reversed(range(length)):
            next_value = values[value_start + t + 1]
            if t == length - 1:
                next_value = next_value * bootstrap[i]
            delta = rewards[start + t] + gamma * next_value - values[value_start + t]
            last = delta + gamma * lam * last
            advantages.append(last)
            returns.append(last + values[value_start + t])
    return xp.stack(advantages[::-1]), xp.stack(returns[::-1])


def areal_padded_gae_loop(rewards, values, loss_mask, seq_no_eos_mask, discount, gae_lambda):
    """AReaL's padded block: t from T-2 down, blended by the loss mask; the last column bootstraps rows without EOS."""
    xp = array_namespace(rewards, values)
    batch, length = rewards.shape
    last = xp.zeros(batch, dtype=xp.float32, device=device_of(values))
    columns = [last]
    next_values = values[:, length - 1] * xp.astype(seq_no_eos_mask, values.dtype)
    for t in reversed(range(length - 1)):
        delta = rewards[:, t] + discount * next_values - values[:, t]
        candidate = delta + discount * gae_lambda * last
        mask = loss_mask[:, t]
        next_values = next_values * (1 - mask) + values[:, t] * mask
        last = last * (1 - mask) + candidate * mask
        columns.append(last)
    advantages = xp.stack(columns[::-1], axis=1)
    return advantages, advantages + values


def cleanrl_gae_loop(rewards, values, dones, next_value, next_done, gamma, gae_lambda):
    """CleanRL's loop: time-major [num_steps, num_envs], ``dones[t]`` stored before step t, ``next_value`` (1, N)."""
    xp = array_namespace(rewards, values)
    num_steps = rewards.shape[0]
    rows = []
    last = 0.0
    for t in reversed(range(num_steps)):
        if t == num_steps - 1:
            next_nonterminal, next_values = 1.0 - next_done, next_value
        else:
            next_nonterminal, next_values = 1.0 - dones[t + 1], values[t + 1]
        delta = rewards[t] + gamma * next_values * next_nonterminal - values[t]
        last = delta + gamma * gae_lambda * next_nonterminal * last
        rows.append(xp.reshape(last, rewards.shape[1:]))
    advantages = xp.stack(rows[::-1], axis=0)
    return advantages, advantages + values


def trl_gae_loop(rewards, values, padding_mask, gamma, lam):
    """TRL's PPOTrainer block: the plain loop, returns = A + V, then ``masked_whiten`` over ``~padding_mask``."""
    xp = array_namespace(rewards, values)
    advantages, returns = slime_serial_gae(rewards, values, gamma, lam)
    mask = xp.astype(~padding_mask, advantages.dtype)
    total = xp.sum(mask)
    mean = xp.sum(advantages * mask) / total
    var = xp.sum((advantages - mean) ** 2 * mask) / total * (total / (total - 1))
    whitened = (advantages - mean) / xp.sqrt(var + 1e-8)
    return xp.where(padding_mask, xp.zeros_like(whitened), whitened), returns


def _decay_matrix(xp, w: float, size: int, like, *, reverse: bool):
    """``M[k, t] = w^(k - t)`` for k >= t (reverse), else ``w^(t - k)`` for t >= k; 0 elsewhere; in like's dtype."""
    steps = xp.arange(size, dtype=like.dtype, device=device_of(like))
    lag = steps[:, None] - steps[None, :] if reverse else steps[None, :] - steps[:, None]
    causal = lag >= 0
    powers = xp.pow(xp.asarray(w, dtype=like.dtype, device=device_of(like)), xp.where(causal, lag, xp.zeros_like(lag)))
    return xp.where(causal, powers, xp.zeros_like(powers))


def _stack_reversed(xp, columns, like):
    if not columns:
        return xp.zeros(like.shape, dtype=like.dtype, device=device_of(like))
    return xp.stack(columns[::-1], axis=-1)


def jax_scan_gae(rewards, values, gamma, lam, terminated=None, truncated=None, mask=None):
    """What a JAX user writes: ``jax.lax.scan`` over time, reversed, carrying (A_{t+1}, V at the next real step).

    [B, T] arrays; the full contract for terminations, truncations and a mask
    (masked steps skipped, outputs 0), bootstrap 0. Run it under ``jax.jit``.
    """
    import jax
    import jax.numpy as jnp

    zero = jnp.zeros(rewards.shape[:-1], dtype=rewards.dtype)
    done = None
    if terminated is not None or truncated is not None:
        done = functools.reduce(jnp.logical_or, [x for x in (terminated, truncated) if x is not None])
    columns = [x.T for x in (rewards, values)] + [x.T for x in (terminated, done, mask) if x is not None]
    has_terminated, has_done, has_mask = terminated is not None, done is not None, mask is not None

    def step(carry, column):
        following, next_value = carry
        r, v, *rest = column
        term = rest.pop(0) if has_terminated else None
        cut = rest.pop(0) if has_done else None
        real = rest.pop(0) if has_mask else None
        bootstrapped = gamma * next_value if term is None else jnp.where(term, 0.0, gamma * next_value)
        carried = gamma * lam * following if cut is None else jnp.where(cut, 0.0, gamma * lam * following)
        advantage = r + bootstrapped - v + carried
        if real is None:
            return (advantage, v), advantage
        return (jnp.where(real, advantage, following), jnp.where(real, v, next_value)), jnp.where(real, advantage, 0.0)

    _, advantages = jax.lax.scan(step, (zero, zero), tuple(columns), reverse=True)
    advantages = advantages.T
    returns = advantages + values
    return advantages, returns if mask is None else jnp.where(mask, returns, 0.0)


def jax_associative_scan_gae(rewards, values, gamma, lam, terminated=None, truncated=None, mask=None):
    """The parallel JAX alternative: two ``jax.lax.associative_scan`` linear recurrences over time.

    ``y_t = b_t + a_t y_{t+1}`` composes associatively; the first scan finds V
    at the next real step (a mask's holes pass it through), the second the
    advantages (a done step has a = 0, a masked step is the identity).
    Cuts use ``where``. [B, T] arrays, bootstrap 0; run it under ``jax.jit``.
    """
    import jax
    import jax.numpy as jnp

    def combine(later, earlier):  # the map z -> b + a z of `earlier` applied after `later`'s
        a_later, b_later = later
        a_earlier, b_earlier = earlier
        return a_earlier * a_later, b_earlier + jnp.where(a_earlier == 0, 0.0, a_earlier * b_later)

    def solve(a, b):
        return jax.lax.associative_scan(combine, (a, b), reverse=True, axis=a.ndim - 1)[1]

    zero_column = jnp.zeros((*rewards.shape[:-1], 1), dtype=rewards.dtype)
    if mask is None:
        next_value = jnp.concatenate([values[..., 1:], zero_column], axis=-1)
    else:  # F_t = V_t at a real step, else F_{t+1}; V at the next real step after t is F_{t+1}
        first_real = solve(jnp.where(mask, 0.0, 1.0).astype(rewards.dtype), jnp.where(mask, values, 0.0))
        next_value = jnp.concatenate([first_real[..., 1:], zero_column], axis=-1)
    bootstrapped = gamma * next_value
    if terminated is not None:
        bootstrapped = jnp.where(terminated, 0.0, bootstrapped)
    delta = rewards + bootstrapped - values
    a = jnp.full(rewards.shape, gamma * lam, dtype=rewards.dtype)
    for flag in (terminated, truncated):
        if flag is not None:
            a = jnp.where(flag, 0.0, a)
    if mask is not None:
        a, delta = jnp.where(mask, a, 1.0), jnp.where(mask, delta, 0.0)
    advantages = solve(a, delta)
    if mask is None:
        return advantages, advantages + values
    return jnp.where(mask, advantages, 0.0), jnp.where(mask, advantages + values, 0.0)
