r"""REINFORCE++ (Hu et al., 2025) and its group-baseline variant, on ``discounted_cumsum``, ``whiten`` and
``group_advantages``: per-token advantages of padded (B, T) responses."""

from __future__ import annotations

from typing import Any

from . import _prepare as prepare_
from ._compat import device_of, isdtype
from .estimators import discounted_cumsum, whiten
from .groups import group_advantages, to_tokens

Array = Any

__all__ = ["reinforce_plus_plus", "reinforce_plus_plus_baseline"]


def reinforce_plus_plus(token_rewards: Array, response_mask: Array, *, gamma: float = 1.0,
                        eps: float = 1e-8) -> Array:
    r"""REINFORCE++: each response token's discounted return, whitened over the batch's response tokens.

    ::

        G_t = r_t + gamma * G_t'       t' = the row's next response token (G = 0 after the last one)
        A_t = (G_t - mean) / sqrt(var + eps)   over all response tokens of the batch (unbiased var)

    A masked token (outside the response) is absent from the recurrence:
    its reward is not read, the return passes it with no discount (the
    current verl convention, its PR #7300), and its advantage is 0. This is
    ``discounted_cumsum`` with the discount ``gamma`` on response tokens and
    1 elsewhere, then ``whiten(returns, response_mask)``.

    Parameters
    ----------
    token_rewards : array (B, T)
        Per-token rewards (the outcome reward on the last response token).
    response_mask : array (B, T)
        Bool, or numeric (nonzero = a response token).
    gamma : float, default 1.0
        In [0, 1].
    eps : float, default 1e-8
        At least 0; added to the variance (verl's ``masked_whiten``).

    Returns
    -------
    array (B, T)
        In the rewards' namespace, device and floating dtype (float16 and
        bfloat16, NumPy's from ml_dtypes too, computed in float32).

    Examples
    --------
    >>> import numpy as np
    >>> from gae_xp import reinforce_plus_plus
    >>> rewards = np.array([[0.0, 0.0, 1.0], [0.0, 0.0, 0.0]])
    >>> reinforce_plus_plus(rewards, np.array([[1, 1, 1], [1, 1, 0]]), eps=0.0).round(4)
    array([[ 0.7303,  0.7303,  0.7303],
           [-1.0954, -1.0954,  0.    ]])
    """
    xp, real, rewards, out_dtype = _checked(token_rewards, response_mask)
    prepare_.check_number("gamma", gamma, low=0.0, high=1.0, strict=False)
    prepare_.check_number("eps", eps, low=0.0, strict=False, finite=True)
    rewards = xp.where(real, rewards, xp.zeros_like(rewards))
    like = {"dtype": rewards.dtype, "device": device_of(rewards)}
    discount = xp.where(real, xp.full(real.shape, float(gamma), **like), xp.ones(real.shape, **like))
    returns = discounted_cumsum(rewards, discount, axis=-1)
    return xp.astype(whiten(returns, real, eps=eps), out_dtype, copy=False)


def reinforce_plus_plus_baseline(token_rewards: Array, response_mask: Array, group_ids: Array | int, *,
                                 eps: float = 1e-8) -> Array:
    r"""REINFORCE++-baseline: each response's score minus its group's mean, on its tokens, whitened over the
    batch's response tokens (token-weighted).

    ::

        s_b   = sum of r_bt over the response tokens of row b
        c_b   = s_b - mean of s over b's group        (group_advantages(s, group_ids, scale=None))
        A_bt  = whiten(c_b on every response token of b, response_mask)   (unbiased var, eps inside the root)

    A group of one has c = 0 (this core's convention; verl's gives a
    singleton mean 0, ``gae_xp.adapters.verl`` reproduces it); a NaN score
    gets c = 0 and is whitened with the rest.

    Parameters
    ----------
    token_rewards, response_mask : array (B, T)
        As in ``reinforce_plus_plus``.
    group_ids : integer array (B,) or int
        As in ``group_advantages``.
    eps : float, default 1e-8
        Added to the variance of the whitening.

    Returns
    -------
    array (B, T)

    Examples
    --------
    >>> import numpy as np
    >>> from gae_xp import reinforce_plus_plus_baseline
    >>> rewards = np.array([[0.0, 1.0], [0.0, 0.0], [0.0, 2.0], [0.0, 2.0]])
    >>> reinforce_plus_plus_baseline(rewards, np.ones((4, 2)), 2, eps=0.0).round(4)
    array([[ 1.3229,  1.3229],
           [-1.3229, -1.3229],
           [ 0.    ,  0.    ],
           [ 0.    ,  0.    ]])
    """
    xp, real, rewards, out_dtype = _checked(token_rewards, response_mask)
    prepare_.check_number("eps", eps, low=0.0, strict=False, finite=True)
    scores = xp.sum(xp.where(real, rewards, xp.zeros_like(rewards)), axis=-1)
    centred = group_advantages(scores, group_ids, baseline="mean", scale=None)
    return xp.astype(whiten(to_tokens(centred, response_mask=real), real, eps=eps), out_dtype, copy=False)


def _checked(token_rewards, response_mask):
    """(namespace, the response tokens as bool, the rewards in the compute dtype, the output dtype), after the
    shapes and dtypes are checked: float16 and bfloat16 (torch's, and NumPy's from ml_dtypes) computed in
    float32, as everywhere in gae_xp (``_prepare.compute_dtypes``), the answer cast back."""
    prepare_.require_array("token_rewards", token_rewards)
    prepare_.require_array("response_mask", response_mask)
    arrays = {"token_rewards": token_rewards, "response_mask": response_mask}
    xp = prepare_.namespace_of(arrays)
    prepare_.check_same_device(arrays, "token_rewards")
    if token_rewards.ndim != 2:
        raise ValueError(f"token_rewards must be 2-D (B, T), got shape {tuple(token_rewards.shape)}")
    prepare_.same_shape("response_mask", response_mask, tuple(token_rewards.shape), anchor="token_rewards")
    if not isdtype(xp, token_rewards.dtype, "real floating"):
        raise TypeError(f"token_rewards must have a real floating dtype, got {token_rewards.dtype}")
    if not isdtype(xp, response_mask.dtype, ("bool", "real floating", "integral")):
        raise TypeError(f"response_mask must be bool or numeric (nonzero = a response token), got dtype "
                        f"{response_mask.dtype}")
    real = response_mask if response_mask.dtype == xp.bool else response_mask != 0
    out_dtype, dtype = prepare_.compute_dtypes(xp, {"token_rewards": token_rewards}, token_rewards)
    return xp, real, xp.astype(token_rewards, dtype, copy=False), out_dtype

