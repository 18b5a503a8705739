r"""The Triton route's plan: a repeated ``gae()`` call of one layout does only what its launches need.

A ``TritonPlan`` is made (``make``, named by ``backends.PLAN_MODULES``) from
a call that went through every check of ``gae_xp._prepare`` and was solved
by the Triton kernels; ``gae_xp._plans`` serves later calls of the same key
with it. The key (``gae_xp._plans.gae_key``) holds every fact that the checks
and the launch configuration read: each tensor's dtype, shape, strides,
device, whether it requires grad, which options are given, the coefficients'
values (Python numbers), ``axis``, ``backend`` and ``fill_masked``. The
plan holds, worked out once, everything else that a launch needs: the grid,
the counts and strides, the coefficients as the kernel takes them, the
specialisation and launch settings (``_triton_launch.Plan``), and the
kernel's arguments after the caller's tensors. A served call is::

    A, R    = torch.empty(shape), torch.empty(shape)       (torch's allocator, the arrays' device)
    args    = (caller's tensors in their slots, bootstrap, A, R, the plan's counts and numbers)
    launch(args) on torch's current stream

No check is repeated that the key answers, no host synchronisation, no
Python loop over options, no block table derived again. What is not in the
key stays per call: a tensor ``bootstrap_value`` is passed where it lies
(its layout is in the key), a Python-number one is a one-element tensor
that every row reads (kept while its value and the stream stay; made anew,
and owned by the graph, inside a CUDA-graph capture), a flag is
viewed as uint8, and ``tuned()`` settings send the call to the backend's own
path. Every output is a new tensor: none shares memory with an input, and
inputs are only read.

Made for calls whose checked problem holds the caller's own tensors as
given (time last, the dtype that the kernels read, flags bool: nothing cast,
moved or broadcast by ``prepare``), with Python-number coefficients, a
bootstrap value that is absent, a number or a tensor (cast to the compute
dtype per call where it is float16 or bfloat16, as ``prepare`` casts it),
no packed sequences, no carry, not traced (``torch_is_recorded``), batch axes that fold into the kernels' two
and no tensor kept negated lazily; other calls keep ``gae_xp._plans``' plans.

Launching (``launch_mode``; ``GAE_XP_TRITON_LAUNCH`` when this module is
imported): ``"direct"`` (the default) keeps, per plan and per 16-byte
alignment of the caller's pointers (Triton specialises on it), the compiled
kernels that Triton's launcher returned on the first launch of that
alignment, and calls their ``run`` with the grid, the stream, the function
handle, the packed metadata and the same arguments (the constexprs
included; the tensors as their addresses, ``_as_addresses``, which spares
the launcher a driver query per pointer), as ``JITFunction.run`` does after
its binder in Triton 3.6 to 3.9; ``"binder"`` launches every call through Triton's own launcher,
``kernel[grid](...)``, whose argument binder specialises every argument again
on every call (on an H100, 108.7 against 27.6 us of host time per call at
38400x128: ``tests/gpu/profile_host.py``). Each compiled kernel is checked
once per process, on the first plan that takes it: the same call launched
directly into outputs of its own equals the binder's launch (equal numbers,
NaN where NaN; one host synchronisation; a later plan of the same kernel,
another B or T, takes it unchecked). Where that check fails or a direct
launch raises, every later call takes the binder and a
``DirectLaunchWarning`` says why (the kernels are dropped, so that a direct
mode chosen again takes and checks them again). The binder also serves,
silently, where it would pick or run another kernel than the one taken
(launch hooks: a profiler; the kernel's pre-run hooks; Triton's debug mode,
stage inspection or instrumentation), where no compiled kernel comes back
(the interpreter), and a first launch of unchecked kernels inside a
CUDA-graph capture or under torch's sync debug mode (the check
synchronises): an eager call takes and checks the kernels later; a process
that keeps sync debug mode on keeps the binder.
"""

from __future__ import annotations

import inspect
import os
import threading
import warnings

import torch
import triton

from gae_xp import _plans, _problem
from gae_xp._compat import is_torch_array, torch_is_recorded

from . import _triton_gae, _triton_launch
from . import triton as triton_backend

