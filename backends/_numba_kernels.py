r"""The numba CPU kernels behind ``gae_xp.backends.numba_cpu`` (numba is imported with this module).

One step of GAE depends on the next one, so a loop over time waits on its
own multiply-add at every step. These kernels break that chain: a *span* of
a row (a whole row, or a run of whole segments) is cut into *windows* of
``LANES`` lanes of ``LANE`` steps, aligned to the span's end (the first
window, at the span's start, is padded with steps that change nothing), and
each window is solved in four passes that stay in the cache:

1. ``prepare``: per step, in float64, into a scratch buffer (no dependence
   between steps: the compiler vectorises it): ``(r - V) m`` (with
   ``next_values``, the whole delta), the weight ``gamma m (1 - terminated)``
   of the next real step's value, the coefficient ``gamma lam`` (0 at a
   done step, 1 at a masked one), V at a real step (m = 1) and NaN at a
   masked one (m = 0). A segment's last step is then patched with its
   bootstrap value and incoming advantage, and cuts like a done step;
2. ``advance``: the ``LANES`` lanes run in lockstep, each from a zero
   advantage, keeping its local advantage ``f_t`` and the product ``P_t``
   of its coefficients (the running "V at the next real step" of a lane
   starts from the value found at the start of the lane to its right);
3. the carries, from the last lane to the first: the advantage entering
   lane k is ``c_k = f + P c_{k+1}`` at the first step of lane k+1;
4. ``finish``: ``A_t = f_t + P_t c_k`` and the returns, written once.

The running sums are float64 whatever the dtype, and a cut is a
coefficient that is exactly 0, so ``P_t`` is exactly 0 behind it. Passes 1
and 2 use multiplications by 0/1 flags, exact for finite numbers; a lane
whose state ends non-finite (NaN or inf in an input, masked ones included,
or entering from its right) is solved again by ``walk``, the serial loop
with every cut and mask a select, so non-finite numbers travel exactly as
in ``gae_xp.reference.gae_loop``. Spans shorter than a window are walked
too, and rows shorter than a window have a driver of their own that only
walks (``walk_units``: the window passes are then not compiled at all).
With ``critic_lam`` a second chain (``gamma * critic_lam``) shares the
deltas, the cuts and the masks and gives the returns. A row that is one
segment with float coefficients and no per-step arrays takes the
constant-discount kernel: pass 1 writes the deltas alone, and the products
are powers of ``gamma * lam``.

Every kernel is compiled once per combination of argument types (None for
an absent ``next_values`` or ``mask``: what is absent costs nothing; a float
or an array for a coefficient) and cached on disk. ``terminated`` and
``truncated`` are bool arrays to the general kernel whether given or not:
an absent one is a single all-False (1, T) row that stands for every row,
so which of them a call gives makes no kernel of its own (their 0/1
factors cost little beside the rewards and values, where a mask's
masked-step handling would cost 30 %). Each driver solves the work units
``first .. stop - 1`` (a unit is a span of one row, a segment, or a row) and
releases the GIL, so the backend shares a call's units between the calling
thread and helper threads (``gae_xp.backends._sharing``).
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic, overload
from numba.np.arrayobj import make_array, populate_array

from ._numba_cache import install as _install_cache_locator

_install_cache_locator()  # before the kernels below are made: their cache is found by contents, not by path

#: Lanes advanced in lockstep by one thread (the unrolled ``_advance*`` below hold one state per lane).
LANES = 8
#: Steps per lane.
LANE = 128
#: Steps per window.
WINDOW = LANES * LANE

# The scratch buffer of the general kernel: one float64 row of WINDOW per field. VM holds V at a real step and NaN
# at a masked one (a real step whose V is NaN has a NaN delta too, which sends its lane to ``walk``). After
# ``advance``, BASE holds the local advantage f, CF its product P, F2 and CF2 the critic chain's.
_BASE, _G, _CF, _VM, _CF2, _F2 = (np.uint64(k * WINDOW) for k in range(6))
GENERAL_FIELDS = 6
# The constant-discount kernel keeps the deltas (then f) and the critic chain's f.
_D, _D2 = np.uint64(0), np.uint64(WINDOW)
CONSTANT_FIELDS = 2
#: Below this a decaying derivative of a summary is 0 (``np.finfo(np.float64).smallest_normal``).
_SMALLEST_NORMAL = 2.2250738585072014e-308

_COMPILED = dict(cache=True, nogil=True, fastmath={"contract"}, error_model="numpy")
# What the drivers call (not Python): no wrappers to call them from Python or C, not cached of their own (the
# drivers' cached code holds them): a fifth less compiling on a cold cache.
_HELPER = dict(nogil=True, fastmath={"contract"}, error_model="numpy", no_cpython_wrapper=True,
               no_cfunc_wrapper=True)


# --- accessors resolved at compile time by the argument's type ---------------------------------------------------


@intrinsic
def _borrowed_row(typingctx, x, row):
    """``x[row]`` of a 2-D array, as a view without a reference of its own (no meminfo): numba's own view takes one
    (an atomic increment, and a decrement when it dies): for a kernel's seven row views about a tenth of a
    microsecond a row, half the kernel's time on 1,024 rows of 512 steps. The view's data, strides and types
    (read-only, aligned) are the array's row; it lives only inside the driver call that made it, while ``x``
    does, and is never returned to Python; ``row`` is in range (the drivers' units are)."""
    if not (isinstance(x, types.Array) and x.ndim == 2 and isinstance(row, types.Integer)):
        return None
    row_type = x.copy(ndim=1, layout="C" if x.layout == "C" else "A")

    def codegen(context, builder, signature, args):
        array_type, index_type = signature.args
        array = make_array(array_type)(context, builder, args[0])
        index = context.cast(builder, args[1], index_type, types.intp)
        shape = cgutils.unpack_tuple(builder, array.shape)
        strides = cgutils.unpack_tuple(builder, array.strides)
        view = make_array(row_type)(context, builder)
        populate_array(view, data=cgutils.pointer_add(builder, array.data, builder.mul(index, strides[0])),
                       shape=[shape[1]], strides=[strides[1]], itemsize=array.itemsize, meminfo=None)
        return view._getvalue()

    return row_type(x, row), codegen


def _row(x, row):
    """Row ``row`` of a (rows, T) array (a borrowed view: ``_borrowed_row``); None and floats unchanged."""


@overload(_row, inline="always")
def _row_overload(x, row):
    if isinstance(x, types.Array):
        return lambda x, row: _borrowed_row(x, row)
    return lambda x, row: x


def _present(x):
    """True for an array (compile-time constant), False for None."""


@overload(_present)
def _present_overload(x):
    present = not isinstance(x, types.NoneType)
    return lambda x: present


def _flag(flags, t):
    """``terminated`` or ``truncated`` at step t; False where it is None (the constant-discount kernel's)."""


@overload(_flag)
def _flag_overload(flags, t):
    if isinstance(flags, types.NoneType):
        return lambda flags, t: False
    return lambda flags, t: flags[t]


def _real(mask, t):
    """Whether step t is real; True where the mask is absent (None)."""


@overload(_real)
def _real_overload(mask, t):
    if isinstance(mask, types.NoneType):
        return lambda mask, t: True
    return lambda mask, t: mask[t]


def _at(x, t):
    """A coefficient (or a value) at step t in float64: a float is one for every step, None is 0."""


@overload(_at)
def _at_overload(x, t):
    if isinstance(x, types.Array):
        return lambda x, t: np.float64(x[t])
    if isinstance(x, types.NoneType):
        return lambda x, t: 0.0
    return lambda x, t: np.float64(x)


# --- the serial loop: exact, for short spans and for lanes with non-finite numbers -------------------------------


@njit(**_HELPER)
def _segment_of(offsets, t):
    """The segment holding step t: the last i with ``offsets[i] <= t`` (empty segments before it share its start)."""
    lo, hi = 0, offsets.shape[0] - 1  # offsets[lo] <= t < offsets[hi]
    while hi - lo > 1:
        middle = (lo + hi) // 2
        if offsets[middle] <= t:
            lo = middle
        else:
            hi = middle
    return lo


@njit(**_HELPER)
def _starts_before(offsets, segment):
    """The segment before ``segment`` that has steps (empty ones are skipped), or -1."""
    segment -= 1
    while segment >= 0 and offsets[segment] == offsets[segment + 1]:
        segment -= 1
    return segment


@njit(**_HELPER)
def walk(rewards, values, steps, bounds, fill_masked, advantages, returns, lo, hi, next_value, following,
         critic_following):
    """Steps ``hi - 1`` down to ``lo`` of one row, in the order and with the selects of the serial loop.

    ``rewards`` ... ``returns`` are the row's 1-D arrays, ``steps`` the row's
    ``(next_values, terminated, truncated, mask, gamma, lam, critic_lam)``,
    ``bounds`` the row's ``(bootstrap, carry, offsets)``. The state entering
    step hi-1 is (next_value, following, critic_following); at a segment's
    last step it is that segment's (bootstrap, carry) instead. Returns the
    state after step lo.
    """
    next_values, terminated, truncated, mask, gamma, lam, critic_lam = steps
    bootstrap, carry, offsets = bounds
    decoupled = _present(critic_lam)
    segment = _segment_of(offsets, hi - 1) if hi > lo else -1
    end = hi
    while end > lo:  # segment by segment, from the last: steps end - 1 down to max(the segment's start, lo)
        if end == offsets[segment + 1]:  # the segment ends here: nothing crosses into it from the right
            next_value = np.float64(bootstrap[segment])
            following = _at(carry, segment)
            critic_following = following
        start = max(offsets[segment], lo)
        for j in range(end - start):
            t = np.uint64(end - 1 - j)  # unsigned: no negative-index test on the arrays
            value = np.float64(values[t])
            g = _at(gamma, t)
            v_next = _at(next_values, t) if _present(next_values) else next_value
            ended = _flag(terminated, t)
            cut = ended or _flag(truncated, t)
            real = _real(mask, t)
            delta = (np.float64(rewards[t]) + (0.0 if ended else g * v_next) - value) if real else 0.0
            # A masked step is the identity of the recurrence (input 0, coefficient 1); a zero coefficient cuts
            # exactly.
            coefficient = (0.0 if cut else g * _at(lam, t)) if real else 1.0
            following = delta + coefficient * following if coefficient != 0.0 else delta
            if decoupled:
                critic = (0.0 if cut else g * _at(critic_lam, t)) if real else 1.0
                critic_following = delta + critic * critic_following if critic != 0.0 else delta
            else:
                critic_following = following
            if real:
                next_value = value
            kept = real or fill_masked
            advantages[t] = following if kept else 0.0
            returns[t] = critic_following + value if kept else 0.0
        end = start
        if end > lo:
            segment = _starts_before(offsets, segment)
    return next_value, following, critic_following


# --- the general window kernel -----------------------------------------------------------------------------------


@njit(**_HELPER)
def _prepare(S, resets, rewards, values, steps, start, first):
    """Pass 1: the scratch fields of the window starting at step ``start``; positions before ``first`` pad.
    ``resets[i]``: the running "V at the next real step" is set at position i (a real step)."""
    next_values, terminated, truncated, mask, gamma, lam, critic_lam = steps
    for i in range(first):
        u = np.uint64(i)
        S[_BASE + u], S[_G + u], S[_CF + u], S[_VM + u], S[_CF2 + u] = 0.0, 0.0, 1.0, np.nan, 1.0
        resets[u] = False
    for i in range(first, WINDOW):
        u = np.uint64(i)
        t = np.uint64(start + i)  # unsigned: no negative-index test, so the loop vectorises
        m = 1.0 if _real(mask, t) else 0.0
        open_ = 0.0 if _flag(terminated, t) else 1.0
        kept = 0.0 if _flag(terminated, t) | _flag(truncated, t) else 1.0  # | reads both: no masked load
        value = np.float64(values[t])
        g = _at(gamma, t)
        base = np.float64(rewards[t]) - value
        if _present(next_values):
            S[_BASE + u] = (base + open_ * g * _at(next_values, t)) * m
            S[_G + u] = 0.0
        else:
            S[_BASE + u] = base * m
            S[_G + u] = m * open_ * g
        S[_CF + u] = m * kept * (g * _at(lam, t)) + (1.0 - m)
        if _present(critic_lam):
            S[_CF2 + u] = m * kept * (g * _at(critic_lam, t)) + (1.0 - m)
        S[_VM + u] = value if _real(mask, t) else np.nan
        resets[u] = _real(mask, t)


@njit(**_HELPER)
def _patch(S, resets, rewards, values, steps, bounds, start, segment):
    """A segment's last step in the window: its bootstrap value and incoming advantage enter, and it cuts."""
    next_values, terminated, truncated, mask, gamma, lam, critic_lam = steps
    bootstrap, carry, offsets = bounds
    t = offsets[segment + 1] - 1
    u = np.uint64(t - start)
    entering = _at(carry, segment)
    b = np.float64(bootstrap[segment])
    S[_G + u], S[_CF + u], S[_CF2 + u] = 0.0, 0.0, 0.0
    resets[u] = True
    if not _real(mask, t):  # the state from the right passes through a masked step
        # A NaN bootstrap value would read as "masked" in VM: a NaN advantage sends the lane to walk instead.
        S[_BASE + u] = entering if b == b else np.nan
        S[_VM + u] = b
        return
    ended = _flag(terminated, t)
    value = np.float64(values[t])
    g = _at(gamma, t)
    v_next = _at(next_values, t) if _present(next_values) else b
    coefficient = 0.0 if ended or _flag(truncated, t) else g * _at(lam, t)
    delta = np.float64(rewards[t]) + (0.0 if ended else g * v_next) - value
    S[_BASE + u] = delta + (coefficient * entering if coefficient != 0.0 else 0.0)
    S[_VM + u] = value


@njit(**_HELPER)
def _step(S, i, f, p, nv):
    c = S[_CF + i]
    d = S[_BASE + i] + S[_G + i] * nv
    value = S[_VM + i]
    nv = value if value == value else nv  # NaN: a masked step
    f = d + c * f
    p = c * p
    S[_BASE + i] = f
    S[_CF + i] = p
    return f, p, nv


@njit(**_HELPER)
def _step2(S, i, f, p, f2, p2, nv):
    c = S[_CF + i]
    c2 = S[_CF2 + i]
    d = S[_BASE + i] + S[_G + i] * nv
    value = S[_VM + i]
    nv = value if value == value else nv
    f = d + c * f
    p = c * p
    f2 = d + c2 * f2
    p2 = c2 * p2
    S[_BASE + i] = f
    S[_CF + i] = p
    S[_F2 + i] = f2
    S[_CF2 + i] = p2
    return f, p, f2, p2, nv


@njit(**_HELPER)
def _advance(S, entering, finite):
    """Pass 2: the LANES lanes of the window in lockstep; ``finite[k]``: lane k's state stayed finite."""
    f0 = f1 = f2 = f3 = f4 = f5 = f6 = f7 = 0.0
    p0 = p1 = p2 = p3 = p4 = p5 = p6 = p7 = 1.0
    n0, n1, n2, n3, n4, n5, n6, n7 = (entering[0], entering[1], entering[2], entering[3], entering[4], entering[5],
                                      entering[6], entering[7])
    for j in range(LANE):
        i = np.uint64(LANE - 1 - j)
        f0, p0, n0 = _step(S, i, f0, p0, n0)
        f1, p1, n1 = _step(S, i + np.uint64(LANE), f1, p1, n1)
        f2, p2, n2 = _step(S, i + np.uint64(2 * LANE), f2, p2, n2)
        f3, p3, n3 = _step(S, i + np.uint64(3 * LANE), f3, p3, n3)
        f4, p4, n4 = _step(S, i + np.uint64(4 * LANE), f4, p4, n4)
        f5, p5, n5 = _step(S, i + np.uint64(5 * LANE), f5, p5, n5)
        f6, p6, n6 = _step(S, i + np.uint64(6 * LANE), f6, p6, n6)
        f7, p7, n7 = _step(S, i + np.uint64(7 * LANE), f7, p7, n7)
    finite[0], finite[1], finite[2], finite[3] = (math.isfinite(f0 + p0), math.isfinite(f1 + p1),
                                                  math.isfinite(f2 + p2), math.isfinite(f3 + p3))
    finite[4], finite[5], finite[6], finite[7] = (math.isfinite(f4 + p4), math.isfinite(f5 + p5),
                                                  math.isfinite(f6 + p6), math.isfinite(f7 + p7))


@njit(**_HELPER)
def _advance2(S, entering, finite):
    """Pass 2 with the critic's recurrence beside the first."""
    f0 = f1 = f2 = f3 = f4 = f5 = f6 = f7 = 0.0
    p0 = p1 = p2 = p3 = p4 = p5 = p6 = p7 = 1.0
    g0 = g1 = g2 = g3 = g4 = g5 = g6 = g7 = 0.0
    q0 = q1 = q2 = q3 = q4 = q5 = q6 = q7 = 1.0
    n0, n1, n2, n3, n4, n5, n6, n7 = (entering[0], entering[1], entering[2], entering[3], entering[4], entering[5],
                                      entering[6], entering[7])
    for j in range(LANE):
        i = np.uint64(LANE - 1 - j)
        f0, p0, g0, q0, n0 = _step2(S, i, f0, p0, g0, q0, n0)
        f1, p1, g1, q1, n1 = _step2(S, i + np.uint64(LANE), f1, p1, g1, q1, n1)
        f2, p2, g2, q2, n2 = _step2(S, i + np.uint64(2 * LANE), f2, p2, g2, q2, n2)
        f3, p3, g3, q3, n3 = _step2(S, i + np.uint64(3 * LANE), f3, p3, g3, q3, n3)
        f4, p4, g4, q4, n4 = _step2(S, i + np.uint64(4 * LANE), f4, p4, g4, q4, n4)
        f5, p5, g5, q5, n5 = _step2(S, i + np.uint64(5 * LANE), f5, p5, g5, q5, n5)
        f6, p6, g6, q6, n6 = _step2(S, i + np.uint64(6 * LANE), f6, p6, g6, q6, n6)
        f7, p7, g7, q7, n7 = _step2(S, i + np.uint64(7 * LANE), f7, p7, g7, q7, n7)
    finite[0], finite[1], finite[2], finite[3] = (math.isfinite(f0 + p0 + g0 + q0), math.isfinite(f1 + p1 + g1 + q1),
                                                  math.isfinite(f2 + p2 + g2 + q2), math.isfinite(f3 + p3 + g3 + q3))
    finite[4], finite[5], finite[6], finite[7] = (math.isfinite(f4 + p4 + g4 + q4), math.isfinite(f5 + p5 + g5 + q5),
                                                  math.isfinite(f6 + p6 + g6 + q6), math.isfinite(f7 + p7 + g7 + q7))


def _advance_chains(S, entering, finite, critic_lam):
    """``_advance2`` with a critic chain, else ``_advance`` (chosen when compiling: only one is compiled)."""


@overload(_advance_chains)
def _advance_chains_overload(S, entering, finite, critic_lam):
    if isinstance(critic_lam, types.NoneType):
        return lambda S, entering, finite, critic_lam: _advance(S, entering, finite)
    return lambda S, entering, finite, critic_lam: _advance2(S, entering, finite)


@njit(**_HELPER)
def _entering_values(S, resets, entering, next_value):
    """The running "V at the next real step" entering each lane, from the value entering the window; returns the
    one leaving the window (a lane's is its first reset's value, or what entered it)."""
    for k in range(LANES - 1, -1, -1):
        entering[k] = next_value
        for i in range(k * LANE, (k + 1) * LANE):
            if resets[np.uint64(i)]:
                next_value = S[_VM + np.uint64(i)]
                break
    return next_value


@njit(**_HELPER)
def _finish_piece(S, values, mask, fill_masked, advantages, returns, start, lo, hi, c, c2, decoupled):
    """Pass 4 for one lane: positions [lo, hi) of the window, the lane's carries c (and c2) given."""
    for i in range(lo, hi):
        u = np.uint64(i)
        t = np.uint64(start + i)
        a = S[_BASE + u] + S[_CF + u] * c
        critic = S[_F2 + u] + S[_CF2 + u] * c2 if decoupled else a
        kept = _real(mask, t) or fill_masked
        advantages[t] = a if kept else 0.0
        returns[t] = critic + np.float64(values[t]) if kept else 0.0


@njit(**_HELPER)
def solve_span(rewards, values, steps, bounds, fill_masked, advantages, returns, first_segment, last_segment):
    """GAE on segments ``[first_segment, last_segment)`` of one row (1-D arrays, as ``walk`` takes them)."""
    next_values, terminated, truncated, mask, gamma, lam, critic_lam = steps
    bootstrap, carry, offsets = bounds
    decoupled = _present(critic_lam)
    lo, hi = offsets[first_segment], offsets[last_segment]
    if hi - lo < WINDOW:
        walk(rewards, values, steps, bounds, fill_masked, advantages, returns, lo, hi, 0.0, 0.0, 0.0)
        return
    S = np.empty(GENERAL_FIELDS * WINDOW)
    resets = np.empty(WINDOW, dtype=np.bool_)
    entering = np.empty(LANES)
    finite = np.empty(LANES, dtype=np.bool_)
    next_value, c, c2 = 0.0, 0.0, 0.0
    segment = last_segment - 1
    end = hi
    while end > lo:
        start = end - WINDOW
        first = max(lo - start, 0)
        _prepare(S, resets, rewards, values, steps, start, first)
        while segment >= first_segment and offsets[segment + 1] > start + first:
            if offsets[segment] < offsets[segment + 1]:
                _patch(S, resets, rewards, values, steps, bounds, start, segment)
            segment -= 1
        leaving = _entering_values(S, resets, entering, next_value)
        _advance_chains(S, entering, finite, critic_lam)
        for k in range(LANES - 1, -1, -1):
            lane_lo, lane_hi = max(k * LANE, first), (k + 1) * LANE
            if lane_lo >= lane_hi:
                break
            if finite[k] and math.isfinite(c + c2):
                _finish_piece(S, values, mask, fill_masked, advantages, returns, start, lane_lo, lane_hi, c, c2,
                              decoupled)
                u = np.uint64(lane_lo)
                c, c2 = (S[_BASE + u] + S[_CF + u] * c,
                         S[_F2 + u] + S[_CF2 + u] * c2 if decoupled else 0.0)
            else:
                _, c, c2 = walk(rewards, values, steps, bounds, fill_masked, advantages, returns, start + lane_lo,
                                start + lane_hi, entering[k], c, c2 if decoupled else c)
                c2 = c2 if decoupled else 0.0
        next_value = leaving
        end = start


# --- the constant-discount window kernel (one segment per row, scalar gamma and lam) -------------------------------


@njit(**_HELPER)
def _advance_constant(S, w, field, finite):
    """Pass 2 for a constant coefficient w on the deltas (or, for the critic chain, a copy of them) in ``field``."""
    f0 = f1 = f2 = f3 = f4 = f5 = f6 = f7 = 0.0
    for j in range(LANE):
        i = field + np.uint64(LANE - 1 - j)
        f0 = S[i] + w * f0
        S[i] = f0
        f1 = S[i + np.uint64(LANE)] + w * f1
        S[i + np.uint64(LANE)] = f1
        f2 = S[i + np.uint64(2 * LANE)] + w * f2
        S[i + np.uint64(2 * LANE)] = f2
        f3 = S[i + np.uint64(3 * LANE)] + w * f3
        S[i + np.uint64(3 * LANE)] = f3
        f4 = S[i + np.uint64(4 * LANE)] + w * f4
        S[i + np.uint64(4 * LANE)] = f4
        f5 = S[i + np.uint64(5 * LANE)] + w * f5
        S[i + np.uint64(5 * LANE)] = f5
        f6 = S[i + np.uint64(6 * LANE)] + w * f6
        S[i + np.uint64(6 * LANE)] = f6
        f7 = S[i + np.uint64(7 * LANE)] + w * f7
        S[i + np.uint64(7 * LANE)] = f7
    finite[0] &= math.isfinite(f0)
    finite[1] &= math.isfinite(f1)
    finite[2] &= math.isfinite(f2)
    finite[3] &= math.isfinite(f3)
    finite[4] &= math.isfinite(f4)
    finite[5] &= math.isfinite(f5)
    finite[6] &= math.isfinite(f6)
    finite[7] &= math.isfinite(f7)


@njit(**_HELPER)
def _powers(w):
    """``powers[i] = w^(LANE - i)``: the weight of a lane's carry at its position i."""
    powers = np.empty(LANE + 1)
    power = 1.0
    for i in range(LANE, -1, -1):
        powers[i] = power
        power *= w
    return powers


@njit(**_HELPER)
def solve_span_constant(rewards, values, steps, bounds, fill_masked, advantages, returns, first_segment,
                        last_segment):
    """``solve_span`` for one segment per row with float gamma, lam (and critic_lam) and no per-step flags."""
    next_values, terminated, truncated, mask, gamma, lam, critic_lam = steps
    bootstrap, carry, offsets = bounds
    decoupled = _present(critic_lam)
    lo, hi = offsets[first_segment], offsets[last_segment]
    if hi - lo < WINDOW or last_segment - first_segment != 1:
        walk(rewards, values, steps, bounds, fill_masked, advantages, returns, lo, hi, 0.0, 0.0, 0.0)
        return
    w, w2 = gamma * lam, gamma * (critic_lam if decoupled else lam)
    powers, powers2 = _powers(w), _powers(w2)
    S = np.empty(CONSTANT_FIELDS * WINDOW)
    finite = np.empty(LANES, dtype=np.bool_)
    c, c2 = 0.0, 0.0
    end = hi
    while end > lo:
        start = end - WINDOW
        first = max(lo - start, 0)
        for i in range(first):
            S[_D + np.uint64(i)] = 0.0
        for i in range(first, WINDOW - 1):
            t = np.uint64(start + i)
            S[_D + np.uint64(i)] = (np.float64(rewards[t]) + gamma * np.float64(values[t + np.uint64(1)])
                                    - np.float64(values[t]))
        t = end - 1
        if end == hi:  # the segment's last step: its bootstrap value and incoming advantage
            entering = _at(carry, first_segment)
            S[_D + np.uint64(WINDOW - 1)] = (np.float64(rewards[t]) + gamma * np.float64(bootstrap[first_segment])
                                            - np.float64(values[t]) + (w * entering if w != 0.0 else 0.0))
        else:
            S[_D + np.uint64(WINDOW - 1)] = (np.float64(rewards[t]) + gamma * np.float64(values[t + 1])
                                            - np.float64(values[t]))
        finite[:] = True
        if decoupled:
            for i in range(WINDOW):
                S[_D2 + np.uint64(i)] = S[_D + np.uint64(i)]
            _advance_constant(S, w2, _D2, finite)
        _advance_constant(S, w, _D, finite)
        for k in range(LANES - 1, -1, -1):
            lane_lo, lane_hi = max(k * LANE, first), (k + 1) * LANE
            if lane_lo >= lane_hi:
                break
            if finite[k] and math.isfinite(c + c2):
                base = k * LANE
                for j in range(lane_lo - base, LANE):
                    i = np.uint64(j)  # unsigned indices: no negative-index test, so the loop vectorises
                    u = np.uint64(base + j)
                    t = np.uint64(start + base + j)
                    a = S[_D + u] + powers[i] * c
                    critic = S[_D2 + u] + powers2[i] * c2 if decoupled else a
                    advantages[t] = a
                    returns[t] = critic + np.float64(values[t])
                u = np.uint64(lane_lo)
                c, c2 = (S[_D + u] + powers[lane_lo - base] * c,
                         S[_D2 + u] + powers2[lane_lo - base] * c2 if decoupled else 0.0)
            else:
                next_value = np.float64(values[start + lane_hi]) if start + lane_hi < hi else 0.0
                _, c, c2 = walk(rewards, values, steps, bounds, fill_masked, advantages, returns, start + lane_lo,
                                start + lane_hi, next_value, c, c2 if decoupled else c)
                c2 = c2 if decoupled else 0.0
        end = start


# --- summaries of segments (pieces that live apart) and the scan ---------------------------------------------------


@njit(**_HELPER)
def summarize_segment(rewards, values, steps, offsets, segment, out):
    """A segment's five numbers (``gae_xp._pieces.FIELDS``) as if nothing came after it, into ``out``."""
    next_values, terminated, truncated, mask, gamma, lam, critic_lam = steps
    # The serial walk with nothing after the segment (b = 0, c = 0), carrying the derivatives of the running
    # values on b (the value after the segment) and on c (the advantage after it).
    next_value, on_value = 0.0, 1.0
    following, on_bootstrap, on_carry = 0.0, 0.0, 1.0
    for t in range(offsets[segment + 1] - 1, offsets[segment] - 1, -1):
        value = np.float64(values[t])
        g = _at(gamma, t)
        v_next = _at(next_values, t) if _present(next_values) else next_value
        ended = _flag(terminated, t)
        cut = ended or _flag(truncated, t)
        real = _real(mask, t)
        delta = (np.float64(rewards[t]) + (0.0 if ended else g * v_next) - value) if real else 0.0
        coefficient = (0.0 if cut else g * _at(lam, t)) if real else 1.0
        # d delta / d b: b reaches this step's Vnext only until a real step is met (on_value).
        entering = (0.0 if ended else g) * on_value if real and not _present(next_values) else 0.0
        if coefficient != 0.0:
            following = delta + coefficient * following
            on_bootstrap = entering + coefficient * on_bootstrap
            on_carry = coefficient * on_carry
            # Over a long segment these derivatives decay to subnormal numbers, where a product with gamma * lam
            # rounds back to the same subnormal forever and every multiply costs ~100 cycles (42 ns a step at
            # T=32768 against 3.4 at T=4096): below the smallest normal float64 they are 0.
            if abs(on_carry) < _SMALLEST_NORMAL:
                on_carry = 0.0
            if abs(on_bootstrap) < _SMALLEST_NORMAL:
                on_bootstrap = 0.0
        else:
            following, on_bootstrap, on_carry = delta, entering, 0.0
        if real:
            next_value, on_value = value, 0.0
    out[0], out[1], out[2], out[3], out[4] = next_value, on_value, following, on_bootstrap, on_carry


@njit(**_HELPER)
def scan_row(x, a, reverse, out):
    """``out_t = x_t + a_t out_{t+1}`` (reverse) or ``out_{t-1}`` along one row; a float ``a`` is every a_t."""
    length = x.shape[0]
    state = 0.0
    for i in range(length):
        t = length - 1 - i if reverse else i
        coefficient = _at(a, t)
        state = np.float64(x[t]) + (coefficient * state if coefficient != 0.0 else 0.0)
        out[t] = state


# --- drivers: the work units first .. stop - 1 of a call ---------------------------------------------------------


def _flag_row(flags, row):
    """Row ``row`` of a (rows, T) flag array, or the single row of a (1, T) one that stands for every row (an absent
    ``terminated`` or ``truncated``: ``gae_xp.backends.numba_cpu.no_flags``); None stays None."""


@overload(_flag_row, inline="always")
def _flag_row_overload(flags, row):
    if isinstance(flags, types.NoneType):
        return lambda flags, row: flags
    return lambda flags, row: _borrowed_row(flags, min(row, flags.shape[0] - 1))


# The row helpers below (and ``_row``, ``_flag_row``) are inlined into the drivers at numba's IR level: the row views
# are then made in the driver's own loop; without it a kernel of many short rows ran 1.5-1.7x slower (B=256, T=4,
# one thread), and its first call did not compile faster.
@njit(inline="always", **_HELPER)
def _row_steps(steps, row):
    next_values, terminated, truncated, mask, gamma, lam, critic_lam = steps
    return (_row(next_values, row), _flag_row(terminated, row), _flag_row(truncated, row), _row(mask, row),
            _row(gamma, row), _row(lam, row), _row(critic_lam, row))


@njit(inline="always", **_HELPER)
def _span(rewards, values, steps, bounds, fill_masked, advantages, returns, spans, unit):
    """The arguments of a span solver for work unit ``unit``: row ``unit // runs``, segments ``spans[k]`` to
    ``spans[k + 1]`` with ``k = unit % runs`` (``runs = len(spans) - 1``)."""
    runs = spans.shape[0] - 1
    row = unit // runs
    k = unit - row * runs
    bootstrap, carry, offsets = bounds
    return (_row(rewards, row), _row(values, row), _row_steps(steps, row),
            (_row(bootstrap, row), _row(carry, row), offsets), fill_masked, _row(advantages, row), _row(returns, row),
            spans[k], spans[k + 1])


@njit(**_COMPILED)
def general_units(rewards, values, steps, bounds, fill_masked, advantages, returns, spans, first, stop):
    for unit in range(first, stop):
        solve_span(*_span(rewards, values, steps, bounds, fill_masked, advantages, returns, spans, unit))


@njit(**_COMPILED)
def constant_units(rewards, values, steps, bounds, fill_masked, advantages, returns, spans, first, stop):
    for unit in range(first, stop):
        solve_span_constant(*_span(rewards, values, steps, bounds, fill_masked, advantages, returns, spans, unit))


@njit(**_COMPILED)
def walk_units(rewards, values, steps, bounds, fill_masked, advantages, returns, spans, first, stop):
    """Rows shorter than a window: each unit's span walked, as ``solve_span`` walks it (the same numbers), by a
    driver that compiles nothing else: a third of the window kernels' compiling on a cold cache."""
    for unit in range(first, stop):
        row_rewards, row_values, row_steps, row_bounds, fill, row_advantages, row_returns, first_segment, \
            last_segment = _span(rewards, values, steps, bounds, fill_masked, advantages, returns, spans, unit)
        offsets = row_bounds[2]
        walk(row_rewards, row_values, row_steps, row_bounds, fill, row_advantages, row_returns, offsets[first_segment],
             offsets[last_segment], 0.0, 0.0, 0.0)


@njit(inline="always", **_HELPER)
def _summary_unit(rewards, values, steps, offsets, out, unit):
    n_segments = offsets.shape[0] - 1
    row = unit // n_segments
    segment = unit - row * n_segments
    summarize_segment(_row(rewards, row), _row(values, row), _row_steps(steps, row), offsets, segment,
                      out[row, segment])


@njit(**_COMPILED)
def summarize_units(rewards, values, steps, offsets, out, first, stop):
    for unit in range(first, stop):
        _summary_unit(rewards, values, steps, offsets, out, unit)


@njit(**_COMPILED)
def scan_units(x, a, reverse, out, first, stop):
    for row in range(first, stop):
        scan_row(_row(x, row), _row(a, row), reverse, _row(out, row))
