r"""Triton kernels of the Triton route besides GAE's forward: the scan, the adjoint (backward) and the estimators.

One program per row walks the row block by block (``BLOCK`` steps, the
number of blocks a run-time value: see "Compilation" below), keeps the
carry between blocks in registers, and solves each block's affine maps
``y -> x_t + a_t y`` with ``tl.associative_scan`` on (coefficient, x) pairs.
Where two maps compose, a zero coefficient cuts exactly: the product with
the value beyond it is chosen away (``tl.where``), never computed, so an
inf or NaN beyond a cut cannot leak (``0 * inf`` is NaN). Arrays are read
in place through their strides (a (..., T) array as (rows, T): a view
unless its batch axes cannot merge); float16 and bfloat16 are computed in
float32, float64 in float64; bool flags are read as bytes.

Compilation: a kernel is specialised on the options present, the dtype, the
block size (``_block``: the row's power of two up to ``SHORT_ROWS`` steps,
``LONG_BLOCK`` beyond) and Triton's own specialisation of integer arguments
(T and the strides: 1, a multiple of 16, or neither). That last one is what
lets the compiler prove 16-byte alignment and issue 16-byte loads and
stores; a hint inside the kernel (``tl.multiple_of`` on a scalar argument)
does not reach the vectoriser in Triton 3.9. So a new T or layout compiles
nothing new unless it changes one of those classes (T = 1000 after T = 1500
compiles nothing; T = 1024 after them compiles the aligned variant once).

* ``scan(x, a, reverse=...)``: ``y_t = x_t + a_t y_{t+1}`` (reverse) or
  ``y_{t-1}`` (forward), ``a`` a float or an array broadcastable to x.
* ``gae_backward``: the adjoint of GAE's reverse scan, a forward scan of the
  upstream gradients with the same coefficients, cut at the same places
  (``gae_xp.backends._numba_backward`` derives it)::

      phi_t = gA_t + gR_t + c_{t-1} phi_{t-1},   g_delta_t = phi_t (real steps; 0 at masked ones)
      g_rewards_t = g_delta_t,   g_values_t = gR_t - g_delta_t + L_{p(t)},   g_next_values_t = b_t
      b_t = gamma_t (1 - terminated_t) g_delta_t,   L_{p(t)}: b at the previous real step of the segment
      g_bootstrap = b at the segment's last real step,   g_carry = c_last phi_last

  With ``critic_lam`` one such pass per chain, summed.
* ``solve_discounted_returns``, ``solve_lambda_returns``, ``solve_vtrace``:
  one reverse pass each; "V at the next real step" and "is there a real step
  after t" are scans of their own in the same pass, and a value of the next
  step comes from the block's scan shifted by one lane (``tl.gather``), the
  lane at the block's edge from the carry.

Packed sequences (``offsets``): each step finds its segment by a binary
search of the offsets (``ceil(log2(n + 1))`` loads); a segment's last step
takes its bootstrap value and cuts. Device offsets that nobody read are
checked on the device first (``gae_xp._prepare.guarded_offsets``); where
they break the contract every output is NaN.

These functions take a ``GaeProblem`` (or tensors) of torch tensors, CUDA
ones on a GPU; with ``TRITON_INTERPRET=1`` set before triton is imported,
the same kernels run on CPU tensors. ``gae_backward`` also takes the fake
tensors of a trace (``torch.compile``, ``opcheck``): it reads no value on
the host, and launches through ``torch.library.wrap_triton`` there.
"""

from __future__ import annotations

import contextlib
import math

import torch
import triton
import triton.language as tl
from torch.library import wrap_triton

from gae_xp._compat import torch_is_recorded
from gae_xp._prepare import guarded_offsets
from gae_xp._problem import fill_invalid

from ._triton_launch import on_device
from ._triton_parts import at as _at
from ._triton_parts import compose as _compose
from ._triton_parts import lane as _lane
from ._triton_parts import solve_block as _solve_block

#: The reverse-in-time families of ``_reverse_rows``.
RETURNS, LAMBDA, VTRACE = 0, 1, 2
#: Rows up to this many steps are scanned in one block of the next power of two (at least 16); longer rows stream
#: blocks of ``LONG_BLOCK``. Few block sizes, so few compilations: a new T inside a size class compiles nothing.
SHORT_ROWS = 256
LONG_BLOCK = 1024


