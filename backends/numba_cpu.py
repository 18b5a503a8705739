"""Host memory: the whole contract in compiled passes over memory (numba ``njit``), for NumPy arrays and PyTorch
CPU tensors.

The recurrence is serial in time; the kernels (``gae_xp.backends._numba_kernels``)
still keep a core busy on one row: each thread advances several lanes of a
row in lockstep and joins them with a fix-up that stays in the cache, in
float64, with every cut exact (see that module). Every step computes what
``gae_xp.reference.gae_loop`` computes:

    Vnext   = next_values[t] | V at the next real step | bootstrap
    delta   = r_t + (0 if terminated_t else gamma_t Vnext) - V_t
    a_t     = 0 if terminated_t or truncated_t else gamma_t lam_t
    A_t     = delta + (0 if a_t == 0 else a_t A_{t+1})
    masked steps: outputs 0 (or, with ``fill_masked``, the running A and
    A + V_t), and the running A and Vnext pass through unchanged.

With ``critic_lam`` the returns come from a second chain of the same pass
(``gamma_t critic_lam_t`` in place of ``gamma_t lam_t``): r and V are read once.
Packed sequences (``offsets``) are cuts inside a row with their own bootstrap
value, and an incoming advantage ``carry`` enters where a piece's right
neighbour lives elsewhere (``gae_xp._pieces``). The summary kernel walks a
segment once without writing outputs and returns its response to the two
numbers that may enter it from the right.

It serves NumPy arrays and PyTorch CPU tensors that record no autograd
history (through zero-copy NumPy views; the outputs are tensors again).
There are no chunks here, so ``chunk_size`` has no effect. numba is imported
on the first call of a kernel; the kernels are cached on disk.

Threads: a call shares its work units (rows, or runs of packed sequences)
between the calling thread and helper threads (``gae_xp.backends._sharing``:
a thread that a busy machine has not scheduled is never waited for) only
when it has at least ``PARALLEL_FROM`` elements, more than one row or
sequence to share and more than one thread (``NUMBA_NUM_THREADS``,
``numba.set_num_threads``), and not inside ``gae_xp.backends.single_threaded()``
(Dask's block tasks): a small call runs on the calling thread alone. The
kernels release the GIL, so calls from several threads run at once; numba's
own thread pool is never started, so a forked child runs every call.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import math

import numpy as np

from gae_xp._compat import has_tangent, is_numpy_array, is_torch_array, torch_cpu_view, values_are_readable
from gae_xp._problem import COEFFICIENTS, PER_STEP
from gae_xp.backends import is_single_threaded

from ._sharing import share

NAME = "numba"
#: Below this many elements a call runs on the calling thread alone.
PARALLEL_FROM = 1 << 17
#: The per-step fields the kernels take after rewards and values, in the order they unpack them.
STEPS = tuple(name for name in PER_STEP if name not in ("rewards", "values"))


class NumbaCPUBackend:
    name = NAME
    segments = True
    uses_chunk_size = False
    critic_lam = True

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
                if has_tangent(a):
                    return "forward-mode dual tensors (torch.autograd.forward_ad) need backend='xp' or 'auto'"
            elif not is_numpy_array(a):
                return "the numba CPU kernels take NumPy arrays and PyTorch CPU tensors"
        if not _numba_installed():
            return "numba is not installed (pip install 'gae_xp[numba]')"
        return None

    def gae(self, problem, *, chunk_size):
        p = problem
        if p.carry is not None and p.critic_lam is not None:
            raise ValueError("a carry enters one advantage chain: solve critic_lam's returns as a problem of their own")
        rewards = _host(p.rewards)
        shape, dtype = rewards.shape, rewards.dtype
        rows = _rows(rewards)
        advantages = np.empty(rows.shape, dtype=dtype)
        returns = np.empty(rows.shape, dtype=dtype)
        bounds = _bounds(p, shape)
        offsets = bounds[2]
        threads = _threads_for(rewards.size, rows.shape[0] * (offsets.shape[0] - 1))
        spans = _spans(rows.shape[0], offsets, threads)
        kernel = _driver(p)
        share(kernel, (rows, _rows(_host(p.values)), _steps(p, rows.shape, kernel), bounds, p.fill_masked,
                       advantages, returns, spans), rows.shape[0] * (spans.shape[0] - 1), threads)
        like = p.rewards
        return _like(advantages.reshape(shape), like), _like(returns.reshape(shape), like)

    def summarize(self, problem):
        """Each segment's summary (see ``gae_xp._pieces``), (..., n, 5), in one read-only pass."""
        p = problem
        rewards = _host(p.rewards)
        shape = rewards.shape
        rows = _rows(rewards)
        offsets = _bounds(p, shape)[2]
        out = np.empty((rows.shape[0], offsets.shape[0] - 1, 5), dtype=np.float64)
        units = rows.shape[0] * (offsets.shape[0] - 1)
        summarize = _kernels().summarize_units
        share(summarize, (rows, _rows(_host(p.values)), _steps(p.replace(critic_lam=None), rows.shape, summarize),
                          offsets, out),
              units, _threads_for(rewards.size, units))
        summary = out.astype(rewards.dtype).reshape((*shape[:-1], offsets.shape[0] - 1, 5))
        return _like(summary, p.rewards)

    def scan(self, xp, x, a, *, reverse, chunk_size):
        host = _host(x)
        rows = _rows(host)
        out = np.empty(rows.shape, dtype=host.dtype)
        coefficient = a if isinstance(a, float) else _rows(np.broadcast_to(_host(a), host.shape))
        share(_kernels().scan_units, (rows, coefficient, reverse, out), rows.shape[0],
              _threads_for(host.size, rows.shape[0]))
        return _like(out.reshape(host.shape), x)


