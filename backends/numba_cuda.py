"""CUDA arrays (CuPy, PyTorch): the carry between chunks and the fix-up in numba-CUDA kernels.

The local scans stay in the array library (``gae_xp._scan``'s doubling scan on
the (..., C, n) chunk layout: a fixed number of whole-array operations). Then,
per scan, two kernels finish the job, whatever T/C is:

1. ``carry``: one block per row solves ``carry_c = edge_c + P_c carry_{c-+1}``
   over the row's n chunks: every thread composes a segment of chunks
   serially, the block combines the segments with a Hillis-Steele scan in
   shared memory (``(b1, p1) o (b2, p2) = (b1 + p1 b2, p1 p2)``), and every
   thread rescans its segment with the carry coming into it;
2. ``fixup``: every element takes its neighbouring chunk's carry,
   ``y = local + decay * carry_{c-+1}``, in place.

The local scan is the doubling scan even for a constant discount: unlike a
matmul with a triangular kernel, it lets a NaN travel only in the
recurrence's direction without a finiteness check that would read a value
back to the host. Arrays are taken zero-copy through
``__cuda_array_interface__``; kernels run on the caller's current stream
(CuPy's or torch's), with no device-wide synchronize and no copy to the host.

With ``NUMBA_ENABLE_CUDASIM=1`` (set before numba is imported) the same
kernels run in numba's CUDA simulator on NumPy arrays, which is how they are
tested on machines without a GPU. The simulator has no external streams, so
the stream hand-off is skipped there.
"""

from __future__ import annotations

import importlib.util
import os

from array_api_compat import device as device_of
from array_api_compat import is_cupy_array, is_jax_array, is_numpy_array, is_torch_array

from gae_xp import _owned as owned
from gae_xp._gae import gae_on_scan
from gae_xp._scan import _across, _doubling, _from_chunks, choose_chunk_size

NAME = "numba-cuda"
FIXUP_THREADS = 256


def simulated() -> bool:
    """True when numba's CUDA simulator is on (read from the environment, as numba does at import)."""
    return os.environ.get("NUMBA_ENABLE_CUDASIM", "0") == "1"


class NumbaCUDABackend:
    name = NAME

    def unavailable_reason(self, xp, arrays, *, forced=False):
        if importlib.util.find_spec("numba") is None or importlib.util.find_spec("numba.cuda") is None:
            return "numba-cuda is not installed (pip install 'gae_xp[cuda12]' or 'gae_xp[cuda13]')"
        if simulated():
            if not forced:
                return "the CUDA simulator serves only backend='numba-cuda', never 'auto'"
            if not all(is_numpy_array(a) for a in arrays):
                return "under NUMBA_ENABLE_CUDASIM=1 the kernels take NumPy arrays"
            return None
        if any(is_jax_array(a) for a in arrays):
            return "JAX arrays are immutable and the kernels write in place: the 'xp' path serves them"
        if not all(hasattr(a, "__cuda_array_interface__") for a in arrays):
            return "the numba-CUDA kernels take CUDA arrays (CuPy arrays, torch CUDA tensors)"
        if any(getattr(a, "requires_grad", False) for a in arrays):
            return "tensors that require grad need backend='xp' (the kernels have no autograd formula)"
        from numba import cuda

        if not cuda.is_available():
            return "numba-cuda finds no usable CUDA driver or GPU"
        return None

    def scan(self, xp, x, a, *, reverse, chunk_size, overwrite_x=False):
        length = x.shape[-1]
        if length == 0:
            return xp.zeros_like(x)
        if isinstance(a, float):
            a = xp.full(x.shape, a, dtype=x.dtype, device=device_of(x))
        else:
            a = xp.broadcast_to(a, x.shape)
        size = max(2, min(chunk_size or choose_chunk_size(length, "doubling"), length))
        local, decay = _doubling(xp, _across(xp, x, size), _across(xp, a, size), reverse, fresh=True)
        edge = 0 if reverse else size - 1
        batch = local.shape[:-2]
        rows = (-1, size, local.shape[-1])
        local3, decay3 = xp.reshape(local, rows), xp.reshape(decay, rows)
        if not owned.writable(local3):
            raise ValueError("the numba-CUDA kernels need a writable array library (CuPy, PyTorch)")
        edges = _contiguous(xp, local3[:, edge, :])
        products = _contiguous(xp, decay3[:, edge, :])
        carries = xp.empty_like(edges)
        kernels = _kernels()
        stream = _current_stream(x)
        n_rows = edges.shape[0]
        if n_rows:
            kernels.carry[n_rows, kernels.CARRY_THREADS, stream](
                _device(edges), _device(products), _device(carries), reverse)
            total = n_rows * size * local.shape[-1]
            blocks = min(max(1, -(-total // FIXUP_THREADS)), 65535)
            kernels.fixup[blocks, FIXUP_THREADS, stream](_device(local3), _device(decay3), _device(carries), reverse)
        fixed = xp.reshape(local3, (*batch, size, local.shape[-1]))
        return _from_chunks(xp, xp.matrix_transpose(fixed), length)

    def gae(self, problem, *, chunk_size):
        return gae_on_scan(problem, chunk_size=chunk_size, solve=self.scan)


def _contiguous(xp, view):
    return xp.reshape(view, view.shape, copy=True)


def _device(array):
    """A numba device array on the same memory (zero-copy), or the NumPy array itself under the simulator."""
    if simulated():
        return array
    from numba import cuda

    return cuda.as_cuda_array(array)


def _current_stream(array):
    """The caller's current stream as a numba stream: CuPy's or torch's; 0 (default) under the simulator."""
    if simulated():
        return 0
    from numba import cuda

    if is_cupy_array(array):
        import cupy

        return cuda.external_stream(cupy.cuda.get_current_stream().ptr)
    if is_torch_array(array):
        import torch

        return cuda.external_stream(torch.cuda.current_stream(array.device).cuda_stream)
    return cuda.default_stream()


def _kernels():
    """The compiled kernels (numba is imported here, on first use)."""
    from gae_xp.backends import _cuda_kernels

    return _cuda_kernels


BACKEND = NumbaCUDABackend()
