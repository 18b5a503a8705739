"""Backends: who solves a checked, laid-out problem (installed as ``gae_xp.backends``).

A backend is a module of this package with a module-level ``BACKEND`` object
that implements :class:`Backend`. The registry names them in the order
``backend="auto"`` tries them. A backend's module is imported only when it is
asked whether it can serve the arrays at hand, and it answers from the arrays
first (their type and device) before it looks for its compiler, so ``import
gae_xp`` imports no framework and no compiler, and NumPy or array-api-strict
arrays never make numba-cuda load. The choice of "auto" is remembered per
kind of call (namespace, array types, device, autograd), so that it costs a
dictionary lookup after the first call.
"""

from __future__ import annotations

import contextlib
import importlib
import threading
from typing import Any, Protocol

from gae_xp._compat import device_of, is_dask_array, values_are_readable


class Backend(Protocol):
    """What a backend implements."""

    name: str

    def unavailable_reason(self, xp, arrays, *, forced: bool = False) -> str | None:
        """None when this backend can serve these arrays, else why not (one line).

        ``forced`` is True when the caller named this backend rather than "auto".
        """

    def scan(self, xp, x, a, *, reverse: bool, chunk_size: int | None) -> Any:
        """``y_t = x_t + a_t y_{t+1}`` (reverse) or ``y_{t-1}`` (forward) along the last axis.

        ``a`` is a float or an array broadcastable to x; x is this package's
        own array, which the backend may overwrite or return.
        """

    def gae(self, problem, *, chunk_size: int | None) -> tuple[Any, Any]:
        """(advantages, returns) of a ``gae_xp._prepare.GaeProblem``, time on the last axis, compute dtype."""


#: name -> module, in the order ``backend="auto"`` tries them (the last one serves every array).
REGISTRY: dict[str, str] = {
    "numba-cuda": "gae_xp.backends.numba_cuda",
    "numba": "gae_xp.backends.numba_cpu",
    "dask": "gae_xp.backends.dask",
    "xp": "gae_xp.backends.xp",
}

_CHOSEN: dict = {}


def names() -> tuple[str, ...]:
    return ("auto", *REGISTRY)


def load(name: str) -> Backend:
    return importlib.import_module(REGISTRY[name]).BACKEND


def select(name: str, xp, arrays) -> Backend:
    """The backend to run: the named one (ValueError if it cannot serve these arrays) or, for "auto", the first that can."""
    if not isinstance(name, str) or name not in REGISTRY and name != "auto":
        raise ValueError(f"backend must be one of {', '.join(map(repr, names()))}, got {name!r}")
    if name != "auto":
        backend = load(name)
        reason = backend.unavailable_reason(xp, arrays, forced=True)
        if reason is not None:
            raise ValueError(f"backend={name!r} cannot run on these arrays: {reason}")
        return backend
    if not all(values_are_readable(a) for a in arrays):
        if any(is_dask_array(a) for a in arrays):
            return load("dask")  # Dask arrays: the chunk scan as Dask's own graph, gae_xp on every block
        return load("xp")  # traced arrays: only the array-API route can follow them
    kind = _kind(xp, arrays)
    chosen = _CHOSEN.get(kind)
    if chosen is None:
        chosen = _CHOSEN[kind] = next(backend for backend in map(load, REGISTRY)
                                      if backend.unavailable_reason(xp, arrays) is None)
    return chosen


_LOCAL = threading.local()


@contextlib.contextmanager
def single_threaded():
    """Within this block, backends compute on the calling thread only (no thread pool of their own).

    For work that is itself one of many tasks run in parallel (the Dask
    backend's block tasks): nested thread pools only contend for the cores.
    """
    before = getattr(_LOCAL, "single", False)
    _LOCAL.single = True
    try:
        yield
    finally:
        _LOCAL.single = before


def is_single_threaded() -> bool:
    """True inside ``single_threaded()`` on this thread."""
    return getattr(_LOCAL, "single", False)


def _kind(xp, arrays):
    """What auto's choice depends on: the namespace, the arrays' types, the first one's device, autograd."""
    return (xp, tuple(type(a) for a in arrays), str(device_of(arrays[0])),
            any(getattr(a, "requires_grad", False) for a in arrays))
