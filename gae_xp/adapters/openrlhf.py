"""OpenRLHF's ``get_advantages_and_returns`` and its advantage normalisation
(openrlhf/trainer/ppo_utils/experience_maker.py), on the chunk scan; and its reward shaping for the
critic-free estimators (``group_advantages``: group_norm, dr_grpo, rloo, reinforce_baseline) on
``gae_xp.group_advantages``.

``get_advantages_and_returns`` multiplies values and rewards by
``action_mask`` (any numeric or bool mask; None for none), then runs the
plain loop over time with value 0 after the end: a hole is a zero-reward,
zero-value step that still decays (unlike verl, which skips it).
``returns = advantages + values`` with the masked values. Values come first
in the signature. Lists of 1-D tensors (packed samples) are handled one
sample at a time with the same ``action_mask``, and lists come back.

``normalize_advantages`` is the last block of ``compute_advantages_and_returns``
(estimators gae, reinforce, reinforce_baseline): the advantages of every
experience are normalised together, over the real tokens of all of them::

    mean = sum(m A) / sum(m)
    var  = sum(m (A - mean)^2) / sum(m)                (biased)
    A'   = (A - mean) * rsqrt(max(var, 1e-8))          (A - mean with no_std_norm)

applied to every position, masked ones included (OpenRLHF's
``--algo.advantage.no_std_norm`` keeps the mean shift and drops the
division; the variance is clamped at 1e-8, not offset by it, so
``gae_xp.whiten(eps=...)`` does not reproduce it). A list of experiences'
[B_i, T_i] advantages and masks gives a list back; one array gives one.
Both run under ``torch.no_grad()`` for torch tensors, as OpenRLHF does.

Deliberate differences from OpenRLHF: results equal up to rounding (a tree of
sums, not a chain); gamma and lambd must lie in [0, 1] (ValueError); the
normalisation's statistics are computed in the advantages' dtype, at least
float32 (OpenRLHF casts to float32, so float64 advantages get float32
statistics there), and masked entries are left out with ``where`` (a NaN in
a masked slot does not reach the statistics; OpenRLHF multiplies it by 0).
"""

from __future__ import annotations

import gae_xp
from gae_xp import _prepare as prepare_
from gae_xp._compat import array_namespace, device_of
from gae_xp.adapters._util import Array, float_dtype, no_grad
from gae_xp.adapters.trl import _check_groups

#: OpenRLHF's critic-free estimators and the core's (baseline, scale) for each.
ESTIMATORS = {"group_norm": ("mean", "group"), "dr_grpo": ("mean", None), "reinforce_baseline": ("mean", None),
              "rloo": ("leave_one_out", None)}


