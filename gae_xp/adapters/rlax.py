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
from typing import Any

from gae_xp._compat import array_namespace, device_of
from gae_xp.adapters._util import Array, Coefficient, DTypeError, ShapeError, like, scan, stop_gradient

VTraceOutput = collections.namedtuple("vtrace_output", ["errors", "pg_advantage", "q_estimate"])
VTraceOutput.__doc__ = """rlax's ``vtrace_output``: what ``vtrace_td_error_and_advantage`` returns.

Attributes
----------
errors : array
    The V-trace errors, ``vs - v_tm1`` (``vtrace``'s).
pg_advantage : array
    The policy-gradient advantage, ``min(clip_pg_rho_threshold, rho_tm1) (q_t - v_tm1)``.
q_estimate : array
    The policy-gradient target ``q_t``.
"""


def lambda_returns(r_t: Array, discount_t: Array, v_t: Array, lambda_: Coefficient = 1.0,
                   stop_target_gradients: bool = False) -> Array:
    r"""Multistep truncated lambda returns of one sequence, as rlax's ``lambda_returns``.

    From ``G_{T-1}`` back to ``G_0``::

        G_t = r_t + discount_t [(1 - lambda_t) v_t + lambda_t G_{t+1}],     G_T = v_t[-1]

    Parameters
    ----------
    r_t : array, shape (T,)
        The sequence of rewards at times [1, T].
    discount_t : array, shape (T,)
        The sequence of discounts at times [1, T] (0 ends an episode).
    v_t : array, shape (T,)
        The sequence of state-value estimates under the policy at times [1, T].
    lambda_ : float or array of shape (T,), default 1.0
        rlax's mixing parameter, a scalar or one value per step; any real value (above 1 for importance-weighted
        forms such as ``lambda_t = lambda rho_t``).
    stop_target_gradients : bool, default False
        Whether to stop gradients through the returns.

    Returns
    -------
    array, shape (T,)
        The multistep lambda returns, of the inputs' library, device and floating dtype.

    Raises
    ------
    ShapeError
        (a ValueError and an AssertionError, as chex's) for inputs that are not one sequence each (rank 1) of one
        length, or a ``lambda_`` that is neither a scalar nor one value per step.
    ValueError
        For a NaN trace coefficient (``discount_t * lambda_``).

    Examples
    --------
    >>> import numpy as np
    >>> from gae_xp.adapters.rlax import lambda_returns
    >>> r_t, discount_t, v_t = np.array([1.0, 0.0, 2.0]), np.array([0.5, 0.0, 0.5]), np.array([2.0, 4.0, 6.0])
    >>> lambda_returns(r_t, discount_t, v_t, lambda_=0.5).tolist()
    [1.5, 0.0, 5.0]
    """
    xp = _sequences(r_t, discount_t, v_t)
    lam = _per_step(xp, lambda_, discount_t)
    returns = scan(r_t + discount_t * ((1 - lam) * v_t), discount_t * lam, initial=v_t[-1])
    return stop_gradient(returns) if stop_target_gradients else returns


def discounted_returns(r_t: Array, discount_t: Array, v_t: Coefficient, stop_target_gradients: bool = False) -> Array:
    r"""Discounted returns of one sequence, as rlax's ``discounted_returns``: lambda returns with lambda 1.

    ::

        G_t = r_t + discount_t G_{t+1},     G_T = v_t (a scalar) or v_t[-1] (a sequence)

    Parameters
    ----------
    r_t : array, shape (T,)
        The reward sequence.
    discount_t : array, shape (T,)
        The discount sequence (0 ends an episode).
    v_t : float or array of shape () or (T,)
        The value sequence or scalar that bootstraps the return; of a sequence, only the last entry counts.
    stop_target_gradients : bool, default False
        Whether to stop gradients through the returns.

    Returns
    -------
    array, shape (T,)
        The discounted returns, of the inputs' library, device and floating dtype.

    Raises
    ------
    ShapeError
        (a ValueError and an AssertionError, as chex's) for inputs that are not one sequence each (rank 1) of one
        length, or a ``v_t`` of rank above 1.
    ValueError
        For a NaN discount.

    Examples
    --------
    >>> import numpy as np
    >>> from gae_xp.adapters.rlax import discounted_returns
    >>> discounted_returns(np.array([1.0, 0.0, 2.0]), np.array([0.5, 0.5, 0.5]), 4.0).tolist()
    [2.0, 2.0, 4.0]
    """
    xp = _sequences(r_t, discount_t)
    if not isinstance(v_t, numbers.Real):
        if v_t.ndim > 1:
            raise ShapeError(f"v_t must be a scalar or a sequence, got shape {tuple(v_t.shape)}")
    bootstrapped = xp.ones_like(discount_t) * v_t
    return lambda_returns(r_t, discount_t, bootstrapped, lambda_=1.0, stop_target_gradients=stop_target_gradients)


