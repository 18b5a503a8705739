"""CUDA arrays (CuPy, PyTorch): GAE and the scan primitive in fused numba-CUDA kernels.

``gae()`` takes at most three launches whatever the options (see
``_cuda_kernels``): (1) per tile of a row, delta and the coefficients in
registers and the tile's map written out; (2) per row, the carries between
tiles; (3) per tile again, the rescan from the carry and the outputs. A row of
one tile takes launch 3 alone. "V at the next real step" under a mask, the
bootstrap value and ``next_values`` are handled inside the same launches (the
value carry is a second, tiny summary per tile). Nothing of the size of the
inputs is allocated besides the two outputs; the summaries and carries are a
few numbers per tile. ``scan()`` (``discounted_cumsum`` and the estimators
built on it) uses the same three launches for ``y_t = x_t + a_t y_{t-+1}``.

* Data: float16, float32 or float64 arrays, computed in float32 (float16,
  float32) or float64, outputs in the problem's dtype. (bfloat16 has no CUDA
  array interface typestr: the array library widens it to float32 first.)
  Strided and broadcast (stride-0) inputs are read in place: an input is
  flattened to (rows, T) by ``reshape``, which copies only when its batch axes
  cannot be merged into one stride. Time-major layouts (T, B) are correct but
  read at a fraction of the bandwidth (a warp's loads span rows).
* Arrays are taken zero-copy through ``__cuda_array_interface__`` without
  synchronizing the stream they name; kernels run on the caller's current
  stream (CuPy's or torch's), on the arrays' device; no host synchronization,
  no copy to the host. Outputs and summaries come from the array library's
  allocator.
* Kernels are compiled on first use per (dtype, structure) with explicit
  signatures and cached on disk (``cache=True``): a process pays the
  compilation once per option set, later processes load it.
* ``chunk_size`` has no effect here: a tile is ``ITEMS`` steps per thread.

With ``NUMBA_ENABLE_CUDASIM=1`` (set before numba is imported) the same
kernels run in numba's CUDA simulator on NumPy arrays, which is how they are
tested on machines without a GPU; the simulator has no external streams, so
the stream hand-off is skipped there.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import math
import os

import numpy as np

from gae_xp._compat import device_of, is_cupy_array, is_jax_array, is_numpy_array, is_torch_array

NAME = "numba-cuda"


@functools.cache
def _not_installed() -> str | None:
    if importlib.util.find_spec("numba") is None or importlib.util.find_spec("numba.cuda") is None:
        return "numba-cuda is not installed (pip install 'gae_xp[cuda12]' or 'gae_xp[cuda13]')"
    return None


def simulated() -> bool:
    """True when numba's CUDA simulator is on (read from the environment, as numba does at import)."""
    return os.environ.get("NUMBA_ENABLE_CUDASIM", "0") == "1"


