r"""The one chunked prefix scan, written only against the array API namespace.

It solves the first-order linear recurrence along the last axis

    reverse=True:   y_t = x_t + a_t y_{t+1},   y_T  = 0
    reverse=False:  y_t = x_t + a_t y_{t-1},   y_-1 = 0

(a boundary value is folded into x by the caller). A zero coefficient cuts
the trace exactly: where ``a_t = 0``, ``y_t = x_t`` even if the neighbour is
NaN or inf. With T steps cut into n chunks of C steps:

0. **chunks**: x zero-padded to n C steps and viewed chunk by chunk;
1. **local scan** in every chunk at once, as if nothing came into it; a
   chunk's summary is its solution at its far edge ``e_c`` (the step the
   recurrence leaves it by) and the product of its coefficients ``P_c``;
2. **carry** between chunks: ``carry_c = e_c + P_c carry_{c+-1}``, the same
   recurrence on n steps, solved by this scan one level up (so the number of
   array operations is O(log_C T) and ``jax.jit`` traces a short program).
   ``chunk_scan`` takes the step as a parameter; pieces that live apart
   (ranks, Dask blocks: ``gae_xp._pieces``) solve their carries with this
   scan over the pieces, and the fused CUDA kernels do all three steps in
   three launches;
3. **fix-up**: the carry of the neighbouring chunk enters every step,
   ``y_t += D_t carry_{c+-1}`` with ``D_t`` the product of the coefficients
   from t to the chunk's edge (on the exact route a product of nonzero
   coefficients that underflows is kept at the smallest normal number, so
   that only a true zero cuts).

Two local scans:

* **constant coefficient** ``a_t = w`` (a Python float): one shared C x C
  kernel ``K[k, t] = w^{|t - k|}`` on the causal side, built in float64 from
  the exact w and then rounded (so no entry carries a power of w's rounding
  error). Step 1 is one matrix-vector product with the kernel's edge column.
  Step 3 lets the neighbour's carry *enter through the step next to it*
  (``x_entry += w carry``) and then one matmul ``y = chunks @ K`` gives the
  final values: O(T C) work, O(T + C^2) memory. NumPy hands each product to
  BLAS in blocks of at most ``BLAS_BLOCK`` elements (``kernel_product``),
  too small for BLAS to wake its thread pool: the pool's threads stall
  behind a busy core and spin after the call, which made the generic path
  up to 10x slower on a shared machine, and every NumPy operation after it;
* **time-varying coefficient** (an array), on chunks laid out as
  (..., C, n), so that step j of every chunk is one contiguous row: in host
  memory, a sequential scan, C - 1 row operations ``y_j = x_j + a_j y_{j+-1}``
  and ``D_j = a_j D_{j+-1}`` (O(T) work, the fewest passes over memory;
  written into the chunks' own arrays where a slice writes through, NumPy
  and PyTorch without autograd history, so no full-size temporaries); on
  an accelerator, a doubling (Hillis-Steele) scan of ceil(log2 C) whole-array
  steps (O(T log C) work, but a handful of kernel launches per level where the
  sequential scan would launch C).

Non-finite values. A matmul multiplies the kernel's zeros with every entry of
a chunk, and ``0 * inf`` is NaN, so non-finite values must not meet it. When x
is known to be finite (one reduction, on arrays in host memory whose values
can be read now) the routes run as above. Otherwise (a NaN or inf in x, or
values that cannot be read: ``jax.jit``, ``torch.compile``, GPU arrays, where
a check would synchronise) the constant route solves the finite part of x and
lays over it the serial loop's pattern of inf and NaN, which a cumulative sum
of the non-finite entries gives exactly (only additions); the time-varying
route cuts with ``where`` at zero coefficients. Either way a non-finite value
travels only in the recurrence's direction and never crosses a cut.
"""

from __future__ import annotations

import math
import threading
from collections import OrderedDict
from contextlib import nullcontext
from typing import Callable

import numpy as np

from . import _compat
from ._compat import (
    add_at,
    device_of,
    ieee_overflow_allowed,
    is_jax_array,
    is_numpy_array,
    is_torch_array,
    known_finite,
    owned_copy,
    values_are_readable,
)