def truncated_generalized_advantage_estimation(r_t: Array, discount_t: Array, lambda_: Coefficient, values: Array,
                                               stop_target_gradients: bool = False) -> Array:
    r"""GAE of one sequence, as rlax's ``truncated_generalized_advantage_estimation``.

    ::

        delta_t = r_t + discount_t values[t + 1] - values[t]
        A_t     = delta_t + discount_t lambda_t A_{t+1},     A_T = 0

    (rlax's reward ``r_t`` is the one received after acting in the state of ``values[t]``.)

    Parameters
    ----------
    r_t : array, shape (T,)
        The sequence of rewards at times [1, T].
    discount_t : array, shape (T,)
        The sequence of discounts at times [1, T] (0 ends an episode).
    lambda_ : float or array of shape (T,)
        rlax's mixing parameter, a scalar or one value per step.
    values : array, shape (T + 1,)
        The sequence of values under the policy at times [0, T]: one more entry than ``r_t``.
    stop_target_gradients : bool, default False
        Whether to stop gradients through the advantages.

    Returns
    -------
    array, shape (T,)
        The advantages, of the inputs' library, device and floating dtype.

    Raises
    ------
    ShapeError
        (a ValueError and an AssertionError, as chex's) for inputs that are not one sequence each (rank 1) of one
        length, or a ``lambda_`` that is neither a scalar nor one value per step.
    ValueError
        For a NaN trace coefficient (``discount_t * lambda_``).

    Examples
    --------
    >>> import numpy as np
    >>> from gae_xp.adapters.rlax import truncated_generalized_advantage_estimation
    >>> r_t, discount_t = np.array([1.0, 0.0, 2.0]), np.array([0.5, 0.0, 0.5])
    >>> values = np.array([0.0, 2.0, 4.0, 6.0])
    >>> truncated_generalized_advantage_estimation(r_t, discount_t, 1.0, values).tolist()
    [1.0, -2.0, 1.0]
    """
    xp = _sequences(r_t, discount_t)
    _bootstrapped_values(values, r_t)
    lam = _per_step(xp, lambda_, discount_t)
    delta = r_t + discount_t * values[1:] - values[:-1]
    advantages = scan(delta, discount_t * lam)
    return stop_gradient(advantages) if stop_target_gradients else advantages


