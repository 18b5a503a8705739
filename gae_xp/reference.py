"""The test oracle: plain per-step loops over time with the full contract of each public function.

* ``gae_loop`` / ``discounted_cumsum_loop`` / ``discounted_returns_loop`` /
  ``lambda_returns_loop`` / ``vtrace_loop``: one step at a time from the last
  step to the first (``discounted_cumsum_loop`` also forwards), in any array
  namespace, computing in the inputs' dtype (pass float64 for an oracle).

They share no code with the implementation (only its import point for
array-api-compat). Each cuts the trace the way the contract says: the term
carried from the following step is chosen with ``where``, so at a done step
or a zero coefficient nothing behind it, NaN and inf included, reaches the
step (``0 * inf`` would be NaN). The benchmarks'
baselines (slime's and the frameworks' loops, the O(T^2) matrix) live in
``gae_xp.bench.baselines``.

All take ``[..., T]`` arrays with time last unless ``axis`` says otherwise.
"""

from __future__ import annotations

import numbers

from gae_xp._compat import array_namespace, device_of


def gae_loop(rewards, values, *, gamma=0.99, lam=0.95, bootstrap_value=None, next_values=None,
             terminated=None, truncated=None, mask=None, axis=-1, fill_masked=False, critic_lam=None):
    """``gae()``'s contract, one step at a time from T-1 down to 0. Returns (advantages, returns).

    With ``critic_lam`` a second advantage runs beside the first with
    ``gamma * critic_lam`` from the same deltas, and the returns are it + V.
    """
    xp, r, at = _per_step(rewards, axis, gamma=gamma, lam=lam, values=values, next_values=next_values,
                          terminated=terminated, truncated=truncated, mask=mask,
                          critic_lam=lam if critic_lam is None else critic_lam)
    zero = xp.zeros(r.shape[:-1], dtype=r.dtype, device=device_of(r))
    next_value = _boundary(xp, bootstrap_value, r, zero)
    following = critic_following = zero
    advantage_columns, return_columns = [], []
    for t in reversed(range(r.shape[-1])):
        step = at(t)
        v = step["values"]
        v_next = next_value if step["next_values"] is None else step["next_values"]
        bootstrapped = _unless(xp, step["terminated"], step["gamma"] * v_next, zero)
        delta = r[..., t] + bootstrapped - v
        advantage = delta + _carried(xp, step, step["gamma"] * step["lam"], following, zero)
        critic = delta + _carried(xp, step, step["gamma"] * step["critic_lam"], critic_following, zero)
        real = step["mask"]
        if real is None:
            following, critic_following, next_value = advantage, critic, v
            advantage_columns.append(advantage)
            return_columns.append(critic + v)
        else:
            following = xp.where(real, advantage, following)
            critic_following = xp.where(real, critic, critic_following)
            next_value = xp.where(real, v, next_value)
            kept = real | fill_masked  # verl's convention: a masked step shows the next real step's advantage
            advantage_columns.append(xp.where(kept, following, zero))
            return_columns.append(xp.where(kept, critic_following + v, zero))
    return (xp.moveaxis(_stack_reversed(xp, advantage_columns, r), -1, axis),
            xp.moveaxis(_stack_reversed(xp, return_columns, r), -1, axis))


