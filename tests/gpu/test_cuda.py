"""GPU tests: CuPy arrays and torch CUDA tensors through the fused numba-CUDA kernels and the generic path.

Skipped with the reason where no CUDA GPU (or no CuPy / torch CUDA build) is
present; ``tests/gpu/check.sh`` runs them on a GPU machine. The float64
reference is computed once per case and shared by the libraries and paths.
"""

from __future__ import annotations

import functools
import math

import numpy as np
import pytest
from conftest import load_target
from helpers import converted, expected, like, make_case, to_numpy, xp_assert_close

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
    """No device-to-host copy and no synchronisation: numba's own copies and stream synchronisation refused; for
    torch, also torch's sync debug mode; for CuPy (whose memory pointers are a compiled type, not patchable), the
    calls return while a long kernel still holds the stream (a synchronisation would have waited for it)."""
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

        spin = cupy.ElementwiseKernel("int64 n", "int64 y", "long long x = 0; for (long long i = 0; i < n; ++i) "
                                      "{ x += i ^ (x >> 3); } y = x;", "gae_xp_spin")
        out = cupy.empty(1, dtype=cupy.int64)
        spin(cupy.int64(1), out)  # compiled here, not below
        stream = cupy.cuda.get_current_stream()
        stream.synchronize()
        spin(cupy.int64(1 << 28), out)  # keeps the stream busy: a synchronisation below would wait for it
        gae_xp.gae(**arrays, backend="numba-cuda")
        gae_xp.discounted_cumsum(arrays["rewards"], 0.9, backend="numba-cuda")
        assert not stream.done, "gae() waited for the stream (a host synchronization)"
        stream.synchronize()
    else:
        import torch

        from gae_xp import _plans

        _plans.PLANS.clear()  # the full path first, then the plan the first call makes
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
        try:
            gae_xp.gae(**arrays, backend="numba-cuda")
            gae_xp.gae(**arrays, backend="numba-cuda")
            gae_xp.discounted_cumsum(arrays["rewards"], 0.9, backend="numba-cuda")
        finally:
            torch.cuda.set_sync_debug_mode("default")


# --- every call on the fused kernels (issue 18) ------------------------------------------------------------------


def host(array):
    """A NumPy copy of a CUDA array (tests only)."""
    return array.get() if hasattr(array, "get") else array.detach().cpu().numpy()


@pytest.mark.parametrize("where", ["device", "host list", "host numpy"])
@pytest.mark.parametrize("case_name", ["plain", "empty sequences", "dones+holes", "next_values"])
def test_packed_sequences_on_the_kernels(gpu, where, case_name):
    """64 sequences (some empty) over 2^16 tokens: sequences end inside tiles and span many; offsets on the device
    or on the host."""
    from test_packed import CASES, make_packed, per_sequence

    require_kernels(gpu)
    offsets, case = make_packed(np.random.default_rng(6), (2,), 2**16, 64, **CASES[case_name])
    arrays = converted(gpu, case)
    cu_seqlens = {"device": gpu.asarray(offsets), "host list": offsets.tolist(), "host numpy": offsets}[where]
    got = gae_xp.gae(**arrays, cu_seqlens=cu_seqlens, backend="numba-cuda")
    for out, want in zip(got, per_sequence(reference.gae_loop, offsets, case)):
        xp_assert_close(out, want, like=like(gpu))


def test_host_offsets_do_not_synchronize_and_device_offsets_once(gpu):
    """Host offsets (a list, a NumPy array) need no device-to-host read; device offsets are read once, by the
    validation in prepare."""
    require_kernels(gpu)
    if gpu.name != "torch:cuda":
        pytest.skip("torch's sync-debug mode counts synchronizations")
    import torch
    from test_packed import make_packed

    offsets, case = make_packed(np.random.default_rng(7), (2,), 50_000, 40, holes=0.1)
    arrays = converted(gpu, case)
    gae_xp.gae(**arrays, cu_seqlens=offsets, backend="numba-cuda")  # compile first
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        gae_xp.gae(**arrays, cu_seqlens=offsets, backend="numba-cuda")
        gae_xp.gae(**arrays, cu_seqlens=offsets.tolist(), backend="numba-cuda")
        with pytest.raises(RuntimeError):
            gae_xp.gae(**arrays, cu_seqlens=gpu.asarray(offsets), backend="numba-cuda")
    finally:
        torch.cuda.set_sync_debug_mode("default")


