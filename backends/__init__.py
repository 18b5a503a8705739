"""Backends: who solves a checked, laid-out problem (installed as ``gae_xp.backends``).

A backend is a module of this package with a module-level ``BACKEND`` object
that implements :class:`Backend`. The registry below names them in the order
``backend="auto"`` tries them; a backend's module is imported only when it is
asked whether it can serve the arrays at hand, so ``import gae_xp`` imports no
framework and no compiler.
"""

from __future__ import annotations

import importlib
from typing import Any, Protocol


class Backend(Protocol):
    """What a backend implements."""

    name: str

    def unavailable_reason(self, xp, arrays, *, forced: bool = False) -> str | None:
        """None when this backend can serve these arrays, else why not (one line).

        ``forced`` is True when the caller named this backend rather than "auto".
        """

    def scan(self, xp, x, a, *, reverse: bool, chunk_size: int | None, overwrite_x: bool = False) -> Any:
        """``y_t = x_t + a_t y_{t+1}`` (reverse) or ``y_{t-1}`` (forward) along the last axis.

        ``a`` is a float or an array broadcastable to x; with ``overwrite_x``
        the caller gives x up as scratch space.
        """

    def gae(self, problem, *, chunk_size: int | None) -> tuple[Any, Any]:
        """(advantages, returns) of a ``gae_xp._inputs.GaeProblem``, time on the last axis, compute dtype."""


#: name -> module, in the order ``backend="auto"`` tries them (the last one serves every array).
REGISTRY: dict[str, str] = {
    "numba-cuda": "gae_xp.backends.numba_cuda",
    "numba": "gae_xp.backends.numba_cpu",
    "xp": "gae_xp.backends.xp",
}


def names() -> tuple[str, ...]:
    return ("auto", *REGISTRY)


def load(name: str) -> Backend:
    return importlib.import_module(REGISTRY[name]).BACKEND


def select(name: str, xp, arrays) -> Backend:
    """The backend to run: the named one (ValueError if it cannot serve these arrays) or, for "auto", the first that can."""
    if not isinstance(name, str) or name not in names():
        raise ValueError(f"backend must be one of {', '.join(map(repr, names()))}, got {name!r}")
    if name != "auto":
        backend = load(name)
        reason = backend.unavailable_reason(xp, arrays, forced=True)
        if reason is not None:
            raise ValueError(f"backend={name!r} cannot run on these arrays: {reason}")
        return backend
    for candidate in REGISTRY:
        backend = load(candidate)
        if backend.unavailable_reason(xp, arrays) is None:
            return backend
    raise AssertionError("the 'xp' backend serves every array namespace")
