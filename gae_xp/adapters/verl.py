"""verl's advantage estimators (verl/trainer/ppo/core_algos.py): GAE on the chunk scan, and the outcome-reward
estimators (GRPO, Dr.GRPO, RLOO, REINFORCE++ and REINFORCE++-baseline) on ``gae_xp.group_advantages``.

The outcome-reward estimators are documented at ``compute_grpo_outcome_advantage`` below. GAE:

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

The outcome-reward estimators take verl's arguments: [bs, response_length]
``token_level_rewards`` and ``response_mask``, and ``index``, verl's NumPy
object array of uid strings (one per row; rows with equal uids are the
responses to one prompt, in any order). The score of a row is the sum of
its token rewards; the scalar per row is broadcast as
``scalar[:, None] * response_mask``; each returns verl's pair (for GRPO,
RLOO and REINFORCE++-baseline the same array twice, as verl returns it).
Every one takes ``**kwargs`` (verl's trainer passes ``index=`` and
``config=`` to all of them). A uid of one row is verl's: GRPO gives it mean
0 and std 1, RLOO and REINFORCE++-baseline leave its score as it is.

Deliberate differences from verl's outcome-reward estimators:

* a group whose scores are all equal gets exactly 0 (verl's float32 mean of
  equal scores such as 0.1, 7.77 or 1e6 + 0.5 is not exact, and GRPO then
  gives advantages up to +-0.97); the statistics are float64 two-pass sums,
  so near-constant scores keep their digits (verl #6348);
* a NaN score is left out of its group's statistics and gets advantage 0
  (verl's mean and std become NaN for the whole group);
* the result is equal to verl's up to rounding, not bitwise;
* REINFORCE++ takes ``gamma=`` too (verl reads ``config.gamma`` only), and a
  missing gamma raises ValueError (verl asserts ``config is not None``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

import gae_xp
from gae_xp._compat import array_namespace, device_of, values_are_readable
from gae_xp.adapters._groups import Groups, rows_times_mask
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


# --- the outcome-reward estimators -----------------------------------------------------------------------------


def compute_grpo_outcome_advantage(token_level_rewards: Array, response_mask: Array, index: Any,
                                   epsilon: float = 1e-6, norm_adv_by_std_in_grpo: bool = True, config: Any = None,
                                   **kwargs: Any) -> tuple[Array, Array]:
    r"""GRPO (and Dr.GRPO) as verl computes it: each row's score against its uid's, to every response token.

    ::

        s_i = sum_t token_level_rewards[i, t]
        a_i = (s_i - mean_g) / (std_g + epsilon)     (std unbiased; s_i - mean_g when not norm_adv_by_std_in_grpo)
        a_i = s_i / (1 + epsilon)  or  s_i           for a uid of one row (verl's mean 0, std 1; 1 + epsilon
                                                     rounded to float32, as verl's torch.tensor(1.0) is)
        advantages = returns = a[:, None] * response_mask

    Parameters
    ----------
    token_level_rewards : array, shape (bs, response_length)
        verl's token-level rewards (the outcome score on the last response token).
    response_mask : array, shape (bs, response_length)
        verl's response mask (int, bool or float; multiplied in as verl does).
    index : array-like of hashable labels, shape (bs,)
        verl's ``uid`` column: a NumPy object array of uid strings (ints work too).
    epsilon : float, default 1e-6
        Added to the group's standard deviation.
    norm_adv_by_std_in_grpo : bool, default True
        False gives Dr.GRPO (no division by the std).
    config, **kwargs
        Accepted and ignored, as verl's trainer passes them.

    Returns
    -------
    advantages, returns : the same array, shape (bs, response_length)
        In torch's promotion of the rewards' and mask's dtypes, on their device.

    Raises
    ------
    ValueError
        ``index`` not one label per row; and the errors of ``gae_xp.group_advantages`` (a negative epsilon).

    Examples
    --------
    >>> import numpy as np
    >>> from gae_xp.adapters.verl import compute_grpo_outcome_advantage
    >>> rewards = np.array([[0.0, 1.0], [0.0, 0.0], [0.0, 0.1], [0.0, 0.1], [0.0, 2.0]])
    >>> mask = np.array([[1, 1], [1, 1], [1, 0], [1, 1], [1, 1]])
    >>> uid = np.array(["a", "a", "b", "b", "c"], dtype=object)
    >>> advantages, returns = compute_grpo_outcome_advantage(rewards, mask, uid)
    >>> advantages.round(4).tolist()    # "b" has equal scores: 0; "c" is alone: 2 / (1 + 1e-6)
    [[0.7071, 0.7071], [-0.7071, -0.7071], [0.0, 0.0], [0.0, 0.0], [2.0, 2.0]]
    """
    xp = array_namespace(token_level_rewards, response_mask)
    with no_grad(token_level_rewards):
        scores = xp.sum(token_level_rewards, axis=-1)
        groups = Groups.of(index, scores.shape[0])
        scale = "group" if norm_adv_by_std_in_grpo else None
        scalars = gae_xp.group_advantages(scores, groups.ids_like(xp, scores), baseline="mean", scale=scale,
                                          eps=epsilon, unbiased=True)
        alone = groups.alone_like(xp, scores)
        if alone is not None:
            # verl's std of a lone row is torch.tensor(1.0), a float32: 1 + epsilon is rounded to float32 there.
            lone_std = float(np.float32(1.0) + np.float32(epsilon))
            scalars = xp.where(alone, scores / lone_std if norm_adv_by_std_in_grpo else scores, scalars)
        advantages = rows_times_mask(xp, scalars, response_mask)
        return advantages, advantages


def compute_rloo_outcome_advantage(token_level_rewards: Array, response_mask: Array, index: Any,
                                   epsilon: float = 1e-6, config: Any = None, **kwargs: Any) -> tuple[Array, Array]:
    r"""RLOO as verl's ``compute_rloo_outcome_advantage`` computes it: each score minus the mean of the others.

    ::

        a_i = (s_i - mean_g) n_g / (n_g - 1)      (= s_i - the mean of the other n_g - 1 scores of its uid)
        a_i = s_i                                 for a uid of one row (verl's loop leaves it; its
                                                  ``rloo_vectorized`` gives 0 there)
        advantages = returns = a[:, None] * response_mask

    Parameters
    ----------
    token_level_rewards, response_mask, index
        As in ``compute_grpo_outcome_advantage``.
    epsilon, config, **kwargs
        Accepted and ignored, as in verl.

    Returns
    -------
    advantages, returns : the same array, shape (bs, response_length)

    Examples
    --------
    >>> import numpy as np
    >>> from gae_xp.adapters.verl import compute_rloo_outcome_advantage
    >>> rewards = np.array([[1.0], [0.0], [0.0], [3.0]])
    >>> advantages, _ = compute_rloo_outcome_advantage(rewards, np.ones((4, 1)), np.array(["a", "a", "a", "b"]))
    >>> advantages[:, 0].tolist()
    [1.0, -0.5, -0.5, 3.0]
    """
    xp = array_namespace(token_level_rewards, response_mask)
    with no_grad(token_level_rewards):
        scores = xp.sum(token_level_rewards, axis=-1)
        groups = Groups.of(index, scores.shape[0])
        scalars = gae_xp.group_advantages(scores, groups.ids_like(xp, scores), baseline="leave_one_out", scale=None)
        alone = groups.alone_like(xp, scores)
        if alone is not None:
            scalars = xp.where(alone, scores, scalars)
        advantages = rows_times_mask(xp, scalars, response_mask)
        return advantages, advantages


def compute_reinforce_plus_plus_baseline_outcome_advantage(token_level_rewards: Array, response_mask: Array,
                                                           index: Any, epsilon: float = 1e-6, config: Any = None,
                                                           **kwargs: Any) -> tuple[Array, Array]:
    r"""REINFORCE++-baseline as verl computes it: s - its uid's mean, to the tokens, whitened over the batch.

    ::

        b_i = s_i - mean_g                       (s_i for a uid of one row: verl's mean 0)
        x   = b[:, None] * response_mask
        advantages = returns = masked_whiten(x, response_mask) * response_mask

    ``masked_whiten`` is current verl's: mean and Bessel-corrected variance weighted by the mask (its
    ``masked_mean`` divides by ``sum(m) + 1e-8``), ``(x - mean) * rsqrt(var + 1e-8)``; a mask summing to 0 or 1
    raises verl's ValueError.

    Parameters
    ----------
    token_level_rewards, response_mask, index
        As in ``compute_grpo_outcome_advantage``.
    epsilon, config, **kwargs
        Accepted and ignored, as in verl.

    Returns
    -------
    advantages, returns : the same array, shape (bs, response_length)

    Examples
    --------
    >>> import numpy as np
    >>> from gae_xp.adapters.verl import compute_reinforce_plus_plus_baseline_outcome_advantage as rfpp_baseline
    >>> rewards = np.array([[0.0, 1.0], [0.0, 0.0]])
    >>> advantages, _ = rfpp_baseline(rewards, np.ones((2, 2)), np.array(["a", "a"], dtype=object))
    >>> advantages.round(4).tolist()
    [[0.866, 0.866], [-0.866, -0.866]]
    """
    xp = array_namespace(token_level_rewards, response_mask)
    with no_grad(token_level_rewards):
        scores = xp.sum(token_level_rewards, axis=-1)
        groups = Groups.of(index, scores.shape[0])
        centred = gae_xp.group_advantages(scores, groups.ids_like(xp, scores), baseline="mean", scale=None)
        alone = groups.alone_like(xp, scores)
        if alone is not None:
            centred = xp.where(alone, scores, centred)
        tokens = rows_times_mask(xp, centred, response_mask)
        m = xp.astype(response_mask, tokens.dtype)
        advantages = _masked_whiten(xp, tokens, m) * m
        return advantages, advantages


def compute_reinforce_plus_plus_outcome_advantage(token_level_rewards: Array, response_mask: Array,
                                                  config: Any = None, gamma: float | None = None,
                                                  **kwargs: Any) -> tuple[Array, Array]:
    r"""REINFORCE++ as current verl computes it (its PR #7300): discounted returns over the response tokens only,
    whitened over the batch.

    For t = T-1 .. 0, with m the response mask and ``run = 0`` after the last token::

        G       = r_t + gamma run
        returns_t = m_t G,      run = m_t G + (1 - m_t) run
        advantages = masked_whiten(returns, response_mask) * response_mask

    So a masked token (tool output in a multi-turn rollout, right padding) is skipped: its reward is not read,
    the running return passes it undiscounted, and its return is 0. Before PR #7300 (issue #7278) verl stored
    ``returns_t = G`` at every token and reset ``run = G m_t``: the return was cut after every masked token, so
    a reward after an observation span never reached the earlier turns, and masked tokens kept a return. The two
    agree when the mask only pads the right end and the padding's rewards are 0.

    A bool or integer mask (verl's int64 attention-mask slice; an integer is read as 0 or not 0) runs
    ``gae_xp.discounted_returns(mask=...)``; a floating one verl's blend as one scan. The
    whitening is current verl's ``masked_whiten``, as in REINFORCE++-baseline.

    Parameters
    ----------
    token_level_rewards, response_mask : arrays, shape (bs, response_length)
        As in ``compute_grpo_outcome_advantage``.
    config : object or mapping, optional
        verl's algorithm config: ``config.gamma`` (or ``config["gamma"]`` for any ``collections.abc.Mapping``) is
        the discount when ``gamma`` is None.
    gamma : float, optional
        The discount, in [0, 1]; overrides ``config``.
    **kwargs
        Accepted and ignored (verl's trainer passes ``index=``).

    Returns
    -------
    advantages, returns : arrays, shape (bs, response_length)

    Raises
    ------
    ValueError
        No gamma (neither ``gamma`` nor ``config``), gamma outside [0, 1], or verl's, for a mask summing to 0 or 1.

    Examples
    --------
    verl's own test: two observation tokens do not block the reward (gamma 0.5).

    >>> import numpy as np
    >>> from gae_xp.adapters.verl import compute_reinforce_plus_plus_outcome_advantage
    >>> rewards, mask = np.array([[0.0, 0.0, 0.0, 0.0, 2.0]]), np.array([[1.0, 1.0, 0.0, 0.0, 1.0]])
    >>> _, returns = compute_reinforce_plus_plus_outcome_advantage(rewards, mask, gamma=0.5)
    >>> returns.tolist()
    [[0.5, 1.0, 0.0, 0.0, 2.0]]
    """
    gamma = _gamma(config, gamma)
    xp = array_namespace(token_level_rewards, response_mask)
    with no_grad(token_level_rewards):
        dtype = float_dtype(xp, token_level_rewards, response_mask)
        r = xp.astype(token_level_rewards, dtype, copy=False)
        if xp.isdtype(response_mask.dtype, "bool"):
            returns = gae_xp.discounted_returns(r, gamma=gamma, mask=response_mask)
        elif xp.isdtype(response_mask.dtype, "integral"):  # verl's attention-mask slice: 0/1 int64
            returns = gae_xp.discounted_returns(r, gamma=gamma, mask=response_mask != 0)
        else:
            returns = _blended_returns(xp, r, xp.astype(response_mask, dtype), gamma)
        m = xp.astype(response_mask, dtype)
        return _masked_whiten(xp, returns, m) * m, returns


def _masked_whiten(xp: Any, x: Array, m: Array) -> Array:
    """Current verl's ``masked_whiten(x, m)``: ``masked_mean`` divides by ``sum(m) + 1e-8``, the variance is the
    masked mean of squared deviations times ``sum(m) / (sum(m) - 1)``, then ``(x - mean) * rsqrt(var + 1e-8)`` at
    every position. Slots of weight 0 are left out with ``where``; a mask summing to 0 or 1 raises verl's error."""
    _check_mask_sum(xp, m)
    real = m != 0
    zero = xp.zeros((), dtype=x.dtype, device=device_of(x))
    total = xp.sum(m)
    mean = xp.sum(xp.where(real, x * m, zero)) / (total + 1e-8)
    centred = x - mean
    variance = xp.sum(xp.where(real, centred * centred * m, zero)) / (total + 1e-8) * (total / (total - 1))
    return centred / xp.sqrt(variance + 1e-8)


def _gamma(config: Any, gamma: float | None) -> float:
    """The discount: ``gamma`` if given, else verl's ``config.gamma``: a key of any mapping (a dict, a UserDict, a
    MappingProxyType, OmegaConf's DictConfig), else an attribute."""
    if gamma is None and config is not None:
        gamma = config.get("gamma") if isinstance(config, Mapping) else getattr(config, "gamma", None)
    if gamma is None:
        raise ValueError("gamma is needed: pass gamma= or a config with a gamma (verl reads config.gamma)")
    return gamma


def _blended_returns(xp: Any, r: Array, m: Array, gamma: float) -> Array:
    """verl's REINFORCE++ loop for a numeric mask, as one scan: run_t = m r + (1 - m + m gamma) run_{t+1};
    returns_t = m (r_t + gamma run_{t+1}). Slots of weight 0 are left out with ``where``."""
    if not 0.0 <= gamma <= 1.0:
        raise ValueError(f"gamma must lie in [0, 1], got {gamma}")
    zero = xp.zeros((), dtype=r.dtype, device=device_of(r))
    real = m != 0
    running = scan(xp.where(real, m * r, zero), 1 - m + m * gamma)
    after = following(xp, running, xp.zeros_like(take_last(running)))
    return xp.where(real, m * (r + gamma * after), zero)
