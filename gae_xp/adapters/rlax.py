"""rlax's multistep returns and V-trace (rlax/_src/multistep.py, rlax/_src/vtrace.py, rlax 0.1.9), on the chunk scan.

rlax's conventions: one time-major 1-D sequence per call (vmap for a batch;
``jax.vmap`` and ``jax.jit`` work over these functions); rewards ``r_t`` and
discounts ``discount_t`` at times 1..T; ``discount_t = 0`` ends an episode
(there are no done flags); ``lambda_`` a scalar or one value per step, and
any value rlax takes, above 1 included (importance-weighted forms such as
lambda_t = lambda rho_t); ``stop_target_gradients`` stops gradients through
the targets (``jax.lax.stop_gradient``, ``detach()`` on torch) and, as rlax,
returns ``stop_gradient(errors + v_tm1) - v_tm1`` for the V-trace errors.
Any array-API library works; results have the inputs' library and dtype.

* ``lambda_returns``: ``G_t = r_t + d_t [(1 - l_t) v_t + l_t G_{t+1}]``, ``G_T = v_t[-1]``.
* ``discounted_returns``: the same with lambda 1 (``v_t`` a scalar or a sequence).
* ``truncated_generalized_advantage_estimation``: ``values`` has T + 1 entries,
  ``A_t = delta_t + d_t l_t A_{t+1}``, ``delta_t = r_t + d_t values[t+1] - values[t]``.
* ``importance_corrected_td_errors`` (``rlax._src.multistep``, not exported by rlax):
  ``rho_tm1[t] E_t``, ``E_t = delta_t + d_t rho_{t+1} l_t E_{t+1}``.
* ``vtrace`` / ``leaky_vtrace``: errors ``e_t = rho_bar_t (r_t + d_t v_t - v_tm1_t) + d_t c_t e_{t+1}``
  with ``c_t = l_t min(1, rho_t)``; ``sample_mask`` (bool) skips a step: it
  keeps the error of the next step and adds nothing.
* ``vtrace_td_error_and_advantage`` (and the leaky one): lambda enters the
  policy-gradient target, ``q_t = r_t + d_t (l_t vs_{t+1} + (1 - l_t) v_tm1_{t+1})``
  with ``vs = errors + v_tm1`` and ``v_t[-1]`` after the last step;
  ``pg = min(clip_pg_rho_threshold, rho) (q - v_tm1)``; ``v_t`` are the
  bootstrap values of the deltas, taken apart from ``v_tm1``.

``n_step_bootstrapped_returns`` is not here: its window of n steps is not a
prefix scan.

Deliberate differences from rlax:

* masked steps are skipped with ``where``: NaN in a masked step's inputs does
  not reach other steps (rlax multiplies it by 0).
* results equal up to rounding, not bitwise (a tree of sums, not a chain);
  lambda above 1 is computed on a rescaled scan, exact where every
  coefficient is at most 1.
* integer inputs are promoted to floats (rlax asserts floats); a wrong rank
  or shape raises ``ShapeError`` and a non-bool ``sample_mask`` ``DTypeError``,
  each both the Python error and the AssertionError chex raises; a NaN
  trace coefficient (NaN rho or discount) raises ValueError.
"""

from __future__ import annotations

import collections
import numbers

from gae_xp._compat import array_namespace, device_of
from gae_xp.adapters._util import DTypeError, ShapeError, like, scan, stop_gradient

VTraceOutput = collections.namedtuple("vtrace_output", ["errors", "pg_advantage", "q_estimate"])


def lambda_returns(r_t, discount_t, v_t, lambda_=1.0, stop_target_gradients=False):
    """Multistep truncated lambda returns of one sequence."""
    xp = _sequences(r_t, discount_t, v_t)
    lam = _per_step(xp, lambda_, discount_t)
    returns = scan(r_t + discount_t * ((1 - lam) * v_t), discount_t * lam, initial=v_t[-1])
    return stop_gradient(returns) if stop_target_gradients else returns