def importance_corrected_td_errors(r_t: Array, discount_t: Array, rho_tm1: Array, lambda_: Coefficient,
                                   values: Array, stop_target_gradients: bool = False) -> Array:
    r"""Multistep TD errors with per-decision importance sampling, as rlax's ``importance_corrected_td_errors``.

    With ``delta_t = r_t + discount_t values[t + 1] - values[t]`` and ``rho_t = rho_tm1[t + 1]`` (1 after the
    last step)::

        E_t      = delta_t + discount_t rho_t lambda_t E_{t+1},     E_T = 0
        errors_t = rho_tm1[t] E_t

    Parameters
    ----------
    r_t : array, shape (T,)
        The sequence of rewards at times [1, T].
    discount_t : array, shape (T,)
        The sequence of discounts at times [1, T].
    rho_tm1 : array, shape (T,)
        The importance ratios ``pi(a|s) / mu(a|s)`` at times [0, T-1].
    lambda_ : float or array of shape (T,)
        rlax's mixing parameter, a scalar or one value per step.
    values : array, shape (T + 1,)
        The state values under the policy at times [0, T].
    stop_target_gradients : bool, default False
        Whether to stop gradients through the targets: ``stop_gradient(errors + v_tm1) - v_tm1``.

    Returns
    -------
    array, shape (T,)
        The importance-corrected errors, of the inputs' library, device and floating dtype.

    Raises
    ------
    ShapeError
        (a ValueError and an AssertionError, as chex's) for inputs that are not one sequence each (rank 1) of one
        length, or a ``lambda_`` that is neither a scalar nor one value per step.
    ValueError
        For a NaN trace coefficient (NaN importance ratios or discounts).

    Examples
    --------
    >>> import numpy as np
    >>> from gae_xp.adapters.rlax import importance_corrected_td_errors
    >>> r_t, discount_t = np.array([1.0, 0.0, 2.0]), np.array([0.5, 0.5, 0.5])
    >>> rho_tm1, values = np.array([1.0, 2.0, 0.5]), np.array([0.0, 2.0, 4.0, 6.0])
    >>> importance_corrected_td_errors(r_t, discount_t, rho_tm1, 1.0, values).tolist()
    [2.25, 0.5, 0.5]
    """
    xp = _sequences(r_t, discount_t, rho_tm1)
    _bootstrapped_values(values, r_t)
    v_tm1, v_next = values[:-1], values[1:]
    rho_t = xp.concat([rho_tm1[1:], xp.ones((1,), dtype=rho_tm1.dtype, device=device_of(rho_tm1))])
    lam = _per_step(xp, lambda_, discount_t)
    errors = rho_tm1 * scan(r_t + discount_t * v_next - v_tm1, discount_t * rho_t * lam)
    return _stop_target(errors, v_tm1, stop_target_gradients)


def vtrace(v_tm1: Array, v_t: Array, r_t: Array, discount_t: Array, rho_tm1: Array, lambda_: Coefficient = 1.0,
           clip_rho_threshold: float = 1.0, stop_target_gradients: bool = True,
           sample_mask: Array | None = None) -> Array:
    r"""V-trace errors (``vs - v_tm1``) of one sequence, as rlax's ``vtrace``.

    With ``c_t = lambda_t min(1, rho_tm1[t])``::

        e_t = min(clip_rho_threshold, rho_tm1[t]) (r_t + discount_t v_t - v_tm1_t) + discount_t c_t e_{t+1}

    Parameters
    ----------
    v_tm1 : array, shape (T,)
        The values at time t-1 (the predictions the errors are for).
    v_t : array, shape (T,)
        The values at time t (the bootstrap of each step).
    r_t : array, shape (T,)
        The reward at time t.
    discount_t : array, shape (T,)
        The discount at time t (0 ends an episode).
    rho_tm1 : array, shape (T,)
        The importance sampling ratios at time t-1.
    lambda_ : float or array of shape (T,), default 1.0
        rlax's mixing parameter, a scalar or one value per step.
    clip_rho_threshold : float, default 1.0
        The clip threshold of the importance weights in the TD errors.
    stop_target_gradients : bool, default True
        Whether to stop gradients through the targets: ``stop_gradient(errors + v_tm1) - v_tm1``.
    sample_mask : bool array of shape (T,), optional
        False skips a step: it adds no error and passes the next step's error through unchanged.

    Returns
    -------
    array, shape (T,)
        The V-trace errors, of the inputs' library, device and floating dtype.

    Raises
    ------
    ShapeError
        (a ValueError and an AssertionError, as chex's) for inputs that are not one sequence each (rank 1) of one
        length, or a ``lambda_`` that is neither a scalar nor one value per step.
    DTypeError
        (a TypeError and an AssertionError) for a ``sample_mask`` that is not bool.
    ValueError
        For a NaN trace coefficient (NaN importance ratios or discounts).

    Examples
    --------
    >>> import numpy as np
    >>> from gae_xp.adapters.rlax import vtrace
    >>> v_tm1, v_t = np.array([0.0, 2.0, 4.0]), np.array([2.0, 4.0, 6.0])
    >>> r_t, discount_t, rho_tm1 = np.array([1.0, 0.0, 2.0]), np.array([0.5, 0.5, 0.5]), np.array([1.0, 2.0, 0.5])
    >>> vtrace(v_tm1, v_t, r_t, discount_t, rho_tm1).tolist()
    [2.125, 0.25, 0.5]
    >>> vtrace(v_tm1, v_t, r_t, discount_t, rho_tm1, sample_mask=np.array([True, False, True])).tolist()
    [2.25, 0.5, 0.5]
    """
    return leaky_vtrace(v_tm1, v_t, r_t, discount_t, rho_tm1, 1.0, lambda_, clip_rho_threshold, stop_target_gradients,
                        sample_mask)


