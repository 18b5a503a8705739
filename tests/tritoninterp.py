"""What the test modules of the Triton kernels under Triton's interpreter share.

``TRITON_INTERPRET=1`` must be set before triton is imported (Triton reads it
when its kernels are decorated): ``tests/conftest.py`` sets it for every test,
and ``require_interpreter()`` sets it too, for a module run on its own. Such a
module calls it before it imports the backend; it is skipped where torch or
triton is not installed, or where triton was imported before the variable was
set (its kernels then need a GPU).
"""

from __future__ import annotations

import importlib.util
import os

import pytest


def require_interpreter():
    """torch, once Triton's interpreter is known to run the kernels on CPU tensors; else the calling module is
    skipped."""
    os.environ.setdefault("TRITON_INTERPRET", "1")
    torch = pytest.importorskip("torch")
    if importlib.util.find_spec("triton") is None:
        pytest.skip("triton is not installed (pip install triton): its interpreter runs the kernels on the CPU",
                    allow_module_level=True)
    import triton

    if not triton.knobs.runtime.interpret:
        pytest.skip("triton was imported before TRITON_INTERPRET=1 was set: its kernels need a GPU here",
                    allow_module_level=True)
    return torch


def record_launches(monkeypatch) -> list:
    """Record every launch of the Triton route's ``gae_kernel`` (its arguments and keywords) and run it."""
    from gae_xp.backends import _triton_launch

    calls = []
    kernel = _triton_launch.gae_kernel

    class Recording:
        def __getitem__(self, grid):
            def launch(*args, **kwargs):
                calls.append((args, kwargs))
                return kernel[grid](*args, **kwargs)

            return launch

    monkeypatch.setattr(_triton_launch, "gae_kernel", Recording())
    return calls
