"""The one import point for array-api-compat, and the questions this package asks of an array.

Every module of the package takes these names from here, so that "is this
an array", "can its values be read now" and "does it live on a CPU" each
have one answer.
"""

from __future__ import annotations

import contextlib
import math
import numbers
import sys

import numpy as np
from array_api_compat import (
    array_namespace,
    is_array_api_obj,
    is_cupy_array,
    is_dask_array,
    is_dask_namespace,
    is_jax_array,
    is_jax_namespace,
    is_lazy_array,
    is_numpy_array,
    is_torch_array,
    is_torch_namespace,
)
from array_api_compat import device as device_of

__all__ = ["array_namespace", "device_of", "is_array", "is_cupy_array", "is_dask_array", "is_dask_namespace",
           "is_jax_array", "is_jax_namespace", "is_numpy_array", "is_torch_array", "is_torch_namespace", "add_at",
           "known_finite", "ieee_overflow_allowed", "owned_copy", "values_are_readable", "values_are_cheap_to_read",
           "on_cpu", "calling_thread_only", "isdtype", "is_extension_float", "torch_cpu_view"]


def is_array(value) -> bool:
    """True for an array of an array-API library; False for None, Python numbers and NumPy scalars."""
    if value is None or type(value) in _PLAIN_NUMBERS:
        return False
    if type(value) is np.ndarray:  # the common case, without the abstract-class checks below
        return True
    return not isinstance(value, numbers.Number) and is_array_api_obj(value)


_PLAIN_NUMBERS = (bool, int, float, complex)


def is_extension_float(dtype) -> bool:
    """True for a NumPy floating dtype that NumPy itself does not know: ml_dtypes' bfloat16, float8_*, ...
    (``np.isdtype`` refuses them; gae_xp computes them in float32, as torch's bfloat16)."""
    return (isinstance(dtype, np.dtype) and dtype.kind == "V"
            and getattr(dtype.type, "__module__", "").partition(".")[0] == "ml_dtypes"
            and dtype.name.startswith(("float", "bfloat")))


def isdtype(xp, dtype, kind) -> bool:
    """``xp.isdtype(dtype, kind)``, also answering for NumPy extension floats (``is_extension_float``): "real
    floating" and nothing else."""
    if is_extension_float(dtype):
        kinds = (kind,) if isinstance(kind, str) else tuple(kind)
        return "real floating" in kinds
    return xp.isdtype(dtype, kind)


def values_are_readable(x) -> bool:
    """True when x's values can be read now, so that a check may look at them.

    False under tracing or transformation (a JAX tracer, torch inside
    ``torch.compile`` or ``torch.func``), for meta tensors and for lazy
    arrays (Dask): only shapes are known there. Eager arrays of every
    library, JAX included, are readable.
    """
    if type(x) is np.ndarray:  # the common case, without the libraries' type checks
        return True
    if is_torch_array(x):
        return not _torch_is_symbolic(x)
    if is_jax_array(x):
        import jax

        return not isinstance(x, jax.core.Tracer)
    return not is_lazy_array(x)


def on_cpu(x) -> bool:
    """True when x lives in host memory (reading a value from it costs no device synchronisation)."""
    if is_torch_array(x):
        return x.device.type == "cpu"
    if is_jax_array(x):
        import jax

        if isinstance(x, jax.core.Tracer):  # where this trace will run
            return jax.default_backend() == "cpu"
        return all(d.platform == "cpu" for d in x.devices())
    return not is_cupy_array(x)


def values_are_cheap_to_read(x) -> bool:
    """True when a data-dependent choice may look at x: readable, and in host memory (no device sync)."""
    return values_are_readable(x) and on_cpu(x)


def known_finite(xp, x) -> bool:
    """True when x is in host memory, readable now, and holds no NaN or inf.

    One reduction, no temporary: a finite sum means finite entries (a sum
    that overflows only makes a caller take its exact route on finite data).
    """
    if not values_are_cheap_to_read(x):
        return False
    if getattr(x, "requires_grad", False):
        x = x.detach()
    with ieee_overflow_allowed(x):  # a sum that overflows is the answer "not known finite", not an error
        return math.isfinite(float(xp.sum(x)))


def ieee_overflow_allowed(x):
    """A context in which NumPy computes on x to IEEE's inf or NaN without a RuntimeWarning.

    Only for arithmetic whose inf or NaN is the intended result (a finiteness probe's sum, ``exp`` of a log
    ratio that a threshold clips next); NumPy's ``errstate`` for a NumPy array, nothing for other libraries
    (they do not warn).
    """
    if is_numpy_array(x):
        return np.errstate(over="ignore", invalid="ignore")
    return contextlib.nullcontext()


