"""GPU tests: CuPy arrays and torch CUDA tensors through the fused numba-CUDA kernels and the generic path.

Skipped with the reason where no CUDA GPU (or no CuPy / torch CUDA build) is
present; ``tests/gpu/check.sh`` runs them on a GPU machine. The float64
reference is computed once per case and shared by the libraries and paths.
"""

from __future__ import annotations

import functools

import numpy as np
import pytest

import gae_xp
from conftest import load_namespace
from helpers import assert_close, expected, make_case, to_namespace

pytestmark = pytest.mark.gpu

LIBRARIES = ["cupy", "torch_cuda"]
OPTIONS = [{}, {"dones": 0.02, "holes": 0.2, "padding": 7}, {"per_step_gamma": True, "bootstrap": True},
           {"next_values": True, "dones": 0.05}, {"holes": 0.9, "bootstrap": True, "per_row_lam": True}]


@pytest.fixture(params=LIBRARIES)
def gpu(request):
    return load_namespace(request.param)


def require_kernels(ns):
    from gae_xp import backends

    reason = backends.load("numba-cuda").unavailable_reason(ns.xp, [ns.asarray(np.zeros((1, 1)))], forced=True)
    if reason is not None:
        pytest.skip(reason)


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
    advantages, returns = gae_xp.gae(**to_namespace(gpu, case), backend=backend)
    assert_close(gpu, advantages, want_a)  # checks the array type and the device too
    assert_close(gpu, returns, want_r)


@pytest.mark.parametrize("dtype", ["float16", "float32"])
def test_narrow_dtypes(gpu, dtype):
    require_kernels(gpu)
    case, (want_a, want_r) = case_and_answer(1, 65537)
    advantages, returns = gae_xp.gae(**to_namespace(gpu, case, dtype), backend="numba-cuda")
    assert_close(gpu, advantages, want_a, dtype)
    assert_close(gpu, returns, want_r, dtype)


def test_strided_and_time_major_inputs(gpu):
    require_kernels(gpu)
    rng = np.random.default_rng(4)
    base_r, base_v = rng.standard_normal((5000, 8)), rng.standard_normal((5000, 8))
    for pick, axis in ((lambda a: a.T, -1), (lambda a: a[::2, ::2], 0), (lambda a: a, 0)):
        got = gae_xp.gae(pick(gpu.asarray(base_r)), pick(gpu.asarray(base_v)), axis=axis, backend="numba-cuda")
        for out, want in zip(got, expected({"rewards": pick(base_r), "values": pick(base_v)}, axis=axis)):
            assert_close(gpu, out, want)


def test_fill_masked_matches_the_cpu_kernels(gpu):
    require_kernels(gpu)
    case = make_case(np.random.default_rng(5), (4, 9000), holes=0.3, dones=0.01, bootstrap=True)
    got = gae_xp.gae(**to_namespace(gpu, case), fill_masked=True, backend="numba-cuda")
    want = gae_xp.gae(**case, fill_masked=True, backend="xp")
    for out, exact in zip(got, want):
        assert_close(gpu, out, exact)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_discounted_cumsum_on_the_kernels(gpu, dtype):
    require_kernels(gpu)
    from gae_xp import reference

    x = np.random.default_rng(0).standard_normal((4, 30000))
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
            advantages, _ = gae_xp.gae(**to_namespace(gpu, case), backend="numba-cuda")
        stream.synchronize()
    else:
        import torch

        stream = torch.cuda.Stream()
        with torch.cuda.stream(stream):
            converted = to_namespace(gpu, case)
            torch.cuda._sleep(200_000_000)  # keeps this stream busy: the kernels must queue behind it
            advantages, _ = gae_xp.gae(**converted, backend="numba-cuda")
            assert not stream.query(), "gae() waited for the stream (a host synchronization)"
        assert torch.cuda.default_stream().query(), "work landed on the default stream"
        stream.synchronize()
    assert_close(gpu, advantages, want_a)


def test_no_copy_to_the_host_and_no_synchronization(gpu, monkeypatch):
    require_kernels(gpu)
    from numba.cuda.cudadrv import driver

    case = make_case(np.random.default_rng(2), (4, 20_000), dones=0.01, holes=0.1)
    converted = to_namespace(gpu, case)
    gae_xp.gae(**converted, backend="numba-cuda")  # compile first: loading a module may synchronize

    def refuse(*args, **kwargs):
        raise AssertionError("a device-to-host copy or a stream synchronization happened")

    monkeypatch.setattr(driver, "device_to_host", refuse)
    monkeypatch.setattr(driver.Stream, "synchronize", refuse)
    if gpu.id == "cupy":
        import cupy

        for name in ("copy_to_host", "copy_to_host_async"):
            monkeypatch.setattr(cupy.cuda.memory.MemoryPointer, name, refuse)
        gae_xp.gae(**converted, backend="numba-cuda")
        gae_xp.discounted_cumsum(converted["rewards"], 0.9, backend="numba-cuda")
    else:
        import torch

        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
        try:
            gae_xp.gae(**converted, backend="numba-cuda")
            gae_xp.discounted_cumsum(converted["rewards"], 0.9, backend="numba-cuda")
        finally:
            torch.cuda.set_sync_debug_mode("default")
