"""CuPy arrays on the Triton route: torch tensors over the same memory (DLPack), launched on CuPy's current stream.

The Triton kernels and their host side take torch tensors. A CuPy call is
handed to them as ``torch.from_dlpack`` of each array, a tensor over the same
device memory (no copy). Torch's current stream is set, for the whole call
(the arrays' exchange included), to the stream CuPy has current on the
arrays' device (``torch.cuda.ExternalStream``; CuPy's null stream is torch's
default stream, the same legacy stream): the exchange finds both libraries on
one stream and orders nothing, and the kernels queue behind the caller's work
on it, with no synchronisation. The outputs go back to CuPy through DLPack
(no copy), exported as on that one stream: torch refuses to export to CuPy's
per-thread default stream by name, which needs no ordering here either.
Their memory stays in torch's caching allocator, which reuses it once CuPy
drops them (CuPy's pool cannot free it; ``torch.cuda.empty_cache`` returns
it to the device).

Inside a CUDA-graph capture that CuPy began, a call through torch views is
refused (``CAPTURE_REFUSED``): torch's allocator does not know of that
capture, so the call's temporaries would be freed, and reused, while the
graph still reads them; a repeated ``gae()`` call launches on the arrays'
addresses instead (``_triton_cupy_plan``), which a capture can hold.

Arrays served: CuPy arrays in device memory. Managed memory (DLPack's
``kDLCUDAManaged``, which torch does not import) takes the numba-CUDA route;
an array with a negative stride (torch has none) is copied first, on CuPy's
stream.

Torch is imported only where the caller allows it: ``backend="triton"``
imports it; ``auto`` takes this route for CuPy arrays only where torch is
imported already (a process that imports both), else the numba-CUDA route.
Like every choice of ``auto``, that one is made at a kind of call's first call
(``gae_xp.backends.select``).

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

    @classmethod
    def on_stream(cls, array):
        """A context in which torch's current stream is CuPy's current stream on ``array``'s device; a RuntimeError
        where that stream is capturing a CUDA graph (``CAPTURE_REFUSED``)."""
        stream = cls.stream_of(array)
        if stream.is_capturing():
            raise RuntimeError(CAPTURE_REFUSED)
        return cls.torch_stream(stream, array)

    @staticmethod
    def stream_of(array):
        """CuPy's current stream on ``array``'s device."""
        import cupy

        with cupy.cuda.Device(array.device.id):
            return cupy.cuda.get_current_stream()

    @staticmethod
    def torch_stream(stream, array):
        """torch's stream context of CuPy's ``stream`` on ``array``'s device."""
        import torch

        return torch.cuda.stream(_torch_stream(stream.ptr, array.device.id))

    @staticmethod
    def from_dlpack(exported):
        import cupy

        return cupy.from_dlpack(exported)

    @staticmethod
    def contiguous(array):
        import cupy

        return cupy.ascontiguousarray(array)

    @staticmethod
    def in_device_memory(array) -> bool:
        """True for an array in device memory (DLPack's kDLCUDA), False for managed memory (an empty array holds
        none: True)."""
        return memory_kind(array) == _KDL_CUDA

    @classmethod
    def to_torch(cls, array):
        """A tensor over ``array``'s memory; an array with a negative stride (torch has none) is copied first."""
        import torch

        if not cls.in_device_memory(array):  # one that auto's choice never saw: made for the call by CuPy's allocator
            raise TypeError("the Triton kernels take CuPy arrays in device memory, not managed memory: "
                            "backend='numba-cuda' takes these arrays")
        if any(stride < 0 for stride in array.strides):
            array = cls.contiguous(array)
        return torch.from_dlpack(array)

    @classmethod
    def from_torch(cls, tensor):
        """An array of the caller's library over ``tensor``'s memory (made on the stream both are on)."""
        return cls.from_dlpack(_OnThisStream(tensor))

    # what a plan's launch on the arrays' pointers asks (``_triton_cupy_plan``)

    @staticmethod
    def pointer(array) -> int:
        """The device address of ``array``'s first element."""
        return array.data.ptr

    @staticmethod
    def empty(shape: tuple, dtype):
        """A new array on the current device, from CuPy's memory pool (on the current stream)."""
        import cupy

        return cupy.empty(shape, dtype)

    @staticmethod
    def full(value: float, dtype):
        """A new one-element array holding ``value``, filled on the current stream."""
        import cupy

        return cupy.full((1,), value, dtype)

    @staticmethod
    def device_index(array) -> int:
        return array.device.id

    @staticmethod
    def current_device() -> int:
        import cupy

        return cupy.cuda.runtime.getDevice()

    @staticmethod
    def on_device(index: int):
        """A context in which device ``index`` is current."""
        import cupy

        return cupy.cuda.Device(index)

    @staticmethod
    def current_stream():
        """CuPy's current stream on the current device (its ``ptr``, and ``is_capturing()``)."""
        import cupy

        return cupy.cuda.get_current_stream()


