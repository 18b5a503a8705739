"""CUDA arrays (CuPy, PyTorch): every GAE call, estimator, piece and gradient in fused numba-CUDA kernels.

A ``gae()`` call without packed offsets, ``critic_lam`` or a carry
(``lean_serves``) runs the lean kernels of ``_cuda_lean``: a row (or a chunk of a row, when rows are
too few to fill the GPU: two launches) streamed by a group of threads with a
two-number state. Every other call lays its arrays
out as (rows, T) views and runs the launch plan of ``_cuda_plan``: **one
launch** when a row fits a tile (T <= 2048; several rows share a tile),
**three** for longer rows (tile maps, carries between the tiles of each
row, final pass). The kernels (``_cuda_gae``: GAE,
V-trace, lambda-returns, discounted returns and piece summaries, reverse in
time; ``_cuda_backward``: the adjoint of GAE and the forward scan) read every
input once per tile launch with coalesced (striped) loads, compute in
registers, and write each output once; nothing the size of the inputs is
allocated besides the outputs, and no coefficient array is materialised (a
per-step or per-row gamma or lam is read in place, broadcast views included).

* Packed sequences (``offsets``): a sequence's end is a cut inside a tile,
  with its own bootstrap value (and incoming ``carry``); empty sequences
  give no output. Device offsets are read by the kernels themselves (a
  binary search per thread); the only host read of them is ``prepare``'s
  validation (one small device-to-host copy, none when the caller gives
  host offsets as a list or NumPy array). Offsets that nobody read
  (``host_offsets`` None: traced, or given to the operator directly) are
  checked on the device first (``_guarded``): where they break the contract
  the kernels get ``[0, T, ..., T]`` and every output is NaN.
* Pieces (CP shards, Dask blocks of CuPy arrays): ``summarize`` is launch 1
  (and 2 for long rows) writing every segment's summary; ``pieces`` also
  keeps the tiles' maps so that the fix-up is launch 3 alone.
* ``critic_lam``: the second chain runs in the same launches (+1 output).
* bfloat16 and float16 arrays are read as they are (bfloat16 as its 16 bits,
  rounded back to nearest-even on output), computed in float32, and the
  outputs keep the problem's dtype.
* ``gae_backward``: the adjoint, three launches (one for short rows) of the
  forward-in-time kernels; with ``critic_lam`` one such pass per chain.

Arrays are taken zero-copy (torch tensors by their pointer, shape and
strides; CuPy arrays through ``__cuda_array_interface__``) without
synchronizing any stream; kernels run on the caller's current CuPy or torch
stream, on the arrays' device; no host synchronization, no copy to the host.
Kernels compile on first use per (dtype, structure) with explicit signatures
and are cached on disk; absent arrays are passed as ``None`` (one integer
parameter, nothing to marshal). They are launched through the driver with
argument blocks laid out once per kernel (``_cuda_launch``), not by numba's
per-call dispatcher. A repeated ``gae()`` call of one layout binds its arrays
into the first call's checked problem (``gae_xp._plans.BoundLayoutPlan``). With ``NUMBA_ENABLE_CUDASIM=1`` (set before
numba is imported) the same kernels run in numba's simulator on NumPy arrays.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import math
import os

import numpy as np

from gae_xp._compat import device_of, is_cupy_array, is_jax_array, is_numpy_array, is_torch_array
from gae_xp._pieces import identity_map
from gae_xp._prepare import guarded_offsets
from gae_xp._problem import fill_invalid

from . import _cuda_plan
from ._cuda_launch import Descriptor

NAME = "numba-cuda"


@functools.cache
def _not_installed() -> str | None:
    if importlib.util.find_spec("numba") is None or importlib.util.find_spec("numba.cuda") is None:
        return "numba-cuda is not installed (pip install 'gae_xp[cuda12]' or 'gae_xp[cuda13]')"
    return None


def simulated() -> bool:
    """True when numba's CUDA simulator is on (read from the environment, as numba does at import)."""
    return os.environ.get("NUMBA_ENABLE_CUDASIM", "0") == "1"


def _device_context(array):
    """The array's own library's device context: CuPy and torch allocate on their *current* device (array-api-compat's
    ``empty(..., device=)`` checks the device, then allocates on the current one), so every allocation of a call is
    made inside this context, as its launches are (``_Launch``)."""
    if is_cupy_array(array):
        return array.device  # a cupy.cuda.Device: entering it makes it current
    if is_torch_array(array) and array.device.type == "cuda":
        import torch

        return torch.cuda.device(array.device)
    return contextlib.nullcontext()


def _on_the_arrays_device(locate):
    """Run the decorated function inside ``_device_context`` of the array ``locate(*args, **kwargs)`` names."""
    def decorate(function):
        @functools.wraps(function)
        def on_device(*args, **kwargs):
            with _device_context(locate(*args, **kwargs)):
                return function(*args, **kwargs)

        return on_device

    return decorate


