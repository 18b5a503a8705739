"""Host memory: the whole contract in one compiled pass over memory (numba ``njit``, parallel over rows).

The recurrence is serial in time, so on a CPU the fastest exact method is one
pass per row, with the rows spread over the cores (``prange``). Every step
does what ``gae_xp.reference.gae_loop`` does, in the same order, with the
running sums in float64 (so float32 inputs come out more accurate than a
float32 loop), and writes each output once:

    Vnext   = next_values[t] | V at the next real step | bootstrap
    delta   = r_t + (0 if terminated_t else gamma_t Vnext) - V_t
    a_t     = 0 if terminated_t or truncated_t else gamma_t lam_t
    A_t     = delta + (0 if a_t == 0 else a_t A_{t+1})
    masked steps: outputs 0 (or, with ``fill_masked``, the running A and
    A + V_t), and the running A and Vnext pass through unchanged.

The kernels walk *segments*: a row is one segment, and packed sequences
(``offsets``) make each sequence one, with its own bootstrap value and an
incoming advantage ``carry`` (0 unless a piece's right neighbour lives
elsewhere, see ``gae_xp._pieces``); rows and segments are spread over the
cores together, so a packed row of many sequences runs in parallel. The
summary kernel walks a segment once without writing outputs and returns
its response to the two numbers that may enter it from the right.

It serves NumPy arrays and PyTorch CPU tensors that record no autograd
history (through zero-copy NumPy views; the outputs are tensors again).
There are no chunks here, so ``chunk_size`` has no effect. numba is imported
on the first call of a kernel. Small problems run a single-threaded build of
the same kernel (starting the thread pool costs more than their work), so do
calls inside ``gae_xp.backends.single_threaded()`` (Dask's block tasks); the
kernels release the GIL, so calls from several threads run at once, and
calls from several Python threads are safe on every threading layer: numba's
``workqueue`` layer (the one left where neither TBB nor OpenMP is installed)
aborts the process on concurrent use, so launches are serialised there.
"""

from __future__ import annotations

import functools
import importlib.util
import math
import threading

import numpy as np

from gae_xp._compat import is_numpy_array, is_torch_array, values_are_readable
from gae_xp._problem import FLAGS, OPTIONAL
from gae_xp.backends import is_single_threaded

NAME = "numba"
#: Below this many elements a call runs the single-threaded kernel.
PARALLEL_FROM = 1 << 15