#: How launches are made (see the module).
LAUNCH_MODES = ("binder", "direct")
#: The environment variable read for the launch mode when this module is imported.
LAUNCH_VARIABLE = "GAE_XP_TRITON_LAUNCH"
#: The caller's per-step tensors that a plan puts in the kernel's first slots, in ``gae()``'s (and the kernel's)
#: order (``_problem.PER_STEP`` without the coefficients); the flags among them are read as uint8.
_TENSORS = tuple(name for name in _problem.PER_STEP if name not in _problem.COEFFICIENTS)
#: The kernel's first slots, which hold the caller's tensors (or ``rewards`` in place of an absent one).
_CALLERS = 10
#: The kernel's argument slots of the outputs and the chunks' maps (after the 9 per-step, bootstrap, carry, offsets).
_ADVANTAGES, _RETURNS, _MAPS = 12, 13, 14
#: Where the bootstrap's three strides sit in the launch plan's counts (after 6 counts and 9 per-step fields).
_BOOTSTRAP_STRIDES = slice(6 + 3 * 9, 6 + 3 * 10)
#: The kernel's compile-time parameters, in its order (a direct launch passes them positionally, as the binder).
_CONSTEXPRS = tuple(name for name, parameter in inspect.signature(_triton_gae.gae_kernel.fn).parameters.items()
                    if parameter.annotation in (triton.language.constexpr, "tl.constexpr"))


class DirectLaunchWarning(RuntimeWarning):
    """A direct launch raised, or its check against Triton's binder failed: the binder launches every later call
    instead, with the same results."""


def _mode_from_environment() -> str:
    mode = os.environ.get(LAUNCH_VARIABLE, "").strip().lower() or "direct"
    if mode not in LAUNCH_MODES:
        raise ValueError(f"{LAUNCH_VARIABLE} must be one of {', '.join(LAUNCH_MODES)}, got {mode!r}")
    return mode


#: ``generation`` counts the changes of mode and the refusals: a direct launch taken in another generation is
#: checked again before it serves (``_triton_cupy_plan``'s launches on addresses).
_STATE = {"mode": _mode_from_environment(), "refused": None, "generation": 0}
#: The compiled kernels whose direct launch was checked against the binder's in this process, by identity (Triton
#: keeps a compiled kernel for the process: the same object comes back for every plan of its specialisation).
_CHECKED: dict[int, object] = {}
_WARNED: set[str] = set()
_LOCK = threading.Lock()


def launch_mode(mode: str | None = None) -> str:
    """The launch mode in force, ``"binder"`` or ``"direct"``; with ``mode``, make later launches of that mode and
    return the one that was in force (a benchmark measures both in one process)."""
    before = _STATE["mode"]
    if mode is not None:
        if mode not in LAUNCH_MODES:
            raise ValueError(f"the launch mode must be one of {', '.join(LAUNCH_MODES)}, got {mode!r}")
        _STATE["mode"], _STATE["refused"] = mode, None
        _STATE["generation"] += 1
    return before


def generation() -> int:
    """How many times the launch mode was chosen or direct launches were refused in this process."""
    return _STATE["generation"]


def direct_refused() -> str | None:
    """Why direct launches stopped serving in this process (a failed check, a launch that raised), or None."""
    return _STATE["refused"]


def make(call, arguments: dict):
    """The plan of a checked call solved by the Triton kernels (``arguments``: ``gae()``'s own), or None when the
    call is not one that it serves (see the module)."""
    p = call.problem
    if not is_torch_array(p.rewards):
        return None  # CuPy arrays: each call goes through torch views of them (``_triton_cupy``)
    if torch_is_recorded(p.rewards):
        return None  # traced (fake tensors, a recording mode): launched through wrap_triton, never kept
    if (p.offsets is not None or p.carry is not None or p.extra or p.values is None or call.offsets_valid is not None
            or call.axis != p.rewards.ndim - 1 or call.out_dtype != p.rewards.dtype or p.rewards.numel() == 0):
        return None
    if any(getattr(p, name) is not arguments[name] for name in _TENSORS):
        return None  # prepare cast, moved or broadcast one: the problem's tensor is not the caller's
    if any(arguments[name] is not None and type(arguments[name]) not in (float, int)
           for name in _problem.COEFFICIENTS):
        return None  # an array coefficient's range check reads its values: the generic plans run it
    if any(t is not None and (t.requires_grad or t.is_neg()) for t in map(arguments.get, _TENSORS)):
        return None
    bootstrap = arguments["bootstrap_value"]
    if not (bootstrap is None or type(bootstrap) is float or type(bootstrap) is torch.Tensor):
        return None
    if type(bootstrap) is torch.Tensor and (bootstrap.is_neg() or bootstrap.requires_grad or (
            p.bootstrap.dtype == bootstrap.dtype and p.bootstrap.data_ptr() != bootstrap.data_ptr())):
        return None  # kept negated, or laid out anew by prepare
    if getattr(triton_backend._SETTINGS, "override", None) is not None:
        return None  # made under tuned(): its launch settings are not the key's
    launch = _triton_launch.solve_layout(p, triton_backend._settings())
    if launch is None:
        return None  # batch axes that do not fold: launched a slice at a time
    tuned = _plans.ChosenBackendPlan(call, triton_backend.BACKEND, arguments["truncated_bootstrap"])
    cast = p.bootstrap.dtype if type(bootstrap) is torch.Tensor and p.bootstrap.dtype != bootstrap.dtype else None
    return TritonPlan(p, launch, tuned, cast)


