"""The fused numba-CUDA kernels of ``gae_xp.backends.numba_cuda`` (this module imports numba).

Every problem here is the first-order recurrence along the rows of (rows, T)
arrays, reverse for GAE (``A_t = delta_t + a_t A_{t+1}``), either way for the
scan primitive. A row is cut into tiles of ``blockDim.x * ITEMS`` steps, one
thread block per tile, ``ITEMS`` consecutive steps per thread. Three launches:

1. ``tile`` (summary): every thread computes delta and the coefficient of its
   steps in registers and folds them, serially, into the map of its segment;
   a block scan in shared memory composes the threads' maps; thread 0 (the
   last in recurrence order for a forward scan) writes the tile's map;
2. ``carry``: one block per row composes the tiles' maps and writes, for
   every tile, the state entering it from its neighbour;
3. ``tile`` (final): the same per-thread work and block scan again, then
   every thread rescans its steps from the state entering it and writes the
   outputs. A row of one tile needs this launch only.

The map of a segment, with A its value at the edge the recurrence starts from
and u "V at the next real step" there (the value carry, only with a mask and
no ``next_values``)::

    A -> b + p A + q u,      u -> v if h else u

(h: the segment has a real step, v: V at its first real step, q: the
coefficient of u in the delta of its last real step). Composition, near after
far (``near o far``)::

    b = b_n + p_n b_f + (q_n v_f if h_f else 0)      p = p_n p_f
    q = p_n q_f + (0 if h_f else q_n)                h = h_n or h_f,  v = v_n if h_n else v_f

with selects: ``p_n == 0`` (a cut) drops the far segment exactly, NaN and inf
included; ``q_n == 0`` drops v_f. A product of non-zero coefficients that
underflows is kept at the smallest subnormal (``_times``), so only a true zero
cuts and non-finite values travel as far back as in the serial loop.

Only the numba.cuda subset that the simulator also runs: shared-memory block
scans (Hillis-Steele, double-buffered), local arrays indexed by unrolled
loops, ``syncthreads``; no warp intrinsics, no cooperative groups. Kernels are
built per (dtype, structure) by the ``*_kernel`` factories below, which
return the Python function and its explicit signature: the backend compiles
them with ``cuda.jit(signature, cache=True)`` and the compile test with
``cuda.compile_ptx``.
"""

from __future__ import annotations

import os
from typing import Callable, NamedTuple

import numpy as np
from numba import cuda, types

SIMULATED = os.environ.get("NUMBA_ENABLE_CUDASIM", "0") == "1"
#: Most threads of a tile block, steps per thread, threads of the carry kernel, granularity of a block's size.
#: Tiny under the simulator, which runs Python per thread: a few steps already make several tiles there.
THREADS, ITEMS, CARRY_THREADS, WARP = (4, 3, 4, 1) if SIMULATED else (256, 8, 128, 32)

#: Bits of the ``options`` argument of the GAE tile kernel: which optional arrays are present.
TERMINATED, TRUNCATED, GAMMA_STEPS, LAM_STEPS, FILL_MASKED = 1, 2, 4, 8, 16
#: Bit of the ``options`` argument of the scan tile kernel.
A_STEPS = 1

#: Rows of the summary array of a tile (b, p, q, h, v) with and without the value carry.
SUMMARY_ROWS = {True: 5, False: 2}

IO_DTYPES = ("float16", "float32", "float64")


class KernelSpec(NamedTuple):
    """A kernel before compilation: its Python function, explicit signature and a name for tables."""

    name: str
    function: Callable
    signature: object


def compute_dtype(io: str) -> str:
    """float64 for float64 data, float32 otherwise (float16 is computed in float32)."""
    return "float64" if io == "float64" else "float32"


def _constants(io: str):
    np_type = np.dtype(compute_dtype(io)).type
    return getattr(types, compute_dtype(io)), np_type(0), np_type(1), np.finfo(np_type).smallest_subnormal


