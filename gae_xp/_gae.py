"""GAE on the chunk scan, written only against the array API namespace.

With ``done_t = terminated_t or truncated_t`` and the mask m (True = a real step):

    Vnext_t = next_values_t, or V at the next real step, or the bootstrap value
    delta_t = r_t + gamma_t (1 - terminated_t) Vnext_t - V_t
    A_t     = delta_t + gamma_t lam_t (1 - done_t) A_{t+1},      A_T = 0
    R_t     = A_t + V_t

A masked step is made the identity of the recurrence (delta 0, coefficient 1),
so no discount is applied across it, and its outputs are set to 0 with
``where``. "V at the next real step" is itself a reverse recurrence,
``y_t = m_t V_t + (1 - m_t) y_{t+1}`` with ``y_T = bootstrap``, solved by the
same scan (exactly: its coefficients are 0 or 1).
"""

from __future__ import annotations

from array_api_compat import device as device_of

from . import _owned as owned
from ._inputs import GaeProblem
from ._scan import fold_initial, scan


def gae_on_scan(p: GaeProblem, *, chunk_size: int | None, solve=scan):
    """(advantages, returns) of a prepared problem; ``solve`` is the scan to use (same signature as ``_scan.scan``)."""
    xp = p.xp
    r, v, m = p.rewards, p.values, p.mask
    if r.shape[-1] == 0:
        return xp.zeros_like(r), xp.zeros_like(r)
    zero = _zero(p)

    v_next = next_real_values(p, solve=solve, chunk_size=chunk_size)
    bootstrapped = p.gamma * v_next if v_next is p.next_values else owned.mul(v_next, p.gamma)
    if p.terminated is not None:
        bootstrapped = xp.where(p.terminated, zero, bootstrapped)
    delta = owned.sub(owned.add(bootstrapped, r), v)

    coeff = p.gamma * p.lam
    if not p.is_constant:
        delta, coeff = skip_masked(p, delta, cut_at_done(p, coeff))

    advantages = solve(xp, delta, coeff, reverse=True, chunk_size=chunk_size, overwrite_x=True)
    returns = advantages + v
    if m is not None and not p.fill_masked:
        advantages = xp.where(m, advantages, zero)
        returns = xp.where(m, returns, zero)
    return advantages, returns



def next_real_values(p: GaeProblem, *, solve, chunk_size):
    """Vnext_t: ``next_values`` when given, else V at the next real (unmasked) step, else the bootstrap value.

    Returns ``p.next_values`` itself or a new array. With a mask, "V at the
    next real step" is the reverse recurrence ``y_t = m_t V_t + (1 - m_t) y_{t+1}``,
    ``y_T = bootstrap``, solved by the scan (exactly: coefficients 0 or 1).
    """
    xp, v, m = p.xp, p.values, p.mask
    if p.next_values is not None:
        return p.next_values
    latest = v
    if m is not None:
        zero = xp.asarray(0.0, dtype=v.dtype, device=device_of(v))
        skip = xp.where(m, zero, zero + 1)
        latest = solve(xp, fold_initial(xp, xp.where(m, v, zero), skip, p.bootstrap, reverse=True), skip,
                       reverse=True, chunk_size=chunk_size, overwrite_x=True)
    return xp.concat([latest[..., 1:], p.bootstrap], axis=-1)


def _zero(p: GaeProblem):
    return p.xp.asarray(0.0, dtype=p.rewards.dtype, device=device_of(p.rewards))


def done_flags(p: GaeProblem):
    """``terminated | truncated`` as one bool array, or None when neither is given."""
    flags = [f for f in (p.terminated, p.truncated) if f is not None]
    if not flags:
        return None
    return flags[0] if len(flags) == 1 else flags[0] | flags[1]


def cut_at_done(p: GaeProblem, coeff):
    """A coefficient (a float or an array) as an array shaped like the rewards, 0 at done steps."""
    coeff = coeff + p.xp.zeros_like(p.rewards)
    done = done_flags(p)
    return coeff if done is None else p.xp.where(done, _zero(p), coeff)


def skip_masked(p: GaeProblem, x, coeff):
    """(x, coeff) with every masked step made the identity of the recurrence: input 0, coefficient 1."""
    if p.mask is None:
        return x, coeff
    zero = _zero(p)
    return p.xp.where(p.mask, x, zero), p.xp.where(p.mask, coeff, zero + 1)
