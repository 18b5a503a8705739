r"""GAE and the estimators built like it, as fused tile kernels (reverse in time; this module imports numba).

One kernel function serves four *families* and two *phases*; a
``Structure`` says which (and which arrays are present), and is the
kernel's compile-time identity. Per real step t (``g_t = 0 if terminated_t
else gamma_t``, ``c_t = 0 if done_t else gamma_t lam_t``; a masked step is
the identity map; ``Y`` is the value chain, "V at the next real step")::

    gae      delta_t = r_t + g_t Vnext_t - V_t,  A_t = delta_t + c_t A_{t+1};  outputs A_t and A_t + V_t
             (Vnext_t = next_values_t, or Y: map edge = r_t - V_t, on_bootstrap = g_t, value = V_t)
             with ``critic_lam``: a second chain A2 with c2_t = gamma_t critic_lam_t, outputs A_t, A2_t + V_t
    vtrace   rho = exp(log_rhos_t): delta_t = min(rho, clip_rho) (r_t + g_t Vnext_t - V_t),
             c_t = gamma_t lam_t min(rho, clip_c); outputs vs_t = A_t + V_t and
             pg_t = min(rho, clip_pg) (r_t + g_t (Vnext_t + (0 if done_t else A_{t+1})) - V_t)
    lambda   G_t = r_t + g_t V'_t + u (c_t G_{t+1} - g_t lam_t V'_t), u = "a real step follows in the
             segment" (the value chain of a row of ones; without a mask: not the segment's last step)
    returns  G_t = r_t + c_t G_{t+1} (c_t = gamma_t unless done), G after a segment = its bootstrap value

At a segment's last step (a row's end, or a ``cu_seqlens`` offset) the
state is *reset* to the segment's boundary values: the incoming advantage
(``carry``, 0 without), the bootstrap value for Y. Phases:

* ``tiles`` (launch 1 of a long row): the maps of the steps, with the
  boundary marked (``ends``) instead of reset, folded per thread, scanned
  per block; the tile's map is written. With ``summaries`` it also writes
  every segment's summary (``_pieces.FIELDS``) where the segment starts: a
  complete one when the segment ends in the tile, else a partial one that
  launch 2 completes (``open_segment``);
* ``final`` (launch 3, or the only launch of short rows): the same maps with
  the boundaries reset, the block scan again, then every thread rescans its
  steps from the state entering it (from ``entering``, launch 2's maps
  applied to the boundary values of the segment at the tile's far end) and
  writes the outputs.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from ._cuda_import import cuda, types
from ._cuda_kernels import (
    BOUNDARY,
    ITEMS,
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

FAMILIES = ("gae", "vtrace", "lambda", "returns")
#: The per-step arrays a family may read (``next_values`` is lambda's V').
INPUTS = {
    "gae": ("values", "next_values", "gamma", "lam", "critic_lam", "terminated", "truncated", "mask"),
    "vtrace": ("values", "next_values", "gamma", "lam", "log_rhos", "terminated", "truncated", "mask"),
    "lambda": ("next_values", "gamma", "lam", "terminated", "truncated", "mask"),
    "returns": ("gamma", "terminated", "truncated", "mask"),
}
#: Order of the kernels' ``scalars`` argument.
SCALARS = ("gamma", "lam", "critic_lam", "clip_rho", "clip_c", "clip_pg")


class Structure(NamedTuple):
    """What a forward kernel is compiled for (with the io dtype)."""

    family: str
    phase: str  # "tiles" or "final"
    inputs: frozenset  # the per-step arrays present, from INPUTS[family]
    offsets: bool = False
    carry: bool = False  # a per-segment incoming advantage (returns: the bootstrap values)
    entering: bool = False  # final phase of a long row: the maps entering each tile (launch 2)
    summaries: bool = False  # tiles phase: piece summaries (gae only)
    fill: bool = False  # fill_masked (gae only)
    critic: bool = False  # a second chain with critic_lam (gae only; a float or an array)
    value_chain: bool = False  # the value chain is live (see value_chain())

    @property
    def name(self) -> str:
        options = sorted(self.inputs) + [name for name in ("offsets", "carry", "entering", "summaries", "fill",
                                                           "critic") if getattr(self, name)]
        return f"{self.family}_{self.phase}[{','.join(options) or 'plain'}]"

    def fields(self, segmented: bool) -> Fields:
        return Fields(self.value_chain, self.critic, segmented)


def value_chain(family: str, inputs, summaries: bool = False) -> bool:
    """Whether the value chain is live: Vnext from V at the next real step (gae, vtrace without next_values; a
    piece summary always has it), or lambda's "a real step follows" under a mask."""
    if family in ("gae", "vtrace"):
        return summaries or "next_values" not in inputs
    return family == "lambda" and "mask" in inputs


