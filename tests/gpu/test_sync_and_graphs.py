"""torch CUDA calls without host synchronisation, and captured in a CUDA graph (issue 29, items 3 and 5).

Every kind of call runs once to compile (loading a module may synchronise),
then again under ``torch.cuda.set_sync_debug_mode("error")``, where a
blocking copy (host to device from a list or pageable memory, device to
host) or a stream synchronisation raises. Skipped with the reason where no
torch CUDA build or no GPU is present.
"""

from __future__ import annotations

import numpy as np
import pytest
from conftest import load_target
from helpers import converted, make_case

import gae_xp

pytestmark = pytest.mark.gpu

BACKEND = "numba-cuda"


@pytest.fixture(scope="module")
def torch_cuda():
    load_target(f"torch:cuda/{BACKEND}")  # skips with the reason where the kernels cannot run on torch CUDA
    import torch

    return torch


def _calls(torch, *, device="cuda", backend=BACKEND, shape=(3, 5000), offsets=(0, 10, 10, 2600, 5000)):
    """(name, call) for every kind of call: each returns its outputs. ``device``, ``backend``, ``shape`` and the
    packed sequences' ``offsets`` are the GPU run's by default; tests/test_gpu_calls_on_cpu.py runs the table on
    small torch CPU tensors."""
    from gae_xp import _prepare, backends

    rng = np.random.default_rng(29)
    case = make_case(rng, shape, holes=0.2, dones=0.01, bootstrap=True)
    arrays = converted(load_target(f"torch:{device}/auto").library, case)
    flags = {k: arrays[k] for k in ("terminated", "truncated", "mask")}
    short = {k: v[:, :100] if k not in ("bootstrap_value",) and hasattr(v, "ndim") and v.ndim == 2 else v
             for k, v in arrays.items()}
    offsets = np.array(offsets)
    log_rhos = torch.as_tensor(rng.normal(0, 0.5, shape), device=device)
    kernels = backends.load(backend)
    pieces_case = {k: v for k, v in arrays.items() if k != "bootstrap_value"}

    def problem(cu_seqlens):
        return _prepare.prepare(**pieces_case, cu_seqlens=cu_seqlens, backend=backend).problem

    def finish():
        p = problem(offsets)
        zeros = torch.zeros((shape[0], len(offsets) - 1), dtype=p.rewards.dtype, device=device)
        return kernels.pieces(p).finish(zeros, zeros)

    upstream = torch.ones_like(arrays["rewards"])
    return {
        "gae, one launch": lambda: gae_xp.gae(**short, backend=backend),
        "gae, three launches": lambda: gae_xp.gae(**arrays, backend=backend),
        "gae, float critic_lam": lambda: gae_xp.gae(**arrays, critic_lam=1.0, backend=backend),
        "gae, host list cu_seqlens": lambda: gae_xp.gae(**pieces_case, cu_seqlens=offsets.tolist(), backend=backend),
        "gae, host numpy cu_seqlens": lambda: gae_xp.gae(**pieces_case, cu_seqlens=offsets, backend=backend),
        "summarize": lambda: (kernels.summarize(problem(offsets)),),
        "pieces and finish": finish,
        "vtrace": lambda: gae_xp.vtrace(log_rhos, arrays["rewards"], arrays["values"], **flags,
                                        truncated_bootstrap=arrays["truncated_bootstrap"], backend=backend),
        "lambda_returns": lambda: (gae_xp.lambda_returns(arrays["rewards"], arrays["values"], **flags,
                                                         backend=backend),),
        "discounted_returns": lambda: (gae_xp.discounted_returns(arrays["rewards"], **flags, backend=backend),),
        "discounted_cumsum, reverse": lambda: (gae_xp.discounted_cumsum(arrays["rewards"], 0.9, backend=backend),),
        "discounted_cumsum, forward": lambda: (gae_xp.discounted_cumsum(arrays["rewards"], 0.9, reverse=False,
                                                                        backend=backend),),
        "gae_backward": lambda: tuple(gradient for gradient in kernels.gae_backward(problem(None), upstream,
                                                                                    upstream).values()
                                      if gradient is not None),  # none to next_values and carry: not given
    }


CALLS = ["gae, one launch", "gae, three launches", "gae, float critic_lam", "gae, host list cu_seqlens",
         "gae, host numpy cu_seqlens", "summarize", "pieces and finish", "vtrace", "lambda_returns",
         "discounted_returns", "discounted_cumsum, reverse", "discounted_cumsum, forward", "gae_backward"]


@pytest.mark.parametrize("name", CALLS)
def test_no_host_synchronisation(torch_cuda, name):
    """Under sync debug mode, the call on its full path (the plan cache emptied) and then repeated (a ``gae()``
    served by its plan) equal the first, compiling, call."""
    from gae_xp import _plans

    torch = torch_cuda
    call = _calls(torch)[name]
    eager = call()  # compiles
    _plans.PLANS.clear()
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        full, repeated = call(), call()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    for got, again, want in zip(full, repeated, eager):
        assert torch.equal(got, want) and torch.equal(again, want), name


@pytest.mark.parametrize("path", ["full", "plan"])
@pytest.mark.parametrize("name", ["gae, one launch", "gae, three launches", "gae, float critic_lam", "vtrace"])
def test_captured_in_a_cuda_graph_and_replayed(torch_cuda, name, path):
    """Captured on torch's capturing stream (a launch elsewhere, a synchronisation or an allocation outside torch's
    caching allocator fails the capture), outputs in the graph's pool; a replay equals eager bit for bit (the
    kernels are deterministic). ``path``: the captured call takes the full path (the plan cache emptied before
    it), or is served by the plan the warm-up made."""
    from gae_xp import _plans

    torch = torch_cuda
    call = _calls(torch)[name]
    eager = call()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up on a side stream, as torch.cuda.graph's documentation asks
        call()
    torch.cuda.current_stream().wait_stream(side)
    if path == "full":
        _plans.PLANS.clear()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = call()
    graph.replay()
    torch.cuda.synchronize()
    for got, want in zip(captured, eager):
        assert torch.equal(got, want), name
