"""The Triton route's launch heuristic: how the block, warps, stages and chunks are chosen (nothing imported at
load: the backend module, the launch module and ``gae_xp.warm_up`` read it)."""

import math

#: (steps per program at most, block, num_warps, num_stages): the first row whose bound holds. The stages
#: pipeline a program's walk over its blocks (the loads of the next blocks in flight while one is solved): rows
#: cut into chunks of several blocks take the row's; every other launch 1 (``_triton_launch._config``). Only
#: the last row's rows are long enough for such chunks (T over two blocks times the chunks): the others' are 1.
HEURISTIC = (
    (128, 128, 1, 1),
    (512, 512, 4, 1),
    (2048, 1024, 4, 1),
    (math.inf, 2048, 8, 3),
)
#: The most chunks one row is cut into (the kernel scans the chunk maps as one block of this many).
MAX_CHUNKS = 256
#: The interpreter's stand-ins for a GPU's multiprocessor count (it decides when rows are cut into chunks) and its
#: shared memory a program may take (the least of the GPUs Triton compiles for: sm_86/89, 99 KB).
INTERPRETER_MULTIPROCESSORS = 4
INTERPRETER_SHARED_MEMORY = 101_376
#: Shared memory a compiled kernel keeps besides its pipeline's buffers (its scans' exchange: 128 to 512 bytes in
#: the compiled kernels, tests/test_triton_ptx.py), with room to spare.
SHARED_MEMORY_BESIDES = 1024
#: Rows are cut into chunks only with fewer rows than this many times the multiprocessors (chunks read the inputs
#: twice; one program a row, two a multiprocessor, ran at 1.6x a copy at 256x131072 on the first H200: the
#: benchmark's baseline, tests/gpu/triton_gae.py) ...
FEW_ROWS = 1
#: ... and for this many programs per multiprocessor.
PROGRAMS_PER_MULTIPROCESSOR = 4


def rows_per_program(length: int, rows: int, tile: int | None) -> tuple[int, int]:
    """(rows a program of the Triton route holds, its lanes of each): for rows of ``length`` steps, ``span`` the
    power of two at or above it, as many rows as ``tile`` holds spans and the ``rows`` need (a power of two), where
    two or more fit (``tuned(tile=...)``); else (1, span): a program a row (``tile`` None, the heuristic's)."""
    span = _power_of_two_at_least(length)
    if tile is None:
        return 1, span
    return max(1, min(tile // span, _power_of_two_at_least(rows))), span


def _power_of_two_at_least(n) -> int:
    """The least power of two >= n (1 for n <= 1), by comparisons: a traced call's sizes are symbols."""
    power = 1
    while power < n:
        power *= 2
    return power


def multiprocessors(device) -> int:
    """The multiprocessors of a torch device: a CUDA device's own, else the interpreter's stand-in."""
    if device.type != "cuda":
        return INTERPRETER_MULTIPROCESSORS
    import torch

    return torch.cuda.get_device_properties(device).multi_processor_count


def shared_memory(device) -> int:
    """The shared memory one program may take on a torch device (bytes): a CUDA device's opt-in limit, else the
    interpreter's stand-in."""
    if device.type != "cuda":
        return INTERPRETER_SHARED_MEMORY
    import torch

    return torch.cuda.get_device_properties(device).shared_memory_per_block_optin


def pipeline_bytes(stages: int, block: int, step_bytes: int) -> int:
    """The shared memory a walk pipelined over ``stages`` takes: ``stages - 1`` blocks in flight of every load
    (``step_bytes``: the bytes a step loads, the values counted twice where the kernel reads V_{t+1} from them),
    and what the kernel keeps besides. An upper bound of the compiled kernels' (tests/test_triton_ptx.py)."""
    return (stages - 1) * block * step_bytes + SHARED_MEMORY_BESIDES


def fitting_stages(stages: int, block: int, step_bytes: int, limit: int) -> int:
    """``stages``, or fewer (1 at least: no pipeline) until its buffers fit ``limit`` bytes of shared memory."""
    while stages > 1 and pipeline_bytes(stages, block, step_bytes) > limit:
        stages -= 1
    return stages


def warm_shapes(multiprocessors: int) -> list[tuple[int, int]]:
    """(rows, T) whose calls together launch every kernel the heuristic can choose for one layout, dtype and set of
    options (``gae_xp.warm_up(device=...)``). A kernel is chosen by T's row of ``HEURISTIC`` (the block), by
    whether rows are cut into chunks (fewer rows than ``FEW_ROWS * multiprocessors`` and T over one block), and by
    the rows' alignment: whether T, the row strides where there are two rows or more, and the pointers a layout
    offsets by T (a bootstrap column) are multiples of 16 bytes of the floats, and by whether chunks hold more than
    one block (pipelined: ``_triton_launch._config``). So, per row of ``HEURISTIC``: T at its bound (four blocks
    for the last, unbounded row) and at its block where that falls inside the row (one block: never cut), each as
    it is (a multiple of 16 bytes of every float) and one step less (of no float); each with one row, two rows and
    ``FEW_ROWS * multiprocessors`` rows; and for the last row, one and two rows long enough that each chunk holds
    two blocks or more (two blocks for each of the most chunks a row is cut into: ``MAX_CHUNKS``, or
    ``PROGRAMS_PER_MULTIPROCESSOR * multiprocessors`` where fewer)."""
    shapes, below = [], 0
    for bound, block, _, _ in HEURISTIC:
        longest = int(bound) if bound != math.inf else 4 * block
        for length in sorted({longest, min(block, longest)}):
            if length <= below:
                continue
            for steps in (length, length - 1):
                shapes += [(rows, steps) for rows in (1, 2, FEW_ROWS * multiprocessors)]
        below = bound
    chunked = 2 * HEURISTIC[-1][1] * min(MAX_CHUNKS, PROGRAMS_PER_MULTIPROCESSOR * multiprocessors)
    return shapes + [(rows, steps) for steps in (chunked, chunked - 1) for rows in (1, 2)]
