r"""Groups as segments: a dense segment index from any ids, segmented sums per library, and each group's moments.

Used by ``gae_xp.groups`` (group-relative advantages). Two layouts:

* consecutive groups of k (``group_ids`` a Python int): a reshape to (G, k)
  and reductions along the last axis, on every library;
* arbitrary integer ids (NumPy with numba installed: one numba kernel of two
  passes, ``backends/_numba_groups.py``; CuPy and torch CUDA with numba-cuda:
  two launches, ``backends/_cuda_groups.py``): a dense index in [0, N) from a sort
  (``dense_index``: equal ids get one index, in the ids' sorted order; the
  index is at most N - 1 by construction, whatever the ids hold, so no value
  check is needed before a segmented sum reads it, traced or not), then one
  segmented sum per library (``segment_sum``): NumPy's ``bincount``, PyTorch's
  ``index_add`` (autograd, ``torch.compile``, CUDA, no host sync), JAX's
  ``jax.ops.segment_sum`` with a static ``num_segments``, CuPy's
  ``cupyx.scatter_add``, Dask's ``bincount`` (groups may span blocks), the
  array API's sort and a segmented scan for the rest (``_sorted_segment_sum``:
  no differences of a cumulative sum, so no group's sum depends on another's).

The moments (``group_moments``) are the backend hook of GROUPS.md: per
group, over its members that are not NaN, in the accumulator dtype (float64
where the device has it)::

    n     = count
    m0    = sum(x) / n                         (pass 1)
    d     = x - m0
    mean  = m0 + sum(d) / n                    (pass 2: the corrected mean)
    M2    = max(sum(d^2) - sum(d)^2 / n, 0)    (Chan, Golub and LeVeque's corrected two-pass sum)

The correction is the rounding error of pass 1, so nothing cancels. For a
group whose members are all equal (to v), every d is the same small number
delta (exact: a difference of two nearby floats), so sum(d) / n = delta,
mean = m0 + (v - m0) = v and M2 = 0 exactly, in float32 as in float64.
A group without a member that is not NaN has n = 0, and mean = M2 = 0. A
group with an infinite member has mean = M2 = NaN (``inf - inf`` in pass 2):
the clamp at 0 keeps a NaN, so no route turns it into 0.
"""

from __future__ import annotations

import importlib.util
from typing import Any

from ._compat import (
    device_of,
    is_cupy_array,
    is_dask_array,
    is_jax_array,
    is_numpy_array,
    is_torch_array,
    values_are_readable,
)

Array = Any

__all__ = ["accumulator_dtype", "dense_index", "segment_sum", "group_moments", "consecutive_moments"]


def accumulator_dtype(xp, like):
    """float64 where ``like``'s device has it (not JAX without x64, not Apple's MPS), else float32."""
    if is_jax_array(like):
        import jax

        return xp.float64 if jax.config.jax_enable_x64 else xp.float32
    if is_torch_array(like) and like.device.type == "mps":
        return xp.float32
    return xp.float64


def dense_index(xp, ids: Array) -> Array:
    """For integer ids (N,): each id's rank among the distinct ids (int64, in [0, N)); equal ids, equal index.

    A sort, a comparison of neighbours, a cumulative sum, and the sorted
    positions scattered back (Dask: its ``unique``'s inverse). The ranks
    depend on the ids' values only, so the sort need not be stable.
    """
    if is_dask_array(ids):
        import dask.array as da

        return da.unique(ids, return_inverse=True)[1].astype("int64")
    if ids.shape[0] == 0:
        return xp.zeros(0, dtype=xp.int64, device=device_of(ids))
    order = xp.argsort(ids, stable=False)  # equal ids get one rank whatever their order: stability is not needed
    ordered = xp.take(ids, order)
    starts = xp.concat([xp.ones(1, dtype=xp.bool, device=device_of(ids)), ordered[1:] != ordered[:-1]])
    ranks = xp.cumulative_sum(xp.astype(starts, xp.int64)) - 1
    return _scatter(xp, order, ranks)


