"""GPU tests: CuPy arrays and torch CUDA tensors through the fused numba-CUDA kernels and the generic path.

Skipped with the reason where no CUDA GPU (or no CuPy / torch CUDA build) is
present; ``tests/gpu/check.sh`` runs them on a GPU machine. The float64
reference is computed once per case and shared by the libraries and paths.
"""

from __future__ import annotations

import functools

import numpy as np
import pytest
from conftest import load_target
from helpers import converted, expected, like, make_case, xp_assert_close

import gae_xp
from gae_xp import reference

pytestmark = pytest.mark.gpu

LIBRARIES = ["cupy", "torch:cuda"]
OPTIONS = [{}, {"dones": 0.02, "holes": 0.2, "padding": 7}, {"per_step_gamma": True, "bootstrap": True},
           {"next_values": True, "dones": 0.05}, {"holes": 0.9, "bootstrap": True, "per_row_lam": True}]


@pytest.fixture(params=LIBRARIES)
def gpu(request):
    return load_target(f"{request.param}/auto").library


def require_kernels(library):
    load_target(f"{library.name}/numba-cuda")  # skips with the reason where the kernels cannot run


@functools.lru_cache(maxsize=None)
def case_and_answer(option: int, length: int):
    case = make_case(np.random.default_rng(length), (3, length), **OPTIONS[option])
    return case, expected(case)


@pytest.mark.parametrize("backend", ["numba-cuda", "xp", "auto"])
@pytest.mark.parametrize("option", range(len(OPTIONS)))
@pytest.mark.parametrize("length", [1, 31, 2048, 2049, 65537])
def test_equals_the_loop_and_stays_on_the_device(gpu, backend, option, length):
    if backend == "numba-cuda":
        require_kernels(gpu)
    case, (want_a, want_r) = case_and_answer(option, length)
    arrays = converted(gpu, case)
    advantages, returns = gae_xp.gae(**arrays, backend=backend)
    xp_assert_close(advantages, want_a, like=arrays["rewards"])  # checks the namespace and the device too
    xp_assert_close(returns, want_r, like=arrays["rewards"])


@pytest.mark.parametrize("dtype", ["float16", "float32"])
def test_narrow_dtypes(gpu, dtype):
    require_kernels(gpu)
    case, (want_a, want_r) = case_and_answer(1, 65537)
    arrays = converted(gpu, case, getattr(gpu.xp, dtype))
    advantages, returns = gae_xp.gae(**arrays, backend="numba-cuda")
    xp_assert_close(advantages, want_a, like=arrays["rewards"])
    xp_assert_close(returns, want_r, like=arrays["rewards"])


def test_strided_and_time_major_inputs(gpu):
    require_kernels(gpu)
    rng = np.random.default_rng(4)
    base_r, base_v = rng.standard_normal((5000, 8)), rng.standard_normal((5000, 8))
    for pick, axis in ((lambda a: a.T, -1), (lambda a: a[::2, ::2], 0), (lambda a: a, 0)):
        got = gae_xp.gae(pick(gpu.asarray(base_r)), pick(gpu.asarray(base_v)), axis=axis, backend="numba-cuda")
        for out, want in zip(got, expected({"rewards": pick(base_r), "values": pick(base_v)}, axis=axis)):
            xp_assert_close(out, want, like=like(gpu))


def test_fill_masked_matches_the_cpu_kernels(gpu):
    require_kernels(gpu)
    case = make_case(np.random.default_rng(5), (4, 9000), holes=0.3, dones=0.01, bootstrap=True)
    got = gae_xp.gae(**converted(gpu, case), fill_masked=True, backend="numba-cuda")
    for out, exact in zip(got, reference.gae_loop(**case, fill_masked=True)):
        xp_assert_close(out, exact, like=like(gpu))


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_discounted_cumsum_on_the_kernels(gpu, dtype):
    require_kernels(gpu)
    x = np.random.default_rng(0).standard_normal((4, 30000))
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
            advantages, _ = gae_xp.gae(**converted(gpu, case), backend="numba-cuda")
        stream.synchronize()
    else:
        import torch

        stream = torch.cuda.Stream()
        with torch.cuda.stream(stream):
            arrays = converted(gpu, case)
            torch.cuda._sleep(200_000_000)  # keeps this stream busy: the kernels must queue behind it
            advantages, _ = gae_xp.gae(**arrays, backend="numba-cuda")
            assert not stream.query(), "gae() waited for the stream (a host synchronization)"
        assert torch.cuda.default_stream().query(), "work landed on the default stream"
        stream.synchronize()
    xp_assert_close(advantages, want_a, like=like(gpu))


def test_no_copy_to_the_host_and_no_synchronization(gpu, monkeypatch):
    require_kernels(gpu)
    from numba.cuda.cudadrv import driver

    case = make_case(np.random.default_rng(2), (4, 20_000), dones=0.01, holes=0.1)
    arrays = converted(gpu, case)
    gae_xp.gae(**arrays, backend="numba-cuda")  # compile first: loading a module may synchronize

    def refuse(*args, **kwargs):
        raise AssertionError("a device-to-host copy or a stream synchronization happened")

    monkeypatch.setattr(driver, "device_to_host", refuse)
    monkeypatch.setattr(driver.Stream, "synchronize", refuse)
    if gpu.name == "cupy":
        import cupy

        for name in ("copy_to_host", "copy_to_host_async"):
            monkeypatch.setattr(cupy.cuda.memory.MemoryPointer, name, refuse)
        gae_xp.gae(**arrays, backend="numba-cuda")
        gae_xp.discounted_cumsum(arrays["rewards"], 0.9, backend="numba-cuda")
    else:
        import torch

        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
        try:
            gae_xp.gae(**arrays, backend="numba-cuda")
            gae_xp.discounted_cumsum(arrays["rewards"], 0.9, backend="numba-cuda")
        finally:
            torch.cuda.set_sync_debug_mode("default")