def _threads_for(size: int, units: int) -> int:
    """The threads a call's units are shared between: numba's thread count when the call has enough work, more
    than one unit and no ``single_threaded()`` block around it; otherwise 1 (the calling thread alone)."""
    if size < PARALLEL_FROM or units < 2 or is_single_threaded():
        return 1
    return _threads()


def _host(a):
    """A NumPy view of a NumPy array or a torch CPU tensor (zero-copy, and the tensor stays resizable:
    ``_compat.torch_cpu_view``; a tensor that torch keeps negated lazily, as ``z.conj().imag``, through a negated
    copy: its memory does not hold its values)."""
    if not is_torch_array(a):
        return a
    return torch_cpu_view(a.resolve_neg() if a.is_neg() else a)


def _like(result: np.ndarray, like):
    """result as the caller's kind of array: a torch tensor sharing its memory, or itself."""
    if is_torch_array(like):
        import torch

        return torch.from_numpy(result)
    return result


def _rows(a):
    """A (rows, T) view or copy of a (..., T) array."""
    return a if a.ndim == 2 else a.reshape((math.prod(a.shape[:-1]), a.shape[-1]))  # np.reshape's dispatch: 0.3 us


def _steps(p, shape, kernel) -> tuple:
    """``kernel``'s per-step arguments (``STEPS``): ``next_values`` and ``mask`` None or a (rows, T) array;
    ``terminated`` and ``truncated`` a (rows, T) bool array, or ``absent_flag(kernel, T)`` where not given; each
    coefficient a float or a read-only (rows, T) array (``frozen``: a broadcast coefficient and a whole one are one
    type to the kernels)."""
    full = p.rewards.shape
    absent = absent_flag(kernel, shape[-1])

    def laid_out(name):
        value = getattr(p, name)
        if value is None:
            return absent if name in ("terminated", "truncated") else None
        if isinstance(value, float):
            return value
        value = _host(value)
        if value.shape != full:  # a per-row coefficient, (..., 1): broadcast (1-2 us) only then
            value = np.broadcast_to(value, full)
        value = value if value.shape == shape else _rows(value).reshape(shape)
        return frozen(value) if name in COEFFICIENTS else value

    return tuple(laid_out(name) for name in STEPS)


@functools.lru_cache(maxsize=16)
def absent_flag(kernel, length: int):
    """An absent ``terminated`` or ``truncated`` as ``kernel`` takes it: None for the constant-discount driver
    (which is chosen only when no flag is given: one type whatever the call, nothing to unbox), else
    ``no_flags(length)``."""
    return None if kernel is _kernels().constant_units else no_flags(length)