class NumbaCUDABackend:
    name = NAME
    segments = True
    uses_chunk_size = False
    critic_lam = True
    #: ``prepare`` may hand this backend float16/bfloat16 arrays as they are: the kernels widen them in registers.
    narrow_floats = True

    def unavailable_reason(self, xp, arrays, *, forced=False):
        # The arrays are asked first, numba last: NumPy or array-api-strict arrays never make numba load.
        if simulated():
            if not forced:
                return "the CUDA simulator serves only backend='numba-cuda', never 'auto'"
            if not all(is_numpy_array(a) for a in arrays):
                return "under NUMBA_ENABLE_CUDASIM=1 the kernels take NumPy arrays"
            return _not_installed()
        if any(is_jax_array(a) for a in arrays):
            return "JAX arrays are not served by the numba-CUDA kernels: the 'xp' path serves them"
        if not all(is_torch_array(a) and a.device.type == "cuda" or hasattr(a, "__cuda_array_interface__")
                   for a in arrays):
            return "the numba-CUDA kernels take CUDA arrays (CuPy arrays, torch CUDA tensors)"
        if any(getattr(a, "requires_grad", False) for a in arrays):
            return "tensors that require grad need backend='xp' (or the autograd custom op, which calls gae_backward)"
        if _not_installed():
            return _not_installed()
        from ._cuda_import import cuda

        if not cuda.is_available():
            return "numba-cuda finds no usable CUDA driver or GPU"
        return None

    # --- forward families ----------------------------------------------------------------------------------

    def gae(self, problem, *, chunk_size=None):
        """(advantages, returns) of a problem (see ``gae_xp._problem.GaeProblem``), in its dtype."""
        p = problem
        if p.carry is not None and p.critic_lam is not None:
            raise ValueError("a carry enters one advantage chain: solve critic_lam's returns as a problem of their "
                             "own")
        if lean_serves(p):
            return _lean(p)
        inputs = {name: getattr(p, name) for name in ("values", "next_values", "gamma", "lam", "critic_lam",
                                                     "terminated", "truncated", "mask")}
        return _forward("gae", p, inputs, bootstrap=p.bootstrap, carry=p.carry, fill=bool(p.fill_masked),
                        critic=p.critic_lam is not None)

    def solve_discounted_returns(self, problem):
        """``gae_xp.discounted_returns`` of a prepared problem: G_t = r_t + gamma_t (1 - done_t) G_{t+1}, G after a
        segment = its bootstrap value; masked steps are skipped and give 0."""
        p = problem
        inputs = {name: getattr(p, name) for name in ("gamma", "terminated", "truncated", "mask")}
        return _forward("returns", p, inputs, carry=p.bootstrap)[0]

    def solve_lambda_returns(self, problem):
        """``gae_xp.lambda_returns`` of a prepared problem (V' in ``problem.extra["next_values"]``)."""
        p = problem
        inputs = {name: getattr(p, name) for name in ("gamma", "lam", "terminated", "truncated", "mask")}
        inputs["next_values"] = p.extra["next_values"]
        return _forward("lambda", p, inputs)[0]

    def solve_vtrace(self, problem, *, clip_rho_threshold, clip_c_threshold, clip_pg_rho_threshold):
        """``gae_xp.vtrace`` of a prepared problem (log-ratios in ``problem.extra["log_rhos"]``): (vs, pg)."""
        p = problem
        inputs = {name: getattr(p, name) for name in ("values", "next_values", "gamma", "lam", "terminated",
                                                     "truncated", "mask")}
        inputs["log_rhos"] = p.extra["log_rhos"]
        clips = (clip_rho_threshold, clip_c_threshold, clip_pg_rho_threshold)
        return _forward("vtrace", p, inputs, bootstrap=p.bootstrap, clips=clips)

    # --- pieces ----------------------------------------------------------------------------------------------

    def summarize(self, problem):
        """Each segment's summary (``gae_xp._pieces.FIELDS``), (..., n, 5) in the compute dtype: launch 1, and
        launch 2 for rows longer than a tile (one read of the inputs)."""
        return self.pieces(problem).summary

    def pieces(self, problem) -> Pieces:
        """The summaries of a problem's segments, and a fix-up that reuses the same pass: ``finish(bootstrap,
        carry)`` is launch 3 alone (see ``Pieces``)."""
        return _summarize(problem)

    # --- the scan primitive --------------------------------------------------------------------------------

    @_on_the_arrays_device(lambda self, xp, x, *args, **kwargs: x)  # the coefficient's cast allocates
    def scan(self, xp, x, a, *, reverse, chunk_size=None):
        """``y_t = x_t + a_t y_{t+1}`` (reverse) or ``y_{t-1}`` (forward) along the last axis; x is never written."""
        from gae_xp._problem import GaeProblem

        coefficient = a if isinstance(a, float) else xp.broadcast_to(_cast(xp, a, x.dtype), tuple(x.shape))
        if reverse:  # discounted returns without flags, boundaries or bootstrap
            p = GaeProblem(xp=xp, rewards=x, values=None, gamma=coefficient, lam=1.0, bootstrap=None)
            return _forward("returns", p, {"gamma": coefficient})[0]
        return _forward_in_time("scan", xp, x, {"grad_advantages": x, "gamma": coefficient},
                                scalars=(coefficient if isinstance(coefficient, float) else 0.0, 0.0))["rewards"]

    # --- gradients -----------------------------------------------------------------------------------------

    @_on_the_arrays_device(lambda self, problem, *args: problem.rewards)  # critic_lam's sum allocates
    def gae_backward(self, problem, grad_advantages, grad_returns) -> dict:
        """The gradients of ``gae(problem)``'s (advantages, returns) to its inputs, given theirs (either may be
        None: no gradient from that output).

        Returns ``{"rewards", "values", "next_values", "bootstrap", "carry"}``,
        each shaped like the problem's array (time last; ``next_values`` and
        ``carry`` None when the problem has none), the per-step ones in the
        problem's dtype, the bootstrap's and the carry's in the compute dtype
        (as ``_numba_backward.gae_backward`` on the CPU). This is the adjoint of the forward
        scan (``_cuda_backward``): a forward scan of the upstream gradients
        with the same coefficients, cut at the same places. Per-step gamma
        and lam are coefficients here: they get no gradient. With
        ``critic_lam`` the two chains are two passes, summed.
        """
        p = problem
        if p.critic_lam is not None:
            first = self.gae_backward(p.replace(critic_lam=None), grad_advantages, None)
            second = self.gae_backward(p.replace(lam=p.critic_lam, critic_lam=None), None, grad_returns)
            return {name: None if first[name] is None else first[name] + second[name] for name in first}
        xp = p.xp
        inputs = {"grad_advantages": grad_advantages, "grad_returns": grad_returns, "gamma": p.gamma, "lam": p.lam,
                  "terminated": p.terminated, "truncated": p.truncated, "mask": p.mask}
        grads = _forward_in_time("adjoint", xp, p.rewards, inputs, problem=p,
                                 scalars=tuple(v if isinstance(v, float) else 0.0 for v in (p.gamma, p.lam)))
        grads["bootstrap"] = xp.reshape(grads["bootstrap"], tuple(p.bootstrap.shape))
        grads["carry"] = None if p.carry is None else xp.reshape(grads["carry"], tuple(p.carry.shape))
        grads.setdefault("next_values", None)
        return grads


