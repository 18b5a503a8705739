"""GPU tests of backend="triton": the compiled kernels on torch CUDA tensors against the float64 per-step loop.

The test run sets ``TRITON_INTERPRET=1`` (``tests/conftest.py``), and
Triton reads it once, at import: so the checks run in a Python process of their
own without it (``triton_cuda_checks.py`` beside this file), and this test
reports what that process found. Skipped where there is no CUDA GPU, no torch
CUDA build or no triton.
"""

from __future__ import annotations

import pytest
from triton_process import run_checks, unavailable

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("part", ["options", "layouts", "compiling"])
def test_triton_on_cuda_matches_the_loop(part):
    reason = unavailable()
    if reason is not None:
        pytest.skip(reason)
    run_checks("triton_cuda_checks.py", part)