@pytest.mark.parametrize("length", [1000, 70_000])
def test_every_estimator_on_the_kernels(gpu, length):
    require_kernels(gpu)
    rng = np.random.default_rng(length)
    case = make_case(rng, (3, length), holes=0.2, dones=0.01, bootstrap=True)
    flags = {k: case[k] for k in ("terminated", "truncated", "mask")}
    arrays = converted(gpu, case)
    gpu_flags = {k: arrays[k] for k in flags}
    log_rhos, next_values = rng.normal(0, 0.5, (3, length)), rng.standard_normal((3, length))
    got = gae_xp.vtrace(gpu.asarray(log_rhos), arrays["rewards"], arrays["values"], lam=0.9, **gpu_flags,
                        bootstrap_value=arrays["bootstrap_value"], backend="numba-cuda",
                        truncated_bootstrap="next_step")
    want = reference.vtrace_loop(log_rhos, case["rewards"], case["values"], lam=0.9, **flags,
                                 bootstrap_value=case["bootstrap_value"], truncated_bootstrap="next_step")
    for out, exact in zip(got, want):
        xp_assert_close(out, exact, like=like(gpu))
    xp_assert_close(gae_xp.lambda_returns(arrays["rewards"], gpu.asarray(next_values), **gpu_flags,
                                          backend="numba-cuda"),
                    reference.lambda_returns_loop(case["rewards"], next_values, **flags), like=like(gpu))
    xp_assert_close(gae_xp.discounted_returns(arrays["rewards"], **gpu_flags, bootstrap_value=arrays["bootstrap_value"],
                                              backend="numba-cuda"),
                    reference.discounted_returns_loop(case["rewards"], **flags,
                                                      bootstrap_value=case["bootstrap_value"]), like=like(gpu))
    for got_a, want_a in zip(gae_xp.gae(**arrays, critic_lam=1.0, backend="numba-cuda"),
                             reference.gae_loop(**case, critic_lam=1.0)):
        xp_assert_close(got_a, want_a, like=like(gpu))


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("length", [100, 70_000])
def test_16_bit_inputs_are_read_directly(gpu, dtype, length):
    """bfloat16/float16 in, computed in float32, out in the input's dtype, and no widened copy of the inputs."""
    require_kernels(gpu)
    if dtype == "bfloat16" and gpu.name != "torch:cuda":
        pytest.skip("bfloat16 arrays: torch")
    import torch

    case = make_case(np.random.default_rng(8), (4, length), holes=0.2, dones=0.01, bootstrap=True)
    narrow = getattr(torch, dtype) if gpu.name == "torch:cuda" else getattr(gpu.xp, dtype)
    arrays = converted(gpu, case, narrow)
    rounded = {k: host(gpu.xp.astype(arrays[k], gpu.xp.float32)).astype(np.float64)
               if k in ("rewards", "values", "bootstrap_value") else v for k, v in case.items()}
    want = reference.gae_loop(**rounded)
    if gpu.name == "torch:cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
    got = gae_xp.gae(**arrays, backend="numba-cuda")
    if gpu.name == "torch:cuda":
        extra = torch.cuda.max_memory_allocated() - before
        outputs = 2 * math.prod(case["rewards"].shape) * 2
        assert extra < outputs + 2 * math.prod(case["rewards"].shape) * 4 / 8, "a widened copy of the inputs"
    scale = 2.0 ** -7 if dtype == "bfloat16" else 2.0 ** -10
    for out, exact in zip(got, want):
        assert out.dtype == narrow
        np.testing.assert_allclose(host(gpu.xp.astype(out, gpu.xp.float64)), exact, rtol=scale,
                                   atol=scale * np.abs(exact).max())


