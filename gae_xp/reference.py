"""Plain reference implementations: the test oracle and the benchmarks' baselines.

* ``gae_loop`` / ``discounted_cumsum_loop``: the per-step loop over time with
  the full contract of ``gae()`` / ``discounted_cumsum()``, in any array
  namespace, computing in the inputs' dtype (pass float64 for an oracle).
* ``gae_matrix``: the fully parallel O(T^2) form ``A = delta @ W`` with
  ``W[k, t] = (gamma lam)^(k - t)`` for k >= t (constant coefficient only).
* ``slime_serial_gae`` and ``slime_chunked_gae``: the two published baselines
  (slime): the batch-vectorised loop over t, and the chunk scan with a Python
  loop over chunks for the carry.

All take ``[..., T]`` arrays with time last unless ``axis`` says otherwise.
"""

from __future__ import annotations

import math
import numbers

from array_api_compat import array_namespace
from array_api_compat import device as device_of

from ._scan import _kernel


def gae_loop(rewards, values, *, gamma=0.99, lam=0.95, bootstrap_value=None, next_values=None,
             terminated=None, truncated=None, mask=None, axis=-1):
    """``gae()``'s contract, one step at a time from T-1 down to 0. Returns (advantages, returns)."""
    xp = array_namespace(rewards, values)
    shape = tuple(rewards.shape)
    r, v = _time_last(xp, rewards, axis), _time_last(xp, values, axis)
    dtype, batch = r.dtype, r.shape[:-1]
    per_step = {name: None if a is None else _time_last(xp, xp.broadcast_to(a, shape), axis)
                for name, a in (("gamma", _as_array(xp, gamma, r)), ("lam", _as_array(xp, lam, r)),
                                ("next_values", next_values), ("terminated", terminated),
                                ("truncated", truncated), ("mask", mask))}
    zero = xp.zeros(batch, dtype=dtype, device=device_of(r))
    next_value = zero if bootstrap_value is None else xp.broadcast_to(_as_array(xp, bootstrap_value, r), batch)
    following = zero
    columns = []
    for t in reversed(range(r.shape[-1])):
        at = {name: None if a is None else a[..., t] for name, a in per_step.items()}
        v_next = next_value if at["next_values"] is None else at["next_values"]
        bootstrapped = at["gamma"] * v_next
        if at["terminated"] is not None:
            bootstrapped = xp.where(at["terminated"] != 0, zero, bootstrapped)
        delta = r[..., t] + bootstrapped - v[..., t]
        keep = at["gamma"] * at["lam"]
        for done in (at["terminated"], at["truncated"]):
            if done is not None:
                keep = keep * (1 - xp.astype(done != 0, dtype))
        advantage = delta + keep * following
        if at["mask"] is None:
            following, next_value = advantage, v[..., t]
            columns.append(advantage)
        else:
            following = xp.where(at["mask"], advantage, following)
            next_value = xp.where(at["mask"], v[..., t], next_value)
            columns.append(xp.where(at["mask"], advantage, zero))
    advantages = _stack_reversed(xp, columns, r)
    returns = advantages + v
    if per_step["mask"] is not None:
        returns = xp.where(per_step["mask"], returns, xp.zeros_like(returns))
    return xp.moveaxis(advantages, -1, axis), xp.moveaxis(returns, -1, axis)


def discounted_returns_loop(rewards, *, gamma=0.99, terminated=None, truncated=None, mask=None,
                            bootstrap_value=None, axis=-1):
    """``G_t = r_t + gamma_t (1 - done_t) G_{t+1}``, ``G_T = bootstrap_value``, one step at a time; masked steps skipped."""
    xp, r, at = _per_step(rewards, axis, gamma=gamma, terminated=terminated, truncated=truncated, mask=mask)
    zero = xp.zeros(r.shape[:-1], dtype=r.dtype, device=device_of(r))
    following = zero if bootstrap_value is None else xp.broadcast_to(_as_array(xp, bootstrap_value, r), zero.shape)
    columns = []
    for t in reversed(range(r.shape[-1])):
        step = at(t)
        value = r[..., t] + step["gamma"] * _not_done(xp, step, r.dtype) * following
        real = step["mask"]
        following = value if real is None else xp.where(real, value, following)
        columns.append(value if real is None else xp.where(real, value, zero))
    return xp.moveaxis(_stack_reversed(xp, columns, r), -1, axis)


