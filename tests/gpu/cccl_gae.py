"""Baseline: GAE as one device-wide inclusive scan of ``cuda.compute`` (cuda-cccl: CUB) with a struct operator.

Written for this benchmark. The recurrence ``A_t = delta_t + c_t A_{t+1}`` is a
scan of affine maps ``x -> b + a x`` under composition, an associative
operator on a two-field struct. The whole (B, T) batch is one sequence in
reversed order (the last step of the last row first), and the last step of
every row has ``a = 0``, which cuts the scan between rows. ``pairs`` lays out
(a, delta) for the scan (a few torch operators); ``scan`` is CUB's decoupled
look-back scan over them (8 bytes read and 8 written per step); ``gae`` is the
whole call (pairs, scan, advantages and returns). float32, constant gamma and
lam. ``compose`` is plain Python: tests/test_gpu_baselines.py checks its algebra
on the CPU, where cuda.compute cannot load (it needs libcuda).
"""

from __future__ import annotations

import numpy as np


def compose(earlier, later):
    """The map of two neighbouring runs in scan order: ``later`` applied after ``earlier``."""
    return type(earlier)(earlier.a * later.a, later.b + later.a * earlier.b)


def pair_arrays(rewards, values, gamma: float, lam: float):
    """The scan's input as two flat arrays in scan order (the batch's last step first): the coefficients
    (gamma lam, 0 at every row's last step: the cut between rows) and the deltas. torch tensors."""
    import torch

    following = torch.nn.functional.pad(values[:, 1:], (0, 1))
    delta = rewards + gamma * following - values
    coefficient = torch.full_like(delta, gamma * lam)
    coefficient[:, -1] = 0.0
    return coefficient.flip((0, 1)).reshape(-1), delta.flip((0, 1)).reshape(-1)


def unpack(scanned, rows: int, length: int):
    """Advantages (rows, length) from the scan's output values (the b fields) in scan order."""
    return scanned.reshape(rows, length).flip((0, 1))


class _Struct:
    """A (n,) device buffer of (a, b) float32 pairs seen as cuda.compute's struct array."""

    def __init__(self, tensor, dtype):
        self.tensor, self.dtype, self.shape = tensor, dtype, (tensor.shape[0],)

    @property
    def __cuda_array_interface__(self):
        return {"shape": self.shape, "typestr": f"|V{self.dtype.itemsize}", "descr": self.dtype.descr,
                "data": (self.tensor.data_ptr(), False), "strides": None, "version": 3}


class _Stream:
    """torch's current stream through the ``__cuda_stream__`` protocol that cuda.compute reads."""

    def __init__(self, handle: int):
        self.handle = handle

    def __cuda_stream__(self):
        return 0, self.handle


class GaeScan:
    """The scan built once for (B, T) float32 torch CUDA tensors, reused by every call."""

    def __init__(self, rows: int, length: int, device, gamma: float = 0.99, lam: float = 0.95):
        import torch
        from cuda import compute

        self.rows, self.length, self.gamma, self.lam = rows, length, gamma, lam
        self.Pair = compute.gpu_struct({"a": np.float32, "b": np.float32}, name="Pair")
        self._pairs = torch.empty((rows * length, 2), dtype=torch.float32, device=device)
        self._out = torch.empty_like(self._pairs)
        self._in_view, self._out_view = _Struct(self._pairs, self.Pair.dtype), _Struct(self._out, self.Pair.dtype)
        self._identity = self.Pair(1.0, 0.0)
        self._scanner = compute.make_inclusive_scan(d_in=self._in_view, d_out=self._out_view, op=compose,
                                                    init_value=self._identity)
        size = self._scanner(temp_storage=None, d_in=self._in_view, d_out=self._out_view, op=compose,
                             init_value=self._identity, num_items=rows * length)
        self._temp = torch.empty(max(int(size), 1), dtype=torch.uint8, device=device)

    def pairs(self, rewards, values):
        """Fill the scan's input: (a, delta) per step, in scan order."""
        self._pairs[:, 0], self._pairs[:, 1] = pair_arrays(rewards, values, self.gamma, self.lam)

    def scan(self):
        """The scan alone, over the pairs already laid out."""
        import torch

        self._scanner(temp_storage=self._temp, d_in=self._in_view, d_out=self._out_view, op=compose,
                      init_value=self._identity, num_items=self.rows * self.length,
                      stream=_Stream(torch.cuda.current_stream().cuda_stream))

    def gae(self, rewards, values):
        """(advantages, returns): pairs, scan, unpack."""
        self.pairs(rewards, values)
        self.scan()
        advantages = unpack(self._out[:, 1], self.rows, self.length)
        return advantages, advantages + values
