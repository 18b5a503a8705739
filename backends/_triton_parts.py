"""The Triton functions that every kernel of the Triton route shares (``_triton_gae``, ``_triton_scan``).

A run of steps of the recurrence ``y_t = x_t + a_t y_next`` is the affine map
``y -> x + a y`` of what enters it; two neighbouring runs compose into one
(``compose``), which is what ``tl.associative_scan`` scans. A zero
coefficient cuts exactly: the product with the value beyond it is chosen
away (``tl.where``), never computed, so an inf or NaN beyond a cut cannot
leak (``0 * inf`` is NaN).
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
def lane(x, lanes, position):
    """The value of ``x`` in the lane at ``position`` (a scalar), reading no other lane's value."""
    return tl.sum(tl.where(lanes == position, x, 0.0), axis=0)