class NumbaCPUBackend:
    name = NAME
    segments = True
    uses_chunk_size = False
    critic_lam = False

    def unavailable_reason(self, xp, arrays, *, forced=False):
        for a in arrays:
            if is_torch_array(a):
                if a.device.type != "cpu":
                    return "the numba CPU kernels take arrays in host memory (NumPy, torch CPU tensors)"
                if a.requires_grad:
                    return ("tensors that require grad take the kernels through backend='auto' (the custom operator "
                            "torch.ops.gae_xp.gae) or the generic path, backend='xp'")
                if not values_are_readable(a):
                    return "traced or meta tensors need backend='xp'"
            elif not is_numpy_array(a):
                return "the numba CPU kernels take NumPy arrays and PyTorch CPU tensors"
        if not _numba_installed():
            return "numba is not installed (pip install 'gae_xp[numba]')"
        return None

    def gae(self, problem, *, chunk_size):
        p = problem
        rewards = _host(p.rewards)
        shape, dtype = rewards.shape, rewards.dtype
        rows = _rows(rewards)
        advantages = np.empty(rows.shape, dtype=dtype)
        returns = np.empty(rows.shape, dtype=dtype)
        segments = _segments(p, shape)
        values = _rows(_host(p.values))
        parallel = _parallel(rewards.size, rows.shape[0] * (segments[2].shape[0] - 1))
        plain = (isinstance(p.gamma, float) and isinstance(p.lam, float) and p.next_values is None
                 and p.terminated is None and p.truncated is None and p.mask is None)
        if plain:  # a constant discount (segments and a carry allowed)
            _launch(parallel, _kernels(parallel).gae_plain, rows, values, *segments, p.gamma, p.lam,
                    advantages, returns)
        else:
            kernel = _general_kernels(*_present(p), parallel).gae
            _launch(parallel, kernel, rows, values, *segments, *_optional_arrays(p, dtype, rows.shape),
                    p.fill_masked, advantages, returns)
        like = p.rewards
        return _like(advantages.reshape(shape), like), _like(returns.reshape(shape), like)

    def summarize(self, problem):
        """Each segment's summary (see ``gae_xp._pieces``), (..., n, 5), in one read-only pass."""
        p = problem
        rewards = _host(p.rewards)
        shape = rewards.shape
        rows = _rows(rewards)
        _, _, offsets = _segments(p, shape)
        out = np.empty((rows.shape[0], offsets.shape[0] - 1, 5), dtype=np.float64)
        parallel = _parallel(rewards.size, rows.shape[0] * (offsets.shape[0] - 1))
        kernel = _general_kernels(*_present(p), parallel).summarize
        _launch(parallel, kernel, rows, _rows(_host(p.values)), offsets,
                *_optional_arrays(p, rewards.dtype, rows.shape), out)
        summary = out.astype(rewards.dtype).reshape((*shape[:-1], offsets.shape[0] - 1, 5))
        return _like(summary, p.rewards)

    def scan(self, xp, x, a, *, reverse, chunk_size):
        host = _host(x)
        rows = _rows(host)
        out = np.empty(rows.shape, dtype=host.dtype)
        a_scalar, a_steps = _coefficient(a, host.dtype, host.shape)
        parallel = _parallel(host.size, rows.shape[0])
        _launch(parallel, _kernels(parallel).scan_rows, rows, a_scalar, a_steps, reverse, out)
        return _like(out.reshape(host.shape), x)


def _parallel(size: int, pieces: int) -> bool:
    """Whether a call runs the parallel build: enough work, more than one row (or segment) to share, and no
    ``single_threaded()`` block around it. One row runs on one thread anyway; waking a pool for it only adds
    the wait for a busy core."""
    return size >= PARALLEL_FROM and pieces > 1 and not is_single_threaded()


def _host(a):
    """A NumPy view of a NumPy array or a torch CPU tensor (zero-copy)."""
    return a.numpy() if is_torch_array(a) else a


def _like(result: np.ndarray, like):
    """result as the caller's kind of array: a torch tensor sharing its memory, or itself."""
    if is_torch_array(like):
        import torch

        return torch.from_numpy(result)
    return result


def _rows(a):
    """A (rows, T) view or copy of a (..., T) array."""
    return np.reshape(a, (math.prod(a.shape[:-1]), a.shape[-1]))


def _coefficient(value, dtype, shape):
    """(scalar, (rows, T) array): a float goes in the scalar beside an empty array, an array in the array."""
    if isinstance(value, float):
        return value, np.empty((0, 0), dtype=dtype)
    return 0.0, _rows(np.broadcast_to(_host(value), shape))


def _present(p):
    """Which optional per-step arrays the problem has (``OPTIONAL`` order): the general kernels are compiled per
    combination."""
    return tuple(getattr(p, name) is not None for name in OPTIONAL)


def _optional_arrays(p, dtype, shape):
    """The general kernels' per-step arguments after (bootstrap, carry, offsets)."""
    gamma_scalar, gamma_steps = _coefficient(p.gamma, dtype, p.rewards.shape)
    lam_scalar, lam_steps = _coefficient(p.lam, dtype, p.rewards.shape)
    arrays = tuple(_optional(getattr(p, name), np.bool_ if name in FLAGS else dtype, shape) for name in OPTIONAL)
    return (*arrays, gamma_scalar, gamma_steps, lam_scalar, lam_steps)


