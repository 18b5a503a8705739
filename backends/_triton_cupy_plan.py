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
checked once more on addresses, per process and generation of direct launches (``_triton_plan.generation``: a
refusal or a launch mode chosen again starts a new one): the call that takes it runs through torch views, as the
route does without a plan, then launches it on the addresses into outputs of its own, which must equal the first
call's (one host synchronisation). Where that check fails or a launch raises, direct launches stop for the process
(``_triton_plan.direct_refused``; one ``DirectLaunchWarning``) and every later call runs through torch views, whose
plan then launches through Triton's binder: the same results. Through torch views too, silently: the binder's
launch mode, what needs Triton's own launcher (launch hooks, its debug modes), a first call at an alignment of the
addresses (Triton specialises on it), and an unchecked kernel under torch's sync debug mode (the check
synchronises). Inside a CUDA-graph capture a call is served on addresses only, or refused with a RuntimeError
that says what to do (two eager calls of the layout first, in the direct launch mode): through torch views its
temporaries would be freed after the call while the graph still reads them.

A Python-number ``bootstrap_value`` is a one-element array of the compute dtype that every row reads, kept while its
value, the stream and the thread stay; a float16 array one is cast to float32 per call, as ``prepare`` casts it,
in C order (a plan is made only where the first call's cast was C-ordered: its strides are the kernel's).
Every buffer a launch reads or writes is alive until the launch is queued, and then freed to CuPy's pool, which
hands it to later work on the same stream only. Inside a CUDA-graph capture the outputs, the chunks' maps and the
bootstrap value are views of one new allocation (the bootstrap value filled by the graph), so that whatever a
replay touches lives as long as the outputs the caller keeps for it. Outputs are new arrays, never an input's
memory.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import threading

import numpy as np
import torch

from gae_xp._compat import array_namespace

from . import _triton_cupy, _triton_plan
from . import triton as triton_backend

