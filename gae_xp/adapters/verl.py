"""verl's ``compute_gae_advantage_return`` (verl/trainer/ppo/core_algos.py), on the chunk scan.

verl walks t from T-1 down to 0 and blends every step by the mask value m_t
(response_mask, 0/1 or fractional)::

    delta_t   = r_t + gamma * next_t - V_t
    A_t       = m_t (delta_t + gamma lam A_{t+1}) + (1 - m_t) A_{t+1}
    next_{t-1} = m_t V_t + (1 - m_t) next_t            (next = 0 after the end)

so a token with m = 0 (a tool-output token, right padding) is skipped: its
reward and value are ignored, no decay crosses it, and it receives the
advantage of the next real token (0 in trailing padding). ``returns = A + V``
at every position. A bool mask is ``gae_xp.gae(mask=..., fill_masked=True)``,
verl's convention for masked steps; a numeric mask (0/1 or fractional) runs
verl's blend as two ``gae_xp.discounted_cumsum`` scans. Then ``verl_F.masked_whiten(A, m)``: mean and variance
weighted by m, Bessel-corrected by ``sum(m) / (sum(m) - 1)``,
``(A - mean) * rsqrt(var + 1e-8)``, applied to every position; a mask
summing to 0 or to 1 raises verl's ValueError. The whitening is
``gae_xp.whiten`` with the mask as weights. Time is the last axis; runs under ``torch.no_grad()``
for torch tensors, as verl does.

Deliberate differences from verl:

* a NaN or inf in a slot with mask 0 changes nothing here; verl multiplies it
  by 0 and the NaN reaches every earlier advantage and the whitening.
* results are equal up to rounding, not bitwise (a tree of sums, not a chain).
* under ``jax.jit`` the mask sum cannot be read, so the two errors are not
  raised there (the whitening then gives inf/NaN as verl's arithmetic would).
* the mask is cast to the rewards' and values' float dtype (in verl a wider
  mask dtype, say float64 against float32 values, would widen the results);
  float16/bfloat16 scans run in float32.
"""

from __future__ import annotations

from typing import Any

import gae_xp
from gae_xp._compat import array_namespace, device_of, values_are_readable
from gae_xp.adapters._util import Array, float_dtype, following, no_grad, scan, take_last


def compute_gae_advantage_return(token_level_rewards: Array, values: Array, response_mask: Array, gamma: float,
                                 lam: float) -> tuple[Array, Array]:
    r"""(advantages, returns) as verl computes them, for [bs, response_length] arrays of any array-API library.

    For t = T-1 .. 0, with m the response mask and ``next = 0`` after the last token::

        delta_t = r_t + gamma next - V_t
        A_t     = m_t (delta_t + gamma lam A_{t+1}) + (1 - m_t) A_{t+1},   next = m_t V_t + (1 - m_t) next
        returns = A + V,   advantages = masked_whiten(A, m)

    Parameters
    ----------
    token_level_rewards : array, shape (bs, response_length)
        verl's token-level rewards (the score on the last response token, KL penalties per token).
    values : array, shape (bs, response_length)
        The critic's values of the response tokens.
    response_mask : bool or numeric array, shape (bs, response_length)
        verl's response mask: 1 for a token the policy generated, 0 for the tokens after [EOS] and for tool
        output in multi-turn rollouts; fractional values blend the step as verl's arithmetic does.
    gamma : float
        The discount factor used in RL, in [0, 1].
    lam : float
        The lambda of Generalized Advantage Estimation, in [0, 1].

    Returns
    -------
    advantages, returns : arrays, shape (bs, response_length)
        Of the inputs' library and device, in the rewards' and values' floating dtype. The advantages are whitened
        over the mask (mean and Bessel-corrected variance weighted by m, ``(A - mean) * rsqrt(var + 1e-8)``) at
        every position; a masked token shows the advantage of the next real token before whitening, and its
        return is that plus its own value (0 in trailing padding).

    Raises
    ------
    ValueError
        verl's, when the mask sums to 0 or to 1 (where its values can be read); and, with a bool mask, for gamma
        or lam outside [0, 1] and arrays of different shapes (a numeric mask runs verl's blend as written: gamma
        and lam unchecked, and a shape mismatch raises the array library's broadcasting error).

    Examples
    --------
    The masked token's value (9.0) is skipped: token 0 bootstraps from token 2.

    >>> import numpy as np
    >>> from gae_xp.adapters.verl import compute_gae_advantage_return
    >>> rewards, values = np.array([[0.0, 0.0, 1.0, 0.0]]), np.array([[0.5, 9.0, 0.5, 0.5]])
    >>> response_mask = np.array([[True, False, True, True]])
    >>> advantages, returns = compute_gae_advantage_return(rewards, values, response_mask, 1.0, 1.0)
    >>> returns.tolist()
    [[1.0, 9.5, 1.0, 0.0]]
    >>> advantages.round(4).tolist()
    [[0.5774, 0.5774, 0.5774, -1.1547]]
    """
    xp = array_namespace(token_level_rewards, values, response_mask)
    with no_grad(values):
        dtype = float_dtype(xp, token_level_rewards, values)
        m = xp.astype(response_mask, dtype)
        if xp.isdtype(response_mask.dtype, "bool"):
            advantages, returns = gae_xp.gae(token_level_rewards, values, gamma=gamma, lam=lam, mask=response_mask,
                                             fill_masked=True)
        else:
            advantages, returns = _blended(xp, xp.astype(token_level_rewards, dtype, copy=False),
                                           xp.astype(values, dtype, copy=False), m, gamma, lam)
        _check_mask_sum(xp, m)
        return gae_xp.whiten(advantages, m, unbiased=True, eps=1e-8, masked_fill=None), returns


def _blended(xp: Any, r: Array, v: Array, m: Array, gamma: float, lam: float) -> tuple[Array, Array]:
    """verl's two recurrences for a numeric mask: every step blended by its mask value."""
    real = m != 0
    zero = xp.zeros((), dtype=v.dtype, device=device_of(v))
    # V at the next real token, blended by the mask as verl does; 0 after the end.
    latest = scan(xp.where(real, m * v, zero), 1 - m)
    next_values = following(xp, latest, xp.zeros_like(take_last(latest)))
    delta = r + gamma * next_values - v
    advantages = scan(xp.where(real, m * delta, zero), 1 - m + m * (gamma * lam))
    return advantages, advantages + v


def _check_mask_sum(xp: Any, m: Array) -> None:
    """verl's masked_var raises for a mask summing to 0 or to 1 (Bessel's n / (n - 1))."""
    if not values_are_readable(m):
        return
    total = float(xp.sum(m))
    if total == 0:
        raise ValueError("At least one element in the mask has to be 1.")
    if total == 1:
        raise ValueError("The sum of the mask is one, which can cause a division by zero.")