def get_advantages_and_returns(values: Array | list[Array], rewards: Array | list[Array], action_mask: Array | None,
                               gamma: float, lambd: float) -> tuple[Array, Array] | tuple[list[Array], list[Array]]:
    r"""(advantages, returns) as OpenRLHF computes them, for [B, T] arrays or lists of [T_i] arrays.

    With ``V = action_mask * values`` and ``r = action_mask * rewards`` (the mask's holes become zero-reward,
    zero-value steps that still decay) and V after the last step 0::

        delta_t = r_t + gamma V_{t+1} - V_t,   A_t = delta_t + gamma lambd A_{t+1},   returns = A + V

    Parameters
    ----------
    values : array, shape (batch_size, response_size), or a list of arrays of shape (T_i,)
        The critic's values of the action tokens; a list holds packed samples, one sequence each.
    rewards : array or list of arrays
        The per-token rewards, which may include OpenRLHF's KL penalty term; of ``values``' shape (or list).
    action_mask : bool or numeric array, or None
        OpenRLHF's action mask (1 for a generated token), multiplied into values and rewards; None for none.
        With lists, the same mask is applied to every sample.
    gamma : float
        The discount factor, in [0, 1].
    lambd : float
        The GAE lambda, in [0, 1].

    Returns
    -------
    advantages, returns : arrays of ``values``' shape, or lists of them
        Of the inputs' library and device, in their floating dtype; ``returns = advantages + masked values``.

    Raises
    ------
    ValueError
        For gamma or lambd outside [0, 1], and values and rewards of different shapes (a mask that does not
        broadcast to them raises the array library's own error, as in OpenRLHF).

    Examples
    --------
    >>> import numpy as np
    >>> from gae_xp.adapters.openrlhf import get_advantages_and_returns
    >>> values, rewards = np.array([[0.5, 0.5, 0.5]]), np.array([[0.0, 1.0, 5.0]])
    >>> advantages, returns = get_advantages_and_returns(values, rewards, np.array([[1.0, 1.0, 0.0]]), 1.0, 1.0)
    >>> advantages.tolist(), returns.tolist()
    ([[0.5, 0.5, 0.0]], [[1.0, 1.0, 0.0]])

    Packed samples, one list entry each:

    >>> advantages, _ = get_advantages_and_returns([np.array([0.5, 0.5]), np.array([1.0])],
    ...                                            [np.array([0.0, 1.0]), np.array([2.0])], None, 1.0, 1.0)
    >>> [a.tolist() for a in advantages]
    [[0.5, 0.5], [1.0]]
    """
    if isinstance(values, list):
        pairs = [get_advantages_and_returns(_unsqueeze(v), _unsqueeze(r), action_mask, gamma, lambd)
                 for v, r in zip(values, rewards)]
        return [a[0, ...] for a, _ in pairs], [r[0, ...] for _, r in pairs]
    with no_grad(values):
        if action_mask is not None:
            xp = array_namespace(values, rewards, action_mask)
            if not xp.isdtype(action_mask.dtype, "real floating"):
                action_mask = xp.astype(action_mask, values.dtype)
            values = action_mask * values
            rewards = action_mask * rewards
        return gae_xp.gae(rewards, values, gamma=gamma, lam=lambd)


def normalize_advantages(advantages: Array | list[Array], action_mask: Array | list[Array],
                         no_std_norm: bool = False) -> Array | list[Array]:
    r"""OpenRLHF's normalisation of the experiences' advantages, together over their real tokens.

    ::

        mean = sum(m A) / sum(m),   var = sum(m (A - mean)^2) / sum(m)
        A'   = (A - mean) * rsqrt(max(var, 1e-8))        (A - mean with no_std_norm)

    Parameters
    ----------
    advantages : array or list of arrays
        One [B_i, T_i] array per experience (shapes may differ), or one array.
    action_mask : bool or numeric array, or a list of them
        One per advantages array, of its shape.
    no_std_norm : bool
        OpenRLHF's ``--algo.advantage.no_std_norm``: shift by the mean only.

    Returns
    -------
    array or list of arrays
        As given, each in its advantages' dtype, every position shifted and scaled.

    Raises
    ------
    ValueError
        when the advantages and masks do not pair up in number and shape.

    Examples
    --------
    >>> import numpy as np
    >>> from gae_xp.adapters.openrlhf import normalize_advantages
    >>> advantages = [np.array([[1.0, 3.0, 9.0]]), np.array([[5.0]])]
    >>> masks = [np.array([[True, True, False]]), np.array([[True]])]
    >>> [a.round(4).tolist() for a in normalize_advantages(advantages, masks)]
    [[[-1.2247, 0.0, 3.6742]], [[1.2247]]]
    >>> [a.tolist() for a in normalize_advantages(advantages, masks, no_std_norm=True)]
    [[[-2.0, 0.0, 6.0]], [[2.0]]]
    """
    listed = isinstance(advantages, list)
    arrays, masks = (advantages, action_mask) if listed else ([advantages], [action_mask])
    if len(arrays) != len(masks) or any(tuple(a.shape) != tuple(m.shape) for a, m in zip(arrays, masks)):
        raise ValueError("advantages and action_mask must pair up: one mask of the same shape per advantages array, "
                         f"got shapes {[tuple(a.shape) for a in arrays]} and {[tuple(m.shape) for m in masks]}")
    xp = array_namespace(*arrays, *masks)
    with no_grad(arrays[0]):
        dtype = xp.result_type(float_dtype(xp, *arrays), xp.float32)
        flat = xp.concat([xp.reshape(xp.astype(a, dtype), (-1,)) for a in arrays])
        weights = xp.concat([xp.reshape(xp.astype(m, dtype), (-1,)) for m in masks])
        real = weights != 0
        zero = xp.zeros((), dtype=dtype, device=device_of(flat))
        count = xp.sum(weights)
        mean = xp.sum(xp.where(real, weights * flat, zero)) / count
        scale = 1.0
        if not no_std_norm:
            centred = flat - mean
            variance = xp.sum(xp.where(real, weights * (centred * centred), zero)) / count
            scale = 1 / xp.sqrt(xp.maximum(variance, xp.full((), 1e-8, dtype=dtype, device=device_of(flat))))
        out = [xp.astype((xp.astype(a, dtype) - mean) * scale, a.dtype) for a in arrays]
        return out if listed else out[0]