def signature(io: str, s: Structure):
    """The explicit signature of a forward kernel: absent arrays are ``none``."""
    data, flags = array(element_type(io), 2), array("uint8", 2)
    compute = compute_dtype(io)
    floats = ("values", "next_values", "gamma", "lam", "critic_lam", "log_rhos")
    tiles, final = s.phase == "tiles", s.phase == "final"
    map_array = array(compute, 2, "C")
    out = array(element_type(io), 2, "C")
    per_segment = array(compute, 2)
    return types.void(
        data,
        *(optional(name in s.inputs, data) for name in floats),
        *(optional(name in s.inputs, flags) for name in ("terminated", "truncated", "mask")),
        optional(final and s.family in ("gae", "vtrace"), per_segment),  # bootstrap
        optional(final and s.carry, per_segment),
        optional(s.offsets, array("int64", 1)),
        types.UniTuple(getattr(types, compute), len(SCALARS)),
        types.UniTuple(types.int64, 6),
        optional(tiles, map_array),
        optional(final and s.entering, map_array),
        optional(s.summaries, array("int64", 1, "C")),
        optional(s.summaries or final, array(compute, 3, "C") if s.summaries else out),
        optional(final and s.family in ("gae", "vtrace"), out),
    )


def forward_kernel(io: str, s: Structure) -> KernelSpec:
    """Launch 1 (``s.phase == "tiles"``) or 3 (``"final"``) of a forward family, for one io dtype."""
    c = constants(io)
    zero, one, dtype = c.zero, c.one, c.dtype
    tiles = s.phase == "tiles"
    family, fill, critic = s.family, s.fill, s.critic
    value = s.value_chain
    # launch 1 marks the boundaries (a segmented scan); launch 3 resets the state there
    marked = algebra(io, s.fields(segmented=True))
    reset = marked if tiles else algebra(io, s.fields(segmented=False))
    mul0, compose, apply, constant, identity = reset.mul0, reset.compose, reset.apply, reset.constant, reset.identity
    block_scan, exclusive = reset.block_scan, reset.exclusive
    write_map, read_map, write_summary = marked.write, marked.read, marked.write_summary
    apply_marked = marked.apply
    again = exchange(io, again=tiles)
    pad, to_registers, flags_to_shared, from_shared = again
    size_shared = shared_size(compute_dtype(io), marked.count)
    tile_length = THREADS * ITEMS
    is_gae, is_vtrace, is_lambda, is_returns = (family == name for name in FAMILIES)
    has_next = "next_values" in s.inputs

    @cuda.jit(device=True)
    def element(r, v, nv, gam, lm, lmc, log_rho, fl, scalars):
        """The map of one step (before its boundary, if it has one)."""
        if not fl & REAL:
            return identity()
        g = zero if fl & TERMINATED else gam
        cut = (fl & (TERMINATED | TRUNCATED)) != 0
        if is_returns:
            return (r, zero if cut else gam, zero, zero, one, zero, zero, one, zero)
        if is_lambda:
            p = zero if cut else g * lm
            b = r + mul0(g, nv)
            q = zero
            if value:  # u is live: b + u (p A - g lam V')
                q = zero if cut else -mul0(g * lm, nv)
            elif cut or fl & BOUNDARY:  # no real step follows in the trace: G = r + g V'
                p = zero
            else:
                b = r + mul0(g * (one - lm), nv)
            return (b, p, q, zero, one, zero, one, zero, zero)
        scale = one
        c_t = zero if cut else gam * lm
        if is_vtrace:
            rho = math.exp(log_rho)  # at real steps only: a masked step's log-ratio is never read
            scale = min(rho, scalars[3])
            c_t = zero if cut else gam * lm * min(rho, scalars[4])
        b = r - v
        q = scale * g
        if has_next:
            b = (r + mul0(g, nv)) - v
            q = zero
        b = scale * b
        c2 = zero
        if critic:
            c2 = zero if cut else gam * lmc
        return (b, c_t, q, b, c2, q, v, zero, zero)

    def kernel(rewards, values, next_values, gamma, lam, critic_lam, log_rhos, terminated, truncated, mask,
               bootstrap, carry, offsets, scalars, geometry, maps, entering, open_segment, out1, out2):
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
        r_ = cuda.local.array(ITEMS, dtype)
        v_ = cuda.local.array(ITEMS, dtype)
        nv_ = cuda.local.array(ITEMS, dtype)
        g_ = cuda.local.array(ITEMS, dtype)
        l_ = cuda.local.array(ITEMS, dtype)
        lc_ = cuda.local.array(ITEMS, dtype)
        log_rho_ = cuda.local.array(ITEMS, dtype)
        f_ = cuda.local.array(ITEMS, np.uint8)
        s_ = cuda.local.array(ITEMS, np.int64)
        # striped loads through shared memory, blocked reads into registers
        to_registers(r_, shared, rewards, row0, start, steps, geometry, first, count)
        to_registers(v_, shared, values, row0, start, steps, geometry, first, count)
        to_registers(nv_, shared, next_values, row0, start, steps, geometry, first, count)
        to_registers(g_, shared, gamma, row0, start, steps, geometry, first, count)
        to_registers(l_, shared, lam, row0, start, steps, geometry, first, count)
        to_registers(lc_, shared, critic_lam, row0, start, steps, geometry, first, count)
        to_registers(log_rho_, shared, log_rhos, row0, start, steps, geometry, first, count)
        flags_to_shared(bits, terminated, truncated, mask, row0, start, steps, geometry)
        cuda.syncthreads()
        # boundaries (a segment's last step) and the segment of every step, walking from the far end
        segment = np.int64(0)
        previous_row = np.int64(-1)
        for i in range(ITEMS):
            j = ITEMS - 1 - i
            f_[j] = 0
            s_[j] = 0
            if j < count:
                row, t = locate(first + j, row0, start, geometry)
                fl = bits[first + j]
                if t == length - 1:
                    fl |= BOUNDARY
                if offsets is not None:
                    if row != previous_row:
                        segment = segment_of(offsets, t)
                    else:
                        while offsets[segment] > t:
                            segment -= 1
                    if t + 1 == offsets[segment + 1]:
                        fl |= BOUNDARY
                    s_[j] = segment
                previous_row = row
                f_[j] = fl
        # the thread's map, folded from its far end
        folded = identity()
        for i in range(ITEMS):
            j = ITEMS - 1 - i
            if j < count:
                m = element(r_[j], v_[j], nv_[j], g_[j] if gamma is not None else scalars[0],
                            l_[j] if lam is not None else scalars[1], lc_[j] if critic_lam is not None else scalars[2],
                            log_rho_[j], f_[j], scalars)
                if f_[j] & BOUNDARY:
                    if tiles:
                        m = (m[0], m[1], m[2], m[3], m[4], m[5], m[6], m[7], one)
                    else:
                        row, t = locate(first + j, row0, start, geometry)
                        m = compose(m, boundary(bootstrap, carry, row, s_[j]))
                folded = compose(m, folded)
        cuda.syncthreads()
        scanned, buf = block_scan(shared, folded, True)
        before = exclusive(shared, buf, True)
        if tiles:
            if tid == 0:
                write_map(maps, tile, scanned)
            if open_segment is not None:
                # every segment that starts in this tile: its summary, or a partial one the carry kernel completes
                piece = before
                for i in range(ITEMS):
                    j = ITEMS - 1 - i
                    if j < count:
                        m = element(r_[j], v_[j], nv_[j], g_[j] if gamma is not None else scalars[0],
                                    l_[j] if lam is not None else scalars[1], zero, zero, f_[j], scalars)
                        if f_[j] & BOUNDARY:
                            m = (m[0], m[1], m[2], m[3], m[4], m[5], m[6], m[7], one)
                        piece = compose(m, piece)
                        row, t = locate(first + j, row0, start, geometry)
                        begins = t == 0
                        if offsets is not None:
                            begins = t == offsets[s_[j]]
                        if begins:
                            write_summary(out1, row, s_[j], piece)
                            if piece[8] == zero:
                                open_segment[tile] = s_[j]
            return
        # the state entering the tile: launch 2's map applied to the boundary of the segment at its far end
        x, x2, y = zero, zero, zero
        if entering is not None:
            row, t = locate(steps - 1, row0, start, geometry)
            far = segment_of(offsets, t) if offsets is not None else np.int64(0)
            edge = boundary(bootstrap, carry, row, far)
            x, x2, y = apply_marked(read_map(entering, tile), edge[0], edge[3], edge[6])
        x, x2, y = apply(before, x, x2, y)
        cuda.syncthreads()
        # the rescan: outputs into shared memory (blocked), then striped stores
        o2 = cuda.local.array(ITEMS, dtype)
        for i in range(ITEMS):
            j = ITEMS - 1 - i
            o1 = zero
            o2[j] = zero
            if j < count:
                gam = g_[j] if gamma is not None else scalars[0]
                m = element(r_[j], v_[j], nv_[j], gam, l_[j] if lam is not None else scalars[1],
                            lc_[j] if critic_lam is not None else scalars[2], log_rho_[j], f_[j], scalars)
                if f_[j] & BOUNDARY:
                    row, t = locate(first + j, row0, start, geometry)
                    m = compose(m, boundary(bootstrap, carry, row, s_[j]))
                ax, ax2, ay = apply(m, x, x2, y)
                fl = f_[j]
                real = (fl & REAL) != 0
                if is_gae:
                    if real or fill:
                        o1 = ax
                        o2[j] = (ax2 if critic else ax) + v_[j]
                elif is_vtrace:
                    if real:
                        o1 = ax + v_[j]
                        following = nv_[j] if next_values is not None else y
                        if fl & BOUNDARY:
                            row, t = locate(first + j, row0, start, geometry)
                            following = boundary(bootstrap, carry, row, s_[j])[6]
                            if next_values is not None:
                                following = nv_[j]
                        if not fl & (TERMINATED | TRUNCATED) and not fl & BOUNDARY:
                            following += x
                        g = zero if fl & TERMINATED else gam
                        o2[j] = min(math.exp(log_rho_[j]), scalars[5]) * ((r_[j] + mul0(g, following)) - v_[j])
                elif real:
                    o1 = ax
                shared[pad(first + j)] = o1
                x, x2, y = ax, ax2, ay
        cuda.syncthreads()
        from_shared(out1, shared, row0, start, steps, geometry)
        if out2 is not None:
            cuda.syncthreads()
            for j in range(ITEMS):
                if j < count:
                    shared[pad(first + j)] = o2[j]
            cuda.syncthreads()
            from_shared(out2, shared, row0, start, steps, geometry)

    @cuda.jit(device=True)
    def boundary(bootstrap, carry, row, segment):
        """The constant map of what enters after a segment: (carry or 0, bootstrap) (returns: the bootstrap as
        the incoming return)."""
        x = zero
        if carry is not None:
            x = carry[row, segment]
        y = zero
        if bootstrap is not None:
            y = bootstrap[row, segment]
        return constant(x, zero, y)

    return KernelSpec(s.name, kernel, signature(io, s), tile_bounds(io, s.critic))
