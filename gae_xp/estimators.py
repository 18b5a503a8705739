r"""The public estimators: GAE, the scan itself, and the returns and corrections built on it.

Every function checks its arguments in ``gae_xp._prepare``, hands the laid-out
problem to a backend (``gae_xp.backends``) or to the recurrences of
``gae_xp._recurrences`` on that backend's scan, and gives back arrays of the
caller's library, on the caller's device, with the caller's time axis. Time
is ``axis``; a masked step is skipped (coefficient 1, input 0) and gets
output 0; ``done_t = terminated_t or truncated_t`` cuts the trace exactly.
"""

from __future__ import annotations

from . import _prepare as prepare_
from . import backends
from ._compat import device_of
from ._recurrences import (
    Picker,
    Segments,
    done_flags,
    last_real_step,
    next_real_values,
    owned_rewards,
    step_coefficients,
)
from ._scan import neighbour


def gae(rewards, values, *, gamma=0.99, lam=0.95, bootstrap_value=None, next_values=None, terminated=None,
        truncated=None, mask=None, axis=-1, chunk_size=None, backend="auto", fill_masked=False, cu_seqlens=None,
        critic_lam=None):
    r"""Generalized Advantage Estimation; returns ``(advantages, returns)``.

    Time is ``axis``; every other axis is batch. With ``done_t = terminated_t or truncated_t``::

        Vnext_t = next_values[t]            if next_values is given,
                  V at the next real step   else (skipping masked steps),
                  bootstrap_value           after the last real step (default 0)
        delta_t = r_t + gamma_t (1 - terminated_t) Vnext_t - V_t
        A_t     = delta_t + gamma_t lam_t (1 - done_t) A_{t+1},     A_T = 0
        returns = A + V

    A done step, or a step whose gamma_t lam_t is 0, cuts the trace exactly:
    nothing behind it, NaN and inf included, reaches the steps before it.

    Args:
        rewards, values: arrays of one shape (any array-API library).
        gamma, lam: numbers in [0, 1], or arrays broadcastable to ``rewards``
            (per-step or per-row discounts), checked wherever their values
            can be read (traced values under ``jax.jit``/``torch.compile``
            are not checked).
        bootstrap_value: the value after the last step, a number or an array
            of the batch shape (``rewards.shape`` without ``axis``).
        next_values: V(s_{t+1}) per step, e.g. the value of the final
            observation at a truncation; replaces the shifted ``values`` and
            ``bootstrap_value`` (pass one of the two).
        terminated: bool array: the episode ended at t; no bootstrap from
            Vnext_t and the trace is cut.
        truncated: bool array: the episode was cut at t; the trace is cut but
            Vnext_t is still bootstrapped (give ``next_values`` for it).
        mask: bool array, True for a real step. Masked steps are skipped as if
            absent: their rewards and values are ignored (NaN there is harmless),
            no discount is applied across them, and their outputs are 0.
        axis: the time axis.
        chunk_size: piece length C of the scan; None picks it by the rule in
            ``gae_xp._scan.choose_chunk_size``. A constant discount's kernel is
            at most 32 wide (a larger C is reduced to 32: a wider one rounds
            more than the serial loop does), so every C keeps float32 results
            within the serial loop's own error. The numba kernels ignore it.
        backend: "auto" (the fastest installed path for these arrays) or a
            name from ``gae_xp.backends.names()``, such as "xp".
        fill_masked: what a masked step gets. False (default): 0 in both
            outputs. True (verl's convention): the advantage of the next real
            step (0 after the last one), and returns = that + its own value.
        cu_seqlens: packed sequences (the "THD" layout): an integer array of
            offsets ``0 = o_0 < o_1 < ... < o_n = T`` of the inputs' library
            and device; sequence i is ``[o_i, o_{i+1})`` of the time axis
            (every row of a batch shares the offsets). Each sequence is
            solved as if it were a row of its own: its end cuts the trace
            (nothing, NaN included, crosses into the sequence before it),
            and after its last real step comes ``bootstrap_value[..., i]``
            (a number, or an array of the batch shape plus a trailing axis
            of n), unless ``terminated`` is set there. Per-step arguments
            keep their meaning. One scan serves every sequence.

    The outputs have the inputs' namespace, device and floating dtype
    (float16/bfloat16 are computed in float32, wider floats in float64;
    integer rewards give the namespace's default float). Inputs are never
    modified and no output shares memory with an input.
    """
    call = prepare_.prepare(rewards, values, gamma=gamma, lam=lam, bootstrap_value=bootstrap_value,
                            next_values=next_values, terminated=terminated, truncated=truncated, mask=mask,
                            axis=axis, chunk_size=chunk_size, backend=backend, fill_masked=fill_masked,
                            cu_seqlens=cu_seqlens, critic_lam=critic_lam)
    advantages, returns = solve_gae(call.problem, backends.solver(call), call.chunk_size)
    return call.restore(advantages), call.restore(returns)


