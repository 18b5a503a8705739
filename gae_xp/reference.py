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

import math
import numbers
from typing import Any, Callable, Union

import numpy as np

from gae_xp._compat import array_namespace, device_of

#: An array of any array-API library (NumPy, PyTorch, CuPy, JAX, Dask, ...).
Array = Any
#: A coefficient: a Python or NumPy number, or an array broadcastable to the inputs.
Coefficient = Union[float, Array]


def gae_loop(rewards: Array, values: Array, *, gamma: Coefficient = 0.99, lam: Coefficient = 0.95,
             bootstrap_value: Coefficient | None = None, next_values: Array | None = None,
             terminated: Array | None = None, truncated: Array | None = None, mask: Array | None = None,
             axis: int = -1, fill_masked: bool = False, critic_lam: Coefficient | None = None,
             truncated_bootstrap: str = "next_values") -> tuple[Array, Array]:
    r"""``gae()``'s contract, one step at a time from T-1 down to 0: ``(advantages, returns)``.

    For t = T-1 .. 0, with ``done_t = terminated_t or truncated_t``, Vnext_t = ``next_values[t]`` if given, else
    V at the next real step, else ``bootstrap_value``::

        delta_t = r_t + (0 if terminated_t else gamma_t Vnext_t) - V_t
        A_t     = delta_t + (0 if done_t or gamma_t lam_t == 0 else gamma_t lam_t A_{t+1})
        returns = A + V

    The term carried from the next step is chosen with ``where``, so nothing behind a cut (NaN and inf
    included) reaches the step. With ``critic_lam`` a second advantage runs beside the first with
    ``gamma * critic_lam`` from the same deltas, and the returns are it + V.

    Parameters
    ----------
    rewards, values : array
        Arrays of one shape, of one array-API library; time is ``axis``. The loop computes in their dtype: pass
        float64 for an oracle.
    gamma, lam : float or array, default 0.99 and 0.95
        Numbers or arrays broadcastable to ``rewards`` (unchecked).
    bootstrap_value : float or array of the batch shape, optional
        The value after the last real step; default 0.
    next_values : array, optional
        V(s_{t+1}) per step; replaces the shifted values and ``bootstrap_value``.
    terminated, truncated : bool arrays, optional
        The episode ended at t (no bootstrap, the trace cut) / was cut at t (the trace cut, Vnext still
        bootstrapped: ``truncated`` needs ``next_values`` unless ``truncated_bootstrap="next_step"``).
    mask : bool array, optional
        True for a real step; a masked step is skipped (no discount across it) and gets 0.
    axis : int, default -1
        The time axis.
    fill_masked : bool, default False
        verl's convention: a masked step shows the next real step's advantage, and that + its own value.
    critic_lam : float or array, optional
        The returns' lambda (decoupled GAE); None: ``lam``.
    truncated_bootstrap : {"next_values", "next_step"}, default "next_values"
        As in ``gae()``: "next_step" lets ``truncated`` go without ``next_values`` (Vnext = V at the next real
        step, else ``bootstrap_value``); otherwise that is a ValueError.

    Returns
    -------
    advantages, returns : array
        Shaped like ``rewards``, in its namespace and dtype, time on ``axis``.

    Examples
    --------
    >>> import numpy as np
    >>> from gae_xp.reference import gae_loop
    >>> rewards, values = np.array([[0.0, 0.0, 1.0]]), np.array([[0.5, 0.5, 0.5]])
    >>> gae_loop(rewards, values, gamma=1.0, lam=1.0)
    (array([[0.5, 0.5, 0.5]]), array([[1., 1., 1.]]))
    >>> gae_loop(rewards, values, gamma=1.0, lam=1.0, mask=np.array([[True, False, True]]))
    (array([[0.5, 0. , 0.5]]), array([[1., 0., 1.]]))

    A terminated step cuts the trace exactly: the NaN behind it does not reach steps 0 and 1.

    >>> gae_loop(rewards, np.array([[0.5, 0.5, np.nan]]), gamma=1.0, lam=1.0,
    ...          terminated=np.array([[False, True, False]]))[0]
    array([[-0.5, -0.5,  nan]])
    """
    _truncation(truncated, next_values, truncated_bootstrap)
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


