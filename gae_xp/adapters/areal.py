"""AReaL's GAE: the packed ``pygae1d_nolp_misalign`` / ``cugae1d_nolp_misalign_func``
(realhf/impl/model/utils/ppo_functional.py, areal/utils/functional.py) and the padded block of
``PPOActor._compute_advantages`` (``_compute_token_level_gae`` in areal/trainer/ppo/gae.py), on the chunk scan.

Packed (``pygae1d_nolp_misalign(rewards, values, cu_seqlens, bootstrap, gamma, lam)``): 1-D rewards of
``total`` tokens, sequence i being ``[o_i, o_{i+1})`` of ``cu_seqlens``; 1-D values of ``total + N`` entries
(N sequences), one extra slot per sequence: sequence i's values are ``[o_i + i, o_{i+1} + i + 1)``, its last
slot the value after its last step. ``bootstrap[i]`` (bool; AReaL passes ``seq_no_eos_mask``, "truncated")
says whether that value is bootstrapped, else 0::

    delta_t = r_t + gamma V_{t+1} - V_t        (V_{t+1} of the last step: the extra slot, or 0)
    A_t     = delta_t + gamma lam A_{t+1}       within a sequence, A = 0 after its end
    returns = A + V                              (V: the sequence's own slots, not the extra one)

An empty sequence (a repeated offset) has no token and one value slot, and
gives no output, as in AReaL's loop. The values are gathered into aligned
ones and the extra slots into ``bootstrap_value``; one ``gae_xp.gae`` call
with ``cu_seqlens`` solves every sequence. ``cugae1d_nolp_misalign_func`` is
the CUDA kernel's name for the same call.

Padded (``compute_token_level_gae(rewards, values, loss_mask, seq_no_eos_mask, discount, gae_lambda)``):
[bs, max_seqlen], time last. The last position is never a step: its
advantage is 0, and its value is the bootstrap after step T-2 for rows
without EOS (``values[:, -1] * seq_no_eos_mask``, else 0). Steps T-2 .. 0
blend by the loss mask m as verl does::

    A_t        = m_t (delta_t + discount lam A_{t+1}) + (1 - m_t) A_{t+1}
    next_{t-1} = m_t V_t + (1 - m_t) next_t

so a token with m = 0 is skipped and gets the next real token's advantage
(a bool mask is ``gae(mask=..., fill_masked=True)``; a numeric one runs the
blend as two scans). ``returns = A + V`` everywhere. ``gae_lambda`` is a
number or one value per row ([bs], AReaL's custom lambda functions).
Results are at least float32, as AReaL's float32 accumulator makes them.

Deliberate differences from AReaL:

* no input is written: AReaL's ``nextvalues *= bootstrap[i]`` multiplies the
  extra value slot of ``values`` in place.
* a flag of 0 selects 0 (``where``), as AReaL's CUDA kernel does: a NaN in an
  extra slot that is not bootstrapped, in the last column of a row with EOS,
  or in a masked token's value does not leak (AReaL's Python loops multiply
  it by 0 and get NaN).
* packed: ``cu_seqlens`` of any integer dtype, and no sequence at all gives
  empty outputs (AReaL's ``torch.stack`` of nothing raises); the shapes are
  checked with ``ShapeError`` (a ValueError and an AssertionError, as AReaL's
  asserts).
* results equal up to rounding, not bitwise (a tree of sums, not a chain);
  gamma/discount and lam must lie in [0, 1] (AReaL only asks lambda to be
  finite) on the packed path and with a bool loss mask; a numeric loss
  mask's blend takes them as given, as AReaL does.
"""

from __future__ import annotations

from typing import Any

import gae_xp
from gae_xp._compat import array_namespace, device_of, is_array
from gae_xp.adapters._util import Array, Coefficient, ShapeError, float_dtype, no_grad, scan


