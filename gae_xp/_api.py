"""The public functions: check the arguments, lay the problem out, hand it to a backend."""

from __future__ import annotations

from dataclasses import dataclass

from gae_xp import backends

from . import _inputs as inputs
from ._scan import fold_initial


def gae(
    rewards,
    values,
    *,
    gamma=0.99,
    lam=0.95,
    bootstrap_value=None,
    next_values=None,
    terminated=None,
    truncated=None,
    mask=None,
    axis=-1,
    chunk_size=None,
    backend="auto",
    fill_masked=False,
):
    r"""Generalized Advantage Estimation; returns ``(advantages, returns)``.

    Time is ``axis``; every other axis is batch. With ``done_t = terminated_t or truncated_t``::

        Vnext_t = next_values[t]            if next_values is given,
                  V at the next real step   else (skipping masked steps),
                  bootstrap_value           after the last real step (default 0)
        delta_t = r_t + gamma_t (1 - terminated_t) Vnext_t - V_t
        A_t     = delta_t + gamma_t lam_t (1 - done_t) A_{t+1},     A_T = 0
        returns = A + V

    Args:
        rewards, values: arrays of one shape (any array-API library).
        gamma, lam: floats in [0, 1], or arrays broadcastable to ``rewards``
            (per-step or per-row discounts).
        bootstrap_value: the value after the last step, a float or an array
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
        chunk_size: chunk length C of the scan; None picks it by the rule in
            ``gae_xp._scan.choose_chunk_size``.
        backend: "auto" (the fastest installed path for these arrays) or a
            name from ``gae_xp.backends.names()``, such as "xp".
        fill_masked: what a masked step gets. False (default): 0 in both
            outputs. True (verl's convention): the advantage of the next real
            step (0 after the last one), and returns = that + its own value.

    The outputs have the inputs' namespace, device and floating dtype
    (float16/bfloat16 are computed in float32; integer rewards give the
    namespace's default float). Inputs are never modified.
    """
    call = prepare(rewards, values, gamma=gamma, lam=lam, bootstrap_value=bootstrap_value, next_values=next_values,
                   terminated=terminated, truncated=truncated, mask=mask, axis=axis, chunk_size=chunk_size,
                   backend=backend, fill_masked=fill_masked)
    advantages, returns = call.solver.gae(call.problem, chunk_size=call.chunk_size)
    return call.restore(advantages), call.restore(returns)


@dataclass(frozen=True)
class PreparedCall:
    """A checked call: the problem (time last, compute dtype), its backend, and how to lay results out again."""

    problem: inputs.GaeProblem
    solver: object
    chunk_size: int | None
    out_dtype: object
    axis: int

    def restore(self, result):
        """A result in the output dtype, with time back on the caller's axis."""
        return _restore(self.problem.xp, result, self.out_dtype, self.axis)


