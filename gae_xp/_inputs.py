"""Argument checks and the preparation of a problem for a backend.

Every check names the argument and what was expected. Nothing here writes into
an input: arrays are cast with ``astype(copy=False)`` and moved with
``moveaxis``, which return new arrays or views.
"""

from __future__ import annotations

import math
import numbers
import operator
from dataclasses import dataclass, field
from typing import Any

from array_api_compat import array_namespace, is_array_api_obj, is_lazy_array
from array_api_compat import device as device_of

Array = Any


@dataclass(frozen=True)
class GaeProblem:
    """A ``gae()`` call, checked and laid out for a backend.

    Every array is in the compute dtype (float32 or float64), with time on the
    last axis. ``gamma`` and ``lam`` are Python floats or arrays shaped like
    ``rewards``; ``bootstrap`` has the batch shape plus a trailing axis of 1.
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
    next_values: Array | None
    terminated: Array | None
    truncated: Array | None
    mask: Array | None
    fill_masked: bool = False
    extra: dict = field(default_factory=dict)

    @property
    def is_constant(self) -> bool:
        """True when the coefficient gamma*lam is one Python float for every step."""
        return (
            isinstance(self.gamma, float)
            and isinstance(self.lam, float)
            and self.terminated is None
            and self.truncated is None
            and self.mask is None
        )


def arrays_among(named: dict[str, Any]) -> list:
    """The arguments that are arrays (not None, not Python numbers)."""
    return [value for value in named.values() if _is_array(value)]


def _is_array(value) -> bool:
    return value is not None and is_array_api_obj(value) and not isinstance(value, numbers.Number)


def namespace_of(named: dict[str, Any]):
    """The array namespace shared by the named arrays; TypeError naming the odd one out."""
    arrays = {name: value for name, value in named.items() if _is_array(value)}
    try:
        return array_namespace(*arrays.values())
    except TypeError:
        first_name, first = next(iter(arrays.items()))
        reference = array_namespace(first)
        for name, value in arrays.items():
            try:
                same = array_namespace(value) is reference
            except TypeError:
                same = False
            if not same:
                raise TypeError(
                    f"{name} is a {type(value).__module__}.{type(value).__name__}, but {first_name} is a "
                    f"{type(first).__module__}.{type(first).__name__}: pass arrays of one library"
                ) from None
        raise


def require_array(name: str, value) -> None:
    if not is_array_api_obj(value) or isinstance(value, numbers.Number):
        raise TypeError(f"{name} must be an array (NumPy, PyTorch, CuPy, JAX, ...), got {type(value).__name__}")


def check_same_device(named: dict[str, Any], anchor: str) -> None:
    """ValueError naming the first array on another device than ``anchor`` (a traced array, device None, is not compared)."""
    where = device_of(named[anchor])
    for name, value in named.items():
        if not _is_array(value):
            continue
        other = device_of(value)
        if where is not None and other is not None and other != where:
            raise ValueError(f"{name} is on device {other}, but {anchor} is on {where}: move them to one device")


def check_axis(axis, ndim: int) -> int:
    if isinstance(axis, bool) or not isinstance(axis, numbers.Integral):
        raise TypeError(f"axis must be an int, got {type(axis).__name__}")
    if ndim == 0:
        raise ValueError("rewards must have at least one dimension (time)")
    if not -ndim <= axis < ndim:
        raise ValueError(f"axis {axis} is out of range for an array of {ndim} dimensions")
    return int(axis) % ndim


def check_chunk_size(chunk_size) -> int | None:
    if chunk_size is None:
        return None
    if isinstance(chunk_size, bool):
        raise TypeError("chunk_size must be a positive int or None, got a bool")
    try:
        size = operator.index(chunk_size)
    except TypeError:
        raise TypeError(f"chunk_size must be a positive int or None, got {type(chunk_size).__name__}") from None
    if size <= 0:
        raise ValueError(f"chunk_size must be a positive int, got {size}")
    return size


def compute_dtypes(xp, arrays: dict[str, Any], anchor):
    """(output dtype, compute dtype) for the floating inputs.

    The output dtype is the promotion of the floating inputs, or the
    namespace's default float when there are none (integer or bool rewards).
    float16/bfloat16 are computed in float32.
    """
    floats = []
    for name, value in arrays.items():
        if value is None or not is_array_api_obj(value):
            continue
        if xp.isdtype(value.dtype, "complex floating"):
            raise TypeError(f"{name} must be real, got dtype {value.dtype}")
        if xp.isdtype(value.dtype, "real floating"):
            floats.append(value.dtype)
        elif not xp.isdtype(value.dtype, ("integral", "bool")):
            raise TypeError(f"{name} must have a real or bool dtype, got {value.dtype}")
    if floats:
        out = xp.result_type(*floats)
    else:
        out = xp.__array_namespace_info__().default_dtypes(device=device_of(anchor))["real floating"]
    compute = out if out in (xp.float32, xp.float64) else xp.float32
    return out, compute


def same_shape(name: str, value, shape) -> None:
    if tuple(value.shape) != tuple(shape):
        raise ValueError(f"{name} must have the shape of rewards {tuple(shape)}, got {tuple(value.shape)}")


def coefficient(xp, name: str, value, shape, dtype, axis: int, *, unit_interval: bool):
    """A discount-like argument: a Python float, or an array broadcast to ``shape`` with time moved last."""
    if isinstance(value, numbers.Real) and not isinstance(value, bool):
        value = float(value)
        if math.isnan(value) or (unit_interval and not 0.0 <= value <= 1.0):
            raise ValueError(f"{name} must be {'in [0, 1]' if unit_interval else 'a number'}, got {value}")
        return value
    if not is_array_api_obj(value):
        raise TypeError(f"{name} must be a float or an array, got {type(value).__name__}")
    if not xp.isdtype(value.dtype, ("real floating", "integral")):
        raise TypeError(f"{name} must have a real dtype, got {value.dtype}")
    try:
        value = xp.broadcast_to(xp.astype(value, dtype, copy=False), tuple(shape))
    except (ValueError, RuntimeError, TypeError):
        raise ValueError(f"{name} of shape {tuple(value.shape)} does not broadcast to the inputs' shape {tuple(shape)}") from None
    if not is_lazy_array(value):
        valid = (value >= 0) & (value <= 1) if unit_interval else value == value
        if not bool(xp.all(valid)):
            raise ValueError(f"{name} must hold values {'in [0, 1]' if unit_interval else 'that are not NaN'}, got one outside")
    return xp.moveaxis(value, axis, -1)


def boundary(xp, name: str, value, batch_shape, dtype, like):
    """A per-row boundary value (bootstrap_value, initial): a number or an array broadcastable to the batch shape."""
    if isinstance(value, numbers.Real) and not isinstance(value, bool):
        return xp.full((*batch_shape, 1), float(value), dtype=dtype, device=device_of(like))
    if not is_array_api_obj(value):
        raise TypeError(f"{name} must be a float or an array, got {type(value).__name__}")
    if not xp.isdtype(value.dtype, ("real floating", "integral", "bool")):
        raise TypeError(f"{name} must have a real dtype, got {value.dtype}")
    try:
        value = xp.broadcast_to(xp.astype(value, dtype, copy=False), tuple(batch_shape))
    except (ValueError, RuntimeError, TypeError):
        raise ValueError(
            f"{name} of shape {tuple(value.shape)} does not broadcast to the batch shape {tuple(batch_shape)} "
            "(the inputs' shape without the time axis)"
        ) from None
    return xp.expand_dims(value, axis=-1)


def flag(xp, name: str, value, shape, axis: int):
    """terminated / truncated: bool, or numbers read as value != 0; time moved last."""
    require_array(name, value)
    same_shape(name, value, shape)
    if not xp.isdtype(value.dtype, "bool"):
        if not xp.isdtype(value.dtype, ("real floating", "integral")):
            raise TypeError(f"{name} must be bool or real, got dtype {value.dtype}")
        value = value != 0
    return xp.moveaxis(value, axis, -1)


def bool_mask(xp, value, shape, axis: int):
    require_array("mask", value)
    same_shape("mask", value, shape)
    if not xp.isdtype(value.dtype, "bool"):
        raise TypeError(f"mask must have dtype bool (True = a real step), got {value.dtype}")
    return xp.moveaxis(value, axis, -1)


def time_last(xp, value, dtype, axis: int):
    return xp.moveaxis(xp.astype(value, dtype, copy=False), axis, -1)