# --- pieces shared by the kernels ----------------------------------------------------------------------------------


@triton.jit
def _enter(product, local, carry):
    """A block's scan entered by the carry from the block before it: ``local + product carry``, cut exactly."""
    return local + tl.where(product != 0.0, product * carry, 0.0)


@triton.jit
def _from_neighbour(x, lanes, carried, REVERSE: tl.constexpr, BLOCK: tl.constexpr):
    """Each lane's neighbour in the recurrence's order (lane + 1 if ``REVERSE``, lane - 1 if not); the lane at the
    block's edge takes ``carried``, the value that the previous block left."""
    if REVERSE:
        shifted = tl.gather(x, tl.minimum(lanes + 1, BLOCK - 1), 0)
        edge = lanes == BLOCK - 1
    else:
        shifted = tl.gather(x, tl.maximum(lanes - 1, 0), 0)
        edge = lanes == 0
    return tl.where(edge, carried, shifted)


@triton.jit
def _compute(x, WIDE: tl.constexpr):
    if WIDE:
        out = x.to(tl.float64)
    else:
        out = x.to(tl.float32)
    return out


@triton.jit
def _scalar(value, WIDE: tl.constexpr):
    """A float argument (float64) as a scalar of the compute dtype."""
    return _compute(tl.full((), 0.0, tl.float64) + value, WIDE)


@triton.jit
def _zero(WIDE: tl.constexpr):
    """A scalar 0 in the compute dtype (a loop-carried value keeps one type)."""
    if WIDE:
        out = tl.full((), 0.0, tl.float64)
    else:
        out = tl.full((), 0.0, tl.float32)
    return out


@triton.jit
def _floats(pointer, base, time_stride, steps, inside, WIDE: tl.constexpr):
    return _compute(tl.load(_at(pointer, base, steps, time_stride, False), mask=inside, other=0.0), WIDE)


@triton.jit
def _flags(pointer, base, time_stride, steps, inside, PRESENT: tl.constexpr):
    """A bool flag per step (read as bytes); False where absent."""
    if PRESENT:
        out = tl.load(_at(pointer, base, steps, time_stride, False), mask=inside, other=0) != 0
    else:
        out = steps < 0
    return out


@triton.jit
def _coefficient(pointer, base, time_stride, steps, inside, scalar, STEPS: tl.constexpr, WIDE: tl.constexpr):
    """A coefficient per step: read from its array (``STEPS``) or the scalar for every step."""
    if STEPS:
        out = _floats(pointer, base, time_stride, steps, inside, WIDE)
    else:
        out = tl.zeros(steps.shape, tl.float64 if WIDE else tl.float32) + _scalar(scalar, WIDE)
    return out


@triton.jit
def _segments(offsets, segments, search_steps, steps):
    """(segment, first, last) per step of packed sequences: its segment's index (a binary search of the offsets)
    and whether it is the segment's first or last step."""
    low = tl.zeros_like(steps)
    high = low + (segments - 1)
    for _ in range(search_steps):  # the largest k with offsets[k] <= t (offsets[0] = 0 <= t always)
        middle = (low + high + 1) // 2
        below = tl.load(offsets + middle).to(tl.int32) <= steps
        low = tl.where(below, middle, low)
        high = tl.where(below, high, middle - 1)
    first = steps == tl.load(offsets + low).to(tl.int32)
    last = steps == tl.load(offsets + low + 1).to(tl.int32) - 1
    return low, first, last


@triton.jit
def _one_segment(steps, length):
    """(segment, first, last) per step of a row that is one segment."""
    return tl.zeros_like(steps), steps == 0, steps == length - 1