def lambda_returns_loop(rewards, next_values, *, gamma=0.99, lam=0.95, terminated=None, truncated=None, mask=None,
                        axis=-1):
    """TD(lambda) targets one step at a time; ``G_{t+1} := V'_t`` at a done step and at a row's last real step."""
    xp, r, at = _per_step(rewards, axis, gamma=gamma, lam=lam, next_values=next_values, terminated=terminated,
                          truncated=truncated, mask=mask)
    zero = xp.zeros(r.shape[:-1], dtype=r.dtype, device=device_of(r))
    following, seen = zero, xp.zeros(zero.shape, dtype=xp.bool, device=device_of(r))
    columns = []
    for t in reversed(range(r.shape[-1])):
        step = at(t)
        v_next = step["next_values"]
        after = xp.where(seen & (_not_done(xp, step, r.dtype) == 1), following, v_next)
        discount = step["gamma"] * _not(xp, step["terminated"], r.dtype)
        value = r[..., t] + discount * ((1 - step["lam"]) * v_next + step["lam"] * after)
        real = step["mask"]
        if real is None:
            following, seen = value, xp.ones_like(seen)
            columns.append(value)
        else:
            following, seen = xp.where(real, value, following), seen | real
            columns.append(xp.where(real, value, zero))
    return xp.moveaxis(_stack_reversed(xp, columns, r), -1, axis)


def vtrace_loop(log_rhos, rewards, values, *, gamma=0.99, lam=1.0, clip_rho_threshold=1.0, clip_c_threshold=1.0,
                clip_pg_rho_threshold=1.0, bootstrap_value=None, next_values=None, terminated=None, truncated=None,
                mask=None, axis=-1):
    """``gae_xp.vtrace``'s contract one step at a time: returns (vs, pg_advantages)."""
    xp, r, at = _per_step(rewards, axis, gamma=gamma, lam=lam, values=values, log_rhos=log_rhos,
                          next_values=next_values, terminated=terminated, truncated=truncated, mask=mask)
    zero = xp.zeros(r.shape[:-1], dtype=r.dtype, device=device_of(r))
    latest_v = zero if bootstrap_value is None else xp.broadcast_to(_as_array(xp, bootstrap_value, r), zero.shape)
    latest_correction = zero  # vs - V at the next real step
    vs_columns, pg_columns = [], []
    for t in reversed(range(r.shape[-1])):
        step = at(t)
        rho = xp.exp(step["log_rhos"])
        v, v_next = step["values"], latest_v if step["next_values"] is None else step["next_values"]
        discount = step["gamma"] * _not(xp, step["terminated"], r.dtype)
        keep = _not_done(xp, step, r.dtype)
        delta = xp.minimum(rho, clip_rho_threshold + 0 * rho) * (r[..., t] + discount * v_next - v)
        c = step["lam"] * xp.minimum(rho, clip_c_threshold + 0 * rho)
        correction = delta + step["gamma"] * keep * c * latest_correction
        vs_next = v_next + keep * latest_correction
        pg = xp.minimum(rho, clip_pg_rho_threshold + 0 * rho) * (r[..., t] + discount * vs_next - v)
        real = step["mask"]
        if real is None:
            latest_v, latest_correction = v, correction
            vs_columns.append(correction + v)
            pg_columns.append(pg)
        else:
            latest_v = xp.where(real, v, latest_v)
            latest_correction = xp.where(real, correction, latest_correction)
            vs_columns.append(xp.where(real, correction + v, zero))
            pg_columns.append(xp.where(real, pg, zero))
    return (xp.moveaxis(_stack_reversed(xp, vs_columns, r), -1, axis),
            xp.moveaxis(_stack_reversed(xp, pg_columns, r), -1, axis))


