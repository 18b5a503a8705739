"""The Triton kernels compiled for sm_90 without a GPU (``tests/triton_ptx.py``): 16-byte accesses, no local memory,
instructions per step within the H200's issue budget.

The compilation runs in a process of its own, without ``TRITON_INTERPRET``
(which replaces the compiler). Every kernel of the package is compiled in
aligned, contiguous float32 layouts (``tests/triton_ptx.cases``: the scans,
the adjoint, the estimators and GAE's one pass and chunk passes).

The instruction bound. An H200 issues at most 132 SMs x 4 schedulers x 32
lanes x 1.98 GHz = 33.4e12 thread instructions per second; a copy moved
3.67 TB/s on it (``../shared/gpu`` table: 38400x128, 16 B a step, 21.4 us).
A kernel that moves ``b`` bytes a step at the copy's speed handles
3.67e12 / b steps a second, so it can spend 33.4e12 / (3.67e12 / b) = 9.1 b
instructions a step before issue, not memory, bounds it. The static SASS
count of the walk over the blocks (the loop's body, once pipelined its steady
state: the prologue that starts the pipeline is outside it) on the path a
block of finite numbers takes (without the paths of a block holding a NaN, an
inf or a masked step; GAE's value chain on a block with masked steps is
bounded the same way) divided by the steps a thread handles per block is
what a long row issues a step; the bound allows 1.25x the budget (the issue's
target), so a kernel above it cannot come near the copy however it is
launched.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

if importlib.util.find_spec("triton") is None:
    pytest.skip("triton is not installed", allow_module_level=True)

ROOT = Path(__file__).parent.parent
SCRIPT = Path(__file__).parent / "triton_ptx.py"
ISSUE_RATE = 132 * 4 * 32 * 1.98e9  # thread instructions per second, H200
COPY_BANDWIDTH = 16 * 38400 * 128 / 21.4e-6  # bytes per second, the measured copy


def _ptxas():
    import triton

    return Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "ptxas"


def _described(*arguments) -> list:
    """``tests/triton_ptx.py``'s JSON (in a process without ``TRITON_INTERPRET``)."""
    if not _ptxas().exists():
        pytest.skip(f"Triton's ptxas is missing ({_ptxas()})")
    environment = {key: value for key, value in os.environ.items() if key != "TRITON_INTERPRET"}
    done = subprocess.run([sys.executable, str(SCRIPT), *arguments], cwd=ROOT, env=environment, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout)


@pytest.fixture(scope="module")
def kernels() -> dict:
    return {case["name"]: case for case in _described()}


def test_a_pipelined_walk_takes_the_shared_memory_its_launch_counts():
    """A Plan lowers the stages until ``_triton_config.pipeline_bytes`` fits the device (an RTX 30xx or 40xx: 99 KB
    a program, an A100 163 KB): the estimate bounds what the compiled kernels take, in every dtype and with every
    option; in the constant case, where every load is pipelined, within what it keeps besides the buffers (loads
    inside a masked block's branch, V_{t+1} among them, stay unpipelined: there it over-counts)."""
    from gae_xp.backends import _triton_config

    for case in _described("shared"):
        estimate = _triton_config.pipeline_bytes(case["stages"], case["block"], case["step_bytes"])
        assert case["shared"] <= estimate, case
        if case["name"].endswith("constant"):
            assert case["shared"] > estimate - 2 * _triton_config.SHARED_MEMORY_BESIDES, (case, estimate)


pytestmark = pytest.mark.slow  # about 25 s of compilation on a shared 2-core machine


def test_every_kernel_is_compiled(kernels):
    from gae_xp.backends import _triton_gae, _triton_scan

    names = " ".join(kernels)
    for function in ("scan", "adjoint", "discounted returns", "lambda-returns", "V-trace", "GAE, constant",
                     "GAE, terminated and mask", "GAE, chunks' final pass"):
        assert function in names
    assert {"_scan_rows", "_adjoint_rows", "_reverse_rows"} <= set(vars(_triton_scan))
    assert "gae_kernel" in vars(_triton_gae)


def test_float_accesses_are_16_bytes_wide(kernels):
    """Aligned contiguous float rows are read and written 16 bytes at a time: loads into registers, or, where the
    walk over the blocks is pipelined (the GAE kernel's ``STAGES`` > 1, as chunks of a long row are launched),
    copies into shared memory (``cp.async``). The only narrower accesses are the bool flags (4 steps of 1 byte a
    thread; the GAE kernel reads its flags a byte at a time: 1 byte of its 18 a step), the per-segment values
    (bootstrap, carry: one number) and the values one step on (V_{t+1}, the neighbour's: 4 bytes, not
    aligned)."""
    for name, case in kernels.items():
        pipelined = case["pipelined"]
        assert ("cp.async 16 B" in case["async_loads"]) if pipelined else ("ld.global.v4.b32" in case["loads"]), name
        assert "st.global.v4.b32" in case["stores"], name
        flags = {"ld.global.b8"} if name.startswith("GAE") and "terminated" in name else set()
        assert set(case["loads"]) <= {"ld.global.v4.b32", "ld.global.b32", *flags}, name
        assert set(case["async_loads"]) <= ({"cp.async 16 B", "cp.async 4 B"} if pipelined else set()), name
        assert set(case["stores"]) <= {"st.global.v4.b32", "st.global.b32"}, name


def test_no_local_memory(kernels):
    for name, case in kernels.items():
        assert not case["local"], f"{name}: PTX uses local memory"
        assert case["sass_local"] == 0, f"{name}: ptxas spills ({case['sass_local']} LDL/STL)"


def test_instructions_per_step_within_the_issue_budget(kernels):
    for name, case in kernels.items():
        budget = ISSUE_RATE / (COPY_BANDWIDTH / case["bytes_per_step"])
        assert case["walk_finite"], f"{name}: no walk over the blocks found in its SASS"
        per_step = case["walk_finite"] / case["steps_per_thread"]
        assert per_step <= 1.25 * budget, f"{name}: {per_step:.0f} SASS instructions a step, budget {budget:.0f}"
        if case["walk_holed"] is not None:  # the value chain's path, which every block of a random mask takes
            holed = case["walk_holed"] / case["steps_per_thread"]
            assert per_step < holed <= 1.25 * budget, (
                f"{name}: {holed:.0f} SASS instructions a step on a block with masked steps, budget {budget:.0f}")
        if not case["pipelined"]:  # the whole listing a step too, prologue included (a pipeline's is outside)
            listed = case["sass_finite"] / case["steps_per_thread"]
            assert listed <= 1.5 * budget, f"{name}: {listed:.0f} SASS instructions a step listed, budget {budget:.0f}"
