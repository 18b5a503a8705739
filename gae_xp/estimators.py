"""More estimators on the same scan, with gae()'s conventions for arrays, devices, dtypes, dones and masks.

Every estimator here is one or two calls of the scan primitive behind
``discounted_cumsum`` (``y_t = x_t + a_t y_{t+1}``) on coefficients built with
``where``; time is ``axis``, a masked step is skipped (coefficient 1, input 0)
and gets output 0, ``done_t = terminated_t or truncated_t`` cuts the trace.
"""

from __future__ import annotations

from array_api_compat import device as device_of

from . import _inputs as inputs
from ._api import prepare
from ._gae import _zero, cut_at_done, done_flags, next_real_values, skip_masked
from ._scan import fold_initial


def discounted_returns(rewards, *, gamma=0.99, terminated=None, truncated=None, mask=None, bootstrap_value=None,
                       axis=-1, chunk_size=None, backend="auto"):
    r"""Reward-to-go (REINFORCE, REINFORCE++)::

        G_t = r_t + gamma_t (1 - done_t) G_{t+1},     G_T = bootstrap_value (default 0)

    Arguments as in ``gae()``; masked steps are skipped and get 0.
    """
    call = prepare(rewards, gamma=gamma, terminated=terminated, truncated=truncated, mask=mask,
                   bootstrap_value=bootstrap_value, axis=axis, chunk_size=chunk_size, backend=backend, lam=1.0)
    p = call.problem
    xp = p.xp
    if p.rewards.shape[-1] == 0:
        return call.restore(xp.zeros_like(p.rewards))
    x, coeff = skip_masked(p, p.rewards, cut_at_done(p, p.gamma))
    returns = _solve(call, fold_initial(xp, x, coeff, p.bootstrap, reverse=True), coeff)
    return call.restore(_masked(p, returns))


def lambda_returns(rewards, next_values, *, gamma=0.99, lam=0.95, terminated=None, truncated=None, mask=None,
                   axis=-1, chunk_size=None, backend="auto"):
    r"""TD(lambda) value targets (rlax ``lambda_returns``, torchrl ``td_lambda_return_estimate``)::

        G_t = r_t + gamma_t (1 - terminated_t) [(1 - lam_t) V'_t + lam_t G_{t+1}]

    with ``V'_t = next_values[t]`` = V(s_{t+1}), and ``G_{t+1} := V'_t`` where
    the trace is cut: at a done step and at the last real step of a row. So
    the last step is bootstrapped by its own V', as in rlax and torchrl.
    """
    call = prepare(rewards, gamma=gamma, lam=lam, terminated=terminated, truncated=truncated, mask=mask,
                   axis=axis, chunk_size=chunk_size, backend=backend, extra={"next_values": next_values})
    p = call.problem
    xp = p.xp
    if p.rewards.shape[-1] == 0:
        return call.restore(xp.zeros_like(p.rewards))
    zero = _zero(p)
    discount = p.gamma if p.terminated is None else xp.where(p.terminated, zero, p.gamma + zero)
    cut = _last_real_step(call)
    done = done_flags(p)
    if done is not None:
        cut = cut | done
    lam_ = p.lam + zero
    x = p.rewards + discount * xp.where(cut, zero + 1, 1 - lam_) * p.extra["next_values"]
    x, coeff = skip_masked(p, x, xp.where(cut, zero, discount * lam_))
    return call.restore(_masked(p, _solve(call, x, coeff)))


def vtrace(log_rhos, rewards, values, *, gamma=0.99, lam=1.0, clip_rho_threshold=1.0, clip_c_threshold=1.0,
           clip_pg_rho_threshold=1.0, bootstrap_value=None, next_values=None, terminated=None, truncated=None,
           mask=None, axis=-1, chunk_size=None, backend="auto"):
    r"""V-trace (IMPALA): returns ``(vs, pg_advantages)``.

    With ``rho_t = exp(log_rhos_t)`` (target over behaviour probability),
    ``rho_bar = min(rho, clip_rho_threshold)``, ``c_t = lam min(rho, clip_c_threshold)``
    and Vnext as in ``gae()``::

        delta_t = rho_bar_t (r_t + gamma_t (1 - terminated_t) Vnext_t - V_t)
        vs_t - V_t = delta_t + gamma_t (1 - done_t) c_t (vs_{t+1} - V_{t+1})
        pg_t = min(rho_t, clip_pg_rho_threshold) (r_t + gamma_t (1 - terminated_t) vs_next_t - V_t)

    where ``vs_next_t = vs`` at the next real step, or Vnext_t where the
    trace is cut (a done step, the last step). Differences from the
    references: rlax ``vtrace`` takes ``rho`` (not its log), fixes the c
    clip at 1, has no dones (``discount_t = 0`` plays terminated), mixes lam
    into the policy-gradient target (``vs_next = lam vs_{t+1} + (1 - lam) V_{t+1}``;
    here lam enters the trace only) and bootstraps the deltas from its own
    ``v_t`` apart from the values it corrects (here Vnext, and
    ``vs_next = Vnext + (vs - V)_{t+1}``); ``gae_xp.adapters.rlax`` reproduces rlax.
    torchrl ``vtrace_advantage_estimate`` has no lam (lam = 1), takes
    ``vs_next = vs_{t+1}`` (this function: next_values_t + (vs - V)_{t+1}, the
    same when next_values_t = V_{t+1}) and cuts the trace at done only
    (terminated alone drops the bootstrap); ``gae_xp.adapters.torchrl`` reproduces it.
    """
    thresholds = {"clip_rho_threshold": clip_rho_threshold, "clip_c_threshold": clip_c_threshold,
                  "clip_pg_rho_threshold": clip_pg_rho_threshold}
    for name, value in thresholds.items():
        if not isinstance(value, (int, float)) or isinstance(value, bool) or not value > 0:
            raise ValueError(f"{name} must be a positive number, got {value!r}")
    call = prepare(rewards, values, gamma=gamma, lam=lam, bootstrap_value=bootstrap_value, next_values=next_values,
                   terminated=terminated, truncated=truncated, mask=mask, axis=axis, chunk_size=chunk_size,
                   backend=backend, extra={"log_rhos": log_rhos})
    p = call.problem
    xp, v = p.xp, p.values
    if p.rewards.shape[-1] == 0:
        return call.restore(xp.zeros_like(v)), call.restore(xp.zeros_like(v))
    zero = _zero(p)
    rho = xp.exp(p.extra["log_rhos"])
    v_next = next_real_values(p, solve=call.solver.scan, chunk_size=call.chunk_size)
    discount = p.gamma if p.terminated is None else xp.where(p.terminated, zero, p.gamma + zero)
    delta = xp.minimum(rho, zero + clip_rho_threshold) * (p.rewards + discount * v_next - v)
    delta, coeff = skip_masked(p, delta, cut_at_done(p, p.gamma * p.lam * xp.minimum(rho, zero + clip_c_threshold)))
    corrections = _solve(call, delta, coeff)  # vs - V; at a masked step, that of the next real step
    following = xp.concat([corrections[..., 1:], xp.zeros_like(corrections[..., :1])], axis=-1)
    done = done_flags(p)
    if done is not None:
        following = xp.where(done, zero, following)
    vs_next = v_next + following
    pg = xp.minimum(rho, zero + clip_pg_rho_threshold) * (p.rewards + discount * vs_next - v)
    return call.restore(_masked(p, corrections + v)), call.restore(_masked(p, pg))