class Pieces:
    """A problem's segment summaries (``summary``, (..., n, 5)) and its fix-up from the boundary values.

    ``finish(bootstrap, carry)`` returns (advantages, returns) of the problem
    with those (..., n) boundary values: for rows longer than a tile it is
    launch 3 alone, reading the tiles' maps that the summary pass left (so a
    shard's summary and fix-up read its inputs twice in all: 3 launches plus
    the all-gather between them).

    ``finish`` may run on another stream than the summary pass: launch 3
    waits for the event recorded after launch 2 on the summary's stream
    (``ready``), and the maps it reads are handed to the allocator as in use
    on the finishing stream (``_release_after_reading``), so that dropping
    this object cannot free them under a launch still reading them.
    """

    def __init__(self, problem, summary, plan, entering, *, owner=None, ready=None, stream=None):
        self.problem, self.summary, self._plan, self._entering = problem, summary, plan, entering
        #: the array holding the maps ``entering`` reads, the event after the launch that wrote them, its stream
        self._owner, self._ready, self._stream = owner, ready, stream

    @_on_the_arrays_device(lambda self, *args: self.problem.rewards)
    def finish(self, bootstrap, carry):
        p = self.problem.replace(bootstrap=bootstrap, carry=carry)
        if self._entering is None:
            return BACKEND.gae(p)
        inputs = {name: getattr(p, name) for name in ("values", "next_values", "gamma", "lam", "terminated",
                                                     "truncated", "mask")}
        outputs = _forward("gae", p, inputs, bootstrap=bootstrap, carry=carry, fill=bool(p.fill_masked),
                           entering=self._entering, value_chain=True, after=self._ready)
        _release_after_reading(self._owner, self._stream)
        return outputs


def _release_after_reading(owner, written_on) -> None:
    """``owner`` (memory written on stream ``written_on``, from that stream's pool) is now read by launches on the
    current stream: torch's caching allocator is told so (``record_stream``); for CuPy, ``written_on`` waits for an
    event recorded on the reading stream, so that its pool hands the memory out again only after the reads."""
    if owner is None or written_on is None:
        return
    with _Launch(owner) as launch:
        if is_torch_array(owner):
            import torch

            owner.record_stream(torch.cuda.current_stream(owner.device))
        else:
            launch.record().wait(written_on)


# --- launching ---------------------------------------------------------------------------------------------------


#: The per-step arguments of the reverse-in-time kernels after rewards, in their order.
_ORDER = ("values", "next_values", "gamma", "lam", "critic_lam", "log_rhos", "terminated", "truncated", "mask")


@_on_the_arrays_device(lambda family, p, *args, **kwargs: p.rewards)
def _forward(family, p, inputs, **options):
    """Run a reverse-in-time family (``_cuda_gae``) on a problem: its outputs as arrays shaped like rewards (NaN
    where unread device offsets break the contract: ``_guarded``)."""
    p, valid = _guarded(p)
    results = _launch_forward(family, p, inputs, **options)
    return results if valid is None else tuple(fill_invalid(p.xp, out, valid) for out in results)


