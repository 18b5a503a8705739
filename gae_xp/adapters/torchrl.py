"""torchrl's ``generalized_advantage_estimate`` and ``vtrace_advantage_estimate``
(torchrl.objectives.value.functional), on the chunk scan.

Inputs are ``[*B, T, *F]`` with time at ``time_dim`` (-2). Both return
``(advantage, value_target)``. As torchrl (0.14) defines them:

* GAE: ``delta_t = r_t + gamma (1 - terminated_t) V'_t - V_t`` and
  ``A_t = delta_t + gamma lmbda (1 - done_t) A_{t+1}``: ``done`` alone cuts
  the trace; ``terminated`` alone only drops the bootstrap V' (a step that is
  terminated but not done continues the trace). ``terminated=None`` means
  ``done``. ``value_target = A + V``. ``time_dim`` is keyword-only.
* V-trace: ``rho = exp(log_pi - log_mu)``, ``rho_thresh`` clips it in the
  deltas and the advantage, ``c_thresh`` in the trace (no lambda); both may
  be floats or tensors broadcastable to the inputs. ``vs - V`` is the trace
  cut at ``done``; the advantage uses ``vs`` of the next step along time, the
  last step's V' after the end and V' itself at a done step. ``time_dim`` may
  be given by position (the tenth argument) or by keyword.

Shape mismatch raises torchrl's RuntimeError; ``done`` and ``terminated``
must be bool (torchrl applies ``~`` to them).

Deliberate differences from torchrl:

* exact: torchrl's vectorised GAE drops the geometric filter's terms below
  1e-7; its loop and this scan agree to rounding.
* exact: torchrl rounds gamma, gamma * lmbda and float thresholds to torch's
  default dtype (float32, through the int flags and ``torch.tensor``) even
  for float64 inputs; here they stay in the inputs' dtype.
* a cut is a ``where``, not a product: NaN or inf in V' at a terminated step,
  or in the trace beyond a done step, does not reach earlier steps (torchrl
  multiplies by 0 and gets NaN).
* GAE's gamma and lmbda must lie in [0, 1]; a NaN importance weight in
  V-trace raises ValueError instead of spreading NaN.
* a positional ``time_dim`` other than -2 is honoured as the time axis;
  torchrl only transposes for a keyword ``time_dim`` and mixes axes otherwise.
"""

from __future__ import annotations

from typing import Any

import gae_xp
from gae_xp._compat import array_namespace
from gae_xp.adapters._util import Array, Coefficient, following, like, scan, take_last

SHAPE_ERR = "All input tensors (value, reward and done states) must share a unique shape."


def generalized_advantage_estimate(gamma: float, lmbda: float, state_value: Array, next_state_value: Array,
                                   reward: Array, done: Array, terminated: Array | None = None, *,
                                   time_dim: int = -2) -> tuple[Array, Array]:
    r"""(advantage, value_target) as torchrl's ``generalized_advantage_estimate`` computes them.

    ::

        delta_t = r_t + gamma (1 - terminated_t) V'_t - V_t
        A_t     = delta_t + gamma lmbda (1 - done_t) A_{t+1},     value_target = A + V

    Parameters
    ----------
    gamma : float
        torchrl's exponential mean discount, in [0, 1].
    lmbda : float
        torchrl's trajectory discount (the GAE lambda), in [0, 1].
    state_value : array, shape ``(*B, T, *F)``
        The value function's result on the old state (``V_t``).
    next_state_value : array, shape ``(*B, T, *F)``
        The value function's result on the new state (``V'_t``, the state after step t).
    reward : array, shape ``(*B, T, *F)``
        The reward of taking the action in the environment.
    done : bool array, shape ``(*B, T, *F)``
        The end of the trajectory (terminated or truncated): cuts the trace.
    terminated : bool array, shape ``(*B, T, *F)``, optional
        The end of the episode: drops the bootstrap ``V'_t``. Defaults to ``done``.
    time_dim : int, default -2
        The dimension along which time is unrolled (keyword-only, as in torchrl).

    Returns
    -------
    advantage, value_target : arrays, shape ``(*B, T, *F)``
        Of the inputs' library and device, in their floating dtype.

    Raises
    ------
    RuntimeError
        torchrl's, when the value, reward and done arrays differ in shape.
    TypeError
        When ``done`` or ``terminated`` is not bool.
    ValueError
        For gamma or lmbda outside [0, 1].

    Examples
    --------
    One row of three steps (time on axis -2, one feature); step 1 ends the trajectory:

    >>> import numpy as np
    >>> from gae_xp.adapters.torchrl import generalized_advantage_estimate
    >>> reward, state_value = np.ones((1, 3, 1)), np.zeros((1, 3, 1))
    >>> next_state_value = np.array([[[1.0], [2.0], [4.0]]])
    >>> done = np.array([[[False], [True], [False]]])
    >>> advantage, value_target = generalized_advantage_estimate(0.5, 1.0, state_value, next_state_value, reward,
    ...                                                          done)
    >>> advantage[..., 0].tolist()
    [[2.0, 1.0, 3.0]]

    Truncated, not terminated, at step 1: the trace is cut there, but ``V'_1`` is bootstrapped:

    >>> terminated = np.zeros((1, 3, 1), dtype=bool)
    >>> generalized_advantage_estimate(0.5, 1.0, state_value, next_state_value, reward, done,
    ...                                terminated)[0][..., 0].tolist()
    [[2.5, 2.0, 3.0]]
    """
    if terminated is None:
        terminated = done
    _same_shapes(next_state_value, state_value, reward, done, terminated)
    xp = array_namespace(reward, state_value, next_state_value)
    done, terminated = _flag(xp, "done", done), _flag(xp, "terminated", terminated)
    bootstrap = xp.where(terminated, xp.zeros_like(next_state_value), next_state_value)
    return gae_xp.gae(reward, state_value, gamma=gamma, lam=lmbda, next_values=bootstrap, truncated=done,
                      axis=time_dim)


