r"""Group-relative advantages (GRPO, Dr.GRPO, RLOO, DAPO's filter): one advantage per response, from its group's
scores, and its broadcast to the response's tokens.

A group is the responses to one prompt: equal ``group_ids`` (any integers,
any order), or consecutive runs of k with ``group_ids=k``. Each group's
count, mean and M2 come from ``gae_xp._segments`` (a reshape for
consecutive groups, a dense index and segmented sums for ids) in float64
accumulators, with the corrected two-pass sum, so a group of equal scores
gets exactly 0 and near-constant scores keep their float64 digits.
"""

from __future__ import annotations

import math
import numbers
from typing import Any

import numpy as np

from . import _prepare as prepare_
from . import _segments
from ._compat import device_of, is_array, is_dask_array

Array = Any

__all__ = ["group_advantages", "zero_variance_groups", "to_tokens", "BASELINES", "SCALES"]

BASELINES = ("mean", "leave_one_out", None)
SCALES = ("group", "batch", None)


def group_advantages(scores: Array, group_ids: Array | int, *, baseline: str | None = "mean",
                     scale: str | None = "group", eps: float = 1e-6, unbiased: bool = True) -> Array:
    r"""Group-relative advantages: each score against its group's (GRPO, Dr.GRPO, RLOO).

    With, for the group g of score s (its members that are not NaN),
    ``n_g``, ``mean_g`` and ``M2_g = sum (s - mean_g)^2``, and
    ``std = sqrt(M2 / (n - 1 if unbiased else n))``::

        centred = s - mean_g                          baseline="mean" (GRPO)
                = (s - mean_g) * n_g / (n_g - 1)      baseline="leave_one_out" (RLOO: s minus the others' mean)
                = s                                   baseline=None
        A       = centred / (std_g + eps)             scale="group"
                = centred / (std_batch + eps)         scale="batch" (std of all N scores that are not NaN)
                = centred                             scale=None (Dr.GRPO)

    Conventions (each framework's own are in ``gae_xp.adapters``):

    * a group whose scores are all equal (M2 = 0, every group of one
      included) gets exactly 0 under ``scale="group"``, whatever the
      baseline and eps (0 rather than s / eps: nothing to learn from it), and
      so does every score under ``scale="batch"`` when all N are equal; its
      centred scores are exactly 0 under the mean baseline on every scale,
      in float32 as in float64;
    * a group of one: ``leave_one_out`` gives 0 (there are no others);
      ``mean`` gives 0 (s - s);
    * a NaN score is left out of its group's statistics (and of the batch's),
      and gets advantage 0; it never affects another group, in the forward
      values or in the gradients (torch, JAX). A group of NaN scores only
      gets 0s. An infinite score makes its group's mean and M2 NaN
      (``inf - inf``), so its group's advantages NaN (its NaN scores keep
      their 0) under every baseline and scale but ``baseline=None,
      scale=None`` (A = s), and, with ``scale="batch"``, every one's. Such a
      group is not a zero-variance group (``zero_variance_groups``);
    * eps is added to the standard deviation (verl, TRL and OpenRLHF's
      placement), not to the variance; ``unbiased=True`` divides M2 by
      n - 1 (a group of one then has std 0, as above).

    Parameters
    ----------
    scores : array (N,)
        One score (outcome reward) per response: any array-API library's
        real array (NumPy, PyTorch, CuPy, JAX, Dask, ...).
    group_ids : integer array (N,) or int
        The group of each score: equal ids form a group, in any order, any
        integer values (negative, huge); or a Python int k: consecutive
        groups of k (N % k == 0), the (prompts x k samples) layout.
    baseline : {"mean", "leave_one_out", None}
    scale : {"group", "batch", None}
    eps : float, default 1e-6
        At least 0; added to the standard deviation.
    unbiased : bool, default True
        n - 1 in the standard deviations (group and batch), else n.

    Returns
    -------
    array (N,)
        In the scores' namespace, device and floating dtype (float16 and
        bfloat16 computed in float32; the statistics in float64 wherever the
        device has it); never sharing memory with an input. No host sync:
        the number of groups is not read (ids are ranked into at most N
        segments).

    Raises
    ------
    TypeError
        scores not an array or not real, group_ids neither an integer array
        nor an int (a float array, a bool), eps or unbiased of a wrong type.
    ValueError
        scores not 1-D, group_ids of another length, k < 1 or not dividing N,
        eps < 0, an unknown baseline or scale; Dask arrays of unknown (NaN)
        chunk sizes (``.compute_chunk_sizes()`` first).

    Examples
    --------
    >>> import numpy as np
    >>> from gae_xp import group_advantages
    >>> scores = np.array([1.0, 0.0, 0.0, 1.0, 0.1, 0.1])
    >>> group_advantages(scores, 2, eps=0.0).round(4)   # three groups of two; the last one's scores are equal
    array([ 0.7071, -0.7071, -0.7071,  0.7071,  0.    ,  0.    ])
    >>> group_advantages(scores, np.array([7, 7, -3, 7, -3, -3]), scale=None).round(4)   # any ids, any order
    array([ 0.3333, -0.6667, -0.0667,  0.3333,  0.0333,  0.0333])
    >>> group_advantages(scores, 3, baseline="leave_one_out", scale=None)    # s minus the others' mean
    array([ 1.  , -0.5 , -0.5 ,  0.9 , -0.45, -0.45])
    """
    call = _Call.prepare(scores, group_ids)
    _check_options(baseline, scale, eps, unbiased)
    xp = call.xp
    if scores.shape[0] == 0:
        return xp.zeros(0, dtype=call.out_dtype, device=device_of(scores))
    def generic():
        return advantages_of(call, call.moments(), baseline=baseline, scale=scale, eps=eps, unbiased=unbiased)

    if call.k is not None and _segments._cuda_kernels_serve(xp, scores):
        from . import backends

        return backends.attempt("numba-cuda", lambda: _cuda_consecutive(call, baseline=baseline, scale=scale,
                                                                         eps=eps, unbiased=unbiased), generic)
    return generic()


