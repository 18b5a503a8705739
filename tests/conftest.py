"""The ``xp`` fixture: one test body, every installed array library.

Each parameter is a :class:`Namespace` that converts NumPy test data to its
library (on its device) and back. Libraries that are not installed, or need a
GPU that is not there, are skipped with the reason; the libraries named in
``GAE_XP_REQUIRE_BACKENDS`` (comma-separated ids, e.g.
``numpy,array_api_strict,torch,jax``) make the run fail instead of skipping.
"""

from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np
import pytest
from hypothesis import HealthCheck, settings

import gae_xp

settings.register_profile(
    "default", deadline=None, max_examples=40, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large]
)
settings.register_profile(
    "thorough", deadline=None, max_examples=400, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large]
)
settings.load_profile(os.environ.get("GAE_XP_HYPOTHESIS_PROFILE", "default"))

REQUIRED = {name.strip() for name in os.environ.get("GAE_XP_REQUIRE_BACKENDS", "").split(",") if name.strip()}


@dataclass
class Namespace:
    """An array library under test: ``xp`` is its array-API namespace."""

    id: str
    xp: Any
    asarray: Callable[[np.ndarray], Any]
    to_numpy: Callable[[Any], np.ndarray]
    device: Any = None
    #: the gae_xp backend the tests force: "xp" on NumPy (so that an installed numba does not hide it),
    #: "numba" for the numba CPU kernels, "auto" elsewhere.
    backend: str = "auto"
    #: the largest array (elements) a test should hand this namespace: the CUDA simulator runs Python per thread.
    max_elements: int = 2**40

    def __repr__(self):
        return self.id

    def gae(self, *args, **kwargs):
        return gae_xp.gae(*args, backend=self.backend, **kwargs)

    def discounted_cumsum(self, *args, **kwargs):
        return gae_xp.discounted_cumsum(*args, backend=self.backend, **kwargs)


def _numpy():
    import array_api_compat.numpy as xp

    return Namespace("numpy", xp, lambda a: np.array(a), lambda a: np.asarray(a), backend="xp")


def _numba():
    import array_api_compat.numpy as xp

    if importlib.util.find_spec("numba") is None:
        raise _Unavailable("numba is not installed")
    return Namespace("numba", xp, lambda a: np.array(a), lambda a: np.asarray(a), backend="numba")


def _array_api_strict():
    import array_api_strict as xp

    return Namespace("array_api_strict", xp, lambda a: xp.asarray(np.array(a)), lambda a: np.asarray(a))


def _torch(device: str):
    import array_api_compat.torch as xp
    import torch

    if device == "cuda" and not torch.cuda.is_available():
        raise _Unavailable("torch is installed but no CUDA GPU is visible")
    return Namespace(
        f"torch:{device}", xp, lambda a: torch.from_numpy(np.array(a)).to(device),
        lambda a: a.detach().cpu().numpy(), torch.device(device),
    )


def _jax():
    import jax

    jax.config.update("jax_enable_x64", True)
    import jax.numpy as xp

    return Namespace("jax", xp, lambda a: xp.asarray(np.array(a)), lambda a: np.asarray(a))


def _cupy():
    import array_api_compat.cupy as xp
    import cupy

    try:
        cupy.cuda.runtime.getDeviceCount()
    except Exception as error:  # no driver or no device
        raise _Unavailable(f"CuPy is installed but no CUDA GPU is usable: {error}") from None
    return Namespace("cupy", xp, lambda a: cupy.asarray(np.array(a)), lambda a: cupy.asnumpy(a))


class _Unavailable(Exception):
    pass


def _numba_cuda_sim():
    import array_api_compat.numpy as xp

    if os.environ.get("NUMBA_ENABLE_CUDASIM") != "1":
        raise _Unavailable("the CUDA simulator needs NUMBA_ENABLE_CUDASIM=1 before numba is imported "
                           "(its own pytest run: see .ci/run)")
    if importlib.util.find_spec("numba") is None or importlib.util.find_spec("numba.cuda") is None:
        raise _Unavailable("numba-cuda is not installed")
    return Namespace("numba_cuda_sim", xp, lambda a: np.array(a), lambda a: np.asarray(a), backend="numba-cuda",
                     max_elements=20_000)


FACTORIES = {
    "numpy": _numpy,
    "numba": _numba,
    "numba_cuda_sim": _numba_cuda_sim,
    "array_api_strict": _array_api_strict,
    "torch": lambda: _torch("cpu"),
    "jax": _jax,
    "cupy": _cupy,
    "torch_cuda": lambda: _torch("cuda"),
}
GPU_IDS = {"cupy", "torch_cuda"}


def load_namespace(name: str) -> Namespace:
    try:
        return FACTORIES[name]()
    except (ImportError, _Unavailable) as error:
        reason = f"{name} unavailable: {error}"
        if name in REQUIRED:
            pytest.fail(f"{reason} (required by GAE_XP_REQUIRE_BACKENDS)")
        pytest.skip(reason)


def pytest_configure(config):
    unknown = REQUIRED - set(FACTORIES)
    if unknown:
        raise pytest.UsageError(f"GAE_XP_REQUIRE_BACKENDS names unknown backends {sorted(unknown)}; known: {sorted(FACTORIES)}")


@pytest.fixture(
    params=[pytest.param(name, marks=[pytest.mark.gpu] if name in GPU_IDS else []) for name in FACTORIES],
    scope="session",
)
def xp(request) -> Namespace:
    return load_namespace(request.param)