def to_device(xp, host: np.ndarray, like):
    """``host`` (a NumPy array) on ``like``'s device, without blocking the host.

    A torch CUDA tensor gets a copy from pinned memory with
    ``non_blocking=True`` (from pageable memory the copy would synchronise):
    the pinned buffer comes from torch's caching host allocator, which
    records the copy's stream and reuses the buffer only once the copy is
    done, so the buffer may be dropped here. Elsewhere ``xp.asarray``: no
    copy on the host, an asynchronous one for CuPy's current stream.
    """
    if _torch_cuda(like):
        torch = sys.modules["torch"]
        return torch.from_numpy(host).pin_memory().to(like.device, non_blocking=True)
    return xp.asarray(host, device=device_of(like))


def _torch_cuda(x) -> bool:
    """True for an eager torch tensor in CUDA memory (a traced one keeps ``xp.asarray``)."""
    return is_torch_array(x) and x.device.type == "cuda" and not _torch_is_symbolic(x)


def owned_copy(xp, x):
    """A new array with x's values that this package may overwrite (x itself is never written)."""
    return xp.astype(x, x.dtype, copy=True)


def torch_is_recorded(x) -> bool:
    """True when an operation on torch tensor ``x`` is recorded, not run: ``x`` is a fake tensor (``torch.compile``,
    ``torch.library.opcheck``, FakeTensorMode; a functional tensor over one included) or a Python dispatch mode
    (``make_fx``) records the operations. A kernel launched on it must go through the graph
    (``torch.library.wrap_triton``, or an opaque operator), never read its pointer."""
    torch = sys.modules["torch"]
    if torch._C._len_torch_dispatch_stack():  # a Python dispatch mode (FakeTensorMode, make_fx's) is on
        return True
    if type(x) is torch.Tensor:  # an eager call's tensor: fake and functional tensors are subclasses
        return False
    from torch._subclasses.fake_tensor import is_fake

    return is_fake(x)


def _torch_is_symbolic(x) -> bool:
    torch = sys.modules["torch"]
    if x.device.type == "meta" or torch.compiler.is_compiling():
        return True
    return torch._C._functorch.is_functorch_wrapped_tensor(x)


def carries_tangents(arrays) -> bool:
    """True when a torch tensor among ``arrays`` is a forward-mode dual tensor (``torch.autograd.forward_ad``):
    its tangent lives beside its values, so a kernel that reads the values alone would drop it. Two attribute reads
    outside a ``dual_level()`` block (none when torch was never imported)."""
    torch = sys.modules.get("torch")
    if torch is None or torch.autograd.forward_ad._current_level < 0:
        return False
    return any(is_torch_array(a) and has_tangent(a) for a in arrays)


def has_tangent(tensor) -> bool:
    """True for a torch tensor that is a forward-mode dual tensor (one attribute read outside ``dual_level()``)."""
    from torch.autograd import forward_ad

    return forward_ad._current_level >= 0 and forward_ad.unpack_dual(tensor).tangent is not None


def writes_through_views(x) -> bool:
    """Whether an in-place operation on a slice of x (an array of this package's own) writes into x.

    True for NumPy arrays and for eager PyTorch tensors without autograd
    history (not under ``torch.compile``, where an in-place update of a slice
    gave wrong values, nor ``torch.func``); the array API leaves it to each
    library, so others are not written.
    """
    return is_numpy_array(x) or (is_torch_array(x) and not x.requires_grad and not _torch_is_symbolic(x))


def add_at(x, index, y):
    """x with y added to ``x[index]``, for an array this package created (never an input).

    Written into x where the library allows it (NumPy, PyTorch, CuPy, ...),
    which spares a full-size copy; JAX gets a new array (``x.at[index].add``);
    a tensor that records autograd history is copied first, since its old
    values may be saved for the backward pass. array-api-extra's ``at`` does
    the same, but is not traceable by ``torch.compile(fullgraph=True)`` (its
    ``is_jax_array`` test of the index breaks the graph), so this is ours.
    """
    if is_jax_array(x):
        return x.at[index].add(y)
    if getattr(x, "requires_grad", False):
        x = x.clone()
    x[index] += y
    return x


