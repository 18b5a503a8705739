"""CUDA arrays (CuPy, PyTorch): the carry between chunks and the fix-up in numba-CUDA kernels.

The local scans and the fix-up stay in the array library (``gae_xp._scan``'s
chunk scan); step 2, the carry between pieces, is one kernel launch per scan
whatever T/C is: one block per row solves ``carry_c = edge_c + P_c
carry_{c-+1}`` over the row's n pieces: every thread composes a segment of
pieces serially, the block combines the segments with a Hillis-Steele scan in
shared memory (``(b1, p1) o (b2, p2) = (b1 + p1 b2, p1 p2)``, with ``p1 = 0``
giving b1 exactly), and every thread rescans its segment with the carry
coming into it. GPU arrays are never read on the host, so the scan takes its
exact route (non-finite values handled with ``where``). Arrays are taken zero-copy through
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

from gae_xp._compat import is_cupy_array, is_jax_array, is_numpy_array, is_torch_array
from gae_xp._recurrences import gae_on_scan
from gae_xp._scan import scan

NAME = "numba-cuda"


def simulated() -> bool:
    """True when numba's CUDA simulator is on (read from the environment, as numba does at import)."""
    return os.environ.get("NUMBA_ENABLE_CUDASIM", "0") == "1"


class NumbaCUDABackend:
    name = NAME

    def unavailable_reason(self, xp, arrays, *, forced=False):
        if simulated():
            if not forced:
                return "the CUDA simulator serves only backend='numba-cuda', never 'auto'"
            if not all(is_numpy_array(a) for a in arrays):
                return "under NUMBA_ENABLE_CUDASIM=1 the kernels take NumPy arrays"
        else:
            if any(is_jax_array(a) for a in arrays):
                return "JAX arrays are immutable and the kernels write in place: the 'xp' path serves them"
            if not all(hasattr(a, "__cuda_array_interface__") for a in arrays):
                return "the numba-CUDA kernels take CUDA arrays (CuPy arrays, torch CUDA tensors)"
            if any(getattr(a, "requires_grad", False) for a in arrays):
                return "tensors that require grad need backend='xp' (the kernels have no autograd formula)"
        if importlib.util.find_spec("numba") is None or importlib.util.find_spec("numba.cuda") is None:
            return "numba-cuda is not installed (pip install 'gae_xp[cuda12]' or 'gae_xp[cuda13]')"
        if not simulated():
            from numba import cuda

            if not cuda.is_available():
                return "numba-cuda finds no usable CUDA driver or GPU"
        return None

    def scan(self, xp, x, a, *, reverse, chunk_size):
        """The chunk scan of ``gae_xp._scan`` with step 2, the carry between pieces, in one kernel launch."""
        def carry(edges, products):
            edges = xp.reshape(edges, edges.shape, copy=True)
            products = xp.reshape(xp.broadcast_to(xp.asarray(products, dtype=edges.dtype), edges.shape),
                                  edges.shape, copy=True)
            rows = (-1, edges.shape[-1])
            flat_edges, flat_products = xp.reshape(edges, rows), xp.reshape(products, rows)
            carries = xp.empty_like(flat_edges)
            if flat_edges.shape[0]:
                kernels = _kernels()
                kernels.carry[flat_edges.shape[0], kernels.CARRY_THREADS, _current_stream(edges)](
                    _device(flat_edges), _device(flat_products), _device(carries), reverse)
            return xp.reshape(carries, edges.shape)

        return scan(xp, x, a, reverse=reverse, chunk_size=chunk_size, carry=carry)

    def gae(self, problem, *, chunk_size):
        return gae_on_scan(problem, chunk_size=chunk_size, solve=self.scan)


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