def discounted_returns(r_t, discount_t, v_t, stop_target_gradients=False):
    """Discounted returns of one sequence, bootstrapped by ``v_t`` (a scalar or a sequence; its last entry counts)."""
    xp = _sequences(r_t, discount_t)
    if not isinstance(v_t, numbers.Real):
        if v_t.ndim > 1:
            raise ShapeError(f"v_t must be a scalar or a sequence, got shape {tuple(v_t.shape)}")
    bootstrapped = xp.ones_like(discount_t) * v_t
    return lambda_returns(r_t, discount_t, bootstrapped, lambda_=1.0, stop_target_gradients=stop_target_gradients)


def truncated_generalized_advantage_estimation(r_t, discount_t, lambda_, values, stop_target_gradients=False):
    """GAE of one sequence; ``values`` holds v(s_0) .. v(s_T) (one more entry than ``r_t``)."""
    xp = _sequences(r_t, discount_t)
    _bootstrapped_values(values, r_t)
    lam = _per_step(xp, lambda_, discount_t)
    delta = r_t + discount_t * values[1:] - values[:-1]
    advantages = scan(delta, discount_t * lam)
    return stop_gradient(advantages) if stop_target_gradients else advantages


def importance_corrected_td_errors(r_t, discount_t, rho_tm1, lambda_, values, stop_target_gradients=False):
    """Multistep TD errors with per-decision importance sampling, as rlax."""
    xp = _sequences(r_t, discount_t, rho_tm1)
    _bootstrapped_values(values, r_t)
    v_tm1, v_next = values[:-1], values[1:]
    rho_t = xp.concat([rho_tm1[1:], xp.ones((1,), dtype=rho_tm1.dtype, device=device_of(rho_tm1))])
    lam = _per_step(xp, lambda_, discount_t)
    errors = rho_tm1 * scan(r_t + discount_t * v_next - v_tm1, discount_t * rho_t * lam)
    return _stop_target(errors, v_tm1, stop_target_gradients)


def vtrace(v_tm1, v_t, r_t, discount_t, rho_tm1, lambda_=1.0, clip_rho_threshold=1.0, stop_target_gradients=True,
           sample_mask=None):
    """V-trace errors (vs - v_tm1) of one sequence."""
    return leaky_vtrace(v_tm1, v_t, r_t, discount_t, rho_tm1, 1.0, lambda_, clip_rho_threshold, stop_target_gradients,
                        sample_mask)


def leaky_vtrace(v_tm1, v_t, r_t, discount_t, rho_tm1, alpha_=1.0, lambda_=1.0, clip_rho_threshold=1.0,
                 stop_target_gradients=True, sample_mask=None):
    """Leaky V-trace errors: alpha mixes clipped (1) and unclipped (0) importance weights."""
    xp = _sequences(v_tm1, v_t, r_t, discount_t, rho_tm1)
    lam = _per_step(xp, lambda_, discount_t)
    c_tm1 = _leaky(xp, rho_tm1, alpha_, 1.0) * lam
    clipped_rho = _leaky(xp, rho_tm1, alpha_, clip_rho_threshold)
    td_errors = clipped_rho * (r_t + discount_t * v_t - v_tm1)
    trace = discount_t * c_tm1
    if sample_mask is not None:
        _sequences(sample_mask, rho_tm1)
        if not xp.isdtype(sample_mask.dtype, "bool"):
            raise DTypeError(f"sample_mask must be bool (True = a learnable step), got dtype {sample_mask.dtype}")
        td_errors = xp.where(sample_mask, td_errors, xp.zeros_like(td_errors))
        trace = xp.where(sample_mask, trace, xp.ones_like(trace))
    return _stop_target(scan(td_errors, trace), v_tm1, stop_target_gradients)