class NumbaCUDABackend:
    name = NAME
    segments = False
    uses_chunk_size = False
    critic_lam = False
    summarize = None

    def unavailable_reason(self, xp, arrays, *, forced=False):
        # The arrays are asked first, numba last: NumPy or array-api-strict arrays never make numba load.
        if simulated():
            if not forced:
                return "the CUDA simulator serves only backend='numba-cuda', never 'auto'"
            if not all(is_numpy_array(a) for a in arrays):
                return "under NUMBA_ENABLE_CUDASIM=1 the kernels take NumPy arrays"
            return _not_installed()
        if any(is_jax_array(a) for a in arrays):
            return "JAX arrays are not served by the numba-CUDA kernels: the 'xp' path serves them"
        if not all(hasattr(a, "__cuda_array_interface__") for a in arrays):
            return "the numba-CUDA kernels take CUDA arrays (CuPy arrays, torch CUDA tensors)"
        if any(getattr(a, "requires_grad", False) for a in arrays):
            return "tensors that require grad need backend='xp' (the kernels have no autograd formula)"
        if any(_dtype_name(a.dtype) == "bfloat16" for a in arrays):
            return "bfloat16 has no CUDA array interface: widen it to float32 or use backend='xp'"
        if _not_installed():
            return _not_installed()
        from numba import cuda

        if not cuda.is_available():
            return "numba-cuda finds no usable CUDA driver or GPU"
        return None

    def scan(self, xp, x, a, *, reverse, chunk_size):
        """``y_t = x_t + a_t y_{t+1}`` (reverse) or ``y_{t-1}`` (forward) along the last axis; x is never written."""
        shape, length = tuple(x.shape), x.shape[-1]
        io = _dtype_name(x.dtype)
        y = xp.empty(shape, dtype=x.dtype, device=device_of(x))
        rows = math.prod(shape[:-1])
        if length == 0 or rows == 0:
            return y
        per_step = not isinstance(a, float)
        coefficient = _rows(xp, xp.broadcast_to(_cast(xp, a, x.dtype), shape)) if per_step else _rows(xp, x)
        threads, n_tiles = _tiling(length)
        summary, carry = _scratch(xp, x, io, 2, 1, rows, n_tiles)
        kernels = _scan_kernels(io, reverse)
        with _Launch(x) as launch:
            summary, carry = launch.array(summary, written=True), launch.array(carry, written=True)
            args = (launch.array(_rows(xp, x)), launch.array(coefficient), _scalar(0.0 if per_step else a, io),
                    np.int32(per_step), np.int64(n_tiles), summary, carry,
                    launch.array(xp.reshape(y, (rows, length)), written=True))
            if n_tiles > 1:
                launch(kernels.summary, rows * n_tiles, threads, *args)
                unread = launch.array(_rows(xp, x)[:, 0])  # the bootstrap argument: no value carry in a scan
                launch(kernels.carry, rows, _carry_threads(n_tiles), summary, unread, carry)
            launch(kernels.final, rows * n_tiles, threads, *args)
        return y

    def gae(self, problem, *, chunk_size):
        """(advantages, returns) of a prepared problem (duck-typed: see ``gae_xp`` GaeProblem), in its dtype."""
        xp, r = problem.xp, problem.rewards
        shape, length = tuple(r.shape), r.shape[-1]
        io = _dtype_name(r.dtype)
        advantages = xp.empty(shape, dtype=r.dtype, device=device_of(r))
        returns = xp.empty(shape, dtype=r.dtype, device=device_of(r))
        rows = math.prod(shape[:-1])
        if length == 0 or rows == 0:
            return advantages, returns
        masked, with_next = problem.mask is not None, problem.next_values is not None
        values = problem.values
        if values is None:  # estimators without a value function: V = 0
            values = xp.broadcast_to(xp.zeros((1,) * len(shape), dtype=r.dtype, device=device_of(r)), shape)
        data = {name: _rows(xp, _cast(xp, array, r.dtype))
                for name, array in (("rewards", r), ("values", values), ("next_values", problem.next_values),
                                    ("gamma", _array_or_none(problem.gamma)), ("lam", _array_or_none(problem.lam)))
                if array is not None}
        flags = {name: _rows(xp, array) for name, array in (("terminated", problem.terminated),
                                                             ("truncated", problem.truncated),
                                                             ("mask", problem.mask)) if array is not None}
        options = _options(problem)
        bootstrap = xp.reshape(_cast(xp, problem.bootstrap, r.dtype), (rows,))
        threads, n_tiles = _tiling(length)
        summary, carry = _scratch(xp, r, io, _SUMMARY_ROWS[masked and not with_next],
                                  _CARRY_ROWS[masked and not with_next], rows, n_tiles)
        flag_stand_in = next(iter(flags.values()), None)
        if flag_stand_in is None:
            flag_stand_in = xp.empty((1, 1), dtype=xp.bool, device=device_of(r))
        kernels = _gae_kernels(io, masked, with_next)
        with _Launch(r) as launch:
            floats = [launch.array(data.get(name, data["rewards"]))
                      for name in ("rewards", "values", "next_values", "gamma", "lam")]
            bools = [launch.array(flags.get(name, flag_stand_in)) for name in ("terminated", "truncated", "mask")]
            summary, carry = launch.array(summary, written=True), launch.array(carry, written=True)
            outputs = [launch.array(xp.reshape(out, (rows, length)), written=True) for out in (advantages, returns)]
            args = (*floats, *bools, launch.array(bootstrap), _scalar(problem.gamma, io), _scalar(problem.lam, io),
                    np.int32(options), np.int64(n_tiles), summary, carry, *outputs)
            if n_tiles > 1:
                launch(kernels.summary, rows * n_tiles, threads, *args)
                launch(kernels.carry, rows, _carry_threads(n_tiles), summary, launch.array(bootstrap), carry)
            launch(kernels.final, rows * n_tiles, threads, *args)
        return advantages, returns