def calling_thread_only(x):
    """A context in which PyTorch runs its operators on the calling thread alone, for an eager CPU tensor x.

    PyTorch hands every elementwise operator of more than 32768 elements and
    every matmul to its intra-op thread pool. The generic path runs hundreds
    of such operators of a few microseconds to a millisecond each; when a
    core is taken by other work, each hand-off waits for a pool thread that is
    not running, and the pool's threads spin between operators: 2-15x slower
    than one thread on a shared 2-core machine (``python -m gae_xp.bench.load``).
    Within the context the calling thread's pool has one thread (restored
    after); other threads keep their own settings (PyTorch keeps the count per
    thread), and results do not depend on it. Nothing changes for other
    libraries (NumPy's operators are single-threaded, and its matmuls are
    sized for one thread: ``gae_xp._scan.kernel_product``), for tensors on
    other devices, or while ``torch.compile`` traces.
    """
    if not is_torch_array(x) or x.device.type != "cpu":
        return contextlib.nullcontext()
    torch = sys.modules["torch"]
    if torch.compiler.is_compiling():
        return contextlib.nullcontext()
    return _OneTorchThread(torch)


class _OneTorchThread:
    __slots__ = ("torch", "before")

    def __init__(self, torch):
        self.torch = torch

    def __enter__(self):
        self.before = self.torch.get_num_threads()
        if self.before != 1:
            self.torch.set_num_threads(1)

    def __exit__(self, *exc):
        if self.before != 1:
            self.torch.set_num_threads(self.before)
        return False


def divide(xp, numerator, denominator):
    """``numerator / denominator``, NaN where both are 0 (what 0/0 gives), without NumPy's "invalid value" warning.

    The mean or variance of no entries (or the unbiased variance of one) is NaN, as in torch and the frameworks
    gae_xp restates; a NaN denominator gives that NaN without raising the floating-point flag.
    """
    undefined = (denominator == 0) & (numerator == 0)
    nan = xp.full((), math.nan, dtype=denominator.dtype, device=device_of(denominator))  # made there: no host copy
    return numerator / xp.where(undefined, nan, denominator)


def torch_cpu_view(t) -> np.ndarray:
    """A NumPy array over a torch CPU tensor's memory (zero-copy, writeable as the tensor is) that leaves the tensor
    as it was given: ``Tensor.numpy()`` marks the tensor's storage non-resizable for good (a later ``t.resize_()``
    raises), an array made from the tensor's ``__array_interface__`` description does not. The array holds the
    tensor, so the memory lives as long as the array.

    Raises as ``Tensor.numpy()`` does: RuntimeError for a tensor that requires grad (while grad mode is on: a
    custom operator's kernel, or ``torch.no_grad()``, reads one), has the negative bit set, or
    has no storage (a ``torch.func`` wrapper, a sparse tensor), TypeError for one off the CPU or of a dtype NumPy
    lacks (bfloat16, float8); and TypeError for a complex tensor (no gae_xp function takes one; its conjugate bit
    is then not read).
    """
    if t.requires_grad and sys.modules["torch"].is_grad_enabled():
        raise RuntimeError("a tensor that requires grad has no NumPy view: detach() it first")
    if t.is_neg():
        raise RuntimeError("a tensor with the negative bit set has no NumPy view: resolve_neg() it first")
    if not t.is_cpu:
        raise TypeError(f"a tensor on {t.device} has no NumPy view")
    typestr, itemsize = _TORCH_TYPESTR.get(t.dtype) or _torch_typestr(t.dtype)
    memory = _TensorMemory()
    memory.__array_interface__ = {  # strides None: C-contiguous, which NumPy lays out itself
        "data": (t.data_ptr(), False), "shape": t.shape, "typestr": typestr, "version": 3,
        "strides": None if t.is_contiguous() else tuple([step * itemsize for step in t.stride()])}
    memory.tensor = t
    return np.asarray(memory)


class _TensorMemory:
    """A torch CPU tensor's memory as NumPy reads it (``torch_cpu_view``), keeping the tensor alive."""

    __slots__ = ("__array_interface__", "tensor")


#: torch dtype -> (NumPy typestr, itemsize), filled as dtypes are met (torch is imported by then)
_TORCH_TYPESTR: dict = {}


def _torch_typestr(dtype):
    import torch

    try:
        as_numpy = np.dtype(torch.empty(0, dtype=dtype).numpy().dtype)  # an empty tensor of our own
    except TypeError:
        as_numpy = None
    if as_numpy is None or as_numpy.kind == "c":
        raise TypeError(f"a tensor of dtype {dtype} has no NumPy view here")
    _TORCH_TYPESTR[dtype] = (as_numpy.str, as_numpy.itemsize)
    return _TORCH_TYPESTR[dtype]
