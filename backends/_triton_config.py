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
#: Rows are cut into chunks only with fewer rows than this many times the multiprocessors (chunks read the inputs
#: twice; one program a row, two a multiprocessor, ran at 1.6x a copy at 256x131072 on the first H200: the
#: benchmark's baseline, tests/gpu/triton_gae.py) ...
FEW_ROWS = 1
#: ... and for this many programs per multiprocessor.
PROGRAMS_PER_MULTIPROCESSOR = 4
