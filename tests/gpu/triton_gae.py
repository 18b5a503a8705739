"""Baselines: GAE with one Triton program per row and ``tl.associative_scan`` (the design of rl-triton), and
with a tile of several short rows per program (``gae_tiles``: the design the bench tries before the route).

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

``gae_tiles``: rows of at most ``MAX_BLOCK`` steps, ``ROWS`` of them a program
as one ``[ROWS, BLOCK]`` tile scanned along its rows (no carry: a row is one
block). The route's program of a 128-step row is a single warp, and a
multiprocessor holds at most 32 programs, each paying its own chain of load,
scan, store and exit; bfloat16 took float32's time there on the first H100
(docs/gpu.md, "Short rows, steps per program"). A tile of ``TILE`` steps a
program pays that chain once for 8 rows of 128; the bench measures whether
that closes the gap (an explanation to test until it runs).
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


#: Steps a program of ``gae_tiles`` holds (rows x block), and its warps.
TILE, TILE_WARPS = 1024, 4


@triton.jit
def _gae_tiles(rewards, values, terminated, advantages, returns, rows, length, row_stride, gamma, lam,
               HAS_DONES: tl.constexpr, ROWS: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)[:, None]
    steps = tl.arange(0, BLOCK)[None, :]
    inside = (row < rows) & (steps < length)
    at = row * row_stride + steps
    r = tl.load(rewards + at, mask=inside, other=0.0).to(tl.float32)
    v = tl.load(values + at, mask=inside, other=0.0).to(tl.float32)
    following = tl.load(values + at + 1, mask=inside & (steps + 1 < length), other=0.0).to(tl.float32)
    coefficient = tl.where(inside, gamma * lam, 0.0)
    if HAS_DONES:
        done = tl.load(terminated + at, mask=inside, other=0) != 0
        following = tl.where(done, 0.0, following)
        coefficient = tl.where(done, 0.0, coefficient)
    delta = r + gamma * following - v
    _, advantage = tl.associative_scan((coefficient, delta), 1, _compose, reverse=True)
    out = advantages.dtype.element_ty
    tl.store(advantages + at, advantage.to(out), mask=inside)
    tl.store(returns + at, (advantage + v).to(out), mask=inside)


def rows_per_program(length: int, tile: int = TILE) -> int:
    """The rows a program of ``gae_tiles`` holds: ``tile`` steps over the block of a row (at least one row)."""
    return max(1, tile // triton.next_power_of_2(max(length, 16)))


def gae_tiles(rewards, values, gamma: float = 0.99, lam: float = 0.95, terminated=None, tile: int = TILE):
    """(advantages, returns) of (B, T) torch tensors (float32, bfloat16 or float16; computed in float32),
    C-contiguous rows of at most ``MAX_BLOCK`` steps, ``tile // block`` rows a program (at least one)."""
    import torch

    if rewards.dtype not in (torch.float32, torch.bfloat16, torch.float16) or rewards.dim() != 2 \
            or not rewards.is_contiguous():
        raise ValueError("rewards must be a C-contiguous float32, bfloat16 or float16 (B, T) tensor")
    rows, length = rewards.shape
    if length > MAX_BLOCK:
        raise ValueError(f"gae_tiles takes rows of at most {MAX_BLOCK} steps, got {length}")
    values = values.contiguous()
    advantages, returns = torch.empty_like(rewards), torch.empty_like(rewards)
    block = triton.next_power_of_2(max(length, 16))
    per_program = rows_per_program(length, tile)
    dones = terminated.contiguous().view(torch.uint8) if terminated is not None else rewards
    _gae_tiles[(triton.cdiv(rows, per_program),)](
        rewards, values, dones, advantages, returns, rows, length, length, gamma, lam,
        HAS_DONES=terminated is not None, ROWS=per_program, BLOCK=block, num_warps=TILE_WARPS)
    return advantages, returns