def discounted_returns_loop(rewards, *, gamma=0.99, terminated=None, truncated=None, mask=None,
                            bootstrap_value=None, axis=-1):
    """``G_t = r_t + gamma_t (1 - done_t) G_{t+1}``, ``G_T = bootstrap_value``, one step at a time; masked steps
    skipped."""
    xp, r, at = _per_step(rewards, axis, gamma=gamma, terminated=terminated, truncated=truncated, mask=mask)
    zero = xp.zeros(r.shape[:-1], dtype=r.dtype, device=device_of(r))
    following = _boundary(xp, bootstrap_value, r, zero)
    columns = []
    for t in reversed(range(r.shape[-1])):
        step = at(t)
        value = r[..., t] + _carried(xp, step, step["gamma"], following, zero)
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
        continues = seen & ~_done(xp, step)
        target = (1 - step["lam"]) * v_next + _unless(xp, ~continues, step["lam"] * following, zero)
        target = xp.where(continues, target, v_next)
        value = r[..., t] + _unless(xp, step["terminated"], step["gamma"] * target, zero)
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
    latest_v = _boundary(xp, bootstrap_value, r, zero)
    latest_correction = zero  # vs - V at the next real step
    vs_columns, pg_columns = [], []
    for t in reversed(range(r.shape[-1])):
        step = at(t)
        rho = xp.exp(step["log_rhos"])
        v, v_next = step["values"], latest_v if step["next_values"] is None else step["next_values"]
        delta = xp.minimum(rho, clip_rho_threshold + 0 * rho) * (
            r[..., t] + _unless(xp, step["terminated"], step["gamma"] * v_next, zero) - v)
        c = step["lam"] * xp.minimum(rho, clip_c_threshold + 0 * rho)
        correction = delta + _carried(xp, step, step["gamma"] * c, latest_correction, zero)
        vs_next = v_next + _unless(xp, _done(xp, step), latest_correction, zero)
        pg = xp.minimum(rho, clip_pg_rho_threshold + 0 * rho) * (
            r[..., t] + _unless(xp, step["terminated"], step["gamma"] * vs_next, zero) - v)
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
    """``y_t = x_t + discount_t y_{t+1}`` (reverse) or ``y_{t-1}`` (forward), one step at a time; 0 cuts exactly."""
    xp = array_namespace(x)
    y = _time_last(xp, x, axis)
    batch = y.shape[:-1]
    a = _time_last(xp, xp.broadcast_to(_as_array(xp, discount, y), tuple(x.shape)), axis)
    zero = xp.zeros(batch, dtype=y.dtype, device=device_of(y))
    state = _boundary(xp, initial, y, zero)
    steps = range(y.shape[-1])
    columns = []
    for t in (reversed(steps) if reverse else steps):
        coefficient = a[..., t]
        state = y[..., t] + coefficient * xp.where(coefficient == 0, zero, state)
        columns.append(state)
    out = _stack_reversed(xp, columns, y) if reverse else _stack(xp, columns, y)
    return xp.moveaxis(out, -1, axis)


def _carried(xp, step, coefficient, following, zero):
    """coefficient * following, or exactly 0 where the trace is cut (a done step or a zero coefficient)."""
    cut = _done(xp, step) | (coefficient == 0)
    return coefficient * xp.where(cut, zero, following)


def _done(xp, step):
    """terminated | truncated at this step as a bool array (False where neither is given)."""
    done = xp.zeros(step["gamma"].shape, dtype=xp.bool, device=device_of(step["gamma"]))
    for name in ("terminated", "truncated"):
        if step.get(name) is not None:
            done = done | (step[name] != 0)
    return done


def _unless(xp, flag, value, zero):
    """value, or exactly 0 where the flag is set (where the flag is absent, value)."""
    return value if flag is None else xp.where(flag != 0, zero, value)


def _per_step(rewards, axis, **named):
    """(xp, rewards with time last, at) where at(t) gives every named argument at step t, as arrays of the batch
    shape."""
    xp = array_namespace(rewards)
    shape = tuple(rewards.shape)
    r = _time_last(xp, rewards, axis)
    moved = {}
    for name, value in named.items():
        if value is None:
            moved[name] = None
        else:
            moved[name] = _time_last(xp, xp.broadcast_to(_as_array(xp, value, r, cast=name != "mask"), shape),
                                     axis)

    def at(t):
        return {name: None if value is None else value[..., t] for name, value in moved.items()}

    return xp, r, at


def _time_last(xp, a, axis):
    return xp.moveaxis(a, axis, -1)


def _as_array(xp, value, like, *, cast=True):
    """A number or an array as an array in like's dtype (bool flags and masks keep their dtype)."""
    if isinstance(value, numbers.Real) and not isinstance(value, bool):
        return xp.asarray(float(value), dtype=like.dtype, device=device_of(like))
    if not cast or xp.isdtype(value.dtype, "bool"):
        return value
    return xp.astype(value, like.dtype)


def _boundary(xp, value, like, zero):
    return zero if value is None else xp.broadcast_to(_as_array(xp, value, like), zero.shape)


def _stack(xp, columns, like):
    if not columns:
        return xp.zeros(like.shape, dtype=like.dtype, device=device_of(like))
    return xp.stack(columns, axis=-1)


def _stack_reversed(xp, columns, like):
    return _stack(xp, columns[::-1], like)
