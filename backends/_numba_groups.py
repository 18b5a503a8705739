r"""The numba CPU kernel behind ``gae_xp._segments.group_moments`` on NumPy arrays (numba is imported with this
module): every group's (count, mean, M2) in two passes over the scores, float64 accumulators.

Pass 1 counts each group's scores that are not NaN and sums them (``m0 = sum / n``); pass 2 sums
``d = x - m0`` and ``d^2`` per group, and ``mean = m0 + sum(d) / n``, ``M2 = max(sum(d^2) - sum(d)^2 / n, 0)``
(a NaN kept: an infinite score's group): the corrected two-pass sum of ``gae_xp._segments``, whose formulas and
exactness argument hold here term for term.
An index outside [0, n_groups) (never made by gae_xp's own dense index) is skipped: no read or write outside the
arrays, whatever the input. Its numba cache is found by this file's contents, in gae_xp's cache directory
(``gae_xp.backends._numba_cache``), never beside the installed package.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

from ._numba_cache import install as _install_cache_locator

_install_cache_locator()  # before the kernel below is made: numba picks its cache's locator then


@njit(cache=True, nogil=True)
def group_moments(x, index, n_groups):
    count = np.zeros(n_groups)
    first = np.zeros(n_groups)
    for i in range(x.shape[0]):
        g = index[i]
        v = np.float64(x[i])
        if 0 <= g < n_groups and not math.isnan(v):
            count[g] += 1.0
            first[g] += v
    for g in range(n_groups):
        if count[g] > 0:
            first[g] /= count[g]
    d_sum = np.zeros(n_groups)
    d_squares = np.zeros(n_groups)
    for i in range(x.shape[0]):
        g = index[i]
        v = np.float64(x[i])
        if 0 <= g < n_groups and not math.isnan(v):
            d = v - first[g]
            d_sum[g] += d
            d_squares[g] += d * d
    mean = np.empty(n_groups)
    m2 = np.empty(n_groups)
    for g in range(n_groups):
        divisor = count[g] if count[g] > 0 else 1.0
        correction = d_sum[g] / divisor
        mean[g] = first[g] + correction
        spread = d_squares[g] - d_sum[g] * correction
        m2[g] = 0.0 if spread < 0 else spread  # a NaN (an infinite score's group) stays NaN
    return count, mean, m2
