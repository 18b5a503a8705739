"""The traffic model: bytes per element of the fused numba-CUDA path and of the generic path (recorded on torch)."""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pytest

from gae_xp.bench import traffic


@pytest.mark.parametrize("case, bound", [("constant", 24), ("dones+mask", 28)])
def test_fused_path_moves_at_most_the_bound(case, bound):
    """Reads of r and V (and the flags) in launches 1 and 3, writes of A and R: 24 B/element, 28 with a bool
    terminated and mask. The per-tile summaries and carries add a few bytes per 2048-step tile on top."""
    row = traffic.fused_row(case)
    assert row.launches == 3
    assert row.streamed_per_element <= bound
    assert row.bytes_per_element <= bound + 0.05
    assert row.predicted_ms == pytest.approx(row.bytes_per_element * math.prod(traffic.SHAPE) / 4.8e12 * 1e3)


def test_short_rows_take_one_launch():
    row = traffic.fused_row("dones+mask", shape=(1024, 2048))
    assert row.launches == 1
    assert row.streamed_per_element == 10 + 8  # one read of r, V and the two flags; the two outputs


def test_broadcast_coefficients_count_their_stored_bytes():
    from gae_xp.backends import numba_cuda

    shape = (256, 4096)
    rewards = np.empty(shape, np.float32)
    problem = SimpleNamespace(rewards=rewards, values=rewards, next_values=None,
                              gamma=np.broadcast_to(np.empty((1, 4096), np.float32), shape),
                              lam=0.95, terminated=None, truncated=None, mask=None)
    with_gamma = sum(streamed for streamed, _ in numba_cuda.traffic(problem).values())
    problem.gamma = 0.99
    without = sum(streamed for streamed, _ in numba_cuda.traffic(problem).values())
    assert with_gamma - without == 2 * 4096 * 4  # one row, read by launches 1 and 3


def test_recording_rule():
    torch = pytest.importorskip("torch")
    a, b = torch.ones(1000), torch.ones(1000)
    assert traffic.record_torch(lambda: a + b) == (1, 12_000, 0)
    assert traffic.record_torch(lambda: a.view(10, 100).t()) == (0, 0, 0)
    row = torch.ones(1, 100)
    assert traffic.record_torch(lambda: row.expand(10, 100) * 2.0) == (1, 400 + 4000, 0)
    assert traffic.record_torch(lambda: float(a.sum())) == (1, 4004, 1)


def test_report_compares_the_paths():
    pytest.importorskip("torch")
    rows = traffic.report(record_shape=(2, 8192))
    by = {(row.path, row.case): row for row in rows}
    for case in traffic.CASES:
        fused = by["numba-cuda (fused)", case]
        generic = by["xp (generic, on a GPU's route)", case]
        assert traffic.FLOOR_BYTES < fused.bytes_per_element < generic.bytes_per_element
        assert fused.launches <= 3 < generic.launches  # the fused path: at most three launches, whatever the options
    assert "not a measurement" in traffic.markdown(rows)
