"""The fused kernels on an array's own GPU and across streams.

* An array on a GPU other than the current one gets its outputs (and its
  scratch) on its own GPU, with the right numbers: needs two visible GPUs,
  skipped with the reason otherwise.
* ``Pieces.finish`` on another stream than the summary pass: it waits for the
  summary's launches (a busy summary stream would otherwise leave launch 3
  reading maps not yet written), and dropping the pieces object while the
  finishing stream still reads its maps frees nothing under it.

Run by ``tests/gpu/check.sh`` on a GPU machine.
"""

from __future__ import annotations

import numpy as np
import pytest
from conftest import load_target
from helpers import converted, expected, make_case, xp_assert_close

import gae_xp

pytestmark = pytest.mark.gpu

CYCLES = 200_000_000  # about 0.1 s of a busy stream on a current GPU


def _kernels(name):
    target = load_target(f"{name}/numba-cuda")  # skips with the reason where the kernels cannot run
    return target.library


def _two_gpus(name):
    if name == "cupy":
        import cupy

        count = cupy.cuda.runtime.getDeviceCount()
    else:
        import torch

        count = torch.cuda.device_count()
    if count < 2:
        pytest.skip(f"needs two visible GPUs, {count} visible")


def _two_gpus_case(shape=(3, 70_000)) -> dict:
    """The case of the test on another GPU (tests/test_gpu_calls_on_cpu.py: small, on the CPU)."""
    return make_case(np.random.default_rng(3), shape, holes=0.2, dones=0.01, bootstrap=True)


def _gae_and_gradient(arrays: dict):
    """(advantages, returns) of torch tensors whose rewards require grad, after the backward of their sum: tensors
    that require grad take ``backend="auto"`` (the custom operator, the kernels' own adjoint; a forced route
    refuses them)."""
    arrays["rewards"].requires_grad_()
    advantages, returns = gae_xp.gae(**arrays, backend="auto")
    (advantages.sum() + returns.sum()).backward()
    return advantages, returns


def _pieces_problem(library, *, backend="numba-cuda", shape=(4, 200_000)):
    """(the case, its arrays in ``library``, the prepared problem, zero bootstrap and carry per row in float64) of
    the test of pieces finished on another stream (tests/test_gpu_calls_on_cpu.py: small, on the CPU)."""
    import torch

    from gae_xp import _prepare

    case = make_case(np.random.default_rng(4), shape, holes=0.2, dones=0.001)
    case.pop("truncated_bootstrap"), case.pop("truncated")
    arrays = converted(library, case)
    p = _prepare.prepare(**arrays, backend=backend).problem
    b, c = (torch.zeros((shape[0], 1), dtype=torch.float64, device=arrays["rewards"].device) for _ in range(2))
    return case, arrays, p, b, c


@pytest.mark.parametrize("name", ["cupy", "torch:cuda"])
def test_an_array_on_another_gpu_than_the_current_one(name):
    _kernels(name)
    _two_gpus(name)
    case = _two_gpus_case()
    want_a, want_r = expected(case)
    if name == "cupy":
        import cupy

        with cupy.cuda.Device(1):
            arrays = {k: cupy.asarray(v) if isinstance(v, np.ndarray) else v for k, v in case.items()}
        with cupy.cuda.Device(0):
            advantages, returns = gae_xp.gae(**arrays, backend="numba-cuda")
            assert cupy.cuda.Device().id == 0  # the caller's current device is kept
        assert advantages.device.id == 1 and returns.device.id == 1
        got = (advantages.get(), returns.get())
    else:
        import torch

        arrays = {k: torch.from_numpy(v).to("cuda:1") if isinstance(v, np.ndarray) else v for k, v in case.items()}
        with torch.cuda.device(0):
            advantages, returns = _gae_and_gradient(arrays)
            assert torch.cuda.current_device() == 0
        assert advantages.device == returns.device == arrays["rewards"].grad.device == torch.device("cuda:1")
        got = (advantages.detach().cpu().numpy(), returns.detach().cpu().numpy())
    np.testing.assert_allclose(got[0], want_a, rtol=0, atol=1e-10 * max(1.0, np.abs(want_a).max()))
    np.testing.assert_allclose(got[1], want_r, rtol=0, atol=1e-10 * max(1.0, np.abs(want_r).max()))


def test_pieces_finished_on_another_stream_wait_for_the_summary():
    library = _kernels("torch:cuda")
    import torch

    from gae_xp import backends

    case, arrays, p, b, c = _pieces_problem(library)
    kernels = backends.load("numba-cuda")
    want = [w.cpu().numpy() for w in kernels.gae(p.replace(bootstrap=b, carry=c))]
    summarizing, finishing = torch.cuda.Stream(), torch.cuda.Stream()
    for _ in range(3):
        with torch.cuda.stream(summarizing):
            torch.cuda._sleep(CYCLES)  # the summary's launches queue behind this
            pieces = kernels.pieces(p)
        with torch.cuda.stream(finishing):
            got = pieces.finish(b, c)
            del pieces  # its maps are still read by the finishing stream
            torch.cuda.empty_cache()
            noise = torch.randn(64 << 20, device="cuda")  # would reuse freed memory at once
        finishing.synchronize()
        del noise
        for out, exact in zip(got, want):
            np.testing.assert_array_equal(out.cpu().numpy(), exact)
    xp_assert_close(got[0], expected(case)[0], like=arrays["rewards"])
