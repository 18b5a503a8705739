"""GPU tests: CuPy arrays and torch CUDA tensors through the numba-CUDA kernels and the generic path.

Skipped with the reason where no CUDA GPU (or no CuPy / torch CUDA build) is
present; ``tests/gpu/check.sh`` runs them on a GPU machine.
"""

from __future__ import annotations

import numpy as np
import pytest

import gae_xp
from conftest import load_namespace
from helpers import assert_close, expected, make_case, to_namespace

pytestmark = pytest.mark.gpu

LIBRARIES = ["cupy", "torch_cuda"]
OPTIONS = [{}, {"dones": 0.02, "holes": 0.2, "padding": 7}, {"per_step_gamma": True, "bootstrap": True},
           {"next_values": True, "dones": 0.05}]


@pytest.fixture(params=LIBRARIES)
def gpu(request):
    return load_namespace(request.param)


def require_kernels(ns):
    from gae_xp import backends

    reason = backends.load("numba-cuda").unavailable_reason(ns.xp, [ns.asarray(np.zeros((1, 1)))], forced=True)
    if reason is not None:
        pytest.skip(reason)


@pytest.mark.parametrize("backend", ["numba-cuda", "xp", "auto"])
@pytest.mark.parametrize("options", OPTIONS)
@pytest.mark.parametrize("length", [1, 31, 4096, 65537])
def test_equals_the_loop_and_stays_on_the_device(gpu, backend, options, length):
    if backend == "numba-cuda":
        require_kernels(gpu)
    case = make_case(np.random.default_rng(length), (3, length), **options)
    advantages, returns = gae_xp.gae(**to_namespace(gpu, case), backend=backend)
    want_a, want_r = expected(case)
    assert_close(gpu, advantages, want_a)  # checks the array type and the device too
    assert_close(gpu, returns, want_r)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_discounted_cumsum_on_the_kernels(gpu, dtype):
    require_kernels(gpu)
    from gae_xp import reference

    x = np.random.default_rng(0).standard_normal((4, 3000))
    for reverse in (True, False):
        want = reference.discounted_cumsum_loop(x, 0.97, reverse=reverse)
        got = gae_xp.discounted_cumsum(gpu.xp.astype(gpu.asarray(x), getattr(gpu.xp, dtype)), 0.97,
                                       reverse=reverse, backend="numba-cuda")
        assert_close(gpu, got, want, dtype)


def test_non_default_stream_without_synchronizing(gpu):
    require_kernels(gpu)
    case = make_case(np.random.default_rng(1), (8, 100_000), dones=0.01, holes=0.1)
    want_a, _ = expected(case)
    if gpu.id == "cupy":
        import cupy

        stream = cupy.cuda.Stream(non_blocking=True)
        with stream:
            converted = to_namespace(gpu, case)
            advantages, _ = gae_xp.gae(**converted, backend="numba-cuda")
        stream.synchronize()
    else:
        import torch

        stream = torch.cuda.Stream()
        with torch.cuda.stream(stream):
            converted = to_namespace(gpu, case)
            advantages, _ = gae_xp.gae(**converted, backend="numba-cuda")
        stream.synchronize()
    assert_close(gpu, advantages, want_a)


def test_no_copy_to_the_host(gpu, monkeypatch):
    require_kernels(gpu)
    case = make_case(np.random.default_rng(2), (4, 20_000), dones=0.01, holes=0.1)
    converted = to_namespace(gpu, case)
    if gpu.id == "cupy":
        import cupy

        def refuse(*args, **kwargs):
            raise AssertionError("a device-to-host copy happened")

        for name in ("copy_to_host", "copy_to_host_async"):
            monkeypatch.setattr(cupy.cuda.memory.MemoryPointer, name, refuse)
        gae_xp.gae(**converted, backend="numba-cuda")
    else:
        import torch

        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
        try:
            gae_xp.gae(**converted, backend="numba-cuda")
        finally:
            torch.cuda.set_sync_debug_mode("default")