def _launch_forward(family, p, inputs, *, bootstrap=None, carry=None, fill=False, critic=False,
                    clips=(1.0, 1.0, 1.0), entering=None, value_chain=None, after=None):
    """The launches of ``_forward``; they wait for the event ``after`` first (work on another stream that wrote
    ``entering``)."""
    xp, r = p.xp, p.rewards
    shape = tuple(r.shape)
    length, rows = shape[-1], math.prod(shape[:-1])
    device = device_of(r)
    results = [xp.empty(shape, dtype=r.dtype, device=device) for _ in range(2 if family in ("gae", "vtrace") else 1)]
    if length == 0 or rows == 0:
        return tuple(results)
    io = _dtype_name(r.dtype)
    present = tuple(name for name in _ORDER if (a := inputs.get(name)) is not None and not isinstance(a, float))
    plan = _plan(rows, length)
    reuse = entering is not None
    tiles, carrying, final, fields_count = _forward_kernels(family, io, present, p.offsets is not None,
                                                            carry is not None, fill, critic, value_chain,
                                                            plan.long_rows, reuse)
    compute = _compute(xp, io)
    scalars = _scalars(io, (inputs.get("gamma", 1.0), inputs.get("lam", 1.0), inputs.get("critic_lam", 0.0), *clips))
    with _Launch(r) as launch:
        launch.wait(after)
        arrays = [launch.array(_steps(xp, r, r.dtype, rows, length))]
        arrays += [launch.array(_steps(xp, inputs[name], r.dtype, rows, length)) if name in present else None
                   for name in _ORDER]
        bounds = [launch.array(_per_segment(xp, value, rows, compute)) if value is not None and family in _USES[name]
                  else None for name, value in (("bootstrap", bootstrap), ("carry", carry))]
        offsets = None if p.offsets is None else launch.array(_offsets(xp, p.offsets))
        geometry = plan.geometry()
        if tiles is not None:
            maps = launch.array(xp.empty((fields_count, plan.tiles), dtype=compute, device=device), written=True)
            entering = launch.array(xp.empty((fields_count, plan.tiles), dtype=compute, device=device), written=True)
            launch(tiles, plan.grid, plan.threads, *_tiles_arguments(arrays, offsets, scalars, geometry, maps))
            launch(carrying, plan.carry_grid, plan.carry_threads, *_carry_arguments(maps, geometry, entering))
        outs = [launch.array(_steps(xp, out, r.dtype, rows, length), written=True) for out in results]
        launch(final, plan.grid, plan.threads, *_final_arguments(arrays, bounds, offsets, scalars, geometry,
                                                                entering if plan.long_rows else None, outs))
    return tuple(results)


def _tiles_arguments(arrays, offsets, scalars, geometry, maps) -> tuple:
    """The arguments of a reverse-in-time launch 1 (``_cuda_gae``'s signature): the per-step arrays (rewards, then
    ``_ORDER``), no boundary values, the offsets, the scalars, the geometry and the tiles' maps it writes."""
    return (*arrays, None, None, offsets, scalars, geometry, maps, None, None, None, None)


def _carry_arguments(maps, geometry, entering) -> tuple:
    """The arguments of launch 2: the tiles' maps it reads, the geometry, the maps entering the tiles it writes."""
    return (maps, geometry, entering, None, None)


def _final_arguments(arrays, bounds, offsets, scalars, geometry, entering, outs) -> tuple:
    """The arguments of a reverse-in-time launch 3 (or the only one): the per-step arrays, the boundary values
    (bootstrap, carry), the offsets, the scalars, the geometry, the maps entering the tiles (None for a row that
    fits a tile) and the one or two outputs."""
    return (*arrays, *bounds, offsets, scalars, geometry, None, entering, None, *outs, *([None] * (2 - len(outs))))


@functools.lru_cache(maxsize=1024)
def _forward_kernels(family, io, present, offsets, carry, fill, critic, value_chain, long_rows, reuse):
    """(launch 1, launch 2, launch 3, map slots) of a reverse-in-time call: launches 1 and 2 None for a row that
    fits a tile, or when the maps entering the tiles are given (``reuse``: a piece's fix-up)."""
    from . import _cuda_gae

    if value_chain is None:
        value_chain = _cuda_gae.value_chain(family, present)
    final = _cuda_gae.Structure(family, "final", frozenset(present), offsets=offsets, carry=carry, entering=long_rows,
                                fill=fill, critic=critic, value_chain=value_chain)
    slots = _slots(value_chain, critic)
    if not long_rows or reuse:
        return None, None, _compiled("gae", io, final), slots
    tiles = final._replace(phase="tiles", carry=False, entering=False, fill=False)
    return _compiled("gae", io, tiles), _carry(io, value_chain, critic, True, False), _compiled("gae", io, final), slots


#: The per-step arrays the lean kernels may read besides rewards and values (``_cuda_lean.OPTIONAL_STEPS``).
_LEAN_STEPS = ("next_values", "gamma", "lam", "terminated", "truncated", "mask")


def lean_serves(problem) -> bool:
    """True when the lean kernels (``_cuda_lean``) solve this ``gae`` problem: values present, no packed offsets,
    ``critic_lam``, carry or extra arrays. The general kernels of ``_cuda_gae`` solve the others. ``problem`` may
    be a stand-in with shapes and dtypes only (``tools.traffic.fused_launches``): an absent field counts as None."""
    return getattr(problem, "values", None) is not None and not getattr(problem, "extra", None) and all(
        getattr(problem, name, None) is None for name in ("offsets", "critic_lam", "carry"))


@_on_the_arrays_device(lambda p: p.rewards)
def _lean(p):
    """(advantages, returns) of a problem that ``lean_serves``, by the lean kernels: one launch, or two
    when rows are cut into chunks (``_cuda_plan.lean_plan``)."""
    xp, r = p.xp, p.rewards
    shape = tuple(r.shape)
    length, rows = shape[-1], math.prod(shape[:-1])
    device = device_of(r)
    results = (xp.empty(shape, dtype=r.dtype, device=device), xp.empty(shape, dtype=r.dtype, device=device))
    if length == 0 or rows == 0:
        return results
    io = _dtype_name(r.dtype)
    present = tuple(name for name in _LEAN_STEPS
                    if (a := getattr(p, name)) is not None and not isinstance(a, float))
    plan = _lean_plan(rows, length, io)
    maps_kernel, final_kernel = _lean_kernels(io, present, plan.chunks > 1, bool(p.fill_masked))
    compute = _compute(xp, io)
    scalars = _scalars(io, (p.gamma, p.lam))
    with _Launch(r) as launch:
        arrays = [launch.array(_steps(xp, r, r.dtype, rows, length)),
                  launch.array(_steps(xp, p.values, r.dtype, rows, length))]
        arrays += [launch.array(_steps(xp, getattr(p, name), r.dtype, rows, length)) if name in present else None
                   for name in _LEAN_STEPS]
        bootstrap = launch.array(_per_segment(xp, p.bootstrap, rows, compute))
        geometry = plan.geometry()
        maps = None
        if maps_kernel is not None:
            maps = launch.array(xp.empty(_lean_maps_shape(present, plan), dtype=compute, device=device), written=True)
            launch(maps_kernel, plan.grid, plan.threads, *arrays, bootstrap, scalars, geometry, maps, None, None)
        outs = [launch.array(_steps(xp, out, r.dtype, rows, length), written=True) for out in results]
        launch(final_kernel, plan.grid, plan.threads, *arrays, bootstrap, scalars, geometry, maps, *outs)
    return results