#: The kernel's slots of the outputs and the chunks' maps (as ``_triton_plan``'s).
_ADVANTAGES, _RETURNS, _MAPS = _triton_plan._ADVANTAGES, _triton_plan._RETURNS, _triton_plan._MAPS
#: The compiled kernels checked on addresses in this process, by identity (kept alive, so no id is reused), with
#: the generation of ``_triton_plan``'s direct launches they were checked in.
_CHECKED: dict[int, tuple[object, int]] = {}
#: Where each buffer of a captured call's one allocation starts: a multiple of this many bytes.
_ALIGNMENT = 256


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
    if cast is not None and not p.bootstrap.flags.c_contiguous:
        return None  # a cast per call is C-ordered: the kernel reads it with the first call's strides
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
        self.constant = None  # (value, stream, thread, one-element array) of the last Python-number bootstrap value
        #: per alignment of the addresses, (generation, the torch plan's launches) once checked on addresses in that
        #: generation of ``_triton_plan``'s direct launches (published whole)
        self.launches: dict[tuple, tuple[int, list]] = {}

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
        capturing = stream.is_capturing()
        number, value = self._boundary(bootstrap_value)
        addresses = self._addresses(caller, arrays)
        launches = self._checked(self._alignment(caller, addresses, value, number))
        if launches is None or not _triton_plan.direct_allowed():
            if capturing:
                raise RuntimeError(_triton_cupy.CAPTURE_REFUSED)
            return self._through_torch(caller, arrays, bootstrap_value, coefficients, stream)
        if capturing:
            *outputs, bootstrap = self._captured_buffers(caller, value, number)
        else:
            outputs, bootstrap = self._outputs(caller), self._bootstrap(caller, value, number, stream)
        try:
            self._launch(caller, (*addresses, caller.pointer(bootstrap)), number, launches, stream.ptr, outputs)
        except Exception as error:  # noqa: BLE001 - any failure: the call runs through torch views, said once
            _triton_plan.refuse(f"a launch on CuPy arrays' addresses raised {type(error).__name__}: {error}")
            if capturing:  # the capture may hold a part of the launches: it cannot be completed
                raise RuntimeError(f"gae_xp: a launch on CuPy arrays' addresses failed inside a CUDA-graph capture "
                                   f"({type(error).__name__}: {error})") from error
            return self._through_torch(caller, arrays, bootstrap_value, coefficients, stream)
        return outputs[0], outputs[1]

    @staticmethod
    def _boundary(bootstrap_value) -> tuple:
        """(whether the bootstrap value is a Python number, the number or the array)."""
        if bootstrap_value is None or type(bootstrap_value) is float:
            return True, 0.0 if bootstrap_value is None else bootstrap_value
        return False, bootstrap_value

    def _alignment(self, caller, addresses: tuple, value, number: bool) -> tuple:
        """The alignment of a call's first ten slots (Triton's specialisation), the bootstrap value's known before
        it is made: an array of the plan's own (a number's, a cast) is a new allocation, aligned."""
        made = number or self.cast is not None
        return _triton_plan._alignment((*addresses, 0 if made else caller.pointer(value)))

    def _checked(self, alignment: tuple):
        """The launches kept for ``alignment`` in this generation of direct launches, or None."""
        entry = self.launches.get(alignment)
        if entry is None or entry[0] != _triton_plan.generation():
            return None
        return entry[1]

    def _addresses(self, caller, arrays: tuple) -> tuple:
        """The kernel's first nine slots as addresses: the caller's arrays, ``rewards``' in place of an absent one
        (and of the coefficients, which a plan never has as arrays); the bootstrap value's comes next."""
        pointer = caller.pointer
        r = pointer(arrays[0])
        return (r, *(r if a is None else pointer(a) for a in arrays[1:]), r, r, r)

    def _bootstrap(self, caller, value, number: bool, stream):
        """The bootstrap value as an array: a number's kept one-element array, a float16 array's float32 copy, or
        the caller's array."""
        if number:
            return self._number(caller, value, stream)
        return value if self.cast is None else value.astype(self.cast, order="C")

    def _number(self, caller, value: float, stream):
        """A one-element array holding ``value`` in the compute dtype, the last one kept while the value, the stream
        and the thread stay (CuPy's per-thread default stream has one address in every thread)."""
        constant, thread = self.constant, threading.get_ident()
        if constant is not None and constant[:3] == (value, stream.ptr, thread):
            return constant[3]
        array = caller.full(value, self.number_dtype)
        self.constant = (value, stream.ptr, thread, array)
        return array

    def _outputs(self, caller) -> tuple:
        """(advantages, returns, the chunks' maps or None): new arrays of the caller's library."""
        empty = caller.empty
        maps = None if self.maps is None else empty(self.maps, self.maps_dtype)
        return empty(self.shape, self.dtype), empty(self.shape, self.dtype), maps

    def _captured_buffers(self, caller, value, number: bool) -> tuple:
        """(advantages, returns, maps or None, bootstrap value) inside a CUDA-graph capture: views of one new
        allocation, so that every buffer a replay of the graph reads or writes lives as long as its outputs
        (CuPy's pool would hand a temporary freed after the call to later work; a graph holds no memory). The
        bootstrap value is filled into its place by the graph, or is the caller's own array where not cast."""
        parts = [(self.shape, self.dtype), (self.shape, self.dtype)]
        if self.maps is not None:
            parts.append((self.maps, self.maps_dtype))
        if number or self.cast is not None:
            parts.append(((1,) if number else value.shape, self.number_dtype if number else self.cast))
        sizes = [-(-math.prod(shape) * np.dtype(dtype).itemsize // _ALIGNMENT) * _ALIGNMENT for shape, dtype in parts]
        memory = caller.empty((sum(sizes),), np.uint8)
        starts = itertools.accumulate([0, *sizes[:-1]])
        views = [memory[start:start + size].view(dtype)[:math.prod(shape)].reshape(shape)
                 for start, size, (shape, dtype) in zip(starts, sizes, parts)]
        advantages, returns = views[0], views[1]
        maps = views[2] if self.maps is not None else None
        if number or self.cast is not None:
            views[-1][...] = value
            return advantages, returns, maps, views[-1]
        return advantages, returns, maps, value

    def _launch(self, caller, addresses: tuple, number: bool, launches: list, stream: int, outputs: tuple) -> None:
        """Launch the kernels on ``addresses`` into ``outputs`` (``_outputs``'), alive until the launches are
        queued."""
        pointer = caller.pointer
        advantages, returns, maps = outputs
        r = addresses[0]
        arguments = (*addresses, r, r, pointer(advantages), pointer(returns), r if maps is None else pointer(maps),
                     *(self.plan.number_tail if number else self.plan.tail))
        self.plan.run_compiled(arguments, launches, stream)

    def _through_torch(self, caller, arrays: tuple, bootstrap_value, coefficients: tuple, stream) -> tuple:
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
        if not _triton_plan.direct_allowed():
            return results
        number, value = self._boundary(bootstrap_value)
        addresses = self._addresses(caller, arrays)
        alignment = self._alignment(caller, addresses, value, number)
        entry = self.plan.kernels.get(alignment)
        if entry is not None and self._checked(alignment) is None:
            bootstrap = self._bootstrap(caller, value, number, stream)
            self._check(caller, (*addresses, caller.pointer(bootstrap)), number, stream, alignment, entry, results)
        return results

    def _check(self, caller, addresses: tuple, number: bool, stream, alignment: tuple, entry: tuple,
               results: tuple) -> None:
        """Keep the torch plan's kernels of ``alignment`` for launches on addresses, once those kernels launched on
        this call's ``addresses`` (their arrays alive in the caller's frame) gave ``results`` (the same call through
        torch views), or were checked before in this generation of direct launches."""
        kernels, launches = entry
        generation = _triton_plan.generation()
        if not all(_CHECKED.get(id(kernel), (None, -1))[1] == generation for kernel in kernels):
            if stream.is_capturing() or torch.cuda.is_available() and torch.cuda.get_sync_debug_mode() != 0:
                return  # the check synchronises: a later eager call makes it
            mine = self._outputs(caller)
            try:
                self._launch(caller, addresses, number, launches, stream.ptr, mine)
                same = _same(mine[0], results[0]) and _same(mine[1], results[1])
            except Exception as error:  # noqa: BLE001 - any failure: the results through torch stand, said once
                _triton_plan.refuse(f"a launch on CuPy arrays' addresses raised {type(error).__name__}: {error}")
                return
            if not same:
                _triton_plan.refuse("a launch on CuPy arrays' addresses gave other results than the same call "
                                    "through torch views")
                return
            _CHECKED.update((id(kernel), (kernel, generation)) for kernel in kernels)
        self.launches[alignment] = (generation, launches)


def _same(a, b) -> bool:
    """Equal element for element where numbers, NaN where NaN (one host synchronisation)."""
    xp = array_namespace(a)
    return bool(xp.all((a == b) | (xp.isnan(a) & xp.isnan(b))))