def pygae1d_nolp_misalign(rewards: Array, values: Array, cu_seqlens: Array, bootstrap: Array, gamma: float,
                          lam: float) -> tuple[Array, Array]:
    r"""(advantages, returns) of AReaL's packed GAE: [total] rewards, [total + N] values, N + 1 offsets.

    Within sequence i (tokens ``[o_i, o_{i+1})``, values ``[o_i + i, o_{i+1} + i + 1)``)::

        delta_t = r_t + gamma V_{t+1} - V_t,   V after the last token = extra slot if bootstrap[i] else 0
        A_t     = delta_t + gamma lam A_{t+1},   returns = A + V

    Parameters
    ----------
    rewards : array, shape (total,)
        Packed rewards of every sequence.
    values : array, shape (total + N,)
        Packed values, one extra slot (the value after the last token) per sequence.
    cu_seqlens : integer array, shape (N + 1,)
        Offsets into ``rewards``, ``0 = o_0 <= o_1 <= ... <= o_N = total``; a repeated offset is an empty sequence.
    bootstrap : bool (or 0/1) array, shape (N,)
        Whether sequence i's extra slot is bootstrapped (AReaL: the sequence has no EOS).
    gamma, lam : float
        In [0, 1].

    Returns
    -------
    advantages, returns : arrays, shape (total,)
        Of the inputs' library, device and floating dtype.

    Raises
    ------
    ShapeError
        (a ValueError and an AssertionError) if the arrays are not 1-D or ``values`` or ``bootstrap`` does not hold
        one entry per sequence beyond the tokens.
    ValueError
        for offsets that decrease, do not start at 0 or do not end at ``total``, and gamma or lam outside [0, 1].

    Examples
    --------
    >>> import numpy as np
    >>> from gae_xp.adapters.areal import pygae1d_nolp_misalign
    >>> rewards = np.array([1.0, 0.0, 1.0])                   # sequences [1, 0] and [1]
    >>> values = np.array([0.5, 0.5, 2.0, 0.0, 3.0])          # [0.5, 0.5 | 2.0] and [0.0 | 3.0]
    >>> advantages, returns = pygae1d_nolp_misalign(rewards, values, np.array([0, 2, 3]),
    ...                                             np.array([True, False]), 1.0, 1.0)
    >>> advantages.tolist(), returns.tolist()
    ([2.5, 1.5, 1.0], [3.0, 2.0, 1.0])
    """
    xp = array_namespace(rewards, values, cu_seqlens, bootstrap)
    if rewards.ndim != 1 or values.ndim != 1 or cu_seqlens.ndim != 1:
        raise ShapeError(f"rewards, values and cu_seqlens must be 1-D (packed), got shapes {tuple(rewards.shape)}, "
                         f"{tuple(values.shape)} and {tuple(cu_seqlens.shape)}")
    count = cu_seqlens.shape[0] - 1
    if values.shape[0] != rewards.shape[0] + count:
        raise ShapeError(f"values must have one extra slot per sequence: {rewards.shape[0]} + {count} entries, "
                         f"got {values.shape[0]}")
    if tuple(bootstrap.shape) != (count,):
        raise ShapeError(f"bootstrap must hold one flag per sequence, shape ({count},), got {tuple(bootstrap.shape)}")
    with no_grad(values):
        total = rewards.shape[0]
        steps = xp.arange(total, dtype=cu_seqlens.dtype, device=device_of(cu_seqlens))
        # Token t of sequence i has its value at t + i; sequence i's extra slot is at o_{i+1} + i.
        sequence = xp.searchsorted(cu_seqlens[1:], steps, side="right")
        aligned = xp.take(values, steps + xp.astype(sequence, steps.dtype), axis=0)
        ends = cu_seqlens[1:] + xp.arange(count, dtype=cu_seqlens.dtype, device=device_of(cu_seqlens))
        extra = xp.take(values, ends, axis=0)
        if xp.isdtype(bootstrap.dtype, "bool"):
            after = xp.where(bootstrap, extra, xp.zeros_like(extra))
        else:  # AReaL's Python loop multiplies by the flag: keep the product where the flag is not 0
            after = xp.where(bootstrap != 0, extra * xp.astype(bootstrap, extra.dtype), xp.zeros_like(extra))
        if count == 0:  # no sequence, no token: empty outputs (gae's cu_seqlens holds at least one sequence)
            return gae_xp.gae(rewards, aligned, gamma=gamma, lam=lam)
        return gae_xp.gae(rewards, aligned, gamma=gamma, lam=lam, bootstrap_value=after, cu_seqlens=cu_seqlens)