def _scatter(xp, positions, values):
    """out with ``out[positions] = values`` for a permutation ``positions``."""
    if is_jax_array(values):
        return xp.zeros_like(values).at[positions].set(values)
    if is_torch_array(values):
        return xp.empty_like(values).scatter_(0, positions, values)
    if is_numpy_array(values) or is_cupy_array(values):
        out = xp.empty_like(values)
        out[positions] = values
        return out
    return xp.take(values, xp.argsort(positions))  # the array API has no scatter: the inverse permutation


def segment_sum(xp, values: Array, index: Array, n_segments: int) -> Array:
    """``out[g] = sum of values[i] over index[i] == g`` (n_segments,), in values' dtype; index in [0, n_segments)."""
    if is_numpy_array(values):
        import numpy as np

        return np.bincount(index, weights=values, minlength=n_segments).astype(values.dtype, copy=False)
    if is_torch_array(values):
        return xp.zeros(n_segments, dtype=values.dtype, device=values.device).index_add(0, index, values)
    if is_jax_array(values):
        import jax

        return jax.ops.segment_sum(values, index, num_segments=n_segments)
    if is_cupy_array(values):
        import cupyx

        out = xp.zeros(n_segments, dtype=values.dtype)
        cupyx.scatter_add(out, index, values)
        return out
    if is_dask_array(values):
        import dask.array as da

        return da.bincount(index.rechunk(values.chunks), weights=values, minlength=n_segments).astype(values.dtype)
    return _sorted_segment_sum(xp, values, index, n_segments)


def _sorted_segment_sum(xp, values, index, n_segments: int):
    """The array API's own route (no scatter-add): sort by index, then a segmented inclusive scan by doubling
    (Hillis and Steele): at step s, each sorted position adds the partial sum s places back when that position is
    in its segment::

        partial_i <- partial_i + (partial_{i-s} if index_{i-s} == index_i else 0),   s = 1, 2, 4, ... < N

    so a segment's last position holds its sum, and every addition is between members of one segment: a segment's
    sum never depends on another's values (no differences of a running sum, which lose a small group's digits
    beside large ones, nor its NaN or inf). ceil(log2 N) steps of whole-array operations."""
    n = values.shape[0]
    empty = xp.zeros(n_segments, dtype=values.dtype, device=device_of(values))
    if n == 0:
        return empty
    order = xp.argsort(index, stable=True)
    keys = xp.take(index, order)
    partial = xp.take(values, order)
    step = 1
    while step < n:
        same = keys[step:] == keys[:-step]
        behind = xp.where(same, partial[:-step], xp.zeros_like(partial[:-step]))
        partial = xp.concat([partial[:step], partial[step:] + behind])
        step *= 2
    segments = xp.arange(n_segments, dtype=keys.dtype, device=device_of(values))
    starts = xp.searchsorted(keys, segments, side="left")
    stops = xp.searchsorted(keys, segments, side="right")
    return xp.where(stops > starts, xp.take(partial, xp.clip(stops - 1, 0, n - 1)), empty)


def group_moments(scores: Array, index: Array, n_groups: int, dtype=None) -> tuple[Array, Array, Array]:
    """(count, mean, M2) of every group (n_groups,) over its members that are not NaN, in ``dtype``
    (default: the accumulator dtype); the formulas are in the module docstring."""
    from ._compat import array_namespace

    xp = array_namespace(scores, index)
    dtype = accumulator_dtype(xp, scores) if dtype is None else dtype
    from . import backends

    def generic():
        return generic_group_moments(xp, scores, index, n_groups, dtype)

    if scores.dtype in (xp.float32, xp.float64) and dtype == xp.float64:
        if is_numpy_array(scores) and numba_installed():
            return backends.attempt("numba", lambda: _numba_group_moments(scores, index, n_groups), generic)
        if _cuda_kernels_serve(xp, scores, index):
            return backends.attempt("numba-cuda", lambda: cuda_group_moments(xp, scores, index, n_groups), generic)
    return generic()