@functools.lru_cache(maxsize=4096)
def _lean_plan(rows: int, length: int, io: str) -> _cuda_plan.LeanPlan:
    return _cuda_plan.lean_plan(rows, length, items=_cuda_plan.lean_items(io))


def _lean_maps_shape(present: tuple, plan: _cuda_plan.LeanPlan) -> tuple[int, int]:
    """The chunks' maps of a lean call (``_cuda_lean``): their numbers (more with the value chain: a mask without
    next_values) by the rows' chunks."""
    value_chain = "mask" in present and "next_values" not in present
    return (_cuda_plan.lean_map_rows(value_chain), plan.rows * plan.chunks)


@functools.lru_cache(maxsize=256)
def _lean_kernels(io: str, present: tuple, chunked: bool, fill: bool):
    """(maps launch or None, final launch) of the lean kernels for a dtype, the optional arrays present and
    ``fill_masked`` (which only a mask makes a difference to)."""
    from ._cuda_lean import LeanStructure

    inputs = frozenset(present)
    final = _compiled("lean", io, LeanStructure(inputs, "final", chunked, fill and "mask" in inputs))
    if not chunked:
        return None, final
    return _compiled("lean", io, LeanStructure(inputs, "maps")), final


#: The families that read each per-segment boundary array (see ``_cuda_gae.signature``).
_USES = {"bootstrap": ("gae", "vtrace"), "carry": ("gae", "returns")}


@_on_the_arrays_device(lambda p: p.rewards)
def _summarize(p) -> Pieces:
    """Piece summaries of a gae problem (launch 1, and 2 for long rows), keeping the tiles' maps for the fix-up
    (NaN summaries where unread device offsets break the contract: ``_guarded``)."""
    if p.critic_lam is not None:
        raise ValueError("pieces solve one advantage chain: summarize critic_lam's returns as a problem of their own")
    p, valid = _guarded(p)
    pieces = _launch_summaries(p)
    if valid is not None:
        pieces.summary = fill_invalid(p.xp, pieces.summary, valid)
    return pieces


def _launch_summaries(p) -> Pieces:
    from . import _cuda_gae

    xp, r = p.xp, p.rewards
    shape, length = tuple(r.shape), r.shape[-1]
    rows = math.prod(shape[:-1])
    count = 1 if p.offsets is None else int(p.offsets.shape[0]) - 1
    io = _dtype_name(r.dtype)
    compute = _compute(xp, io)
    identity = identity_map(xp, compute, device_of(r))
    summary = xp.broadcast_to(identity, (rows, count, 5)) + xp.zeros((rows, count, 5), dtype=compute,
                                                                     device=device_of(r))
    if length == 0 or rows == 0:
        return Pieces(p, xp.reshape(summary, (*shape[:-1], count, 5)), None, None)
    inputs = {name: getattr(p, name) for name in ("values", "next_values", "gamma", "lam", "terminated", "truncated",
                                                 "mask")}
    present = {name: a for name, a in inputs.items() if a is not None and not isinstance(a, float)}
    plan = _plan(rows, length)
    structure = _cuda_gae.Structure("gae", "tiles", frozenset(present), offsets=p.offsets is not None,
                                    summaries=True, value_chain=True)
    fields_count = _slots(True, False)
    entering = owner = None
    with _Launch(r) as launch:
        steps = {name: launch.array(_steps(xp, a, r.dtype)) for name, a in present.items()}
        arrays = [launch.array(_steps(xp, r, r.dtype)), *(steps.get(name) for name in _ORDER)]
        offsets = None if p.offsets is None else launch.array(_offsets(xp, p.offsets))
        geometry = plan.geometry()
        scalars = tuple(_scalar(v, io) for v in (p.gamma, p.lam, 0.0, 1.0, 1.0, 1.0))
        maps = launch.array(xp.empty((fields_count, plan.tiles), dtype=compute, device=device_of(r)), written=True)
        opened = launch.array(xp.full((plan.tiles,), -1, dtype=xp.int64, device=device_of(r)), written=True)
        out = launch.array(summary, written=True)
        launch(_compiled("gae", io, structure), plan.grid, plan.threads, *arrays, None, None, offsets, scalars,
               geometry, maps, None, opened, out, None)
        if plan.long_rows:
            owner = xp.empty((fields_count, plan.tiles), dtype=compute, device=device_of(r))
            entering = launch.array(owner, written=True)
            launch(_carry(io, True, False, True, True), plan.carry_grid, plan.carry_threads, maps, geometry,
                   entering, opened, out)
        ready = launch.record() if entering is not None else None
    return Pieces(p, xp.reshape(summary, (*shape[:-1], count, 5)), plan, entering, owner=owner, ready=ready,
                  stream=None if ready is None else launch.stream)


