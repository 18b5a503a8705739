"""slime's ``vanilla_gae``, ``chunked_gae`` and ``chunked_discounted_returns`` (slime/utils/ppo_utils.py), on
the chunk scan.

Right-padded [B, T] rewards and values, time on the last axis; the value
after the last step is 0; ``returns = advantages + values``;
``chunked_discounted_returns`` is ``G_t = r_t + discount G_{t+1}``, ``G_T = 0``.
``chunk_size`` is handed to the scan (slime's chunk scan loops over the
chunks in Python; here they are carried by the same scan one level up).

Deliberate differences from slime:

* any chunk size gives the serial loop's numbers, to float32 rounding no
  worse than the loop's own (slime's chunk scan drifts with the chunk size).
* float16/bfloat16 are computed in float32 and cast back (slime computes in
  the input dtype).
* gamma, lambd and discount must lie in [0, 1] (ValueError); a chunk size
  that is not a positive int raises ValueError/TypeError.
* inputs that are not 2-D raise ``ShapeError``, both a ValueError (as
  vanilla_gae's unpacking) and an AssertionError (as chunked_gae's assert).
"""

from __future__ import annotations

import gae_xp
from gae_xp.adapters._util import Array, ShapeError


def vanilla_gae(rewards: Array, values: Array, gamma: float, lambd: float) -> tuple[Array, Array]:
    r"""(advantages, returns) of slime's serial loop, for right-padded [B, T] arrays.

    ::

        delta_t = r_t + gamma V_{t+1} - V_t          (V_T = 0)
        A_t     = delta_t + gamma lambd A_{t+1},     returns = A + V

    Parameters
    ----------
    rewards : array, shape (B, T)
        slime's reward sequence, time on the last axis.
    values : array, shape (B, T)
        Value predictions; the next value of the final step is taken as 0 (slime's PPO convention).
    gamma : float
        The discount factor, in [0, 1].
    lambd : float
        The GAE lambda, in [0, 1].

    Returns
    -------
    advantages, returns : arrays, shape (B, T)
        Of the inputs' library and device, in their floating dtype; ``returns = advantages + values``.

    Raises
    ------
    ShapeError
        (a ValueError and an AssertionError) when the inputs are not 2-D or differ in shape.
    ValueError
        For gamma or lambd outside [0, 1].

    Examples
    --------
    >>> import numpy as np
    >>> from gae_xp.adapters.slime import vanilla_gae
    >>> advantages, returns = vanilla_gae(np.array([[0.0, 0.0, 1.0]]), np.array([[0.5, 0.5, 0.5]]), 1.0, 0.5)
    >>> advantages.tolist(), returns.tolist()
    ([[0.125, 0.25, 0.5]], [[0.625, 0.75, 1.0]])
    """
    _two_dimensional(rewards, values)
    return gae_xp.gae(rewards, values, gamma=gamma, lam=lambd)


def chunked_gae(rewards: Array, values: Array, gamma: float, lambd: float,
                chunk_size: int = 128) -> tuple[Array, Array]:
    r"""(advantages, returns) of slime's chunked GAE: the serial loop's numbers, whatever ``chunk_size``.

    The recurrence of ``vanilla_gae``. slime solves it with a scan inside chunks of ``chunk_size`` steps and a
    Python loop that carries the state across them; here the carry between chunks is the same scan one level up.

    Parameters
    ----------
    rewards : array, shape (B, T)
        slime's reward sequence, time on the last axis.
    values : array, shape (B, T)
        Value predictions; the next value of the final step is taken as 0.
    gamma : float
        The discount factor, in [0, 1].
    lambd : float
        The GAE lambda, in [0, 1].
    chunk_size : int, default 128
        The sequence chunk length of the parallel scan, a positive int; any value gives the serial loop's numbers to
        rounding. gae_xp's generic scan takes it as its chunk length C (at most 32 for a constant discount, see
        ``gae_xp.gae``); its kernels (numba, numba-cuda, lax.scan) ignore it.

    Returns
    -------
    advantages, returns : arrays, shape (B, T)
        Of the inputs' library and device, in their floating dtype; ``returns = advantages + values``.

    Raises
    ------
    ShapeError
        (a ValueError and an AssertionError) when the inputs are not 2-D or differ in shape.
    ValueError, TypeError
        For gamma or lambd outside [0, 1], and a chunk size that is not a positive int.

    Examples
    --------
    >>> import numpy as np
    >>> from gae_xp.adapters.slime import chunked_gae
    >>> rewards, values = np.array([[0.0, 0.0, 1.0, 0.0, 2.0]]), np.zeros((1, 5))
    >>> chunked_gae(rewards, values, 1.0, 0.5, chunk_size=2)[0].tolist()
    [[0.375, 0.75, 1.5, 1.0, 2.0]]
    """
    _two_dimensional(rewards, values)
    return gae_xp.gae(rewards, values, gamma=gamma, lam=lambd, chunk_size=chunk_size)


def chunked_discounted_returns(rewards: Array, discount: float, chunk_size: int = 128) -> Array:
    r"""[B, T] discounted returns, as slime's ``chunked_discounted_returns`` (REINFORCE++).

    ::

        G_t = r_t + discount G_{t+1},     G_T = 0

    Parameters
    ----------
    rewards : array, shape (B, T)
        slime's reward sequence, time on the last axis.
    discount : float
        The discount factor applied at each step, in [0, 1].
    chunk_size : int, default 128
        The sequence chunk length of the parallel scan, a positive int; any value gives the serial loop's numbers to
        rounding (as in ``chunked_gae``).

    Returns
    -------
    array, shape (B, T)
        The discounted returns, of the rewards' library, device and floating dtype.

    Raises
    ------
    ShapeError
        (a ValueError and an AssertionError, as slime's ``assert rewards.ndim == 2``) for rewards that are not 2-D.
    ValueError, TypeError
        For a discount outside [0, 1], and a chunk size that is not a positive int.

    Examples
    --------
    >>> import numpy as np
    >>> from gae_xp.adapters.slime import chunked_discounted_returns
    >>> chunked_discounted_returns(np.array([[1.0, 0.0, 2.0]]), 0.5).tolist()
    [[1.5, 1.0, 2.0]]
    """
    _two_dimensional(rewards)
    return gae_xp.discounted_returns(rewards, gamma=discount, chunk_size=chunk_size)


def _two_dimensional(*arrays: Array) -> None:
    for a in arrays:
        if a.ndim != 2:
            raise ShapeError(f"slime takes [B, T] arrays, got shape {tuple(a.shape)}")
    if len(arrays) == 2 and tuple(arrays[0].shape) != tuple(arrays[1].shape):
        raise ShapeError(f"rewards {tuple(arrays[0].shape)} and values {tuple(arrays[1].shape)} differ in shape")
