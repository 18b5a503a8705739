r"""GAE and the estimators' recurrences on a scan, written only against the array API namespace.

With ``done_t = terminated_t or truncated_t`` and the mask m (True = a real step)::

    Vnext_t = next_values_t, or V at the next real step, or the bootstrap value
    delta_t = r_t + (0 if terminated_t else gamma_t Vnext_t) - V_t
    A_t     = delta_t + a_t A_{t+1},   a_t = 0 if done_t else gamma_t lam_t,   A_T = 0
    R_t     = A_t + V_t

A masked step is made the identity of the recurrence (input 0, coefficient
1), so no discount is applied across it, and its outputs are 0 (or, with
``fill_masked``, those of the next real step). "V at the next real step" is
itself a reverse recurrence, ``y_t = m_t V_t + (1 - m_t) y_{t+1}`` with
``y_T = bootstrap``, solved by the same scan (exactly: its coefficients are 0
or 1). A zero coefficient cuts the scan exactly (see ``gae_xp._scan``), so
nothing, NaN and inf included, crosses a done step.

Segments (packed sequences, pieces of a longer row: see ``GaeProblem``):
the end of every segment cuts both chains, and the segment's boundary
values enter there the way ``bootstrap`` enters at a row's end: folded into
the input of its last step with that step's coefficient (``Segments.fold``),
after which the coefficient is set to 0 (``Segments.cut``). One scan serves
all segments of a row; there is no loop over them.

``solve`` is a backend's scan: ``solve(xp, x, a, *, reverse, chunk_size)``,
taking over x (an array of this package's own).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ._compat import device_of, ieee_overflow_allowed, is_numpy_array, known_finite, owned_copy, writes_through_views
from ._scan import fold_boundary, neighbour

if TYPE_CHECKING:
    from ._problem import GaeProblem


class Picker:
    """Zeroing entries by a bool flag, for one call.

    With ``where`` (exact: a NaN or inf in a zeroed slot cannot leak), or,
    when every float input of the call is known to be finite, by multiplying
    with the flag as 0/1 (``factor``): the same numbers, several times faster
    on a CPU, where ``where`` on an unpredictable mask is slow. ``owned=True``
    says x is this call's own new array: the product is then written into it
    where the library writes in place (NumPy, PyTorch without autograd
    history), sparing a full-size temporary and its fresh pages.
    """

    def __init__(self, p: GaeProblem, *inputs):
        xp = p.xp
        self.xp, self.dtype = xp, p.rewards.dtype
        self.zero = xp.full((), 0.0, dtype=self.dtype, device=device_of(p.rewards))  # no host copy
        self._inputs = [x for x in inputs if x is not None and not isinstance(x, float)]
        self._exact = None
        self._floats: dict = {}

    @property
    def exact(self) -> bool:
        """True unless every float input is known to be finite: asked on first use (one reduction per input), so
        that a call without flags (a constant discount) reads its inputs no extra time."""
        if self._exact is None:
            self._exact = not all(known_finite(self.xp, x) for x in self._inputs)
        return self._exact

    def only(self, flag, x, *, owned: bool = False):
        """x where flag is True, 0 elsewhere (x itself when flag is None)."""
        if flag is None:
            return x
        return self.xp.where(flag, x, self.zero) if self.exact else times(x, self.factor(flag), owned=owned)

    def real(self, mask, x):
        """x with its masked steps made 0 before any arithmetic (x itself when mask is None).

        A masked step is absent whatever values it holds: ``r - V`` of a
        masked r = 3e38 and V = -3e38 overflows to inf (and warns), and
        ``inf * 0`` is NaN, which would spread to every earlier step. Zeroed
        first, a masked step only ever meets finite neighbours. The exact
        route zeroes with ``where``, so a masked NaN or inf never enters the
        arithmetic either.
        """
        if mask is None:
            return x
        return self.xp.where(mask, x, self.zero) if self.exact else x * self.factor(mask)

    def unless(self, flag, x, *, owned: bool = False):
        """0 where flag is True, x elsewhere (x itself when flag is None)."""
        if flag is None:
            return x
        if self.exact:
            return self.xp.where(flag, self.zero, x)
        return times(x, self.factor(flag, negated=True), owned=owned)

    def factor(self, flag, *, negated: bool = False):
        """The flag (or its negation) as a 0/1 factor of a product: on NumPy the bool array itself (NumPy
        multiplies a float by a bool exactly, with no float copy of the flag: 4 bytes a step fewer to write and
        to fault in), elsewhere the flag as floats (``as_float``: PyTorch multiplies by a bool tensor 2x slower,
        and the array API does not mix bool and float)."""
        if not is_numpy_array(flag):
            return self.as_float(flag, negated=negated)
        if not negated:
            return flag
        key = (id(flag), "not")
        if key not in self._floats:
            self._floats[key] = (flag, ~flag)
        return self._floats[key][1]

    def as_float(self, flag, *, negated: bool = False):
        """The flag (or its negation) as 0.0/1.0 in the compute dtype, made once per call."""
        key = (id(flag), negated)
        if key not in self._floats:
            self._floats[key] = (flag, self.xp.astype(~flag if negated else flag, self.dtype))
        return self._floats[key][1]


class Segments:
    """Where a problem's segments end, per step, for the array-API route (see ``GaeProblem``).

    Without offsets the row is one segment and every method takes the short
    path of a row's end. With offsets, ``index`` is each step's segment
    (``searchsorted`` on the offsets) and ``end`` marks each segment's last step.
    """

    def __init__(self, p: GaeProblem):
        xp = self.xp = p.xp
        self.like = p.rewards
        self.index = self.end = None
        if p.offsets is not None:
            steps = xp.arange(p.rewards.shape[-1], dtype=p.offsets.dtype, device=device_of(p.rewards))
            self.index = xp.searchsorted(p.offsets[1:], steps, side="right")
            self.end = (steps + 1) == xp.take(p.offsets, self.index + 1)

    def ends(self):
        """True at each segment's last step (the row's last step without offsets), shaped like the steps."""
        xp = self.xp
        if self.end is not None:
            return self.end
        steps = xp.arange(self.like.shape[-1], device=device_of(self.like))
        return steps == self.like.shape[-1] - 1

    def at_ends(self, per_segment):
        """(..., n) -> (..., T): each segment's value at its last step, 0 elsewhere."""
        xp = self.xp
        if self.end is None:
            zeros = xp.zeros((*per_segment.shape[:-1], self.like.shape[-1] - 1), dtype=per_segment.dtype,
                             device=device_of(per_segment))
            return xp.concat([zeros, per_segment], axis=-1)
        return xp.where(self.end, xp.take(per_segment, self.index, axis=per_segment.ndim - 1), xp.zeros_like(self.like))

    def fold(self, x, coefficient, per_segment):
        """x (an array of this package's own) with ``coefficient * per_segment`` added at each segment's last step.

        The value after a segment entering through the step before it, like
        ``fold_boundary`` at a row's end; a zero coefficient takes nothing
        (exactly: a non-finite value cannot leak).
        """
        xp = self.xp
        if self.end is None:
            return fold_boundary(xp, x, coefficient, per_segment, reverse=True)
        entering = xp.where(self.end & (coefficient != 0), self.at_ends(per_segment), xp.zeros_like(self.like))
        return x + coefficient * entering

    def cut(self, coefficient):
        """The coefficient with 0 at each segment's last step (the row's end needs none)."""
        if self.end is None:
            return coefficient
        xp = self.xp
        return xp.where(self.end, xp.zeros_like(self.like), coefficient + xp.zeros_like(self.like))

    def following(self, y):
        """y_{t+1} within the segment: 0 at each segment's last step."""
        shifted = neighbour(self.xp, y, reverse=True)
        return shifted if self.end is None else self.xp.where(self.end, self.xp.zeros_like(shifted), shifted)