@pytest.mark.parametrize("cuts", [None, [0, 1000, 1000, 50_000, 70_000]])
def test_piece_summaries_and_fix_up(gpu, cuts):
    """The summaries and the fix-up of pieces on the kernels equal the numba CPU backend's on host copies."""
    require_kernels(gpu)
    from gae_xp import _prepare, backends

    case = make_case(np.random.default_rng(9), (2, 70_000), holes=0.2, dones=0.001)
    kernels, cpu = backends.load("numba-cuda"), backends.load("numba")
    p = _prepare.prepare(**converted(gpu, case), cu_seqlens=cuts, backend="numba-cuda").problem
    q = _prepare.prepare(**case, cu_seqlens=cuts, backend="numba").problem
    pieces = kernels.pieces(p)
    xp_assert_close(pieces.summary, cpu.summarize(q), like=like(gpu))
    n = pieces.summary.shape[-2]
    b, c = np.random.default_rng(10).standard_normal((2, 2, n))
    want = cpu.gae(q.replace(bootstrap=b, carry=c), chunk_size=None)
    for got in (pieces.finish(gpu.asarray(b), gpu.asarray(c)),
                kernels.gae(p.replace(bootstrap=gpu.asarray(b), carry=gpu.asarray(c)))):
        for out, exact in zip(got, want):
            xp_assert_close(out, exact, like=like(gpu))


@pytest.mark.parametrize("length", [700, 70_000])
def test_gae_backward_on_the_kernels(gpu, length):
    """The kernels' adjoint on the GPU against torch autograd through the generic path on CPU float64 copies."""
    require_kernels(gpu)
    torch = pytest.importorskip("torch")
    from gae_xp import _prepare, backends
    from gae_xp.backends import solve_gae

    rng = np.random.default_rng(11)
    case = make_case(rng, (2, length), holes=0.2, dones=0.001, bootstrap=True)
    upstream = rng.standard_normal((2, length)), rng.standard_normal((2, length))
    p = _prepare.prepare(**converted(gpu, case), backend="numba-cuda").problem
    got = backends.load("numba-cuda").gae_backward(p, *(gpu.asarray(u) for u in upstream))
    leaves = {k: torch.tensor(case[k], requires_grad=True) for k in ("rewards", "values", "bootstrap_value")}
    tensors = {k: torch.from_numpy(v) if isinstance(v, np.ndarray) else v for k, v in case.items()}
    generic = _prepare.prepare(**{**tensors, **leaves}, backend="xp").problem
    advantages, returns = solve_gae(generic, backends.load("xp"), None)
    ((advantages * torch.tensor(upstream[0])).sum() + (returns * torch.tensor(upstream[1])).sum()).backward()
    for mine, theirs in (("rewards", "rewards"), ("values", "values"), ("bootstrap", "bootstrap_value")):
        want = leaves[theirs].grad.numpy()
        xp_assert_close(gpu.xp.reshape(got[mine], want.shape), want, like=like(gpu))


def test_dask_arrays_of_gpu_blocks_use_the_kernels(gpu):
    require_kernels(gpu)
    if gpu.name != "cupy":
        pytest.skip("Dask arrays of CuPy blocks")
    da = pytest.importorskip("dask.array")
    case = make_case(np.random.default_rng(12), (2, 30_000), holes=0.2, dones=0.01)
    lazy = {k: da.from_array(gpu.asarray(v), chunks=(2, 7_000)) if isinstance(v, np.ndarray) else v
            for k, v in case.items()}
    got = gae_xp.gae(**lazy)
    for out, want in zip(got, reference.gae_loop(**case)):
        xp_assert_close(out.compute(), want, like=like(gpu))


