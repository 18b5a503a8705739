"""The registry of array libraries and of the (library, backend) targets that the tests, the bench and asv share.

A library is named ``module[:device]``: numpy, array_api_strict, torch:cpu,
torch:cuda, cupy, jax:cpu, jax:cuda. A target is ``library/backend``: one
gae_xp backend forced on one library's arrays (``numpy/numba``,
``torch:cuda/numba-cuda``...). Nothing is imported until a library is asked
for; ``unavailable(name)`` and ``target_unavailable(target)`` say why one
cannot run here (not installed, no GPU, a backend that cannot serve those
arrays), so the tests skip it with that reason and the bench and asv leave
it out.
"""

from __future__ import annotations

import importlib.util
import os
import tracemalloc
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

NAMES = ("numpy", "array_api_strict", "torch:cpu", "torch:cuda", "cupy", "jax:cpu", "jax:cuda")
CPU_NAMES = ("numpy", "array_api_strict", "torch:cpu", "jax:cpu")
GPU_NAMES = ("torch:cuda", "cupy", "jax:cuda")

#: Every backend on every library it can serve. ``numpy/numba-cuda`` is the CUDA simulator
#: (``NUMBA_ENABLE_CUDASIM=1``, set before numba is imported), where the kernels run on NumPy arrays.
TARGETS = ("numpy/xp", "numpy/numba", "numpy/numba-cuda", "array_api_strict/xp", "torch:cpu/xp",
           "torch:cpu/numba", "jax:cpu/xp", "jax:cpu/jax", "torch:cuda/xp", "torch:cuda/numba-cuda", "cupy/xp",
           "cupy/numba-cuda", "jax:cuda/xp")


@dataclass(eq=False)
class Library:
    """One array library on one device: its namespace, and how to make an array, read it back, wait for it."""

    name: str
    xp: Any
    device: Any
    asarray: Callable[[np.ndarray], Any]
    to_numpy: Callable[[Any], np.ndarray]
    synchronize: Callable[[Any], None]
    #: runs a call and returns the peak bytes it allocated, or None where the library gives no way to tell.
    peak_memory: Callable[[Callable[[], Any]], int | None]
    version: str
    #: how the library's users run a whole-array function: jax.jit for JAX, the function itself elsewhere.
    compile: Callable[[Callable], Callable] = lambda function: function

    def __repr__(self):
        return self.name


def simulated() -> bool:
    """True when numba's CUDA simulator is asked for (``NUMBA_ENABLE_CUDASIM=1``)."""
    return os.environ.get("NUMBA_ENABLE_CUDASIM", "0") == "1"


def unavailable(name: str) -> str | None:
    """None when ``name`` can run here, else why not."""
    if name not in NAMES:
        return f"unknown library {name!r}; known: {', '.join(NAMES)}"
    module = name.split(":")[0]
    if importlib.util.find_spec(module) is None:
        return f"{module} is not installed"
    if name == "torch:cuda":
        import torch

        if not torch.cuda.is_available():
            return "torch is installed but no CUDA GPU is visible"
    if name == "cupy":
        try:
            import cupy

            cupy.cuda.runtime.getDeviceCount()
        except Exception as error:  # no driver, no device
            return f"CuPy cannot reach a GPU: {error}"
    if name.startswith("jax:"):
        import jax

        try:
            jax.devices(name.split(":")[1].replace("cuda", "gpu"))
        except RuntimeError:
            return f"JAX has no {name.split(':')[1]} device"
    return None


def target_unavailable(target: str) -> str | None:
    """None when the target ``library/backend`` can run here, else why not."""
    name, _, backend = target.partition("/")
    if target not in TARGETS:
        return f"unknown target {target!r}; known: {', '.join(TARGETS)}"
    if target == "numpy/numba-cuda" and not simulated():
        return ("numba-CUDA on NumPy arrays is the CUDA simulator: it needs NUMBA_ENABLE_CUDASIM=1 before numba "
                "is imported (its own pytest run: see .ci/run)")
    reason = unavailable(name)
    if reason is not None:
        return reason
    from gae_xp import backends

    library = load(name)
    sample = library.asarray(np.zeros((1, 1)))
    return backends.load(backend).unavailable_reason(library.xp, [sample], forced=True)


def to_numpy(array: Any) -> np.ndarray:
    """Any library's array as a NumPy array in host memory (bfloat16 widened to float32, which NumPy lacks)."""
    from gae_xp._compat import is_cupy_array, is_jax_array, is_torch_array

    if is_torch_array(array):
        array = array.detach().cpu()
        return (array.float() if str(array.dtype) == "torch.bfloat16" else array).numpy()
    if is_cupy_array(array):
        return array.get()
    if is_jax_array(array) and str(array.dtype) == "bfloat16":
        array = array.astype("float32")
    return np.asarray(array)


def load(name: str) -> Library:
    reason = unavailable(name)
    if reason is not None:
        raise ValueError(reason)
    return _FACTORIES[name.split(":")[0]](name)


def _traced_peak(call):
    tracemalloc.start()
    try:
        call()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def _numpy(name):
    import array_api_compat.numpy as xp

    return Library(name, xp, "cpu", np.array, np.asarray, lambda result: None, _traced_peak, np.__version__)


def _array_api_strict(name):
    import array_api_strict as xp

    return Library(name, xp, xp.Device("CPU_DEVICE"), lambda a: xp.asarray(np.array(a)), np.asarray,
                   lambda result: None, _traced_peak, xp.__version__)


def _torch(name):
    import array_api_compat.torch as xp
    import torch

    device = torch.device(name.split(":")[1])
    cuda = device.type == "cuda"

    def synchronize(result):
        if cuda:
            torch.cuda.synchronize(device)

    def peak_memory(call):
        if not cuda:
            return None
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        before = torch.cuda.memory_allocated(device)
        call()
        torch.cuda.synchronize(device)
        return torch.cuda.max_memory_allocated(device) - before

    return Library(name, xp, device, lambda a: torch.from_numpy(np.array(a)).to(device), to_numpy,
                   synchronize, peak_memory, torch.__version__)


def _cupy(name):
    import array_api_compat.cupy as xp
    import cupy

    return Library(name, xp, cupy.cuda.Device(), cupy.asarray, cupy.asnumpy,
                   lambda result: cupy.cuda.Device().synchronize(), lambda call: None, cupy.__version__)


def _jax(name):
    import jax

    jax.config.update("jax_enable_x64", True)  # so that float64 means float64
    import jax.numpy as xp

    device = jax.devices(name.split(":")[1].replace("cuda", "gpu"))[0]

    def synchronize(result):
        jax.block_until_ready(result)

    return Library(name, xp, device, lambda a: jax.device_put(np.array(a), device), to_numpy, synchronize,
                   lambda call: None, jax.__version__, jax.jit)


_FACTORIES = {"numpy": _numpy, "array_api_strict": _array_api_strict, "torch": _torch, "cupy": _cupy, "jax": _jax}
