"""The one place the fused CUDA kernels import their compiler from: numba-cuda-mlir or numba-cuda.

numba-cuda is in maintenance mode; numba-cuda-mlir (``numba_cuda_mlir``) is its
successor, with the same kernel language (``cuda.jit``, ``cuda.shared.array``,
``cuda.local.array``, ``cuda.syncthreads``, explicit signatures built from
``types``). This module takes numba-cuda-mlir where it is installed and
numba-cuda (``numba.cuda``) otherwise. numba-cuda-mlir has no simulator, so
under ``NUMBA_ENABLE_CUDASIM=1`` the kernels always run on numba-cuda's.
``GAE_XP_CUDA_COMPILER=numba-cuda`` or ``=numba-cuda-mlir`` forces one (read
once, when this module is first imported).

``compile_ptx`` compiles a kernel for a target on a machine without a GPU,
on either compiler: both ask the current device for its compute capability
while they type a call, even when the target is given, and are answered with
the target's.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
from types import SimpleNamespace

NUMBA_CUDA, NUMBA_CUDA_MLIR = "numba-cuda", "numba-cuda-mlir"
COMPILERS = (NUMBA_CUDA_MLIR, NUMBA_CUDA)
ENVIRONMENT_VARIABLE = "GAE_XP_CUDA_COMPILER"


def installed() -> tuple[str, ...]:
    """The compilers that are installed, numba-cuda-mlir first."""
    found = []
    if importlib.util.find_spec("numba_cuda_mlir") is not None:
        found.append(NUMBA_CUDA_MLIR)
    if importlib.util.find_spec("numba") is not None and importlib.util.find_spec("numba.cuda") is not None:
        found.append(NUMBA_CUDA)
    return tuple(found)


def choose(environ=os.environ, available: tuple[str, ...] | None = None) -> str:
    """The compiler the kernels use: the forced one, else numba-cuda-mlir where installed, else numba-cuda.

    Raises
    ------
    ValueError
        ``GAE_XP_CUDA_COMPILER`` names no compiler, or numba-cuda-mlir is forced under the simulator.
    ImportError
        The forced compiler, or every compiler, is missing.
    """
    available = installed() if available is None else available
    simulated = environ.get("NUMBA_ENABLE_CUDASIM", "0") == "1"
    forced = environ.get(ENVIRONMENT_VARIABLE, "")
    if forced and forced not in COMPILERS:
        raise ValueError(f"{ENVIRONMENT_VARIABLE} must be one of {COMPILERS}, got {forced!r}")
    if forced == NUMBA_CUDA_MLIR and simulated:
        raise ValueError(f"{ENVIRONMENT_VARIABLE}={NUMBA_CUDA_MLIR} with NUMBA_ENABLE_CUDASIM=1: numba-cuda-mlir "
                         "has no simulator")
    wanted = forced or (NUMBA_CUDA if simulated else next(iter(available), NUMBA_CUDA))
    if wanted not in available:
        extra = "numba-cuda-mlir[cu12]" if wanted == NUMBA_CUDA_MLIR else "numba-cuda[cu12]"
        raise ImportError(f"the CUDA kernels need {wanted}, which is not installed (pip install '{extra}')")
    return wanted


NAME = choose()
if NAME == NUMBA_CUDA_MLIR:
    from numba_cuda_mlir import cuda, types
else:
    from numba import cuda, types


@contextlib.contextmanager
def _answering_compute_capability(cc: tuple[int, int]):
    """While inside, the compiler's question "which compute capability has the current device?" gets ``cc``."""
    if NAME == NUMBA_CUDA_MLIR:
        from numba_cuda_mlir import tools

        saved = tools._cached_cc
        tools._cached_cc = tuple(cc)
        try:
            yield
        finally:
            tools._cached_cc = saved
    else:
        import numba.cuda.dispatcher

        saved = numba.cuda.dispatcher.get_current_device
        numba.cuda.dispatcher.get_current_device = lambda: SimpleNamespace(compute_capability=tuple(cc))
        try:
            yield
        finally:
            numba.cuda.dispatcher.get_current_device = saved


def compile_ptx(function, signature, cc: tuple[int, int]) -> str:
    """The PTX of the kernel ``function`` with its explicit ``signature`` for compute capability ``cc``, on the
    chosen compiler, with or without a GPU."""
    with _answering_compute_capability(cc):
        ptx, _ = cuda.compile_ptx(function, signature, cc=tuple(cc))
    return ptx


__all__ = ["COMPILERS", "NAME", "choose", "compile_ptx", "cuda", "installed", "types"]