def advantages_of(call: "_Call", moments, *, baseline, scale, eps: float, unbiased: bool, batch=None) -> Array:
    """The advantages of ``call``'s scores from every group's (count, mean, M2) (G,) and, for ``scale="batch"``,
    the batch's (n, M2) (default: merged from the groups'). ``gae_xp.distributed`` passes the ranks' merged ones."""
    xp = call.xp
    count, mean, m2 = moments
    x = xp.astype(call.scores, call.dtype)
    valid = ~xp.isnan(x)
    zero = xp.zeros_like(x)
    # A NaN score enters no arithmetic as NaN: the final where gives it 0, but its gradient would still reach the
    # divisor (d(c / s)/ds = -c / s^2 is NaN for c NaN) and so its group-mates' (or, under scale="batch", everyone's).
    x = xp.where(valid, x, zero)
    n = call.per_sample(count)
    if baseline is None:
        centred = x
    else:
        centred = x - call.per_sample(mean)
        if baseline == "leave_one_out":
            factor = xp.where(n > 1, n / xp.where(n > 1, n - 1, xp.ones_like(n)), zero)
            centred = centred * factor
    if scale == "group":
        spread = call.per_sample(m2)
        std = _std(xp, spread, n, unbiased)
    elif scale == "batch":
        total, spread = batch if batch is not None else _merge(xp, count, mean, m2)[::2]
        std = _std(xp, spread, total, unbiased)
    else:
        return xp.astype(xp.where(valid, centred, zero), call.out_dtype, copy=False)
    flat = spread == 0  # not a NaN spread: an infinite score makes its advantages NaN
    out = xp.where(valid & ~flat, centred / xp.where(flat, xp.ones_like(std), std + eps), zero)
    return xp.astype(out, call.out_dtype, copy=False)


def _cuda_consecutive(call: "_Call", **options) -> Array:
    """Consecutive groups of k on CUDA arrays: the fused launches of ``backends/_cuda_consecutive.py`` (one, two for
    ``scale="batch"``); other dtypes are widened first (float16 and bfloat16 to float32) and the answer cast back."""
    from .backends import _cuda_consecutive

    xp, scores = call.xp, call.scores
    if scores.dtype not in (xp.float32, xp.float64):
        wide = call.out_dtype if call.out_dtype in (xp.float32, xp.float64) else xp.float32
        scores = xp.astype(scores, wide)
    out = _cuda_consecutive.advantages(xp, scores, call.k, device=device_of(scores), **options)
    return xp.astype(out, call.out_dtype, copy=False)