#: Default chunk lengths of the two local scans; see ``choose_chunk_size``.
MATMUL_CHUNK = 32
SEQUENTIAL_CHUNK = 16
#: The widest constant kernel: one dot product of C terms rounds C times, and from C = 64 on that adds up to more
#: float32 error than the serial loop makes (gamma .99, lam .95, T = 131072: tests/conformance/float32_accuracy.py).
MATMUL_WIDEST = 32

#: ``carry(edges, products) -> carries``: step 2 of the scan, for the chunks' summaries laid along the last axis.
Carry = Callable[[object, object], object]


def choose_chunk_size(length: int, constant: bool, requested: int | None = None) -> int:
    """Chunk length C: ``requested`` (or the default when None), never more than T (a short sequence is one chunk).

    * constant coefficient: the work is T C multiply-adds in a skinny
      matmul that runs below BLAS peak, so C is small: 32 by default, and a
      larger request is reduced to ``MATMUL_WIDEST`` (32) for accuracy;
    * time-varying: C - 1 row operations per level on a CPU (log2 C
      whole-array steps on an accelerator), levels shrinking by C: 16.

    Measured with ``python -m gae_xp bench --chunk-size auto,8,16,32,64,128``
    on NumPy and PyTorch CPU (see the README).
    """
    if constant:
        return max(1, min(requested or MATMUL_CHUNK, MATMUL_WIDEST, length))
    return max(1, min(requested or SEQUENTIAL_CHUNK, length))


def scan(xp, x, a, *, reverse: bool, chunk_size: int | None = None):
    """Solve the recurrence along the last axis of x (see the module docstring).

    ``x`` is an array this package owns: the scan may overwrite it, and the
    result may be x itself. ``a`` is a Python float (constant coefficient) or
    an array broadcastable to x. Returns an array shaped like x, in x's dtype,
    on its device.
    """
    if x.shape[-1] == 0 or (isinstance(a, float) and a == 0.0):
        return x
    finite = known_finite(xp, x)
    if isinstance(a, float) and not finite:
        if a > 0:
            kept = xp.isfinite(x)
            y = _solve(xp, xp.where(kept, x, xp.zeros_like(x)), a, reverse, chunk_size, finite=True)
            return _non_finite_pattern(xp, x, kept, y, a, reverse)
        a = xp.full(x.shape, a, dtype=x.dtype, device=device_of(x))  # a negative w flips an infinity's sign
    if not isinstance(a, float):
        a = xp.broadcast_to(a, x.shape)
    return _solve(xp, x, a, reverse, chunk_size, finite=finite)


def fold_boundary(xp, x, a, boundary_value, *, reverse: bool):
    """x (an array this package owns) with the boundary term ``a * y_T`` (reverse) or ``a * y_-1`` added at its edge.

    ``boundary_value`` has the batch shape with a trailing axis of 1; ``a`` is
    a Python float or an array shaped like x. Where ``a`` is 0 the boundary
    is cut exactly (``where``), so a non-finite boundary cannot leak.
    """
    edge = slice(-1, None) if reverse else slice(0, 1)
    a_edge = a if isinstance(a, float) else a[..., edge]
    if isinstance(a, float):
        return x if a == 0.0 else add_at(x, (..., edge), a * boundary_value)
    return add_at(x, (..., edge), cut_product(xp, a_edge, boundary_value))


def _solve(xp, x, a, reverse: bool, chunk_size, *, finite: bool):
    constant = isinstance(a, float)
    size = choose_chunk_size(x.shape[-1], constant, chunk_size)
    if constant:
        local = MatmulLocal(xp, a, reverse)
    elif not _compat.on_cpu(x):
        local = DoublingLocal(xp, reverse, exact=not finite)
    elif _compat.writes_through_views(x) and _compat.writes_through_views(a):
        # in place only when neither x nor a records autograd history: a's chunks are multiplied in place, and a
        # coefficient that requires grad (meta-gradients: lam alone) has them saved for the backward pass
        local = InPlaceSequentialLocal(xp, reverse, exact=not finite)
    else:
        local = SequentialLocal(xp, reverse, exact=not finite)
    def carry(edges, products):  # step 2: the same recurrence on the chunks' summaries, one level up
        return _solve(xp, edges, products, reverse, max(size, 2), finite=finite)

    return chunk_scan(xp, x, a, size, local, carry)