@triton.jit
def _step_flags(steps, length, row, terminated, truncated, mask, terminated_row, terminated_time, truncated_row,
                truncated_time, mask_row, mask_time, HAS_TERMINATED: tl.constexpr, HAS_TRUNCATED: tl.constexpr,
                HAS_MASK: tl.constexpr):
    """What every reverse and adjoint kernel knows of its block's steps besides their segments (``_segments``):
    inside the row, terminated, cut (terminated or truncated), real (unmasked).

    Kept apart from ``_segments`` for torch's mutation analysis (``torch.library.triton_op``): it counts every
    pointer given to a called function whose result addresses a store as written, and the segment addresses the
    per-segment gradients; the flags, given here, are then never copied as if written."""
    inside = steps < length
    ended = _flags(terminated, row * terminated_row, terminated_time, steps, inside, HAS_TERMINATED)
    cut = ended | _flags(truncated, row * truncated_row, truncated_time, steps, inside, HAS_TRUNCATED)
    if HAS_MASK:
        real = _flags(mask, row * mask_row, mask_time, steps, inside, True)
    else:
        real = inside
    return inside, ended, cut, real


@triton.jit
def _scan_rows(out, x, a, coefficient: tl.float64, length, x_row, x_time, a_row, a_time,
               REVERSE: tl.constexpr, STEPS: tl.constexpr, WIDE: tl.constexpr,
               BLOCK: tl.constexpr, RARE_PATHS: tl.constexpr):
    """``y_t = x_t + a_t y_{t+1}`` (``REVERSE``) or ``y_{t-1}`` along one row per program."""
    row = tl.program_id(0).to(tl.int64)
    lanes = tl.arange(0, BLOCK)
    x_base, a_base, out_base = row * x_row, row * a_row, row * length
    carry = _zero(WIDE)
    blocks = tl.cdiv(length, BLOCK)
    for i in range(0, blocks):
        start = ((blocks - 1 - i) if REVERSE else i) * BLOCK
        steps = start + lanes
        inside = steps < length
        values = _floats(x, x_base, x_time, steps, inside, WIDE)
        coefficients = tl.where(inside, _coefficient(a, a_base, a_time, steps, inside, coefficient, STEPS, WIDE), 0.0)
        y, _, carry = _solve_block(coefficients, values, carry, lanes, 0 if REVERSE else BLOCK - 1, REVERSE, RARE_PATHS)
        tl.store(out + out_base + steps, y, mask=inside)


