"""The one chunked prefix scan, written only against the array API namespace.

It solves the first-order linear recurrence along the last axis

    reverse=True:   y_t = x_t + a_t * y_{t+1},   y_T  = 0
    reverse=False:  y_t = x_t + a_t * y_{t-1},   y_-1 = 0

(a boundary value is folded into x by the caller, see ``fold_initial``).

Time is cut into chunks of C steps, viewed as (..., n, C):

1. a local scan inside every chunk at once;
2. the carry between chunks, ``carry_c = edge_c + P_c * carry_{c-1}``, where
   ``edge_c`` is the chunk's local solution at its far edge and ``P_c`` the
   product of the coefficients over the chunk. That is the same recurrence on
   n = T/C steps, so it is solved by calling this scan again, one level up;
3. the neighbouring chunk's carry is brought into every step of the chunk.

Levels above the first use at least C = 2, so chunk_size=1 still halves the
length at every level. The number of array operations is O(log_C T): no
Python loop grows with T/C, and ``jax.jit`` traces a short program.

Two local scans:

* constant coefficient ``a_t = w`` (a Python float): one shared C x C kernel,
  ``K[k, t] = w^|t - k|`` on the causal side and 0 elsewhere. The chunks' edge
  values are one matrix-vector product with a column of K; the neighbour's
  carry is added to the step next to it (``x += w * carry``), and then one
  matmul, ``y = chunks @ K``, gives the final values. O(T C) work, O(T + C^2)
  memory, one full-size result;
* time-varying ``a_t`` (an array): a doubling (Hillis-Steele) scan of
  ceil(log2 C) steps, ``b_t += a_t b_{t+-k}; a_t *= a_{t+-k}``, built from
  slicing and ``concat`` only, then ``y = b + p * carry`` with p the products
  of a up to the chunk's edge. O(T log C) work, O(T) memory, exact at a_t = 0.

A matmul multiplies the kernel's zeros with every entry of a chunk, so a NaN or
inf would leak to the steps the recurrence never reaches. The constant path is
therefore taken only when the input is known to be finite; otherwise (or when
that cannot be checked without tracing, as under ``jax.jit``) the doubling scan
runs with the constant broadcast, and non-finite values travel only in the
recurrence's direction.

Temporaries are updated in place where the library allows (see ``_owned``);
``overwrite_x=True`` lets the scan use x itself as one.
"""

from __future__ import annotations

import functools
import math

from array_api_compat import device as device_of
from array_api_compat import is_lazy_array

from . import _owned as owned

#: Default chunk sizes of the two local scans; see ``choose_chunk_size``.
MATMUL_CHUNK = 32
DOUBLING_CHUNK = 16


def choose_chunk_size(length: int, method: str) -> int:
    """Chunk size used when ``chunk_size=None``.

    * ``"matmul"`` (constant coefficient): the work is T*C multiply-adds and
      a skinny matmul runs below BLAS peak, so C is small: 32;
    * ``"doubling"`` (time-varying coefficient): the work is log2(C) passes
      over memory per level, and the levels shrink by C: C = 16.

    C never exceeds T (a sequence shorter than C is one chunk). Measured with
    ``python -m gae_xp bench --chunk-size auto,8,16,32,64,128`` on NumPy and
    PyTorch CPU, float32 and float64 (see the README).
    """
    size = MATMUL_CHUNK if method == "matmul" else DOUBLING_CHUNK
    return max(1, min(size, length))


def fold_initial(xp, x, a, initial, *, reverse: bool):
    """Fold the boundary value y_T (reverse) or y_-1 (forward) into x (a new array).

    ``initial`` has the batch shape with a trailing axis of 1; ``a`` is a
    Python float or an array shaped like x.
    """
    if reverse:
        head, tail = x[..., :-1], x[..., -1:]
        a_edge = a if isinstance(a, float) else a[..., -1:]
        return xp.concat([head, tail + a_edge * initial], axis=-1)
    head, tail = x[..., :1], x[..., 1:]
    a_edge = a if isinstance(a, float) else a[..., :1]
    return xp.concat([head + a_edge * initial, tail], axis=-1)


def scan(xp, x, a, *, reverse: bool, chunk_size: int | None, overwrite_x: bool = False):
    """Solve the recurrence along the last axis of x (see the module docstring).

    ``a`` is a Python float (constant coefficient) or an array broadcastable
    to x. Returns a new array shaped like x, in x's dtype and on its device.
    With ``overwrite_x`` the caller gives x up, and it may be written into.
    """
    length = x.shape[-1]
    if length == 0:
        return xp.zeros_like(x)
    if isinstance(a, float) and _is_known_finite(xp, x):
        size = chunk_size or choose_chunk_size(length, "matmul")
        return _matmul_scan(xp, x, a, reverse, size, overwrite_x)
    if isinstance(a, float):
        a = xp.full(x.shape, a, dtype=x.dtype, device=device_of(x))
    else:
        a = xp.broadcast_to(a, x.shape)
    size = chunk_size or choose_chunk_size(length, "doubling")
    return _doubling_chunk_scan(xp, x, a, reverse, size)


def _is_known_finite(xp, x) -> bool:
    """True when x can be read eagerly and holds no NaN or inf.

    One reduction, no temporary: a finite sum means finite entries. A sum that
    overflows only sends finite data to the (equally correct) doubling scan.
    """
    return not is_lazy_array(x) and math.isfinite(float(xp.sum(x)))


