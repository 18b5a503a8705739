"""Both GPU routes, ``backend="triton"`` and ``backend="numba-cuda"``, on torch CUDA tensors, at small shapes.

Per route: every kernel structure once against float64 (the calls of
``sanitize_calls.py``: every option of ``gae()``, packed sequences, rows long
enough for the multi-block structures, the other estimators, the backward pass,
float32 and the common structures in float16, bfloat16 and float64); no host
synchronisation on a repeated call; a CUDA graph's replay equal to the eager
call; the launches on the caller's busy stream. A route that this gae_xp does
not have, or that says it cannot run here, is skipped with its reason. Last,
CuPy arrays on the Triton route (``triton_cuda_checks.py cupy``).
``tests/gpu/check.sh`` runs this file first among the GPU tests.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest
from triton_process import run_checks, unavailable

import gae_xp

pytestmark = pytest.mark.gpu

ROUTES = ["triton", "numba-cuda"]
CYCLES = 100_000_000  # about 50 ms of a busy stream on a current GPU


def _sanitize_calls():
    spec = importlib.util.spec_from_file_location("gpu_sanitize_calls", Path(__file__).with_name("sanitize_calls.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


CALLS = _sanitize_calls()


@pytest.fixture(params=ROUTES)
def route(request):
    """The route's name, or a skip with the reason it cannot run on torch CUDA tensors here."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA GPU visible to torch")
    from array_api_compat import array_namespace

    from gae_xp import backends

    if request.param not in backends.names():
        pytest.skip(f"this gae_xp has no {request.param!r} route (its routes: {', '.join(backends.names())})")
    sample = torch.zeros((1, 1), device="cuda")
    reason = backends.load(request.param).unavailable_reason(array_namespace(sample), [sample], forced=True)
    if reason is not None:
        pytest.skip(f"{request.param}: {reason}")
    return request.param


def test_every_structure_against_float64(route):
    lines = list(CALLS.run_route(gae_xp, CALLS.Library(dry_run=False), route, route))
    failed = [line for line in lines if line.startswith("FAILED")]
    assert lines and not failed, "\n".join(failed)


@pytest.mark.parametrize("name", ["gae", "gae, terminated, truncated, next_values", "gae, mask",
                                  "gae, critic_lam float", "gae, host cu_seqlens", "vtrace", "lambda_returns",
                                  "discounted_returns", "discounted_cumsum, reverse"])
def test_a_repeated_call_does_not_synchronise(route, name):
    """Under torch's sync debug mode a blocking copy or a synchronisation raises: the repeated call makes none.
    (Not here: array gamma or lam, whose range check reads a flag on the host, and device offsets, read once;
    docs/gpu.md, "Known limits".)"""
    import torch

    call = CALLS.calls(gae_xp, route)[name]
    arrays = _arrays()
    eager = call(arrays)  # compiles (loading a module may synchronise)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        again = call(arrays)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    for got, want in zip(again, eager):
        assert torch.equal(got, want), name


@pytest.mark.parametrize("name", ["gae", "gae, mask", "gae, critic_lam float", "vtrace"])
def test_captured_in_a_cuda_graph_and_replayed(route, name):
    import torch

    call = CALLS.calls(gae_xp, route)[name]
    arrays = _arrays()
    eager = call(arrays)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up on a side stream, as torch.cuda.graph's documentation asks
        call(arrays)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = call(arrays)
    graph.replay()
    torch.cuda.synchronize()
    for got, want in zip(captured, eager):
        assert torch.equal(got, want), name


def test_launches_on_the_callers_busy_stream(route):
    """The inputs are written on a busy side stream and the call made there: a launch on any other stream would
    read them before they are written."""
    import torch

    arrays = _arrays()
    want = gae_xp.gae(arrays["rewards"], arrays["values"], terminated=arrays["terminated"], backend=route)
    torch.cuda.synchronize()
    busy = torch.cuda.Stream()
    with torch.cuda.stream(busy):
        torch.cuda._sleep(CYCLES)
        rewards, values = torch.empty_like(arrays["rewards"]), torch.empty_like(arrays["values"])
        rewards.copy_(arrays["rewards"])
        values.copy_(arrays["values"])
        got = gae_xp.gae(rewards, values, terminated=arrays["terminated"], backend=route)
    busy.synchronize()
    for out, exact in zip(got, want):
        assert torch.equal(out, exact)


def _arrays(device="cuda", shape=(3, 3000)) -> dict:
    """The inputs of the calls above, float32 on ``device`` (tests/test_gpu_calls_on_cpu.py: small, on the CPU)."""
    return CALLS.Library(dry_run=False, device=device).convert(CALLS.inputs(np.random.default_rng(7), shape),
                                                               "float32")


def test_cupy_arrays_take_the_triton_route():
    """CuPy arrays through torch views of their memory on CuPy's stream, in a process of its own: equal to float64,
    CuPy results, ``auto``'s choice, no synchronisation, negative strides, CuPy's per-thread default stream, managed
    memory left to another route. Last in this file: it compiles some kernels of its own."""
    pytest.importorskip("cupy")
    reason = unavailable()
    if reason is not None:
        pytest.skip(reason)
    run_checks("triton_cuda_checks.py", "cupy")
