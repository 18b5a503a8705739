r"""Forward-in-time tile kernels: the adjoint of GAE and the forward scan (this module imports numba).

**The adjoint of GAE.** ``A_t = delta_t + c_t A_{t+1}`` is linear, so with
upstream gradients G_t (``grad_advantages + grad_returns`` where the step's
outputs are kept: a real step, or any step with ``fill_masked``) the
gradient reaching A_t is ``lambda_t = G_t + mu_t``, ``mu_{t+1} = c_t
lambda_t``: a forward scan with the same coefficients, cut at the same
places (a segment's first step receives nothing from the segment before).
With ``g_t = 0 if terminated_t else gamma_t``, at a real step::

    d rewards_t     = lambda_t
    d values_t      = -lambda_t + omega_t (+ grad_returns_t)
    d next_values_t = g_t lambda_t                       (when next_values is given)

where ``omega_t`` is the gradient of "V at the next real step" pending for
this step's V: ``omega`` leaves a real step as ``g_t lambda_t`` and passes a
masked one unchanged. Per segment, what leaves its last step is the
gradient of its boundary values: ``omega`` for ``bootstrap``, ``mu`` for
``carry``. In maps (``_cuda_kernels``): X = omega (edge = g_t G_t, product =
0, on_bootstrap = g_t) and Y = mu (value = c_t G_t, on_value = c_t) at a real
step; at a masked one omega passes (product 1) and mu takes G_t (value G_t,
on_value 1). With ``next_values`` omega is not needed and X = mu
(edge = c_t G_t, product = c_t). Gradients to per-step gamma or lam are not
computed here (the caller takes the generic path for them).

**The forward scan** ``y_t = x_t + a_t y_{t-1}``: edge = x_t, product = a_t.

Phases as in ``_cuda_gae``: ``tiles`` writes the tiles' maps (boundaries
marked), ``final`` rescans from the state entering each tile (0 at every
segment's first step).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from ._cuda_import import cuda, types
from ._cuda_kernels import (
    BOUNDARY,
    ITEMS,
    LAST,
    REAL,
    TERMINATED,
    TRUNCATED,
    Fields,
    KernelSpec,
    algebra,
    array,
    compute_dtype,
    constants,
    element_type,
    exchange,
    locate,
    optional,
    segment_of,
    shared_size,
    tile_bounds,
    tile_id,
    tile_place,
)
from ._cuda_plan import THREADS

FAMILIES = ("adjoint", "scan")
INPUTS = {
    "adjoint": ("grad_advantages", "grad_returns", "gamma", "lam", "terminated", "truncated", "mask"),
    "scan": ("coefficient",),
}


class Structure(NamedTuple):
    """What a forward-in-time kernel is compiled for (with the io dtype)."""

    family: str
    phase: str  # "tiles" or "final"
    inputs: frozenset
    offsets: bool = False
    entering: bool = False
    fill: bool = False
    next_values: bool = False  # adjoint: next_values was given (its gradient is an output; no omega chain)
    carry: bool = False  # adjoint: the problem had a carry (its gradient is an output)

    @property
    def name(self) -> str:
        options = sorted(self.inputs) + [name for name in ("offsets", "entering", "fill", "next_values", "carry")
                                         if getattr(self, name)]
        return f"{self.family}_{self.phase}[{','.join(options) or 'plain'}]"

    @property
    def value_chain(self) -> bool:
        return self.family == "adjoint" and not self.next_values

    def fields(self, segmented: bool) -> Fields:
        return Fields(self.value_chain, False, segmented)


def signature(io: str, s: Structure):
    data, flags = array(element_type(io), 2), array("uint8", 2)
    compute = compute_dtype(io)
    tiles, final = s.phase == "tiles", s.phase == "final"
    adjoint = s.family == "adjoint"
    out, per_segment = array(element_type(io), 2, "C"), array(compute, 2, "C")
    return types.void(
        optional("grad_advantages" in s.inputs or not adjoint, data),  # the scan's x
        optional("grad_returns" in s.inputs, data),
        optional("gamma" in s.inputs or "coefficient" in s.inputs, data),
        optional("lam" in s.inputs, data),
        *(optional(name in s.inputs, flags) for name in ("terminated", "truncated", "mask")),
        optional(s.offsets, array("int64", 1)),
        types.UniTuple(getattr(types, compute), 2),
        types.UniTuple(types.int64, 6),
        optional(tiles, array(compute, 2, "C")),
        optional(final and s.entering, array(compute, 2, "C")),
        optional(final, out),
        optional(final and adjoint, out),
        optional(final and s.next_values, out),
        optional(final and adjoint and not s.next_values, per_segment),
        optional(final and s.carry, per_segment),
    )


def forward_kernel(io: str, s: Structure) -> KernelSpec:
    """Launch 1 (``s.phase == "tiles"``) or 3 (``"final"``) of the adjoint or the forward scan."""
    c = constants(io)
    zero, one, dtype = c.zero, c.one, c.dtype
    tiles = s.phase == "tiles"
    adjoint, fill, value = s.family == "adjoint", s.fill, s.value_chain
    marked = algebra(io, s.fields(segmented=True))
    reset = marked if tiles else algebra(io, s.fields(segmented=False))
    mul0, compose, apply, constant, identity = reset.mul0, reset.compose, reset.apply, reset.constant, reset.identity
    block_scan, exclusive = reset.block_scan, reset.exclusive
    write_map, read_map, apply_marked = marked.write, marked.read, marked.apply
    pad, to_registers, flags_to_shared, from_shared = exchange(io, again=tiles)
    size_shared = shared_size(compute_dtype(io), marked.count)
    tile_length = THREADS * ITEMS

    @cuda.jit(device=True)
    def element(x, gr, gam, lm, fl):
        """The map of one step (before the reset at its segment's first step, if it is one)."""
        if not adjoint:
            return (x, gam, zero, zero, one, zero, zero, one, zero)
        real = (fl & REAL) != 0
        upstream = x + gr if real or fill else zero
        if not real:
            if value:
                return (zero, one, zero, zero, one, zero, upstream, one, zero)
            return (upstream, one, zero, zero, one, zero, zero, one, zero)
        g = zero if fl & TERMINATED else gam
        c_t = zero if fl & (TERMINATED | TRUNCATED) else gam * lm
        if value:
            return (mul0(g, upstream), zero, g, zero, one, zero, mul0(c_t, upstream), c_t, zero)
        return (mul0(c_t, upstream), c_t, zero, zero, one, zero, zero, one, zero)

    def kernel(grad_advantages, grad_returns, gamma, lam, terminated, truncated, mask, offsets, scalars, geometry,
               maps, entering, out_rewards, out_values, out_next_values, out_bootstrap, out_carry):
        tile = tile_id()
        if tile >= geometry[5]:
            return
        row0, start, steps = tile_place(geometry, tile)
        length = geometry[1]
        tid = cuda.threadIdx.x
        first = tid * ITEMS
        count = min(ITEMS, steps - first)
        shared = cuda.shared.array(size_shared, dtype)
        bits = cuda.shared.array(tile_length, np.uint8)
        x_ = cuda.local.array(ITEMS, dtype)
        gr_ = cuda.local.array(ITEMS, dtype)
        g_ = cuda.local.array(ITEMS, dtype)
        l_ = cuda.local.array(ITEMS, dtype)
        f_ = cuda.local.array(ITEMS, np.uint8)
        s_ = cuda.local.array(ITEMS, np.int64)
        to_registers(x_, shared, grad_advantages, row0, start, steps, geometry, first, count)
        to_registers(gr_, shared, grad_returns, row0, start, steps, geometry, first, count)
        to_registers(g_, shared, gamma, row0, start, steps, geometry, first, count)
        to_registers(l_, shared, lam, row0, start, steps, geometry, first, count)
        flags_to_shared(bits, terminated, truncated, mask, row0, start, steps, geometry)
        cuda.syncthreads()
        # a segment's first step (BOUNDARY) and last step (LAST), walking from the far end (the first step)
        segment = np.int64(0)
        previous_row = np.int64(-1)
        for j in range(ITEMS):
            f_[j] = 0
            s_[j] = 0
            if j < count:
                row, t = locate(first + j, row0, start, geometry)
                fl = bits[first + j]
                if t == 0:
                    fl |= BOUNDARY
                if t == length - 1:
                    fl |= LAST
                if offsets is not None:
                    if row != previous_row:
                        segment = segment_of(offsets, t)
                    else:
                        while offsets[segment + 1] <= t:
                            segment += 1
                    if t == offsets[segment]:
                        fl |= BOUNDARY
                    if t + 1 == offsets[segment + 1]:
                        fl |= LAST
                    s_[j] = segment
                previous_row = row
                f_[j] = fl
        folded = identity()
        for j in range(ITEMS):
            if j < count:
                m = element(x_[j], gr_[j], g_[j] if gamma is not None else scalars[0],
                            l_[j] if lam is not None else scalars[1], f_[j])
                if f_[j] & BOUNDARY:
                    if tiles:
                        m = (m[0], m[1], m[2], m[3], m[4], m[5], m[6], m[7], one)
                    else:
                        m = compose(m, constant(zero, zero, zero))
                folded = compose(m, folded)
        cuda.syncthreads()
        scanned, buf = block_scan(shared, folded, False)
        before = exclusive(shared, buf, False)
        if tiles:
            if tid == cuda.blockDim.x - 1:
                write_map(maps, tile, scanned)
            return
        x, x2, y = zero, zero, zero
        if entering is not None:
            x, x2, y = apply_marked(read_map(entering, tile), zero, zero, zero)
        x, x2, y = apply(before, x, x2, y)
        cuda.syncthreads()
        o2 = cuda.local.array(ITEMS, dtype)
        o3 = cuda.local.array(ITEMS, dtype)
        for j in range(ITEMS):
            o2[j] = zero
            o3[j] = zero
            if j < count:
                gam = g_[j] if gamma is not None else scalars[0]
                fl = f_[j]
                m = element(x_[j], gr_[j], gam, l_[j] if lam is not None else scalars[1], fl)
                if fl & BOUNDARY:
                    m = compose(m, constant(zero, zero, zero))
                    x, x2, y = zero, zero, zero
                ax, ax2, ay = apply(m, x, x2, y)
                o1 = ax
                if adjoint:
                    o1 = zero
                    if fl & REAL:
                        mu = y if value else x
                        gradient = x_[j] + gr_[j] + mu
                        o1 = gradient
                        o2[j] = -gradient + gr_[j] + (x if value else zero)
                        o3[j] = mul0(zero if fl & TERMINATED else gam, gradient)
                    elif fill:
                        o2[j] = gr_[j]
                    if fl & LAST:
                        row, t = locate(first + j, row0, start, geometry)
                        if out_bootstrap is not None:
                            out_bootstrap[row, s_[j]] = ax
                        if out_carry is not None:
                            out_carry[row, s_[j]] = ay if value else ax
                shared[pad(first + j)] = o1
                x, x2, y = ax, ax2, ay
        cuda.syncthreads()
        from_shared(out_rewards, shared, row0, start, steps, geometry)
        if out_values is not None:
            cuda.syncthreads()
            for j in range(ITEMS):
                if j < count:
                    shared[pad(first + j)] = o2[j]
            cuda.syncthreads()
            from_shared(out_values, shared, row0, start, steps, geometry)
        if out_next_values is not None:
            cuda.syncthreads()
            for j in range(ITEMS):
                if j < count:
                    shared[pad(first + j)] = o3[j]
            cuda.syncthreads()
            from_shared(out_next_values, shared, row0, start, steps, geometry)

    return KernelSpec(s.name, kernel, signature(io, s), tile_bounds(io))
