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
from typing import Any, Callable, Protocol

import numpy as np

from gae_xp._compat import (
    carries_tangents,
    device_of,
    is_dask_namespace,
    is_jax_namespace,
    is_torch_namespace,
    values_are_readable,
)
from gae_xp._problem import GaeProblem, PreparedCall, PreparedScan

# The two traceable routes are imported with the registry: neither imports a framework.
from . import jax as _lax_scan
from . import xp as _generic


class Backend(Protocol):
    """What a backend implements."""

    name: str
    #: True when ``gae`` honours a problem's ``offsets`` and ``carry`` (packed sequences, shards, blocks).
    segments: bool
    #: True when ``chunk_size`` changes how the scan runs (the chunked scan); kernels that walk the steps ignore it.
    uses_chunk_size: bool
    #: True when ``gae`` honours a problem's ``critic_lam`` in the same pass; else ``gae()`` runs a second pass.
    critic_lam: bool
    #: ``summarize(problem) -> (..., n, 5)``: each segment's summary (``gae_xp._pieces.FIELDS``) in one pass of
    #: its own, or None, and the summary is read off ``gae`` on stacked variants of the problem.
    summarize: Callable[[GaeProblem], Any] | None

    def unavailable_reason(self, xp, arrays, *, forced: bool = False) -> str | None:
        """None when this backend can serve these arrays, else why not (one line).

        ``forced`` is True when the caller named this backend rather than "auto".
        """

    def scan(self, xp, x, a, *, reverse: bool, chunk_size: int | None) -> Any:
        """``y_t = x_t + a_t y_{t+1}`` (reverse) or ``y_{t-1}`` (forward) along the last axis.

        ``a`` is a float or an array broadcastable to x; x is this package's
        own array, which the backend may overwrite or return.
        """

    def gae(self, problem: GaeProblem, *, chunk_size: int | None) -> tuple[Any, Any]:
        """(advantages, returns) of a ``GaeProblem``, time on the last axis, compute dtype."""


#: name -> module, in the order ``backend="auto"`` tries them (the last one serves every array).
REGISTRY: dict[str, str] = {
    "triton": "gae_xp.backends.triton",
    "numba-cuda": "gae_xp.backends.numba_cuda",
    "numba": "gae_xp.backends.numba_cpu",
    "jax": "gae_xp.backends.jax",
    "dask": "gae_xp.backends.dask",
    "xp": "gae_xp.backends.xp",
}

_LOADED: dict[str, Backend] = {"jax": _lax_scan.BACKEND, "xp": _generic.BACKEND}
_CHOSEN: dict = {}


def names() -> tuple[str, ...]:
    return ("auto", *REGISTRY)


def load(name: str) -> Backend:
    backend = _LOADED.get(name)
    if backend is None:
        backend = _LOADED[name] = importlib.import_module(REGISTRY[name]).BACKEND
    return backend


def select(name: str, xp, arrays, *, segments: bool = False) -> Backend:
    """The backend to run: the named one (ValueError if it cannot serve these arrays) or, for "auto", the first
    that can.

    ``segments``: the problem has segments or an incoming carry (packed
    sequences, a rank's shard, a Dask block), which not every backend takes.
    """
    if not isinstance(name, str) or name not in REGISTRY and name != "auto":
        raise ValueError(f"backend must be one of {', '.join(map(repr, names()))}, got {name!r}")
    if name != "auto":
        backend = load(name)
        reason = backend.unavailable_reason(xp, arrays, forced=True)
        if reason is None and segments and not backend.segments:
            reason = ("it does not take packed sequences or pieces (cu_seqlens, shards, blocks): "
                      f"{', '.join(repr(n) for n in _with_segments())} do")
        if reason is not None:
            raise ValueError(f"backend={name!r} cannot run on these arrays: {reason}")
        return backend
    if carries_tangents(arrays):  # forward-mode AD: the array-API path's torch operations carry the tangents
        return _generic.BACKEND
    if not all(values_are_readable(a) for a in arrays) or any(getattr(a, "requires_grad", False) for a in arrays):
        return _traceable(xp, arrays)
    kind = (_kind(xp, arrays), segments)
    chosen = _CHOSEN.get(kind)
    if chosen is None:
        chosen = _CHOSEN[kind] = next(backend for backend in map(load, REGISTRY)
                                      if backend.unavailable_reason(xp, arrays) is None
                                      and (backend.segments or not segments))
    return chosen


def solver(call: PreparedCall | PreparedScan, *, segments: bool = False) -> Backend:
    """The backend for a checked call: ``select`` on the backend it asked for and the arrays it was given.

    ``segments``: the caller will give the problem segments or a carry (a
    rank's shard, a Dask block); a call with packed sequences always needs them.
    """
    problem = getattr(call, "problem", None)
    segments = segments or (problem is not None and problem.offsets is not None)
    xp = call.xp if problem is None else problem.xp
    return select(call.backend, xp, list(call.arrays), segments=segments)


def solve_gae(problem: GaeProblem, backend: Backend, chunk_size: int | None, critic_carry=None) -> tuple[Any, Any]:
    """(advantages, returns) of a checked problem on a backend, time last, compute dtype.

    A decoupled ``critic_lam`` is solved in the backend's one pass where it
    takes one (``Backend.critic_lam``), else in two: the advantages with
    ``lam``, then the returns of the problem with ``lam = critic_lam``. A
    problem with an incoming ``carry`` (a piece) always takes two, since each
    chain has its own carry: the returns' is ``critic_carry``.
    """
    if problem.critic_lam is None:
        return backend.gae(problem, chunk_size=chunk_size)
    if problem.carry is None and backend.critic_lam:
        return backend.gae(problem, chunk_size=chunk_size)
    if problem.carry is not None and critic_carry is None:
        raise ValueError("a piece with critic_lam needs the returns' chain's own carry (critic_carry)")
    advantages, _ = backend.gae(problem.replace(critic_lam=None), chunk_size=chunk_size)
    critic = problem.replace(lam=problem.critic_lam, critic_lam=None, carry=critic_carry)
    _, returns = backend.gae(critic, chunk_size=chunk_size)
    return advantages, returns


def _with_segments() -> list[str]:
    """The registered backends that take segments and a carry (loaded: the attribute lives on the class)."""
    return [name for name in REGISTRY if load(name).segments]


def _traceable(xp, arrays) -> Backend:
    """For traced or lazy arrays, or tensors that record autograd history, a route that follows them: Dask's own
    graph for Dask arrays, lax.scan for JAX on a CPU, the custom operators for torch tensors where they have a
    kernel (``torch_ops``: one node under ``torch.compile``, the kernels' own backward), else the array-API chunk
    scan."""
    if is_dask_namespace(xp):
        return load("dask")
    if is_jax_namespace(xp) and _lax_scan.BACKEND.unavailable_reason(xp, arrays) is None:
        return _lax_scan.BACKEND
    if is_torch_namespace(xp):
        from . import torch_ops

        if torch_ops.BACKEND.unavailable_reason(xp, arrays) is None:
            return torch_ops.BACKEND
    return _generic.BACKEND


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
    """What auto's choice depends on: the namespace, the arrays' types, the first one's device (tensors that record
    autograd history never get here: ``select`` routes them first)."""
    types = tuple(map(type, arrays))
    if all(kind is np.ndarray for kind in types):  # the common case: NumPy arrays live on the CPU
        return xp, types
    return xp, types, str(device_of(arrays[0]))
