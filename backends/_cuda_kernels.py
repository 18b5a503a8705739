"""The numba-CUDA kernels of ``gae_xp.backends.numba_cuda`` (this module imports numba).

Kept in a module of their own so that numba's CUDA simulator can swap the
module-level ``cuda`` name when ``NUMBA_ENABLE_CUDASIM=1``.
"""

from __future__ import annotations

import os

from numba import cuda, float64

#: Threads per block of the carry kernel: the segments one row's chunks are cut into.
CARRY_THREADS = 8 if os.environ.get("NUMBA_ENABLE_CUDASIM", "0") == "1" else 128


@cuda.jit
def carry(edges, products, carries, reverse):
    """carries[r, c] = edges[r, c] + products[r, c] * carries[r, c -+ 1] (0 past the edge); one block per row r.

    Thread k composes the k-th segment of chunks in recurrence order, the
    block scans the segments' (value, product) pairs in shared memory, and
    every thread rescans its segment from the value coming into it. A zero
    product cuts exactly: nothing, NaN and inf included, crosses it.
    """
    row = cuda.blockIdx.x
    tid = cuda.threadIdx.x
    n = edges.shape[1]
    span = (n + CARRY_THREADS - 1) // CARRY_THREADS
    first = n - 1 - tid * span if reverse else tid * span
    step = -1 if reverse else 1
    count = max(0, min(span, n - tid * span))
    b = 0.0
    p = 1.0
    for i in range(count):
        c = first + step * i
        b = edges[row, c] + _carried(products[row, c], b)
        p = products[row, c] * p
    seg_b = cuda.shared.array(CARRY_THREADS, float64)
    seg_p = cuda.shared.array(CARRY_THREADS, float64)
    seg_b[tid] = b
    seg_p[tid] = p
    cuda.syncthreads()
    offset = 1
    while offset < CARRY_THREADS:
        earlier_b = 0.0
        earlier_p = 1.0
        if tid >= offset:
            earlier_b = seg_b[tid - offset]
            earlier_p = seg_p[tid - offset]
        cuda.syncthreads()
        if tid >= offset:
            b = b + _carried(p, earlier_b)
            p = p * earlier_p
            seg_b[tid] = b
            seg_p[tid] = p
        cuda.syncthreads()
        offset *= 2
    incoming = seg_b[tid - 1] if tid > 0 else 0.0
    for i in range(count):
        c = first + step * i
        incoming = edges[row, c] + _carried(products[row, c], incoming)
        carries[row, c] = incoming


@cuda.jit(device=True)
def _carried(coefficient, value):
    """coefficient * value, with a zero coefficient cutting exactly (0 * inf would be NaN)."""
    return coefficient * value if coefficient != 0.0 else 0.0