def zero_variance_groups(scores: Array, group_ids: Array | int) -> Array:
    """Per sample: True where the sample's group has zero variance (DAPO's dynamic sampling drops these).

    A group has zero variance when its scores that are not NaN are all equal
    (M2 = 0, in float64: exactly equal scores, not "close"), which includes a
    group of one and a group of NaN scores only; a group with an infinite
    score has M2 = NaN, not 0, so it is not flagged (``[inf, 1.0]``,
    ``[-inf, inf]``, ``[inf, inf]``). The answer is per sample
    (N,), the mask DAPO's filter applies (``keep = ~zero_variance_groups(...)``);
    a NaN score gets its group's answer. Computed on the device, no host sync.

    Parameters
    ----------
    scores, group_ids
        As in ``group_advantages``.

    Returns
    -------
    bool array (N,)
        In the scores' namespace and device.

    Examples
    --------
    >>> import numpy as np
    >>> from gae_xp import zero_variance_groups
    >>> zero_variance_groups(np.array([1.0, 1.0, 0.0, 1.0, 0.3]), np.array([4, 4, 5, 5, 6]))
    array([ True,  True, False, False,  True])
    """
    call = _Call.prepare(scores, group_ids)
    if scores.shape[0] == 0:
        return call.xp.zeros(0, dtype=call.xp.bool, device=device_of(scores))
    _, _, m2 = call.moments()
    return call.per_sample(m2) == 0


def to_tokens(advantages: Array, *, response_mask: Array | None = None, cu_seqlens: Array | None = None,
              like: Array | None = None) -> Array:
    """Each token gets its response's advantage: padded (B, T) with a response mask, or packed with ``cu_seqlens``.

    * padded: ``advantages`` (B,) and ``response_mask`` (B, T) (bool, or
      numeric: nonzero is a response token) give ``out[b, t] =
      advantages[b]`` where the mask is set, else 0; without a mask, ``like``
      (an array of the token layout (B, T)) gives the shape, and every token
      gets its row's advantage;
    * packed: ``advantages`` (n,) and ``cu_seqlens`` (n + 1,), offsets
      ``0 = o_0 <= ... <= o_n``, give ``out[t] = advantages[i]`` for
      ``o_i <= t < o_{i+1}`` (T_total = o_n; n = 0, ``cu_seqlens=[0]``,
      gives an empty output). Host offsets (a list, a NumPy array, with
      advantages of any library, NumPy's included) are checked; device offsets need ``like`` (the packed token
      array, (T_total,)) for the length, are checked where their values can
      be read, and are never trusted: a token outside every sequence gets 0,
      and the gather index is clamped into [0, n), so offsets that cannot be
      checked (under ``torch.compile`` or ``jax.jit``) never read outside
      ``advantages``. No host sync, no Python loop.

    Parameters
    ----------
    advantages : array (B,) or (n,)
    response_mask : array (B, T), optional
    cu_seqlens : integer array (n + 1,), optional
    like : array, optional
        The token array whose shape the output takes (its values are not read).

    Returns
    -------
    array
        In the advantages' namespace, device and dtype; never sharing memory
        with an input.

    Examples
    --------
    >>> import numpy as np
    >>> from gae_xp import to_tokens
    >>> to_tokens(np.array([1.0, -2.0]), response_mask=np.array([[1, 1, 0], [1, 0, 0]]))
    array([[ 1.,  1.,  0.],
           [-2.,  0.,  0.]])
    >>> to_tokens(np.array([1.0, -2.0]), cu_seqlens=[0, 3, 5])
    array([ 1.,  1.,  1., -2., -2.])
    """
    prepare_.require_array("advantages", advantages)
    if (response_mask is None) == (cu_seqlens is None) and like is None:
        raise ValueError("to_tokens takes response_mask (padded) or cu_seqlens (packed), or like (padded, every "
                         "token) alone")
    if response_mask is not None and cu_seqlens is not None:
        raise ValueError("to_tokens takes response_mask (padded) or cu_seqlens (packed), not both")
    if advantages.ndim != 1:
        raise ValueError(f"advantages must be 1-D (one per response), got shape {tuple(advantages.shape)}")
    if cu_seqlens is not None:
        return _packed(advantages, cu_seqlens, like)
    present = {"advantages": advantages, "response_mask": response_mask, "like": like}
    present = {name: value for name, value in present.items() if is_array(value)}
    xp = prepare_.namespace_of(present)
    prepare_.check_same_device(present, "advantages")
    shape = tuple((response_mask if response_mask is not None else like).shape)
    if len(shape) != 2 or shape[0] != advantages.shape[0]:
        name = "response_mask" if response_mask is not None else "like"
        raise ValueError(f"{name} must have shape (B, T) with B = len(advantages) = {advantages.shape[0]}, got "
                         f"{shape}")
    if response_mask is None:
        return xp.asarray(xp.broadcast_to(advantages[:, None], shape), copy=True)
    real = response_mask if response_mask.dtype == xp.bool else response_mask != 0
    zero = xp.zeros((), dtype=advantages.dtype, device=device_of(advantages))  # broadcast, never materialised
    return xp.where(real, advantages[:, None], zero)