def prepare(rewards, values=None, *, gamma=0.99, lam=0.95, bootstrap_value=None, next_values=None,
            terminated=None, truncated=None, mask=None, axis=-1, chunk_size=None, backend="auto",
            extra=None, fill_masked=False) -> PreparedCall:
    """Check the arguments shared by gae() and the other estimators, and lay them out as a GaeProblem.

    ``values`` may be None for estimators without a value function; ``extra``
    names further per-step float arrays (shape of rewards) to check, cast and
    lay out the same way: they land in ``problem.extra``.
    """
    extra = extra or {}
    inputs.require_array("rewards", rewards)
    if values is not None:
        inputs.require_array("values", values)
    arrays = {
        "rewards": rewards, "values": values, "next_values": next_values, "terminated": terminated,
        "truncated": truncated, "mask": mask, "gamma": gamma, "lam": lam, "bootstrap_value": bootstrap_value,
        **extra,
    }
    xp = inputs.namespace_of(arrays)
    inputs.check_same_device(arrays, "rewards")
    shape = tuple(rewards.shape)
    axis = inputs.check_axis(axis, len(shape))
    chunk_size = inputs.check_chunk_size(chunk_size)
    for name, value in {"values": values, "next_values": next_values, **extra}.items():
        if value is not None:
            inputs.require_array(name, value)
            inputs.same_shape(name, value, shape)
    if next_values is not None and bootstrap_value is not None:
        raise ValueError("pass bootstrap_value or next_values, not both: next_values already holds every V(s_{t+1})")
    out_dtype, dtype = inputs.compute_dtypes(
        xp, {"rewards": rewards, "values": values, "next_values": next_values, "bootstrap_value": bootstrap_value,
             **extra}, rewards)
    batch_shape = shape[:axis] + shape[axis + 1:]
    problem = inputs.GaeProblem(
        xp=xp,
        rewards=inputs.time_last(xp, rewards, dtype, axis),
        values=None if values is None else inputs.time_last(xp, values, dtype, axis),
        gamma=inputs.coefficient(xp, "gamma", gamma, shape, dtype, axis, unit_interval=True),
        lam=inputs.coefficient(xp, "lam", lam, shape, dtype, axis, unit_interval=True),
        bootstrap=inputs.boundary(xp, "bootstrap_value", 0.0 if bootstrap_value is None else bootstrap_value,
                                  batch_shape, dtype, rewards),
        next_values=None if next_values is None else inputs.time_last(xp, next_values, dtype, axis),
        terminated=None if terminated is None else inputs.flag(xp, "terminated", terminated, shape, axis),
        truncated=None if truncated is None else inputs.flag(xp, "truncated", truncated, shape, axis),
        mask=None if mask is None else inputs.bool_mask(xp, mask, shape, axis),
        fill_masked=fill_masked,
        extra={name: inputs.time_last(xp, value, dtype, axis) for name, value in extra.items()},
    )
    solver = backends.select(backend, xp, inputs.arrays_among(arrays))
    return PreparedCall(problem, solver, chunk_size, out_dtype, axis)


def discounted_cumsum(x, discount, *, axis=-1, reverse=True, initial=None, chunk_size=None, backend="auto"):
    r"""The scan primitive: a discounted cumulative sum along ``axis``.

    ::

        reverse=True:   y_t = x_t + discount_t * y_{t+1},   y_T  = initial (default 0)
        reverse=False:  y_t = x_t + discount_t * y_{t-1},   y_-1 = initial (default 0)

    ``discount`` is a float or an array broadcastable to ``x`` (any real
    value, NaN rejected); ``initial`` a float or an array of the batch shape.
    ``y`` has x's namespace, device and floating dtype (integer or bool x
    gives the namespace's default float). ``gae()`` is built on this scan.
    """
    inputs.require_array("x", x)
    arrays = {"x": x, "discount": discount, "initial": initial}
    xp = inputs.namespace_of(arrays)
    inputs.check_same_device(arrays, "x")
    shape = tuple(x.shape)
    axis = inputs.check_axis(axis, len(shape))
    chunk_size = inputs.check_chunk_size(chunk_size)
    if not isinstance(reverse, bool):
        raise TypeError(f"reverse must be a bool, got {type(reverse).__name__}")
    out_dtype, dtype = inputs.compute_dtypes(xp, {"x": x, "initial": initial}, x)
    a = inputs.coefficient(xp, "discount", discount, shape, dtype, axis, unit_interval=False)
    y = inputs.time_last(xp, x, dtype, axis)
    if initial is not None and shape[axis] > 0:
        batch_shape = shape[:axis] + shape[axis + 1:]
        y = fold_initial(xp, y, a, inputs.boundary(xp, "initial", initial, batch_shape, dtype, x), reverse=reverse)
    solver = backends.select(backend, xp, inputs.arrays_among(arrays))
    return _restore(xp, solver.scan(xp, y, a, reverse=reverse, chunk_size=chunk_size), out_dtype, axis)


def _restore(xp, result, dtype, axis):
    return xp.moveaxis(xp.astype(result, dtype, copy=False), -1, axis)
