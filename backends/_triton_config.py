"""The Triton route's launch heuristic: how the block, warps, stages and chunks are chosen (nothing imported at
load: the backend module, the launch module and ``gae_xp.warm_up`` read it)."""

import math

#: (steps per program at most, block, num_warps, num_stages): the first row whose bound holds. The stages
#: pipeline a program's walk over its blocks (the loads of the next blocks in flight while one is solved): rows
#: cut into chunks of several blocks take the row's; every other launch 1 (``_triton_launch._config``).
HEURISTIC = (
    (128, 128, 1, 2),
    (512, 512, 4, 2),
    (2048, 1024, 4, 3),
    (math.inf, 2048, 8, 3),
)
#: The interpreter's stand-in for a GPU's multiprocessor count (it decides when rows are cut into chunks).
INTERPRETER_MULTIPROCESSORS = 4
#: Rows are cut into chunks only with fewer rows than this many times the multiprocessors (chunks read the inputs
#: twice; one program a row, two a multiprocessor, ran at 1.6x a copy at 256x131072 on the first H200: the
#: benchmark's baseline, tests/gpu/triton_gae.py) ...
FEW_ROWS = 1
#: ... and for this many programs per multiprocessor.
PROGRAMS_PER_MULTIPROCESSOR = 4


def multiprocessors(device) -> int:
    """The multiprocessors of a torch device: a CUDA device's own, else the interpreter's stand-in."""
    if device.type != "cuda":
        return INTERPRETER_MULTIPROCESSORS
    import torch

    return torch.cuda.get_device_properties(device).multi_processor_count


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
    two blocks or more (two blocks per program at most ``PROGRAMS_PER_MULTIPROCESSOR * multiprocessors``
    programs a row)."""
    shapes, below = [], 0
    for bound, block, _, _ in HEURISTIC:
        longest = int(bound) if bound != math.inf else 4 * block
        for length in sorted({longest, min(block, longest)}):
            if length <= below:
                continue
            for steps in (length, length - 1):
                shapes += [(rows, steps) for rows in (1, 2, FEW_ROWS * multiprocessors)]
        below = bound
    chunked = 2 * HEURISTIC[-1][1] * PROGRAMS_PER_MULTIPROCESSOR * multiprocessors
    return shapes + [(rows, steps) for steps in (chunked, chunked - 1) for rows in (1, 2)]