def group_advantages(rewards: Array, n_samples_per_prompt: int, advantage_estimator: str) -> Array:
    r"""OpenRLHF's reward shaping for the critic-free estimators: each reward against its prompt's samples.

    With the rewards in prompt order (``n_samples_per_prompt`` consecutive samples per prompt; OpenRLHF sorts
    them so before this step)::

        group_norm:                 (r - mean) / (std + 1e-9)      (torch's unbiased std)
        rloo:                       r - (S - r) / (n - 1)          (S the group's sum: r minus the others' mean)
        dr_grpo, reinforce_baseline: r - mean

    OpenRLHF then gives the shaped reward to the last response token (``compute_reward``, with the KL penalty)
    and sums it back over the tokens with gamma 1 (``get_cumulative_returns``); for ``reinforce_baseline`` the
    advantages are then whitened over the batch's tokens (``normalize_advantages``).

    Deliberate differences from OpenRLHF: a group whose rewards are all equal gets exactly 0 (OpenRLHF's float32
    mean of equal rewards such as 0.1 is not exact, and with its eps of 1e-9 group_norm then gives +-0.8 and
    more); one sample per prompt gives 0 (OpenRLHF's group_norm and rloo give NaN there: a std of one sample,
    a division by n - 1 = 0); a NaN reward is left out of its group's statistics and gets 0 (OpenRLHF's group
    becomes NaN).

    Parameters
    ----------
    rewards : array, shape (N,)
        One reward per sample, prompt by prompt.
    n_samples_per_prompt : int
        OpenRLHF's ``--rollout.n_samples_per_prompt``; N must be a multiple of it.
    advantage_estimator : {"group_norm", "dr_grpo", "rloo", "reinforce_baseline"}
        OpenRLHF's ``--algo.advantage.estimator``.

    Returns
    -------
    array, shape (N,)
        In the rewards' namespace, device and floating dtype.

    Raises
    ------
    ValueError
        Another estimator; rewards not 1-D; ``n_samples_per_prompt`` below 1 or not dividing N.

    Examples
    --------
    >>> import numpy as np
    >>> from gae_xp.adapters.openrlhf import group_advantages
    >>> rewards = np.array([1.0, 0.0, 0.0, 0.1, 0.1, 0.1])
    >>> group_advantages(rewards, 3, "rloo").round(4).tolist()
    [1.0, -0.5, -0.5, 0.0, 0.0, 0.0]
    >>> group_advantages(rewards, 3, "group_norm").round(4).tolist()
    [1.1547, -0.5774, -0.5774, 0.0, 0.0, 0.0]
    """
    if advantage_estimator not in ESTIMATORS:
        raise ValueError(f"advantage_estimator must be one of {sorted(ESTIMATORS)} (the critic-free estimators "
                         f"whose rewards OpenRLHF shapes by group), got {advantage_estimator!r}")
    prepare_.require_array("rewards", rewards)
    _check_groups("n_samples_per_prompt", rewards, n_samples_per_prompt)
    baseline, scale = ESTIMATORS[advantage_estimator]
    return gae_xp.group_advantages(rewards, n_samples_per_prompt, baseline=baseline, scale=scale, eps=1e-9,
                                   unbiased=True)


def _unsqueeze(a: Array) -> Array:
    return array_namespace(a).expand_dims(a, axis=0)