def _matmul_scan(xp, x, w: float, reverse: bool, size: int, overwrite_x: bool):
    length = x.shape[-1]
    kernel = _kernel(xp, w, min(size, length), reverse, x)
    if length <= size:
        return x @ kernel
    chunks, padded = _to_chunks(xp, x, size)
    edge = 0 if reverse else size - 1
    # Each chunk's local value at its far edge: sum over the chunk of w^(distance to the edge) x.
    edges = xp.reshape(xp.reshape(chunks, (-1, size)) @ kernel[:, edge], chunks.shape[:-1])
    carry = _matmul_scan(xp, edges, w**size, reverse, max(size, 2), overwrite_x=True)
    # The neighbouring chunk's value enters through the step next to it: x += w * carry there.
    entry = size - 1 if reverse else 0
    chunks = owned.add_to_columns(xp, chunks, entry, entry + 1, w * _neighbour(xp, carry, reverse)[..., None],
                                  in_place=overwrite_x or padded)
    return _from_chunks(xp, xp.reshape(xp.reshape(chunks, (-1, size)) @ kernel, chunks.shape), length)


def _kernel(xp, w: float, size: int, reverse: bool, like):
    """C x C matrix with K[k, t] = w^(k - t) for k >= t (reverse), else w^(t - k) for t >= k; 0 elsewhere.

    In like's dtype and on its device; cached per namespace, device and dtype,
    except for traced arrays (JAX), whose constants belong to one trace.
    """
    if is_lazy_array(like):
        return _build_kernel(xp, w, size, reverse, like.dtype, device_of(like))
    try:
        return _cached_kernel(xp, w, size, reverse, like.dtype, device_of(like))
    except TypeError:  # a device or dtype that cannot be a cache key
        return _build_kernel(xp, w, size, reverse, like.dtype, device_of(like))


def _build_kernel(xp, w: float, size: int, reverse: bool, dtype, device):
    steps = xp.arange(size, dtype=dtype, device=device)
    lag = steps[:, None] - steps[None, :] if reverse else steps[None, :] - steps[:, None]
    causal = lag >= 0
    powers = xp.pow(xp.asarray(w, dtype=dtype, device=device), xp.where(causal, lag, xp.zeros_like(lag)))
    return xp.where(causal, powers, xp.zeros_like(powers))


_cached_kernel = functools.lru_cache(maxsize=128)(_build_kernel)


def _doubling_chunk_scan(xp, x, a, reverse: bool, size: int):
    length = x.shape[-1]
    if length <= size:
        return _doubling(xp, x[..., None], a[..., None], reverse, fresh=False)[0][..., 0]
    local, decay = _doubling(xp, _across(xp, x, size), _across(xp, a, size), reverse, fresh=True)
    edge = 0 if reverse else size - 1
    carry = _doubling_chunk_scan(xp, local[..., edge, :], decay[..., edge, :], reverse, max(size, 2))
    correction = decay * _neighbour(xp, carry, reverse)[..., None, :]
    return _from_chunks(xp, xp.matrix_transpose(owned.add(local, correction)), length)


def _across(xp, x, size: int):
    """A new row-major array of x's chunks laid out as (..., C, n): step within the chunk on axis -2, chunk last.

    The doubling scan's slices are then runs of whole rows rather than pieces
    C long, and the copy is this package's own to update in place.
    """
    chunks = xp.matrix_transpose(_to_chunks(xp, x, size)[0])
    return xp.reshape(chunks, chunks.shape, copy=True)


def _doubling(xp, b, a, reverse: bool, *, fresh: bool):
    """Hillis-Steele scan along axis -2.

    Returns (b, p): b the local solution, p_t the product of a from t to the
    edge the recurrence starts from (the last step if reverse, else the first).
    Step k combines every step with the one k away, on the side the recurrence
    comes from: ``b_t += a_t b_{t+-k}; a_t *= a_{t+-k}``. Arrays that are
    ``fresh`` (this package's own copies) are updated in place where the
    library allows; otherwise the first step builds new arrays, and later steps
    update those. With one step per chunk the inputs come back unchanged.
    """
    size = b.shape[-2]
    shift = 1
    while shift < size:
        keep = size - shift
        near = slice(None, keep) if reverse else slice(shift, None)
        far = slice(shift, None) if reverse else slice(None, keep)
        if (fresh or shift > 1) and owned.writable(b) and owned.writable(a):
            b[..., near, :] += a[..., near, :] * b[..., far, :]
            a[..., near, :] = a[..., near, :] * a[..., far, :]
        else:
            rest = slice(keep, None) if reverse else slice(None, shift)
            b_near = b[..., near, :] + a[..., near, :] * b[..., far, :]
            a_near = a[..., near, :] * a[..., far, :]
            pieces = ((b_near, b[..., rest, :]), (a_near, a[..., rest, :]))
            b, a = (xp.concat(list(p if reverse else p[::-1]), axis=-2) for p in pieces)
        shift *= 2
    return b, a


def _to_chunks(xp, x, size: int):
    """(chunks, padded): the last axis zero-padded to a multiple of size (a new array) and viewed as (..., n, size)."""
    length = x.shape[-1]
    n = math.ceil(length / size)
    pad = n * size - length
    if pad:
        filler = xp.zeros((*x.shape[:-1], pad), dtype=x.dtype, device=device_of(x))
        x = xp.concat([x, filler], axis=-1)
    return xp.reshape(x, (*x.shape[:-1], n, size)), bool(pad)


def _from_chunks(xp, chunks, length: int):
    flat = xp.reshape(chunks, (*chunks.shape[:-2], chunks.shape[-2] * chunks.shape[-1]))
    return flat[..., :length]


def _neighbour(xp, carry, reverse: bool):
    """The carry of the chunk the recurrence comes from: c+1 if reverse, c-1 if not; 0 past the edge."""
    zero = xp.zeros((*carry.shape[:-1], 1), dtype=carry.dtype, device=device_of(carry))
    if reverse:
        return xp.concat([carry[..., 1:], zero], axis=-1)
    return xp.concat([zero, carry[..., :-1]], axis=-1)
