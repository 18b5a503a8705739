"""Array libraries as the benchmarks see them: how to make an array, wait for it, and measure memory.

A library is named ``module[:device]``: numpy, array_api_strict, torch:cpu,
torch:cuda, cupy, jax:cpu, jax:cuda. Nothing is imported until a library is
asked for; ``unavailable(name)`` says why one cannot run here (not installed,
no GPU), so the CLI and asv can skip it.
"""

from __future__ import annotations

import importlib.util
import tracemalloc
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

NAMES = ("numpy", "array_api_strict", "torch:cpu", "torch:cuda", "cupy", "jax:cpu", "jax:cuda")
CPU_NAMES = ("numpy", "array_api_strict", "torch:cpu", "jax:cpu")


@dataclass(eq=False)
class Library:
    """One array library on one device, ready to benchmark."""

    name: str
    asarray: Callable[[np.ndarray], Any]
    to_numpy: Callable[[Any], np.ndarray]
    synchronize: Callable[[Any], None]
    #: runs a call and returns the peak bytes it allocated, or None where the library gives no way to tell.
    peak_memory: Callable[[Callable[[], Any]], int | None]
    version: str
    #: how the library's users run a whole-array function: jax.jit for JAX, the function itself elsewhere.
    compile: Callable[[Callable], Callable] = lambda function: function


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
            return "torch has no CUDA GPU here"
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
    return Library(name, np.array, np.asarray, lambda result: None, _traced_peak, np.__version__)


def _array_api_strict(name):
    import array_api_strict as xp

    return Library(name, lambda a: xp.asarray(np.array(a)), np.asarray, lambda result: None, _traced_peak,
                   xp.__version__)


def _torch(name):
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

    return Library(name, lambda a: torch.from_numpy(np.array(a)).to(device), lambda t: t.detach().cpu().numpy(),
                   synchronize, peak_memory, torch.__version__)


def _cupy(name):
    import cupy

    return Library(name, cupy.asarray, cupy.asnumpy, lambda result: cupy.cuda.Device().synchronize(),
                   lambda call: None, cupy.__version__)


def _jax(name):
    import jax

    jax.config.update("jax_enable_x64", True)  # so that --dtype float64 means float64
    device = jax.devices(name.split(":")[1].replace("cuda", "gpu"))[0]

    def synchronize(result):
        jax.block_until_ready(result)

    return Library(name, lambda a: jax.device_put(np.array(a), device), np.asarray, synchronize,
                   lambda call: None, jax.__version__, jax.jit)


_FACTORIES = {"numpy": _numpy, "array_api_strict": _array_api_strict, "torch": _torch, "cupy": _cupy, "jax": _jax}