@triton.jit(do_not_specialize=["segments", "search_steps"])
def _adjoint_rows(on_rewards, on_values, on_next_values, on_bootstrap, on_carry,
                  grad_advantages, grad_returns, terminated, truncated, mask, gamma_steps, lam_steps, offsets,
                  gamma: tl.float64, lam: tl.float64, length, segments, search_steps,
                  grads_row, grads_time, returns_row, returns_time, terminated_row, terminated_time,
                  truncated_row, truncated_time, mask_row, mask_time, gamma_row, gamma_time, lam_row, lam_time,
                  HAS_ADVANTAGES: tl.constexpr, HAS_RETURNS: tl.constexpr, HAS_NEXT: tl.constexpr,
                  HAS_CARRY: tl.constexpr, HAS_TERMINATED: tl.constexpr, HAS_TRUNCATED: tl.constexpr,
                  HAS_MASK: tl.constexpr, GAMMA_STEPS: tl.constexpr, LAM_STEPS: tl.constexpr,
                  HAS_OFFSETS: tl.constexpr, FILL: tl.constexpr, WIDE: tl.constexpr,
                  BLOCK: tl.constexpr):
    """The adjoint of GAE's reverse scan for one row per program, forward in time (see the module docstring)."""
    row = tl.program_id(0).to(tl.int64)
    lanes = tl.arange(0, BLOCK)
    out_base = row * length
    flow = _zero(WIDE)  # phi at the previous block's last step
    into = _zero(WIDE)  # the coefficient that carries it into this block's first step
    pending = _zero(WIDE)  # b at the latest real step so far in the segment
    for i in range(0, tl.cdiv(length, BLOCK)):
        steps = i * BLOCK + lanes
        if HAS_OFFSETS:  # without offsets, no call is given their stand-in pointer (see _step_flags)
            segment, first, last = _segments(offsets, segments, search_steps, steps)
        else:
            segment, first, last = _one_segment(steps, length)
        inside, ended, cut, real = _step_flags(
            steps, length, row, terminated, truncated, mask, terminated_row, terminated_time, truncated_row,
            truncated_time, mask_row, mask_time, HAS_TERMINATED, HAS_TRUNCATED, HAS_MASK)
        kept = (real | FILL) & inside
        g = _coefficient(gamma_steps, row * gamma_row, gamma_time, steps, inside, gamma, GAMMA_STEPS,
                         WIDE)
        w = g * _coefficient(lam_steps, row * lam_row, lam_time, steps, inside, lam, LAM_STEPS, WIDE)
        upstream = tl.zeros_like(w)
        if HAS_ADVANTAGES:
            upstream += tl.where(kept, _floats(grad_advantages, row * grads_row, grads_time, steps,
                                               inside, WIDE), 0.0)
        on_return = tl.zeros_like(w)
        if HAS_RETURNS:
            on_return = tl.where(kept, _floats(grad_returns, row * returns_row, returns_time, steps,
                                               inside, WIDE), 0.0)
            upstream += on_return
        leaving = tl.where(real, tl.where(cut, 0.0, w), 1.0)  # the coefficient into the next step
        entering = tl.where(first, 0.0, _from_neighbour(leaving, lanes, into, False, BLOCK))
        product, local = tl.associative_scan((entering, upstream), 0, _compose)
        phi = _enter(product, local, flow)
        on_delta = tl.where(real, phi, 0.0)
        bootstrapped = tl.where(real & ~ended, g * on_delta, 0.0)
        tl.store(on_rewards + out_base + steps, on_delta, mask=inside)
        if HAS_NEXT:
            tl.store(on_next_values + out_base + steps, bootstrapped, mask=inside)
            tl.store(on_values + out_base + steps, on_return - on_delta, mask=inside)
        else:
            # b at the latest real step up to t, reset at each segment's start; V_t gets it from the step before t.
            keep = tl.where(real | first, 0.0, 1.0)
            held_product, held = tl.associative_scan((keep, bootstrapped), 0, _compose)
            latest = _enter(held_product, held, pending)
            before = tl.where(first, 0.0, _from_neighbour(latest, lanes, pending, False, BLOCK))
            tl.store(on_values + out_base + steps, on_return - on_delta + tl.where(real, before, 0.0), mask=inside)
            tl.store(on_bootstrap + row * segments + segment, latest, mask=last & inside)
            pending = _lane(latest, lanes, BLOCK - 1)
        if HAS_CARRY:
            tl.store(on_carry + row * segments + segment, tl.where(leaving != 0.0, leaving * phi, 0.0),
                     mask=last & inside)
        flow = _lane(phi, lanes, BLOCK - 1)
        into = _lane(leaving, lanes, BLOCK - 1)


