"""Baseline: GAE with one CUDA thread per row (the design of PufferLib's advantage kernel), numba-CUDA.

Written for this benchmark from that design: thread ``row`` walks its row from
the last step to the first with the serial recurrence in registers, reading
r and V and writing A and R step by step. Adjacent threads read addresses a
row apart (uncoalesced), and a batch of B rows keeps B threads busy: cheap at
short horizons, slow on long rows. float32, constant gamma and lam, optional
``terminated`` (cut with selects). Runs in numba's CUDA simulator on NumPy
arrays (``NUMBA_ENABLE_CUDASIM=1``; tests/test_gpu_baselines.py).
"""

from __future__ import annotations

import functools

from gae_xp.backends._cuda_import import cuda

THREADS = 256


def _walk(rewards, values, terminated, has_dones, gamma, lam, advantages, returns):
    row = cuda.grid(1)
    if row >= rewards.shape[0]:
        return
    length = rewards.shape[1]
    if length == 0:
        return
    advantage = rewards[row, 0] * 0.0
    following = advantage
    for i in range(length):
        t = length - 1 - i
        value = values[row, t]
        if has_dones and terminated[row, t]:
            advantage = rewards[row, t] - value
        else:
            advantage = rewards[row, t] + gamma * following - value + gamma * lam * advantage
        advantages[row, t] = advantage
        returns[row, t] = advantage + value
        following = value


@functools.cache
def _kernel():
    return cuda.jit("void(float32[:, :], float32[:, :], boolean[:, :], boolean, float32, float32, "
                    "float32[:, :], float32[:, :])")(_walk)


def gae(rewards, values, gamma: float = 0.99, lam: float = 0.95, terminated=None, like=None):
    """(advantages, returns) of float32 (B, T) arrays (CuPy, torch CUDA, or NumPy under the simulator)."""
    empty = _empty_like(rewards)
    advantages, returns = empty(), empty()
    rows = rewards.shape[0]
    flags = terminated if terminated is not None else _flag_stand_in(rewards)
    blocks = max(1, -(-rows // THREADS))
    _kernel()[blocks, THREADS](_device(rewards), _device(values), _device(flags), terminated is not None,
                               gamma, lam, _device(advantages, written=True), _device(returns, written=True))
    return advantages, returns


def _empty_like(array):
    module = type(array).__module__.split(".")[0]
    if module == "torch":
        import torch

        return lambda: torch.empty_like(array)
    if module == "cupy":
        import cupy

        return lambda: cupy.empty_like(array)
    import numpy

    return lambda: numpy.empty_like(array)


def _flag_stand_in(like):
    module = type(like).__module__.split(".")[0]
    if module == "torch":
        import torch

        return torch.zeros((1, 1), dtype=torch.bool, device=like.device)
    if module == "cupy":
        import cupy

        return cupy.zeros((1, 1), dtype=bool)
    import numpy

    return numpy.zeros((1, 1), dtype=bool)


def _device(array, written: bool = False):
    if hasattr(array, "__cuda_array_interface__"):
        return cuda.as_cuda_array(array, sync=False)
    return array if written else cuda.In(array)