def chunk_scan(xp, x, a, size: int, local, carry: Carry):
    """Steps 0-3 of the module docstring, with ``local`` the local scan and ``carry`` step 2."""
    length = x.shape[-1]
    chunked = local.split(x, a, size)                       # 0. chunks
    if chunked.count == 1:
        return local.solve_alone(chunked, length)
    edges, products = local.summarize(chunked)              # 1. local scan: each chunk's summary
    carries = carry(edges, products)                        # 2. carry between chunks
    return local.fix_up(chunked, neighbour(xp, carries, local.reverse), length)  # 3. fix-up


class Chunks:
    """The chunked layout a local scan works on: its arrays, the number of chunks n and their length C, and x's
    chunks in time order (``origin``, (..., n, C)) where the layout is a copy of them."""

    __slots__ = ("x", "a", "count", "size", "state", "origin")

    def __init__(self, x, a, count: int, size: int, origin=None):
        self.x, self.a, self.count, self.size, self.state, self.origin = x, a, count, size, None, origin


class MatmulLocal:
    """Constant coefficient w: the C x C kernel, one matrix-vector product for the summaries, one matmul at the end."""

    def __init__(self, xp, w: float, reverse: bool):
        self.xp, self.w, self.reverse = xp, w, reverse

    def split(self, x, a, size):
        chunks, count = to_chunks(self.xp, x, size)
        return Chunks(chunks, None, count, size)

    def solve_alone(self, chunked, length):
        xp, x = self.xp, chunked.x
        flat = xp.reshape(x, (-1, length))
        return xp.reshape(kernel_product(xp, flat, self._kernel(length, x)), x.shape[:-2] + (length,))

    def summarize(self, chunked):
        xp, chunks, size = self.xp, chunked.x, chunked.size
        edge = 0 if self.reverse else size - 1
        flat = kernel_product(xp, xp.reshape(chunks, (-1, size)), self._kernel(size, chunks)[:, edge])
        return xp.reshape(flat, chunks.shape[:-1]), self.w ** size

    def fix_up(self, chunked, incoming, length):
        xp, chunks, size = self.xp, chunked.x, chunked.size
        # The neighbouring chunk's carry enters through the step next to it: x_entry += w * carry.
        entry = size - 1 if self.reverse else 0
        chunks = add_at(chunks, (..., slice(entry, entry + 1)), self.w * incoming[..., None])
        solved = kernel_product(xp, xp.reshape(chunks, (-1, size)), self._kernel(size, chunks))
        return from_chunks(xp, xp.reshape(solved, chunks.shape), length)

    def _kernel(self, size, like):
        return kernel(self.xp, self.w, size, self.reverse, like)


class _RowsLocal:
    """What the time-varying local scans share: the (..., C, n) layout, and the exact cut and products."""

    def __init__(self, xp, reverse: bool, *, exact: bool):
        self.xp, self.reverse, self.exact = xp, reverse, exact

    def split(self, x, a, size):
        xp = self.xp
        x_chunks, count = to_chunks(xp, x, size)
        a_chunks, _ = to_chunks(xp, a, size)
        return Chunks(_rows_major(xp, x_chunks), _rows_major(xp, a_chunks), count, size, origin=x_chunks)

    def solve_alone(self, chunked, length):
        return self._join(chunked, self.local(chunked)[0], length)

    def summarize(self, chunked):
        chunked.state = solved, decay = self.local(chunked)
        edge = 0 if self.reverse else chunked.size - 1
        return solved[..., edge, :], decay[..., edge, :]

    def fix_up(self, chunked, incoming, length):
        solved, decay = chunked.state
        return self._join(chunked, self._carried(solved, decay, incoming[..., None, :]), length)

    def local(self, chunked):
        """(y, D) on the (..., C, n) layout: the local solution, and the product of the coefficients from each
        step to the chunk's edge (the step the recurrence leaves it by)."""
        raise NotImplementedError

    def _product(self, a, b):
        return nonzero_product(self.xp, a, b) if self.exact else a * b

    def _carried(self, y, coefficient, incoming):
        """y + coefficient * incoming, with a zero coefficient cutting exactly when ``exact``."""
        return y + (cut_product(self.xp, coefficient, incoming) if self.exact else coefficient * incoming)

    def _join(self, chunked, solved, length):
        """The solution on the (..., C, n) layout back in time order, (..., T)."""
        return from_chunks(self.xp, _rows_major(self.xp, solved), length)