@triton.jit(do_not_specialize=["segments", "search_steps"])
def _reverse_rows(first_out, second_out, rewards, values, following, log_rhos, terminated, truncated, mask,
                  gamma_steps, lam_steps, bootstrap, offsets,
                  gamma: tl.float64, lam: tl.float64, clip_rho: tl.float64, clip_c: tl.float64, clip_pg: tl.float64,
                  length, segments, search_steps,
                  rewards_row, rewards_time, values_row, values_time, following_row, following_time,
                  rhos_row, rhos_time, terminated_row, terminated_time, truncated_row, truncated_time,
                  mask_row, mask_time, gamma_row, gamma_time, lam_row, lam_time, bootstrap_row, bootstrap_segment,
                  FAMILY: tl.constexpr, HAS_NEXT: tl.constexpr, HAS_TERMINATED: tl.constexpr,
                  HAS_TRUNCATED: tl.constexpr, HAS_MASK: tl.constexpr, GAMMA_STEPS: tl.constexpr,
                  LAM_STEPS: tl.constexpr, HAS_OFFSETS: tl.constexpr, HAS_BOOTSTRAP: tl.constexpr,
                  WIDE: tl.constexpr, BLOCK: tl.constexpr, RARE_PATHS: tl.constexpr):
    """Discounted returns, lambda-returns or V-trace (``FAMILY``) of one row per program, from its last block."""
    row = tl.program_id(0).to(tl.int64)
    lanes = tl.arange(0, BLOCK)
    out_base = row * length
    carry = _zero(WIDE)  # the solution at the first step of the block after this one
    ahead = _zero(WIDE)  # the side chain there: V at the next real step (V-trace), a real step ahead (lambda)
    blocks = tl.cdiv(length, BLOCK)
    for i in range(0, blocks):
        steps = (blocks - 1 - i) * BLOCK + lanes
        if HAS_OFFSETS:  # without offsets, no call is given their stand-in pointer (see _step_flags)
            segment, first, last = _segments(offsets, segments, search_steps, steps)
        else:
            segment, first, last = _one_segment(steps, length)
        inside, ended, cut, real = _step_flags(
            steps, length, row, terminated, truncated, mask, terminated_row, terminated_time, truncated_row,
            truncated_time, mask_row, mask_time, HAS_TERMINATED, HAS_TRUNCATED, HAS_MASK)
        g = _coefficient(gamma_steps, row * gamma_row, gamma_time, steps, inside, gamma, GAMMA_STEPS,
                         WIDE)
        r = tl.where(real, _floats(rewards, row * rewards_row, rewards_time, steps, inside, WIDE), 0.0)
        if HAS_BOOTSTRAP:
            boundary = _compute(tl.load(_at(bootstrap, row * bootstrap_row, segment, bootstrap_segment, False),
                                        mask=last & inside, other=0.0), WIDE)
        else:
            boundary = tl.zeros_like(r)
        if FAMILY == 0:  # RETURNS: G_t = r_t + gamma_t (1 - done_t) G_{t+1}, the bootstrap after a segment
            coefficient = tl.where(real, tl.where(cut, 0.0, g), 1.0)
            x = r + tl.where(last & (coefficient != 0.0), coefficient * boundary, 0.0)
        elif FAMILY == 1:  # LAMBDA: cut at a done step and at the segment's last real step, bootstrapped by V'
            lam_t = _coefficient(lam_steps, row * lam_row, lam_time, steps, inside, lam, LAM_STEPS, WIDE)
            seen = _compute(tl.where(real, 1.0, 0.0), WIDE)  # a real step at or after t in the segment
            seen_product, seen_local = tl.associative_scan((tl.where(real | last, 0.0, 1.0), seen), 0, _compose,
                                                           reverse=True)
            seen = _enter(seen_product, seen_local, ahead)
            after = tl.where(last, 0.0, _from_neighbour(seen, lanes, ahead, True, BLOCK))
            ahead = _lane(seen, lanes, 0)
            stop = cut | (real & (after == 0.0))
            kept = tl.where(stop, 0.0, 1.0)
            bootstrapped = tl.where(real, _floats(following, row * following_row, following_time,
                                                  steps, inside, WIDE), 0.0)
            x = tl.where(real, r + tl.where(ended, 0.0, g * (1.0 - lam_t * kept) * bootstrapped), 0.0)
            w = g * lam_t
            coefficient = tl.where(real, tl.where(stop, 0.0, w), 1.0)
        else:  # VTRACE
            lam_t = _coefficient(lam_steps, row * lam_row, lam_time, steps, inside, lam, LAM_STEPS, WIDE)
            v = tl.where(real, _floats(values, row * values_row, values_time, steps, inside, WIDE), 0.0)
            if HAS_NEXT:
                next_value = _floats(following, row * following_row, following_time, steps, inside,
                                     WIDE)
            else:  # V at the next real step of the segment, else its bootstrap value
                latest_product, latest_local = tl.associative_scan(
                    (tl.where(real | last, 0.0, 1.0), tl.where(real, v, tl.where(last, boundary, 0.0))), 0, _compose,
                    reverse=True)
                latest = _enter(latest_product, latest_local, ahead)
                next_value = tl.where(last, boundary, _from_neighbour(latest, lanes, ahead, True, BLOCK))
                ahead = _lane(latest, lanes, 0)
            rho = tl.exp(tl.where(real, _floats(log_rhos, row * rhos_row, rhos_time, steps, inside, WIDE),
                                  0.0))
            x = tl.where(real, tl.minimum(rho, _scalar(clip_rho, WIDE))
                         * (r + tl.where(ended, 0.0, g * next_value) - v), 0.0)
            coefficient = tl.where(real, tl.where(cut, 0.0, g * lam_t * tl.minimum(rho, _scalar(clip_c, WIDE))), 1.0)
        coefficient = tl.where(last | ~inside, 0.0, coefficient)
        y, _, entering = _solve_block(coefficient, x, carry, lanes, 0, True, RARE_PATHS)
        if FAMILY == 2:
            following_correction = tl.where(last | cut, 0.0, _from_neighbour(y, lanes, carry, True, BLOCK))
            vs_next = next_value + following_correction
            pg = tl.minimum(rho, _scalar(clip_pg, WIDE)) * (r + tl.where(ended, 0.0, g * vs_next) - v)
            tl.store(first_out + out_base + steps, tl.where(real, y + v, 0.0), mask=inside)
            tl.store(second_out + out_base + steps, tl.where(real, pg, 0.0), mask=inside)
        else:
            tl.store(first_out + out_base + steps, tl.where(real, y, 0.0), mask=inside)
        carry = entering


