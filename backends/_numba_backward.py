r"""The backward of ``gae()`` on the CPU: the adjoint of the reverse scan, one forward pass per segment (numba).

``gae()`` is linear in (rewards, values, next_values, bootstrap, carry) once
the flags and coefficients are fixed. Its forward recurrence, per segment
and from its last step down (``c_t`` the coefficient of the step, 1 at a
masked step, 0 at a cut; ``k_t`` the same with ``critic_lam``)::

    F_t = d_t + c_t F_{t+1},   G_t = d_t + k_t G_{t+1},   F_end = G_end = carry
    A_t = F_t,   R_t = G_t + V_t           (kept steps; 0 elsewhere)

has, for upstream gradients ``gA`` and ``gR``, the adjoint recurrence that
runs forward in time with the same coefficients, cut at the same places
(a cut at t-1 stops the flow from t-1 into t)::

    phi_t = gA_t + c_{t-1} phi_{t-1},   psi_t = gR_t + k_{t-1} psi_{t-1},   phi_start = psi_start = 0
    g_delta_t = phi_t + psi_t   (real steps; 0 at a masked one)

(one chain ``phi`` on ``gA + gR`` when the returns use ``lam`` too). From
``delta_t = r_t + gamma_t (1 - terminated_t) Vnext_t - V_t``::

    g_rewards_t = g_delta_t
    g_values_t  = gR_t - g_delta_t + gamma_p (1 - terminated_p) g_delta_p   (p: the previous real step, whose
                                                                            Vnext is V_t; without next_values)
    g_next_values_t = gamma_t (1 - terminated_t) g_delta_t
    g_bootstrap     = gamma_p (1 - terminated_p) g_delta_p                   (p: the segment's last real step)
    g_carry         = c_last phi_last + k_last psi_last

A masked step passes both flows through (coefficient 1) and gets gradient 0
in r and V (with ``fill_masked``, V still gets ``gR_t``: its return is the
next real step's advantage plus its own value). Products with a zero
coefficient are chosen away, never computed (``0 * inf`` is NaN), as in the
forward kernels; the flows run in float64.

Gradients to per-step gamma or lam are not computed here: ``gae()`` sends
calls whose coefficients require grad to the generic path.
"""

from __future__ import annotations

import functools

import numpy as np

from gae_xp._problem import FLAGS, OPTIONAL

from . import numba_cpu
from ._sharing import share


def gae_backward(problem, grad_advantages, grad_returns) -> dict:
    """The gradients of a ``GaeProblem``'s (advantages, returns) to its inputs, given the upstream gradients.

    ``problem`` holds NumPy arrays or torch CPU tensors that record no
    autograd history; ``grad_advantages`` and ``grad_returns`` are shaped
    like ``problem.rewards``. Returns a dict of arrays of the problem's kind
    and compute dtype: "rewards", "values" (shape of rewards), "next_values"
    (None without them), "bootstrap" and "carry" (the batch shape plus a
    trailing axis of the segments' count; "carry" None without one).
    """
    p = problem
    rewards = numba_cpu._host(p.rewards)
    shape, dtype = rewards.shape, rewards.dtype
    rows = numba_cpu._rows(np.broadcast_to(numba_cpu._host(grad_advantages), shape))
    offsets = numba_cpu._offsets(p, shape[-1])
    count = offsets.shape[0] - 1
    on_rewards = np.empty(rows.shape, dtype=dtype)
    on_values = np.empty(rows.shape, dtype=dtype)
    on_next_values = np.empty(rows.shape if p.next_values is not None else (0, 0), dtype=dtype)
    on_bootstrap = np.empty((rows.shape[0], count), dtype=dtype)
    on_carry = np.empty((rows.shape[0], count) if p.carry is not None else (0, 0), dtype=dtype)
    critic = p.lam if p.critic_lam is None else p.critic_lam
    critic_scalar, critic_steps = _coefficient(critic, dtype, shape)
    flags = _optional_arrays(p, dtype, rows.shape)[1:]  # terminated, truncated, mask, gamma, lam
    units = (rows.shape[0] + 1) // 2 * count
    per_step = tuple(not isinstance(c, float) for c in (p.gamma, p.lam, critic))
    kernel = _kernel(*(getattr(p, name) is not None for name in OPTIONAL), p.critic_lam is not None, *per_step)
    share(kernel, (rows, numba_cpu._rows(np.broadcast_to(numba_cpu._host(grad_returns), shape)), offsets, *flags,
                   critic_scalar, critic_steps, p.fill_masked, on_rewards, on_values, on_next_values, on_bootstrap,
                   on_carry), units, numba_cpu._threads_for(rewards.size, units))
    like = p.rewards
    batch = (*shape[:-1], count)
    return {"rewards": numba_cpu._like(on_rewards.reshape(shape), like),
            "values": numba_cpu._like(on_values.reshape(shape), like),
            "next_values": None if p.next_values is None else numba_cpu._like(on_next_values.reshape(shape), like),
            "bootstrap": numba_cpu._like(on_bootstrap.reshape(batch), like),
            "carry": None if p.carry is None else numba_cpu._like(on_carry.reshape(batch), like)}


