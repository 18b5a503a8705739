"""The steady-state fast path of ``gae()``: a plan per layout, so that a repeated call skips the layout's checks.

RL calls GAE at the same shapes every step, and at those shapes a call is
mostly its checks and its layout. A **key** says everything the checks that
depend only on the layout read: the arrays' library, dtypes, shapes,
strides and device (for torch, whether they require grad; for CuPy, device or managed memory), which
options are there, the scalar coefficients' values, ``axis``,
``chunk_size``, ``backend`` and ``fill_masked``. A **plan** is made from a
call with that key that went through every check (``gae_xp._prepare``) and
was solved; it holds what the call worked out (the backend chosen, and for
the numba kernels the layout, the kernel and its constant arguments). A later
call with the same key is served by the plan, which still runs every check
that reads the data: the value range of an array ``gamma``, ``lam`` or
``critic_lam`` (its errors are ``_prepare``'s own), and whatever the kernels
check themselves.

Never wrong, by construction: a call whose arguments have no key (another
library, a tensor subclass, ``cu_seqlens``, a NumPy scalar coefficient,
tracing under ``torch.compile``/``torch.func``, a Python dispatch mode such as ``make_fx``'s recording the call,
a forward-mode AD level) takes the full path and makes
no plan; a call that fails a check raises before a plan exists, so no
plan is ever made for a key whose layout is refused; and a plan serves only
its own key. The cache is bounded (least recently used plans go first, use
counted once it is half full) and
thread-safe (one lock around the lookups; a plan itself holds no per-call
state). ``tests/test_plans.py`` draws sequences of layouts and checks every
served call against an uncached one and the float64 reference.
"""

from __future__ import annotations

import sys
import threading
from collections import OrderedDict

import numpy as np

from ._compat import torch_cpu_view
from ._problem import COEFFICIENTS, PER_STEP

#: Plans kept: more layouts than a trainer uses (one or two per batch shape), few enough to stay small.
MAX_PLANS = 128


class PlanCache:
    """A bounded, thread-safe least-recently-used map from a call's key to its plan (a use reorders it once it is
    half full).

    A lookup takes no lock: ``dict.get`` and ``OrderedDict.move_to_end`` are
    each one atomic operation (C code under the GIL; a critical section of
    their own in free-threaded builds), and a key evicted between the two is
    simply not moved. Adding and evicting hold the lock.
    """

    def __init__(self, maxsize: int = MAX_PLANS):
        self.maxsize = maxsize
        self._reorder_from = maxsize // 2
        self._plans: OrderedDict = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key):
        """The plan for ``key``, or None. A plan served is made the most recently used once the cache is half
        full; below that no plan is near eviction, and the reordering (a third of a lookup's cost) is skipped."""
        plan = self._plans.get(key)
        if plan is not None and len(self._plans) > self._reorder_from:
            try:
                self._plans.move_to_end(key)
            except KeyError:  # evicted by another thread meanwhile: it still serves this call
                pass
        return plan

    def put(self, key, plan) -> None:
        """Keep ``plan`` for ``key``, dropping the least recently used plans beyond ``maxsize``."""
        with self._lock:
            self._plans[key] = plan
            self._plans.move_to_end(key)
            while len(self._plans) > self.maxsize:
                self._plans.popitem(last=False)

    def discard(self, key) -> None:
        """Forget the plan of ``key``, if one is kept."""
        with self._lock:
            self._plans.pop(key, None)

    def clear(self) -> None:
        with self._lock:
            self._plans.clear()

    def __len__(self) -> int:
        return len(self._plans)


#: The plans of ``gae()``.
PLANS = PlanCache()


