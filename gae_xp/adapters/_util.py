"""Small helpers shared by the adapters, built on gae_xp's public API (and its one import point for array-api-compat)."""

from __future__ import annotations

import contextlib
import numbers

import gae_xp
from gae_xp._compat import array_namespace, device_of, is_jax_array, is_torch_array
from gae_xp._compat import values_are_readable as readable


class ShapeError(ValueError, AssertionError):
    """A shape the framework refuses with an assertion (slime, rlax's chex): catchable as either."""


class DTypeError(TypeError, AssertionError):
    """A dtype the framework refuses with an assertion (rlax's chex): catchable as either."""


def no_grad(like):
    """torch.no_grad() for torch tensors (verl and OpenRLHF run under it), else a no-op context."""
    if is_torch_array(like):
        import torch

        return torch.no_grad()
    return contextlib.nullcontext()


def stop_gradient(x):
    """jax.lax.stop_gradient for JAX arrays, detach() for torch tensors, x itself elsewhere."""
    if is_jax_array(x):
        import jax

        return jax.lax.stop_gradient(x)
    if is_torch_array(x):
        return x.detach()
    return x


def float_dtype(xp, *arrays):
    """The promoted floating dtype of the arrays (the namespace's default float when none is floating)."""
    floats = [a.dtype for a in arrays if xp.isdtype(a.dtype, "real floating")]
    if floats:
        return xp.result_type(*floats)
    return xp.__array_namespace_info__().default_dtypes(device=device_of(arrays[0]))["real floating"]


def following(xp, a, fill, axis=-1):
    """``a`` shifted one step back along ``axis``: out[t] = a[t + 1], and ``fill`` (an array of one step) last."""
    axis = axis % a.ndim
    index = [slice(None)] * a.ndim
    index[axis] = slice(1, None)
    return xp.concat([a[tuple(index)], fill], axis=axis)


def take_last(a, axis=-1):
    """The last step along ``axis``, keeping the axis (length 1)."""
    axis = axis % a.ndim
    index = [slice(None)] * a.ndim
    index[axis] = slice(-1, None)
    return a[tuple(index)]


def scan(x, a, *, axis=-1, initial=None):
    r"""``y_t = x_t + a_t y_{t+1}``, ``y_T = initial``, for any real coefficients ``a``.

    ``gae_xp.discounted_cumsum`` takes |a| <= 1. Importance-weighted traces
    (torchrl's ``c_thresh`` above 1, rlax's lambda above 1) can exceed 1, so
    such coefficients are rescaled: with ``m_t = max(1, |a_t|)``, ``b_t = a_t / m_t``
    and ``s_t = prod m`` from t to the next zero coefficient (a cut),
    ``z = discounted_cumsum(x / s, b)`` and ``y = s z``. Where every |a| <= 1,
    s is exactly 1 and this is discounted_cumsum itself. Arrays whose values
    cannot be read (traced) always take the rescaled form (the same numbers).
    """
    xp = array_namespace(x)
    if isinstance(a, numbers.Real) and not isinstance(a, bool):
        if abs(a) <= 1:
            return gae_xp.discounted_cumsum(x, float(a), axis=axis, initial=initial)
        a = xp.full(x.shape, float(a), dtype=x.dtype, device=device_of(x))
    if readable(a) and bool(xp.all(xp.abs(a) <= 1)):
        return gae_xp.discounted_cumsum(x, a, axis=axis, initial=initial)
    a = xp.broadcast_to(a, tuple(x.shape))
    if xp.isdtype(x.dtype, "real floating"):
        a = xp.astype(a, x.dtype, copy=False)
    one = xp.ones((), dtype=a.dtype, device=device_of(a))
    magnitude = xp.maximum(xp.abs(a), one)
    keep = xp.where(a != 0, one, xp.zeros_like(one))
    scale = xp.exp(gae_xp.discounted_cumsum(xp.log(magnitude), keep, axis=axis))
    return gae_xp.discounted_cumsum(x / scale, a / magnitude, axis=axis, initial=initial) * scale
