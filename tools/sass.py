"""SASS, the machine code a cubin holds: its instructions listed, and the instructions a thread issues, counted.

``listing`` disassembles a cubin with ``cuobjdump -sass`` (from the PATH, or
the one Triton's wheel bundles); ``ptxas`` finds the assembler of the
``nvidia-cuda-nvcc`` wheel. ``per_step`` and ``per_thread`` read a listing's
loops from its backward branches:

* a *scan* loop is an innermost loop holding a barrier (``BAR.SYNC``): the
  numba-CUDA kernels' Hillis-Steele block scans, one trip per doubling step;
* the *walk* is the loop around a scan (the lean kernels' walk over a row's
  tiles), or, where ``scan_loops`` is False (Triton kernels: their
  ``tl.associative_scan`` is unrolled, with barriers but no loop), the
  outermost loop (the walk over a row's blocks); without a walk a thread runs
  the whole kernel once (the general numba-CUDA kernels: one tile a block).

Both sides of every branch count: a static count, an upper bound of the path
one thread runs.
"""

from __future__ import annotations

import importlib.util
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path


def ptxas() -> str | None:
    """ptxas of the ``nvidia-cuda-nvcc`` wheel, or from the PATH, or None."""
    try:  # find_spec raises when the parent package "nvidia" itself is absent
        spec = importlib.util.find_spec("nvidia.cuda_nvcc")
    except ModuleNotFoundError:
        spec = None
    for root in (spec.submodule_search_locations or []) if spec else []:
        candidate = Path(root) / "bin" / "ptxas"
        if candidate.exists():
            return str(candidate)
    return shutil.which("ptxas")


def cuobjdump() -> str | None:
    """cuobjdump from the PATH, or the one Triton's wheel bundles, or None."""
    found = shutil.which("cuobjdump")
    if found:
        return found
    spec = importlib.util.find_spec("triton")
    for root in (spec.submodule_search_locations or []) if spec else []:
        candidate = Path(root) / "backends" / "nvidia" / "bin" / "cuobjdump"
        if candidate.exists():
            return str(candidate)
    return None


def listing(cubin: Path | bytes) -> tuple[tuple[int, str], ...] | None:
    """(address, instruction) of a cubin's SASS (a file, or its bytes), or None without cuobjdump; without the
    padding that follows each kernel's code (``NOP``, and the ``BRA`` to itself that traps a thread running past
    its last ``EXIT``), which no thread issues."""
    if cuobjdump() is None:
        return None
    if isinstance(cubin, bytes):
        with tempfile.NamedTemporaryFile(suffix=".cubin") as file:
            file.write(cubin)
            file.flush()
            return listing(Path(file.name))
    done = subprocess.run([cuobjdump(), "-sass", str(cubin)], capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"cuobjdump -sass {cubin} failed: {done.stderr.strip()}")
    found = (re.match(r"\s*/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;", line) for line in done.stdout.splitlines())
    code = ((int(m.group(1), 16), m.group(2)) for m in found if m)
    return tuple((address, instruction) for address, instruction in code
                 if instruction != "NOP" and instruction != f"BRA 0x{address:x}")


@dataclass(frozen=True)
class Loops:
    """A listing's instructions in all (``total``), in its walk (``walk``, 0 without one; a scan inside it counted
    once) and in each of its scan loops (``scans``)."""

    total: int
    walk: int
    scans: tuple[int, ...]


def loops(code, *, scan_loops: bool = True) -> Loops:
    """The loops of a listing (see the module docstring)."""
    found = []
    for address, instruction in code:
        target = re.search(r"\bBRA\s+0x([0-9a-f]+)", instruction)
        if target and int(target.group(1), 16) < address:
            found.append((int(target.group(1), 16), address))

    def size(loop):
        return (loop[1] - loop[0]) // 16 + 1

    if not scan_loops:
        outermost = [(lo, hi) for lo, hi in found if not any((a, b) != (lo, hi) and a <= lo and hi <= b
                                                             for a, b in found)]
        return Loops(len(code), max(map(size, outermost), default=0), ())
    barriers = [address for address, instruction in code if "BAR.SYNC" in instruction]
    scans = [(lo, hi) for lo, hi in found if any(lo <= b <= hi for b in barriers)
             and not any((a, b) != (lo, hi) and lo <= a and b <= hi for a, b in found)]
    walks = [(lo, hi) for lo, hi in found if any(lo < a and b <= hi for a, b in scans)]
    return Loops(len(code), size(walks[0]) if walks else 0, tuple(map(size, scans)))


def per_thread(shape: Loops, walk_trips: int, scan_trips: int) -> int:
    """Instructions one thread issues: what lies outside the walk once, the walk ``walk_trips`` times, each scan
    loop ``scan_trips`` times per trip of the walk (or once, without a walk)."""
    scans = sum((scan_trips - 1) * size for size in shape.scans)
    if not shape.walk:
        return shape.total + scans
    return shape.total - shape.walk + walk_trips * (shape.walk + scans)


def per_step(code, items: int, scan_steps: int) -> float:
    """SASS instructions a thread issues per step of a tile: the walk's trip (or the whole kernel) with each scan
    run ``scan_steps`` times, over the ``items`` steps a thread holds."""
    shape = loops(code)
    scans = sum((scan_steps - 1) * size for size in shape.scans)
    return ((shape.walk or shape.total) + scans) / items
