"""GPU tests of the torch operators as ``torch.library.triton_op``'s: ``torch.compile`` and CUDA-graph capture.

The test run sets ``TRITON_INTERPRET=1`` (``tests/conftest.py``), and Triton
reads it once, at import: so the checks run in a Python process of their own
without it (``triton_op_checks.py`` beside this file), and this test reports
what that process found. Skipped where there is no CUDA GPU, no torch CUDA
build or no triton.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.gpu


def _unavailable() -> str | None:
    if importlib.util.find_spec("torch") is None or importlib.util.find_spec("triton") is None:
        return "needs torch and triton"
    import torch

    if not torch.cuda.is_available():
        return "needs a CUDA GPU (torch.cuda.is_available() is False)"
    return None


@pytest.mark.parametrize("part", ["compile", "graphs"])
def test_the_compiled_operators_on_cuda(part):
    """torch.compile(fullgraph=True) of gae_xp.gae (forward and gradients, the Triton launches in the graphs) and
    the compiled call captured in a CUDA graph and replayed."""
    reason = _unavailable()
    if reason is not None:
        pytest.skip(reason)
    env = {name: value for name, value in os.environ.items() if name != "TRITON_INTERPRET"}
    script = Path(__file__).with_name("triton_op_checks.py")
    done = subprocess.run([sys.executable, str(script), part], capture_output=True, text=True, env=env, timeout=600)
    print(done.stdout[-5000:])
    assert done.returncode == 0, (done.stdout + done.stderr)[-5000:]
    assert "checked" in done.stdout