def discounted_cumsum_loop(x, discount, *, axis=-1, reverse=True, initial=None):
    """``y_t = x_t + discount_t y_{t+1}`` (reverse) or ``y_{t-1}`` (forward), one step at a time."""
    xp = array_namespace(x)
    y = _time_last(xp, x, axis)
    batch = y.shape[:-1]
    a = _time_last(xp, xp.broadcast_to(_as_array(xp, discount, y), tuple(x.shape)), axis)
    state = xp.zeros(batch, dtype=y.dtype, device=device_of(y))
    if initial is not None:
        state = xp.broadcast_to(_as_array(xp, initial, y), batch)
    steps = range(y.shape[-1])
    columns = []
    for t in (reversed(steps) if reverse else steps):
        state = y[..., t] + a[..., t] * state
        columns.append(state)
    out = _stack_reversed(xp, columns, y) if reverse else _stack(xp, columns, y)
    return xp.moveaxis(out, -1, axis)


def gae_matrix(rewards, values, *, gamma=0.99, lam=0.95, bootstrap_value=0.0):
    """The O(T^2) matrix method for a constant gamma and lam, time last: ``A = delta @ W``."""
    xp = array_namespace(rewards, values)
    tail = xp.full((*rewards.shape[:-1], 1), float(bootstrap_value), dtype=values.dtype, device=device_of(values))
    delta = rewards + gamma * xp.concat([values[..., 1:], tail], axis=-1) - values
    advantages = delta @ _kernel(xp, float(gamma * lam), rewards.shape[-1], True, delta)
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
    local = chunks @ _kernel(xp, w, size, False, delta)
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


def torchrl_gae_loop(gamma, lmbda, state_value, next_state_value, reward, done, terminated):
    """torchrl's GAE one step at a time, time at -2: delta = r + g (1 - term) V' - V; A = delta + g l (1 - done) A'."""
    xp = array_namespace(reward)
    following = xp.zeros_like(reward[..., 0, :])
    not_done, not_terminated = 1 - xp.astype(done, reward.dtype), 1 - xp.astype(terminated, reward.dtype)
    columns = []
    for t in reversed(range(reward.shape[-2])):
        delta = reward[..., t, :] + gamma * not_terminated[..., t, :] * next_state_value[..., t, :] - state_value[..., t, :]
        following = delta + gamma * lmbda * not_done[..., t, :] * following
        columns.append(following)
    advantage = xp.stack(columns[::-1], axis=-2)
    return advantage, advantage + state_value


def _per_step(rewards, axis, **named):
    """(xp, rewards with time last, at) where at(t) gives every named argument at step t (a float stays a float)."""
    xp = array_namespace(rewards)
    shape = tuple(rewards.shape)
    r = _time_last(xp, rewards, axis)
    moved = {}
    for name, value in named.items():
        if value is None or isinstance(value, (int, float)):
            moved[name] = value
        else:
            moved[name] = _time_last(xp, xp.broadcast_to(value, shape), axis)

    def at(t):
        return {name: value if value is None or isinstance(value, (int, float)) else value[..., t]
                for name, value in moved.items()}

    return xp, r, at


def _not(xp, flag, dtype):
    """1 - flag as a float (1 where the flag is absent)."""
    return 1.0 if flag is None else 1 - xp.astype(flag != 0, dtype)


def _not_done(xp, step, dtype):
    return _not(xp, step["terminated"], dtype) * _not(xp, step["truncated"], dtype)


def _time_last(xp, a, axis):
    return xp.moveaxis(a, axis, -1)


def _as_array(xp, value, like):
    if isinstance(value, numbers.Real) and not isinstance(value, bool):
        return xp.asarray(float(value), dtype=like.dtype, device=device_of(like))
    return xp.astype(value, like.dtype)


def _stack(xp, columns, like):
    if not columns:
        return xp.zeros(like.shape, dtype=like.dtype, device=device_of(like))
    return xp.stack(columns, axis=-1)


def _stack_reversed(xp, columns, like):
    return _stack(xp, columns[::-1], like)
