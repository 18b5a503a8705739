"""torchrl's ``generalized_advantage_estimate`` and ``vtrace_advantage_estimate``
(torchrl.objectives.value.functional), on the chunk scan.

Inputs are [*B, T, *F] with time at ``time_dim`` (-2). Both return
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

import gae_xp
from gae_xp._compat import array_namespace
from gae_xp.adapters._util import following, like, scan, take_last

SHAPE_ERR = "All input tensors (value, reward and done states) must share a unique shape."


def generalized_advantage_estimate(gamma, lmbda, state_value, next_state_value, reward, done, terminated=None, *,
                                   time_dim=-2):
    """(advantage, value_target) as torchrl computes them."""
    if terminated is None:
        terminated = done
    _same_shapes(next_state_value, state_value, reward, done, terminated)
    xp = array_namespace(reward, state_value, next_state_value)
    done, terminated = _flag(xp, "done", done), _flag(xp, "terminated", terminated)
    bootstrap = xp.where(terminated, xp.zeros_like(next_state_value), next_state_value)
    return gae_xp.gae(reward, state_value, gamma=gamma, lam=lmbda, next_values=bootstrap, truncated=done,
                      axis=time_dim)


def vtrace_advantage_estimate(gamma, log_pi, log_mu, state_value, next_state_value, reward, done, terminated=None,
                              rho_thresh=1.0, c_thresh=1.0, time_dim=-2):
    """(advantage, value_target) as torchrl's V-trace computes them."""
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


def _same_shapes(*arrays):
    if any(tuple(a.shape) != tuple(arrays[0].shape) for a in arrays[1:]):
        raise RuntimeError(SHAPE_ERR)


def _flag(xp, name, value):
    if not xp.isdtype(value.dtype, "bool"):
        raise TypeError(f"{name} must be a bool tensor (torchrl inverts it with ~), got dtype {value.dtype}")
    return value
