"""The launch plan of the fused CUDA kernels: tiles, grids, block sizes and map sizes, in plain Python (no numba
import).

Every call lays its arrays out as (rows, T) and cuts the flattened steps
into *tiles*, one thread block each, ``threads x ITEMS`` steps at most:

* **short rows** (T <= the longest tile): a tile holds ``rows_per_tile``
  whole rows, so no row crosses a tile and the call is **one launch**;
* **long rows**: a row is cut into ``tiles_per_row`` tiles of the longest
  length (the last one partial); the call is **three launches** (tile maps,
  carries between the tiles of each row, final pass).

A grid never exceeds the hardware's limits (2^31 - 1 blocks in x, 65,535 in
y): the tiles are numbered ``blockIdx.x + blockIdx.y * gridDim.x`` over a
2-D grid whose x is as large as it must be and whose y is as small as it can
be, so fewer than y blocks are idle; a problem that needs more than
(2^31 - 1) * 65,535 blocks is refused with a ValueError before anything is
allocated. ``plan`` is pure arithmetic: tests check it for huge B x T
without allocating.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import NamedTuple

#: numba's CUDA simulator runs Python per thread: tiny tiles there make a few steps several tiles.
SIMULATED = os.environ.get("NUMBA_ENABLE_CUDASIM", "0") == "1"
#: Most threads of a tile block, steps per thread, threads of a carry block, granularity of a block's size.
THREADS, ITEMS, CARRY_THREADS, WARP = (4, 3, 4, 1) if SIMULATED else (256, 8, 128, 32)
#: The hardware's grid limits (every CUDA GPU since compute capability 3.0).
MAX_GRID_X, MAX_GRID_Y = 2**31 - 1, 65_535


@dataclass(frozen=True)
class Plan:
    """How one call's (rows, T) steps are cut into tiles and launched (see the module docstring)."""

    rows: int
    length: int
    threads: int
    items: int
    #: steps of a full tile (``rows_per_tile * length`` for short rows, ``threads * items`` for long rows).
    tile_steps: int
    tiles_per_row: int
    rows_per_tile: int
    tiles: int
    grid: tuple[int, int]
    carry_threads: int
    carry_grid: tuple[int, int]

    @property
    def long_rows(self) -> bool:
        """True when a row spans several tiles (three launches); False: whole rows per tile (one launch)."""
        return self.tiles_per_row > 1

    def geometry(self) -> tuple[int, int, int, int, int, int]:
        """The kernels' ``geometry`` argument: (rows, T, tiles per row, rows per tile, steps per tile, tiles)."""
        return (self.rows, self.length, self.tiles_per_row, self.rows_per_tile, self.tile_steps, self.tiles)


