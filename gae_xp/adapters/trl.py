"""TRL's PPO advantages and masked statistics (trl/experimental/ppo/ppo_trainer.py, formerly
trl/trainer/ppo_trainer.py and trl/core.py), on the chunk scan; and GRPOTrainer's group advantages
(``grpo_advantages``, trl/trainer/grpo_trainer.py) on ``gae_xp.group_advantages``.

``compute_advantages_and_returns`` is step 6 of ``PPOTrainer.train`` (the
template many RLHF trainers copied): [batch, response_length] rewards and
values, time last, the plain loop over the whole response with value 0
after it (TRL has already set the values past ``sequence_length + 1`` to 0
and put the score on the last real token)::

    delta_t = r_t + gamma V_{t+1} - V_t,    A_t = delta_t + gamma lam A_{t+1}
    returns = A + V
    advantages = masked_whiten(A, ~padding_mask), then 0 where padding_mask

(TRL's defaults: gamma 1.0, lam 0.95). ``masked_mean(values, mask, axis)``
is ``sum(values * mask) / sum(mask)``; ``masked_var(values, mask, unbiased)``
the masked mean of the squared deviations, times ``n / (n - 1)`` when
unbiased (n = sum(mask); n = 0 raises TRL's ValueError); ``masked_whiten``
is ``(values - mean) * rsqrt(var + 1e-8)`` with that unbiased variance,
plus the mean again when ``shift_mean=False``: ``gae_xp.whiten`` with the
mask as weights. A mask may be bool or numeric (TRL multiplies by it).
Runs under ``torch.no_grad()`` for torch tensors, as TRL's rollout does.

Deliberate differences from TRL:

* masked entries are left out with ``where``: a NaN or inf where the mask is
  0 does not reach the mean, the variance or the other entries (TRL
  multiplies it by 0 and gets NaN).
* the mask is cast to the values' float dtype (TRL's ``values * mask`` would
  widen float32 values by a float64 mask); float16/bfloat16 statistics are
  computed in float32.
* results equal up to rounding, not bitwise; gamma and lam must lie in [0, 1].
* under ``jax.jit`` the mask sum cannot be read, so the zero-sum error is not
  raised there (the statistics are then NaN, as TRL's arithmetic would give).
"""

from __future__ import annotations

from typing import Any

import gae_xp
from gae_xp import _prepare as prepare_
from gae_xp._compat import array_namespace, device_of, divide, values_are_readable
from gae_xp.adapters._util import Array, float_dtype, no_grad

#: GRPOConfig's ``scale_rewards`` values (True and False are its legacy spellings) and the core's scale for each.
SCALE_REWARDS = {"group": "group", "batch": "batch", "none": None, True: "group", False: None}

ZERO_SUM = ("The sum of the mask is zero, which can happen when `mini_batch_size=1`;"
            "try increase the `mini_batch_size` or `gradient_accumulation_steps`")


def compute_advantages_and_returns(rewards: Array, values: Array, padding_mask: Array, gamma: float = 1.0,
                                   lam: float = 0.95) -> tuple[Array, Array]:
    r"""(advantages, returns) of PPOTrainer's advantage block: the loop, then the advantages whitened and masked.

    ::

        A_t = r_t + gamma V_{t+1} - V_t + gamma lam A_{t+1}   (V and A are 0 after the last position)
        returns = A + V;   advantages = masked_whiten(A, ~padding_mask), 0 where padding_mask

    Parameters
    ----------
    rewards, values : arrays, shape (batch, response_length)
        TRL's per-token rewards (KL penalty plus the score) and values (0 past ``sequence_length + 1``).
    padding_mask : bool array, shape (batch, response_length)
        True past each response's last real token.
    gamma, lam : float
        In [0, 1] (TRL's defaults 1.0 and 0.95).

    Returns
    -------
    advantages, returns : arrays, shape (batch, response_length)
        Of the inputs' library, device and floating dtype.

    Raises
    ------
    ValueError
        TRL's, when ``padding_mask`` leaves no real token; and for gamma or lam outside [0, 1].

    Examples
    --------
    >>> import numpy as np
    >>> from gae_xp.adapters.trl import compute_advantages_and_returns
    >>> rewards, values = np.array([[0.0, 1.0, 0.0]]), np.zeros((1, 3))
    >>> advantages, returns = compute_advantages_and_returns(rewards, values, np.array([[False, False, True]]))
    >>> returns.tolist(), advantages.round(4).tolist()
    ([[0.95, 1.0, 0.0]], [[-0.7071, 0.7071, 0.0]])
    """
    xp = array_namespace(rewards, values, padding_mask)
    with no_grad(values):
        advantages, returns = gae_xp.gae(rewards, values, gamma=gamma, lam=lam)
        real = ~padding_mask if xp.isdtype(padding_mask.dtype, "bool") else padding_mask == 0
        _check_mask_sum(xp, real)
        return gae_xp.whiten(advantages, real, unbiased=True, eps=1e-8, masked_fill=0.0), returns