def _array(dtype: str, ndim: int, layout: str = "A"):
    return types.Array(getattr(types, dtype) if dtype != "bool" else types.boolean, ndim, layout)


@cuda.jit(device=True)
def _times(x, y, zero, tiny):
    """x * y, which is 0 only when x or y is: an underflow is kept at +-tiny, since only a true zero cuts."""
    z = x * y
    if z == zero and x != zero and y != zero:
        z = -tiny if (x < zero) != (y < zero) else tiny
    return z


@cuda.jit(device=True)
def _compose(b_n, p_n, q_n, h_n, v_n, b_f, p_f, q_f, h_f, v_f, zero, tiny):
    """``near o far`` of two segment maps (see the module docstring); selects, never 0 * x."""
    b = b_n
    q = zero if h_f else q_n
    if p_n != zero:
        b = b + p_n * b_f
        q = q + p_n * q_f
    if h_f and q_n != zero:
        b = b + q_n * v_f
    return b, _times(p_n, p_f, zero, tiny), q, h_n or h_f, v_n if h_n else v_f


@cuda.jit(device=True)
def _apply(b, p, q, h, v, a, u, zero):
    """The state (A, u) after a segment of map (b, p, q, h, v), given the state (a, u) entering it."""
    out = b
    if p != zero:
        out = out + p * a
    if q != zero:
        out = out + q * u
    return out, v if h else u


@cuda.jit(device=True)
def _block_scan(shared, b, p, q, h, v, rows, reverse, zero, tiny):
    """Inclusive scan of the threads' maps in recurrence order; every thread gets the composite of itself and
    the threads its recurrence comes from (higher ids if ``reverse``).

    ``shared`` is (2, rows, blockDim.x): two buffers, so one barrier per step. ``rows`` is 5 with the value
    carry (b, p, q, h, v) and 2 without (b, p; q = 0, h = True). Returns the composite and the buffer
    that holds every thread's composite afterwards.
    """
    tid = cuda.threadIdx.x
    threads = cuda.blockDim.x
    buf = 0
    shared[0, 0, tid] = b
    shared[0, 1, tid] = p
    if rows == 5:
        shared[0, 2, tid] = q
        shared[0, 3, tid] = 1 if h else 0
        shared[0, 4, tid] = v
    cuda.syncthreads()
    step = 1
    while step < threads:
        partner = tid + step if reverse else tid - step
        if 0 <= partner < threads:
            far_q, far_h, far_v = zero, True, zero
            if rows == 5:
                far_q, far_h, far_v = shared[buf, 2, partner], shared[buf, 3, partner] != 0, shared[buf, 4, partner]
            b, p, q, h, v = _compose(b, p, q, h, v, shared[buf, 0, partner], shared[buf, 1, partner],
                                     far_q, far_h, far_v, zero, tiny)
        buf = 1 - buf
        shared[buf, 0, tid] = b
        shared[buf, 1, tid] = p
        if rows == 5:
            shared[buf, 2, tid] = q
            shared[buf, 3, tid] = 1 if h else 0
            shared[buf, 4, tid] = v
        cuda.syncthreads()
        step *= 2
    return b, p, q, h, v, buf


@cuda.jit(device=True)
def _neighbour(shared, buf, rows, reverse, one, zero):
    """The composite of the threads before this one in recurrence order (the identity map for the first)."""
    partner = cuda.threadIdx.x + 1 if reverse else cuda.threadIdx.x - 1
    if partner < 0 or partner >= cuda.blockDim.x:
        return zero, one, zero, False, zero
    if rows == 5:
        return (shared[buf, 0, partner], shared[buf, 1, partner], shared[buf, 2, partner],
                shared[buf, 3, partner] != 0, shared[buf, 4, partner])
    return shared[buf, 0, partner], shared[buf, 1, partner], zero, False, zero


