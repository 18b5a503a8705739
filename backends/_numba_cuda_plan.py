"""The numba-CUDA kernels' plan: a repeated ``gae()`` call of one layout, launched from argument blocks packed once.

``make`` (named by ``backends.PLAN_MODULES``) makes a ``CudaPlan`` from a call that went
through every check of ``gae_xp._prepare`` and that these kernels solved,
where ``gae_xp._plans.BoundLayoutPlan`` could serve it too (the problem's
per-step arrays are the caller's own torch tensors, the coefficients Python
numbers, no packed sequences, no carry, no tensor that requires grad), its
results need no cast, and the kernels read the caller's arrays where they
lie (the (rows, T) views of ``numba_cuda._steps``, no copy). The plan holds
what ``numba_cuda._launch_forward`` works out on every call from the layout
alone: the kernels, the launch geometry, and each launch's argument block
(``_cuda_launch.BoundLaunch``), packed once with the first call's shapes,
strides and scalars.

A later call of the key (``gae_xp._plans`` says what it holds: a tensor's
dtype, shape, strides and device, the coefficients' values, what a
``bootstrap_value`` is) allocates its outputs, a zero bootstrap value per row
or its ``bootstrap_value``'s as ``prepare`` makes them (the key fixes their
layout too), and for rows longer than a tile the tiles' two maps; it writes
each array's data pointer into the blocks and launches. Per array only the
pointer changes between calls of one key: its shape and strides are the
key's. The plan keeps no array: every buffer a launch reads is the caller's or
allocated by the call on the caller's stream, so a CUDA graph that captured a
call owns them all, and no tensor of a call outlives it in the plan cache.

Not made under the simulator or with ``GAE_XP_CUDA_LAUNCH=numba`` (numba's
own launch takes arrays, not pointers), nor for CuPy arrays:
``BoundLayoutPlan`` serves those.
"""

from __future__ import annotations

import math

from gae_xp import _plans, _prepare
from gae_xp._compat import is_torch_array
from gae_xp._problem import COEFFICIENTS, PER_STEP

from . import numba_cuda
from ._cuda_launch import BoundLaunch, Descriptor

#: The per-step arrays of ``gae()`` a plan binds per call (its coefficients are Python numbers: in the key).
_STEPS = tuple(name for name in PER_STEP if name not in COEFFICIENTS)
#: The arrays a call's launches read or write, by position in ``CudaPlan.__call__``'s tuple of them.
_SOURCES = (*_STEPS, "bootstrap", "advantages", "returns", "maps", "entering")


def make(call, arguments: dict):
    """The plan of a checked ``gae()`` call that the numba-CUDA kernels solved (``arguments``: ``gae()``'s own),
    or None where it is not the case above."""
    if numba_cuda.simulated() or not numba_cuda._Launch.driver:
        return None
    p = call.problem
    if (p.values is None or call.out_dtype != p.rewards.dtype or call.axis != p.rewards.ndim - 1
            or not is_torch_array(p.rewards) or _plans.BoundLayoutPlan.of(call, numba_cuda.BACKEND, arguments) is None):
        return None
    return CudaPlan.of(p)