CALLER = CuPy
_KDL_CUDA = 2
#: Why a call through torch views is refused inside a CUDA-graph capture that CuPy began: torch's allocator does not
#: know of that capture, so the call's temporaries would be freed (and reused) while the graph still reads them.
CAPTURE_REFUSED = (
    "gae_xp: CuPy arrays reach the Triton kernels through torch views here, whose temporaries a CUDA-graph capture "
    "begun by CuPy does not keep: call gae() on arrays of this layout (shapes, strides, dtypes, options) twice before "
    "the capture, in the direct launch mode (GAE_XP_TRITON_LAUNCH unset or 'direct'), so that a plan launches it on "
    "the arrays' addresses; the other estimators, and calls no plan serves, are captured on torch tensors "
    "(torch.cuda.graph)")


class _OnThisStream:
    """A torch tensor offered to a DLPack consumer on the producer's own current stream: exported without a stream
    (nothing to order: ``solve`` runs both libraries on one stream), whichever stream the consumer names."""

    def __init__(self, tensor):
        self.tensor = tensor

    def __dlpack__(self, *, stream=None, **options):
        return self.tensor.__dlpack__(stream=-1, **options)  # -1: no synchronisation (torch's default varied)

    def __dlpack_device__(self):
        return self.tensor.__dlpack_device__()


@functools.lru_cache(maxsize=64)
def _torch_stream(pointer: int, device: int):
    import torch

    if pointer == 0:  # CuPy's null stream is the legacy default stream, torch's default stream too
        return torch.cuda.default_stream(device)
    return torch.cuda.ExternalStream(pointer, device=torch.device("cuda", device))


def memory_kind(array) -> int:
    """DLPack's device type of a CuPy array's memory: kDLCUDA (2), or kDLCUDAManaged (13) for managed memory (an
    empty array, whose pointer may be null: kDLCUDA)."""
    return _KDL_CUDA if array.size == 0 else array.__dlpack_device__()[0]


def serves(arrays) -> bool:
    """True when every array is the caller library's (CuPy's)."""
    return bool(arrays) and all(CALLER.is_array(a) for a in arrays)


def unavailable_reason(arrays, *, forced: bool, interpreted: bool) -> str | None:
    """None when this route can take these CuPy arrays now, else why not (one line); ``interpreted``: Triton's
    interpreter is on (it runs kernels on CPU tensors only)."""
    if interpreted and CALLER is CuPy:
        return "under TRITON_INTERPRET=1 the kernels take torch CPU tensors, not CuPy arrays"
    if not all(CALLER.in_device_memory(a) for a in arrays):
        return "the Triton kernels take CuPy arrays in device memory (torch imports no managed memory)"
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
    with CALLER.on_stream(problem.rewards):
        tensors = problem.map_steps(lambda name, array: CALLER.to_torch(array))
        tensors = tensors.replace(xp=array_namespace(tensors.rewards), bootstrap=_to_torch(problem.bootstrap),
                                  carry=_to_torch(problem.carry), offsets=_to_torch(problem.offsets))
        return _to_caller(method(tensors, *args, **kwargs))


def scan(method, x, a):
    """``method(x, a)`` (the backend's scan) on torch views of CuPy's ``x`` and ``a`` (an array or a float), on
    CuPy's current stream; the result as a CuPy array."""
    with CALLER.on_stream(x):
        return _to_caller(method(CALLER.to_torch(x), _to_torch(a)))


def _to_torch(value):
    return CALLER.to_torch(value) if CALLER.is_array(value) else value


def _to_caller(result):
    if isinstance(result, tuple):
        return tuple(_to_caller(part) for part in result)
    return None if result is None else CALLER.from_torch(result)