class SequentialLocal(_RowsLocal):
    """Time-varying coefficients on a CPU: C - 1 row operations, ``y_j = x_j + a_j y_{j+-1}``, each on a
    contiguous row of every chunk at once. O(T) work: the fewest passes over memory."""

    def local(self, chunked):
        rows, decay = self._rows(chunked)
        # Stacked as they lie, (..., C, n): contiguous writes.
        return self.xp.stack(rows, axis=-2), self.xp.stack(decay, axis=-2)

    def summarize(self, chunked):
        chunked.state = rows, decay = self._rows(chunked)
        edge = 0 if self.reverse else chunked.size - 1
        return rows[edge], decay[edge]

    def fix_up(self, chunked, incoming, length):
        # Row by row, stacked once at the end: under jax.jit, XLA fuses these row operations, where a fix-up of
        # the stacked rows made the compiled scan 10x slower on a CPU (53 ms against 5 ms, B=8, T=131072).
        rows, decay = chunked.state
        solved = self.xp.stack([self._carried(y, d, incoming) for y, d in zip(rows, decay)], axis=-2)
        return self._join(chunked, solved, length)

    def _rows(self, chunked):
        """(y_j, D_j) per row j, as lists: the local solution and the product of the coefficients from j to the
        chunk's edge."""
        x, a, size = chunked.x, chunked.a, chunked.size
        order = range(size - 1, -1, -1) if self.reverse else range(size)
        rows, decay = [None] * size, [None] * size
        previous = None
        for j in order:
            if previous is None:
                rows[j], decay[j] = x[..., j, :], a[..., j, :]
            else:
                rows[j] = self._carried(x[..., j, :], a[..., j, :], rows[previous])
                decay[j] = self._product(a[..., j, :], decay[previous])
            previous = j
        return rows, decay


class InPlaceSequentialLocal(_RowsLocal):
    """The sequential local scan written into the chunks' own arrays (this package's copies), for libraries whose
    arrays can be written (NumPy, PyTorch without autograd history): no full-size temporaries, whose fresh pages
    cost more than the arithmetic on a CPU (a page fault for every 4 KiB of each), and the solution written back
    in time order into x's own memory."""

    def summarize(self, chunked):
        edges, products = super().summarize(chunked)
        return owned_copy(self.xp, edges), products  # the carries' scan takes its x over: not the solution's row

    def local(self, chunked):
        x, a, size = chunked.x, chunked.a, chunked.size
        order = range(size - 1, -1, -1) if self.reverse else range(size)
        previous = None
        for j in order:
            if previous is not None:
                y, coefficient = x[..., j, :], a[..., j, :]  # views: written in place
                if self.exact:  # a real step's inf meets -inf inside its episode: IEEE's NaN, without a warning
                    with ieee_overflow_allowed(y):
                        y += cut_product(self.xp, coefficient, x[..., previous, :])
                    a[..., j, :] = nonzero_product(self.xp, coefficient, a[..., previous, :])
                else:
                    y += coefficient * x[..., previous, :]
                    coefficient *= a[..., previous, :]
            previous = j
        return x, a

    def fix_up(self, chunked, incoming, length):
        solved, decay = chunked.state
        incoming = incoming[..., None, :]
        if self.exact:  # as in ``local``: inf + -inf inside an episode is IEEE's NaN
            with ieee_overflow_allowed(solved):
                solved += cut_product(self.xp, decay, incoming)
        else:
            decay *= incoming
            solved += decay
        return self._join(chunked, solved, length)

    def _join(self, chunked, solved, length):
        chunked.origin[...] = self.xp.matrix_transpose(solved)
        return from_chunks(self.xp, chunked.origin, length)


