r"""Per-sample lambda: a GAE lambda for every trajectory from its length, as an array ``gae()`` takes.

Two rules, each a function of a trajectory's length ``l`` (its real steps:
tokens, or turns with ``gae_xp.turn_counts``):

* VAPO's length-adaptive lambda (Yue et al. 2025, "VAPO: Efficient and
  Reliable Reinforcement Learning for Advanced Reasoning Tasks",
  arXiv:2504.05118, Length-Adaptive GAE): ``lambda = 1 - 1 / (alpha l)``, so
  that the sum of the TD errors' weights, ``1 / (1 - lambda)``, is ``alpha l``
  (the paper takes alpha = 0.05);
* AReaL's relative-position lambda (``areal/trainer/ppo/lambda_fn.py``,
  ``relative_position_gae_lambda``): ``lambda = q ** (1 / (l - 1))``, so that a
  terminal reward reaches the first step with the weight q (gamma = 1) and
  every step at the same relative position gets the same weight, whatever l.

The lengths come from ``lengths`` itself, from a ``mask`` (its True steps
along ``axis``), or, for packed sequences, from ``cu_seqlens`` (with a mask:
the True steps of each sequence). The result broadcasts to the inputs: one
value per row (the time axis kept with size 1), or with ``cu_seqlens`` one
per sequence (a trailing axis), spread to every step when ``per_token`` is
True.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from . import _prepare as prepare_
from ._compat import device_of, isdtype, values_are_readable

Array = Any

__all__ = ["length_adaptive_lambda", "relative_position_lambda"]


def length_adaptive_lambda(alpha: float, *, lengths: Array | None = None, mask: Array | None = None,
                           cu_seqlens: Array | None = None, per_token: bool = False, axis: int = -1,
                           dtype: Any = None) -> Array:
    r"""VAPO's length-adaptive GAE lambda for every trajectory: ``lambda = max(0, 1 - 1 / (alpha l))``.

    A trajectory of ``l`` steps gets ``1 - 1 / (alpha l)``; where that is
    below 0 (``l < 1 / alpha``), and for an empty trajectory (``l = 0``), it
    gets 0, so that its advantages are its TD errors (AReaL's
    ``vapo_length_adaptive_gae`` clamps the same way).

    Parameters
    ----------
    alpha : float
        Above 0 (VAPO takes 0.05): the weights of a trajectory's TD errors
        sum to ``alpha l``.
    lengths : array, optional
        Trajectory lengths (integers or floats, at least 0); lambda has
        their shape.
    mask : bool array, optional
        True for a real step; a row's length is its count of True steps
        along ``axis`` (or each sequence's with ``cu_seqlens``).
    cu_seqlens : integer array, optional
        Packed sequences along the time axis, as in ``gae()``: one lambda per
        sequence; lengths are ``cu_seqlens[i + 1] - cu_seqlens[i]`` unless
        ``mask`` or ``lengths`` gives them (``lengths``: the batch shape plus
        a trailing axis of one per sequence, e.g. from ``turn_counts``).
    per_token : bool
        With ``cu_seqlens``: spread each sequence's lambda over its steps
        (time on the last axis, or on ``axis`` of ``mask``), which ``gae()``
        takes as ``lam`` for packed rows.
    axis : int
        The time axis of ``mask``.
    dtype : floating dtype, optional
        Of the result; default the namespace's default floating dtype
        (float32 on PyTorch: pass float64 for float64 rewards).

    Returns
    -------
    array
        Floating lambdas in [0, 1], in the library and on the device of the
        arrays given: the shape of ``lengths``; from a mask alone, its shape
        with ``axis`` of size 1; with ``cu_seqlens``, the batch shape plus a
        trailing axis of one per sequence (``per_token``: the mask's shape,
        or ``(T,)`` without a mask).

    Raises
    ------
    TypeError
        alpha not a real number; lengths not numeric; mask not bool.
    ValueError
        alpha not above 0 or not finite; a length below 0 or NaN; none or
        two of ``lengths`` and ``mask`` given without ``cu_seqlens``;
        ``per_token`` without ``cu_seqlens``; shapes that do not match.

    Examples
    --------
    >>> import numpy as np
    >>> from gae_xp import length_adaptive_lambda
    >>> length_adaptive_lambda(0.05, lengths=np.array([10, 20, 100, 1000]))
    array([0.  , 0.  , 0.8 , 0.98])
    >>> mask = np.array([[True, True, True, True, False], [True, True, False, False, False]])
    >>> length_adaptive_lambda(1.0, mask=mask)
    array([[0.75],
           [0.5 ]])
    """
    alpha = prepare_.check_number("alpha", alpha, low=0.0, strict=True, finite=True)
    return _per_sample(lambda xp, lengths: _vapo(xp, lengths, alpha), lengths, mask, cu_seqlens, per_token, axis, dtype)


def relative_position_lambda(q: float, *, lengths: Array | None = None, mask: Array | None = None,
                             cu_seqlens: Array | None = None, per_token: bool = False, axis: int = -1,
                             dtype: Any = None) -> Array:
    r"""AReaL's relative-position GAE lambda for every trajectory: ``lambda = q ** (1 / (l - 1))`` for ``l >= 2``.

    With gamma = 1, a reward at the last of ``l`` steps reaches step ``k``
    (1-based) with the weight ``lambda ** (l - k) = q ** ((l - k) / (l - 1))``:
    the first step keeps exactly ``q``, the last one 1, and steps at the same
    relative position ``(k - 1) / (l - 1)`` the same weight whatever ``l``. A
    trajectory of one step gets 1 (nothing to decay over) and an empty one 0,
    as in AReaL's ``relative_position_gae_lambda``.

    Parameters
    ----------
    q : float
        The weight kept at the first step, in (0, 1].
    lengths, mask, cu_seqlens, per_token, axis, dtype
        Where the lengths come from, the shape and dtype of the result, as
        in ``length_adaptive_lambda``.

    Returns
    -------
    array
        Floating lambdas in (0, 1] (0 for an empty trajectory), shaped as in
        ``length_adaptive_lambda``.

    Raises
    ------
    TypeError, ValueError
        As in ``length_adaptive_lambda``; q outside (0, 1] or not finite.

    Examples
    --------
    >>> import numpy as np
    >>> from gae_xp import relative_position_lambda
    >>> relative_position_lambda(0.25, lengths=np.array([0, 1, 2, 3]))
    array([0.  , 1.  , 0.25, 0.5 ])
    """
    q = prepare_.check_number("q", q, low=0.0, strict=True, high=1.0)
    return _per_sample(lambda xp, lengths: _relative(xp, lengths, q), lengths, mask, cu_seqlens, per_token, axis, dtype)


# --- the two rules, on float lengths ---------------------------------------------------------------------------


def _vapo(xp, lengths, alpha: float):
    safe = xp.where(lengths > 0, lengths, xp.ones_like(lengths))  # no division by 0 (an empty trajectory gets 0)
    lam = xp.clip(1.0 - 1.0 / (alpha * safe), min=0.0, max=1.0)
    return xp.where(lengths > 0, lam, xp.zeros_like(lam))


def _relative(xp, lengths, q: float):
    steps = xp.where(lengths > 1, lengths - 1, xp.ones_like(lengths))
    lam = xp.exp(math.log(q) / steps)
    one, zero = xp.ones_like(lam), xp.zeros_like(lam)
    return xp.where(lengths > 1, lam, xp.where(lengths > 0, one, zero))


# --- lengths in, lambdas out -----------------------------------------------------------------------------------


def _per_sample(rule, lengths, mask, cu_seqlens, per_token, axis, dtype):
    prepare_.check_bool("per_token", per_token)
    present = {name: value for name, value in {"lengths": lengths, "mask": mask}.items() if value is not None}
    if not (present or cu_seqlens is not None) or len(present) == 2:
        raise ValueError("give the trajectories' lengths as lengths=, or count them from mask= or cu_seqlens= (or "
                         "both: the True steps of each sequence); not lengths= and mask= together")
    if per_token and cu_seqlens is None:
        raise ValueError("per_token needs cu_seqlens: one lambda per row already broadcasts to every step of it")
    if not present:  # the offsets alone: host offsets are NumPy's
        present["cu_seqlens"] = np.asarray(cu_seqlens) if isinstance(cu_seqlens, (list, tuple)) else cu_seqlens
        cu_seqlens = present["cu_seqlens"]
    elif cu_seqlens is not None and not prepare_.is_host_offsets(cu_seqlens, next(iter(present.values()))):
        present["cu_seqlens"] = cu_seqlens  # an array of the others' library: checked with them
    xp = prepare_.namespace_of(present)
    anchor = next(iter(present))
    prepare_.check_same_device(present, anchor)
    like = present[anchor]
    dtype = _float_dtype(xp, like, dtype)
    if mask is not None:
        axis = prepare_.check_axis(axis, mask.ndim, "mask")
        mask = prepare_.flag(xp, "mask", mask, tuple(mask.shape), axis)  # time last now
    offsets = None if cu_seqlens is None else _offsets(xp, cu_seqlens, None if mask is None else mask.shape[-1],
                                                       like)
    if lengths is not None:
        lengths = _checked_lengths(xp, lengths, dtype, offsets)
    elif offsets is None:
        lengths = xp.sum(xp.astype(mask, dtype), axis=-1, keepdims=True)
    elif mask is None:
        lengths = xp.astype(offsets[1:] - offsets[:-1], dtype)
    else:
        lengths = _counts_per_sequence(xp, mask, offsets, dtype)
    lam = rule(xp, lengths)
    if per_token:
        lam = xp.repeat(lam, offsets[1:] - offsets[:-1], axis=lam.ndim - 1)
    if mask is not None and (offsets is None or per_token) and axis != lam.ndim - 1:
        lam = xp.moveaxis(lam, -1, axis)
    return lam


def _float_dtype(xp, like, dtype):
    """dtype if given (a real floating dtype), else the namespace's default floating dtype on like's device."""
    if dtype is None:
        return xp.__array_namespace_info__().default_dtypes(device=device_of(like))["real floating"]
    try:
        floating = isdtype(xp, dtype, "real floating")
    except (TypeError, ValueError):
        floating = False
    if not floating:
        raise TypeError(f"dtype must be a real floating dtype of the arrays' library, got {dtype!r}")
    return dtype


def _offsets(xp, cu_seqlens, length, like):
    """cu_seqlens checked as in gae(): against the mask's time length, or, without a mask, its own last offset."""
    if length is None:
        try:
            length = int(np.asarray(cu_seqlens)[-1] if prepare_.is_host_offsets(cu_seqlens, like) else cu_seqlens[-1])
        except (IndexError, TypeError, ValueError):  # not 1-D integers: the check below says what is wrong
            length = 0
    offsets, _ = prepare_.check_offsets(xp, cu_seqlens, length, like)
    return offsets


def _checked_lengths(xp, lengths, dtype, offsets):
    prepare_.require_array("lengths", lengths)
    if not isdtype(xp, lengths.dtype, ("integral", "real floating")):
        raise TypeError(f"lengths must be integers or real numbers (counts of steps), got dtype {lengths.dtype}")
    lengths = xp.astype(lengths, dtype)
    if values_are_readable(lengths) and not bool(xp.all(lengths >= 0)):
        raise ValueError("lengths must be at least 0 (NaN is not a length)")
    if offsets is not None and (lengths.ndim == 0 or lengths.shape[-1] != offsets.shape[0] - 1):
        raise ValueError(f"with cu_seqlens, lengths holds one length per sequence on its last axis "
                         f"({offsets.shape[0] - 1}), got shape {tuple(lengths.shape)}")
    return lengths


def _counts_per_sequence(xp, mask, offsets, dtype):
    """The True steps of every sequence of every row: differences of a running count at the offsets."""
    counts = xp.cumulative_sum(xp.astype(mask, xp.int64), axis=-1, include_initial=True)
    at = xp.take(counts, offsets, axis=-1)
    return xp.astype(at[..., 1:] - at[..., :-1], dtype)
