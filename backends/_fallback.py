"""When a kernel route's compiler fails: tell a compiler failure from a caller's error, remember it, say it once.

A kernel route (numba on the CPU, numba-CUDA, Triton) can fail to import its
compiler (``import numba`` raising "Numba needs NumPy ..."), to compile a
kernel (numba-cuda 0.30.4 under NumPy 2.5: ``numpy.row_stack`` is gone; a
missing libNVVM; a Triton without a backend) or to launch one. Such a failure
is recognised by where it comes from, never by its message:

* an ``ImportError`` (a compiler or one of its parts that does not import), or
* an exception of a class defined in a compiler's package (numba's
  ``TypingError``, ``LoweringError``, Triton's ``CompilationError``), or
* any exception raised inside a compiler's package (``numba``, ``llvmlite``,
  ``numba_cuda``, ``numba_cuda_mlir``, ``triton``): of the frames it passed
  through, the innermost that is gae_xp's or a compiler's is a compiler's (the
  ``AttributeError`` of ``numpy.row_stack`` comes from ``numba.np.arrayobj``
  or ``numba.cuda.np.arrayobj``, through NumPy's module ``__getattr__``).

A caller's error (a ``ValueError`` naming an argument, raised by gae_xp's own
checks or by a compiled kernel, whose innermost frame is gae_xp's call of the
kernel) is none of these and propagates unchanged.

A failed route is remembered for the process (``broken``): ``backend="auto"``
goes straight to the next route from then on, and never retries it per call.
Each cause is warned about once per process (``RouteUnavailableWarning``); a
caller who named the route gets ``RouteUnavailableError`` with the same text,
chained to the original exception.
"""

from __future__ import annotations

import importlib.metadata
import sys
import threading
import warnings

import numpy as np

#: The top-level modules of the kernel compilers: an exception raised inside them is a compiler failure.
COMPILER_MODULES = ("numba", "llvmlite", "numba_cuda", "numba_cuda_mlir", "triton")
#: The distribution of each route's compiler (what ``pip`` installs), for the messages.
ROUTE_PACKAGES = {"numba": "numba", "numba-cuda": "numba-cuda", "triton": "triton", "torch-op": "numba"}


class RouteUnavailableWarning(UserWarning):
    """A kernel route could not import, compile or launch its kernels: ``backend="auto"`` fell back to the next
    route (the answer is the fallback route's, as exact as ever). Issued once per process and cause."""


class RouteUnavailableError(RuntimeError):
    """A backend named by the caller could not import, compile or launch its kernels (the original exception is
    its ``__cause__``)."""


_BROKEN: dict[str, str] = {}
_ERRORS: dict[str, BaseException] = {}
_WARNED: set[str] = set()
_LOCK = threading.Lock()


def is_compiler_failure(error: BaseException) -> bool:
    """True when ``error`` comes from a kernel compiler (import, compile or launch), not from the caller's input.

    Memory running out is never one: it says nothing of the route, which must stay usable for the next call."""
    if isinstance(error, MemoryError):
        return False
    if isinstance(error, ImportError):
        return True
    if _top_module(type(error).__module__) in COMPILER_MODULES:
        return True
    return _raised_in_compiler(error)


def broken(name: str) -> str | None:
    """Why the route ``name`` failed in this process, or None if it has not."""
    return _BROKEN.get(name)


def record(name: str, error: BaseException) -> str:
    """Remember that route ``name`` failed with ``error`` (a compiler failure) and return the cause, in words."""
    cause = describe(name, error)
    with _LOCK:
        _BROKEN.setdefault(name, cause)
        _ERRORS.setdefault(name, error)
    return _BROKEN[name]


def failure(name: str) -> BaseException | None:
    """The exception with which route ``name`` failed in this process (None if it has not)."""
    return _ERRORS.get(name)


def warn_once(name: str, cause: str, fallback: str) -> None:
    """Warn that route ``name`` is unavailable for ``cause`` and that ``fallback`` serves instead, once per cause."""
    with _LOCK:
        if cause in _WARNED:
            return
        _WARNED.add(cause)
    warnings.warn(f"gae_xp: the {name!r} route is unavailable: {cause}; falling back to {fallback!r} (the same "
                  "answers, slower)", RouteUnavailableWarning, stacklevel=_caller_level())


def refuse(name: str, cause: str) -> RouteUnavailableError:
    """The error for a caller who named the failed route ``name`` (raise it ``from error``)."""
    return RouteUnavailableError(f"backend={name!r} is unavailable: {cause}")


def describe(name: str, error: BaseException) -> str:
    """The cause of a compiler failure, naming the packages and their versions, and what to do."""
    numpy = f"NumPy {np.__version__}"
    package = _package_of(error) or ROUTE_PACKAGES.get(name, name)
    installed = f"{package} {_version(package)}"
    if isinstance(error, AttributeError) and "row_stack" in str(error):
        advice = "pip install 'numpy<2.5'"
        if package == "numba-cuda":
            advice += ", or install numba-cuda-mlir"
        return f"{installed} cannot compile with {numpy} (numpy.row_stack was removed): {advice}"
    detail = f"{type(error).__name__}: {_first_line(error)}"
    if isinstance(error, ImportError):
        return (f"{installed} does not import with {numpy} ({detail}): install a {package} release that supports "
                f"{numpy}, or a NumPy that {package} {_version(package)} supports")
    return (f"{installed} failed to compile or launch the kernels with {numpy} ({detail}): install another "
            f"{package} release, or pass backend='xp'")


def _caller_level() -> int:
    """The ``stacklevel`` that makes a warning issued by this module's caller point at the first frame outside
    gae_xp (the user's call)."""
    level, frame = 2, sys._getframe(2)
    while frame is not None and (frame.f_globals.get("__name__") or "").startswith("gae_xp"):
        frame, level = frame.f_back, level + 1
    return level


def _first_line(error: BaseException) -> str:
    lines = str(error).strip().splitlines()
    return lines[0] if lines else ""


def _top_module(module: str | None) -> str:
    return (module or "").split(".")[0]


def _raised_in_compiler(error: BaseException) -> bool:
    """True when, of the frames ``error`` passed through, the innermost one that is gae_xp's or a compiler's is a
    compiler's (numba's import of ``numpy.row_stack`` raises in NumPy's module ``__getattr__``, below numba's frame;
    a compiled kernel's own ``ValueError`` has gae_xp's call as its innermost frame)."""
    tb, inside = error.__traceback__, False
    while tb is not None:
        module = tb.tb_frame.f_globals.get("__name__") or ""
        if _top_module(module) in COMPILER_MODULES:
            inside = True
        elif _top_module(module) == "gae_xp":
            inside = False
        tb = tb.tb_next
    return inside


def _package_of(error: BaseException) -> str | None:
    """The distribution whose code raised ``error`` (or failed to import), None when none of the compilers'."""
    missing = getattr(error, "name", None) if isinstance(error, ImportError) else None
    tb, found = error.__traceback__, None
    while tb is not None:  # the innermost frame of a compiler's package decides
        module = tb.tb_frame.f_globals.get("__name__") or ""
        if _top_module(module) in COMPILER_MODULES:
            found = (module, tb.tb_frame.f_code.co_filename)
        tb = tb.tb_next
    if found is None and missing:
        found = (missing, "")
    if found is None:
        return None
    module, filename = found
    top = _top_module(module)
    if top == "numba_cuda_mlir":
        return "numba-cuda-mlir"
    if top == "numba_cuda" or module.startswith("numba.cuda") or "numba_cuda" in filename:
        return "numba-cuda"
    return top


def _version(package: str) -> str:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return "(version unknown)"