class CudaPlan:
    """One layout's ``gae()`` call on the numba-CUDA kernels; ``plan(...)`` is ``gae()`` on arguments of that key.

    ``launches``: per launch, its ``BoundLaunch``, its grid and block size, and the positions in ``_SOURCES`` of
    the arrays whose pointers it takes, in its ``varying`` order.
    """

    def __init__(self, p, scratch_shape, compute, launches):
        import torch

        from ._cuda_import import cuda

        r = p.rewards
        self.xp = p.xp
        self.shape = tuple(r.shape)
        self.batch_shape = self.shape[:-1]
        self.rows = math.prod(self.batch_shape)
        self.dtype, self.compute = r.dtype, compute
        self.bootstrap_dtype = p.bootstrap.dtype
        self.device = r.device
        self.launches = launches
        #: the tiles' maps of a row longer than a tile, or the chunks' maps of the lean kernels (None: neither)
        self.scratch_shape = scratch_shape
        #: whether a launch reads the maps entering the tiles (the general kernels' launch 3 of long rows)
        self._entering = any(_SOURCES.index("entering") in sources for _, _, _, sources in launches)
        self._empty, self._zeros, self._pointer = torch.empty, torch.zeros, torch.Tensor.data_ptr
        #: the device's context, made current around the launches, as ``numba_cuda._Launch`` does
        self._device_index = numba_cuda._device_index(r)
        self._context = cuda.gpus[self._device_index]

    @classmethod
    def of(cls, p):
        """The plan of a prepared problem whose arrays are the caller's, or None where the kernels would read a copy
        of one of them (its batch axes do not merge into one stride, or torch keeps it negated lazily)."""
        xp, r = p.xp, p.rewards
        length = r.shape[-1]
        rows = math.prod(r.shape[:-1])
        if length == 0 or rows == 0:
            return None
        io = numba_cuda._dtype_name(r.dtype)
        compute = numba_cuda._compute(xp, io)
        inputs = p.steps()
        lean = numba_cuda.lean_serves(p)
        if lean:
            present = tuple(name for name in numba_cuda._LEAN_STEPS if name in inputs)
            shapes = numba_cuda._lean_plan(rows, length, io)
            tiles, final = numba_cuda._lean_kernels(io, present, shapes.chunks > 1, bool(p.fill_masked))
            scalars = numba_cuda._scalars(io, (p.gamma, p.lam))
            scratch_shape = numba_cuda._lean_maps_shape(present, shapes) if tiles is not None else None
        else:
            present = tuple(name for name in numba_cuda._ORDER if name in inputs)
            shapes = numba_cuda._plan(rows, length)
            tiles, carrying, final, slots = numba_cuda._forward_kernels(
                "gae", io, present, False, False, bool(p.fill_masked), p.critic_lam is not None, None,
                shapes.long_rows, False)
            scalars = numba_cuda._scalars(io, (p.gamma, p.lam, p.critic_lam, 1.0, 1.0, 1.0))
            scratch_shape = (slots, shapes.tiles) if tiles is not None else None
        geometry = shapes.geometry()

        def described(array):
            view = numba_cuda._steps(xp, array, r.dtype, rows, length)
            descriptor = numba_cuda._descriptor(view)
            return descriptor if descriptor.pointer == array.data_ptr() else None

        descriptors = {name: described(a) for name, a in inputs.items()}
        if any(d is None for d in descriptors.values()):
            return None
        descriptors["bootstrap"] = numba_cuda._descriptor(numba_cuda._per_segment(xp, p.bootstrap, rows, compute))
        descriptors["advantages"] = descriptors["returns"] = _contiguous((rows, length), r.element_size())
        if scratch_shape is not None:
            descriptors["maps"] = descriptors["entering"] = _contiguous(scratch_shape, 8 if io == "float64" else 4)

        def arrays(of):
            return [of("rewards")] + [of(name) if name in present else None for name in numba_cuda._ORDER]

        def bind(kernel, grid, threads, build):
            tags = build(lambda name: name)
            varying = [index for index, tag in enumerate(tags) if isinstance(tag, str)]
            launch = BoundLaunch(numba_cuda._launcher(kernel), build(descriptors.get), varying)
            return launch, grid, threads, tuple(_SOURCES.index(tags[index]) for index in varying)

        def final_arguments(of):
            return numba_cuda.final_arguments(arrays(of), [of("bootstrap"), None], None, scalars, geometry,
                                              of("entering") if shapes.long_rows else None,
                                              [of("advantages"), of("returns")])

        def lean_arguments(of, outputs):
            steps = [of(name) if name in present else None for name in numba_cuda._LEAN_STEPS]
            return (of("rewards"), of("values"), *steps, of("bootstrap"), scalars, geometry,
                    of("maps") if tiles is not None else None, *(of(name) if outputs else None
                                                                for name in ("advantages", "returns")))

        launches = []
        if lean:
            if tiles is not None:
                launches.append(bind(tiles, shapes.grid, shapes.threads, lambda of: lean_arguments(of, False)))
            launches.append(bind(final, shapes.grid, shapes.threads, lambda of: lean_arguments(of, True)))
            return cls(p, scratch_shape, compute, tuple(launches))
        if tiles is not None:
            launches.append(bind(tiles, shapes.grid, shapes.threads, lambda of: numba_cuda.tiles_arguments(
                arrays(of), None, scalars, geometry, of("maps"))))
            launches.append(bind(carrying, shapes.carry_grid, shapes.carry_threads,
                                 lambda of: numba_cuda.carry_arguments(of("maps"), geometry, of("entering"))))
        launches.append(bind(final, shapes.grid, shapes.threads, final_arguments))
        return cls(p, scratch_shape, compute, tuple(launches))

    def __call__(self, rewards, values, gamma, lam, bootstrap_value, next_values, terminated, truncated, mask,
                 critic_lam, views=None):
        """``gae()``'s results for arguments of this plan's key; ``views`` is the key's (None for CUDA tensors)."""
        if bootstrap_value is None:
            bootstrap = self._zeros((self.rows, 1), dtype=self.compute, device=self.device)
        else:  # made as ``prepare`` makes it: its view's layout is the key's, so the first call's block's
            made = _prepare.boundary(self.xp, "bootstrap_value", bootstrap_value, self.batch_shape,
                                     self.bootstrap_dtype, rewards)
            bootstrap = numba_cuda._per_segment(self.xp, made, self.rows, self.compute)
        advantages = self._empty(self.shape, dtype=self.dtype, device=self.device)
        returns = self._empty(self.shape, dtype=self.dtype, device=self.device)
        arrays = (rewards, values, next_values, terminated, truncated, mask, bootstrap, advantages, returns)  # _SOURCES
        if self.scratch_shape is not None:
            arrays += (self._scratch(), self._scratch() if self._entering else None)
        pointer = self._pointer
        with self._context:
            stream = numba_cuda._current_stream(rewards)
            for launch, grid, threads, sources in self.launches:
                launch(self._device_index, stream, grid, threads, [pointer(arrays[i]) for i in sources])
        return advantages, returns

    def _scratch(self):
        """One of the tiles' (or the lean kernels' chunks') maps, (slots, tiles or chunks) in the compute dtype."""
        return self._empty(self.scratch_shape, dtype=self.compute, device=self.device)


def _contiguous(shape: tuple, itemsize: int) -> Descriptor:
    """An array a call allocates (C-contiguous, this shape), as its block describes it: its pointer is the call's."""
    return Descriptor(0, shape, tuple(math.prod(shape[axis + 1:]) * itemsize for axis in range(len(shape))),
                      itemsize)