class DoublingLocal(_RowsLocal):
    """Time-varying coefficients on an accelerator: a doubling (Hillis-Steele) scan, ceil(log2 C) whole-array
    steps ``b_t += a_t b_{t+-k}; a_t *= a_{t+-k}``. O(T log C) work but a handful of launches per level, where
    the sequential scan's C row operations would each be a kernel launch."""

    def local(self, chunked):
        xp, b, a, size = self.xp, chunked.x, chunked.a, chunked.size
        shift = 1
        while shift < size:
            keep = size - shift
            near = slice(None, keep) if self.reverse else slice(shift, None)
            far = slice(shift, None) if self.reverse else slice(None, keep)
            rest = slice(keep, None) if self.reverse else slice(None, shift)
            b_near = self._carried(b[..., near, :], a[..., near, :], b[..., far, :])
            a_near = self._product(a[..., near, :], a[..., far, :])
            parts = ((b_near, b[..., rest, :]), (a_near, a[..., rest, :]))
            b, a = (xp.concat(list(p if self.reverse else p[::-1]), axis=-2) for p in parts)
            shift *= 2
        return b, a


def _rows_major(xp, chunks):
    """A contiguous copy of ``chunks`` with its last two axes swapped: (..., n, C) chunks become (..., C, n), so
    that step j of every chunk is one contiguous row (and back)."""
    moved = xp.matrix_transpose(chunks)
    return xp.reshape(moved, moved.shape, copy=True)


def to_chunks(xp, x, size: int):
    """(chunks, n): the last axis zero-padded to a multiple of ``size`` and viewed as (..., n, size)."""
    length = x.shape[-1]
    count = math.ceil(length / size)
    pad = count * size - length
    if pad:
        filler = xp.zeros((*x.shape[:-1], pad), dtype=x.dtype, device=device_of(x))
        x = xp.concat([x, filler], axis=-1)
    return xp.reshape(x, (*x.shape[:-1], count, size)), count


def from_chunks(xp, chunks, length: int):
    """The (..., n, C) chunks back as (..., T), padding dropped."""
    flat = xp.reshape(chunks, (*chunks.shape[:-2], chunks.shape[-2] * chunks.shape[-1]))
    return flat[..., :length]


#: The most elements of one BLAS call in ``kernel_product``: 8192 x C x C multiply-adds (C <= 32) stay below every
#: BLAS's threshold for threads (OpenBLAS: M N K <= 2^18 for a matrix product, M N < 9216 for a matrix-vector one).
BLAS_BLOCK = 8192


def kernel_product(xp, rows, matrix):
    """``rows @ matrix`` for (M, C) rows and a (C, C) matrix or a (C,) vector (C <= ``MATMUL_WIDEST``).

    NumPy hands a matmul to BLAS in one call, and a call on the whole array
    wakes BLAS's thread pool, whose threads wait for a busy core and spin
    after it, slowing what comes next. Stacked as blocks of at most
    ``BLAS_BLOCK`` elements, NumPy's matmul makes one small BLAS call per
    block (in C, no Python loop), each on the calling thread. Other
    libraries get the one matmul (PyTorch's generic path runs on one thread:
    ``gae_xp._compat.calling_thread_only``).
    """
    count, size = rows.shape
    if not is_numpy_array(rows) or count * size <= BLAS_BLOCK:
        return rows @ matrix
    per_block = BLAS_BLOCK // size
    whole = count - count % per_block
    out = np.empty((count, *matrix.shape[1:]), dtype=np.result_type(rows, matrix))
    np.matmul(rows[:whole].reshape(-1, per_block, size), matrix, out=out[:whole].reshape(-1, per_block,
                                                                                       *matrix.shape[1:]))
    if whole < count:
        np.matmul(rows[whole:], matrix, out=out[whole:])
    return out


def nonzero_product(xp, a, b):
    """a * b, where a product of nonzero factors that underflows to 0 becomes the smallest normal number of its sign.

    A zero coefficient is a cut, so a product of nonzero coefficients must not
    become one: the loop carries a NaN or inf through any chain of nonzero
    coefficients, however small their product.
    """
    product = a * b
    underflow = (product == 0) & (a != 0) & (b != 0)
    smallest = xp.asarray(xp.finfo(product.dtype).smallest_normal, dtype=product.dtype, device=device_of(product))
    return xp.where(underflow, xp.copysign(smallest, product), product)


def cut_product(xp, coefficient, x):
    """coefficient * x, exactly 0 where the coefficient is 0 (``0 * inf`` would be NaN)."""
    return coefficient * xp.where(coefficient == 0, xp.zeros_like(x), x)


