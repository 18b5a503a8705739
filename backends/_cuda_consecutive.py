r"""The numba-CUDA kernels behind ``gae_xp.group_advantages(scores, k)`` on CUDA arrays (CuPy, torch CUDA tensors
that do not require grad, outside ``torch.compile``): consecutive groups of k, the whole advantages fused, one
thread per group, float64 arithmetic, no atomics.

Each thread computes its group's (n, mean, M2) over the members that are not NaN by the corrected two-pass sum of
``gae_xp._segments`` (the same float64 operations, in the same order, as the numba CPU kernel)::

    m0 = sum(x) / n,   d = x - m0,   mean = m0 + sum(d) / n,   M2 = max(sum(d^2) - sum(d)^2 / n, 0)

and writes ``A = centred / (std + eps)`` (or ``centred``) for its k members, with ``gae_xp.groups``' conventions
(a NaN score gets 0; M2 = 0 gives 0 under a scale, a NaN M2, from an infinite score, NaN; leave-one-out's factor
n / (n - 1), 0 for a group of one).

* ``scale="group"`` or ``None``: one launch, ``advantages``;
* ``scale="batch"``: two launches. ``statistics`` writes every group's (n, mean) and, per block, the block's
  (n, mean, M2) over its groups (the corrected two-pass sum over the groups, two tree reductions in shared
  memory); ``batch_advantages`` has every block merge all blocks' partials the same way (Chan's merge:
  ``M2 = sum M2_b + sum n_b d_b^2 - (sum n_b d_b)^2 / n``, ``d_b = mean_b - m0``) and write its groups'
  advantages. Equal means give equal d, so all N equal scores still give M2 = 0 exactly, and the tree's fixed
  order makes the answer the same from run to run.

Every slot of the (G,) and (blocks,) arrays is written before it is read: nothing is zeroed, so the route is
exactly its one or two launches on the caller's stream (``numba_cuda._Launch``), no host synchronisation.
"""

from __future__ import annotations

import math

from ._cuda_groups import THREADS
from ._cuda_import import cuda, types
from ._cuda_kernels import KernelSpec
from .numba_cuda import _Launch

__all__ = ["advantages", "THREADS", "BASELINE_CODES", "specs"]

#: baseline -> the kernels' code.
BASELINE_CODES = {None: 0, "mean": 1, "leave_one_out": 2}


@cuda.jit(device=True, inline=True)
def _moments(x, start, k):
    """(n, mean, M2) of x[start:start + k], NaN left out."""
    count = 0.0
    total = 0.0
    for j in range(k):
        v = types.float64(x[start + j])
        if not math.isnan(v):
            count += 1.0
            total += v
    divisor = count if count > 0 else 1.0
    first = total / divisor
    d_sum = 0.0
    d_squares = 0.0
    for j in range(k):
        v = types.float64(x[start + j])
        if not math.isnan(v):
            d = v - first
            d_sum += d
            d_squares += d * d
    correction = d_sum / divisor
    spread = d_squares - d_sum * correction
    return count, first + correction, 0.0 if spread < 0 else spread  # NaN kept (an infinite score)


@cuda.jit(device=True, inline=True)
def _write(x, out, start, k, count, mean, spread, n, baseline, scaled, unbiased, eps):
    """out[start:start + k] from the group's (count, mean) and the scale's (spread = M2, n); ``groups``' formula."""
    factor = 1.0
    if baseline == 2:
        factor = count / (count - 1.0) if count > 1 else 0.0
    denominator = 1.0
    flat = spread == 0.0  # not a NaN spread: an infinite score makes its advantages NaN
    if scaled and not flat:
        divisor = n - 1.0 if unbiased else n
        std = math.sqrt(spread / divisor) if divisor > 0 else spread  # n <= 1: the spread is NaN here
        denominator = std + eps
    for j in range(k):
        v = types.float64(x[start + j])
        centred = v if baseline == 0 else (v - mean) * factor
        keep = not math.isnan(v) and not (scaled and flat)
        out[start + j] = centred / denominator if keep else 0.0


def advantages_kernel(x, out, k, baseline, scaled, unbiased, eps):
    g = cuda.grid(1)
    if g < out.shape[0] // k:
        count, mean, m2 = _moments(x, g * k, k)
        _write(x, out, g * k, k, count, mean, m2, count, baseline, scaled, unbiased, eps)


@cuda.jit(device=True, inline=True)
def _block_sums(shared, t, a, b, c):
    """The block's sums of a, b, c (a fixed tree in shared memory; every thread of the block must call it)."""
    shared[0, t] = a
    shared[1, t] = b
    shared[2, t] = c
    cuda.syncthreads()
    step = THREADS // 2
    while step > 0:
        if t < step:
            for row in range(3):
                shared[row, t] += shared[row, t + step]
        cuda.syncthreads()
        step //= 2
    a, b, c = shared[0, 0], shared[1, 0], shared[2, 0]
    cuda.syncthreads()  # before the next call writes shared again
    return a, b, c


