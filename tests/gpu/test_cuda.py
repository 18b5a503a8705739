"""GPU tests: CuPy arrays and torch CUDA tensors through the numba-CUDA kernels and the generic path.

Skipped with the reason where no CUDA GPU (or no CuPy / torch CUDA build) is
present; ``tests/gpu/check.sh`` runs them on a GPU machine.
"""

from __future__ import annotations

import numpy as np
import pytest

import gae_xp
from conftest import load_target
from helpers import converted, expected, like, make_case, xp_assert_close

pytestmark = pytest.mark.gpu

LIBRARIES = ["cupy", "torch:cuda"]
OPTIONS = [{}, {"dones": 0.02, "holes": 0.2, "padding": 7}, {"per_step_gamma": True, "bootstrap": True},
           {"next_values": True, "dones": 0.05}]


@pytest.fixture(params=LIBRARIES)
def gpu(request):
    return load_target(f"{request.param}/auto").library


def require_kernels(library):
    load_target(f"{library.name}/numba-cuda")


@pytest.mark.parametrize("backend", ["numba-cuda", "xp", "auto"])
@pytest.mark.parametrize("options", OPTIONS)
@pytest.mark.parametrize("length", [1, 31, 4096, 65537])
def test_equals_the_loop_and_stays_on_the_device(gpu, backend, options, length):
    if backend == "numba-cuda":
        require_kernels(gpu)
    case = make_case(np.random.default_rng(length), (3, length), **options)
    arrays = converted(gpu, case)
    advantages, returns = gae_xp.gae(**arrays, backend=backend)
    want_a, want_r = expected(case)
    xp_assert_close(advantages, want_a, like=arrays["rewards"])  # checks the namespace and the device too
    xp_assert_close(returns, want_r, like=arrays["rewards"])


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_discounted_cumsum_on_the_kernels(gpu, dtype):
    require_kernels(gpu)
    from gae_xp import reference

    x = np.random.default_rng(0).standard_normal((4, 3000))
    for reverse in (True, False):
        want = reference.discounted_cumsum_loop(x, 0.97, reverse=reverse)
        got = gae_xp.discounted_cumsum(gpu.xp.astype(gpu.asarray(x), getattr(gpu.xp, dtype)), 0.97,
                                       reverse=reverse, backend="numba-cuda")
        xp_assert_close(got, want, like=like(gpu), dtype=getattr(gpu.xp, dtype))


def test_non_default_stream_without_synchronizing(gpu):
    require_kernels(gpu)
    case = make_case(np.random.default_rng(1), (8, 100_000), dones=0.01, holes=0.1)
    want_a, _ = expected(case)
    if gpu.name == "cupy":
        import cupy

        stream = cupy.cuda.Stream(non_blocking=True)
        with stream:
            arrays = converted(gpu, case)
            advantages, _ = gae_xp.gae(**arrays, backend="numba-cuda")
        stream.synchronize()
    else:
        import torch

        stream = torch.cuda.Stream()
        with torch.cuda.stream(stream):
            arrays = converted(gpu, case)
            advantages, _ = gae_xp.gae(**arrays, backend="numba-cuda")
        stream.synchronize()
    xp_assert_close(advantages, want_a, like=like(gpu))


def test_no_copy_to_the_host(gpu, monkeypatch):
    require_kernels(gpu)
    case = make_case(np.random.default_rng(2), (4, 20_000), dones=0.01, holes=0.1)
    arrays = converted(gpu, case)
    if gpu.name == "cupy":
        import cupy

        def refuse(*args, **kwargs):
            raise AssertionError("a device-to-host copy happened")

        for name in ("copy_to_host", "copy_to_host_async"):
            monkeypatch.setattr(cupy.cuda.memory.MemoryPointer, name, refuse)
        gae_xp.gae(**arrays, backend="numba-cuda")
    else:
        import torch

        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
        try:
            gae_xp.gae(**arrays, backend="numba-cuda")
        finally:
            torch.cuda.set_sync_debug_mode("default")