def gae_on_scan(p: GaeProblem, *, solve, chunk_size: int | None):
    """(advantages, returns) of a prepared problem, time last, in the compute dtype.

    With ``critic_lam`` the returns come from a second scan of the same deltas
    with ``gamma * critic_lam`` (decoupled GAE); a problem with a ``carry``
    brings the advantage chain's carry only, so it must not have one.
    """
    xp = p.xp
    r, v, m = p.rewards, p.values, p.mask
    if r.shape[-1] == 0:
        return xp.zeros_like(r), xp.zeros_like(r)
    if p.carry is not None and p.critic_lam is not None:
        raise ValueError("a carry enters one advantage chain: solve critic_lam's returns as a problem of their own")
    pick = Picker(p, r, v, p.next_values, p.bootstrap, p.carry)
    segments = Segments(p)
    v_next = next_real_values(p, pick, solve=solve, chunk_size=chunk_size, segments=segments)
    real_v = pick.real(m, v)
    # A new array at every step (NumPy writes a chain of operators on a temporary into it). A real step's inf or
    # NaN gives inf - inf = NaN here and below: IEEE's answer, which the contract keeps inside its episode.
    with ieee_overflow_allowed(r):
        delta = pick.unless(p.terminated, p.gamma * v_next, owned=True) + pick.real(m, r) - real_v
    if not p.is_constant:
        delta = pick.only(m, delta, owned=True)

    def advantages_at(lam, x):  # the scan takes x over
        coefficient = p.gamma * lam
        if not p.is_constant:
            coefficient = step_coefficients(p, coefficient, pick)
        if p.carry is not None:
            x = segments.fold(x, coefficient, p.carry)
        return solve(xp, x, segments.cut(coefficient), reverse=True, chunk_size=chunk_size)

    own_v = v if p.fill_masked else real_v  # verl's convention adds a masked step's own value
    if p.critic_lam is None:
        advantages = advantages_at(p.lam, delta)
        with ieee_overflow_allowed(advantages):
            returns = advantages + own_v
    else:
        advantages = advantages_at(p.lam, owned_copy(xp, delta))
        critic = advantages_at(p.critic_lam, delta)
        with ieee_overflow_allowed(critic):
            returns = critic + own_v
    if not p.fill_masked:  # both this call's own: the scan's result and a sum
        advantages, returns = pick.only(m, advantages, owned=True), pick.only(m, returns, owned=True)
    return advantages, returns