def leaky_vtrace(v_tm1: Array, v_t: Array, r_t: Array, discount_t: Array, rho_tm1: Array, alpha_: float = 1.0,
                 lambda_: Coefficient = 1.0, clip_rho_threshold: float = 1.0, stop_target_gradients: bool = True,
                 sample_mask: Array | None = None) -> Array:
    r"""Leaky V-trace errors of one sequence, as rlax's ``leaky_vtrace``.

    ``vtrace`` with every clipped weight ``min(threshold, rho)`` replaced by the mix
    ``(1 - alpha_) rho + alpha_ min(threshold, rho)``: ``alpha_`` 1 is V-trace, 0 plain importance sampling.

    Parameters
    ----------
    v_tm1, v_t, r_t, discount_t, rho_tm1 : arrays, shape (T,)
        As in ``vtrace``: the values at times t-1 and t, the reward and discount at time t, and the importance
        weights at time t-1.
    alpha_ : float, default 1.0
        rlax's mixing parameter of importance sampling and V-trace.
    lambda_ : float or array of shape (T,), default 1.0
        rlax's mixing parameter, a scalar or one value per step.
    clip_rho_threshold : float, default 1.0
        The clip threshold of the importance weights in the TD errors.
    stop_target_gradients : bool, default True
        Whether to stop gradients through the targets.
    sample_mask : bool array of shape (T,), optional
        False skips a step, as in ``vtrace``.

    Returns
    -------
    array, shape (T,)
        The leaky V-trace errors, of the inputs' library, device and floating dtype.

    Raises
    ------
    ShapeError
        (a ValueError and an AssertionError, as chex's) for inputs that are not one sequence each (rank 1) of one
        length, or a ``lambda_`` that is neither a scalar nor one value per step.
    DTypeError
        (a TypeError and an AssertionError) for a ``sample_mask`` that is not bool.
    ValueError
        For a NaN trace coefficient.

    Examples
    --------
    >>> import numpy as np
    >>> from gae_xp.adapters.rlax import leaky_vtrace
    >>> v_tm1, v_t = np.array([0.0, 2.0, 4.0]), np.array([2.0, 4.0, 6.0])
    >>> r_t, discount_t, rho_tm1 = np.array([1.0, 0.0, 2.0]), np.array([0.5, 0.5, 0.5]), np.array([1.0, 2.0, 0.5])
    >>> leaky_vtrace(v_tm1, v_t, r_t, discount_t, rho_tm1, alpha_=0.5).tolist()
    [2.1875, 0.375, 0.5]
    """
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


