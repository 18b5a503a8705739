r"""GAE's common structures as lean numba-CUDA kernels: a row streamed right to left, a two-number state.

The structures served (``numba_cuda.lean_serves``): a constant or per-step/per-row gamma
and lam, a bootstrap value per row, ``terminated``, ``truncated``,
``next_values``, a mask, with or without ``fill_masked``; no packed offsets,
``critic_lam``, carry or pieces (the general kernels of ``_cuda_gae`` keep
those). Per step, reverse in
time (``g_t = 0 if terminated_t else gamma_t``, ``c_t = 0 if terminated_t or
truncated_t else gamma_t lam_t``)::

    delta_t = (r_t - V_t) + g_t Vnext_t        (Vnext_t = V_{t+1}, the row's bootstrap value after its last step)
    delta_t = (r_t + g_t Vnext_t) - V_t        (Vnext_t = next_values_t)
    A_t     = delta_t + c_t A_{t+1},  A_T = 0;  outputs A_t and A_t + V_t

A masked step is skipped (the identity map; outputs 0, or with
``fill_masked`` the advantage passing through it and that plus its own V), and without
``next_values`` Vnext_t is V at the next real step: a value chain scanned
before the advantage, each thread's leftmost real value composed "the first
known, near before far", carried from tile to tile like the advantage. Its
scan runs only in a tile where a thread holding steps of it holds no real
one (a run of masked steps as long as a thread's steps, or a partial tile's
last thread holding only masked steps): elsewhere each thread's own leftmost
real value is already its composite, and the block knows it from a vote at
the scan's first barrier (``syncthreads_or``). The vote is the block's: with
short rows (several a block), one row's run makes every group scan.

A run of steps acts on the advantage entering it from the right by the
affine map ``x -> d + c x``: the state is two numbers (coefficient, delta).
Composition, near after far: ``(c_n c_f, d_n + c_n d_f)``, with the product
``c_n d_f`` exactly 0 when ``c_n`` is (``_cuda_kernels.products``' ``scale0``:
nothing, NaN and inf included, crosses a cut) and products of coefficients
that keep an underflow of non-zero factors at the smallest subnormal
(``times``: only a true zero cuts). The advantage's maps and the value
chain's are scanned by one Hillis-Steele device function (``group_scan``),
each with its composition.

**One block streams a row.** A *group* of threads (the whole block, or a
power-of-two part of it when rows are short: several rows per block) owns a
row, or a *chunk* of it when too few rows fill the GPU, and walks it from
its last *tile* (``group x items`` steps) to its first. Per tile: striped
loads (thread ``k`` of the group reads steps ``i group + k``: a warp's load
reads consecutive steps) into shared memory; each thread folds its
``items`` consecutive steps (``_cuda_plan.lean_items``; V_{t+1} read from
the neighbouring slot, the tile's last step reads the value carried from the
tile to its right) into a map; a Hillis-Steele scan in shared memory (``log2(group)`` steps, a barrier
each; no warp intrinsics, so numba's simulator runs the same code) composes
the threads' maps from the right; every thread rescans its steps from the
advantage entering it and writes A and A + V back to shared memory; striped
stores. The advantage and the value at the tile's first step are the carry
into the next tile, held in registers.

**Chunks.** A row cut into chunks is two launches: ``maps`` writes each
chunk's map ``(c, d)`` (its steps folded, no output), ``final`` starts each
chunk from the maps of the chunks to its right composed in registers (a few
per row) applied to 0 (and to the bootstrap value), then streams as above.
The inputs are read twice and the outputs written once: 1.5x the floor
bytes of the plain case. With the value chain, the value entering a chunk
from the right (V at the next real step after it) is unknown to ``maps``:
only the chunk's last real step t* reads it, so that step is kept apart
(``r - V``, c, g) and the others folded into (P, D); the chunk's map is
``x, Y -> (D + P (r - V)) + P c x + P g Y`` (``c, d, q``) with Y's own map,
the chunk's first real value or Y itself (``known, value``): five numbers
(``_cuda_plan.lean_map_rows``).

Kernels are built by ``lean_kernel`` as ``KernelSpec`` (explicit signature,
absent arrays typed ``none`` and pruned at compile time) and launched by
``numba_cuda._lean`` through the backend's driver launch (``_cuda_launch``);
``_cuda_plan.lean_plan`` sizes the groups, chunks and grid of a call (pure
arithmetic, no numba needed).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from ._cuda_import import cuda, types
from ._cuda_kernels import (
    KernelSpec,
    array,
    compute_dtype,
    constants,
    conversions,
    element_type,
    optional,
    pad_shift,
    products,
    tile_id,
)
from ._cuda_plan import LEAN_THREADS as THREADS
from ._cuda_plan import SIMULATED, lean_items

#: The per-step arrays a lean kernel may read besides rewards and values, in argument order.
OPTIONAL_STEPS = ("next_values", "gamma", "lam", "terminated", "truncated", "mask")
#: A tile's first step masked with this plus an in-tile index below 2**32 is provably >= 0 to the compiler, which
#: then drops the negative-index wrap-around that numba's cache-hint loads and stores (``cuda.ldcs``, ``cuda.stcs``)
#: put in every address (no array has 2**62 elements: the mask changes no index).
INDEX_BITS = np.uint64(2**62 - 1)
#: Bits of a step's flag byte.
TERMINATED, TRUNCATED, MASKED = 1, 2, 4
#: Launch bounds: at least this many blocks of LEAN_THREADS per SM, float32 compute (at most 128 registers a thread:
#: with fewer, the branch-free fold of a tile spills) and float64 (at most 168: its mask spilled on sm_80 under 128).
BLOCKS_PER_SM = (4, 3)


class LeanStructure(NamedTuple):
    """What a lean kernel is compiled for (with the io dtype): its optional per-step arrays and its phase."""

    inputs: frozenset  # from OPTIONAL_STEPS
    phase: str = "final"  # "maps" (a chunk's map, launch 1 of chunked rows) or "final"
    chunked: bool = False  # final phase: start each chunk from the maps of the chunks to its right
    fill: bool = False  # final phase with a mask: fill_masked (a masked step shows the advantage passing through)

    @property
    def name(self) -> str:
        options = sorted(self.inputs) + [name for name in ("chunked", "fill") if getattr(self, name)]
        return f"lean_{self.phase}[{','.join(options) or 'plain'}]"

    @property
    def value_chain(self) -> bool:
        """Vnext is V at the next real step (a mask without next_values): a scan of its own."""
        return "mask" in self.inputs and "next_values" not in self.inputs


# --- global loads and stores of a row (a 1-D view: one index, one stride) ----------------------------------------

if SIMULATED:
    @cuda.jit(device=True)
    def load_once(a, t):
        return a[t]

    load_again = load_once

    @cuda.jit(device=True)
    def store_once(a, t, value):
        a[t] = value
else:
    @cuda.jit(device=True)
    def load_once(a, t):
        """A last read: streaming, evict first (ld.global.cs)."""
        return cuda.ldcs(a, t)

    @cuda.jit(device=True)
    def load_again(a, t):
        """A read the final launch repeats, or of a coefficient other rows may share: cached in L2 (ld.global.cg)."""
        return cuda.ldcg(a, t)

    @cuda.jit(device=True)
    def store_once(a, t, value):
        """An output: streaming store (st.global.cs)."""
        cuda.stcs(a, t, value)


def signature(io: str, s: LeanStructure):
    """The explicit signature of a lean kernel: absent arrays are ``none``."""
    data, flags = array(element_type(io), 2), array("uint8", 2)
    compute = compute_dtype(io)
    final = s.phase == "final"
    out = array(element_type(io), 2, "C")
    floats = ("next_values", "gamma", "lam")
    return types.void(
        data, data,
        *(optional(name in s.inputs, data) for name in floats),
        *(optional(name in s.inputs, flags) for name in ("terminated", "truncated", "mask")),
        array(compute, 2),  # bootstrap, (rows, 1)
        types.UniTuple(getattr(types, compute), 2),
        types.UniTuple(types.int64, 5),
        optional(not final or s.chunked, array(compute, 2, "C")),  # maps, (2, rows * chunks)
        optional(final, out), optional(final, out),
    )


def lean_kernel(io: str, s: LeanStructure, *, rare_paths: bool = True):
    """A lean kernel (see the module docstring) for one io dtype, as ``_cuda_kernels.KernelSpec``.

    ``rare_paths`` False compiles it without what only a tile with a thread whose steps are all masked runs (the
    value chain's scan, ``group_scan``'s ``voted``): only the instruction counts do that (``tools.cost_model``), to
    count the path of every other tile (of the benchmark's all-real masks, and of all but runs of masked steps)."""
    c = constants(io)
    zero, one, dtype = c.zero, c.one, c.dtype
    scale0, times = products(io).scale0, products(io).times
    to_compute, to_io = conversions(io)
    items = lean_items(io)  # steps per thread in a tile: a compile-time constant of the kernel
    if items & (items - 1):
        raise ValueError(f"the lean kernels shift by log2 of their steps per thread: {items} is no power of two")
    final = s.phase == "final"
    chunked = s.chunked
    one_chunk = final and not chunked  # a row is one chunk (the plan's chunks is 1)
    load = load_once if final else load_again  # the maps launch reads what the final launch reads again
    has_next = "next_values" in s.inputs
    has_mask = "mask" in s.inputs
    zero_masked = has_mask and not s.fill  # a masked step's outputs are 0 (else the advantage passing through)
    has_flags = has_mask or "terminated" in s.inputs or "truncated" in s.inputs
    value_chain = s.value_chain  # Vnext = V at the next real step: a scan of its own
    neighbour = not has_mask and not has_next  # Vnext = V_{t+1}: the neighbouring slot
    open_chain = value_chain and not final  # a chunk's map: the value entering it from the right is unknown
    shift = pad_shift(compute_dtype(io))
    tile_size = THREADS * items
    # a group's slots: its tile's steps, then the value after them (groups never share a slot)
    slots = tile_size + THREADS
    padded = slots + (slots >> shift) + 1
    scan_size = 2 * THREADS  # the block scan's two buffers
    # an array the structure lacks gets one unused slot
    coefficient_size = padded if final and not (s.inputs & {"next_values", "gamma", "lam"}) else 1
    next_size = padded if has_next else 1
    gamma_size = padded if "gamma" in s.inputs else 1
    lam_size = padded if "lam" in s.inputs else 1
    flags_size = slots if has_flags else 1
    last_size = 3 * THREADS if open_chain else 1  # per group: the chunk's last real step (r - V, c, g)

    # in-tile indices are unsigned: no sign fix-ups in shifts, no negative-index wrap-around in shared arrays
    u_zero, u_one, u_two, u_three, u_items, u_threads, u_shift, u_item_bits = (
        np.uint64(n) for n in (0, 1, 2, 3, items, THREADS, shift, items.bit_length() - 1))

    @cuda.jit(device=True)
    def pad(i):
        """The shared slot of a tile's i-th step (unsigned): blocked reads of items consecutive steps hit distinct
        banks."""
        return i + (i >> u_shift)

    if one_chunk or not value_chain:
        @cuda.jit(device=True)
        def step(start, i):
            """The index of a tile's i-th step (``i`` < 2**32), provably >= 0 to the compiler (``INDEX_BITS``)."""
            return (np.uint64(start) & INDEX_BITS) + np.uint64(np.uint32(i))
    else:
        @cuda.jit(device=True)
        def step(start, i):
            """The index of a tile's i-th step, wrap-around kept: with the value chain, the launches of chunked rows
            are at the register bound, and rematerialise these addresses where the cheaper ones spill."""
            return np.uint64(start) + i

    @cuda.jit(device=True)
    def compose(near_c, near_d, far_c, far_d):
        """The affine maps of two runs, near after far."""
        return times(near_c, far_c), near_d + scale0(near_c, far_d)

    @cuda.jit(device=True)
    def compose_at(near_c, near_d, s_c, s_d, far):
        """``compose`` with the far map in shared memory at ``far``."""
        return compose(near_c, near_d, s_c[far], s_d[far])

    @cuda.jit(device=True)
    def first_known_at(near_known, near_value, s_known, s_value, far):
        """The value chain's maps, near before far (in shared memory at ``far``): the nearest known value (known
        1); the far one is read only when the near one is unknown."""
        if near_known != zero:
            return near_known, near_value
        return s_known[far], s_value[far]

    def group_scan(combine, voted=False):
        """A Hillis-Steele scan of a group's per-thread pairs from the right (double-buffered in shared memory, a
        barrier per step; the simulator runs it), ``combine(near pair, the two buffers, far index)`` composing two;
        it returns the buffer holding each thread's composite. ``voted``: its first barrier is a vote of the block
        on ``needed``, and where no thread needs the scan it composes nothing (each pair is its thread's composite
        already: the value chain's, where every thread holding steps of the tile holds a real one)."""
        @cuda.jit(device=True)
        def scan(s_a, s_b, a, b, tid, lt, group, needed):
            s_a[tid] = a
            s_b[tid] = b
            span = group
            if not voted:
                cuda.syncthreads()
            elif not rare_paths:  # the instruction counts: a tile that needs no scan
                cuda.syncthreads()
                span = u_one
            elif cuda.syncthreads_or(np.int32(1 if needed else 0)) == 0:
                span = u_one
            buf = u_zero
            step = u_one
            while step < span:
                if lt + step < group:
                    partner = buf * u_threads + tid + step
                    a, b = combine(a, b, s_a, s_b, partner)
                buf = u_one - buf
                s_a[buf * u_threads + tid] = a
                s_b[buf * u_threads + tid] = b
                cuda.syncthreads()
                step = step * u_two
            return buf

        return scan

    scan_maps, scan_values = group_scan(compose_at), group_scan(first_known_at, voted=True)

    def kernel(rewards, values, next_values, gamma, lam, terminated, truncated, mask, bootstrap, scalars, geometry,
               maps, advantages, returns):
        rows, length, chunks, chunk_steps, group_bits = geometry
        # powers of two: the group's place and size by shifts and masks, not divisions
        group_shift = np.uint64(group_bits)
        tid = np.uint64(cuda.threadIdx.x)
        group = u_one << group_shift
        g = tid >> group_shift
        lt = tid & (group - u_one)  # this thread's place in its group
        lead = g << group_shift  # the group's first thread
        base = lead * u_items + g  # the group's first shared slot (one more per group: the value after its tile)
        first = base + lt * u_items  # this thread's first shared slot
        work = tile_id() * np.int64(u_threads >> group_shift) + np.int64(g)
        if one_chunk:  # a row is one chunk: no division
            row, chunk = work, np.int64(0)
        else:
            row = work // chunks
            chunk = work - row * chunks
        live = row < rows
        lo = chunk * chunk_steps
        hi = min(lo + chunk_steps, length)
        if not live:
            lo, hi = np.int64(0), np.int64(0)
        # the row whose views the group takes (an idle group never reads them), unsigned: its views skip numba's
        # negative-index wrap-around, as the steps' indices do (``INDEX_BITS``)
        at = np.uint64(min(row, rows - 1))
        tile = np.int64(group * u_items)
        # the same for every group of a block: barriers match
        tiles = np.int64((np.uint64(chunk_steps) + np.uint64(tile - 1)) >> (group_shift + u_item_bits))
        s_r = cuda.shared.array(padded, dtype)
        s_v = cuda.shared.array(padded, dtype)
        s_n = cuda.shared.array(next_size, dtype)
        s_g = cuda.shared.array(gamma_size, dtype)
        s_l = cuda.shared.array(lam_size, dtype)
        # each step's coefficient, in a slot its own thread has read already where there is one
        if has_next:
            s_k = s_n
        elif gamma is not None:
            s_k = s_g
        elif lam is not None:
            s_k = s_l
        else:
            s_k = cuda.shared.array(coefficient_size, dtype)
        s_f = cuda.shared.array(flags_size, np.uint8)
        s_c = cuda.shared.array(scan_size, dtype)
        s_d = cuda.shared.array(scan_size, dtype)
        s_last = cuda.shared.array(last_size, dtype)
        gam, lm = scalars[0], scalars[1]
        # the state entering the chunk from the right: the advantage and the value after its last step (the value
        # chain: V at the next real step after it)
        x = zero
        v_right = zero
        v_known = not open_chain  # a chunk's map leaves the value entering it open until a real step is found
        if live:
            if value_chain:
                if final:  # the maps launch leaves it open
                    v_right = bootstrap[row, 0]
            elif hi < length:
                v_right = to_compute(values[row, hi])
            else:
                v_right = bootstrap[row, 0]
            if final and chunked:
                k = chunks - 1
                while k > chunk:
                    column = row * chunks + k
                    x = maps[1, column] + scale0(maps[0, column], x)
                    if value_chain:
                        x += scale0(maps[2, column], v_right)
                        if maps[3, column] != zero:
                            v_right = maps[4, column]
                    k -= 1
        if open_chain and lt == u_zero:  # no real step yet: the identity
            s_last[u_three * g] = zero
            s_last[u_three * g + u_one] = one
            s_last[u_three * g + u_two] = zero
        map_c, map_d = one, zero  # maps phase: the chunk's map so far (from its right end)
        for n in range(tiles):
            start = lo + (tiles - 1 - n) * tile
            steps = np.uint64(max(min(tile, hi - start), 0))
            # striped loads into the group's slots; a step past the tile's end reloads its last step (no branch)
            if steps > u_zero:
                for k in range(items):
                    i = min(np.uint64(k) * group + lt, steps - u_one)
                    t = step(start, i)
                    slot = pad(base + i)
                    s_r[slot] = to_compute(load(rewards[at], t))
                    s_v[slot] = to_compute(load(values[at], t))
                    if has_next:
                        s_n[slot] = to_compute(load(next_values[at], t))
                    if gamma is not None:
                        s_g[slot] = to_compute(load_again(gamma[at], t))
                    if lam is not None:
                        s_l[slot] = to_compute(load_again(lam[at], t))
                    if has_flags:
                        bits = 0
                        if terminated is not None:
                            if load(terminated[at], t) != 0:
                                bits |= TERMINATED
                        if truncated is not None:
                            if load(truncated[at], t) != 0:
                                bits |= TRUNCATED
                        if mask is not None:
                            if load(mask[at], t) == 0:
                                bits |= MASKED
                        s_f[base + i] = np.uint8(bits)
            if lt == u_zero and neighbour:
                s_v[pad(base + steps)] = v_right
            cuda.syncthreads()
            if steps > u_zero and neighbour:
                v_right = s_v[pad(base)]
            vnext = v_right  # the value chain entering this thread's steps (a mask without next_values)
            open_here = False  # the value entering this thread's steps is the chunk's open one
            if value_chain:
                # each thread's leftmost real value (known 1) or none (known 0), scanned from the right
                known, value = zero, zero
                for i in range(items):
                    j = np.uint64(items - 1 - i)
                    if lt * u_items + j < steps and (s_f[first + j] & MASKED) == 0:
                        known, value = one, s_v[pad(first + j)]
                # the nearest real value to the right of a thread's steps is the next thread's own leftmost one,
                # unless that thread holds steps of the tile but no real one: only then does the block scan
                buf = scan_values(s_c, s_d, known, value, tid, lt, group, known == zero and lt * u_items < steps)
                if lt + u_one < group and s_c[buf * u_threads + tid + u_one] != zero:
                    vnext = s_d[buf * u_threads + tid + u_one]
                elif open_chain:
                    open_here = not v_known
                if s_c[buf * u_threads + lead] != zero:
                    v_right = s_d[buf * u_threads + lead]
                    if open_chain:
                        v_known = True
                cuda.syncthreads()  # the buffers are the advantage scan's next
            # each thread's steps folded from its far end into (fc, fd); each step's (c, d) kept in its slots. Steps
            # past the tile's end read slots of the tile and are made the identity by a select (no branch).
            fc, fd = one, zero
            for i in range(items):
                j = np.uint64(items - 1 - i)
                slot = pad(first + j)
                r = s_r[slot]
                v = s_v[slot]
                step_gamma = s_g[slot] if gamma is not None else gam
                step_lam = s_l[slot] if lam is not None else lm
                discount = step_gamma
                coefficient = step_gamma * step_lam
                inside = lt * u_items + j < steps
                if has_flags:
                    fl = s_f[first + j]
                    if fl & TERMINATED:
                        discount = zero
                    if fl & (TERMINATED | TRUNCATED):
                        coefficient = zero
                    if has_mask:
                        inside = inside and (fl & MASKED) == 0
                if has_next:
                    delta = (r + scale0(discount, s_n[slot])) - v
                elif value_chain:
                    delta = (r - v) + scale0(discount, vnext)
                    vnext = v if inside else vnext
                else:
                    delta = (r - v) + scale0(discount, s_v[pad(first + j + u_one)])
                if open_chain and inside and open_here:
                    # the chunk's last real step: its Vnext enters from the right, unknown here; it is kept apart
                    # (r - V, c, g) and made the identity in the fold
                    s_last[u_three * g] = r - v
                    s_last[u_three * g + u_one] = coefficient
                    s_last[u_three * g + u_two] = discount
                    inside = False
                    open_here = False
                coefficient = coefficient if inside else one
                delta = delta if inside else zero
                if final:
                    s_r[slot] = delta
                    s_k[slot] = coefficient
                fc, fd = compose(coefficient, delta, fc, fd)
            # the group's maps composed from the right
            buf = scan_maps(s_c, s_d, fc, fd, tid, lt, group, False)
            tile_c, tile_d = s_c[buf * u_threads + lead], s_d[buf * u_threads + lead]
            if final:
                y = x
                if lt + u_one < group:
                    y = s_d[buf * u_threads + tid + u_one] + scale0(s_c[buf * u_threads + tid + u_one], x)
                for i in range(items):  # past the tile's end: the identity, written to slots nobody stores
                    slot = pad(first + np.uint64(items - 1 - i))
                    y = s_r[slot] + scale0(s_k[slot], y)
                    s_r[slot] = y
                    s_v[slot] = y + s_v[slot]
                    if zero_masked:  # a masked step: 0 (its value is ignored, NaN included)
                        if s_f[first + np.uint64(items - 1 - i)] & MASKED:
                            s_r[slot] = zero
                            s_v[slot] = zero
                x = tile_d + scale0(tile_c, x)
                cuda.syncthreads()
                for k in range(items):
                    i = np.uint64(k) * group + lt
                    if i < steps:
                        slot = pad(base + i)
                        t = step(start, i)
                        store_once(advantages[at], t, to_io(s_r[slot]))
                        store_once(returns[at], t, to_io(s_v[slot]))
            else:
                map_c, map_d = compose(tile_c, tile_d, map_c, map_d)
            cuda.syncthreads()
        if not final and live and lt == u_zero:
            if open_chain:
                # the chunk's map: its steps before its last real step (map_c, map_d) after that step
                last_delta, last_c = s_last[u_three * g], s_last[u_three * g + u_one]
                maps[2, work] = times(map_c, s_last[u_three * g + u_two])
                maps[3, work] = one if v_known else zero
                maps[4, work] = v_right
                map_d = map_d + scale0(map_c, last_delta)
                map_c = times(map_c, last_c)
            maps[0, work] = map_c
            maps[1, work] = map_d

    return KernelSpec(s.name, kernel, signature(io, s), (THREADS, BLOCKS_PER_SM[io == "float64"]))