@_on_the_arrays_device(lambda family, xp, like, *args, **kwargs: like)
def _forward_in_time(family, xp, like, inputs, *, problem=None, scalars):
    """Run a forward-in-time family (``_cuda_backward``): {"rewards": y} for the scan, the gradients for the
    adjoint (NaN where unread device offsets break the contract: ``_guarded``)."""
    valid = None
    if problem is not None:
        problem, valid = _guarded(problem)
    results = _launch_forward_in_time(family, xp, like, inputs, problem=problem, scalars=scalars)
    return results if valid is None else {name: fill_invalid(xp, value, valid) for name, value in results.items()}


def _launch_forward_in_time(family, xp, like, inputs, *, problem, scalars):
    from . import _cuda_backward

    shape, length = tuple(like.shape), like.shape[-1]
    rows = math.prod(shape[:-1])
    adjoint = family == "adjoint"
    has_next = adjoint and problem.next_values is not None
    has_carry = adjoint and problem.carry is not None
    names = ["rewards"] + (["values"] if adjoint else []) + (["next_values"] if has_next else [])
    results = {name: xp.empty(shape, dtype=like.dtype, device=device_of(like)) for name in names}
    io = _dtype_name(like.dtype)
    compute = _compute(xp, io)
    count = 1 if problem is None or problem.offsets is None else int(problem.offsets.shape[0]) - 1
    if adjoint:
        results["bootstrap"] = xp.zeros((rows, count), dtype=compute, device=device_of(like))
        if has_carry:
            results["carry"] = xp.zeros((rows, count), dtype=compute, device=device_of(like))
    if length == 0 or rows == 0:
        return results
    present = {name: a for name, a in inputs.items() if a is not None and not isinstance(a, float)}
    plan = _plan(rows, length)
    structure = _cuda_backward.Structure(
        family, "final", frozenset("coefficient" if name == "gamma" and not adjoint else name for name in present
                                   if name != "grad_advantages" or adjoint),
        offsets=problem is not None and problem.offsets is not None, entering=plan.long_rows,
        fill=adjoint and bool(problem.fill_masked), next_values=has_next, carry=has_carry)
    with _Launch(like) as launch:
        steps = {name: launch.array(_steps(xp, a, like.dtype)) for name, a in present.items()}
        arrays = [steps.get(name) for name in ("grad_advantages", "grad_returns", "gamma", "lam", "terminated",
                                               "truncated", "mask")]
        offsets = None if structure.offsets is False else launch.array(_offsets(xp, problem.offsets))
        geometry = plan.geometry()
        scalars_t = tuple(_scalar(v, io) for v in scalars)
        entering = None
        if plan.long_rows:
            fields_count = _slots(structure.value_chain, False)
            maps = launch.array(xp.empty((fields_count, plan.tiles), dtype=compute, device=device_of(like)),
                                written=True)
            entering = launch.array(xp.empty((fields_count, plan.tiles), dtype=compute, device=device_of(like)),
                                    written=True)
            tiles = _compiled("backward", io, structure._replace(phase="tiles", entering=False, fill=structure.fill))
            launch(tiles, plan.grid, plan.threads, *arrays, offsets, scalars_t, geometry, maps, None, None, None, None,
                   None, None)
            launch(_carry(io, structure.value_chain, False, False, False), plan.carry_grid, plan.carry_threads, maps,
                   geometry, entering, None, None)
        outs = [launch.array(_steps(xp, results[name], like.dtype), written=True) for name in names]
        outs += [None] * (3 - len(outs))
        per_segment = [launch.array(results["bootstrap"], written=True) if adjoint and not has_next else None,
                       launch.array(results["carry"], written=True) if has_carry else None]
        launch(_compiled("backward", io, structure), plan.grid, plan.threads, *arrays, offsets, scalars_t, geometry,
               None, entering, *outs, *per_segment)
    return results


def _slots(value_chain: bool, critic: bool) -> int:
    """The numbers of a tile's map that launch 1 writes (``_cuda_plan.Fields``: its live slots, ``ends`` among
    them)."""
    return len(_cuda_plan.Fields(value_chain, critic, True).live())


@functools.lru_cache(maxsize=4096)
def _plan(rows: int, length: int) -> _cuda_plan.Plan:
    return _cuda_plan.plan(rows, length)


def _scalars(io: str, values: tuple) -> tuple:
    """The kernels' ``scalars`` argument (floats; an array's slot 0), remembered per (dtype, values)."""
    key = (io, *(v if isinstance(v, float) else None for v in values))
    scalars = _SCALARS.get(key)
    if scalars is None:
        scalars = _SCALARS[key] = tuple(_scalar(v, io) for v in values)
        if len(_SCALARS) > 4096:
            _SCALARS.clear()
    return scalars


_SCALARS: dict = {}


def _scalar(value, io: str):
    """A kernel's scalar argument in the compute dtype (0 for an array's slot)."""
    return (np.float64 if io == "float64" else np.float32)(value if isinstance(value, float) else 0.0)


_DTYPE_NAMES: dict = {}


def _dtype_name(dtype) -> str:
    name = _DTYPE_NAMES.get(dtype)
    if name is None:
        name = _DTYPE_NAMES[dtype] = str(dtype).rsplit(".", 1)[-1]
    return name


def _compute(xp, io: str):
    return xp.float64 if io == "float64" else xp.float32


def _cast(xp, array, dtype):
    return array if array.dtype == dtype else xp.astype(array, dtype)


def _rows(xp, array):
    """A (rows, T) view of a (..., T) array (a copy only when its batch axes cannot be merged)."""
    return xp.reshape(array, (math.prod(array.shape[:-1]), array.shape[-1]))