# --- the host side -------------------------------------------------------------------------------------------------


def scan(x, a, *, reverse: bool):
    """``y_t = x_t + a_t y_{t+1}`` (``reverse``) or ``y_{t-1}`` along the last axis of a torch tensor.

    ``a`` is a Python float or a tensor broadcastable to x. Returns a new
    tensor shaped like x, in x's dtype (computed in float32, or float64 for
    float64 x); x and a are never written.
    """
    shape = tuple(x.shape)
    out = torch.empty(shape, dtype=x.dtype, device=x.device)
    rows, length = math.prod(shape[:-1]), shape[-1] if shape else 1
    if rows == 0 or length == 0:
        return out
    values = _rows(x, rows, length)
    steps = not isinstance(a, float)
    coefficients = _rows(torch.broadcast_to(a, shape), rows, length) if steps else values
    block = _block(length)
    with on_device(x.device):
        _scan_rows[(rows,)](out, values, coefficients, 0.0 if steps else a, length, *_strides(values),
                            *_strides(coefficients), REVERSE=reverse, STEPS=steps, WIDE=_wide(x.dtype), BLOCK=block,
                            RARE_PATHS=True, num_warps=_warps(block))
    return out


def gae_backward(problem, grad_advantages, grad_returns) -> dict:
    """The gradients of ``gae(problem)``'s (advantages, returns) to its inputs, given theirs (either may be None:
    no gradient from that output).

    Returns ``{"rewards", "values", "next_values", "bootstrap", "carry"}``,
    each shaped like the problem's array (time last; ``next_values`` and
    ``carry`` None when the problem has none), the per-step ones in the
    problem's dtype, the bootstrap's and the carry's in the compute dtype:
    the contract of ``numba_cuda.NumbaCUDABackend.gae_backward``. Per-step
    gamma and lam are coefficients: they get no gradient. With
    ``critic_lam`` the two chains are two passes, summed.
    """
    p = problem
    if p.critic_lam is not None:
        first = gae_backward(p.replace(critic_lam=None), grad_advantages, None)
        second = gae_backward(p.replace(lam=p.critic_lam, critic_lam=None), None, grad_returns)
        return {name: None if first[name] is None else first[name] + second[name] for name in first}
    p, valid = _guarded(p)
    r = p.rewards
    shape = tuple(r.shape)
    rows, length = math.prod(shape[:-1]), shape[-1]
    count = _segment_count(p)
    compute = _compute_dtype(r.dtype)
    empty = {name: torch.empty(shape, dtype=r.dtype, device=r.device) for name in ("rewards", "values")}
    grads = {**empty, "next_values": None if p.next_values is None else torch.empty_like(empty["rewards"]),
             "bootstrap": torch.zeros((rows, count), dtype=compute, device=r.device),
             "carry": None if p.carry is None else torch.zeros((rows, count), dtype=compute, device=r.device)}
    if rows and length:
        upstream = [None if g is None else _rows(torch.broadcast_to(g, shape), rows, length)
                    for g in (grad_advantages, grad_returns)]
        flags = [_flag_rows(f, rows, length) for f in (p.terminated, p.truncated, p.mask)]
        coefficients = [_coefficient_rows(c, rows, length) for c in (p.gamma, p.lam)]
        arrays = [*upstream, *flags, *coefficients]
        written = [grads[name] for name in ("rewards", "values", "next_values", "bootstrap", "carry")]
        block = _block(length)
        traced = torch_is_recorded(r)  # torch.compile, opcheck: the launch goes into the graph
        with contextlib.nullcontext() if traced else on_device(r.device):
            (wrap_triton(_adjoint_rows) if traced else _adjoint_rows)[(rows,)](
                *(_or(a, r) for a in written), *(_or(a, r) for a in arrays), _offsets(p, r),
                *(c if isinstance(c, float) else 0.0 for c in (p.gamma, p.lam)), length, count,
                int(count).bit_length(),
                *(s for a in arrays for s in _strides(a)),
                HAS_ADVANTAGES=upstream[0] is not None, HAS_RETURNS=upstream[1] is not None,
                HAS_NEXT=p.next_values is not None, HAS_CARRY=p.carry is not None,
                HAS_TERMINATED=flags[0] is not None, HAS_TRUNCATED=flags[1] is not None, HAS_MASK=flags[2] is not None,
                GAMMA_STEPS=coefficients[0] is not None, LAM_STEPS=coefficients[1] is not None,
                HAS_OFFSETS=p.offsets is not None, FILL=bool(p.fill_masked), WIDE=_wide(r.dtype), BLOCK=block,
                num_warps=_warps(block))
    grads["bootstrap"] = grads["bootstrap"].reshape(tuple(p.bootstrap.shape))
    if p.carry is not None:
        grads["carry"] = grads["carry"].reshape(tuple(p.carry.shape))
    return {name: None if g is None else fill_invalid(torch, g, valid) for name, g in grads.items()}


