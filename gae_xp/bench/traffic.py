"""Traffic model: the bytes each path of a ``gae()`` call reads and writes in device memory, and the time the
bandwidth of a GPU predicts from them.

At (B, T) = (256, 131072) a GPU is bound by memory traffic, not arithmetic, so
bytes per element divided by bandwidth predicts the time of a path (launch
latency and host overhead excluded). Two ways to count:

* the generic path (``backend="xp"``) on torch: every aten operator the call
  runs is recorded with a ``TorchDispatchMode`` on CPU tensors, which run the
  same operator sequence as CUDA tensors would (eager torch: each operator is
  at least one kernel launch). Rule: an operator reads each of its tensor
  arguments once and writes each of its tensor results once, with no reuse
  between operators (no fusion). A tensor counts the bytes its view spans, so
  a broadcast (stride 0) counts its stored row once. Views (an operator whose
  schema returns an alias of an input, plus ``_unsafe_view``), allocations
  (``empty*``) and shape queries move nothing. ``fill_``, ``zero_`` and
  ``copy_`` do not read the tensor they overwrite; ``out=`` arguments are
  written, not read. ``_local_scalar_dense`` (``float(t)``, ``bool(t)``) is
  a device-to-host copy and a host synchronization on a GPU: counted apart;
* the fused numba-CUDA path: ``gae_xp.backends.numba_cuda.traffic`` states
  each launch's loads and stores from the kernels' code (inputs once per tile
  launch, outputs once, a few numbers per tile).

``report()`` returns the rows; ``python -m gae_xp.bench.traffic`` prints them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from types import SimpleNamespace

import numpy as np

import gae_xp

#: Bandwidth of an NVIDIA H200 (HBM3e), bytes per second.
H200_BANDWIDTH = 4.8e12
#: The shape the figures are predicted for, and the shape the generic path is recorded at: the same T (the
#: hierarchy of chunk levels depends on it), fewer rows (every operator is whole-array: bytes scale with B).
SHAPE = (256, 131072)
RECORD_SHAPE = (4, 131072)
CASES = ("constant", "dones+mask")
#: Read rewards and values once, write advantages and returns once (float32).
FLOOR_BYTES = 16

_NO_TRAFFIC = {"_unsafe_view", "empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided",
               "sym_size", "sym_stride", "sym_numel", "sym_storage_offset", "is_same_size"}
_OVERWRITES_SELF = {"fill_", "zero_", "copy_"}


@dataclass(frozen=True)
class Row:
    """One path on one case: its launches (operators), bytes per element and predicted time at ``SHAPE``."""

    path: str
    case: str
    launches: int
    bytes_per_element: float
    predicted_ms: float
    host_syncs: int = 0
    #: bytes per element of the element-proportional part alone (the fused path also moves a few per tile).
    streamed_per_element: float | None = None


def case_arrays(case: str, shape, dtype=np.float32, seed: int = 0) -> dict:
    """gae() keyword arguments as NumPy arrays: ``constant`` (rewards, values) or ``dones+mask`` (plus
    terminated with probability 0.01 per step and a mask with 20 % holes)."""
    if case not in CASES:
        raise ValueError(f"case must be one of {CASES}, got {case!r}")
    rng = np.random.default_rng(seed)
    arrays = {"rewards": rng.standard_normal(shape).astype(dtype), "values": rng.standard_normal(shape).astype(dtype)}
    if case == "dones+mask":
        arrays["terminated"] = rng.random(shape) < 0.01
        arrays["mask"] = rng.random(shape) >= 0.2
    return arrays


def record_torch(call) -> tuple[int, int, int]:
    """(operators that move data, bytes they read and write, host synchronizations) of ``call()`` on torch."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_leaves

    totals = [0, 0, 0]

    class Recorder(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            out = func(*args, **kwargs)
            name = func.overloadpacket.__name__
            if name == "_local_scalar_dense":
                totals[2] += 1
            elif not func.is_view and name not in _NO_TRAFFIC:
                inputs = tree_leaves((args[1:] if name in _OVERWRITES_SELF else args,
                                      {k: v for k, v in kwargs.items() if k != "out"}))
                moved = sum(_span(t) for t in inputs if isinstance(t, torch.Tensor))
                moved += sum(_span(t) for t in tree_leaves(out) if isinstance(t, torch.Tensor))
                totals[0] += 1
                totals[1] += moved
            return out

    with Recorder():
        call()
    return totals[0], totals[1], totals[2]


def _span(tensor) -> int:
    """Bytes a tensor's view spans (stride-0 axes count once)."""
    if tensor.numel() == 0:
        return 0
    elements = 1 + sum((n - 1) * abs(s) for n, s in zip(tensor.shape, tensor.stride()))
    return min(elements, tensor.numel()) * tensor.element_size()


def generic_rows(case: str, *, shape=SHAPE, record_shape=RECORD_SHAPE, bandwidth=H200_BANDWIDTH) -> list[Row]:
    """The generic path recorded on torch CPU tensors, on the route it takes on a GPU.

    On a GPU the generic path never reads a value back to the host (a
    finiteness check would synchronise), so it takes its exact route: with a
    constant discount, the matmul on the finite part plus the serial loop's
    non-finite pattern; with dones and a mask, the doubling local scan with
    ``where`` at the cuts. The recording runs with the arrays taken as device
    arrays (``_compat.on_cpu`` answering False), so that CPU tensors follow
    that same operator sequence.
    """
    from unittest import mock

    import torch

    from gae_xp import _compat

    arrays = {k: torch.from_numpy(v) for k, v in case_arrays(case, record_shape).items()}
    with mock.patch.object(_compat, "on_cpu", lambda x: False):
        launches, moved, syncs = record_torch(lambda: gae_xp.gae(**arrays, backend="xp"))
    per_element = moved / math.prod(record_shape)
    return [Row("xp (generic, on a GPU's route)", case, launches, per_element, _ms(per_element, shape, bandwidth),
                syncs)]


def fused_row(case: str, *, shape=SHAPE, bandwidth=H200_BANDWIDTH, itemsize: int = 4) -> Row:
    """The fused numba-CUDA path from ``numba_cuda.traffic`` (no GPU needed: shapes and dtypes only)."""
    from gae_xp.backends import numba_cuda

    def spec(dtype):
        dtype = np.dtype(dtype)
        strides = (shape[1] * dtype.itemsize, dtype.itemsize)
        return SimpleNamespace(shape=shape, dtype=dtype, strides=strides)

    data = spec(f"f{itemsize}")
    flags = case == "dones+mask"
    problem = SimpleNamespace(rewards=data, values=data, next_values=None, gamma=0.99, lam=0.95,
                              terminated=spec(bool) if flags else None, truncated=None,
                              mask=spec(bool) if flags else None, fill_masked=False)
    launches = numba_cuda.traffic(problem)
    elements = math.prod(shape)
    streamed = sum(part for part, _ in launches.values()) / elements
    total = sum(part + tiles for part, tiles in launches.values()) / elements
    return Row("numba-cuda (fused)", case, len(launches), total, _ms(total, shape, bandwidth), 0, streamed)


def report(*, shape=SHAPE, record_shape=RECORD_SHAPE, cases=CASES, bandwidth=H200_BANDWIDTH,
           generic: bool = True) -> list[Row]:
    """Rows for every path and case (float32): the floor, the fused path and, with torch installed and
    ``generic``, the generic path. Times are predictions at ``bandwidth``, not measurements."""
    rows = []
    for case in cases:
        rows.append(Row("floor: read r, V; write A, R", case, 1, FLOOR_BYTES, _ms(FLOOR_BYTES, shape, bandwidth)))
        rows.append(fused_row(case, shape=shape, bandwidth=bandwidth))
        if generic:
            rows.extend(generic_rows(case, shape=shape, record_shape=record_shape, bandwidth=bandwidth))
    return rows


def _ms(per_element: float, shape, bandwidth: float) -> float:
    return per_element * math.prod(shape) / bandwidth * 1e3


def markdown(rows: list[Row], *, shape=SHAPE, bandwidth=H200_BANDWIDTH) -> str:
    """The rows as a markdown table."""
    lines = [f"Predicted at B={shape[0]}, T={shape[1]}, float32, {bandwidth / 1e12:g} TB/s (traffic model, "
             "not a measurement)", "",
             "| path | case | launches (operators) | bytes/element | predicted time (ms) | host syncs |",
             "|---|---|---|---|---|---|"]
    for row in rows:
        lines.append(f"| {row.path} | {row.case} | {row.launches} | {row.bytes_per_element:.2f} | "
                     f"{row.predicted_ms:.3f} | {row.host_syncs} |")
    return "\n".join(lines)


if __name__ == "__main__":
    print(markdown(report()))