def _steps(xp, array, dtype, rows: int | None = None, length: int | None = None):
    """A per-step array as the kernels read it: (rows, T), bool as uint8, bfloat16 as its bits, floats in ``dtype``.

    A reshape (a view unless the batch axes cannot merge into one stride) of the array, or of its cast when its
    dtype is another float's.
    """
    if rows is None:
        rows, length = math.prod(array.shape[:-1]), array.shape[-1]
    if array.dtype == dtype:
        view = array if array.ndim == 2 else array.reshape(rows, length)
        return _bits(view, "uint16") if _dtype_name(dtype) == "bfloat16" else view
    if _dtype_name(array.dtype) == "bool":
        return _bits(array.reshape(rows, length), "uint8")
    return _steps(xp, xp.astype(array, dtype), dtype, rows, length)


def _bits(array, kind: str):
    """The same memory read as unsigned integers of the same width (zero-copy)."""
    if is_torch_array(array):
        import torch

        return array.view(torch.uint8 if kind == "uint8" else torch.int16)  # int16: torch < 2.3 has no uint16
    return array.view(np.dtype(kind)) if is_numpy_array(array) else array.view(kind)


def _per_segment(xp, value, rows: int, compute):
    """A (..., n) boundary array as (rows, n) in the compute dtype (broadcast views stay views)."""
    return xp.reshape(_cast(xp, value, compute), (rows, value.shape[-1]))


def _offsets(xp, offsets):
    return _cast(xp, offsets, xp.int64)


def _guarded(p):
    """(p, None) when p's offsets were checked on the host (``host_offsets``) or it has none; else (p with offsets
    the kernels can index by, valid): device offsets that nobody read (traced, or given to the operator directly)
    are checked on the device (``guarded_offsets``, no synchronisation), and the caller fills its outputs with
    NaN where they break the contract."""
    if p.offsets is None or p.host_offsets is not None:
        return p, None
    offsets, valid = guarded_offsets(p.xp, _offsets(p.xp, p.offsets), p.rewards.shape[-1])
    return p.replace(offsets=offsets), valid


class _NoneArgument:
    """numba-cuda launch extension: an absent array (``None``, typed ``none``) is one pointer-sized 0."""

    def prepare_args(self, ty, val, stream=None, retr=None):
        from ._cuda_import import types

        if isinstance(ty, types.NoneType):
            return types.uint64, 0
        return ty, val


_EXTENSIONS = [_NoneArgument()]


@functools.lru_cache(maxsize=None)
def _compiled(module: str, io: str, structure):
    """A kernel of ``_cuda_gae`` ("gae"), ``_cuda_lean`` ("lean") or ``_cuda_backward`` ("backward"), compiled for
    its signature."""
    if module == "gae":
        from ._cuda_gae import forward_kernel
    elif module == "lean":
        from ._cuda_lean import lean_kernel as forward_kernel
    else:
        from ._cuda_backward import forward_kernel
    return _jit(forward_kernel(io, structure))


@functools.lru_cache(maxsize=None)
def _carry(io: str, value_chain: bool, critic: bool, reverse: bool, complete: bool):
    from ._cuda_kernels import Fields, carry_kernel

    return _jit(carry_kernel(io, Fields(value_chain, critic, True), reverse=reverse, complete=complete))


def _jit(spec):
    """A kernel compiled for its signature (cached on disk; the simulator takes the function as it is)."""
    from ._cuda_import import cuda

    if simulated():
        return cuda.jit(spec.signature)(spec.function)
    from ._numba_cache import install_cuda

    install_cuda()  # the kernels' cache goes to gae_xp's cache directory, never beside the installed package
    bounds = {} if spec.launch_bounds is None else {"launch_bounds": spec.launch_bounds}
    return cuda.jit(spec.signature, cache=True, extensions=_EXTENSIONS, **bounds)(spec.function)


def _launch_through_the_driver(choice: str) -> bool:
    """``GAE_XP_CUDA_LAUNCH``: ``driver`` (the default: packed argument blocks, ``cuLaunchKernel``) or ``numba``
    (numba-cuda's own launcher, a way back should the driver launch misbehave on some setup)."""
    if choice not in ("driver", "numba"):
        raise ValueError(f"GAE_XP_CUDA_LAUNCH must be 'driver' or 'numba', got {choice!r}")
    return choice == "driver"