def solve_gae(problem, solver, chunk_size):
    """(advantages, returns) of a checked problem on a backend, time last, compute dtype.

    A decoupled ``critic_lam`` that the backend does not take in the same
    pass gets a second pass: the returns of the problem with ``lam =
    critic_lam``.
    """
    if problem.critic_lam is None or solver.critic_lam:
        return solver.gae(problem, chunk_size=chunk_size)
    advantages, _ = solver.gae(problem.replace(critic_lam=None), chunk_size=chunk_size)
    _, returns = solver.gae(problem.replace(lam=problem.critic_lam, critic_lam=None), chunk_size=chunk_size)
    return advantages, returns


def discounted_cumsum(x, discount, *, axis=-1, reverse=True, initial=None, chunk_size=None, backend="auto"):
    r"""The scan primitive: a discounted cumulative sum along ``axis``.

    ::

        reverse=True:   y_t = x_t + discount_t * y_{t+1},   y_T  = initial (default 0)
        reverse=False:  y_t = x_t + discount_t * y_{t-1},   y_-1 = initial (default 0)

    ``discount`` is a number in [-1, 1] or an array of such values
    broadcastable to x (a larger |discount| is rejected with ValueError: its
    products overflow in any parallel form long before the loop's values do);
    a zero discount cuts the trace exactly. ``initial`` is a number or an
    array of the batch shape. ``y`` has x's namespace, device and floating
    dtype (integer or bool x gives the namespace's default float) and never
    shares memory with x. ``gae()`` is built on this scan.
    """
    return linear_scan(x, discount, axis=axis, reverse=reverse, initial=initial, chunk_size=chunk_size,
                       backend=backend)


def linear_scan(x, coefficient, *, axis=-1, reverse=True, initial=None, chunk_size=None, backend="auto",
                name="discount", bounds=(-1.0, 1.0)):
    """``discounted_cumsum`` with the coefficient's name and bounds given: the adapters' importance-weighted
    traces (torchrl's ``c_thresh`` above 1, rlax's lambda above 1) take any real coefficient."""
    call = prepare_.prepare_scan(x, coefficient, axis=axis, reverse=reverse, initial=initial, chunk_size=chunk_size,
                                 backend=backend, name=name, bounds=bounds)
    y = backends.solver(call).scan(call.xp, call.x, call.discount, reverse=call.reverse, chunk_size=call.chunk_size)
    return call.restore(y)


def discounted_returns(rewards, *, gamma=0.99, terminated=None, truncated=None, mask=None, bootstrap_value=None,
                       axis=-1, chunk_size=None, backend="auto", cu_seqlens=None):
    r"""Reward-to-go (REINFORCE, REINFORCE++)::

        G_t = r_t + gamma_t (1 - done_t) G_{t+1},     G_T = bootstrap_value (default 0)

    Arguments as in ``gae()`` (``cu_seqlens``: packed sequences, each with
    its own ``bootstrap_value``); masked steps are skipped and get 0.
    """
    call = prepare_.prepare(rewards, gamma=gamma, terminated=terminated, truncated=truncated, mask=mask,
                            bootstrap_value=bootstrap_value, axis=axis, chunk_size=chunk_size, backend=backend,
                            lam=1.0, needs_values=False, cu_seqlens=cu_seqlens)
    p, solver = call.problem, backends.solver(call)
    if hasattr(solver, "solve_discounted_returns"):  # a fused kernel: no coefficient arrays materialised
        return call.restore(solver.solve_discounted_returns(p))
    if p.rewards.shape[-1] == 0:
        return call.restore(p.xp.zeros_like(p.rewards))
    pick = Picker(p, p.rewards, p.bootstrap)
    segments = Segments(p)
    coefficient = p.gamma if p.is_constant else step_coefficients(p, p.gamma, pick)
    x = segments.fold(owned_rewards(p, pick), coefficient, p.bootstrap)
    return call.restore(pick.only(p.mask, _solve(call, solver, x, segments.cut(coefficient))))


