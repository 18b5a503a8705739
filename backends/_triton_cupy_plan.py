r"""The Triton route's plans, CuPy arrays' included: a repeated ``gae()`` call on CuPy arrays launches the compiled
kernels on the arrays' addresses, with no torch tensor, DLPack exchange or stream context per call.

``make`` is the route's plan maker (``backends.PLAN_MODULES``): a call on torch tensors gets ``_triton_plan``'s
plan; a call on CuPy arrays (the caller's library of ``_triton_cupy``) gets a ``CuPyPlan`` where the torch plan
serves the same call seen through torch views of its arrays (``_triton_plan.make``, with every condition of it:
the caller's own arrays, Python-number coefficients, batch axes that fold, ...) and no array has a negative stride
(its torch view would be a copy). The key (``gae_xp._plans.gae_key``) holds each array's dtype, shape, strides,
device and memory kind. A served call, on the arrays' device::

    A, R   = cupy.empty(shape), cupy.empty(shape)                  (CuPy's memory pool)
    args   = (the arrays' addresses in their slots, the bootstrap's, A's, R's, the torch plan's counts and numbers)
    run(args) of each of the torch plan's compiled kernels on CuPy's current stream

An address is a Python int, which Triton's launcher (3.6 to 3.9) passes as the device pointer itself. The kernels
are the torch plan's, taken and checked against Triton's binder by its direct launch (``_triton_plan``); each is
checked once more per process, on addresses: the call that takes it runs through torch views, as the route does
without a plan, then launches it on the addresses into outputs of its own, which must equal the first call's (one
host synchronisation). Where that check fails or a launch raises, direct launches stop for the process
(``_triton_plan.direct_refused``; one ``DirectLaunchWarning``) and every later call runs through torch views, whose
plan then launches through Triton's binder: the same results. Through torch views too, silently: the binder's
launch mode, what needs Triton's own launcher (launch hooks, its debug modes), a first call at an alignment of the
addresses (Triton specialises on it), and an unchecked kernel inside a CUDA-graph capture or under torch's sync
debug mode (the check synchronises).

A Python-number ``bootstrap_value`` is a one-element array of the compute dtype that every row reads, kept while its
value and the stream stay (a new one inside a capture: the graph's own); a float16 array one is cast to float32
per call, as ``prepare`` casts it. Outputs are new arrays of CuPy's pool, never an input's memory.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import torch

from gae_xp._compat import array_namespace

from . import _triton_cupy, _triton_plan
from . import triton as triton_backend

#: The kernel's slots of the outputs and the chunks' maps (as ``_triton_plan``'s).
_ADVANTAGES, _RETURNS, _MAPS = _triton_plan._ADVANTAGES, _triton_plan._RETURNS, _triton_plan._MAPS
#: The compiled kernels checked on addresses in this process, by identity (kept alive, so no id is reused).
_CHECKED: dict[int, object] = {}


def make(call, arguments: dict):
    """The plan of a checked call solved by the Triton kernels (``arguments``: ``gae()``'s own), or None where no
    plan serves it (see the module)."""
    p = call.problem
    caller = _triton_cupy.CALLER
    if not _triton_cupy.serves([p.rewards]):
        return _triton_plan.make(call, arguments)
    given = [a for a in (*p.steps().values(), *p.extra.values(), p.bootstrap) if caller.is_array(a)]
    if (call.out_dtype != p.rewards.dtype or any(stride < 0 for a in given for stride in a.strides)
            or not all(map(caller.in_device_memory, given))):
        return None  # results cast after the kernels, or an array whose torch view would be a copy
    views: dict[int, object] = {}

    def view(value):
        """One torch view per array of the caller (an argument and the problem's field: the same view)."""
        if not caller.is_array(value):
            return value
        if id(value) not in views:
            views[id(value)] = caller.to_torch(value)
        return views[id(value)]

    with caller.on_stream(p.rewards):
        tensors = p.map_steps(lambda name, array: view(array))
        tensors = tensors.replace(xp=array_namespace(tensors.rewards), bootstrap=view(p.bootstrap),
                                  carry=view(p.carry), offsets=view(p.offsets))
        seen = dataclasses.replace(call, problem=tensors, arrays=tuple(map(view, call.arrays)),
                                   out_dtype=tensors.rewards.dtype)
        plan = _triton_plan.make(seen, {name: view(value) for name, value in arguments.items()})
    if plan is None:
        return None
    bootstrap = arguments["bootstrap_value"]
    cast = p.bootstrap.dtype if caller.is_array(bootstrap) and bootstrap.dtype != p.bootstrap.dtype else None
    return CuPyPlan(plan, p.rewards, cast)


class CuPyPlan:
    """One layout's launches on CuPy arrays (``plan``: the torch plan of the same call on torch views of them);
    ``plan(rewards, values, ...)`` is ``gae()`` on arrays of that key, given in ``gae()``'s order."""

    def __init__(self, plan, rewards, cast=None):
        caller = _triton_cupy.CALLER
        self.plan = plan
        self.shape, self.dtype = tuple(rewards.shape), rewards.dtype
        self.device = caller.device_index(rewards)
        self.maps = plan.maps
        self.maps_dtype = np.float64 if plan.maps_dtype == torch.float64 else np.float32
        self.number_dtype = np.float64 if self.dtype == np.float64 else np.float32
        self.cast = cast  # the compute dtype a float16 array bootstrap value is cast to per call, or None
        self.constant = None  # (value, stream, one-element array) of the last Python-number bootstrap value
        #: per alignment of the addresses, the torch plan's launches once checked on addresses (published whole)
        self.launches: dict[tuple, list] = {}

    def __call__(self, rewards, values, gamma, lam, bootstrap_value, next_values, terminated, truncated, mask,
                 critic_lam, views=None):
        if getattr(triton_backend._SETTINGS, "override", None) is not None:  # tuned(): the backend's own path
            return self.plan.tuned(rewards, values, gamma, lam, bootstrap_value, next_values, terminated, truncated,
                                   mask, critic_lam)
        caller = _triton_cupy.CALLER
        arrays = (rewards, values, next_values, terminated, truncated, mask)
        if caller.current_device() != self.device:
            with caller.on_device(self.device):
                return self._call(caller, arrays, bootstrap_value, (gamma, lam, critic_lam))
        return self._call(caller, arrays, bootstrap_value, (gamma, lam, critic_lam))

    def _call(self, caller, arrays: tuple, bootstrap_value, coefficients: tuple):
        stream = caller.current_stream()
        bootstrap, tail = self._bootstrap(caller, bootstrap_value, stream)
        addresses = self._addresses(caller, arrays, bootstrap)
        alignment = tuple(address % 16 == 0 for address in addresses)
        launches = self.launches.get(alignment)
        if launches is None or not _triton_plan.direct_allowed():
            return self._through_torch(caller, arrays, bootstrap_value, coefficients, stream, alignment)
        try:
            return self._launch(caller, addresses, tail, launches, stream.ptr)
        except Exception as error:  # noqa: BLE001 - any failure: the call runs through torch views, said once
            self.launches.clear()
            _CHECKED.clear()
            _triton_plan.refuse(f"a launch on CuPy arrays' addresses raised {type(error).__name__}: {error}")
            return self._through_torch(caller, arrays, bootstrap_value, coefficients, stream, alignment)

    def _addresses(self, caller, arrays: tuple, bootstrap) -> tuple:
        """The kernel's first slots as addresses: the caller's arrays, ``rewards``' in place of an absent one (and
        of the coefficients, carry and offsets, which a plan never has as arrays), the bootstrap value's."""
        pointer = caller.pointer
        r = pointer(arrays[0])
        return (r, *(r if a is None else pointer(a) for a in arrays[1:]), r, r, r, pointer(bootstrap))

    def _bootstrap(self, caller, bootstrap_value, stream) -> tuple:
        """(the bootstrap value as an array, the torch plan's counts and numbers that go with it)."""
        if bootstrap_value is None or type(bootstrap_value) is float:
            return self._number(caller, 0.0 if bootstrap_value is None else bootstrap_value, stream), \
                self.plan.number_tail
        return (bootstrap_value if self.cast is None else bootstrap_value.astype(self.cast)), self.plan.tail

    def _number(self, caller, value: float, stream):
        """A one-element array holding ``value`` in the compute dtype: the last one kept while the value and the
        stream stay; inside a CUDA-graph capture a new one every time, never kept (the graph owns it)."""
        constant = self.constant
        if constant is not None and constant[0] == value and constant[1] == stream.ptr and not stream.is_capturing():
            return constant[2]
        array = caller.full(value, self.number_dtype)
        if not stream.is_capturing():
            self.constant = (value, stream.ptr, array)
        return array

    def _launch(self, caller, addresses: tuple, tail: tuple, launches: list, stream: int) -> tuple:
        """Launch the kernels on ``addresses`` into new outputs; (advantages, returns)."""
        empty, pointer = caller.empty, caller.pointer
        advantages, returns = empty(self.shape, self.dtype), empty(self.shape, self.dtype)
        maps = addresses[0] if self.maps is None else pointer(empty(self.maps, self.maps_dtype))
        r = addresses[0]
        arguments = (*addresses, r, r, pointer(advantages), pointer(returns), maps, *tail)
        self.plan.run_compiled(arguments, launches, stream)
        return advantages, returns

    def _through_torch(self, caller, arrays: tuple, bootstrap_value, coefficients: tuple, stream,
                       alignment: tuple) -> tuple:
        """The call on torch views of the arrays, as the route runs it without a plan (the torch plan takes the
        kernels of this alignment there); then, where it took them, their check on addresses."""
        gamma, lam, critic_lam = coefficients
        with caller.on_stream(arrays[0]):
            rewards, values, next_values, terminated, truncated, mask = (
                None if a is None else caller.to_torch(a) for a in arrays)
            bootstrap = caller.to_torch(bootstrap_value) if caller.is_array(bootstrap_value) else bootstrap_value
            results = self.plan(rewards, values, gamma, lam, bootstrap, next_values, terminated, truncated, mask,
                                critic_lam)
            results = tuple(map(caller.from_torch, results))
        entry = self.plan.kernels.get(alignment)
        if entry is not None and alignment not in self.launches and _triton_plan.direct_allowed():
            self._check(caller, arrays, bootstrap_value, stream, alignment, entry, results)
        return results

    def _check(self, caller, arrays: tuple, bootstrap_value, stream, alignment: tuple, entry: tuple,
               results: tuple) -> None:
        """Keep the torch plan's kernels of ``alignment`` for launches on addresses, once those kernels launched on
        this call's addresses gave ``results`` (the same call through torch views), or were checked before."""
        kernels, launches = entry
        if not all(id(kernel) in _CHECKED for kernel in kernels):
            if stream.is_capturing() or torch.cuda.is_available() and torch.cuda.get_sync_debug_mode() != 0:
                return  # the check synchronises: a later eager call makes it
            bootstrap, tail = self._bootstrap(caller, bootstrap_value, stream)
            try:
                mine = self._launch(caller, self._addresses(caller, arrays, bootstrap), tail, launches, stream.ptr)
                same = all(map(_same, mine, results))
            except Exception as error:  # noqa: BLE001 - any failure: the results through torch stand, said once
                _triton_plan.refuse(f"a launch on CuPy arrays' addresses raised {type(error).__name__}: {error}")
                return
            if not same:
                _triton_plan.refuse("a launch on CuPy arrays' addresses gave other results than the same call "
                                    "through torch views")
                return
            _CHECKED.update((id(kernel), kernel) for kernel in kernels)
        self.launches[alignment] = launches


def _same(a, b) -> bool:
    """Equal element for element where numbers, NaN where NaN (one host synchronisation)."""
    xp = array_namespace(a)
    return bool(xp.all((a == b) | (xp.isnan(a) & xp.isnan(b))))