class _Launch(contextlib.AbstractContextManager):
    """Launches on the arrays' device and the caller's current stream; arrays go to the kernels zero-copy.

    On a GPU the kernels are launched through the driver with their argument blocks packed by
    ``_cuda_launch.Launcher`` (arrays as ``_cuda_launch.Descriptor``: pointer, shape, strides); with ``driver``
    False, by numba's own launcher (arrays as numba device arrays), which the GPU tests compare it with. The
    simulator has no driver: numba's launch, on NumPy arrays.
    """

    #: launch through the driver with packed argument blocks (False: numba's dispatcher, which
    #: ``GAE_XP_CUDA_LAUNCH=numba`` in the environment chooses at import)
    driver = _launch_through_the_driver(os.environ.get("GAE_XP_CUDA_LAUNCH", "driver"))

    def __init__(self, like):
        self._sim = simulated()
        self._like = like
        self._context = contextlib.nullcontext()
        self._device = 0
        self.stream = 0

    def __enter__(self):
        if not self._sim:
            from ._cuda_import import cuda

            self._device = _device_index(self._like)
            self._context = cuda.gpus[self._device]
            self._context.__enter__()
            self.stream = _current_stream(self._like)
        return self

    def __exit__(self, *exc):
        return self._context.__exit__(*exc)

    def array(self, array, *, written: bool = False):
        """The array as the kernels take it, on the same memory, without synchronizing any stream (None stays
        None): a ``Descriptor`` (or a numba device array, ``driver`` False).

        Under the simulator: the NumPy array itself if the kernels write it, else marked as input only (the
        simulator copies every other argument back, which a read-only broadcast view refuses). The simulator
        copies arguments in one piece, so a strided view is made contiguous there first; a broadcast stays a
        broadcast, of a contiguous copy of its core when the core (the array without its zero-stride axes) is not
        contiguous itself.
        """
        if array is None:
            return None
        if not self._sim:
            return _descriptor(array) if self.driver else _device_array(array)
        from ._cuda_import import cuda

        if written:
            return array
        return cuda.In(_one_piece(array))

    def record(self):
        """An event recorded on this launch's stream after the launches so far (None under the simulator, which
        has one stream)."""
        if self._sim:
            return None
        from ._cuda_import import cuda

        event = cuda.event(timing=False)
        event.record(self.stream)
        return event

    def wait(self, event) -> None:
        """The next launches on this stream start after ``event`` (None: no wait)."""
        if event is not None:
            event.wait(self.stream)

    def __call__(self, kernel, grid, threads: int, *args):
        if self._sim:
            kernel[grid, threads](*args)
        elif self.driver:
            _launcher(kernel)(self._device, self.stream, grid, threads, args)
        else:
            kernel[grid, threads, self.stream](*args)


@functools.lru_cache(maxsize=None)
def _launcher(kernel):
    """The driver launcher of a compiled kernel (one per kernel, like the kernels themselves)."""
    from ._cuda_launch import Launcher

    return Launcher(kernel)


def _one_piece(array):
    """``array`` over one contiguous buffer: itself if it is; a broadcast (zero strides) of a contiguous copy of
    its core; else a contiguous copy."""
    if array.flags.c_contiguous or array.flags.f_contiguous:
        return array
    if 0 not in array.strides:
        return array.copy()
    core = array[tuple(slice(0, 1) if stride == 0 else slice(None) for stride in array.strides)]
    if core.flags.c_contiguous or core.flags.f_contiguous:
        return array
    return np.broadcast_to(np.ascontiguousarray(core), array.shape)


#: ``__cuda_array_interface__`` type strings of the dtypes the kernels read (bfloat16: its bits, as unsigned).
_TYPESTRS = {"float16": "<f2", "float32": "<f4", "float64": "<f8", "uint8": "|u1", "int16": "<u2", "int64": "<i8"}


def _device_array(array):
    """A numba device array on a CUDA array's memory. A torch tensor is described from its pointer, shape and
    strides (faster than its ``__cuda_array_interface__``, which also refuses tensors that require grad)."""
    from ._cuda_import import cuda

    if is_torch_array(array):
        array = _materialized(array)
        item = array.element_size()
        description = {"shape": tuple(array.shape), "strides": tuple(s * item for s in array.stride()),
                       "typestr": _TYPESTRS[_dtype_name(array.dtype)], "data": (array.data_ptr(), False),
                       "version": 3}
        return cuda.from_cuda_array_interface(description, owner=array, sync=False)
    return cuda.as_cuda_array(array, sync=False)


def _descriptor(array):
    """A CUDA array's pointer, shape, strides (bytes) and item size, for the driver launch: a torch tensor's
    from the tensor itself (``_materialized``), others' from ``__cuda_array_interface__`` (C-contiguous when it
    gives no strides)."""
    if is_torch_array(array):
        array = _materialized(array)
        item = array.element_size()
        return Descriptor(array.data_ptr(), tuple(array.shape), tuple([s * item for s in array.stride()]), item,
                          array)
    interface = array.__cuda_array_interface__
    shape = tuple(interface["shape"])
    item = np.dtype(interface["typestr"]).itemsize
    strides = interface.get("strides")
    if strides is None:
        strides = tuple(math.prod(shape[axis + 1:]) * item for axis in range(len(shape)))
    return Descriptor(interface["data"][0], shape, tuple(strides), item, array)


def _materialized(tensor):
    """The tensor whose memory holds its values: torch keeps a negation lazily (a negative bit, as in
    ``z.conj().imag``), and the kernels read memory, so such a tensor is read from a negated copy (``resolve_neg``,
    on the tensor's stream); any other tensor is itself."""
    return tensor.resolve_neg() if tensor.is_neg() else tensor


def _device_index(array) -> int:
    if is_cupy_array(array):
        return array.device.id
    if is_torch_array(array):
        return array.device.index if array.device.index is not None else __import__("torch").cuda.current_device()
    return 0


def _current_stream(array):
    """The caller's current stream on the array's device, as a numba stream: CuPy's or torch's (one numba object
    per stream, remembered)."""
    from ._cuda_import import cuda

    if is_cupy_array(array):
        import cupy

        with array.device:
            pointer = cupy.cuda.get_current_stream().ptr
    elif is_torch_array(array):
        import torch

        pointer = torch.cuda.current_stream(array.device).cuda_stream
    else:
        return cuda.default_stream()
    key = (_device_index(array), pointer)
    stream = _STREAMS.get(key)
    if stream is None:
        if len(_STREAMS) > 64:
            _STREAMS.clear()
        stream = _STREAMS[key] = cuda.external_stream(pointer)
    return stream


_STREAMS: dict = {}


BACKEND = NumbaCUDABackend()