def _segments(p, shape):
    """(bootstrap, carry, offsets): the per-segment boundary values as (rows, n) float64, the offsets as int64.

    Without offsets the row is one segment ``[0, T]``; without a carry the
    carry is an empty (0, 0) array (the kernels start from 0).
    """
    length, batch = shape[-1], shape[:-1]
    if p.offsets is None:
        offsets = np.array([0, length], dtype=np.int64)
    else:
        offsets = np.ascontiguousarray(p.host_offsets, dtype=np.int64)
    count = offsets.shape[0] - 1

    def per_segment(value):
        return _rows(np.broadcast_to(_host(value), (*batch, count))).astype(np.float64)

    carry = np.empty((0, 0), dtype=np.float64) if p.carry is None else per_segment(p.carry)
    return per_segment(p.bootstrap), carry, offsets


def _optional(value, dtype, shape):
    """The (rows, T) array, or an empty (0, 0) one that tells the kernel the argument is absent."""
    if value is None:
        return np.empty((0, 0), dtype=dtype)
    return np.reshape(_host(value), shape)


@functools.cache
def _numba_installed() -> bool:
    return importlib.util.find_spec("numba") is not None


_LAUNCH_LOCK = threading.Lock()
_concurrency_safe = False


def _launch(parallel: bool, kernel, *args):
    """Run a kernel; parallel ones are serialised until numba's threading layer is known to allow concurrent calls."""
    global _concurrency_safe
    if _concurrency_safe or not parallel:
        kernel(*args)
        return
    with _LAUNCH_LOCK:
        kernel(*args)
        _concurrency_safe = _threading_layer() in ("tbb", "omp")


def _threading_layer() -> str | None:
    """The threading layer numba runs parallel kernels on, or None before it has started one."""
    import numba

    try:
        return numba.threading_layer()
    except ValueError:
        return None


@functools.cache
def _kernels(parallel: bool):
    """The constant-discount and scan kernels, compiled on first use (numba is imported here)."""
    from types import SimpleNamespace

    import numba

    def gae_plain(rewards, values, bootstrap, carry, offsets, gamma, lam, advantages, returns):
        # The constant-discount case alone: the shortest loop, as fast as a hand-written one.
        w = gamma * lam
        n_segments = offsets.shape[0] - 1
        has_carry = carry.shape[0] > 0
        for s in numba.prange(rewards.shape[0] * n_segments):
            row = s // n_segments
            segment = s - row * n_segments
            next_value = bootstrap[row, segment]
            following = carry[row, segment] if has_carry else 0.0
            for t in range(offsets[segment + 1] - 1, offsets[segment] - 1, -1):
                value = np.float64(values[row, t])
                carried = w * following if w != 0.0 else 0.0
                following = np.float64(rewards[row, t]) + gamma * next_value - value + carried
                next_value = value
                advantages[row, t] = following
                returns[row, t] = following + value

    def scan_rows(x, a_scalar, a_steps, reverse, out):
        n_rows, length = x.shape
        per_step = a_steps.shape[0] > 0
        for row in numba.prange(n_rows):
            state = 0.0
            for i in range(length):
                t = length - 1 - i if reverse else i
                a = np.float64(a_steps[row, t]) if per_step else a_scalar
                state = np.float64(x[row, t]) + (a * state if a != 0.0 else 0.0)
                out[row, t] = state

    compile_ = numba.njit(parallel=parallel, cache=True, nogil=True)
    return SimpleNamespace(gae_plain=compile_(gae_plain), scan_rows=compile_(scan_rows))


