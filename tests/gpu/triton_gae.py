"""Baseline: GAE with one Triton program per row and ``tl.associative_scan`` (the design of rl-triton).

Written for this benchmark from that design, not copied: program ``row`` walks
its row from the last block of ``BLOCK`` steps to the first, computes delta
and the coefficient in registers, scans the block's affine maps
``A -> delta_t + c_t A`` from the right with ``tl.associative_scan``, applies
the advantage carried in from the block after it, and writes advantages and
returns. float32, a constant gamma and lam, optional ``terminated`` (a done
step cuts: its next value and coefficient are 0). One program per row: few
long rows leave most of the GPU idle, which is the regime this baseline is
here to show. ``TRITON_INTERPRET=1`` runs it on the CPU (tests/test_gpu_baselines.py);
the number of blocks per row is a compile-time constant because Triton 3.6's
interpreter cannot loop to a run-time bound under NumPy 2.4 (it converts the
bound, a one-element array, with ``int()``, which NumPy 2.4 refuses).
"""

from __future__ import annotations

import triton
import triton.language as tl

#: Most steps a program scans at once (a power of two).
MAX_BLOCK = 2048


@triton.jit
def _compose(far_coefficient, far_value, near_coefficient, near_value):
    """The map of two neighbouring runs of steps, the near one (closer to the row's start) applied last."""
    return far_coefficient * near_coefficient, near_value + near_coefficient * far_value


@triton.jit
def _gae_rows(rewards, values, terminated, advantages, returns, length, row_stride, gamma, lam,
              HAS_DONES: tl.constexpr, BLOCK: tl.constexpr, BLOCKS: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    base = row * row_stride
    carry = 0.0
    for i in range(0, BLOCKS):
        start = (BLOCKS - 1 - i) * BLOCK
        steps = start + tl.arange(0, BLOCK)
        inside = steps < length
        r = tl.load(rewards + base + steps, mask=inside, other=0.0)
        v = tl.load(values + base + steps, mask=inside, other=0.0)
        following = tl.load(values + base + steps + 1, mask=steps + 1 < length, other=0.0)
        coefficient = tl.where(inside, gamma * lam, 0.0)
        if HAS_DONES:
            done = tl.load(terminated + base + steps, mask=inside, other=0) != 0
            following = tl.where(done, 0.0, following)
            coefficient = tl.where(done, 0.0, coefficient)
        delta = r + gamma * following - v
        product, local = tl.associative_scan((coefficient, delta), 0, _compose, reverse=True)
        advantage = local + product * carry
        tl.store(advantages + base + steps, advantage, mask=inside)
        tl.store(returns + base + steps, advantage + v, mask=inside)
        carry = tl.sum(tl.where(steps == start, advantage, 0.0), axis=0)


def gae(rewards, values, gamma: float = 0.99, lam: float = 0.95, terminated=None, block: int | None = None):
    """(advantages, returns) of float32 (B, T) torch tensors, C-contiguous rows; ``terminated`` bool or None."""
    import torch

    if rewards.dtype != torch.float32 or rewards.dim() != 2 or not rewards.is_contiguous():
        raise ValueError("rewards must be a C-contiguous float32 (B, T) tensor")
    rows, length = rewards.shape
    values = values.contiguous()
    advantages, returns = torch.empty_like(rewards), torch.empty_like(rewards)
    block = block or min(MAX_BLOCK, triton.next_power_of_2(max(length, 16)))
    dones = terminated.contiguous().view(torch.uint8) if terminated is not None else rewards
    _gae_rows[(rows,)](rewards, values, dones, advantages, returns, length, length, gamma, lam,
                       HAS_DONES=terminated is not None, BLOCK=block, BLOCKS=triton.cdiv(length, block),
                       num_warps=8 if block >= 2048 else 4)
    return advantages, returns
