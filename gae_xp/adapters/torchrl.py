"""torchrl's ``generalized_advantage_estimate`` and ``vtrace_advantage_estimate``, on the chunk scan.

Inputs are [*B, T, F] with time at ``time_dim`` (-2). ``done`` cuts the
trace, ``terminated`` removes the bootstrap (when it is None, ``done`` plays
both parts, as in torchrl). Both return ``(advantage, value_target)``.
Ours is exact, where torchrl's vectorised GAE cuts its geometric filter at
1e-7.

V-trace as torchrl (0.14) defines it: ``rho = exp(log_pi - log_mu)``, clipped
at ``rho_thresh`` for the deltas and the advantage and at ``c_thresh`` for
the trace (no lambda); the advantage uses ``vs`` of the next step along time,
and the next state's value after the last step and at a done step.
"""

from __future__ import annotations

from array_api_compat import array_namespace
from array_api_compat import device as device_of

import gae_xp
from gae_xp.estimators import vtrace


def generalized_advantage_estimate(gamma, lmbda, state_value, next_state_value, reward, done, terminated=None, *,
                                   time_dim=-2):
    """(advantage, value_target) as torchrl computes them."""
    if terminated is None:
        terminated = done
    return gae_xp.gae(reward, state_value, gamma=gamma, lam=lmbda, next_values=next_state_value,
                      terminated=terminated, truncated=done, axis=time_dim)


def vtrace_advantage_estimate(gamma, log_pi, log_mu, state_value, next_state_value, reward, done, terminated=None,
                              rho_thresh=1.0, c_thresh=1.0, *, time_dim=-2):
    """(advantage, value_target) as torchrl's V-trace computes them."""
    if terminated is None:
        terminated = done
    xp = array_namespace(reward)
    vs, _ = vtrace(log_pi - log_mu, reward, state_value, gamma=gamma, lam=1.0, clip_rho_threshold=float(rho_thresh),
                   clip_c_threshold=float(c_thresh), next_values=next_state_value, terminated=terminated,
                   truncated=done, axis=time_dim)
    axis = time_dim % reward.ndim
    following = xp.concat([_slice(vs, axis, 1, None), _slice(next_state_value, axis, -1, None)], axis=axis)
    following = xp.where(done if xp.isdtype(done.dtype, "bool") else done != 0, next_state_value, following)
    not_terminated = 1 - xp.astype(terminated, reward.dtype)
    rho = xp.exp(log_pi - log_mu)
    clipped = xp.minimum(rho, xp.asarray(float(rho_thresh), dtype=rho.dtype, device=device_of(rho)))
    advantage = clipped * (reward + gamma * not_terminated * following - state_value)
    return advantage, vs


def _slice(a, axis, start, stop):
    index = [slice(None)] * a.ndim
    index[axis] = slice(start, stop)
    return a[tuple(index)]