#: Rows of a tile's summary and carry (see ``_cuda_kernels.SUMMARY_ROWS``), keyed by "has the value carry";
#: repeated here so that the traffic model does not import numba.
_SUMMARY_ROWS = {True: 5, False: 2}
_CARRY_ROWS = {True: 2, False: 1}


def traffic(problem) -> dict[str, tuple[int, int]]:
    """Bytes that each launch of ``gae(problem)`` moves in device memory, from the kernels' code.

    ``{launch: (streamed, per_tile)}``, both read plus written: ``streamed``
    grows with the elements (every input read once per tile launch, 1 and 3,
    the two outputs written once by launch 3; a row of one tile has launch 3
    only); ``per_tile`` is a few numbers per tile: the tile's map (written by
    launch 1, read by launch 2), its carry (written by launch 2, read by
    launch 3), the bootstrap value and, without a mask and next_values, V at
    the first step of the next tile. An array counts the bytes it spans: a
    per-step gamma broadcast over rows counts one row. ``problem`` needs only
    shapes, dtypes and strides (NumPy arrays or stand-ins will do).
    """
    r = problem.rewards
    length, rows = r.shape[-1], math.prod(r.shape[:-1])
    item = r.dtype.itemsize
    compute = 8 if item == 8 else 4
    value_carry = problem.mask is not None and problem.next_values is None
    _, n_tiles = _tiling(length, threads=256, items=8)
    tiles = rows * n_tiles
    inputs = sum(_stored_bytes(a) for a in (r, problem.values, problem.next_values, _array_or_none(problem.gamma),
                                            _array_or_none(problem.lam), problem.terminated, problem.truncated,
                                            problem.mask) if a is not None)
    edge = 0 if problem.mask is not None or problem.next_values is not None else item
    per_tile = tiles * (item + edge)  # the bootstrap value and V at the next tile's first step
    summary, carry = tiles * _SUMMARY_ROWS[value_carry] * compute, tiles * _CARRY_ROWS[value_carry] * compute
    outputs = 2 * rows * length * item
    if n_tiles == 1:
        return {"final": (inputs + outputs, per_tile)}
    return {
        "summary": (inputs, per_tile + summary),
        "carry": (0, summary + carry + (rows * item if value_carry else 0)),
        "final": (inputs + outputs, per_tile + carry),
    }


def _stored_bytes(array) -> int:
    """Bytes an array's view spans (a broadcast axis, stride 0, counts once); numel * itemsize without strides."""
    item = array.dtype.itemsize
    strides = getattr(array, "strides", None)
    if strides is None or any(n == 0 for n in array.shape):
        return math.prod(array.shape) * item
    span = item + sum((n - 1) * abs(s) for n, s in zip(array.shape, strides))
    return min(span, math.prod(array.shape) * item)