def cugae1d_nolp_misalign_func(rewards: Array, values: Array, cu_seqlens: Array, truncate: Array, gamma: float,
                               lam: float) -> tuple[Array, Array]:
    r"""AReaL's CUDA kernel's entry point: ``pygae1d_nolp_misalign`` with ``truncate`` as the bootstrap flags.

    The same recurrence, on any array library and device (the kernel selects with the flag, as this does).

    Parameters
    ----------
    rewards : array, shape (total,)
        Packed rewards of every sequence.
    values : array, shape (total + N,)
        Packed values, one extra slot (the value after the last token) per sequence.
    cu_seqlens : integer array, shape (N + 1,)
        Offsets into ``rewards``; a repeated offset is an empty sequence.
    truncate : bool array, shape (N,)
        AReaL's truncation flags: True bootstraps sequence i from its extra slot, False takes 0 after its end.
    gamma, lam : float
        In [0, 1].

    Returns
    -------
    advantages, returns : arrays, shape (total,)
        Of the inputs' library, device and floating dtype.

    Raises
    ------
    ShapeError
        (a ValueError and an AssertionError) as ``pygae1d_nolp_misalign``.
    ValueError
        For bad offsets, and gamma or lam outside [0, 1].

    Examples
    --------
    >>> import numpy as np
    >>> from gae_xp.adapters.areal import cugae1d_nolp_misalign_func
    >>> advantages, _ = cugae1d_nolp_misalign_func(np.array([1.0]), np.array([0.0, 4.0]), np.array([0, 1]),
    ...                                            np.array([True]), 0.5, 1.0)
    >>> advantages.tolist()
    [3.0]
    """
    return pygae1d_nolp_misalign(rewards, values, cu_seqlens, truncate, gamma, lam)