@cuda.jit(device=True, inline=True)
def _merged(shared, t, count, mean, m2):
    """(n, M2) of the (count, mean, M2) the block's threads hold, by the corrected two-pass sum over them."""
    total, weighted, _ = _block_sums(shared, t, count, count * mean, 0.0)
    divisor = total if total > 0 else 1.0
    first = weighted / divisor
    d = mean - first
    d_sum, d_squares, m2_sum = _block_sums(shared, t, count * d, count * d * d, m2)
    correction = d_sum / divisor
    spread = d_squares - d_sum * correction
    return total, first + correction, m2_sum + (0.0 if spread < 0 else spread)


def statistics_kernel(x, stats, partials, k):
    shared = cuda.shared.array((3, THREADS), types.float64)
    t = cuda.threadIdx.x
    g = cuda.grid(1)
    count, mean, m2 = 0.0, 0.0, 0.0
    if g < stats.shape[1]:
        count, mean, m2 = _moments(x, g * k, k)
        stats[0, g] = count
        stats[1, g] = mean
    total, block_mean, block_m2 = _merged(shared, t, count, mean, m2)
    if t == 0:
        partials[0, cuda.blockIdx.x] = total
        partials[1, cuda.blockIdx.x] = block_mean
        partials[2, cuda.blockIdx.x] = block_m2


def batch_advantages_kernel(x, stats, partials, out, k, baseline, unbiased, eps):
    shared = cuda.shared.array((3, THREADS), types.float64)
    t = cuda.threadIdx.x
    # Chan's merge of every block's partials: each thread takes a stride of blocks, then the tree.
    count, weighted = 0.0, 0.0
    for b in range(t, partials.shape[1], THREADS):
        count += partials[0, b]
        weighted += partials[0, b] * partials[1, b]
    total, weighted, _ = _block_sums(shared, t, count, weighted, 0.0)
    divisor = total if total > 0 else 1.0
    first = weighted / divisor
    d_sum, d_squares, m2_sum = 0.0, 0.0, 0.0
    for b in range(t, partials.shape[1], THREADS):
        d = partials[1, b] - first
        d_sum += partials[0, b] * d
        d_squares += partials[0, b] * d * d
        m2_sum += partials[2, b]
    d_sum, d_squares, m2_sum = _block_sums(shared, t, d_sum, d_squares, m2_sum)
    spread = d_squares - d_sum * (d_sum / divisor)
    batch_m2 = m2_sum + (0.0 if spread < 0 else spread)
    g = cuda.grid(1)
    if g < stats.shape[1]:
        _write(x, out, g * k, k, stats[0, g], stats[1, g], batch_m2, total, baseline, True, unbiased, eps)


def specs(io: str):
    """The three kernels' KernelSpecs for scores of dtype ``io`` (what the PTX tests compile)."""
    scalar = getattr(types, io)
    x, out = scalar[:], scalar[::1]  # any strides in: a view of the caller's scores as it is
    table = types.float64[:, ::1]
    flags = (types.int64, types.int64, types.boolean, types.float64)  # k, baseline, scaled / unbiased, eps
    return [
        KernelSpec(f"groups_consecutive_advantages[{io}]", advantages_kernel,
                   types.void(x, out, types.int64, types.int64, types.boolean, types.boolean, types.float64),
                   (THREADS, 1)),
        KernelSpec(f"groups_consecutive_statistics[{io}]", statistics_kernel,
                   types.void(x, table, table, types.int64), (THREADS, 1)),
        KernelSpec(f"groups_consecutive_batch_advantages[{io}]", batch_advantages_kernel,
                   types.void(x, table, table, out, *flags), (THREADS, 1)),
    ]


_COMPILED: dict = {}


def _kernels(io: str):
    if io not in _COMPILED:
        _COMPILED[io] = [cuda.jit(spec.signature)(spec.function) for spec in specs(io)]
    return _COMPILED[io]


def advantages(xp, scores, k: int, *, baseline, scale, eps: float, unbiased: bool, device):
    """``group_advantages(scores, k, ...)`` (scores float32 or float64, N > 0, N % k == 0) in the scores' dtype:
    one launch, two for ``scale="batch"``."""
    n = scores.shape[0]
    groups = n // k
    blocks = (groups + THREADS - 1) // THREADS
    out = xp.empty(n, dtype=scores.dtype, device=device)
    fused, statistics, batch = _kernels(str(scores.dtype).rsplit(".", 1)[-1])
    code = BASELINE_CODES[baseline]
    with _Launch(scores) as launch:
        x, written = launch.array(scores), launch.array(out, written=True)
        if scale != "batch":
            launch(fused, blocks, THREADS, x, written, k, code, scale == "group", unbiased, float(eps))
            return out
        stats = xp.empty((2, groups), dtype=xp.float64, device=device)
        partials = xp.empty((3, blocks), dtype=xp.float64, device=device)
        stats_, partials_ = launch.array(stats, written=True), launch.array(partials, written=True)
        launch(statistics, blocks, THREADS, x, stats_, partials_, k)
        launch(batch, blocks, THREADS, x, stats_, partials_, written, k, code, unbiased, float(eps))
    return out