def gae_key(rewards, values, gamma, lam, bootstrap_value, next_values, terminated, truncated, mask, axis, chunk_size,
            backend, fill_masked, cu_seqlens, critic_lam, truncated_bootstrap):
    """The key of a ``gae()`` call (see the module docstring) and the host views of its per-step arrays:
    ``(key, views)``, ``(None, None)`` when the call takes the full path.

    A Python float or int coefficient enters with its value (its range
    check is then part of the layout); a Python float ``bootstrap_value``
    with its type only (it is read on every call, and has no range).
    ``views`` is None for NumPy arrays (they are their own); for torch, the
    NumPy views (``_compat.torch_cpu_view``, which leaves the tensors resizable) of ``rewards``, ``values``,
    ``next_values``, ``terminated``, ``truncated`` and ``mask``, None for an
    absent one or one without a view (another device, grad, bfloat16): a
    tensor with a view is keyed by the view's dtype, shape and strides,
    which it needs anyway, and one without by its own.
    """
    if (cu_seqlens is not None or type(axis) is not int or type(backend) is not str
            or type(fill_masked) is not bool or not (chunk_size is None or type(chunk_size) is int)
            or not (truncated_bootstrap is None or type(truncated_bootstrap) is str)):
        return None, None
    kind = type(rewards)
    views = None
    try:
        if kind is np.ndarray:
            layout = _numpy_layout
            steps = (_numpy_layout(rewards), _numpy_layout(values),
                     None if next_values is None else _numpy_layout(next_values),
                     None if terminated is None else _numpy_layout(terminated),
                     None if truncated is None else _numpy_layout(truncated),
                     None if mask is None else _numpy_layout(mask))
        elif kind is _torch_tensor():
            if (_TORCH.is_compiling() or _TORCH.dispatch_modes() or _TORCH.forward_ad._current_level >= 0):
                return None, None  # traced or recorded (a plan would launch past the recording), or dual tensors
            layout = _torch_layout
            views = [None, None, None, None, None, None]
            steps = (_torch_step(rewards, views, 0), _torch_step(values, views, 1),
                     None if next_values is None else _torch_step(next_values, views, 2),
                     None if terminated is None else _torch_step(terminated, views, 3),
                     None if truncated is None else _torch_step(truncated, views, 4),
                     None if mask is None else _torch_step(mask, views, 5))
        elif kind is _cupy_ndarray():
            layout = _cupy_layout
            steps = tuple(None if a is None else _cupy_layout(a)
                          for a in (rewards, values, next_values, terminated, truncated, mask))
        else:
            return None, None
        key = (kind, axis, chunk_size, backend, fill_masked, truncated_bootstrap, steps,
               _coefficient_key(gamma, layout), _coefficient_key(lam, layout),
               None if critic_lam is None else _coefficient_key(critic_lam, layout),
               type(bootstrap_value) if bootstrap_value is None or type(bootstrap_value) is float
               else layout(bootstrap_value))
    except _NoKey:
        return None, None
    return key, views


class _NoKey(Exception):
    """An argument that a key cannot describe (another kind of array, a NumPy scalar, ...)."""


def _coefficient_key(value, layout):
    if type(value) is float or type(value) is int:
        return type(value), value
    return layout(value)


def _numpy_layout(a):
    """dtype, shape and strides of an exact ``numpy.ndarray``."""
    if type(a) is not np.ndarray:
        raise _NoKey
    return a.dtype, a.shape, a.strides


def _torch_layout(t):
    """dtype, shape, strides, device, whether it requires grad and whether torch keeps it negated lazily (its
    memory then holds the values' negatives, and the kernels read a negated copy), of an exact ``torch.Tensor``
    that no ``torch.func`` transform wraps."""
    if type(t) is not _TORCH.tensor or _TORCH.wrapped(t):
        raise _NoKey
    return t.dtype, t.shape, t.stride(), t.device, t.requires_grad, t.is_neg()