def compute_token_level_gae(rewards: Array, values: Array, loss_mask: Array, seq_no_eos_mask: Array, discount: float,
                            gae_lambda: Coefficient) -> tuple[Array, Array]:
    r"""(advantages, returns) of AReaL's padded GAE block, for [bs, max_seqlen] arrays.

    For t = T-2 .. 0, with ``next = values[:, -1]`` for rows without EOS (else 0) before step T-2::

        delta_t = r_t + discount next - V_t
        A_t     = m_t (delta_t + discount lam A_{t+1}) + (1 - m_t) A_{t+1},   A_{T-1} = 0
        next    = m_t V_t + (1 - m_t) next,                                     returns = A + V

    Parameters
    ----------
    rewards, values : arrays, shape (bs, max_seqlen)
        max_seqlen at least 1; the last column is no step.
    loss_mask : bool or numeric array, shape (bs, max_seqlen)
        AReaL's rolled loss mask (1 = a token that contributes to the loss); numeric values blend as AReaL does.
    seq_no_eos_mask : bool array, shape (bs,)
        True for a row without EOS: its last value is the bootstrap.
    discount : float
        In [0, 1].
    gae_lambda : float or array of shape (bs,)
        In [0, 1]; one value per row for AReaL's custom lambda functions.

    Returns
    -------
    advantages, returns : arrays, shape (bs, max_seqlen)
        Of the inputs' library and device, in their floating dtype but at least float32.

    Raises
    ------
    ShapeError
        (a ValueError and an AssertionError) for mismatched shapes, max_seqlen 0 or a lambda per row of the wrong
        length.
    ValueError
        for discount or gae_lambda outside [0, 1], with a bool ``loss_mask`` (a numeric one takes them unchecked).

    Examples
    --------
    >>> import numpy as np
    >>> from gae_xp.adapters.areal import compute_token_level_gae
    >>> rewards, values = np.array([[1.0, 1.0, 0.0]]), np.array([[0.0, 0.0, 5.0]])
    >>> mask = np.array([[1.0, 1.0, 0.0]])
    >>> compute_token_level_gae(rewards, values, mask, np.array([True]), 1.0, 1.0)[0].tolist()
    [[7.0, 6.0, 0.0]]
    >>> compute_token_level_gae(rewards, values, mask, np.array([False]), 1.0, 1.0)[0].tolist()
    [[2.0, 1.0, 0.0]]
    """
    xp = array_namespace(rewards, values, loss_mask, seq_no_eos_mask)
    if rewards.ndim != 2 or tuple(values.shape) != tuple(rewards.shape) or tuple(loss_mask.shape) != tuple(
            rewards.shape):
        raise ShapeError(f"rewards, values and loss_mask must be [bs, max_seqlen] of one shape, got "
                         f"{tuple(rewards.shape)}, {tuple(values.shape)} and {tuple(loss_mask.shape)}")
    if tuple(seq_no_eos_mask.shape) != (rewards.shape[0],):
        raise ShapeError(f"seq_no_eos_mask must hold one flag per row, shape ({rewards.shape[0]},), got "
                         f"{tuple(seq_no_eos_mask.shape)}")
    if rewards.shape[1] == 0:
        raise ShapeError("max_seqlen must be at least 1 (AReaL reads values[:, -1])")
    with no_grad(values):
        dtype = xp.result_type(float_dtype(xp, rewards, values), xp.float32)
        r, v = xp.astype(rewards, dtype), xp.astype(values, dtype)
        lam = _per_row(xp, gae_lambda, dtype, v)
        no_eos = seq_no_eos_mask if xp.isdtype(seq_no_eos_mask.dtype, "bool") else seq_no_eos_mask != 0
        bootstrap = xp.where(no_eos, v[:, -1], xp.zeros_like(v[:, -1]))
        steps_r, steps_v, m = r[:, :-1], v[:, :-1], loss_mask[:, :-1]
        if xp.isdtype(loss_mask.dtype, "bool"):
            advantages, _ = gae_xp.gae(steps_r, steps_v, gamma=discount, lam=lam, bootstrap_value=bootstrap,
                                       mask=m, fill_masked=True)
        else:
            advantages = _blended(xp, steps_r, steps_v, xp.astype(m, dtype), bootstrap, discount, lam)
        advantages = xp.concat([advantages, xp.zeros_like(v[:, -1:])], axis=1)
        return advantages, advantages + v


def _per_row(xp: Any, gae_lambda: Coefficient, dtype: Any, like: Array) -> Coefficient:
    """AReaL's lambda: a number, or one value per row ([bs]) as a column that broadcasts over time."""
    if not is_array(gae_lambda) or gae_lambda.ndim == 0:
        return gae_lambda
    if tuple(gae_lambda.shape) != (like.shape[0],):
        raise ShapeError(f"gae_lambda must be a number or one value per row, shape ({like.shape[0]},), got "
                         f"{tuple(gae_lambda.shape)}")
    return xp.astype(gae_lambda, dtype)[:, None]


def _blended(xp: Any, r: Array, v: Array, m: Array, bootstrap: Array, gamma: float, lam: Coefficient) -> Array:
    """The loop's two recurrences for a numeric mask, every step blended by its mask value; bootstrap after the end."""
    if r.shape[1] == 0:
        return xp.zeros_like(r)
    real = m != 0
    zero = xp.zeros((), dtype=v.dtype, device=device_of(v))
    # next_{t-1} = m_t V_t + (1 - m_t) next_t, next_{T-2} = bootstrap: the value seen from the step before.
    latest = scan(xp.where(real, m * v, zero), 1 - m, initial=bootstrap)
    next_values = xp.concat([latest[:, 1:], bootstrap[:, None]], axis=1)
    delta = r + gamma * next_values - v
    return scan(xp.where(real, m * delta, zero), 1 - m + m * (gamma * lam))
