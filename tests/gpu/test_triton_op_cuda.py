"""GPU tests of the torch operators as ``torch.library.triton_op``'s: ``torch.compile`` and CUDA-graph capture.

The test run sets ``TRITON_INTERPRET=1`` (``tests/conftest.py``), and Triton
reads it once, at import: so the checks run in a Python process of their own
without it (``triton_op_checks.py`` beside this file), and this test reports
what that process found. Skipped where there is no CUDA GPU, no torch CUDA
build or no triton.
"""

from __future__ import annotations

import pytest
from triton_process import run_checks, unavailable

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("part", ["compile", "graphs"])
def test_the_compiled_operators_on_cuda(part):
    """torch.compile(fullgraph=True) of gae_xp.gae (forward and gradients, the Triton launches in the graphs) and
    the compiled call captured in a CUDA graph and replayed."""
    reason = unavailable()
    if reason is not None:
        pytest.skip(reason)
    run_checks("triton_op_checks.py", part)