def vtrace_td_error_and_advantage(v_tm1: Array, v_t: Array, r_t: Array, discount_t: Array, rho_tm1: Array,
                                  lambda_: Coefficient = 1.0, clip_rho_threshold: float = 1.0,
                                  clip_pg_rho_threshold: float = 1.0, stop_target_gradients: bool = True,
                                  sample_mask: Array | None = None) -> VTraceOutput:
    r"""(errors, pg_advantage, q_estimate) of one sequence, as IMPALA's V-trace in rlax.

    With ``errors`` from ``vtrace`` and ``vs = errors + v_tm1``::

        q_t  = r_t + discount_t (lambda_t vs_{t+1} + (1 - lambda_t) v_tm1_{t+1}),   q_{T-1} = r + discount v_t[-1]
        pg_t = min(clip_pg_rho_threshold, rho_tm1[t]) (q_t - v_tm1_t)

    Parameters
    ----------
    v_tm1, v_t, r_t, discount_t, rho_tm1 : arrays, shape (T,)
        As in ``vtrace``: the values at times t-1 and t, the reward and discount at time t, and the importance
        weights at time t-1.
    lambda_ : float or array of shape (T,), default 1.0
        rlax's mixing parameter; here it also mixes the policy-gradient target.
    clip_rho_threshold : float, default 1.0
        The clip threshold of the importance ratios in the TD errors.
    clip_pg_rho_threshold : float, default 1.0
        The clip threshold of the policy-gradient importance ratios.
    stop_target_gradients : bool, default True
        Whether to stop gradients through the targets.
    sample_mask : bool array of shape (T,), optional
        False skips a step in the errors, as in ``vtrace``.

    Returns
    -------
    VTraceOutput
        The named tuple ``(errors, pg_advantage, q_estimate)``, arrays of shape (T,) of the inputs' library,
        device and floating dtype.

    Raises
    ------
    ShapeError
        (a ValueError and an AssertionError, as chex's) for inputs that are not one sequence each (rank 1) of one
        length, or a ``lambda_`` that is neither a scalar nor one value per step.
    DTypeError
        (a TypeError and an AssertionError) for a ``sample_mask`` that is not bool.
    ValueError
        For a NaN trace coefficient.

    Examples
    --------
    >>> import numpy as np
    >>> from gae_xp.adapters.rlax import vtrace_td_error_and_advantage
    >>> v_tm1, v_t = np.array([0.0, 2.0, 4.0]), np.array([2.0, 4.0, 6.0])
    >>> r_t, discount_t, rho_tm1 = np.array([1.0, 0.0, 2.0]), np.array([0.5, 0.5, 0.5]), np.array([1.0, 2.0, 0.5])
    >>> out = vtrace_td_error_and_advantage(v_tm1, v_t, r_t, discount_t, rho_tm1, lambda_=0.5)
    >>> out.errors.tolist(), out.pg_advantage.tolist(), out.q_estimate.tolist()
    ([2.03125, 0.125, 0.5], [2.03125, 0.125, 0.5], [2.03125, 2.125, 5.0])
    """
    return leaky_vtrace_td_error_and_advantage(v_tm1, v_t, r_t, discount_t, rho_tm1, 1.0, lambda_,
                                               clip_rho_threshold, clip_pg_rho_threshold, stop_target_gradients,
                                               sample_mask)


