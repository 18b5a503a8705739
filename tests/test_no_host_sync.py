"""No blocking host-to-device copy on the CUDA path, checked without a GPU (``tests/gpu`` checks it on one).

A torch copy from a Python list or from pageable memory to a CUDA tensor
blocks the host; these tests catch such copies with stand-ins: a namespace
that refuses ``asarray`` of a list (``helpers.ListRefusing``), and CPU
tensors standing in for CUDA ones in ``_compat.to_device`` (torch's pinned
memory needs a CUDA build, so ``pin_memory`` is recorded instead).
"""

from __future__ import annotations

import numpy as np
import pytest
from helpers import ListRefusing, make_case, xp_assert_close

from gae_xp import _compat, _pieces, _prepare, _problem, backends


def test_the_identity_map_is_made_on_the_device():
    import array_api_compat.numpy as xp

    got = _pieces.identity_map(ListRefusing(xp), np.float32, "cpu")
    assert got.dtype == np.float32
    np.testing.assert_array_equal(got, [0.0, 1.0, 0.0, 0.0, 1.0])


@pytest.mark.parametrize("valid", [True, False])
def test_invalid_offsets_fill_with_nan_made_on_the_device(valid):
    """Outputs of unread device offsets that break the contract are NaN, made on the device (``full_like``), not
    copied from a host number (a blocking copy in torch, and a failure inside a CUDA graph's capture)."""
    import array_api_compat.numpy as xp

    result = np.arange(6.0, dtype=np.float32).reshape(2, 3)
    got = _problem.fill_invalid(ListRefusing(xp), result, np.asarray(valid))
    assert got.dtype == np.float32
    np.testing.assert_array_equal(got, result if valid else np.full_like(result, np.nan))


@pytest.mark.parametrize("length", [0, 9])
def test_summaries_copy_no_list_to_the_device(length):
    case = make_case(np.random.default_rng(length), (2, length), holes=0.3, dones=0.1)
    case.pop("bootstrap_value", None)
    p = _prepare.prepare(**case, cu_seqlens=[0, length // 2, length], backend="xp").problem
    got = _pieces._summarize_on_scan(p.replace(xp=ListRefusing(p.xp)), backends.load("xp").scan, None)
    xp_assert_close(got, _pieces._summarize_on_scan(p, backends.load("xp").scan, None), like=case["rewards"])


@pytest.fixture
def torch_cuda_stand_in(monkeypatch):
    """CPU tensors taken for CUDA ones by ``to_device``; returns the (pinned, non_blocking) record of each copy and
    refuses ``asarray`` of host data in torch's namespace."""
    torch = pytest.importorskip("torch")
    import array_api_compat.torch as xt

    copies = []
    monkeypatch.setattr(_compat, "_torch_cuda", lambda x: _compat.is_torch_array(x))
    monkeypatch.setattr(torch.Tensor, "pin_memory", lambda self: (copies.append("pinned"), self)[1])
    to = torch.Tensor.to

    def recording_to(self, *args, **kwargs):
        if "non_blocking" in kwargs:
            copies.append(("non_blocking", kwargs["non_blocking"]))
        return to(self, *args, **kwargs)

    def refusing_asarray(obj, *args, real=xt.asarray, **kwargs):
        assert not isinstance(obj, (list, tuple, np.ndarray)), "a blocking host-to-device copy"
        return real(obj, *args, **kwargs)

    monkeypatch.setattr(torch.Tensor, "to", recording_to)
    monkeypatch.setattr(xt, "asarray", refusing_asarray)
    return torch, copies


@pytest.mark.parametrize("cu_seqlens", [[0, 3, 3, 10], np.array([0, 4, 10])])
def test_host_cu_seqlens_reach_a_cuda_tensor_by_a_pinned_non_blocking_copy(torch_cuda_stand_in, cu_seqlens):
    torch, copies = torch_cuda_stand_in
    rewards = torch.linspace(-1.0, 1.0, 20).reshape(2, 10)
    p = _prepare.prepare(rewards, rewards * 0.5, cu_seqlens=cu_seqlens, backend="xp").problem
    assert copies == ["pinned", ("non_blocking", True)]
    assert torch.equal(p.offsets, torch.as_tensor(np.asarray(cu_seqlens), dtype=torch.int64))


def test_segments_reach_a_cuda_tensor_by_a_pinned_non_blocking_copy(torch_cuda_stand_in):
    torch, copies = torch_cuda_stand_in
    rewards = torch.zeros(2, 10)
    p = _prepare.prepare(rewards, rewards, backend="xp").problem
    cut = p.with_segments([0, 6, 10], torch.zeros(2, 2))
    assert copies == ["pinned", ("non_blocking", True)]
    assert torch.equal(cut.offsets, torch.tensor([0, 6, 10]))
