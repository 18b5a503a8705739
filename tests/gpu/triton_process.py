"""What the GPU tests of the Triton kernels share: their checks run in a Python process of their own.

The test run sets ``TRITON_INTERPRET=1`` (``tests/conftest.py``), and Triton
reads it once, at import: so a check script beside this file runs without
it, and the test reports what that process found.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path


def unavailable() -> str | None:
    """Why the Triton kernels cannot run on a GPU here (no torch or triton, no CUDA GPU), or None."""
    if importlib.util.find_spec("torch") is None or importlib.util.find_spec("triton") is None:
        return "needs torch and triton"
    import torch

    if not torch.cuda.is_available():
        return "needs a CUDA GPU (torch.cuda.is_available() is False)"
    return None


def run_checks(script: str, part: str) -> None:
    """Run ``script`` (a file beside this one) on ``part`` without ``TRITON_INTERPRET``; AssertionError with its
    output's tail unless it exits 0 having printed "checked"."""
    env = {name: value for name, value in os.environ.items() if name != "TRITON_INTERPRET"}
    path = Path(__file__).with_name(script)
    done = subprocess.run([sys.executable, str(path), part], capture_output=True, text=True, env=env, timeout=600)
    print(done.stdout[-5000:])
    assert done.returncode == 0, (done.stdout + done.stderr)[-5000:]
    assert "checked" in done.stdout