def grid(blocks: int) -> tuple[int, int]:
    """A 2-D grid of at least ``blocks`` blocks within the hardware's limits, fewer than y of them idle."""
    if blocks <= MAX_GRID_X:
        return (max(blocks, 1), 1)
    y = -(-blocks // MAX_GRID_X)
    if y > MAX_GRID_Y:
        raise ValueError(f"{blocks} thread blocks exceed the CUDA grid ({MAX_GRID_X} x {MAX_GRID_Y}): split the "
                         "batch into several calls")
    return (-(-blocks // y), y)


def plan(rows: int, length: int, *, threads: int = THREADS, items: int = ITEMS, warp: int = WARP,
         carry_threads: int = CARRY_THREADS) -> Plan:
    """The plan for ``rows`` rows of ``length`` steps (both > 0)."""
    if rows <= 0 or length <= 0:
        raise ValueError(f"a launch plan needs rows > 0 and T > 0, got rows={rows}, T={length}")
    longest = threads * items
    if length <= longest:
        rows_per_tile = min(longest // length, rows)
        tile_steps = rows_per_tile * length
        tiles = -(-rows // rows_per_tile)
        needed = -(-tile_steps // items)
        block = min(threads, -(-needed // warp) * warp)
        return Plan(rows, length, block, items, tile_steps, 1, rows_per_tile, tiles, grid(tiles), 0, (0, 0))
    tiles_per_row = -(-length // longest)
    tiles = rows * tiles_per_row
    carry_block = min(carry_threads, -(-tiles_per_row // warp) * warp)
    return Plan(rows, length, threads, items, longest, tiles_per_row, 1, tiles, grid(tiles), carry_block, grid(rows))


def tile_of(p: Plan, tile: int) -> tuple[int, int, int]:
    """(first row, first step, steps) of tile ``tile``: the arithmetic the kernels do, for tests."""
    if p.long_rows:
        row, part = divmod(tile, p.tiles_per_row)
        start = part * p.tile_steps
        return row, start, min(p.tile_steps, p.length - start)
    row = tile * p.rows_per_tile
    return row, 0, min(p.rows_per_tile, p.rows - row) * p.length


def block_of(p: Plan, x: int, y: int) -> int:
    """The tile a block (x, y) of ``p.grid`` runs (>= p.tiles: the block is idle)."""
    return x + y * p.grid[0]


class Fields(NamedTuple):
    """Which slots of a map a structure keeps live: the value chain, the second chain, the segment flag."""

    value: bool
    critic: bool
    segmented: bool

    def live(self) -> tuple[str, ...]:
        names = ["edge", "product"]
        if self.value:
            names.append("on_bootstrap")
        if self.critic:
            names += ["edge2", "product2"] + (["on_bootstrap2"] if self.value else [])
        if self.value:
            names += ["value", "on_value"]
        if self.segmented:
            names.append("ends")
        return tuple(names)


# --- the lean kernels (``_cuda_lean``) -------------------------------------------------------------------------

#: Threads of a lean block and steps per thread in a tile (float64: fewer, its shared arrays are twice as wide). The
#: simulator runs Python per thread: tiny blocks there.
LEAN_THREADS, LEAN_ITEMS, LEAN_ITEMS_FLOAT64 = (4, 2, 2) if SIMULATED else (128, 8, 4)
#: Fewer lean blocks than this leave an H100/H200 (132 SMs) underfilled: rows are then cut into chunks.
FILL_BLOCKS = 4 if SIMULATED else 1024


def lean_items(io: str) -> int:
    """Steps per thread in a lean tile for an io dtype."""
    return LEAN_ITEMS_FLOAT64 if io == "float64" else LEAN_ITEMS


def lean_map_rows(value_chain: bool) -> int:
    """Numbers in a chunk's map (``_cuda_lean``): (c, d), or with the value chain (a mask without next_values)
    (c, d, q, known, value)."""
    return 5 if value_chain else 2


@dataclass(frozen=True)
class LeanPlan:
    """How one call's (rows, T) steps map onto the lean kernels' blocks.

    A *work item* is one chunk of one row (``chunks`` per row, ``chunk_steps`` steps each, the last one
    partial); a block of ``threads`` threads runs ``groups`` work items at once, one per group of
    ``threads // groups`` threads (a power of two).
    """

    rows: int
    length: int
    threads: int
    groups: int
    chunks: int
    chunk_steps: int
    blocks: int
    grid: tuple[int, int]

    def geometry(self) -> tuple[int, int, int, int, int]:
        """The lean kernels' ``geometry`` argument: (rows, T, chunks per row, steps per chunk, log2 of a group's
        threads)."""
        return (self.rows, self.length, self.chunks, self.chunk_steps, (self.threads // self.groups).bit_length() - 1)


def lean_plan(rows: int, length: int, *, threads: int = LEAN_THREADS, items: int = LEAN_ITEMS,
              fill_blocks: int = FILL_BLOCKS) -> LeanPlan:
    """The lean plan of ``rows`` rows of ``length`` steps (both > 0).

    A row that fits a group of fewer threads than a block (``group x items >= T``, the smallest power of two)
    shares the block with ``threads // group`` rows. Rows too few to make ``fill_blocks`` blocks are cut into
    chunks of a whole number of tiles (``threads x items`` steps), as many as make ``fill_blocks`` blocks, at
    most one per tile.
    """
    if rows <= 0 or length <= 0:
        raise ValueError(f"a launch plan needs rows > 0 and T > 0, got rows={rows}, T={length}")
    needed = -(-length // items)
    group = 1
    while group < needed and group < threads:
        group *= 2
    groups = threads // group
    chunks, chunk_steps = 1, length
    tile = threads * items
    if groups == 1 and rows < fill_blocks and length > tile:
        wanted = min(-(-fill_blocks // rows), -(-length // tile))
        chunk_steps = -(-(-(-length // wanted)) // tile) * tile
        chunks = -(-length // chunk_steps)
        if chunks == 1:
            chunk_steps = length
    blocks = -(-(rows * chunks) // groups)
    return LeanPlan(rows, length, threads, groups, chunks, chunk_steps, blocks, grid(blocks))