@pytest.mark.parametrize("dtype", ["float16", "float32", "float64"])
@pytest.mark.parametrize("k", [1, 16])
def test_consecutive_group_advantages_on_the_fused_kernels(gpu, dtype, k, monkeypatch):
    """group_advantages(scores, k) on CUDA arrays takes backends/_cuda_consecutive.py (one launch, two for
    scale="batch") and equals the float64 loop, every baseline x scale x unbiased: NaN scores, a group of equal
    scores, more groups than a block has threads."""
    import itertools

    from gae_xp.backends import _cuda_consecutive

    require_kernels(gpu)
    calls = []
    fused = _cuda_consecutive.advantages
    monkeypatch.setattr(_cuda_consecutive, "advantages", lambda *a, **kw: calls.append(1) or fused(*a, **kw))
    rng = np.random.default_rng(k)
    scores = rng.normal(0, 1, 16 * 1000).astype(dtype).astype(np.float64)  # the dtype's values, exactly
    scores[rng.random(scores.shape[0]) < 0.05] = np.nan
    scores[:k] = 0.5  # a group of equal scores
    device = gpu.xp.astype(gpu.asarray(scores), getattr(gpu.xp, dtype))
    for baseline, scale, unbiased in itertools.product(gae_xp.groups.BASELINES, gae_xp.groups.SCALES,
                                                       [True, False]):
        options = dict(baseline=baseline, scale=scale, eps=1e-6, unbiased=unbiased)
        want = reference.group_advantages_loop(scores, np.arange(scores.shape[0]) // k, **options)
        got = gae_xp.group_advantages(device, k, **options)
        xp_assert_close(got, want, like=device, dtype=getattr(gpu.xp, dtype))
    assert len(calls) == 18


@pytest.mark.parametrize("option", range(len(OPTIONS)))
@pytest.mark.parametrize("length", [31, 65537])
def test_driver_launch_equals_numbas_launch_and_the_loop(gpu, option, length, monkeypatch):
    """The launches through the driver with packed argument blocks (``_cuda_launch``) give the same bits as
    numba's own launcher of the same kernels, and the float64 loop's answer; every launch went through the driver,
    none through numba's dispatcher."""
    from gae_xp import _plans
    from gae_xp.backends import _cuda_launch, numba_cuda

    require_kernels(gpu)
    case, (want_a, want_r) = case_and_answer(option, length)
    arrays = converted(gpu, case)
    _plans.PLANS.clear()  # both calls take the full path, not a plan made by an earlier test
    driven = []
    launch = _cuda_launch.Launcher.__call__
    monkeypatch.setattr(_cuda_launch.Launcher, "__call__",
                        lambda self, *args: driven.append(self.argtypes) or launch(self, *args))
    ours = gae_xp.gae(**arrays, backend="numba-cuda")
    assert driven, "no launch went through the driver"
    monkeypatch.setattr(numba_cuda._Launch, "driver", False)
    _plans.PLANS.clear()
    count = len(driven)
    theirs = gae_xp.gae(**arrays, backend="numba-cuda")
    assert len(driven) == count, "numba's launcher was asked for, the driver launched"
    for a, b, want in zip(ours, theirs, (want_a, want_r)):
        xp_assert_close(a, want, like=arrays["rewards"])
        assert np.array_equal(to_numpy(a), to_numpy(b), equal_nan=True)


@pytest.mark.parametrize("option", range(len(OPTIONS)))
@pytest.mark.parametrize("length", [31, 65537])
def test_a_repeated_call_is_served_by_its_plan_and_equals_the_loop(option, length):
    """A repeated ``gae()`` call of one layout on torch CUDA tensors (other data, the same layout) is served by the
    plan that binds its arrays (``BoundLayoutPlan``) where one applies (Python-number coefficients) and gives the
    float64 loop's answer for its own data, bit for bit what the full path gives on the same tensors."""
    from gae_xp import _plans

    library = load_target("torch:cuda/numba-cuda").library
    first_case, _ = case_and_answer(option, length)
    case = make_case(np.random.default_rng(length + 1), (3, length), **OPTIONS[option])
    want_a, want_r = expected(case)
    _plans.PLANS.clear()
    gae_xp.gae(**converted(library, first_case), backend="numba-cuda")
    arrays = converted(library, case)
    served = gae_xp.gae(**arrays, backend="numba-cuda")
    (plan,) = _plans.PLANS._plans.values()
    floats = not any(key in OPTIONS[option] for key in ("per_step_gamma", "per_row_lam"))
    assert isinstance(plan, _plans.BoundLayoutPlan) == floats, type(plan).__name__
    _plans.PLANS.clear()
    full = gae_xp.gae(**arrays, backend="numba-cuda")
    for a, b, want in zip(served, full, (want_a, want_r)):
        xp_assert_close(a, want, like=arrays["rewards"])
        assert np.array_equal(to_numpy(a), to_numpy(b), equal_nan=True)
