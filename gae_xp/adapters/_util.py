"""Small helpers shared by the adapters, built on gae_xp's estimators and its import point for array-api-compat."""

from __future__ import annotations

import contextlib
import math
import numbers
from typing import Any

from gae_xp._compat import device_of, is_jax_array, is_torch_array
from gae_xp.estimators import Array, Coefficient, linear_scan


class ShapeError(ValueError, AssertionError):
    """A shape the framework refuses with an assertion (slime, rlax's chex): catchable as either."""


class DTypeError(TypeError, AssertionError):
    """A dtype the framework refuses with an assertion (rlax's chex): catchable as either."""


def no_grad(like: Array) -> contextlib.AbstractContextManager:
    """torch.no_grad() for torch tensors (verl and OpenRLHF run under it), else a no-op context."""
    if is_torch_array(like):
        import torch

        return torch.no_grad()
    return contextlib.nullcontext()


def stop_gradient(x: Array) -> Array:
    """jax.lax.stop_gradient for JAX arrays, detach() for torch tensors, x itself elsewhere."""
    if is_jax_array(x):
        import jax

        return jax.lax.stop_gradient(x)
    if is_torch_array(x):
        return x.detach()
    return x


def float_dtype(xp: Any, *arrays: Array) -> Any:
    """The promoted floating dtype of the arrays (the namespace's default float when none is floating)."""
    floats = [a.dtype for a in arrays if xp.isdtype(a.dtype, "real floating")]
    if floats:
        return xp.result_type(*floats)
    return xp.__array_namespace_info__().default_dtypes(device=device_of(arrays[0]))["real floating"]


def like(xp: Any, value: Coefficient, array: Array) -> Array:
    """A threshold or coefficient (a real number or an array) as an array of ``array``'s dtype on its device."""
    if isinstance(value, numbers.Real) and not isinstance(value, bool):
        return xp.full((), float(value), dtype=array.dtype, device=device_of(array))  # made there: no host copy
    return xp.astype(value, array.dtype, copy=False)


def following(xp: Any, a: Array, fill: Array, axis: int = -1) -> Array:
    """``a`` shifted one step back along ``axis``: out[t] = a[t + 1], and ``fill`` (an array of one step) last."""
    axis = axis % a.ndim
    index = [slice(None)] * a.ndim
    index[axis] = slice(1, None)
    return xp.concat([a[tuple(index)], fill], axis=axis)


def take_last(a: Array, axis: int = -1) -> Array:
    """The last step along ``axis``, keeping the axis (length 1)."""
    axis = axis % a.ndim
    index = [slice(None)] * a.ndim
    index[axis] = slice(-1, None)
    return a[tuple(index)]


def scan(x: Array, a: Coefficient, *, axis: int = -1, initial: Coefficient | None = None,
         name: str = "the trace's coefficient") -> Array:
    r"""``y_t = x_t + a_t y_{t+1}``, ``y_T = initial``, for any real coefficients ``a``.

    ``gae_xp.discounted_cumsum`` takes |a| <= 1; importance-weighted traces
    (torchrl's ``c_thresh`` above 1, rlax's lambda above 1) can exceed it, and
    the scan solves them as they are (its products are those of the true
    coefficients, so they overflow only where the loop's values would). A NaN
    coefficient raises ValueError naming ``name``.
    """
    return linear_scan(x, a, axis=axis, initial=initial, name=name, bounds=(-math.inf, math.inf))