def lambda_returns(rewards, next_values, *, gamma=0.99, lam=0.95, terminated=None, truncated=None, mask=None,
                   axis=-1, chunk_size=None, backend="auto", cu_seqlens=None):
    r"""TD(lambda) value targets (rlax ``lambda_returns``, torchrl ``td_lambda_return_estimate``)::

        G_t = r_t + gamma_t (1 - terminated_t) [(1 - lam_t) V'_t + lam_t G_{t+1}]

    with ``V'_t = next_values[t]`` = V(s_{t+1}), and ``G_{t+1} := V'_t`` where
    the trace is cut: at a done step and at the last real step of a row (of
    each sequence, with ``cu_seqlens``). So the last step is bootstrapped by
    its own V', as in rlax and torchrl.
    """
    call = prepare_.prepare(rewards, gamma=gamma, lam=lam, terminated=terminated, truncated=truncated, mask=mask,
                            axis=axis, chunk_size=chunk_size, backend=backend, extra={"next_values": next_values},
                            needs_values=False, cu_seqlens=cu_seqlens)
    p, solver = call.problem, backends.solver(call)
    if hasattr(solver, "solve_lambda_returns"):
        return call.restore(solver.solve_lambda_returns(p))
    xp = p.xp
    if p.rewards.shape[-1] == 0:
        return call.restore(xp.zeros_like(p.rewards))
    following = p.extra["next_values"]
    pick = Picker(p, p.rewards, following)
    segments = Segments(p)
    cut = last_real_step(p, pick, solve=solver.scan, chunk_size=call.chunk_size, segments=segments)
    done = done_flags(p)
    if done is not None:
        cut = cut | done
    kept = pick.as_float(cut, negated=True)
    # At a cut the step is bootstrapped by its own V' alone: G_t = r_t + gamma_t V'_t (0 if terminated).
    x = p.rewards + pick.unless(p.terminated, p.gamma * (1 - p.lam * kept) * following)
    coefficient = segments.cut(step_coefficients(p, p.gamma * p.lam * kept, pick))
    return call.restore(pick.only(p.mask, _solve(call, solver, pick.only(p.mask, x), coefficient)))


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
    thresholds = {name: prepare_.check_number(name, value, low=0.0, strict=True) for name, value in
                  (("clip_rho_threshold", clip_rho_threshold), ("clip_c_threshold", clip_c_threshold),
                   ("clip_pg_rho_threshold", clip_pg_rho_threshold))}
    call = prepare_.prepare(rewards, values, gamma=gamma, lam=lam, bootstrap_value=bootstrap_value,
                            next_values=next_values, terminated=terminated, truncated=truncated, mask=mask,
                            axis=axis, chunk_size=chunk_size, backend=backend, extra={"log_rhos": log_rhos})
    p, solver = call.problem, backends.solver(call)
    if hasattr(solver, "solve_vtrace"):
        vs, pg = solver.solve_vtrace(p, **thresholds)
        return call.restore(vs), call.restore(pg)
    xp, v = p.xp, p.values
    if p.rewards.shape[-1] == 0:
        return call.restore(xp.zeros_like(v)), call.restore(xp.zeros_like(v))
    pick = Picker(p, p.rewards, v, p.next_values, p.bootstrap, p.extra["log_rhos"])
    rho = xp.exp(p.extra["log_rhos"])
    v_next = next_real_values(p, pick, solve=solver.scan, chunk_size=call.chunk_size)
    clipped = {name: xp.minimum(rho, xp.asarray(value, dtype=rho.dtype, device=device_of(rho)))
               for name, value in thresholds.items()}
    delta = pick.only(p.mask, clipped["clip_rho_threshold"] * (p.rewards + pick.unless(p.terminated, p.gamma * v_next)
                                                                - v))
    coefficient = step_coefficients(p, p.gamma * p.lam * clipped["clip_c_threshold"], pick)
    corrections = _solve(call, solver, delta, coefficient)  # vs - V; at a masked step, that of the next real step
    following = neighbour(xp, corrections, reverse=True)
    vs_next = v_next + pick.unless(done_flags(p), following)
    pg = clipped["clip_pg_rho_threshold"] * (p.rewards + pick.unless(p.terminated, p.gamma * vs_next) - v)
    return call.restore(pick.only(p.mask, corrections + v)), call.restore(pick.only(p.mask, pg))


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
    arrays = {"x": x} if mask is None else {"x": x, "mask": mask}
    xp = prepare_.namespace_of(arrays)
    prepare_.check_same_device(arrays, "x")
    out_dtype, dtype = prepare_.compute_dtypes(xp, {"x": x}, x)
    eps = prepare_.check_number("eps", eps, low=0.0, strict=False)
    values = xp.astype(x, dtype, copy=False)
    zero = xp.asarray(0.0, dtype=dtype, device=device_of(values))
    if mask is not None:
        prepare_.same_shape("mask", mask, values.shape)
        if not xp.isdtype(mask.dtype, ("bool", "real floating", "integral")):
            raise TypeError(f"mask must be bool (True = a real entry) or real weights, got dtype {mask.dtype}")
    # A bool mask is the weights 0/1; weight-0 entries are left out with where, so nothing there leaks.
    weights = xp.ones_like(values) if mask is None else xp.astype(mask, dtype)
    real = weights != 0
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


def _solve(call, solver, x, coefficient):
    return solver.scan(call.problem.xp, x, coefficient, reverse=True, chunk_size=call.chunk_size)
