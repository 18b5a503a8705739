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

A kernel route whose compiler fails to import, compile or launch (told from a
caller's error by ``_fallback.is_compiler_failure``) is remembered for the
process: "auto" falls to the next route that serves the arrays, the generic
path last, with one ``RouteUnavailableWarning`` per cause; a caller who named
the route gets ``RouteUnavailableError``. ``run`` does that around a call's
work, ``attempt`` around a kernel that has a generic twin (the group kernels).
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
    is_cupy_array,
    is_dask_namespace,
    is_jax_namespace,
    is_torch_namespace,
    values_are_readable,
)
from gae_xp._problem import GaeProblem, PreparedCall, PreparedScan

from . import _fallback

# The two traceable routes are imported with the registry: neither imports a framework.
from . import jax as _lax_scan
from . import xp as _generic
from ._triton_cupy import memory_kind  # what auto's kind of call asks of CuPy arrays (it imports no framework)


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

#: backend name -> the module of that backend's own plan for repeated ``gae()`` calls of one layout
#: (``gae_xp._plans``; ``plan_maker``). A plan module imports its backend's module, never the reverse.
PLAN_MODULES: dict[str, str] = {
    "triton": "gae_xp.backends._triton_cupy_plan",
    "numba": "gae_xp.backends._numba_plan",
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
    """The backend to run: the named one (ValueError if it cannot serve these arrays, ``RouteUnavailableError`` if
    its compiler failed) or, for "auto", the first that can and whose compiler has not failed in this process.

    ``segments``: the problem has segments or an incoming carry (packed
    sequences, a rank's shard, a Dask block), which not every backend takes.
    """
    if not isinstance(name, str) or name not in REGISTRY and name != "auto":
        raise ValueError(f"backend must be one of {', '.join(map(repr, names()))}, got {name!r}")
    if name != "auto":
        backend, reason = _asked(name, xp, arrays, forced=True)
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
        failed = []
        for candidate in REGISTRY:
            try:
                backend, reason = _asked(candidate, xp, arrays, forced=False)
            except _fallback.RouteUnavailableError:
                if _would_serve(candidate, xp, arrays):
                    failed.append(candidate)
                continue
            if reason is None and (backend.segments or not segments):
                chosen = _CHOSEN[kind] = backend
                break
        for candidate in failed:
            _fallback.warn_once(candidate, _fallback.broken(candidate), chosen.name)
    return chosen


def plan_maker(backend: Backend) -> Callable | None:
    """The function that makes ``backend``'s own plan of a checked call it solved, ``make(call, arguments)`` ->
    the plan or None (``PLAN_MODULES``); None for a backend without one (``gae_xp._plans`` then makes its own)."""
    module = PLAN_MODULES.get(backend.name)
    if module is None or _LOADED.get(backend.name) is not backend:
        return None
    return importlib.import_module(module).make


def run(call: PreparedCall | PreparedScan, work: Callable[[Backend], Any], *, segments: bool = False):
    """``(work(backend), backend)`` on the backend that ``solver(call)`` picks; when that backend's compiler fails
    (``_fallback.is_compiler_failure``), "auto" runs ``work`` again on the next route, with one warning per cause,
    and a named backend raises ``RouteUnavailableError`` from the failure; where no other route serves the arrays
    (Dask's graph for Dask arrays) the failure propagates. A caller's error propagates."""
    while True:
        backend = solver(call, segments=segments)
        try:
            return work(backend), backend
        except Exception as error:
            if backend is _generic.BACKEND or not _fallback.is_compiler_failure(error):
                raise
            cause = fail(backend.name, error)
            if call.backend != "auto":
                raise _fallback.refuse(backend.name, cause) from error
            fallback = solver(call, segments=segments)
            if fallback is backend:  # the only route for these arrays (Dask's graph): none to fall to, never a loop
                raise
            _fallback.warn_once(backend.name, cause, fallback.name)


def attempt(name: str, work: Callable[[], Any], otherwise: Callable[[], Any]) -> Any:
    """``work()`` on the kernels of route ``name``, or ``otherwise()`` (the generic path) when that route's compiler
    failed, now (remembered, warned once per cause) or earlier in the process. A caller's error propagates."""
    if _fallback.broken(name) is None:
        try:
            return work()
        except Exception as error:
            if not _fallback.is_compiler_failure(error):
                raise
            _fallback.warn_once(name, fail(name, error), _generic.BACKEND.name)
    return otherwise()


class Guarded:
    """A backend whose ``gae``, ``scan`` and ``summarize`` fall to the generic path when its compiler fails
    (``attempt``: remembered, warned once per cause), or, where the caller named it (``forced``), raise
    ``RouteUnavailableError`` from the failure: for work that calls a backend's methods itself (Dask's block tasks,
    the distributed shards) rather than through ``run``."""

    def __init__(self, backend: Backend, *, forced: bool = False):
        self.backend, self.forced = backend, forced
        self.name, self.segments, self.critic_lam = backend.name, backend.segments, backend.critic_lam
        self.uses_chunk_size = backend.uses_chunk_size
        self.gae = self._guard(backend.gae, _generic.BACKEND.gae)
        self.scan = self._guard(backend.scan, _generic.BACKEND.scan)
        self.summarize = None if backend.summarize is None else self._guard(backend.summarize, _generic_summary)

    def _guard(self, method, generic):
        if self.backend is _generic.BACKEND:
            return method

        def call(*args, **kwargs):
            if not self.forced:
                return attempt(self.name, lambda: method(*args, **kwargs), lambda: generic(*args, **kwargs))
            try:
                return method(*args, **kwargs)
            except Exception as error:
                if not _fallback.is_compiler_failure(error):
                    raise
                raise _fallback.refuse(self.name, fail(self.name, error)) from error

        return call


def _generic_summary(problem: GaeProblem):
    """Each segment's summary on the generic path (read off its ``gae``, ``gae_xp._pieces``)."""
    from gae_xp import _pieces

    return _pieces.summarize(problem, _generic.BACKEND, None)


def is_compiler_failure(error: BaseException) -> bool:
    """Whether ``error`` came from a kernel compiler rather than the caller's input (``_fallback``'s test): a plan
    whose call raised one is dropped, and the full path (``run``) falls back."""
    return _fallback.is_compiler_failure(error)


def fail(name: str, error: BaseException) -> str:
    """Remember that route ``name``'s compiler failed with ``error``; "auto" no longer picks it. The cause."""
    cause = _fallback.record(name, error)
    for kind in [kind for kind, backend in list(_CHOSEN.items()) if backend.name == name]:
        _CHOSEN.pop(kind, None)
    return cause


def _would_serve(name: str, xp, arrays) -> bool:
    """True when the route ``name``, whose compiler failed, would serve these arrays but for that (its answer from
    the arrays; a compiler failure while it answers counts as yes): "auto" then says that it falls back."""
    try:
        return load(name).unavailable_reason(xp, arrays) is None
    except Exception as error:
        if not _fallback.is_compiler_failure(error):
            raise
        return True


def _asked(name: str, xp, arrays, *, forced: bool) -> tuple[Backend, str | None]:
    """``(backend, reason)``: the backend ``name`` and why it cannot serve these arrays (None when it can).

    Raises ``RouteUnavailableError`` (from the failure) when its compiler failed in this process, now or before.
    """
    cause = _fallback.broken(name)
    if cause is None:
        try:
            backend = load(name)
            return backend, backend.unavailable_reason(xp, arrays, forced=forced)
        except Exception as error:
            if not _fallback.is_compiler_failure(error):
                raise
            raise _fallback.refuse(name, fail(name, error)) from error
    raise _fallback.refuse(name, cause) from _fallback.failure(name)


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
    if (is_jax_namespace(xp) and _fallback.broken(_lax_scan.NAME) is None
            and _lax_scan.BACKEND.unavailable_reason(xp, arrays) is None):
        return _lax_scan.BACKEND
    if is_torch_namespace(xp):
        from . import torch_ops

        if _fallback.broken(torch_ops.NAME) is None and torch_ops.BACKEND.unavailable_reason(xp, arrays) is None:
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
    """What auto's choice depends on: the namespace, the arrays' types, the first one's device and, for CuPy, each
    array's kind of memory (device or managed: the Triton route takes device memory only) (tensors that record
    autograd history never get here: ``select`` routes them first)."""
    types = tuple(map(type, arrays))
    if all(kind is np.ndarray for kind in types):  # the common case: NumPy arrays live on the CPU
        return xp, types
    first = arrays[0]
    if is_cupy_array(first):
        return xp, types, str(device_of(first)), tuple(memory_kind(a) if is_cupy_array(a) else None for a in arrays)
    return xp, types, str(device_of(first))