def next_real_values(p: GaeProblem, pick: Picker, *, solve, chunk_size, segments: Segments | None = None):
    """Vnext_t: ``next_values`` when given, else V at the next real (unmasked) step, else the bootstrap value."""
    xp = p.xp
    if p.next_values is not None:
        return p.next_values
    segments = segments or Segments(p)
    latest = latest_real_values(p, pick, solve=solve, chunk_size=chunk_size, segments=segments)
    if segments.end is None:
        return xp.concat([latest[..., 1:], p.bootstrap], axis=-1)
    return xp.where(segments.end, segments.at_ends(p.bootstrap), segments.following(latest))


def latest_real_values(p: GaeProblem, pick: Picker, *, solve, chunk_size, segments: Segments | None = None):
    """V at step t if it is real, else at the next real step of its segment, else the segment's bootstrap value.

    ``y_t = m_t V_t + (1 - m_t) y_{t+1}``, entered by the bootstrap value
    after each segment's last step: a scan whose coefficients are 0 or 1.
    """
    xp, v, m = p.xp, p.values, p.mask
    if m is None:
        return v
    segments = segments or Segments(p)
    skip = pick.as_float(m, negated=True)  # coefficient 1 at a masked step, 0 at a real one
    return solve(xp, segments.fold(pick.only(m, v), skip, p.bootstrap), segments.cut(skip), reverse=True,
                 chunk_size=chunk_size)


def done_flags(p: GaeProblem):
    """``terminated | truncated`` as one bool array, or None when neither is given."""
    flags = [f for f in (p.terminated, p.truncated) if f is not None]
    if not flags:
        return None
    return flags[0] if len(flags) == 1 else flags[0] | flags[1]


def step_coefficients(p: GaeProblem, coefficient, pick: Picker):
    """The scan's coefficient per step: ``coefficient`` (a float or an array), 0 at a done step, 1 at a masked one.

    With ``pick.exact`` by ``where`` (a coefficient made from a NaN input at a
    masked step, V-trace's ``log_rhos`` say, must not leak), else by the flags
    as 0/1 factors: the same numbers for finite coefficients.
    """
    xp, done = p.xp, done_flags(p)
    if pick.exact:
        out = coefficient + xp.zeros_like(p.rewards)
        out = out if done is None else xp.where(done, xp.zeros_like(out), out)
        return out if p.mask is None else xp.where(p.mask, out, xp.ones_like(out))
    if isinstance(coefficient, float):
        out = xp.full(p.rewards.shape, coefficient, dtype=p.rewards.dtype, device=device_of(p.rewards))
    else:
        out = coefficient + xp.zeros_like(p.rewards)
    if done is not None:
        out = times(out, pick.factor(done, negated=True), owned=True)
    if p.mask is not None:
        out = plus(times(out, pick.factor(p.mask), owned=True), pick.factor(p.mask, negated=True), owned=True)
    return out


def times(x, factor, *, owned: bool):
    """x * factor, written into x when x is this call's own new array (``owned``) and its library writes in place."""
    if owned and writes_through_views(x):
        x *= factor
        return x
    return x * factor


def plus(x, term, *, owned: bool):
    """x + term, written into x when x is this call's own new array (``owned``) and its library writes in place."""
    if owned and writes_through_views(x):
        x += term
        return x
    return x + term


def last_real_step(p: GaeProblem, pick: Picker, *, solve, chunk_size, segments: Segments | None = None):
    """True at each segment's last real step: the real steps after t in its segment, counted by the scan, are none."""
    xp = p.xp
    segments = segments or Segments(p)
    length = p.rewards.shape[-1]
    if p.mask is None:
        last = segments.end
        if last is None:
            last = xp.arange(length, device=device_of(p.rewards)) == length - 1
        return xp.broadcast_to(last, p.rewards.shape)
    # The scan takes its x over: a new array, not the call's cached copy of the mask as floats.
    counts = solve(xp, xp.astype(p.mask, p.rewards.dtype), segments.cut(1.0), reverse=True, chunk_size=chunk_size)
    return p.mask & (segments.following(counts) == 0)


def owned_rewards(p: GaeProblem, pick: Picker):
    """The rewards, 0 at masked steps, as an array of this package's own (the scan takes it over)."""
    return pick.only(p.mask, p.rewards) if p.mask is not None else owned_copy(p.xp, p.rewards)