def masked_mean(values: Array, mask: Array, axis: int | None = None) -> Array:
    """TRL's ``masked_mean``: ``sum(values * mask, axis) / sum(mask, axis)``, masked entries left out.

    Parameters
    ----------
    values : array
        The tensor to average.
    mask : bool or numeric array of ``values``' shape
        Weights (TRL multiplies by them); entries of weight 0 are left out with ``where``.
    axis : int or None
        The axis to reduce; None: over every entry.

    Returns
    -------
    array
        0-d, or reduced over ``axis``, in ``values``' floating dtype.

    Examples
    --------
    >>> import numpy as np
    >>> from gae_xp.adapters.trl import masked_mean
    >>> float(masked_mean(np.array([1.0, 2.0, 3.0, np.nan]), np.array([0.0, 1.0, 1.0, 0.0])))
    2.5
    """
    xp = array_namespace(values, mask)
    m = xp.astype(mask, float_dtype(xp, values))
    zero = xp.zeros((), dtype=m.dtype, device=device_of(m))
    return divide(xp, xp.sum(xp.where(m != 0, values * m, zero), axis=axis), xp.sum(m, axis=axis))


def masked_var(values: Array, mask: Array, unbiased: bool = True) -> Array:
    """TRL's ``masked_var``: masked mean of the squared deviations, times ``n / (n - 1)`` when unbiased.

    ::

        mean = masked_mean(values, mask),   var = masked_mean((values - mean)^2, mask) * n / (n - 1),   n = sum(mask)

    Parameters
    ----------
    values : array
        The tensor whose variance is taken, over every entry.
    mask : bool or numeric array of ``values``' shape
        Weights, as in ``masked_mean``.
    unbiased : bool, default True
        Apply Bessel's correction ``n / (n - 1)``.

    Returns
    -------
    array
        0-d, in ``values``' floating dtype.

    Raises
    ------
    ValueError
        TRL's, when ``unbiased`` and the mask sums to 0 (where the mask's values can be read).

    Examples
    --------
    >>> import numpy as np
    >>> from gae_xp.adapters.trl import masked_var
    >>> float(masked_var(np.array([1.0, 2.0, 3.0, 4.0]), np.array([0.0, 1.0, 1.0, 0.0])))
    0.5
    """
    xp = array_namespace(values, mask)
    centred = values - masked_mean(values, mask)
    variance = masked_mean(centred * centred, mask)
    if not unbiased:
        return variance
    _check_mask_sum(xp, mask)
    total = xp.sum(xp.astype(mask, variance.dtype))
    return variance * (total / (total - 1))


def masked_whiten(values: Array, mask: Array, shift_mean: bool = True) -> Array:
    """TRL's ``masked_whiten``: ``(values - mean) * rsqrt(var + 1e-8)``, unbiased var, mean kept if not shift_mean.

    Every entry is whitened, masked ones included, with the masked statistics (``gae_xp.whiten`` with the mask
    as weights, ``masked_fill=None``).

    Parameters
    ----------
    values : array
        The tensor to whiten.
    mask : bool or numeric array of ``values``' shape
        Weights, as in ``masked_mean``.
    shift_mean : bool, default True
        False adds the mean back (scale only), as TRL's ``shift_mean=False``.

    Returns
    -------
    array
        Shaped like ``values``, in its floating dtype.

    Raises
    ------
    ValueError
        TRL's, when the mask sums to 0 (where the mask's values can be read).

    Examples
    --------
    >>> import numpy as np
    >>> from gae_xp.adapters.trl import masked_whiten
    >>> masked_whiten(np.array([1.0, 2.0, 3.0, 4.0]), np.array([0.0, 1.0, 1.0, 0.0])).round(4).tolist()
    [-2.1213, -0.7071, 0.7071, 2.1213]
    """
    xp = array_namespace(values, mask)
    _check_mask_sum(xp, mask)
    return gae_xp.whiten(values, mask, unbiased=True, eps=1e-8, shift_mean=shift_mean, masked_fill=None)