def solve_discounted_returns(problem):
    """``gae_xp.discounted_returns`` of a prepared problem: ``G_t = r_t + gamma_t (1 - done_t) G_{t+1}``, G after a
    segment = its bootstrap value; masked steps are skipped and give 0."""
    return _reverse(RETURNS, problem)[0]


def solve_lambda_returns(problem):
    """``gae_xp.lambda_returns`` of a prepared problem (V' in ``problem.extra["next_values"]``)::

        G_t = r_t + gamma_t (1 - terminated_t) [(1 - lam_t) V'_t + lam_t G_{t+1}]

    with ``G_{t+1} := V'_t`` at a done step and at each segment's last real step; 0 at masked steps.
    """
    return _reverse(LAMBDA, problem, following=problem.extra["next_values"])[0]


def solve_vtrace(problem, *, clip_rho_threshold, clip_c_threshold, clip_pg_rho_threshold):
    """``gae_xp.vtrace`` of a prepared problem (log-ratios in ``problem.extra["log_rhos"]``): (vs, pg), each 0 at
    masked steps::

        delta_t = min(rho_t, clip_rho) (r_t + gamma_t (1 - terminated_t) Vnext_t - V_t)
        vs_t - V_t = delta_t + gamma_t (1 - done_t) lam_t min(rho_t, clip_c) (vs_{t+1} - V_{t+1})
        pg_t = min(rho_t, clip_pg) (r_t + gamma_t (1 - terminated_t) (Vnext_t + (vs - V) at the next real step) - V_t)
    """
    clips = (float(clip_rho_threshold), float(clip_c_threshold), float(clip_pg_rho_threshold))
    return _reverse(VTRACE, problem, following=problem.next_values, clips=clips)