def _packed(advantages, cu_seqlens, like):
    host = isinstance(cu_seqlens, (list, tuple, np.ndarray))  # a NumPy array's values are on the host, whatever
    # the advantages' library: its length is read from it
    present = {"advantages": advantages, "like": like}
    if not host:
        present["cu_seqlens"] = cu_seqlens
    present = {name: value for name, value in present.items() if is_array(value)}
    xp = prepare_.namespace_of(present)
    prepare_.check_same_device(present, "advantages")
    if host:
        length = int(np.asarray(cu_seqlens)[-1]) if len(cu_seqlens) else 0
    elif like is None:
        raise ValueError("to_tokens with cu_seqlens on the device needs like= (the packed token array) for the "
                         "total length: reading cu_seqlens[-1] would synchronise the device")
    else:
        length = like.shape[0]
    if like is not None and (like.ndim != 1 or like.shape[0] != length):
        raise ValueError(f"like must be the packed token array (T_total,) = ({length},), got {tuple(like.shape)}")
    offsets, _ = prepare_.check_offsets(xp, cu_seqlens, length, advantages)
    if offsets.shape[0] != advantages.shape[0] + 1:
        raise ValueError(f"cu_seqlens must hold len(advantages) + 1 = {advantages.shape[0] + 1} offsets, got "
                         f"{offsets.shape[0]}")
    positions = xp.arange(length, dtype=offsets.dtype, device=device_of(advantages))
    sequence = xp.searchsorted(offsets, positions, side="right") - 1
    inside = (sequence >= 0) & (sequence < advantages.shape[0])
    last = max(advantages.shape[0] - 1, 0)
    sequence = xp.clip(sequence, 0, last)
    if advantages.shape[0] == 0:
        return xp.zeros(length, dtype=advantages.dtype, device=device_of(advantages))
    gathered = xp.take(advantages, sequence)
    return xp.where(inside, gathered, xp.zeros_like(gathered))


# --- one call ------------------------------------------------------------------------------------------------


