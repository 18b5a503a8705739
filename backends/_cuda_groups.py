r"""The numba-CUDA kernels behind ``gae_xp._segments.group_moments`` on CUDA arrays (CuPy, torch CUDA tensors that
do not require grad, outside ``torch.compile``): every group's sums for the corrected two-pass moments, in two
launches of one thread per score, float64 atomics into (n_groups,) arrays.

1. ``count_and_sum``: a score that is not NaN adds 1 to its group's count and itself to its group's sum;
2. ``centred_sums``: it adds ``d = x - sum/count`` and ``d^2`` to its group's (``sum/count`` is the quotient
   ``gae_xp._segments`` computes, so both routes centre on the same float64 number).

The finishing arithmetic (``mean = m0 + sum(d)/n``, ``M2 = max(sum(d^2) - sum(d)^2/n, 0)``) is the library's, in
``_segments``. Atomics add in any order; for equal scores every partial sum of pass 2 is an exact multiple of one
small difference, so the answer is still exactly (v, 0). An index outside [0, n_groups) is skipped: no read or
write outside the arrays. Launches go on the caller's current stream, arrays zero-copy
(``numba_cuda._Launch``); no host synchronisation.
"""

from __future__ import annotations

import math

from ._cuda_import import cuda, types
from ._cuda_kernels import KernelSpec
from .numba_cuda import _Launch

#: Threads per block.
THREADS = 256
#: The score dtypes the kernels read (others are widened first).
IO_DTYPES = ("float32", "float64")


def count_and_sum(x, index, count, total):
    i = cuda.grid(1)
    if i < x.shape[0]:
        g = index[i]
        v = types.float64(x[i])
        if 0 <= g < count.shape[0] and not math.isnan(v):
            cuda.atomic.add(count, g, 1.0)
            cuda.atomic.add(total, g, v)


def centred_sums(x, index, count, total, d_sum, d_squares):
    i = cuda.grid(1)
    if i < x.shape[0]:
        g = index[i]
        v = types.float64(x[i])
        if 0 <= g < count.shape[0] and not math.isnan(v):
            d = v - total[g] / count[g]
            cuda.atomic.add(d_sum, g, d)
            cuda.atomic.add(d_squares, g, d * d)


def specs(io: str):
    """The two kernels' KernelSpecs for scores of dtype ``io`` (what the PTX test compiles)."""
    x, index = getattr(types, io)[:], types.int64[:]  # any strides: a view of the caller's scores as it is
    sums = types.float64[::1]
    return [KernelSpec(f"groups_count_and_sum[{io}]", count_and_sum, types.void(x, index, sums, sums), (THREADS, 1)),
            KernelSpec(f"groups_centred_sums[{io}]", centred_sums, types.void(x, index, sums, sums, sums, sums),
                       (THREADS, 1))]


_COMPILED: dict = {}


def _kernels(io: str):
    if io not in _COMPILED:
        _COMPILED[io] = [cuda.jit(spec.signature)(spec.function) for spec in specs(io)]
    return _COMPILED[io]


def sums(xp, scores, index, n_groups: int, device):
    """(count, sum, sum(d), sum(d^2)) float64 (n_groups,) of every group, by the two launches."""
    out = [xp.zeros(n_groups, dtype=xp.float64, device=device) for _ in range(4)]
    n = scores.shape[0]
    if n == 0 or n_groups == 0:
        return out
    first, second = _kernels(str(scores.dtype).rsplit(".", 1)[-1])
    blocks = (n + THREADS - 1) // THREADS
    with _Launch(scores) as launch:
        x, idx = launch.array(scores), launch.array(index)
        count, total, d_sum, d_squares = (launch.array(a, written=True) for a in out)
        launch(first, blocks, THREADS, x, idx, count, total)
        launch(second, blocks, THREADS, x, idx, count, total, d_sum, d_squares)
    return out
