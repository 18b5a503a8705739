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