def leaky_vtrace_td_error_and_advantage(v_tm1: Array, v_t: Array, r_t: Array, discount_t: Array, rho_tm1: Array,
                                        alpha: float = 1.0, lambda_: Coefficient = 1.0,
                                        clip_rho_threshold: float = 1.0, clip_pg_rho_threshold: float = 1.0,
                                        stop_target_gradients: bool = True,
                                        sample_mask: Array | None = None) -> VTraceOutput:
    r"""(errors, pg_advantage, q_estimate) of leaky V-trace, as rlax's ``leaky_vtrace_td_error_and_advantage``.

    ``vtrace_td_error_and_advantage`` with the errors of ``leaky_vtrace`` and the policy-gradient weight mixed
    the same way: ``(1 - alpha) rho + alpha min(clip_pg_rho_threshold, rho)``.

    Parameters
    ----------
    v_tm1, v_t, r_t, discount_t, rho_tm1 : arrays, shape (T,)
        As in ``vtrace``.
    alpha : float, default 1.0
        rlax's mixing of the clipped importance sampling weights with the unclipped ones.
    lambda_ : float or array of shape (T,), default 1.0
        rlax's mixing parameter, in the trace and the policy-gradient target.
    clip_rho_threshold, clip_pg_rho_threshold : float, default 1.0
        The clip thresholds of the importance ratios in the TD errors and in the policy gradient.
    stop_target_gradients : bool, default True
        Whether to stop gradients through the targets.
    sample_mask : bool array of shape (T,), optional
        False skips a step in the errors, as in ``vtrace``.

    Returns
    -------
    VTraceOutput
        The named tuple ``(errors, pg_advantage, q_estimate)``, arrays of shape (T,).

    Raises
    ------
    ShapeError
        (a ValueError and an AssertionError, as chex's) for inputs that are not one sequence each (rank 1) of one
        length, or a ``lambda_`` that is neither a scalar nor one value per step.
    DTypeError
        (a TypeError and an AssertionError) for a ``sample_mask`` that is not bool.
    ValueError
        For a NaN trace coefficient.

    Examples
    --------
    >>> import numpy as np
    >>> from gae_xp.adapters.rlax import leaky_vtrace_td_error_and_advantage
    >>> v_tm1, v_t = np.array([0.0, 2.0, 4.0]), np.array([2.0, 4.0, 6.0])
    >>> r_t, discount_t, rho_tm1 = np.array([1.0, 0.0, 2.0]), np.array([0.5, 0.5, 0.5]), np.array([1.0, 2.0, 0.5])
    >>> out = leaky_vtrace_td_error_and_advantage(v_tm1, v_t, r_t, discount_t, rho_tm1, alpha=0.5)
    >>> out.pg_advantage.tolist()
    [2.1875, 0.375, 0.5]
    """
    xp = _sequences(v_tm1, v_t, r_t, discount_t, rho_tm1)
    lam = xp.ones_like(discount_t) * _per_step(xp, lambda_, discount_t)
    errors = leaky_vtrace(v_tm1, v_t, r_t, discount_t, rho_tm1, alpha, lam, clip_rho_threshold,
                          stop_target_gradients, sample_mask)
    targets_tm1 = errors + v_tm1
    q_bootstrap = xp.concat([lam[:-1] * targets_tm1[1:] + (1 - lam[:-1]) * v_tm1[1:], v_t[-1:]])
    q_estimate = r_t + discount_t * q_bootstrap
    pg_advantage = _leaky(xp, rho_tm1, alpha, clip_pg_rho_threshold) * (q_estimate - v_tm1)
    return VTraceOutput(errors=errors, pg_advantage=pg_advantage, q_estimate=q_estimate)


def _sequences(*arrays: Array) -> Any:
    """The shared namespace; ShapeError unless every array is 1-D and of one length."""
    xp = array_namespace(*arrays)
    for a in arrays:
        if a.ndim != 1:
            raise ShapeError(f"rlax takes one time-major sequence (rank 1) per call, got shape {tuple(a.shape)}; "
                             "vmap over a batch")
        if tuple(a.shape) != tuple(arrays[0].shape):
            raise ShapeError(f"sequences of different shapes {tuple(arrays[0].shape)} and {tuple(a.shape)}")
    return xp


def _bootstrapped_values(values: Array, r_t: Array) -> None:
    if values.ndim != 1 or values.shape[0] != r_t.shape[0] + 1:
        raise ShapeError(f"values must hold v(s_0) .. v(s_T): shape ({r_t.shape[0] + 1},), got {tuple(values.shape)}")


def _per_step(xp: Any, lambda_: Coefficient, steps: Array) -> Coefficient:
    """lambda_ as rlax takes it: a number, a 0-d array or one value per step."""
    if isinstance(lambda_, numbers.Real) and not isinstance(lambda_, bool):
        return float(lambda_)
    if lambda_.ndim > 1 or (lambda_.ndim == 1 and tuple(lambda_.shape) != tuple(steps.shape)):
        raise ShapeError(f"lambda_ must be a scalar or one value per step {tuple(steps.shape)}, got "
                         f"{tuple(lambda_.shape)}")
    return lambda_


def _leaky(xp: Any, rho: Array, alpha: float, threshold: float) -> Array:
    """(1 - alpha) rho + alpha min(threshold, rho); min(threshold, rho) itself for alpha = 1."""
    clipped = xp.minimum(rho, like(xp, threshold, rho))
    if isinstance(alpha, numbers.Real) and alpha == 1:
        return clipped
    return (1 - alpha) * rho + alpha * clipped


def _stop_target(errors: Array, v_tm1: Array, stop_target_gradients: bool) -> Array:
    """rlax's ``stop_gradient(errors + v_tm1) - v_tm1`` (the same rounding), or the errors themselves."""
    if not stop_target_gradients:
        return errors
    return stop_gradient(errors + v_tm1) - v_tm1