class TritonPlan:
    """One layout's launches of the Triton kernels; ``plan(rewards, values, ...)`` is ``gae()`` on arguments of
    that key, given in ``gae()``'s order (as ``gae_xp._plans`` calls a plan)."""

    def __init__(self, p, launch, tuned, cast=None):
        rewards = p.rewards
        self.shape, self.dtype, self.device = tuple(rewards.shape), rewards.dtype, rewards.device
        self.device_index = rewards.device.index if rewards.device.type == "cuda" else None
        self.grid, self.modes, self.options = launch.grid, launch.modes, dict(launch.constants)
        self.keywords = [dict(self.options, MODE=mode) for mode in self.modes]  # per launch: what the binder takes
        self.maps, self.maps_dtype = launch.maps, launch.maps_dtype
        numbers = tuple(value if kind == _triton_launch.NUMBER else 0.0
                        for kind, value in zip(launch.kinds, (p.gamma, p.lam, p.critic_lam)))
        counts = list(launch.counts)
        self.tail = (*counts, *numbers)  # a tensor bootstrap: its strides as the key fixes them
        counts[_BOOTSTRAP_STRIDES] = (0, 0, 0)
        self.number_tail = (*counts, *numbers)  # a number: one element that every row reads
        self.tuned = tuned
        self.cast = cast  # the compute dtype a tensor bootstrap value is cast to per call (bfloat16 ones), or None
        self.constant = None  # (value, stream, one-element tensor) of the last Python-number bootstrap value
        #: direct launches: per 16-byte alignment of the caller's pointers (Triton specialises on it), the compiled
        #: kernels and, per launch mode, (run, function, packed metadata, constexprs); an entry is published whole,
        #: once its kernels are checked, so that another thread sees it complete or not at all
        self.kernels: dict[tuple, tuple[list, list]] = {}

    def __call__(self, rewards, values, gamma, lam, bootstrap_value, next_values, terminated, truncated, mask,
                 critic_lam, views=None):
        if getattr(triton_backend._SETTINGS, "override", None) is not None:  # tuned(): the backend's own path
            return self.tuned(rewards, values, gamma, lam, bootstrap_value, next_values, terminated, truncated,
                              mask, critic_lam)
        arguments = self.pack(rewards, values, bootstrap_value, next_values, terminated, truncated, mask,
                              *self.outputs(rewards))
        if self.device_index is not None and torch.cuda.current_device() != self.device_index:
            with torch.cuda.device(self.device_index):
                self.launch(arguments)
        else:
            self.launch(arguments)
        return arguments[_ADVANTAGES], arguments[_RETURNS]

    def outputs(self, rewards) -> tuple:
        """(advantages, returns, the chunks' maps or ``rewards`` in their place): new tensors on the device."""
        empty, shape, dtype, device = torch.empty, self.shape, self.dtype, self.device
        maps = rewards if self.maps is None else empty(self.maps, dtype=self.maps_dtype, device=device)
        return empty(shape, dtype=dtype, device=device), empty(shape, dtype=dtype, device=device), maps

    def pack(self, rewards, values, bootstrap_value, next_values, terminated, truncated, mask, advantages, returns,
             maps) -> tuple:
        """The kernel's arguments up to its constexprs: the caller's tensors in their slots (``rewards`` in place of
        an absent one or a number), the bootstrap value as a tensor, the outputs, the plan's counts and numbers."""
        if bootstrap_value is None or type(bootstrap_value) is float:
            bootstrap, tail = self._number(0.0 if bootstrap_value is None else bootstrap_value), self.number_tail
        else:  # a tensor of the key's layout (a cast one's layout follows from it, as on the first call)
            bootstrap = bootstrap_value if self.cast is None else bootstrap_value.to(self.cast)
            tail = self.tail
        return (rewards, values, rewards if next_values is None else next_values,
                rewards if terminated is None else terminated.view(torch.uint8),
                rewards if truncated is None else truncated.view(torch.uint8),
                rewards if mask is None else mask.view(torch.uint8),
                rewards, rewards, rewards, bootstrap, rewards, rewards, advantages, returns, maps, *tail)

    def launch(self, arguments: tuple) -> None:
        """Launch the kernels on ``arguments`` (a call's, in the kernel's order up to its constexprs)."""
        if _STATE["mode"] == "direct" and _STATE["refused"] is None and self._direct(arguments):
            return
        self.binder(arguments)

    def binder(self, arguments: tuple) -> None:
        """Launch ``arguments`` through Triton's launcher (``kernel[grid](...)``), once per launch mode."""
        launcher = _triton_launch.gae_kernel[self.grid]
        for keywords in self.keywords:
            launcher(*arguments, **keywords)

    def _number(self, value: float):
        """A one-element tensor holding ``value`` in the compute dtype, on the device, ready on the current stream:
        the last one is kept while the value and the stream stay. Inside a CUDA-graph capture a new one is made
        every time and never kept: the graph owns it (a kept one could be freed, with its plan, before a replay
        reads it), and its fill is one of the graph's nodes."""
        capturing = self.device_index is not None and torch.cuda.is_current_stream_capturing()
        stream = _stream(self.device_index)
        constant = self.constant
        if not capturing and constant is not None and constant[0] == value and constant[1] == stream:
            return constant[2]
        tensor = torch.full((1,), value, dtype=torch.float64 if self.dtype == torch.float64 else torch.float32,
                            device=self.device)
        if not capturing:
            self.constant = (value, stream, tensor)
        return tensor

    # ------------------------------------------------------------------------------------------------ direct

    def _direct(self, arguments: tuple) -> bool:
        """Launch ``arguments`` through the compiled kernels themselves; False (the binder then launches) where
        this call cannot (see the module)."""
        if _binder_needed():
            return False
        addresses = _as_addresses(arguments)
        alignment = _alignment(addresses)
        entry = self.kernels.get(alignment)
        if entry is None:
            return self._take_compiled(arguments, alignment)
        try:
            self.run_compiled(addresses, entry[1])
        except Exception as error:  # noqa: BLE001 - any failure: the binder launches the call again, said once
            self.kernels.clear()  # never kept, nor taken unchecked: a direct mode chosen again checks them again
            for kernel in entry[0]:
                _CHECKED.pop(id(kernel), None)
            refuse(f"a direct launch raised {type(error).__name__}: {error}")
            return False
        return True

    def _take_compiled(self, arguments: tuple, alignment: tuple) -> bool:
        """The first launch of the plan at this alignment: the binder launches ``arguments`` and returns the
        compiled kernels, kept for the plan's later calls; a kernel not yet checked in this process first launches
        the same call into outputs of its own, which must equal the binder's. Inside a CUDA-graph capture or
        under torch's sync debug mode, an unchecked kernel is not kept (the check synchronises): a later eager
        call takes it."""
        launcher = _triton_launch.gae_kernel[self.grid]
        kernels = [launcher(*arguments, **keywords) for keywords in self.keywords]
        if not all(hasattr(kernel, "run") and hasattr(kernel, "packed_metadata") for kernel in kernels):
            return True  # the interpreter returns no compiled kernel: the binder launched, and launches
        launches = [(kernel.run, kernel.function, kernel.packed_metadata,
                     tuple(mode if name == "MODE" else self.options[name] for name in _CONSTEXPRS))
                    for mode, kernel in zip(self.modes, kernels)]
        if not all(id(kernel) in _CHECKED for kernel in kernels):
            if self.device_index is not None and (torch.cuda.is_current_stream_capturing()
                                                  or torch.cuda.get_sync_debug_mode() != 0):
                return True
            mine = list(arguments)
            for slot in (_ADVANTAGES, _RETURNS) + ((_MAPS,) if self.maps is not None else ()):
                mine[slot] = torch.empty_like(arguments[slot])
            try:
                self.run_compiled(_as_addresses(tuple(mine)), launches)
                same = all(_same(arguments[slot], mine[slot]) for slot in (_ADVANTAGES, _RETURNS))
            except Exception as error:  # noqa: BLE001 - any failure: the binder's results stand, said once
                refuse(f"a direct launch raised {type(error).__name__}: {error}")
                return True
            if not same:
                refuse("a direct launch gave other results than the binder's launch of the same arguments")
                return True
            _CHECKED.update((id(kernel), kernel) for kernel in kernels)
        self.kernels[alignment] = (kernels, launches)
        return True

    def run_compiled(self, arguments: tuple, launches: list, stream: int | None = None) -> None:
        """Launch ``arguments`` through compiled kernels (``launches``: per launch mode, (run, function, packed
        metadata, constexprs), as ``self.kernels`` keeps them) on ``stream`` (a raw stream; by default torch's
        current one)."""
        if stream is None:
            stream = _stream(self.device_index)
        grid = self.grid[0]
        for run, function, metadata, constexprs in launches:
            run(grid, 1, 1, stream, function, metadata, None, None, None, *arguments, *constexprs)


