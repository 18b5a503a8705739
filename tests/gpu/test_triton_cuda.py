"""GPU tests of backend="triton": the compiled kernels on torch CUDA tensors against the float64 per-step loop.

The test run sets ``TRITON_INTERPRET=1`` (``tests/conftest.py``), and
Triton reads it once, at import: so the checks run in a Python process of their
own without it (``triton_cuda_checks.py`` beside this file), and this test
reports what that process found. Skipped where there is no CUDA GPU, no torch
CUDA build or no triton.
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


@pytest.mark.parametrize("part", ["options", "layouts", "compiling"])
def test_triton_on_cuda_matches_the_loop(part):
    reason = _unavailable()
    if reason is not None:
        pytest.skip(reason)
    env = {name: value for name, value in os.environ.items() if name != "TRITON_INTERPRET"}
    script = Path(__file__).with_name("triton_cuda_checks.py")
    done = subprocess.run([sys.executable, str(script), part], capture_output=True, text=True, env=env,
                          timeout=600)
    print(done.stdout[-5000:])
    assert done.returncode == 0, (done.stdout + done.stderr)[-5000:]
    assert "checked" in done.stdout