def vtrace_td_error_and_advantage(v_tm1, v_t, r_t, discount_t, rho_tm1, lambda_=1.0, clip_rho_threshold=1.0,
                                  clip_pg_rho_threshold=1.0, stop_target_gradients=True, sample_mask=None):
    """(errors, pg_advantage, q_estimate) of one sequence, as IMPALA's V-trace in rlax."""
    return leaky_vtrace_td_error_and_advantage(v_tm1, v_t, r_t, discount_t, rho_tm1, 1.0, lambda_,
                                               clip_rho_threshold, clip_pg_rho_threshold, stop_target_gradients,
                                               sample_mask)


def leaky_vtrace_td_error_and_advantage(v_tm1, v_t, r_t, discount_t, rho_tm1, alpha=1.0, lambda_=1.0,
                                        clip_rho_threshold=1.0, clip_pg_rho_threshold=1.0,
                                        stop_target_gradients=True, sample_mask=None):
    """(errors, pg_advantage, q_estimate) of leaky V-trace."""
    xp = _sequences(v_tm1, v_t, r_t, discount_t, rho_tm1)
    lam = xp.ones_like(discount_t) * _per_step(xp, lambda_, discount_t)
    errors = leaky_vtrace(v_tm1, v_t, r_t, discount_t, rho_tm1, alpha, lam, clip_rho_threshold,
                          stop_target_gradients, sample_mask)
    targets_tm1 = errors + v_tm1
    q_bootstrap = xp.concat([lam[:-1] * targets_tm1[1:] + (1 - lam[:-1]) * v_tm1[1:], v_t[-1:]])
    q_estimate = r_t + discount_t * q_bootstrap
    pg_advantage = _leaky(xp, rho_tm1, alpha, clip_pg_rho_threshold) * (q_estimate - v_tm1)
    return VTraceOutput(errors=errors, pg_advantage=pg_advantage, q_estimate=q_estimate)


def _sequences(*arrays):
    """The shared namespace; ShapeError unless every array is 1-D and of one length."""
    xp = array_namespace(*arrays)
    for a in arrays:
        if a.ndim != 1:
            raise ShapeError(f"rlax takes one time-major sequence (rank 1) per call, got shape {tuple(a.shape)}; "
                             "vmap over a batch")
        if tuple(a.shape) != tuple(arrays[0].shape):
            raise ShapeError(f"sequences of different shapes {tuple(arrays[0].shape)} and {tuple(a.shape)}")
    return xp


def _bootstrapped_values(values, r_t):
    if values.ndim != 1 or values.shape[0] != r_t.shape[0] + 1:
        raise ShapeError(f"values must hold v(s_0) .. v(s_T): shape ({r_t.shape[0] + 1},), got {tuple(values.shape)}")


def _per_step(xp, lambda_, steps):
    """lambda_ as rlax takes it: a number, a 0-d array or one value per step."""
    if isinstance(lambda_, numbers.Real) and not isinstance(lambda_, bool):
        return float(lambda_)
    if lambda_.ndim > 1 or (lambda_.ndim == 1 and tuple(lambda_.shape) != tuple(steps.shape)):
        raise ShapeError(f"lambda_ must be a scalar or one value per step {tuple(steps.shape)}, got "
                         f"{tuple(lambda_.shape)}")
    return lambda_


def _leaky(xp, rho, alpha, threshold):
    """(1 - alpha) rho + alpha min(threshold, rho); min(threshold, rho) itself for alpha = 1."""
    clipped = xp.minimum(rho, like(xp, threshold, rho))
    if isinstance(alpha, numbers.Real) and alpha == 1:
        return clipped
    return (1 - alpha) * rho + alpha * clipped


def _stop_target(errors, v_tm1, stop_target_gradients):
    """rlax's ``stop_gradient(errors + v_tm1) - v_tm1`` (the same rounding), or the errors themselves."""
    if not stop_target_gradients:
        return errors
    return stop_gradient(errors + v_tm1) - v_tm1