def gae_tile_kernel(io: str, *, final: bool, masked: bool, with_next: bool) -> KernelSpec:
    """Launch 1 (``final=False``: tile maps) or 3 (``final=True``: outputs) of GAE, for one dtype and structure.

    Per real step t, with Vnext_t = next_values[t] (``with_next``), else V at the next real step (the
    value carry, with ``masked``), else V_{t+1} (bootstrap after the last step)::

        delta_t = r_t + (0 if terminated_t else gamma_t Vnext_t) - V_t
        a_t     = 0 if terminated_t or truncated_t else gamma_t lam_t
        A_t     = delta_t if a_t == 0 else delta_t + a_t A_{t+1};      R_t = A_t + V_t

    A masked step (``masked``, mask False) is the identity; its outputs are 0, or A and A + V_t with the
    FILL_MASKED option. Terminated/truncated arrays, per-step gamma/lam and fill_masked are ``options``
    bits (uniform branches); an absent array's argument is any array of its type and is never read.
    The summary array is (5 or 2, rows, n_tiles) (see SUMMARY_ROWS); the carry array is (2 or 1, rows,
    n_tiles): the state (A, u) entering each tile from the right.
    """
    compute, zero_c, one_c, tiny_c = _constants(io)
    value_carry = masked and not with_next
    rows = SUMMARY_ROWS[value_carry]

    def tile(rewards, values, next_values, gamma, lam, terminated, truncated, mask, bootstrap,
             gamma_scalar, lam_scalar, options, n_tiles, summary, carry, advantages, returns):
        tid = cuda.threadIdx.x
        row = cuda.blockIdx.x // n_tiles
        tile_id = cuda.blockIdx.x % n_tiles
        length = rewards.shape[1]
        lo = (tile_id * cuda.blockDim.x + tid) * ITEMS
        count = min(ITEMS, length - lo)
        boot = compute(bootstrap[row])
        delta = cuda.local.array(ITEMS, compute)
        coeff = cuda.local.array(ITEMS, compute)
        value = cuda.local.array(ITEMS, compute)
        real = cuda.local.array(ITEMS, types.boolean)
        # This thread's map, built step by step from its far edge. ``pending`` is the step whose Vnext is the
        # value carried in (u); ``pending_r``, ``pending_v``, ``pending_g`` hold its r, V and gamma (0 if terminated)
        # for when u is known
        # (registers: reading value[pending] would index the local array dynamically and put it in memory).
        b, p, q, h, v = zero_c, one_c, zero_c, False, zero_c
        pending, pending_r, pending_v, pending_g = -1, zero_c, zero_c, zero_c
        for i in range(ITEMS):
            j = ITEMS - 1 - i
            if j < count:
                t = lo + j
                v_t = compute(values[row, t])
                value[j] = v_t
                is_real = mask[row, t] if masked else True
                real[j] = is_real
                if is_real:
                    r_t = compute(rewards[row, t])
                    g = compute(gamma[row, t]) if options & GAMMA_STEPS else gamma_scalar
                    lam_t = compute(lam[row, t]) if options & LAM_STEPS else lam_scalar
                    ended = (options & TERMINATED) != 0 and terminated[row, t]
                    cut = ended or ((options & TRUNCATED) != 0 and truncated[row, t])
                    q_t = zero_c
                    if with_next:
                        following = compute(next_values[row, t])
                    elif value_carry:
                        following = v
                        if not h:
                            following, pending, pending_r, pending_v = zero_c, j, r_t, v_t
                            pending_g = zero_c if ended else g
                            q_t = pending_g
                    else:
                        following = compute(values[row, t + 1]) if t + 1 < length else boot
                    d = (r_t + (zero_c if ended else g * following)) - v_t
                    c = zero_c if cut else g * lam_t
                    delta[j] = d
                    coeff[j] = c
                    if c == zero_c:
                        b, p, q = d, zero_c, q_t
                    else:
                        b, p, q = d + c * b, _times(c, p, zero_c, tiny_c), q_t + c * q
                    h, v = True, v_t
        shared = cuda.shared.array((2, rows, THREADS), compute)
        b, p, q, h, v, buf = _block_scan(shared, b, p, q, h, v, rows, True, zero_c, tiny_c)
        if not final:
            if tid == 0:
                summary[0, row, tile_id] = b
                summary[1, row, tile_id] = p
                if value_carry:
                    summary[2, row, tile_id] = q
                    summary[3, row, tile_id] = one_c if h else zero_c
                    summary[4, row, tile_id] = v
            return
        last = tile_id == n_tiles - 1
        a_tile = zero_c if last else carry[0, row, tile_id]
        u_tile = boot if last or not value_carry else carry[1, row, tile_id]
        b, p, q, h, v = _neighbour(shared, buf, rows, True, one_c, zero_c)
        following, u = _apply(b, p, q, h, v, a_tile, u_tile, zero_c)
        fill = (options & FILL_MASKED) != 0
        for i in range(ITEMS):
            j = ITEMS - 1 - i
            if j < count:
                t = lo + j
                if real[j]:
                    d = delta[j]
                    if value_carry and j == pending and pending_g != zero_c:
                        d = (pending_r + pending_g * u) - pending_v
                    c = coeff[j]
                    following = d if c == zero_c else d + c * following
                    advantages[row, t] = following
                    returns[row, t] = following + value[j]
                elif fill:
                    advantages[row, t] = following
                    returns[row, t] = following + value[j]
                else:
                    advantages[row, t] = zero_c
                    returns[row, t] = zero_c

    data, flags = _array(io, 2), _array("bool", 2)
    signature = types.void(data, data, data, data, data, flags, flags, flags, _array(io, 1), compute, compute,
                           types.int32, types.int64, _array(compute_dtype(io), 3, "C"),
                           _array(compute_dtype(io), 3, "C"), _array(io, 2, "C"), _array(io, 2, "C"))
    structure = ("mask" if masked else "") + ("+next" if with_next else "")
    return KernelSpec(f"gae_{'final' if final else 'summary'}[{structure or 'plain'}]", tile, signature)