@functools.lru_cache(maxsize=32)
def _general_kernels(has_next: bool, has_terminated: bool, has_truncated: bool, has_mask: bool, parallel: bool):
    """The whole contract, compiled once per combination of the optional arrays present.

    The flags are constants of the compiled code, so what is absent costs
    nothing, and what is present costs no test per step. Both kernels walk
    segments (``offsets``; one per row without them), in parallel across
    rows and segments, with the same arithmetic per step: ``gae`` writes the
    outputs, ``summarize`` each segment's summary (see ``gae_xp._pieces``).
    """
    from types import SimpleNamespace

    import numba

    def gae_segments(rewards, values, bootstrap, carry, offsets, next_values, terminated, truncated, mask,
                     gamma_scalar, gamma_steps, lam_scalar, lam_steps, fill_masked, advantages, returns):
        # Every step does the same arithmetic and picks with selects, off the chain through
        # ``following``: random holes in a mask would otherwise cost a mispredicted branch each.
        n_segments = offsets.shape[0] - 1
        has_carry = carry.shape[0] > 0
        gamma_per_step, lam_per_step = gamma_steps.shape[0] > 0, lam_steps.shape[0] > 0
        for s in numba.prange(rewards.shape[0] * n_segments):
            row = s // n_segments
            segment = s - row * n_segments
            next_value = bootstrap[row, segment]
            following = carry[row, segment] if has_carry else 0.0
            for t in range(offsets[segment + 1] - 1, offsets[segment] - 1, -1):
                value = np.float64(values[row, t])
                gamma = np.float64(gamma_steps[row, t]) if gamma_per_step else gamma_scalar
                lam = np.float64(lam_steps[row, t]) if lam_per_step else lam_scalar
                v_next = np.float64(next_values[row, t]) if has_next else next_value
                ended = has_terminated and terminated[row, t]
                cut = ended or (has_truncated and truncated[row, t])
                real = not has_mask or mask[row, t]
                delta = np.float64(rewards[row, t]) + (0.0 if ended else gamma * v_next) - value
                # A masked step is the identity of the recurrence: input 0, coefficient 1.
                coefficient = (0.0 if cut else gamma * lam) if real else 1.0
                # A zero coefficient cuts exactly: 0 * inf would be NaN.
                carried = coefficient * following if coefficient != 0.0 else 0.0
                following = (delta if real else 0.0) + carried
                next_value = value if real else next_value
                kept = real or fill_masked
                advantages[row, t] = following if kept else 0.0
                returns[row, t] = following + value if kept else 0.0

    def summarize_segments(rewards, values, offsets, next_values, terminated, truncated, mask,
                           gamma_scalar, gamma_steps, lam_scalar, lam_steps, out):
        # The same walk with nothing after the segment (b = 0, c = 0), carrying the derivatives of the
        # running values on b (the value after the segment) and on c (the advantage after it).
        n_segments = offsets.shape[0] - 1
        gamma_per_step, lam_per_step = gamma_steps.shape[0] > 0, lam_steps.shape[0] > 0
        for s in numba.prange(rewards.shape[0] * n_segments):
            row = s // n_segments
            segment = s - row * n_segments
            next_value, on_value = 0.0, 1.0
            following, on_bootstrap, on_carry = 0.0, 0.0, 1.0
            for t in range(offsets[segment + 1] - 1, offsets[segment] - 1, -1):
                # The same step as in gae_segments (written out: a shared helper costs 20% there).
                value = np.float64(values[row, t])
                gamma = np.float64(gamma_steps[row, t]) if gamma_per_step else gamma_scalar
                lam = np.float64(lam_steps[row, t]) if lam_per_step else lam_scalar
                v_next = np.float64(next_values[row, t]) if has_next else next_value
                ended = has_terminated and terminated[row, t]
                cut = ended or (has_truncated and truncated[row, t])
                real = not has_mask or mask[row, t]
                delta = (np.float64(rewards[row, t]) + (0.0 if ended else gamma * v_next) - value) if real else 0.0
                coefficient = (0.0 if cut else gamma * lam) if real else 1.0
                # d delta / d b: b reaches this step's Vnext only until a real step is met (on_value).
                entering = (0.0 if ended else gamma) * on_value if real and not has_next else 0.0
                if coefficient != 0.0:
                    following = delta + coefficient * following
                    on_bootstrap = entering + coefficient * on_bootstrap
                    on_carry = coefficient * on_carry
                else:
                    following, on_bootstrap, on_carry = delta, entering, 0.0
                if real:
                    next_value, on_value = value, 0.0
            out[row, segment, 0] = next_value
            out[row, segment, 1] = on_value
            out[row, segment, 2] = following
            out[row, segment, 3] = on_bootstrap
            out[row, segment, 4] = on_carry

    compile_ = numba.njit(parallel=parallel, nogil=True)
    return SimpleNamespace(gae=compile_(gae_segments), summarize=compile_(summarize_segments))


BACKEND = NumbaCPUBackend()