class _Call:
    """Checked scores and groups: the namespace, dtypes, and how to reach each sample's group."""

    def __init__(self, xp, scores, k, group_ids, index, n_groups, out_dtype, dtype):
        self.xp, self.scores, self.out_dtype, self.dtype = xp, scores, out_dtype, dtype
        #: consecutive groups of k; or the ids, their dense index (N,) and its number of slots (N)
        self.k, self.group_ids, self.index, self.n_groups = k, group_ids, index, n_groups

    @classmethod
    def prepare(cls, scores, group_ids) -> "_Call":
        prepare_.require_array("scores", scores)
        arrays = {"scores": scores}
        if is_array(group_ids):
            arrays["group_ids"] = group_ids
        xp = prepare_.namespace_of(arrays)
        prepare_.check_same_device(arrays, "scores")
        if scores.ndim != 1:
            raise ValueError(f"scores must be 1-D (one score per response), got shape {tuple(scores.shape)}")
        _refuse_unknown_lengths(arrays)
        out_dtype, _ = prepare_.compute_dtypes(xp, {"scores": scores}, scores)
        dtype = _segments.accumulator_dtype(xp, scores)
        n = scores.shape[0]
        if is_array(group_ids):
            if not xp.isdtype(group_ids.dtype, "integral"):
                raise TypeError(f"group_ids must be an integer array (equal ids form a group) or an int k, got "
                                f"dtype {group_ids.dtype}")
            if tuple(group_ids.shape) != (n,):
                raise ValueError(f"group_ids must have the shape of scores, ({n},), got {tuple(group_ids.shape)}")
            return cls(xp, scores, None, group_ids, _segments.dense_index(xp, group_ids), n, out_dtype, dtype)
        if isinstance(group_ids, bool) or not isinstance(group_ids, numbers.Integral):
            raise TypeError(f"group_ids must be an integer array (equal ids form a group) or an int k, got "
                            f"{type(group_ids).__name__}")
        k = int(group_ids)
        if k < 1:
            raise ValueError(f"group_ids as an int is the group size k and must be at least 1, got {k}")
        if n is not None and n % k != 0:
            raise ValueError(f"group_ids = {k} (consecutive groups of k) must divide the number of scores, {n}")
        return cls(xp, scores, k, None, None, None, out_dtype, dtype)

    def moments(self):
        if self.k is not None:
            return _segments.consecutive_moments(self.scores, self.k, self.dtype)
        return _segments.group_moments(self.scores, self.index, self.n_groups, self.dtype)

    def per_sample(self, per_group):
        """A per-group array (G,) spread to the samples (N,)."""
        xp = self.xp
        if self.k is not None:
            spread = xp.broadcast_to(per_group[:, None], (per_group.shape[0], self.k))
            return xp.reshape(spread, (-1,))
        if is_dask_array(per_group):
            return per_group[self.index]
        return xp.take(per_group, self.index)


def _refuse_unknown_lengths(arrays: dict) -> None:
    """ValueError naming the arrays of unknown (NaN) length, as Dask arrays after boolean indexing: neither the
    groups (N % k, ids beside scores) nor their statistics can be laid out before their lengths are known."""
    unknown = [name for name, value in arrays.items()
               if any(isinstance(size, float) and math.isnan(size) for size in value.shape)]
    if unknown:
        shapes = ", ".join(f"{name} {tuple(arrays[name].shape)}" for name in unknown)
        raise ValueError(f"{' and '.join(unknown)} {'have' if len(unknown) > 1 else 'has'} unknown (NaN) chunk "
                         f"sizes ({shapes}), as after boolean indexing of a Dask array: call "
                         f".compute_chunk_sizes() on {'both' if len(unknown) > 1 else 'it'} first")


def _check_options(baseline, scale, eps, unbiased) -> None:
    if baseline not in BASELINES:
        raise ValueError(f"baseline must be one of {BASELINES}, got {baseline!r}")
    if scale not in SCALES:
        raise ValueError(f"scale must be one of {SCALES}, got {scale!r}")
    prepare_.check_number("eps", eps, low=0.0, strict=False, finite=True)
    prepare_.check_bool("unbiased", unbiased)


def _std(xp, m2, n, unbiased: bool):
    """sqrt(M2 / (n - 1 or n)); 0 where M2 is 0 or the divisor is not positive (a group of one, whose M2 is 0
    unless it is NaN), NaN where M2 is NaN (an infinite score); a safe square root for autograd."""
    divisor = n - 1 if unbiased else n
    ok = (divisor > 0) & (m2 > 0)
    var = xp.where(ok, m2 / xp.where(ok, divisor, xp.ones_like(divisor)), xp.ones_like(m2))
    return xp.where(ok, xp.sqrt(var), xp.where(xp.isnan(m2), m2, xp.zeros_like(m2)))


def _merge(xp, count, mean, m2):
    """The batch's (n, mean, M2) from every group's, by the corrected two-pass sum over the groups::

        m0 = sum n_g mean_g / n,   d_g = mean_g - m0,   mean = m0 + sum n_g d_g / n,
        M2 = sum M2_g + sum n_g d_g^2 - (sum n_g d_g)^2 / n

    (equal means give d_g all equal, so mean is exactly theirs and M2 = sum M2_g)."""
    total = xp.sum(count)
    divisor = xp.where(total > 0, total, xp.ones_like(total))
    first = xp.sum(count * mean) / divisor
    d = mean - first
    d_sum = xp.sum(count * d)
    correction = d_sum / divisor
    spread = xp.sum(count * d * d) - d_sum * correction
    return total, first + correction, xp.sum(m2) + xp.where(spread < 0, xp.zeros_like(spread), spread)
