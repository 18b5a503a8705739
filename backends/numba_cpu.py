"""NumPy on the CPU: the whole contract in one compiled pass over memory (numba ``njit``, parallel over rows).

The recurrence is serial in time, so on a CPU the fastest exact method is one
pass per row, with the rows spread over the cores (``prange``). Every step
does what ``gae_xp.reference.gae_loop`` does, in the same order, with the
running sums in float64 (so float32 inputs come out more accurate than a
float32 loop), and writes each output once:

    Vnext   = next_values[t] | V at the next real step | bootstrap
    delta   = r_t + (0 if terminated_t else gamma_t Vnext) - V_t
    A_t     = delta + gamma_t lam_t (1 - terminated_t) (1 - truncated_t) A_{t+1}
    masked steps: outputs 0 (or, with ``fill_masked``, the running A and
    A + V_t), and the running A and Vnext pass through unchanged.

There are no chunks here, so ``chunk_size`` has no effect on this backend.
numba is imported on the first call of a kernel, i.e. when NumPy arrays meet
``backend="auto"`` or ``"numba"`` and numba is installed.
"""

from __future__ import annotations

import functools
import importlib.util
import math

import numpy as np
from array_api_compat import is_numpy_array

NAME = "numba"


class NumbaCPUBackend:
    name = NAME

    def unavailable_reason(self, xp, arrays, *, forced=False):
        if importlib.util.find_spec("numba") is None:
            return "numba is not installed (pip install 'gae_xp[numba]')"
        if not all(is_numpy_array(a) for a in arrays):
            return "the numba CPU kernels take NumPy arrays"
        return None

    def gae(self, problem, *, chunk_size):
        rows = _rows(problem.rewards)
        shape = problem.rewards.shape
        dtype = problem.rewards.dtype
        advantages = np.empty(rows.shape, dtype=dtype)
        returns = np.empty(rows.shape, dtype=dtype)
        bootstrap = _rows(np.broadcast_to(problem.bootstrap, (*shape[:-1], 1)))[:, 0].astype(np.float64)
        if problem.is_constant and problem.next_values is None:
            _kernels().gae_plain(rows, _rows(problem.values), bootstrap, problem.gamma, problem.lam, advantages,
                                 returns)
            return advantages.reshape(shape), returns.reshape(shape)
        gamma_scalar, gamma_steps = _coefficient(problem.gamma, dtype, shape)
        lam_scalar, lam_steps = _coefficient(problem.lam, dtype, shape)
        present = tuple(a is not None for a in (problem.next_values, problem.terminated, problem.truncated,
                                                problem.mask))
        _general_kernel(*present)(
            rows, _rows(problem.values), _optional(problem.next_values, dtype, rows.shape), bootstrap,
            _optional(problem.terminated, np.bool_, rows.shape), _optional(problem.truncated, np.bool_, rows.shape),
            _optional(problem.mask, np.bool_, rows.shape),
            gamma_scalar, gamma_steps, lam_scalar, lam_steps, problem.fill_masked, advantages, returns,
        )
        return advantages.reshape(shape), returns.reshape(shape)

    def scan(self, xp, x, a, *, reverse, chunk_size, overwrite_x=False):
        rows = _rows(x)
        out = np.empty(rows.shape, dtype=x.dtype)
        a_scalar, a_steps = _coefficient(a, x.dtype, x.shape)
        _kernels().scan_rows(rows, a_scalar, a_steps, reverse, out)
        return out.reshape(x.shape)


def _rows(a):
    """A (rows, T) view or copy of a (..., T) array."""
    return np.reshape(a, (math.prod(a.shape[:-1]), a.shape[-1]))


def _coefficient(value, dtype, shape):
    """(scalar, (rows, T) array): a float goes in the scalar beside an empty array, an array in the array."""
    if isinstance(value, float):
        return value, np.empty((0, 0), dtype=dtype)
    return 0.0, _rows(np.broadcast_to(value, shape))


def _optional(value, dtype, shape):
    """The (rows, T) array, or an empty (0, 0) one that tells the kernel the argument is absent."""
    if value is None:
        return np.empty((0, 0), dtype=dtype)
    return np.reshape(value, shape)


_COMPILED = None


def _kernels():
    """Compile the kernels on first use (numba is imported here, not at import time)."""
    global _COMPILED
    if _COMPILED is None:
        _COMPILED = _compile()
    return _COMPILED


def _compile():
    from types import SimpleNamespace

    import numba

    @numba.njit(parallel=True, cache=True)
    def gae_plain(rewards, values, bootstrap, gamma, lam, advantages, returns):
        # The constant-discount case alone: the shortest loop, as fast as a hand-written one.
        for row in numba.prange(rewards.shape[0]):
            next_value = bootstrap[row]
            following = 0.0
            for t in range(rewards.shape[1] - 1, -1, -1):
                value = np.float64(values[row, t])
                following = np.float64(rewards[row, t]) + gamma * next_value - value + gamma * lam * following
                next_value = value
                advantages[row, t] = following
                returns[row, t] = following + value

    @numba.njit(parallel=True, cache=True)
    def scan_rows(x, a_scalar, a_steps, reverse, out):
        n_rows, length = x.shape
        per_step = a_steps.shape[0] > 0
        for row in numba.prange(n_rows):
            state = 0.0
            for i in range(length):
                t = length - 1 - i if reverse else i
                a = np.float64(a_steps[row, t]) if per_step else a_scalar
                state = np.float64(x[row, t]) + a * state
                out[row, t] = state

    return SimpleNamespace(gae_plain=gae_plain, scan_rows=scan_rows)


@functools.lru_cache(maxsize=16)
def _general_kernel(has_next: bool, has_terminated: bool, has_truncated: bool, has_mask: bool):
    """The whole contract, compiled once per combination of the optional arrays present.

    The flags are constants of the compiled code, so what is absent costs
    nothing, and what is present costs no test per step.
    """
    import numba

    @numba.njit(parallel=True)
    def gae_rows(rewards, values, next_values, bootstrap, terminated, truncated, mask,
                 gamma_scalar, gamma_steps, lam_scalar, lam_steps, fill_masked, advantages, returns):
        # Every step does the same arithmetic and picks with selects, off the chain through
        # ``following``: random holes in a mask would otherwise cost a mispredicted branch each.
        n_rows, length = rewards.shape
        gamma_per_step = gamma_steps.shape[0] > 0
        lam_per_step = lam_steps.shape[0] > 0
        for row in numba.prange(n_rows):
            next_value = bootstrap[row]
            following = 0.0
            for t in range(length - 1, -1, -1):
                value = np.float64(values[row, t])
                gamma = np.float64(gamma_steps[row, t]) if gamma_per_step else gamma_scalar
                lam = np.float64(lam_steps[row, t]) if lam_per_step else lam_scalar
                v_next = np.float64(next_values[row, t]) if has_next else next_value
                ended = has_terminated and terminated[row, t]
                cut = ended or (has_truncated and truncated[row, t])
                real = not has_mask or mask[row, t]
                delta = np.float64(rewards[row, t]) + (0.0 if ended else gamma * v_next) - value
                # A masked step is the identity of the recurrence: input 0, coefficient 1.
                coeff = (0.0 if cut else gamma * lam) if real else 1.0
                following = (delta if real else 0.0) + coeff * following
                next_value = value if real else next_value
                kept = real or fill_masked
                advantages[row, t] = following if kept else 0.0
                returns[row, t] = following + value if kept else 0.0

    return gae_rows


BACKEND = NumbaCPUBackend()
