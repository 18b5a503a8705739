"""CuPy arrays on the Triton route: torch tensors over the same memory (DLPack), launched on CuPy's current stream.

The Triton kernels and their host side take torch tensors. A CuPy call is
handed to them as ``torch.from_dlpack`` of each array, a tensor over the same
device memory (no copy); torch's current stream is set, for the call, to the
stream CuPy has current on the arrays' device (``torch.cuda.ExternalStream``),
so the kernels queue behind the caller's work on that stream, with no
synchronisation; the outputs go back as ``cupy.from_dlpack`` of torch's
(no copy), taken on that same stream. Their memory stays in torch's caching
allocator, which reuses it once CuPy drops them.

Torch is imported only where the caller allows it: ``backend="triton"``
imports it; ``auto`` takes this route for CuPy arrays only where torch is
imported already (a process that imports both), else the numba-CUDA route.

``CALLER`` is the caller's library (CuPy); the tests put a NumPy stand-in in
its place to run this module under Triton's interpreter on a CPU.
"""

from __future__ import annotations

import functools
import sys

from gae_xp._compat import array_namespace, is_cupy_array


class CuPy:
    """What this route asks of CuPy: its arrays, its current stream, and how arrays pass between it and torch."""

    is_array = staticmethod(is_cupy_array)

    @staticmethod
    def stream(array):
        """The torch stream for ``array``'s device that is CuPy's current stream there."""
        import cupy

        device = array.device.id
        with cupy.cuda.Device(device):
            pointer = cupy.cuda.get_current_stream().ptr
        return _torch_stream(pointer, device)

    @staticmethod
    def from_torch(tensor):
        import cupy

        return cupy.from_dlpack(tensor)

    @staticmethod
    def contiguous(array):
        import cupy

        return cupy.ascontiguousarray(array)

    @classmethod
    def to_torch(cls, array):
        """A tensor over ``array``'s memory; an array with a negative stride (torch has none) is copied first."""
        import torch

        if any(stride < 0 for stride in array.strides):
            array = cls.contiguous(array)
        return torch.from_dlpack(array)


CALLER = CuPy


@functools.lru_cache(maxsize=64)
def _torch_stream(pointer: int, device: int):
    import torch

    if pointer == 0:  # CuPy's null stream is the legacy default stream, torch's default stream too
        return torch.cuda.default_stream(device)
    return torch.cuda.ExternalStream(pointer, device=torch.device("cuda", device))


def serves(arrays) -> bool:
    """True when every array is the caller library's (CuPy's)."""
    return bool(arrays) and all(CALLER.is_array(a) for a in arrays)


def unavailable_reason(*, forced: bool, interpreted: bool) -> str | None:
    """None when this route can take CuPy arrays now, else why not (one line); ``interpreted``: Triton's interpreter
    is on (it runs kernels on CPU tensors only)."""
    if interpreted and CALLER is CuPy:
        return "under TRITON_INTERPRET=1 the kernels take torch CPU tensors, not CuPy arrays"
    if not forced and "torch" not in sys.modules:
        return ("CuPy arrays reach the Triton kernels through torch: 'auto' takes that route where torch is imported "
                "already, backend='triton' imports it")
    try:
        import torch
    except ImportError:
        return "CuPy arrays reach the Triton kernels through torch, which is not installed"
    if CALLER is CuPy and not torch.cuda.is_available():
        return "CuPy arrays reach the Triton kernels through torch, whose build here has no CUDA"
    return None


def solve(method, problem, *args, **kwargs):
    """``method(problem, *args, **kwargs)`` (a Triton backend's solver) on ``problem``'s arrays as torch tensors, on
    CuPy's current stream; its array results as CuPy arrays (a tuple's too, None kept)."""
    import torch

    tensors = problem.map_steps(lambda name, array: CALLER.to_torch(array))
    tensors = tensors.replace(xp=array_namespace(tensors.rewards), bootstrap=_to_torch(problem.bootstrap),
                              carry=_to_torch(problem.carry), offsets=_to_torch(problem.offsets))
    with torch.cuda.stream(CALLER.stream(problem.rewards)):
        return _to_caller(method(tensors, *args, **kwargs))


def scan(method, x, a):
    """``method(x, a)`` (the backend's scan) on torch views of CuPy's ``x`` and ``a`` (an array or a float), on
    CuPy's current stream; the result as a CuPy array."""
    import torch

    with torch.cuda.stream(CALLER.stream(x)):
        return _to_caller(method(CALLER.to_torch(x), _to_torch(a)))


def _to_torch(value):
    return CALLER.to_torch(value) if CALLER.is_array(value) else value


def _to_caller(result):
    if isinstance(result, tuple):
        return tuple(_to_caller(part) for part in result)
    return None if result is None else CALLER.from_torch(result)