def _numba_group_moments(scores, index, n_groups: int):
    """group_moments by the numba CPU kernel of ``backends/_numba_groups.py`` (numba is imported here)."""
    from .backends._numba_groups import group_moments as kernel

    return kernel(scores, index, n_groups)


def _cuda_kernels_serve(xp, scores, *others) -> bool:
    """True for CuPy arrays and torch CUDA tensors (``scores`` and ``others``) that do not require grad, outside
    tracing, with numba-cuda and a GPU (``backends.numba_cuda``'s own test of the arrays)."""
    if not (is_cupy_array(scores) or is_torch_array(scores) and scores.device.type == "cuda"):
        return False
    if not values_are_readable(scores):  # torch.compile, torch.func: the segmented sums trace, a kernel does not
        return False
    from . import backends

    def serve() -> bool:
        return backends.load("numba-cuda").unavailable_reason(xp, [scores, *others], forced=True) is None

    return backends.attempt("numba-cuda", serve, lambda: False)


def cuda_group_moments(xp, scores, index, n_groups: int):
    """group_moments by the two numba-CUDA launches of ``backends/_cuda_groups.py`` (float64), finished here."""
    from .backends import _cuda_groups

    count, total, d_sum, d_squares = _cuda_groups.sums(xp, scores, index, n_groups, device_of(scores))
    divisor = xp.where(count > 0, count, xp.ones_like(count))
    return _finish(xp, count, divisor, total / divisor, d_sum, d_squares)


def numba_installed() -> bool:
    """True when numba can be imported (then NumPy scores take its kernel, ``backends/_numba_groups.py``)."""
    return importlib.util.find_spec("numba") is not None


def generic_group_moments(xp, scores, index, n_groups: int, dtype):
    """group_moments by the library's segmented sums (every library; NumPy's without numba)."""
    x = xp.astype(scores, dtype)
    valid = ~xp.isnan(x)
    zero = xp.zeros_like(x)
    x = xp.where(valid, x, zero)
    count = segment_sum(xp, xp.astype(valid, dtype), index, n_groups)
    divisor = xp.where(count > 0, count, xp.ones_like(count))
    first = segment_sum(xp, x, index, n_groups) / divisor
    d = xp.where(valid, x - xp.take(first, index), zero)
    d_sum = segment_sum(xp, d, index, n_groups)
    d_squares = segment_sum(xp, d * d, index, n_groups)
    return _finish(xp, count, divisor, first, d_sum, d_squares)


def consecutive_moments(scores: Array, k: int, dtype=None) -> tuple[Array, Array, Array]:
    """group_moments for consecutive groups of k (N % k == 0): a reshape to (N // k, k), reductions on axis 1."""
    from ._compat import array_namespace

    xp = array_namespace(scores)
    dtype = accumulator_dtype(xp, scores) if dtype is None else dtype
    x = xp.reshape(xp.astype(scores, dtype), (-1, k))
    valid = ~xp.isnan(x)
    zero = xp.zeros_like(x)
    x = xp.where(valid, x, zero)
    count = xp.sum(xp.astype(valid, dtype), axis=1)
    divisor = xp.where(count > 0, count, xp.ones_like(count))
    first = xp.sum(x, axis=1) / divisor
    d = xp.where(valid, x - first[:, None], zero)
    return _finish(xp, count, divisor, first, xp.sum(d, axis=1), xp.sum(d * d, axis=1))


def _finish(xp, count, divisor, first, d_sum, d_squares):
    correction = d_sum / divisor
    m2 = d_squares - d_sum * correction
    return count, first + correction, xp.where(m2 < 0, xp.zeros_like(m2), m2)  # a NaN M2 (an infinite score) stays