def discounted_returns_loop(rewards: Array, *, gamma: Coefficient = 0.99, terminated: Array | None = None,
                            truncated: Array | None = None, mask: Array | None = None,
                            bootstrap_value: Coefficient | None = None, axis: int = -1) -> Array:
    r"""``discounted_returns()``'s contract one step at a time: ``G_t = r_t + gamma_t (1 - done_t) G_{t+1}``.

    ``G_T = bootstrap_value`` (default 0); a done step or a zero gamma cuts exactly, and a masked step is skipped
    and gets 0.

    Parameters
    ----------
    rewards : array
        Any array-API library's array; time is ``axis``; the loop computes in its dtype.
    gamma : float or array, default 0.99
        A number or an array broadcastable to ``rewards``.
    terminated, truncated : bool arrays, optional
        Either cuts the trace at its step.
    mask : bool array, optional
        True for a real step.
    bootstrap_value : float or array of the batch shape, optional
        The return after the last real step; default 0.
    axis : int, default -1
        The time axis.

    Returns
    -------
    array
        G, shaped like ``rewards``, in its namespace and dtype.

    Examples
    --------
    >>> import numpy as np
    >>> from gae_xp.reference import discounted_returns_loop
    >>> discounted_returns_loop(np.array([1.0, 0.0, 2.0]), gamma=0.5)
    array([1.5, 1. , 2. ])
    >>> discounted_returns_loop(np.array([1.0, 0.0, 2.0]), gamma=0.5, terminated=np.array([False, True, False]))
    array([1., 0., 2.])
    """
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


def lambda_returns_loop(rewards: Array, next_values: Array, *, gamma: Coefficient = 0.99, lam: Coefficient = 0.95,
                        terminated: Array | None = None, truncated: Array | None = None, mask: Array | None = None,
                        axis: int = -1) -> Array:
    r"""``lambda_returns()``'s TD(lambda) targets one step at a time.

    ::

        G_t = r_t + (0 if terminated_t else gamma_t [(1 - lam_t) V'_t + lam_t G_{t+1}])

    with ``G_{t+1} := V'_t`` at a done step and at a row's last real step.

    Parameters
    ----------
    rewards, next_values : array
        Arrays of one shape; ``next_values[t]`` is V(s_{t+1}); the loop computes in the rewards' dtype.
    gamma, lam : float or array, default 0.99 and 0.95
        Numbers or arrays broadcastable to ``rewards``.
    terminated, truncated : bool arrays, optional
        Either cuts the trace at its step; terminated also drops the bootstrap.
    mask : bool array, optional
        True for a real step; a masked step is skipped and gets 0.
    axis : int, default -1
        The time axis.

    Returns
    -------
    array
        G, shaped like ``rewards``, in its namespace and dtype.

    Examples
    --------
    >>> import numpy as np
    >>> from gae_xp.reference import lambda_returns_loop
    >>> lambda_returns_loop(np.array([1.0, 1.0]), np.array([2.0, 4.0]), gamma=0.5, lam=0.5)
    array([2.25, 3.  ])
    """
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


