"""The Triton route's launch heuristic: how the block, warps, stages and chunks are chosen (no imports: the
backend module and the launch module both read it)."""

import math

#: (steps per program at most, block, num_warps, num_stages): the first row whose bound holds.
HEURISTIC = (
    (128, 128, 1, 2),
    (512, 512, 4, 2),
    (2048, 1024, 4, 3),
    (math.inf, 2048, 8, 3),
)
#: The interpreter's stand-in for a GPU's multiprocessor count (it decides when rows are cut into chunks).
INTERPRETER_MULTIPROCESSORS = 4
#: Rows are cut into chunks only with fewer rows than this many times the multiprocessors ...
FEW_ROWS = 2
#: ... and for this many programs per multiprocessor.
PROGRAMS_PER_MULTIPROCESSOR = 4
