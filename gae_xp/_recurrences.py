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

``solve`` is a backend's scan: ``solve(xp, x, a, *, reverse, chunk_size)``,
taking over x (an array of this package's own).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ._compat import device_of, known_finite, owned_copy
from ._scan import fold_boundary

if TYPE_CHECKING:
    from ._prepare import GaeProblem


class Picker:
    """Zeroing entries by a bool flag, for one call.

    With ``where`` (exact: a NaN or inf in a zeroed slot cannot leak), or,
    when every float input of the call is known to be finite, by multiplying
    with the flag as 0.0/1.0: the same numbers, several times faster on a
    CPU, where ``where`` on an unpredictable mask is slow.
    """

    def __init__(self, p: GaeProblem, *inputs):
        xp = p.xp
        self.xp, self.dtype = xp, p.rewards.dtype
        self.zero = xp.asarray(0.0, dtype=self.dtype, device=device_of(p.rewards))
        self.exact = not all(known_finite(xp, x) for x in inputs if x is not None and not isinstance(x, float))

    def only(self, flag, x):
        """x where flag is True, 0 elsewhere (x itself when flag is None)."""
        if flag is None:
            return x
        return self.xp.where(flag, x, self.zero) if self.exact else x * self.as_float(flag)

    def unless(self, flag, x):
        """0 where flag is True, x elsewhere (x itself when flag is None)."""
        if flag is None:
            return x
        return self.xp.where(flag, self.zero, x) if self.exact else x * self.as_float(~flag)

    def as_float(self, flag):
        return self.xp.astype(flag, self.dtype)


def gae_on_scan(p: GaeProblem, *, solve, chunk_size: int | None):
    """(advantages, returns) of a prepared problem, time last, in the compute dtype."""
    xp = p.xp
    r, v, m = p.rewards, p.values, p.mask
    if r.shape[-1] == 0:
        return xp.zeros_like(r), xp.zeros_like(r)
    pick = Picker(p, r, v, p.next_values, p.bootstrap)
    v_next = next_real_values(p, pick, solve=solve, chunk_size=chunk_size)
    delta = pick.unless(p.terminated, p.gamma * v_next) + r - v
    coefficient = p.gamma * p.lam
    if not p.is_constant:
        delta, coefficient = pick.only(m, delta), step_coefficients(p, coefficient)
    advantages = solve(xp, delta, coefficient, reverse=True, chunk_size=chunk_size)
    returns = advantages + v
    if not p.fill_masked:
        advantages, returns = pick.only(m, advantages), pick.only(m, returns)
    return advantages, returns


def next_real_values(p: GaeProblem, pick: Picker, *, solve, chunk_size):
    """Vnext_t: ``next_values`` when given, else V at the next real (unmasked) step, else the bootstrap value."""
    xp, v, m = p.xp, p.values, p.mask
    if p.next_values is not None:
        return p.next_values
    latest = v
    if m is not None:
        skip = 1 - pick.as_float(m)  # coefficient 1 at a masked step, 0 at a real one
        latest = solve(xp, fold_boundary(xp, pick.only(m, v), skip, p.bootstrap, reverse=True), skip,
                       reverse=True, chunk_size=chunk_size)
    return xp.concat([latest[..., 1:], p.bootstrap], axis=-1)


def done_flags(p: GaeProblem):
    """``terminated | truncated`` as one bool array, or None when neither is given."""
    flags = [f for f in (p.terminated, p.truncated) if f is not None]
    if not flags:
        return None
    return flags[0] if len(flags) == 1 else flags[0] | flags[1]


def step_coefficients(p: GaeProblem, coefficient):
    """The scan's coefficient per step: ``coefficient`` (a float or an array), 0 at a done step, 1 at a masked one.

    Coefficients are finite, so multiplying by the flags as 0/1 is exact.
    """
    xp, dtype = p.xp, p.rewards.dtype
    done = done_flags(p)
    out = coefficient + xp.zeros_like(p.rewards)
    if done is not None:
        out = out * xp.astype(~done, dtype)
    if p.mask is not None:
        real = xp.astype(p.mask, dtype)
        out = out * real + (1 - real)
    return out


def last_real_step(p: GaeProblem, pick: Picker, *, solve, chunk_size):
    """True at each row's last real step: the real steps after t, counted by the scan, are none."""
    xp = p.xp
    length = p.rewards.shape[-1]
    steps = xp.arange(length, device=device_of(p.rewards))
    if p.mask is None:
        return xp.broadcast_to(steps == length - 1, p.rewards.shape)
    counts = solve(xp, pick.as_float(p.mask), 1.0, reverse=True, chunk_size=chunk_size)
    after = xp.concat([counts[..., 1:], xp.zeros_like(counts[..., :1])], axis=-1)
    return p.mask & (after == 0)


def owned_rewards(p: GaeProblem, pick: Picker):
    """The rewards, 0 at masked steps, as an array of this package's own (the scan takes it over)."""
    return pick.only(p.mask, p.rewards) if p.mask is not None else owned_copy(p.xp, p.rewards)
