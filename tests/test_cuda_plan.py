"""The launch plan of the fused CUDA kernels (``gae_xp.backends._cuda_plan``): pure arithmetic, no GPU, no numba,
nothing allocated, so shapes far beyond any memory are checked too."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gae_xp.backends import _cuda_plan
from gae_xp.backends._cuda_plan import MAX_GRID_X, MAX_GRID_Y, block_of, grid, plan, tile_of

REAL = dict(threads=256, items=8, warp=32, carry_threads=128)  # the GPU's constants (the simulator has its own)
LONGEST = 256 * 8


def check_grid(shape, blocks):
    x, y = shape
    assert 1 <= x <= MAX_GRID_X and 1 <= y <= MAX_GRID_Y
    assert x * y >= blocks and x * y - blocks < y  # every tile has a block; fewer than y blocks idle
    assert block_of(_plan_with_grid(shape, blocks), x - 1, y - 1) == x * y - 1


def _plan_with_grid(shape, blocks):
    return _cuda_plan.Plan(1, 1, 32, 8, 1, 1, 1, blocks, shape, 0, (0, 0))


@given(rows=st.integers(1, 2**40), length=st.integers(1, 2**40))
def test_every_plan_fits_the_hardware_grid(rows, length):
    blocks = rows * -(-length // LONGEST) if length > LONGEST else -(-rows // (LONGEST // length))
    if blocks > MAX_GRID_X * MAX_GRID_Y:
        with pytest.raises(ValueError, match="exceed the CUDA grid"):
            plan(rows, length, **REAL)
        return
    p = plan(rows, length, **REAL)
    check_grid(p.grid, p.tiles)
    assert p.threads % 32 == 0 and 32 <= p.threads <= 256
    assert p.threads * p.items >= p.tile_steps  # a tile's steps fit its block
    if p.long_rows:
        assert p.tiles == rows * -(-length // LONGEST) and p.tile_steps == LONGEST
        check_grid(p.carry_grid, rows)
        assert p.carry_threads % 32 == 0 and p.carry_threads <= 128
    else:
        assert not p.long_rows and p.rows_per_tile * length == p.tile_steps <= LONGEST
        assert p.tiles == -(-rows // p.rows_per_tile)


@pytest.mark.parametrize("rows, length, tiles, grid_shape", [
    (2**31, 1, 2**20, (2**20, 1)),  # B = 2^31 rows of T = 1 (8 GiB per float32 input): 2048 rows per tile
    (2**31, 4096, 2**32, (1_431_655_766, 3)),  # 2^32 tiles: a 2-D grid, 2 blocks idle
    (2**31 - 1, 2048, 2**31 - 1, (2**31 - 1, 1)),  # the largest 1-D grid
    (2**31, 2048, 2**31, (2**30, 2)),  # one tile too many for 1-D
    (256, 131072, 256 * 64, (256 * 64, 1)),  # slime's shape
    (16, 524288, 16 * 256, (16 * 256, 1)),
])
def test_huge_batches_without_allocating(rows, length, tiles, grid_shape):
    p = plan(rows, length, **REAL)
    assert p.tiles == tiles and p.grid == grid_shape
    check_grid(p.grid, p.tiles)


def test_too_many_blocks_is_refused_before_any_launch():
    with pytest.raises(ValueError, match="exceed the CUDA grid"):
        grid(MAX_GRID_X * MAX_GRID_Y + 1)
    with pytest.raises(ValueError, match="exceed the CUDA grid"):
        plan(2**40, 2**20, **REAL)


@pytest.mark.parametrize("rows, length", [(1, 1), (3, 5), (2049, 1), (7, 300), (5, 2048), (4, 2049), (3, 10000)])
def test_tiles_cover_every_step_once(rows, length):
    p = plan(rows, length, **REAL)
    covered = [0] * (rows * length)
    for tile in range(p.tiles):
        row, start, steps = tile_of(p, tile)
        assert 0 < steps <= p.tile_steps
        for i in range(steps):
            r, t = (row, start + i) if p.long_rows else (row + i // length, i % length)
            covered[r * length + t] += 1
    assert covered == [1] * (rows * length)


def test_short_rows_share_a_tile_and_take_one_launch():
    p = plan(32768, 8, **REAL)  # PufferLib-style short horizons: 256 rows per tile
    assert (p.long_rows, p.rows_per_tile, p.tiles, p.threads) == (False, 256, 128, 256)
    p = plan(4096, 128, **REAL)
    assert (p.long_rows, p.rows_per_tile, p.tiles) == (False, 16, 256)
    p = plan(8192, 1024, **REAL)  # rl-triton's shape: 2 rows per tile
    assert (p.long_rows, p.rows_per_tile, p.tile_steps) == (False, 2, 2048)
    p = plan(3, 5, **REAL)
    assert (p.tiles, p.threads) == (1, 32) and math.prod(p.grid) == 1


#: The lean kernels' plan as on a GPU (the module's constants are the simulator's under NUMBA_ENABLE_CUDASIM=1).
LEAN = dict(threads=128, items=8, fill_blocks=1024)


def lean_work(p):
    """(row, first step, steps) of every work item of a lean plan: what the kernels compute from its geometry."""
    for work in range(p.blocks * p.groups):
        row, chunk = divmod(work, p.chunks)
        if row < p.rows:
            lo = chunk * p.chunk_steps
            yield row, lo, min(lo + p.chunk_steps, p.length) - lo


@pytest.mark.parametrize("rows, length", [(1, 1), (3, 5), (5, 16), (300, 8), (7, 1000), (2, 5000), (1, 70001),
                                          (2000, 3000)])
def test_lean_work_items_cover_every_step_once(rows, length):
    p = _cuda_plan.lean_plan(rows, length, **LEAN)
    covered = [0] * (rows * length)
    for row, lo, steps in lean_work(p):
        assert 0 < steps <= p.chunk_steps
        for t in range(lo, lo + steps):
            covered[row * length + t] += 1
    assert covered == [1] * (rows * length)
    group = p.threads // p.groups
    assert group & (group - 1) == 0 and group * 8 >= min(length, p.threads * 8)
    # the kernels take a group's size and the block's groups by shifting by the geometry's last number
    rows_, length_, chunks, chunk_steps, shift = p.geometry()
    assert (rows_, length_, chunks, chunk_steps) == (rows, length, p.chunks, p.chunk_steps)
    assert 1 << shift == group and p.threads >> shift == p.groups
    assert p.chunks == 1 or p.chunk_steps % (p.threads * 8) == 0  # chunks of whole tiles


def test_lean_plans_of_the_measured_shapes():
    """The H200 table's shapes: short rows share blocks (T = 128: groups of 16 threads, 8 rows a block), many long
    rows take a block each, few long rows are cut into chunks of whole tiles until about 1,024 blocks."""
    cases = {(38400, 128): (8, 1, 4800), (4096, 32): (32, 1, 128), (8192, 1024): (1, 1, 8192),
             (256, 131072): (1, 4, 1024), (16, 524288): (1, 64, 1024), (2048, 4096): (1, 1, 2048)}
    for (rows, length), (groups, chunks, blocks) in cases.items():
        p = _cuda_plan.lean_plan(rows, length, **LEAN)
        assert (p.groups, p.chunks, p.blocks) == (groups, chunks, blocks), (rows, length, p)


def test_a_lean_plan_needs_steps():
    with pytest.raises(ValueError, match="rows > 0 and T > 0"):
        _cuda_plan.lean_plan(0, 5, **LEAN)
