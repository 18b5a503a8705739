"""The numba-CUDA kernels' plan: a repeated ``gae()`` call of one layout, launched from argument blocks packed once.

``NumbaCUDABackend.make_plan`` makes a ``CudaPlan`` from a call that went
through every check of ``gae_xp._prepare`` and that these kernels solved,
where ``gae_xp._plans.BoundLayoutPlan`` could serve it too (the problem's
per-step arrays are the caller's own, the coefficients Python numbers, no
packed sequences, no carry, no tensor that requires grad), its results need
no cast, and the kernels read the caller's arrays where they lie (the
(rows, T) views of ``numba_cuda._steps``, no copy). The plan holds what
``numba_cuda._launch_forward`` works out on every call from the layout alone:
the kernels, the launch geometry, and each launch's argument block
(``_cuda_launch.BoundLaunch``), packed once with the first call's shapes,
strides and scalars. A later call of the key (``gae_xp._plans`` says what it
holds: an array's dtype, shape, strides and device, the coefficients'
values) allocates its outputs (and, for rows longer than a tile, the tiles'
maps: nothing the plan holds lives on the device, so a captured CUDA graph
owns every buffer it reads), makes its bootstrap values as ``prepare`` does,
writes each array's data pointer into the blocks and launches. Per array
only the pointer changes between calls of one key; the rest of its
parameters are the key's.

Not made under the simulator or with ``GAE_XP_CUDA_LAUNCH=numba`` (numba's
own launch takes arrays, not pointers): ``BoundLayoutPlan`` serves those.
"""

from __future__ import annotations

import math

from gae_xp import _plans, _prepare
from gae_xp._compat import is_torch_array
from gae_xp._problem import COEFFICIENTS, PER_STEP

from . import numba_cuda
from ._cuda_launch import BoundLaunch

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
            or not is_torch_array(p.rewards)):
        return None
    bound = _plans.BoundLayoutPlan.of(call, numba_cuda.BACKEND, arguments)
    return None if bound is None else CudaPlan.of(p, bound)