def _coefficient(value, dtype, shape):
    """(scalar, (rows, T) array): a float goes in the scalar beside an empty array, an array in the array."""
    if isinstance(value, float):
        return value, np.empty((0, 0), dtype=dtype)
    return 0.0, numba_cpu._rows(np.broadcast_to(numba_cpu._host(value), shape))


def _optional_arrays(p, dtype, shape):
    """The kernel's optional per-step arrays (``OPTIONAL`` order, an empty (0, 0) array where absent), then gamma's
    and lam's (scalar, per-step array) pairs."""
    gamma_scalar, gamma_steps = _coefficient(p.gamma, dtype, p.rewards.shape)
    lam_scalar, lam_steps = _coefficient(p.lam, dtype, p.rewards.shape)
    arrays = tuple(np.empty((0, 0), dtype=np.bool_ if name in FLAGS else dtype) if getattr(p, name) is None
                   else np.reshape(numba_cpu._host(getattr(p, name)), shape) for name in OPTIONAL)
    return (*arrays, gamma_scalar, gamma_steps, lam_scalar, lam_steps)


@functools.lru_cache(maxsize=64)
def _kernel(has_next: bool, has_terminated: bool, has_truncated: bool, has_mask: bool, has_critic: bool,
            gamma_per_step: bool, lam_per_step: bool, critic_per_step: bool):
    """The adjoint pass, compiled once per combination of the optional arrays present and of the coefficients
    given per step (constants of the code, not a test per step).

    A task walks one segment of two rows side by side: the two chains are
    independent, so one's multiply-add need not wait for the other's. At
    B=8, T=131072, float32, one thread (fastest of 10, a busy machine): one
    row at a time with per-step tests 2.6 ms, in pairs 1.9 ms, in pairs with
    the tests compiled away 1.5 ms; the forward kernel 2.1 ms. The last
    row of an odd count is walked twice, writing the same values. ``step``
    takes and returns numbers only: an array passed to an inlined function
    costs a reference count per step, so the loads and stores of the two
    rows are written out. The kernel solves the tasks ``first .. stop - 1``
    (shared between threads by ``gae_xp.backends._sharing``).
    """
    import numba

    @numba.njit(inline="always")
    def step(phi, psi, into_phi, into_psi, pending, gamma, lam, critic, ended, cut, real, upstream_a, upstream_r):
        # phi, psi: the gradient flowing into the running advantage (and the critic's); into_*: the coefficients
        # that carry them into the next step (0 at the segment's start); pending: what the previous real step's
        # Vnext sends to V at the next real step (or to the bootstrap value).
        if has_critic:
            phi = upstream_a + (into_phi * phi if into_phi != 0.0 else 0.0)
            psi = upstream_r + (into_psi * psi if into_psi != 0.0 else 0.0)
            on_delta = phi + psi if real else 0.0
        else:
            phi = upstream_a + upstream_r + (into_phi * phi if into_phi != 0.0 else 0.0)
            on_delta = phi if real else 0.0
        # d delta_t / d Vnext_t is gamma_t, or 0 at a terminated step (chosen, not multiplied).
        bootstrapped = 0.0 if ended or not real else gamma * on_delta
        if has_next:
            on_value = upstream_r - on_delta
        else:
            on_value = upstream_r - on_delta + (pending if real else 0.0)
            pending = bootstrapped if real else pending
        into_phi = (0.0 if cut else gamma * lam) if real else 1.0
        if has_critic:
            into_psi = (0.0 if cut else gamma * critic) if real else 1.0
        return phi, psi, into_phi, into_psi, pending, on_delta, on_value, bootstrapped

    @numba.njit(inline="always")
    def leaving(phi, psi, into_phi, into_psi):
        # The gradient to the carry that entered the segment after its last step.
        out = into_phi * phi if into_phi != 0.0 else 0.0
        if has_critic and into_psi != 0.0:
            out += into_psi * psi
        return out

    def backward_segments(grad_advantages, grad_returns, offsets, terminated, truncated, mask, gamma_scalar,
                          gamma_steps, lam_scalar, lam_steps, critic_scalar, critic_steps, fill_masked,
                          on_rewards, on_values, on_next_values, on_bootstrap, on_carry, first, stop):
        n_rows, n_segments = grad_advantages.shape[0], offsets.shape[0] - 1
        has_carry = on_carry.shape[0] > 0
        for s in range(first, stop):
            pair = s // n_segments
            segment = s - pair * n_segments
            a, b = 2 * pair, min(2 * pair + 1, n_rows - 1)
            phi_a, psi_a, into_phi_a, into_psi_a, pending_a = 0.0, 0.0, 0.0, 0.0, 0.0
            phi_b, psi_b, into_phi_b, into_psi_b, pending_b = 0.0, 0.0, 0.0, 0.0, 0.0
            for t in range(offsets[segment], offsets[segment + 1]):
                # The same loads for both rows, written out (see the docstring).
                ended_a = has_terminated and terminated[a, t]
                ended_b = has_terminated and terminated[b, t]
                cut_a = ended_a or (has_truncated and truncated[a, t])
                cut_b = ended_b or (has_truncated and truncated[b, t])
                real_a, real_b = not has_mask or mask[a, t], not has_mask or mask[b, t]
                kept_a, kept_b = real_a or fill_masked, real_b or fill_masked
                gamma_a = np.float64(gamma_steps[a, t]) if gamma_per_step else gamma_scalar
                gamma_b = np.float64(gamma_steps[b, t]) if gamma_per_step else gamma_scalar
                lam_a = np.float64(lam_steps[a, t]) if lam_per_step else lam_scalar
                lam_b = np.float64(lam_steps[b, t]) if lam_per_step else lam_scalar
                critic_a = np.float64(critic_steps[a, t]) if critic_per_step else critic_scalar
                critic_b = np.float64(critic_steps[b, t]) if critic_per_step else critic_scalar
                upstream_a = np.float64(grad_advantages[a, t]) if kept_a else 0.0
                upstream_b = np.float64(grad_advantages[b, t]) if kept_b else 0.0
                returns_a = np.float64(grad_returns[a, t]) if kept_a else 0.0
                returns_b = np.float64(grad_returns[b, t]) if kept_b else 0.0
                phi_a, psi_a, into_phi_a, into_psi_a, pending_a, on_delta_a, on_value_a, on_next_a = step(
                    phi_a, psi_a, into_phi_a, into_psi_a, pending_a, gamma_a, lam_a, critic_a, ended_a, cut_a, real_a,
                    upstream_a, returns_a)
                phi_b, psi_b, into_phi_b, into_psi_b, pending_b, on_delta_b, on_value_b, on_next_b = step(
                    phi_b, psi_b, into_phi_b, into_psi_b, pending_b, gamma_b, lam_b, critic_b, ended_b, cut_b, real_b,
                    upstream_b, returns_b)
                on_rewards[a, t], on_values[a, t] = on_delta_a, on_value_a
                on_rewards[b, t], on_values[b, t] = on_delta_b, on_value_b
                if has_next:
                    on_next_values[a, t], on_next_values[b, t] = on_next_a, on_next_b
            on_bootstrap[a, segment] = 0.0 if has_next else pending_a
            on_bootstrap[b, segment] = 0.0 if has_next else pending_b
            if has_carry:
                on_carry[a, segment] = leaving(phi_a, psi_a, into_phi_a, into_psi_a)
                on_carry[b, segment] = leaving(phi_b, psi_b, into_phi_b, into_psi_b)

    return numba.njit(nogil=True)(backward_segments)