def _torch_step(t, views: list, index: int):
    """A per-step tensor's layout: its NumPy view's dtype, shape and strides (the view kept in ``views[index]``)
    where it has one (a CPU tensor without grad of a dtype NumPy has), else ``_torch_layout``'s.

    A tensor that a ``torch.func`` transform wraps has no storage, so no view: ``torch_cpu_view`` raises for
    it (as ``Tensor.numpy()`` would), and ``_torch_layout`` then refuses it.
    """
    if type(t) is not _TORCH.tensor:
        raise _NoKey
    if t.is_cpu and t.dtype not in _TORCH.without_numpy:
        try:
            view = torch_cpu_view(t)  # not Tensor.numpy(): it would leave the tensor non-resizable
        except (TypeError, RuntimeError):  # grad, wrapped, bfloat16, a conjugate or negative bit: keyed as a tensor
            pass
        else:
            views[index] = view
            return view.dtype, view.shape, view.strides
    return _torch_layout(t)


def _cupy_layout(a):
    """dtype, shape, strides, device and memory kind (DLPack's: device or managed memory, which the routes take
    apart) of an exact ``cupy.ndarray``."""
    if type(a) is not _CUPY["ndarray"]:
        raise _NoKey
    return a.dtype, a.shape, a.strides, a.device.id, a.__dlpack_device__()[0] if a.size else None


#: ``cupy.ndarray`` once CuPy is imported (``gae_key`` never imports it).
_CUPY: dict = {"ndarray": None}


def _cupy_ndarray():
    """``cupy.ndarray`` once CuPy is imported (an array of a library not imported cannot be CuPy's), else None."""
    if _CUPY["ndarray"] is None and "cupy" in sys.modules:
        _CUPY["ndarray"] = getattr(sys.modules["cupy"], "ndarray", None)  # None: a module of that name, not CuPy
    return _CUPY["ndarray"]


class _Torch:
    """torch's names that a key reads, looked up once torch is imported (``gae_key`` never imports it)."""

    tensor = None

    def load(self) -> None:
        torch = sys.modules["torch"]
        self.wrapped = torch._C._functorch.is_functorch_wrapped_tensor
        self.is_compiling = torch.compiler.is_compiling
        #: how many Python dispatch modes (make_fx's, FakeTensorMode, a user's) are on: a call then is recorded
        self.dispatch_modes = torch._C._len_torch_dispatch_stack
        self.forward_ad = torch.autograd.forward_ad
        self.tensor = torch.Tensor
        #: dtypes NumPy has no counterpart of: ``Tensor.numpy()`` raises for them, at the cost of an exception
        #: (several microseconds), so their tensors are keyed as tensors without asking
        self.without_numpy = frozenset(getattr(torch, name) for name in (
            "bfloat16", "float8_e4m3fn", "float8_e4m3fnuz", "float8_e5m2", "float8_e5m2fnuz") if hasattr(torch, name))


_TORCH = _Torch()


def _torch_tensor():
    """``torch.Tensor`` once torch is imported (an array of a library not imported cannot be a tensor), else None."""
    if _TORCH.tensor is None and "torch" in sys.modules:
        _TORCH.load()
    return _TORCH.tensor


def make_plan(call, solver, arguments: dict, own_plan=None):
    """The plan of a checked, solved ``gae()`` call (``arguments``: its own, by name): the backend's own
    (``own_plan(call, arguments)``, ``gae_xp.backends.plan_maker``) where it has one that serves this call; else,
    where the checked layout is the caller's own arrays, a plan that binds a later call's arrays into it
    (``BoundLayoutPlan``); else a plan that runs the checks and the layout again on the backend chosen."""
    plan = None if own_plan is None else own_plan(call, arguments)
    if plan is None:
        plan = BoundLayoutPlan.of(call, solver, arguments)
    return plan if plan is not None else ChosenBackendPlan(call, solver, arguments["truncated_bootstrap"])


#: The per-step arrays of ``gae()`` that a ``BoundLayoutPlan`` binds (the coefficients are in the key).
_BOUND = tuple(name for name in PER_STEP if name not in COEFFICIENTS)