class CudaPlan:
    """One layout's ``gae()`` call on the numba-CUDA kernels; ``plan(...)`` is ``gae()`` on arguments of that key.

    ``launches``: per launch, its ``BoundLaunch``, its grid and block size, and the positions in ``_SOURCES`` of
    the arrays whose pointers it takes, in its ``varying`` order. ``bound``, the ``BoundLayoutPlan`` of the same
    call, serves a call whose bootstrap values' view the blocks do not describe (an array ``bootstrap_value``
    whose broadcast gives the view other strides than the first call's).
    """

    def __init__(self, p, bound, scratch_shape, compute):
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
        self.launches = ()
        self.bound = bound
        #: the tiles' maps of a row longer than a tile (None: rows that fit one)
        self.scratch_shape = scratch_shape
        self._empty, self._zeros, self._pointer = torch.empty, torch.zeros, torch.Tensor.data_ptr
        #: the shape and strides (bytes) the bootstrap values' view had in the first call
        self._bootstrap_layout = None
        #: the device's context, made current around the launches, as ``numba_cuda._Launch`` does
        self._device_index = numba_cuda._device_index(r)
        self._context = cuda.gpus[self._device_index]

    @classmethod
    def of(cls, p, bound):
        """The plan of a prepared problem whose arrays are the caller's, or None where the kernels would read a copy
        of one of them (its batch axes do not merge into one stride)."""
        xp, r = p.xp, p.rewards
        length = r.shape[-1]
        rows = math.prod(r.shape[:-1])
        if length == 0 or rows == 0:
            return None
        io = numba_cuda._dtype_name(r.dtype)
        compute = numba_cuda._compute(xp, io)
        inputs = p.steps()
        present = tuple(name for name in numba_cuda._ORDER if name in inputs)
        shapes = numba_cuda._plan(rows, length)
        tiles, carrying, final, slots = numba_cuda._forward_kernels(
            "gae", io, present, False, False, bool(p.fill_masked), p.critic_lam is not None, None,
            shapes.long_rows, False)
        scalars = numba_cuda._scalars(io, (p.gamma, p.lam, p.critic_lam, 1.0, 1.0, 1.0))
        geometry = shapes.geometry()

        def described(array):
            view = numba_cuda._steps(xp, array, r.dtype, rows, length)
            descriptor = numba_cuda._descriptor(view)
            return descriptor if descriptor.pointer == array.data_ptr() else None

        descriptors = {name: described(a) for name, a in inputs.items()}
        if any(d is None for d in descriptors.values()):
            return None
        plan = cls(p, bound, (slots, shapes.tiles) if tiles is not None else None, compute)
        descriptors["bootstrap"] = numba_cuda._descriptor(numba_cuda._per_segment(xp, p.bootstrap, rows, compute))
        output = numba_cuda._descriptor(numba_cuda._steps(xp, plan._empty(plan.shape, dtype=r.dtype, device=r.device),
                                                          r.dtype, rows, length))
        descriptors["advantages"] = descriptors["returns"] = output
        if tiles is not None:
            descriptors["maps"] = descriptors["entering"] = numba_cuda._descriptor(plan._scratch())
        plan._bootstrap_layout = (descriptors["bootstrap"].shape, descriptors["bootstrap"].strides)

        def arrays(of):
            return [of("rewards")] + [of(name) if name in present else None for name in numba_cuda._ORDER]

        def bind(kernel, grid, threads, build):
            arguments = build(descriptors.get)
            tags = build(lambda name: name)
            varying = [index for index, tag in enumerate(tags) if isinstance(tag, str)]
            bound = BoundLaunch(numba_cuda._launcher(kernel), arguments, varying)
            return bound, grid, threads, tuple(_SOURCES.index(tags[index]) for index in varying)

        def final_arguments(of):
            return numba_cuda.final_arguments(arrays(of), [of("bootstrap"), None], None, scalars, geometry,
                                              of("entering") if shapes.long_rows else None,
                                              [of("advantages"), of("returns")])

        launches = []
        if tiles is not None:
            launches.append(bind(tiles, shapes.grid, shapes.threads, lambda of: numba_cuda.tiles_arguments(
                arrays(of), None, scalars, geometry, of("maps"))))
            launches.append(bind(carrying, shapes.carry_grid, shapes.carry_threads,
                                 lambda of: numba_cuda.carry_arguments(of("maps"), geometry, of("entering"))))
        launches.append(bind(final, shapes.grid, shapes.threads, final_arguments))
        plan.launches = tuple(launches)
        return plan

    def __call__(self, rewards, values, gamma, lam, bootstrap_value, next_values, terminated, truncated, mask,
                 critic_lam, views=None):
        """``gae()``'s results for arguments of this plan's key; ``views`` is the key's (None for CUDA tensors)."""
        bootstrap = self._zero_bootstrap() if bootstrap_value is None else self._bootstrap(bootstrap_value, rewards)
        if bootstrap is None:  # a view the first call's blocks do not describe: the backend's own launch
            return self.bound(rewards, values, gamma, lam, bootstrap_value, next_values, terminated, truncated, mask,
                              critic_lam, views)
        advantages = self._empty(self.shape, dtype=self.dtype, device=self.device)
        returns = self._empty(self.shape, dtype=self.dtype, device=self.device)
        arrays = (rewards, values, next_values, terminated, truncated, mask, bootstrap, advantages, returns)  # _SOURCES
        if self.scratch_shape is not None:
            arrays += (self._scratch(), self._scratch())
        pointer = self._pointer
        with self._context:
            stream = numba_cuda._current_stream(rewards)
            for bound, grid, threads, sources in self.launches:
                bound(self._device_index, stream, grid, threads, [pointer(arrays[i]) for i in sources])
        return advantages, returns

    def _zero_bootstrap(self):
        """A bootstrap value of 0 per row, as the kernels read it: (rows, 1) in the compute dtype (made per call, on
        the caller's stream: memory a plan kept could be freed under a CUDA graph that captured it)."""
        return self._zeros((self.rows, 1), dtype=self.compute, device=self.device)

    def _scratch(self):
        """One of the tiles' maps of a row longer than a tile: (slots, tiles) in the compute dtype."""
        return self._empty(self.scratch_shape, dtype=self.compute, device=self.device)

    def _bootstrap(self, value, like):
        """The bootstrap values made as ``prepare`` makes them, in the (rows, n) view the kernels read; None when
        that view's layout is not the one the first call's argument block holds."""
        made = _prepare.boundary(self.xp, "bootstrap_value", value, self.batch_shape, self.bootstrap_dtype, like)
        view = numba_cuda._per_segment(self.xp, made, self.rows, self.compute)
        descriptor = numba_cuda._descriptor(view)
        if (descriptor.shape, descriptor.strides) != self._bootstrap_layout:
            return None
        return view