def _reverse(family: int, problem, *, following=None, clips=(1.0, 1.0, 1.0)):
    """The outputs of ``_reverse_rows`` for a problem: one array (returns, lambda) or two (V-trace), shaped like
    the rewards, in their dtype."""
    p, valid = _guarded(problem)
    r = p.rewards
    shape = tuple(r.shape)
    rows, length = math.prod(shape[:-1]), shape[-1]
    outputs = [torch.empty(shape, dtype=r.dtype, device=r.device) for _ in range(2 if family == VTRACE else 1)]
    if rows == 0 or length == 0:
        return tuple(outputs)
    count = _segment_count(p)
    per_step = [_rows(r, rows, length)]
    per_step += [None if a is None else _rows(torch.broadcast_to(a, shape), rows, length)
                 for a in (p.values if family == VTRACE else None, following,
                           p.extra["log_rhos"] if family == VTRACE else None)]
    per_step += [_flag_rows(f, rows, length) for f in (p.terminated, p.truncated, p.mask)]
    per_step += [_coefficient_rows(c, rows, length) for c in (p.gamma, p.lam)]
    bootstrap = p.bootstrap if family != LAMBDA else None
    if bootstrap is not None:
        bootstrap = torch.broadcast_to(bootstrap, (*shape[:-1], count)).reshape(rows, count)
    block = _block(length)
    with on_device(r.device):
        _reverse_rows[(rows,)](
            outputs[0], outputs[-1], *(_or(a, r) for a in per_step), _or(bootstrap, r), _offsets(p, r),
            *(c if isinstance(c, float) else 0.0 for c in (p.gamma, p.lam)), *clips, length, count,
            count.bit_length(), *(s for a in per_step for s in _strides(a)),
            *((0, 0) if bootstrap is None else bootstrap.stride()),
            FAMILY=family, HAS_NEXT=following is not None, HAS_TERMINATED=per_step[4] is not None,
            HAS_TRUNCATED=per_step[5] is not None, HAS_MASK=per_step[6] is not None,
            GAMMA_STEPS=per_step[7] is not None, LAM_STEPS=per_step[8] is not None, HAS_OFFSETS=p.offsets is not None,
            HAS_BOOTSTRAP=bootstrap is not None, WIDE=_wide(r.dtype),
            BLOCK=block, RARE_PATHS=True, num_warps=_warps(block))
    return tuple(fill_invalid(torch, out, valid) for out in (outputs[:1] if family != VTRACE else outputs))


def _guarded(p):
    """(p, None) when its offsets were checked on the host or it has none; else (p with offsets the kernels can
    index by, valid): see ``gae_xp._prepare.guarded_offsets``."""
    if p.offsets is None or p.host_offsets is not None:
        return p, None
    offsets, valid = guarded_offsets(torch, p.offsets.to(torch.int64), p.rewards.shape[-1])
    return p.replace(offsets=offsets), valid


def _segment_count(p) -> int:
    return 1 if p.offsets is None else int(p.offsets.shape[0]) - 1


def _offsets(p, like):
    """The offsets as the kernels read them (int64; ``like`` stands in where there are none)."""
    return like if p.offsets is None else p.offsets.to(torch.int64)


def _rows(array, rows: int, length: int):
    """A (..., T) tensor as (rows, T): a view unless its batch axes cannot merge into one stride."""
    return array.reshape(rows, length)


def _flag_rows(flags, rows: int, length: int):
    """A bool flag tensor (or None) as (rows, T) bytes."""
    return None if flags is None else _rows(flags, rows, length).view(torch.uint8)


def _coefficient_rows(coefficient, rows: int, length: int):
    """A per-step coefficient (a tensor broadcastable to the rewards) as (rows, T), or None for a float: broadcast
    views stay views."""
    if isinstance(coefficient, float):
        return None
    return _rows(torch.broadcast_to(coefficient, (*coefficient.shape[:-1], length)), rows, length) \
        if math.prod(coefficient.shape[:-1]) == rows else torch.broadcast_to(coefficient, (rows, length))


def _strides(array) -> tuple[int, int]:
    """(row stride, time stride) of a (rows, T) tensor, (0, 0) for None."""
    return (0, 0) if array is None else tuple(array.stride())


def _or(array, stand_in):
    """The array, or a stand-in pointer where it is absent (the kernel never reads it)."""
    return stand_in if array is None else array


def _wide(dtype) -> bool:
    return dtype == torch.float64


def _compute_dtype(dtype):
    return torch.float64 if dtype == torch.float64 else torch.float32


def _block(length: int) -> int:
    """Steps per block: the whole row (a power of two, at least 16) up to ``SHORT_ROWS``, else ``LONG_BLOCK``."""
    return max(16, triton.next_power_of_2(length)) if length <= SHORT_ROWS else LONG_BLOCK


def _warps(block: int) -> int:
    return 8 if block >= LONG_BLOCK else 4