def _tiling(length: int, threads: int | None = None, items: int | None = None) -> tuple[int, int]:
    """(threads per tile block, tiles per row): as many threads as the row needs, in warps, at most THREADS."""
    if threads is None or items is None:
        kernels = _kernels_module()
        threads, items, warp = kernels.THREADS, kernels.ITEMS, kernels.WARP
    else:
        warp = 32
    needed = -(-length // items)
    threads = min(threads, -(-needed // warp) * warp)
    return threads, -(-length // (threads * items))


def _carry_threads(n_tiles: int) -> int:
    kernels = _kernels_module()
    return min(kernels.CARRY_THREADS, -(-n_tiles // kernels.WARP) * kernels.WARP)


def _options(problem) -> int:
    k = _kernels_module()
    bits = ((problem.terminated is not None, k.TERMINATED), (problem.truncated is not None, k.TRUNCATED),
            (not isinstance(problem.gamma, float), k.GAMMA_STEPS), (not isinstance(problem.lam, float), k.LAM_STEPS),
            (bool(problem.fill_masked), k.FILL_MASKED))
    return sum(bit for present, bit in bits if present)


def _scalar(value, io: str):
    """A kernel's scalar argument, typed as its signature says (the compute dtype); 0 for an array's slot."""
    return (np.float64 if io == "float64" else np.float32)(value if isinstance(value, float) else 0.0)


def _array_or_none(value):
    return None if isinstance(value, float) else value


def _dtype_name(dtype) -> str:
    return str(dtype).rsplit(".", 1)[-1]


def _cast(xp, array, dtype):
    return array if array.dtype == dtype else xp.astype(array, dtype)


def _rows(xp, array):
    """A (rows, T) view of a (..., T) array (a copy only when its batch axes cannot be merged)."""
    return xp.reshape(array, (math.prod(array.shape[:-1]), array.shape[-1]))


def _scratch(xp, like, io: str, summary_rows: int, carry_rows: int, rows: int, n_tiles: int):
    """The tiles' maps and carries (a stand-in of one element each when a row is one tile)."""
    dtype = xp.float64 if io == "float64" else xp.float32
    shape_s, shape_c = ((summary_rows, rows, n_tiles), (carry_rows, rows, n_tiles)) if n_tiles > 1 else ((1, 1, 1),) * 2
    return (xp.empty(shape_s, dtype=dtype, device=device_of(like)),
            xp.empty(shape_c, dtype=dtype, device=device_of(like)))


class _Launch(contextlib.AbstractContextManager):
    """Launches on the arrays' device and the caller's current stream; arrays go to numba zero-copy."""

    def __init__(self, like):
        self._sim = simulated()
        self._like = like
        self._context = contextlib.nullcontext()
        self.stream = 0

    def __enter__(self):
        if not self._sim:
            from numba import cuda

            self._context = cuda.gpus[_device_index(self._like)]
            self._context.__enter__()
            self.stream = _current_stream(self._like)
        return self

    def __exit__(self, *exc):
        return self._context.__exit__(*exc)

    def array(self, array, *, written: bool = False):
        """A numba device array on the same memory, without synchronizing the stream it names.

        Under the simulator: the NumPy array itself if the kernels write it, else marked as input only (the
        simulator copies every other argument back, which a read-only broadcast view refuses). The simulator
        copies arguments in one piece, so a strided view is made contiguous there first (a broadcast stays).
        """
        from numba import cuda

        if not self._sim:
            return cuda.as_cuda_array(array, sync=False)
        if written:
            return array
        one_piece = 0 in array.strides or array.flags.c_contiguous or array.flags.f_contiguous
        return cuda.In(array if one_piece else array.copy())

    def __call__(self, kernel, blocks: int, threads: int, *args):
        if self._sim:
            kernel[blocks, threads](*args)
        else:
            kernel[blocks, threads, self.stream](*args)


def _device_index(array) -> int:
    if is_cupy_array(array):
        return array.device.id
    if is_torch_array(array):
        return array.device.index if array.device.index is not None else __import__("torch").cuda.current_device()
    return 0


def _current_stream(array):
    """The caller's current stream on the array's device, as a numba stream: CuPy's or torch's."""
    from numba import cuda

    if is_cupy_array(array):
        import cupy

        with array.device:
            return cuda.external_stream(cupy.cuda.get_current_stream().ptr)
    if is_torch_array(array):
        import torch

        return cuda.external_stream(torch.cuda.current_stream(array.device).cuda_stream)
    return cuda.default_stream()


def _kernels_module():
    """The kernels' module (numba is imported here, on first use)."""
    from gae_xp.backends import _cuda_kernels

    return _cuda_kernels


class _Kernels:
    def __init__(self, summary, carry, final):
        self.summary, self.carry, self.final = summary, carry, final


def _compile(spec):
    from numba import cuda

    return cuda.jit(spec.signature, cache=True)(spec.function)


@functools.lru_cache(maxsize=None)
def _gae_kernels(io: str, masked: bool, with_next: bool) -> _Kernels:
    k = _kernels_module()
    return _Kernels(_compile(k.gae_tile_kernel(io, final=False, masked=masked, with_next=with_next)),
                    _compile(k.carry_kernel(io, value_carry=masked and not with_next, reverse=True)),
                    _compile(k.gae_tile_kernel(io, final=True, masked=masked, with_next=with_next)))


@functools.lru_cache(maxsize=None)
def _scan_kernels(io: str, reverse: bool) -> _Kernels:
    k = _kernels_module()
    return _Kernels(_compile(k.scan_tile_kernel(io, final=False, reverse=reverse)),
                    _compile(k.carry_kernel(io, value_carry=False, reverse=reverse)),
                    _compile(k.scan_tile_kernel(io, final=True, reverse=reverse)))


BACKEND = NumbaCUDABackend()