def direct_allowed() -> bool:
    """Whether a call may launch compiled kernels directly now: the direct mode, not refused in this process, and
    nothing that needs Triton's own launcher (``_binder_needed``)."""
    return _STATE["mode"] == "direct" and _STATE["refused"] is None and not _binder_needed()


def _binder_needed() -> bool:
    """Whether Triton's own launcher must run every call: launch hooks (a profiler), pre-run hooks on the kernel, or
    a debug mode or instrumentation that picks another compiled kernel than the one taken."""
    runtime = triton.knobs.runtime
    kernel = _triton_launch.gae_kernel
    return (_hooked(runtime.launch_enter_hook) or _hooked(runtime.launch_exit_hook)
            or bool(getattr(kernel, "pre_run_hooks", None)) or bool(getattr(runtime, "debug", False))
            or getattr(runtime, "add_stages_inspection_hook", None) is not None
            or getattr(getattr(triton.knobs, "compilation", None), "instrumentation_mode", "") not in ("", None))


def _hooked(hook) -> bool:
    """True when a launch hook of Triton's would be called: a function, or a chain of hooks (Triton 3.6+) holding
    one (an empty chain, or None, calls nothing: a direct launch passes None)."""
    return hook is not None and bool(getattr(hook, "calls", True))


def _stream(device_index) -> int:
    """torch's current stream of the CUDA device ``device_index`` as Triton's driver reads it (0 off CUDA)."""
    return 0 if device_index is None else torch._C._cuda_getCurrentRawStream(device_index)