def vtrace_advantage_estimate(gamma: float, log_pi: Array, log_mu: Array, state_value: Array,
                              next_state_value: Array, reward: Array, done: Array, terminated: Array | None = None,
                              rho_thresh: Coefficient = 1.0, c_thresh: Coefficient = 1.0,
                              time_dim: int = -2) -> tuple[Array, Array]:
    r"""(advantage, value_target) as torchrl's V-trace (``vtrace_advantage_estimate``) computes them.

    With ``rho = exp(log_pi - log_mu)``, ``rho_bar = min(rho, rho_thresh)`` and ``c = min(rho, c_thresh)``::

        vs_t - V_t = rho_bar_t (r_t + gamma (1 - terminated_t) V'_t - V_t) + gamma (1 - done_t) c_t (vs - V)_{t+1}
        advantage  = rho_bar_t (r_t + gamma (1 - terminated_t) vs'_t - V_t)

    where ``vs'_t`` is ``vs_{t+1}``, or ``V'_t`` at a done step and at the last step; ``value_target = vs``.

    Parameters
    ----------
    gamma : float
        torchrl's exponential mean discount.
    log_pi : array, shape ``(*B, T, *F)``
        The log-probability of the taken actions under the current (learning) actor, as torchrl's ``VTrace``
        passes it.
    log_mu : array, shape ``(*B, T, *F)``
        The log-probability of the taken actions under the actor that collected them (``VTrace``'s sample log
        prob). (torchrl's docstring of the function names the two the other way round; the arithmetic, reproduced
        here, is ``rho = exp(log_pi - log_mu)``.)
    state_value, next_state_value : arrays, shape ``(*B, T, *F)``
        The value function's result on the state and on the next state.
    reward : array, shape ``(*B, T, *F)``
        The reward of taking the action in the environment.
    done : bool array, shape ``(*B, T, *F)``
        The end of the episode (terminated or truncated): cuts the trace.
    terminated : bool array, shape ``(*B, T, *F)``, optional
        The terminated states: drop the bootstrap. Defaults to ``done``.
    rho_thresh : float or array, default 1.0
        The rho clipping parameter of the importance weights (the deltas and the advantage).
    c_thresh : float or array, default 1.0
        The c clipping parameter of the importance weights (the trace); may exceed 1.
    time_dim : int, default -2
        The dimension along which time is unrolled (by position or keyword).

    Returns
    -------
    advantage, value_target : arrays, shape ``(*B, T, *F)``
        Of the inputs' library and device, in their floating dtype.

    Raises
    ------
    RuntimeError
        torchrl's, when the value, reward and done arrays differ in shape.
    TypeError
        When ``done`` or ``terminated`` is not bool.
    ValueError
        For a NaN importance weight in the trace.

    Examples
    --------
    >>> import numpy as np
    >>> from gae_xp.adapters.torchrl import vtrace_advantage_estimate
    >>> reward, state_value = np.ones((1, 3, 1)), np.zeros((1, 3, 1))
    >>> next_state_value = np.array([[[1.0], [2.0], [4.0]]])
    >>> done = np.array([[[False], [True], [False]]])
    >>> log_pi, log_mu = np.log(np.array([[[1.0], [2.0], [0.5]]])), np.zeros((1, 3, 1))
    >>> advantage, value_target = vtrace_advantage_estimate(0.5, log_pi, log_mu, state_value, next_state_value,
    ...                                                     reward, done)
    >>> advantage[..., 0].tolist(), value_target[..., 0].tolist()
    ([[1.5, 1.0, 1.5]], [[2.0, 1.0, 1.5]])
    """
    _same_shapes(next_state_value, state_value, reward, done)
    xp = array_namespace(reward, state_value, next_state_value, log_pi, log_mu)
    done = _flag(xp, "done", done)
    terminated = done if terminated is None else _flag(xp, "terminated", terminated)
    axis = time_dim % reward.ndim
    zeros = xp.zeros_like(next_state_value)
    bootstrap = xp.where(terminated, zeros, next_state_value)
    rho = xp.exp(log_pi - log_mu)
    clipped_rho = xp.minimum(rho, like(xp, rho_thresh, rho))
    clipped_c = xp.minimum(rho, like(xp, c_thresh, rho))
    deltas = clipped_rho * (reward + gamma * bootstrap - state_value)
    trace = xp.where(done, zeros, gamma * clipped_c)
    vs = scan(deltas, trace, axis=axis) + state_value
    vs_next = following(xp, vs, take_last(next_state_value, axis), axis)
    vs_next = xp.where(done, next_state_value, vs_next)
    advantage = clipped_rho * (reward + gamma * xp.where(terminated, zeros, vs_next) - state_value)
    return advantage, vs


def _same_shapes(*arrays: Array) -> None:
    if any(tuple(a.shape) != tuple(arrays[0].shape) for a in arrays[1:]):
        raise RuntimeError(SHAPE_ERR)


def _flag(xp: Any, name: str, value: Array) -> Array:
    if not xp.isdtype(value.dtype, "bool"):
        raise TypeError(f"{name} must be a bool tensor (torchrl inverts it with ~), got dtype {value.dtype}")
    return value
