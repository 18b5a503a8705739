r"""The problem a backend solves: one call's arrays, checked and laid out (time last, compute dtype).

This module is a leaf: it imports nothing of the package but ``_compat``, so
that the checks (``_prepare``), the recurrences, the piece algebra and every
backend can share the type without importing each other. The per-step
fields of a problem are listed once, in ``PER_STEP``; code that walks them
uses ``GaeProblem.steps`` and ``GaeProblem.map_steps``.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any, Callable

from ._compat import device_of, to_device

Array = Any

#: The per-step fields of a ``GaeProblem``, in this order: each None, a Python float (the coefficients only) or
#: an array shaped like ``rewards``. ``extra`` holds an estimator's further per-step arrays.
PER_STEP = ("rewards", "values", "next_values", "terminated", "truncated", "mask", "gamma", "lam", "critic_lam")
#: The per-step fields that are bool flags (the others are floats in the compute dtype).
FLAGS = ("terminated", "truncated", "mask")
#: The per-step fields that are coefficients: a Python float (one for every step) or an array.
COEFFICIENTS = ("gamma", "lam", "critic_lam")
#: The per-step arrays a call may leave out (None), in ``PER_STEP`` order: kernels are specialised on which are there.
OPTIONAL = tuple(name for name in PER_STEP if name not in ("rewards", "values", *COEFFICIENTS))


@dataclass(frozen=True)
class GaeProblem:
    """A ``gae()`` call (or an estimator's), checked and laid out for a backend.

    Every float array is in the compute dtype (float32 or float64), with time
    on the last axis; for a backend that reads float16/bfloat16 itself
    (``narrow_floats``) the per-step arrays may keep that dtype (``bootstrap``
    and ``carry`` stay in the compute dtype). ``gamma``, ``lam`` and ``critic_lam`` are Python floats or
    arrays shaped like ``rewards``; ``critic_lam`` None means the returns use
    ``lam`` too (otherwise ``returns = A(critic_lam) + V``, the decoupled GAE of
    VAPO: the same deltas and cuts, another coefficient).

    Segments: the time axis is cut into ``n`` segments, ``[offsets[i],
    offsets[i+1])`` (packed sequences, ``cu_seqlens``; a segment may be empty);
    without ``offsets`` the whole axis is one segment. Nothing crosses a
    segment's end in either chain: after its last step the value is
    ``bootstrap[..., i]`` and the advantage is ``carry[..., i]`` (0 when
    ``carry`` is None), so a segment whose right neighbour is a piece living
    elsewhere (a rank's shard, a Dask block) is solved by passing the
    neighbour's numbers there. ``bootstrap`` (and ``carry``) have the batch
    shape plus a trailing axis of n (1 without offsets); ``offsets`` is an
    integer array ``0 = o_0 <= o_1 <= ... <= o_n = T`` of the inputs' namespace
    and device, and ``host_offsets`` the same as a NumPy int64 array when its
    values are known on the host (None under tracing): kernels read that.
    ``terminated``, ``truncated`` and ``mask`` are bool arrays or None.
    ``values`` is None for estimators without a value function. With
    ``fill_masked`` a masked step gets the advantage of the next real step (0
    after the last one) and returns = that + its own value, as verl does,
    instead of 0. ``extra`` holds an estimator's further per-step arrays.
    """

    xp: Any
    rewards: Array
    values: Array | None
    gamma: float | Array
    lam: float | Array
    bootstrap: Array
    next_values: Array | None = None
    terminated: Array | None = None
    truncated: Array | None = None
    mask: Array | None = None
    critic_lam: float | Array | None = None
    fill_masked: bool = False
    extra: dict = field(default_factory=dict)
    offsets: Array | None = None
    host_offsets: Any = None
    carry: Array | None = None

    @property
    def is_constant(self) -> bool:
        """True when the coefficient gamma*lam is one Python float for every step (no cut but the row's end)."""
        return (isinstance(self.gamma, float) and isinstance(self.lam, float) and self.terminated is None
                and self.truncated is None and self.mask is None and self.offsets is None)

    @property
    def length(self) -> int:
        """T, the number of steps."""
        return self.rewards.shape[-1]

    def steps(self) -> dict[str, Array]:
        """The per-step fields that hold arrays, by name in ``PER_STEP`` order (floats and absent ones left out)."""
        return {name: value for name in PER_STEP
                if (value := getattr(self, name)) is not None and not isinstance(value, float)}

    def map_steps(self, function: Callable[[str, Array], Array]) -> GaeProblem:
        """The problem with ``function(name, array)`` in place of every per-step array (``extra``'s included)."""
        changed = {name: function(name, value) for name, value in self.steps().items()}
        extra = {name: function(name, value) for name, value in self.extra.items()}
        return dataclasses.replace(self, **changed, extra=extra)

    def head(self, steps: int) -> GaeProblem:
        """The first ``steps`` steps as one open segment: nothing enters after them (bootstrap 0, no carry)."""
        zero = self.xp.zeros((*self.rewards.shape[:-1], 1), dtype=self.rewards.dtype, device=device_of(self.rewards))
        head = self.map_steps(lambda name, x: x[..., :steps])
        return dataclasses.replace(head, bootstrap=zero, offsets=None, host_offsets=None, carry=None)

    def with_segments(self, host_offsets, bootstrap, carry=None) -> GaeProblem:
        """The problem cut at ``host_offsets`` (NumPy int64 or a list), with a bootstrap value (and an incoming
        advantage ``carry``) per segment, each (..., n)."""
        import numpy as np

        host_offsets = np.asarray(host_offsets, dtype=np.int64)
        offsets = to_device(self.xp, host_offsets, self.rewards)
        return dataclasses.replace(self, offsets=offsets, host_offsets=host_offsets, bootstrap=bootstrap, carry=carry)

    def replace(self, **changes) -> GaeProblem:
        """The problem with the named fields changed (``dataclasses.replace``)."""
        return dataclasses.replace(self, **changes)


@dataclass(frozen=True)
class PreparedCall:
    """A checked call: its problem, the caller's arrays (what a backend is chosen by), the backend asked for,
    and how to lay results out again."""

    problem: GaeProblem
    arrays: tuple
    backend: str
    chunk_size: int | None
    out_dtype: Any
    axis: int
    #: A 0-d bool array for traced offsets checked on their device (``_prepare.traced_offsets``): False fills
    #: every result with NaN; None when there is nothing to check.
    offsets_valid: Any = None

    def restore(self, result):
        """A result in the output dtype, with time back on the caller's axis (NaN where ``offsets_valid`` is
        False)."""
        if self.offsets_valid is not None:
            result = fill_invalid(self.problem.xp, result, self.offsets_valid)
        return restore(self.problem.xp, result, self.out_dtype, self.axis)


@dataclass(frozen=True)
class PreparedScan:
    """A checked ``discounted_cumsum`` call: x (time last, compute dtype, this package's own copy) and the discount."""

    xp: Any
    x: Array
    discount: float | Array
    reverse: bool
    arrays: tuple
    backend: str
    chunk_size: int | None
    out_dtype: Any
    axis: int

    def restore(self, result):
        """A result in the output dtype, with time back on the caller's axis."""
        return restore(self.xp, result, self.out_dtype, self.axis)


def restore(xp, result, dtype, axis: int):
    """result in ``dtype`` with time moved from the last axis back to ``axis``."""
    if result.dtype != dtype:  # astype(copy=False) would return result itself, after array-api-compat's checks
        result = xp.astype(result, dtype, copy=False)
    return result if axis == result.ndim - 1 else xp.moveaxis(result, -1, axis)


def fill_invalid(xp, result, valid):
    """result, or NaN everywhere when ``valid`` (a 0-d bool array, or None: nothing to check) is False."""
    if valid is None:
        return result
    return xp.where(valid, result, xp.full((), math.nan, dtype=result.dtype, device=device_of(result)))  # no host copy