def _as_addresses(arguments: tuple) -> tuple:
    """``arguments`` with each tensor of the kernel's array slots as its address: Triton's launcher passes an int as
    the device pointer itself, where for a tensor it calls ``data_ptr()`` and asks the driver for the pointer's
    device address (``cuPointerGetAttribute``), once per slot and call; ``rewards``, in the slots of absent arrays,
    is asked once."""
    rewards = arguments[0]
    first = rewards.data_ptr()
    return (first, *(first if a is rewards else a.data_ptr() for a in arguments[1:_MAPS + 1]),
            *arguments[_MAPS + 1:])


def _alignment(addresses: tuple) -> tuple:
    """Whether each of the caller's arrays (``_as_addresses``' first slots) starts on a 16-byte boundary (what
    Triton specialises a pointer on)."""
    return tuple(a % 16 == 0 for a in addresses[:_CALLERS])


def _same(a, b) -> bool:
    """Equal bit for bit where numbers, NaN where NaN."""
    return bool(((a == b) | (a.isnan() & b.isnan())).all())


def refuse(cause: str) -> None:
    """Stop direct launches for the process, and say why (once per cause)."""
    _STATE["refused"] = cause
    _STATE["generation"] += 1
    with _LOCK:
        if cause in _WARNED:
            return
        _WARNED.add(cause)
    warnings.warn(f"gae_xp: the Triton route's direct launch: {cause}; Triton's binder launches every later call "
                  "instead (the same results)", DirectLaunchWarning, stacklevel=3)