def whiten(x, mask=None, *, unbiased=True, eps=1e-8, shift_mean=True, masked_fill=0.0):
    r"""Normalise x with the mean and variance of its real entries::

        out = (x - mean) / sqrt(var + eps)      (+ mean again if not shift_mean)

    over all of x (every axis), or over ``mask``: bool (True = real), or
    numeric weights as verl's ``masked_mean`` takes them (a 0/1 float mask,
    or fractional weights: ``mean = sum(w x) / sum(w)``,
    ``var = sum(w (x - mean)^2) / sum(w)``). Entries with mask False or
    weight 0 are left out with ``where``, so NaN or inf there cannot leak.
    ``unbiased`` divides the variance by n - 1 (n = the count, or sum(w)).
    Masked entries get ``masked_fill``, or are whitened like the rest with
    ``masked_fill=None`` (verl's convention).
    """
    inputs.require_array("x", x)
    xp = inputs.namespace_of({"x": x, "mask": mask})
    inputs.check_same_device({"x": x, "mask": mask}, "x")
    out_dtype, dtype = inputs.compute_dtypes(xp, {"x": x}, x)
    if not isinstance(eps, (int, float)) or isinstance(eps, bool) or not eps >= 0:
        raise ValueError(f"eps must be a non-negative number, got {eps!r}")
    values = xp.astype(x, dtype, copy=False)
    zero = xp.asarray(0.0, dtype=dtype, device=device_of(values))
    weights = None
    if mask is None:
        real = xp.ones(values.shape, dtype=xp.bool, device=device_of(values))
    else:
        inputs.require_array("mask", mask)
        inputs.same_shape("mask", mask, values.shape)
        if xp.isdtype(mask.dtype, "bool"):
            real = mask
        elif xp.isdtype(mask.dtype, ("real floating", "integral")):
            weights = xp.astype(mask, dtype)
            real = weights != 0
        else:
            raise TypeError(f"mask must be bool (True = a real entry) or real weights, got dtype {mask.dtype}")
    if weights is None:
        count = xp.sum(xp.astype(real, dtype))
        mean = xp.sum(xp.where(real, values, zero)) / count
        centred = values - mean
        var = xp.sum(xp.where(real, centred * centred, zero)) / (count - 1 if unbiased else count)
    else:
        count = xp.sum(weights)
        mean = xp.sum(xp.where(real, weights * values, zero)) / count
        centred = values - mean
        var = xp.sum(xp.where(real, weights * (centred * centred), zero)) / (count - 1 if unbiased else count)
    out = centred / xp.sqrt(var + eps)
    if not shift_mean:
        out = out + mean
    if mask is not None and masked_fill is not None:
        out = xp.where(real, out, zero + masked_fill)
    return xp.astype(out, out_dtype, copy=False)


def _last_real_step(call):
    """True at each row's last real step: the real steps after t, counted by the scan, are none."""
    p = call.problem
    xp = p.xp
    length = p.rewards.shape[-1]
    steps = xp.arange(length, device=device_of(p.rewards))
    if p.mask is None:
        return xp.broadcast_to(steps == length - 1, p.rewards.shape)
    zero = _zero(p)
    counts = _solve(call, xp.where(p.mask, zero + 1, zero), 1.0)
    after = xp.concat([counts[..., 1:], xp.zeros_like(counts[..., :1])], axis=-1)
    return p.mask & (after == 0)


def _solve(call, x, coeff):
    return call.solver.scan(call.problem.xp, x, coeff, reverse=True, chunk_size=call.chunk_size, overwrite_x=True)


def _masked(p, result):
    return result if p.mask is None else p.xp.where(p.mask, result, _zero(p))