def vtrace_loop(log_rhos: Array, rewards: Array, values: Array, *, gamma: Coefficient = 0.99,
                lam: Coefficient = 1.0, clip_rho_threshold: float = 1.0, clip_c_threshold: float = 1.0,
                clip_pg_rho_threshold: float = 1.0, bootstrap_value: Coefficient | None = None,
                next_values: Array | None = None, terminated: Array | None = None, truncated: Array | None = None,
                mask: Array | None = None, axis: int = -1,
                truncated_bootstrap: str = "next_values") -> tuple[Array, Array]:
    r"""``vtrace()``'s contract one step at a time: ``(vs, pg_advantages)``.

    With ``rho_t = exp(log_rhos_t)`` and Vnext as in ``gae_loop``::

        delta_t    = min(rho_t, clip_rho_threshold) (r_t + gamma_t (1 - terminated_t) Vnext_t - V_t)
        vs_t - V_t = delta_t + gamma_t (1 - done_t) lam_t min(rho_t, clip_c_threshold) (vs - V)_{t+1}
        pg_t       = min(rho_t, clip_pg_rho_threshold) (r_t + gamma_t (1 - terminated_t) vs_next_t - V_t)

    where ``vs_next_t = Vnext_t + (vs - V)`` of the next real step, or Vnext_t where the trace is cut.

    Parameters
    ----------
    log_rhos, rewards, values : array
        Arrays of one shape: the log importance ratios, rewards and V(s_t); the loop computes in the rewards'
        dtype.
    gamma, lam : float or array, default 0.99 and 1.0
        Numbers or arrays broadcastable to ``rewards``; lam enters the trace coefficient only.
    clip_rho_threshold, clip_c_threshold, clip_pg_rho_threshold : float, default 1.0
        The clipping thresholds of rho in the deltas, the trace and the policy-gradient target.
    bootstrap_value, next_values, terminated, truncated, mask, axis, truncated_bootstrap
        As in ``gae_loop``.

    Returns
    -------
    vs, pg_advantages : array
        Shaped like ``rewards``, in its namespace and dtype; 0 at masked steps.

    Examples
    --------
    >>> import numpy as np
    >>> from gae_xp.reference import vtrace_loop
    >>> vtrace_loop(np.zeros(2), np.array([0.0, 1.0]), np.array([0.5, 0.5]), gamma=1.0)
    (array([1., 1.]), array([0.5, 0.5]))
    """
    _truncation(truncated, next_values, truncated_bootstrap)
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


def discounted_cumsum_loop(x: Array, discount: Coefficient, *, axis: int = -1, reverse: bool = True,
                           initial: Coefficient | None = None) -> Array:
    r"""``discounted_cumsum()`` one step at a time: ``y_t = x_t + discount_t y_{t+1}`` (reverse) or ``y_{t-1}``.

    ``y`` beyond the edge is ``initial`` (default 0); a zero discount cuts exactly (``y_t = x_t``, even next to
    NaN or inf).

    Parameters
    ----------
    x : array
        Any array-API library's array; time is ``axis``; the loop computes in its dtype.
    discount : float or array
        A number or an array broadcastable to ``x`` (unchecked).
    axis : int, default -1
        The time axis.
    reverse : bool, default True
        From the last step back, or from the first on.
    initial : float or array of the batch shape, optional
        The value entering at the edge; default 0.

    Returns
    -------
    array
        y, shaped like ``x``, in its namespace and dtype.

    Examples
    --------
    >>> import numpy as np
    >>> from gae_xp.reference import discounted_cumsum_loop
    >>> discounted_cumsum_loop(np.array([1.0, 1.0, 1.0]), 0.5)
    array([1.75, 1.5 , 1.  ])
    >>> discounted_cumsum_loop(np.array([1.0, 1.0, 1.0]), 0.5, reverse=False, initial=4.0)
    array([3.  , 2.5 , 2.25])
    >>> discounted_cumsum_loop(np.array([1.0, 1.0, np.inf]), np.array([0.5, 0.0, 0.5]))
    array([1.5, 1. , inf])
    """
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