def no_flags(length: int) -> np.ndarray:
    """An absent ``terminated`` or ``truncated`` as the kernels take it: one all-False (1, T) row that stands for
    every row (the kernels read its row 0 for every row). It is writable, as the flags callers give mostly are
    (numba compiles a kernel of its own for read-only arrays); nothing writes it."""
    return np.zeros((1, length), dtype=bool)


def frozen(a: np.ndarray) -> np.ndarray:
    """A read-only view of ``a`` (``a`` itself when it is read-only already): the kernels' arrays that may come
    either way (broadcast coefficients, a caller's bootstrap values) then always have the one numba type."""
    if a.flags.writeable:
        a = a.view()
        a.flags.writeable = False
    return a


def _bounds(p, shape) -> tuple:
    """(bootstrap, carry, offsets): the per-segment boundary values as (rows, n) float64 (carry None when absent),
    the offsets as int64 (``[0, T]`` without them: the row is one segment)."""
    offsets = _offsets(p, shape[-1])

    def per_segment(value):  # (..., n) in the compute dtype
        return frozen(np.ascontiguousarray(_rows(_host(value)), dtype=np.float64))

    return per_segment(p.bootstrap), None if p.carry is None else per_segment(p.carry), offsets


def _driver(p):
    """The kernel driver that solves ``p``'s work units: for rows shorter than a window, the walk alone (the window
    kernels would walk them too, so the numbers are theirs; only its code is compiled); for longer ones the leaner
    constant-discount kernel for a row that is one segment with float coefficients and no per-step arrays, the
    general one otherwise."""
    kernels = _kernels()
    if p.rewards.shape[-1] < kernels.WINDOW:
        return kernels.walk_units
    if p.offsets is None and set(p.steps()) == {"rewards", "values"}:
        return kernels.constant_units
    return kernels.general_units


def _offsets(p, length: int) -> np.ndarray:
    """The segments' offsets as a read-only int64 host array: ``[0, T]`` when the row is one segment."""
    return _whole_row(length) if p.offsets is None else _read_only(p.host_offsets)


@functools.lru_cache(maxsize=64)
def _whole_row(length: int) -> np.ndarray:
    """The offsets ``[0, T]`` of a row that is one segment (shared between calls)."""
    return _read_only(np.array([0, length]))


def _read_only(offsets) -> np.ndarray:
    """Offsets as a read-only int64 array (one type for the kernels, whoever owns the array)."""
    return frozen(np.ascontiguousarray(offsets, dtype=np.int64))


def _spans(n_rows: int, offsets: np.ndarray, threads: int) -> np.ndarray:
    """Where each row is split into work units, as segment indices ``0 = s_0 < ... < s_k = n``: the whole row
    (``[0, n]``), or, shared between threads with fewer rows than threads' worth of work, runs of whole segments
    of about equal length (nothing crosses a segment's end). The kernels run every (row, run) once."""
    count = offsets.shape[0] - 1
    if threads < 2 or count == 1:
        return np.array([0, count], dtype=np.int64)
    runs = min(count, -(-4 * threads // max(n_rows, 1)))
    targets = np.linspace(0, offsets[-1], runs + 1)[1:-1]
    return np.unique(np.concatenate([[0, count], np.searchsorted(offsets, targets)])).astype(np.int64)


@functools.cache
def _numba_installed() -> bool:
    return importlib.util.find_spec("numba") is not None


@functools.cache
def _kernels():
    """The compiled kernels (numba is imported here, on first use)."""
    return importlib.import_module("gae_xp.backends._numba_kernels")


def _threads() -> int:
    """numba's thread count for this thread (``numba.set_num_threads``; before numba's pool has started,
    ``NUMBA_NUM_THREADS``, so that asking starts nothing). Calls share their work between that many threads."""
    import numba

    try:
        numba.threading_layer()
    except ValueError:  # no pool started: numba.get_num_threads() would start one
        return numba.config.NUMBA_NUM_THREADS
    return numba.get_num_threads()


BACKEND = NumbaCPUBackend()