def neighbour(xp, carry, reverse: bool):
    """The carry of the chunk the recurrence comes from: c+1 if reverse, c-1 if not; 0 past the edge."""
    zero = xp.zeros((*carry.shape[:-1], 1), dtype=carry.dtype, device=device_of(carry))
    if reverse:
        return xp.concat([carry[..., 1:], zero], axis=-1)
    return xp.concat([zero, carry[..., :-1]], axis=-1)


def _non_finite_pattern(xp, x, kept, y, w: float, reverse: bool):
    """The serial loop's inf/NaN pattern laid over y, the solution on x's finite part (w a nonzero constant).

    With ``s_t`` the sum of x's non-finite entries from t on (in the
    recurrence's direction) the loop's y_t is non-finite exactly where s_t is,
    and then equals ``x_t + w s_{t+-1}``: w > 0 keeps an infinity's sign and
    NaN absorbs all, so the sum of the entries ahead has the loop's kind.
    """
    ahead = _cumulative_sum(xp, xp.where(kept, xp.zeros_like(x), x), reverse)
    following = neighbour(xp, ahead, reverse)
    return xp.where(xp.isfinite(ahead), y, x + w * following)


def _cumulative_sum(xp, x, reverse: bool):
    if not reverse:
        return xp.cumulative_sum(x, axis=-1)
    return xp.flip(xp.cumulative_sum(xp.flip(x, axis=-1), axis=-1), axis=-1)


# --- the constant kernel and its cache ---------------------------------------------------------------------------


def kernel(xp, w: float, size: int, reverse: bool, like):
    """The C x C matrix ``K[k, t] = w^(k - t)`` for k >= t (reverse), else ``w^(t - k)`` for t >= k; 0 elsewhere.

    Built in float64 from the exact w and rounded once to like's dtype, on
    like's device. Cached (see ``KERNELS``) except for traced arrays, whose
    constants belong to one trace.
    """
    if not values_are_readable(like):  # a constant of this trace, on the trace's device (a JAX tracer's is implicit)
        device = None if is_jax_array(like) else device_of(like)
        return xp.asarray(_kernel64(w, size, reverse), dtype=like.dtype, device=device)
    device = device_of(like)
    key = (xp.__name__, str(device), str(like.dtype), w, size, reverse)
    return KERNELS.get(key, lambda: _build(xp, w, size, reverse, like.dtype, device, torch=is_torch_array(like)))


def _kernel64(w: float, size: int, reverse: bool) -> np.ndarray:
    steps = np.arange(size)
    lag = steps[:, None] - steps[None, :] if reverse else steps[None, :] - steps[:, None]
    causal = lag >= 0
    return np.where(causal, np.float64(w) ** np.where(causal, lag, 0), 0.0)


def _build(xp, w, size, reverse, dtype, device, *, torch: bool):
    # Under torch.inference_mode a new tensor is an inference tensor, which autograd refuses to save later:
    # the cached kernel is made outside it, so that one process may infer and train.
    with _normal_tensors() if torch else nullcontext():
        return xp.asarray(_kernel64(w, size, reverse), dtype=dtype, device=device)


def _normal_tensors():
    import torch

    return torch.inference_mode(False)


class KernelCache:
    """The kernels in use, least recently used first out, bounded by their total bytes (not by their count)."""

    def __init__(self, max_bytes: int):
        self.max_bytes = max_bytes
        self._entries: OrderedDict = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    def get(self, key, build):
        with self._lock:
            if key in self._entries:
                self._entries.move_to_end(key)
                return self._entries[key]
        value = build()
        nbytes = _nbytes(value)
        with self._lock:
            if key not in self._entries and nbytes <= self.max_bytes:
                self._entries[key] = value
                self._bytes += nbytes
                while self._bytes > self.max_bytes:
                    _, evicted = self._entries.popitem(last=False)
                    self._bytes -= _nbytes(evicted)
        return value

    @property
    def nbytes(self) -> int:
        return self._bytes

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self._bytes = 0


def _nbytes(array) -> int:
    return getattr(array, "nbytes", None) or math.prod(array.shape) * 8


#: Kernels kept between calls: 16 MiB in all (a 256 x 256 float64 kernel is 512 KiB).
KERNELS = KernelCache(16 * 2**20)