def _check_mask_sum(xp: Any, mask: Array) -> None:
    """TRL's masked_var raises for a mask summing to 0 (no real entry); read only where the values can be read."""
    if values_are_readable(mask) and not bool(xp.any(mask if xp.isdtype(mask.dtype, "bool") else mask != 0)):
        raise ValueError(ZERO_SUM)


def grpo_advantages(rewards: Array, num_generations: int, scale_rewards: str | bool = "group") -> Array:
    r"""GRPOTrainer's advantages: each reward against its group's (``num_generations`` consecutive completions).

    ::

        A_i = (r_i - nanmean_g) / (nanstd_g + 1e-4)        scale_rewards="group" (or True)
            = (r_i - nanmean_g) / (nanstd_batch + 1e-4)    scale_rewards="batch" (the group's mean, the batch's std)
            = r_i - nanmean_g                              scale_rewards="none" (or False): Dr.GRPO

    ``nanstd`` is TRL's: unbiased, over the rewards that are not NaN. A NaN reward (a completion every reward
    function returned None for) is left out of the means and stds and gets 0, as TRL's ``nan_to_num`` gives it;
    one generation per prompt gives 0 everywhere. These are the rewards summed over the reward functions with
    their weights (TRL's default ``multi_objective_aggregation="sum_then_normalize"``), for the whole gathered
    batch, before TRL slices out each process's part.

    Deliberate differences from TRL: a group whose rewards are all equal gets exactly 0 (TRL's float32 mean of
    equal rewards such as 1e6 + 0.5 is not exact, and the advantages then reach +-0.96); the statistics are
    float64 two-pass sums (TRL's ``nanstd`` takes Bessel's ``count / (count - 1)`` in torch's default float32,
    so its float64 advantages differ from these in the 8th digit); an infinite reward gives NaN advantages to
    its group (TRL's ``nan_to_num`` turns them into 0 and the infinity itself into the largest float).

    Parameters
    ----------
    rewards : array, shape (N,)
        One reward per completion, the ``num_generations`` completions of a prompt consecutive.
    num_generations : int
        Completions per prompt (GRPOConfig's ``num_generations``); N must be a multiple of it.
    scale_rewards : {"group", "batch", "none", True, False}, default "group"
        GRPOConfig's ``scale_rewards``.

    Returns
    -------
    array, shape (N,)
        In the rewards' namespace, device and floating dtype.

    Raises
    ------
    ValueError
        TRL's, for another ``scale_rewards``; rewards not 1-D, ``num_generations`` below 1 or not dividing N.

    Examples
    --------
    >>> import numpy as np
    >>> from gae_xp.adapters.trl import grpo_advantages
    >>> rewards = np.array([1.0, 0.0, np.nan, 0.5, 0.5, 0.5])
    >>> grpo_advantages(rewards, 3).round(4).tolist()    # the NaN is left out; equal rewards give 0
    [0.707, -0.707, 0.0, 0.0, 0.0, 0.0]
    >>> grpo_advantages(rewards, 3, scale_rewards="none").tolist()
    [0.5, -0.5, 0.0, 0.0, 0.0, 0.0]
    """
    if isinstance(scale_rewards, bool) or scale_rewards in ("group", "batch", "none"):
        scale = SCALE_REWARDS[scale_rewards]
    else:
        raise ValueError(f"Invalid value for scale_rewards: {scale_rewards}. Must be one of 'batch', 'group', or "
                         "'none'.")
    prepare_.require_array("rewards", rewards)
    _check_groups("num_generations", rewards, num_generations)
    return gae_xp.group_advantages(rewards, num_generations, baseline="mean", scale=scale, eps=1e-4, unbiased=True)


def _check_groups(name: str, rewards: Array, size: int) -> None:
    """One reward per completion (N,), in consecutive groups of ``size``: named errors before the core's."""
    if rewards.ndim != 1:
        raise ValueError(f"rewards must be 1-D (one per completion), got shape {tuple(rewards.shape)}")
    if isinstance(size, bool) or not isinstance(size, int) or size < 1:
        raise ValueError(f"{name} must be an int of at least 1, got {size!r}")
    if rewards.shape[0] is not None and rewards.shape[0] % size:
        raise ValueError(f"{name} = {size} must divide the number of rewards, {rewards.shape[0]}")