def group_advantages_loop(scores, group_ids, *, baseline: str | None = "mean", scale: str | None = "group",
                          eps: float = 1e-6, unbiased: bool = True) -> np.ndarray:
    r"""``group_advantages()`` one group at a time, in Python floats (float64, ``math.fsum``): a float64 array (N,).

    The groups of a dict of lists, in the order their ids first appear
    (verl's reference loop, with the contract of ``group_advantages``): NaN
    scores left out of every statistic and given 0; a group whose other
    scores are all equal has mean exactly that score and M2 = 0; under
    ``scale="group"`` such a group gets 0, and under ``scale="batch"`` every
    score gets 0 when the batch's M2 is 0. A group with an infinite score has
    mean and M2 NaN: its advantages are NaN (but with ``baseline=None`` and
    ``scale=None``), and under ``scale="batch"`` every score's that is not NaN.

    Parameters
    ----------
    scores : array (N,)
        Read as float64 (NumPy, or anything ``np.asarray`` takes).
    group_ids : int or integer array (N,)
        An int k (consecutive groups of k) or one id per score.
    baseline, scale, eps, unbiased
        As in ``gae_xp.group_advantages``.

    Returns
    -------
    numpy.ndarray (N,)
        float64.

    Examples
    --------
    >>> import numpy as np
    >>> from gae_xp.reference import group_advantages_loop
    >>> group_advantages_loop(np.array([1.0, 3.0, 5.0, 5.0]), 2, eps=0.0).round(4)
    array([-0.7071,  0.7071,  0.    ,  0.    ])
    """
    values = [float(v) for v in np.asarray(scores, dtype=np.float64).reshape(-1)]
    if isinstance(group_ids, numbers.Integral):
        ids = [i // int(group_ids) for i in range(len(values))]
    else:
        ids = [int(i) for i in np.asarray(group_ids).reshape(-1)]
    members: dict = {}
    for i, group in enumerate(ids):
        members.setdefault(group, []).append(i)
    stats = {}
    for group, where in members.items():
        real = [values[i] for i in where if not math.isnan(values[i])]
        stats[group] = _moments_loop(real)
    out = np.zeros(len(values))
    batch_n, batch_mean, batch_m2 = _moments_loop([v for v in values if not math.isnan(v)])
    for i, (value, group) in enumerate(zip(values, ids)):
        if math.isnan(value):
            continue
        n, mean, m2 = stats[group]
        if baseline is None:
            centred = value
        elif math.isnan(mean):  # an infinite score in the group: its mean is NaN
            centred = math.nan
        elif baseline == "mean":
            centred = value - mean
        else:  # leave_one_out: the score minus the mean of the others
            others = [values[j] for j in members[group] if j != i and not math.isnan(values[j])]
            centred = value - _moments_loop(others)[1] if others else 0.0
        if scale == "group":
            out[i] = 0.0 if m2 == 0 else centred / (_std_loop(m2, n, unbiased) + eps)
        elif scale == "batch":
            out[i] = 0.0 if batch_m2 == 0 else centred / (_std_loop(batch_m2, batch_n, unbiased) + eps)
        else:
            out[i] = centred
    return out


def _std_loop(m2: float, n: int, unbiased: bool) -> float:
    """sqrt(M2 / (n - 1 or n)) for M2 > 0; NaN for a NaN M2 (whatever n)."""
    return m2 if math.isnan(m2) else math.sqrt(m2 / (n - 1 if unbiased else n))


def _moments_loop(real: list) -> tuple[int, float, float]:
    """(n, mean, M2) of a list of floats, two passes with exact sums; equal values give (n, that value, 0); an
    infinite value gives (n, NaN, NaN) (``inf - inf``: the library's two-pass sums)."""
    if not real:
        return 0, 0.0, 0.0
    if any(math.isinf(v) for v in real):
        return len(real), math.nan, math.nan
    if all(v == real[0] for v in real):
        return len(real), real[0], 0.0
    mean = math.fsum(real) / len(real)
    return len(real), mean, math.fsum((v - mean) ** 2 for v in real)


def reinforce_plus_plus_loop(token_rewards, response_mask, *, gamma: float = 1.0, eps: float = 1e-8) -> np.ndarray:
    r"""``reinforce_plus_plus()`` one row and one step at a time, in Python floats: a float64 array (B, T).

    From the last token back, a response token's return is its reward plus
    gamma times the return of the next response token (a masked token is
    skipped, its return 0); then the returns of all response tokens are
    whitened together, ``(G - mean) / sqrt(var + eps)`` with the unbiased
    variance, and masked tokens get 0.

    Parameters
    ----------
    token_rewards, response_mask : array (B, T)
        Read as float64 and as ``!= 0``.
    gamma, eps : float
        As in ``gae_xp.reinforce_plus_plus``.

    Returns
    -------
    numpy.ndarray (B, T)
        float64.

    Examples
    --------
    >>> import numpy as np
    >>> from gae_xp.reference import reinforce_plus_plus_loop
    >>> reinforce_plus_plus_loop(np.array([[0.0, 1.0], [0.0, 0.0]]), np.ones((2, 2)), eps=0.0).round(4)
    array([[ 0.866,  0.866],
           [-0.866, -0.866]])
    """
    rewards = np.asarray(token_rewards, dtype=np.float64)
    real = np.asarray(response_mask) != 0
    returns = np.zeros(rewards.shape)
    for b in range(rewards.shape[0]):
        running = 0.0
        for t in reversed(range(rewards.shape[1])):
            if real[b, t]:
                running = float(rewards[b, t]) + gamma * running
                returns[b, t] = running
    picked = [float(v) for v in returns[real]]
    n, mean, m2 = _moments_loop(picked)
    out = np.zeros(rewards.shape)
    if n:
        scale = math.sqrt(m2 / (n - 1) + eps) if n > 1 else math.nan
        for b, t in zip(*np.nonzero(real)):
            out[b, t] = (returns[b, t] - mean) / scale
    return out


def _truncation(truncated: Array | None, next_values: Array | None, truncated_bootstrap: str) -> None:
    """The contract's rule: a truncated step's V(s_{t+1}) comes from next_values, unless "next_step" is said."""
    if truncated_bootstrap not in ("next_values", "next_step"):
        raise ValueError(f"truncated_bootstrap must be 'next_values' or 'next_step', got {truncated_bootstrap!r}")
    if truncated_bootstrap == "next_values" and truncated is not None and next_values is None:
        raise ValueError('truncated needs next_values (or truncated_bootstrap="next_step")')
    if truncated_bootstrap == "next_step" and next_values is not None:
        raise ValueError('truncated_bootstrap="next_step" and next_values exclude each other')


def _carried(xp: Any, step: dict, coefficient: Array, following: Array, zero: Array) -> Array:
    """coefficient * following, or exactly 0 where the trace is cut (a done step or a zero coefficient)."""
    cut = _done(xp, step) | (coefficient == 0)
    return coefficient * xp.where(cut, zero, following)


def _done(xp: Any, step: dict) -> Array:
    """terminated | truncated at this step as a bool array (False where neither is given)."""
    done = xp.zeros(step["gamma"].shape, dtype=xp.bool, device=device_of(step["gamma"]))
    for name in ("terminated", "truncated"):
        if step.get(name) is not None:
            done = done | (step[name] != 0)
    return done


def _unless(xp: Any, flag: Array | None, value: Array, zero: Array) -> Array:
    """value, or exactly 0 where the flag is set (where the flag is absent, value)."""
    return value if flag is None else xp.where(flag != 0, zero, value)


def _per_step(rewards: Array, axis: int, **named: Coefficient | None) -> tuple[Any, Array, Callable[[int], dict]]:
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

    def at(t: int) -> dict:
        return {name: None if value is None else value[..., t] for name, value in moved.items()}

    return xp, r, at


def _time_last(xp: Any, a: Array, axis: int) -> Array:
    return xp.moveaxis(a, axis, -1)


def _as_array(xp: Any, value: Coefficient, like: Array, *, cast: bool = True) -> Array:
    """A number or an array as an array in like's dtype (bool flags and masks keep their dtype)."""
    if isinstance(value, numbers.Real) and not isinstance(value, bool):
        return xp.asarray(float(value), dtype=like.dtype, device=device_of(like))
    if not cast or xp.isdtype(value.dtype, "bool"):
        return value
    return xp.astype(value, like.dtype)


def _boundary(xp: Any, value: Coefficient | None, like: Array, zero: Array) -> Array:
    return zero if value is None else xp.broadcast_to(_as_array(xp, value, like), zero.shape)


def _stack(xp: Any, columns: list, like: Array) -> Array:
    if not columns:
        return xp.zeros(like.shape, dtype=like.dtype, device=device_of(like))
    return xp.stack(columns, axis=-1)


def _stack_reversed(xp: Any, columns: list, like: Array) -> Array:
    return _stack(xp, columns[::-1], like)