def scan_tile_kernel(io: str, *, final: bool, reverse: bool) -> KernelSpec:
    """Launch 1 or 3 of the scan primitive ``y_t = x_t + a_t y_{t+1}`` (reverse) or ``y_{t-1}`` (forward).

    ``a_t == 0`` cuts exactly: ``y_t = x_t`` (a select). ``a`` is the array (A_STEPS option bit) or the
    scalar argument. Summary (2, rows, n_tiles): the tiles' maps (b, p); carry (1, rows, n_tiles): the
    value entering each tile from its neighbour in recurrence order.
    """
    compute, zero_c, one_c, tiny_c = _constants(io)

    def tile(x, a, a_scalar, options, n_tiles, summary, carry, y):
        tid = cuda.threadIdx.x
        row = cuda.blockIdx.x // n_tiles
        tile_id = cuda.blockIdx.x % n_tiles
        length = x.shape[1]
        lo = (tile_id * cuda.blockDim.x + tid) * ITEMS
        count = min(ITEMS, length - lo)
        term = cuda.local.array(ITEMS, compute)
        coeff = cuda.local.array(ITEMS, compute)
        b, p = zero_c, one_c
        for i in range(ITEMS):
            j = ITEMS - 1 - i if reverse else i
            if j < count:
                t = lo + j
                d = compute(x[row, t])
                c = compute(a[row, t]) if options & A_STEPS else a_scalar
                term[j] = d
                coeff[j] = c
                if c == zero_c:
                    b, p = d, zero_c
                else:
                    b, p = d + c * b, _times(c, p, zero_c, tiny_c)
        shared = cuda.shared.array((2, 2, THREADS), compute)
        b, p, q, h, v, buf = _block_scan(shared, b, p, zero_c, True, zero_c, 2, reverse, zero_c, tiny_c)
        if not final:
            if tid == (0 if reverse else cuda.blockDim.x - 1):
                summary[0, row, tile_id] = b
                summary[1, row, tile_id] = p
            return
        edge = tile_id == n_tiles - 1 if reverse else tile_id == 0
        b, p, q, h, v = _neighbour(shared, buf, 2, reverse, one_c, zero_c)
        state, u = _apply(b, p, zero_c, True, zero_c, zero_c if edge else carry[0, row, tile_id], zero_c, zero_c)
        for i in range(ITEMS):
            j = ITEMS - 1 - i if reverse else i
            if j < count:
                c = coeff[j]
                state = term[j] if c == zero_c else term[j] + c * state
                y[row, lo + j] = state

    compute_name = compute_dtype(io)
    signature = types.void(_array(io, 2), _array(io, 2), compute, types.int32, types.int64,
                           _array(compute_name, 3, "C"), _array(compute_name, 3, "C"), _array(io, 2, "C"))
    return KernelSpec(f"scan_{'final' if final else 'summary'}[{'reverse' if reverse else 'forward'}]", tile,
                      signature)