class BoundLayoutPlan:
    """A plan for a call whose checked layout holds the caller's own arrays, on any backend without a plan of its
    own (the generic scan, numba-CUDA; calls that Triton's or numba's own plan declines): a later call of the key
    gets the first call's ``GaeProblem`` with its own arrays bound in, and its bootstrap values made again
    (``_prepare.boundary``, as ``prepare`` makes them: an array's dtype and broadcast are checked there).

    Made only where ``prepare`` handed every per-step array to the problem as it was given (time last, the
    compute dtype already, flags bool: no view, cast or move), the coefficients are Python numbers (their values
    are in the key, so their range checks are too), there are no packed sequences and no tensor requires grad.
    Then every check ``prepare`` makes reads only what the key holds, and a call of the same key would get a
    problem of these arrays themselves: binding them is ``prepare`` without its checks, not an approximation of
    it.
    """

    def __init__(self, call, solver):
        p = call.problem
        #: the first call's problem without its arrays (each call binds its own): a kept plan holds no caller's
        #: memory (the coefficients are Python numbers; no carry, offsets or extra fields)
        self.problem = object.__new__(type(p))
        self.problem.__dict__.update(p.__dict__, **dict.fromkeys(_BOUND), bootstrap=None)
        self.solver = solver
        self.chunk_size = call.chunk_size
        self.out_dtype, self.axis = call.out_dtype, call.axis
        self.batch_shape = tuple(p.rewards.shape[:-1])
        self.bootstrap_dtype = p.bootstrap.dtype

    @classmethod
    def of(cls, call, solver, arguments: dict):
        """The plan for this call, or None where its layout is not the caller's own arrays (see the class)."""
        p = call.problem
        if (p.offsets is not None or p.carry is not None or p.extra or call.offsets_valid is not None
                or any(getattr(p, name) is not arguments[name] for name in _BOUND)
                or any(arguments[name] is not None and type(arguments[name]) not in (float, int)
                       for name in COEFFICIENTS)
                or any(getattr(a, "requires_grad", False) for a in call.arrays)):
            return None
        return cls(call, solver)

    def __call__(self, rewards, values, gamma, lam, bootstrap_value, next_values, terminated, truncated, mask,
                 critic_lam, views=None):
        from . import _prepare, backends
        from ._problem import restore

        p = self.problem
        bootstrap = _prepare.boundary(p.xp, "bootstrap_value", 0.0 if bootstrap_value is None else bootstrap_value,
                                      self.batch_shape, self.bootstrap_dtype, rewards)
        # the first call's problem with this call's arrays: its other fields are a checked problem's, so the copy
        # is made field for field (``dataclasses.replace`` would run the frozen class's __init__: 4 us)
        problem = object.__new__(type(p))
        problem.__dict__.update(p.__dict__, rewards=rewards, values=values, next_values=next_values,
                                terminated=terminated, truncated=truncated, mask=mask, bootstrap=bootstrap)
        advantages, returns = backends.solve_gae(problem, self.solver, self.chunk_size)
        return (restore(p.xp, advantages, self.out_dtype, self.axis),
                restore(p.xp, returns, self.out_dtype, self.axis))


class ChosenBackendPlan:
    """A plan that keeps the backend chosen for the key (``backends.solver``'s answer) and runs every check and
    the layout of ``gae_xp._prepare`` again: for the calls that neither the backend's own plan nor a
    ``BoundLayoutPlan`` serves (arrays that ``prepare`` moves or casts, array coefficients, tensors that require
    grad)."""

    def __init__(self, call, solver, truncated_bootstrap: str):
        self.solver = solver
        self.options = {"axis": call.axis, "chunk_size": call.chunk_size, "backend": call.backend,
                        "fill_masked": call.problem.fill_masked, "truncated_bootstrap": truncated_bootstrap}

    def __call__(self, rewards, values, gamma, lam, bootstrap_value, next_values, terminated, truncated, mask,
                 critic_lam, views=None):
        from . import _prepare, backends

        call = _prepare.prepare(rewards, values, gamma=gamma, lam=lam, bootstrap_value=bootstrap_value,
                                next_values=next_values, terminated=terminated, truncated=truncated, mask=mask,
                                critic_lam=critic_lam, **self.options)
        advantages, returns = backends.solve_gae(call.problem, self.solver, call.chunk_size)
        return call.restore(advantages), call.restore(returns)
