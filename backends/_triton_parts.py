"""The Triton functions that every kernel of the Triton route shares (``_triton_gae``, ``_triton_scan``).

A run of steps of the recurrence ``y_t = x_t + a_t y_next`` is the affine map
``y -> x + a y`` of what enters it; two neighbouring runs compose into one
(``compose``), which is what ``tl.associative_scan`` scans. A zero
coefficient cuts exactly: the product with the value beyond it is chosen
away (``tl.where``), never computed, so an inf or NaN beyond a cut cannot
leak (``0 * inf`` is NaN).

Exactness costs a compare and a select per composition. ``solve_block``
first scans with the plain composition (``affine``: one fused multiply-add),
which differs from the exact one only where a zero coefficient meets an inf
or a NaN beyond it, and then only by a NaN; a block whose result holds a NaN
is scanned again exactly. A block of finite numbers is scanned once.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def compose(first_coefficient, first_value, second_coefficient, second_value):
    """The map of two neighbouring runs of steps, ``second`` applied last (the nearer one in the scan's order):
    ``y -> second_value + second_coefficient (first_value + first_coefficient y)``, a zero coefficient cutting
    exactly."""
    carried = tl.where(second_coefficient != 0.0, second_coefficient * first_value, 0.0)
    return first_coefficient * second_coefficient, second_value + carried


@triton.jit
def affine(first_coefficient, first_value, second_coefficient, second_value):
    """``compose`` without the exact cut: ``0 * inf`` and ``0 * NaN`` beyond a zero coefficient give NaN."""
    return first_coefficient * second_coefficient, second_value + second_coefficient * first_value


@triton.jit
def at(array, base, steps, stride, CONTIGUOUS: tl.constexpr, AHEAD: tl.constexpr = 0):
    """The address of the element of step ``steps + AHEAD`` in a row starting at ``array + base``: ``steps`` apart
    where the time axis is contiguous (``AHEAD`` added last, so that the address of the step after shares the
    step's), else ``steps * stride`` (a 64-bit product: both may be 32-bit, their product not)."""
    if CONTIGUOUS:
        address = array + base + steps + AHEAD
    else:
        address = array + base + (steps + AHEAD).to(tl.int64) * stride
    return address


@triton.jit
def lane(x, lanes, position):
    """The value of ``x`` in the lane at ``position`` (a scalar), reading no other lane's value."""
    return tl.sum(tl.where(lanes == position, x, 0.0), axis=0)


@triton.jit
def solve_block(coefficient, x, entering, lanes, position, REVERSE: tl.constexpr, RARE_PATHS: tl.constexpr):
    """One block of ``y_t = x_t + a_t y_next`` entered by ``entering`` (the carry from the block walked before):
    (``y``, the products of the coefficients from each lane to the block's edge, ``y`` in the lane at
    ``position``), every zero coefficient a cut.

    The plain scan (``affine``) runs first. The lane's value is read by a sum that also takes ``y * 0`` of every
    other lane (NaN where ``y`` is a NaN or an inf, else 0), so one reduction both reads the carry and says
    whether the exact scan (``compose``) must run. ``RARE_PATHS`` False leaves the exact scan out: only the
    instruction counts compile that (``tools.cost_model``), to count the path a block of finite numbers takes."""
    products, local = tl.associative_scan((coefficient, x), 0, affine, reverse=REVERSE)
    y = local + products * entering
    probe = tl.sum(tl.where(lanes == position, y, y * 0.0), axis=0)
    if RARE_PATHS and probe != probe:  # a NaN or an inf: the block's own, or a cut's 0 * inf; the exact scan decides
        products, local = tl.associative_scan((coefficient, x), 0, compose, reverse=REVERSE)
        carried = tl.where(products == 0, 0.0, products * entering)
        y = local + tl.where(entering == 0, 0.0, carried)
        probe = lane(y, lanes, position)
    return y, products, probe