def carry_kernel(io: str, *, value_carry: bool, reverse: bool) -> KernelSpec:
    """Launch 2: one block per row turns the tiles' maps into the state entering every tile.

    Thread k composes a segment of consecutive tiles serially, the block scans the segments' maps, and
    every thread walks its segment again from the state entering it, writing each tile's state: (A, u)
    with the value carry, A alone without. The state entering the row's edge is A = 0 and u = bootstrap.
    """
    compute, zero_c, one_c, tiny_c = _constants(io)
    rows = SUMMARY_ROWS[value_carry]

    def carry(summary, bootstrap, out):
        tid = cuda.threadIdx.x
        row = cuda.blockIdx.x
        n = summary.shape[2]
        span = (n + cuda.blockDim.x - 1) // cuda.blockDim.x
        lo = min(tid * span, n)
        size = min(span, n - lo)
        b, p, q, h, v = zero_c, one_c, zero_c, False, zero_c
        for i in range(size):
            k = lo + size - 1 - i if reverse else lo + i
            near_q, near_h, near_v = zero_c, True, zero_c
            if value_carry:
                near_q, near_h, near_v = summary[2, row, k], summary[3, row, k] != zero_c, summary[4, row, k]
            b, p, q, h, v = _compose(summary[0, row, k], summary[1, row, k], near_q, near_h, near_v,
                                     b, p, q, h, v, zero_c, tiny_c)
        shared = cuda.shared.array((2, rows, CARRY_THREADS), compute)
        b, p, q, h, v, buf = _block_scan(shared, b, p, q, h, v, rows, reverse, zero_c, tiny_c)
        b, p, q, h, v = _neighbour(shared, buf, rows, reverse, one_c, zero_c)
        state, u = _apply(b, p, q, h, v, zero_c, compute(bootstrap[row]) if value_carry else zero_c, zero_c)
        for i in range(size):
            k = lo + size - 1 - i if reverse else lo + i
            out[0, row, k] = state
            near_q, near_h, near_v = zero_c, True, zero_c
            if value_carry:
                out[1, row, k] = u
                near_q, near_h, near_v = summary[2, row, k], summary[3, row, k] != zero_c, summary[4, row, k]
            state, u = _apply(summary[0, row, k], summary[1, row, k], near_q, near_h, near_v, state, u, zero_c)

    compute_name = compute_dtype(io)
    signature = types.void(_array(compute_name, 3, "C"), _array(io, 1), _array(compute_name, 3, "C"))
    kind = "value" if value_carry else ("reverse" if reverse else "forward")
    return KernelSpec(f"carry[{kind}]", carry, signature)


def all_kernels():
    """Every (io dtype, kernel) the backend can launch: what the compile test compiles for sm_80 and sm_90."""
    for io in IO_DTYPES:
        for final in (False, True):
            for masked in (False, True):
                for with_next in (False, True):
                    yield io, gae_tile_kernel(io, final=final, masked=masked, with_next=with_next)
            for reverse in (True, False):
                yield io, scan_tile_kernel(io, final=final, reverse=reverse)
        yield io, carry_kernel(io, value_carry=True, reverse=True)
        for reverse in (True, False):
            yield io, carry_kernel(io, value_carry=False, reverse=reverse)
