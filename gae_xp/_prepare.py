"""Argument checks and layout: every public function turns its arguments into a problem for a backend here.

Every check names the argument and what was expected. Nothing here writes
into an input: arrays are cast with ``astype(copy=False)`` and moved with
``moveaxis``, which return new arrays or views; a backend that needs to
write gets its own copy (see ``gae_xp._scan.scan``).

Conventions settled here, for every namespace:

* time goes last (``axis`` is moved to -1) and comes back in ``restore``;
* the compute dtype is float32 for float16/bfloat16/float32 data, float64
  for float64 and wider floats (NumPy's longdouble is computed in float64
  and returned as longdouble); integer or bool data gives the namespace's
  default float;
* Python numbers, NumPy scalars and 0-d arrays given as a boundary value
  (``bootstrap_value``, ``initial``) are weakly typed: they never change
  the output dtype;
* value checks (gamma and lam in [0, 1], a discount in [-1, 1]) run on
  every array whose values can be read now (NumPy, PyTorch, CuPy, eager
  JAX); only traced values (``jax.jit``, ``torch.compile``, ``torch.func``,
  meta tensors, Dask) skip them.
"""

from __future__ import annotations

import numbers
import operator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from gae_xp import backends

from ._compat import array_namespace, device_of, is_array, owned_copy, values_are_readable
from ._scan import fold_boundary

Array = Any


@dataclass(frozen=True)
class GaeProblem:
    """A ``gae()`` call (or an estimator's), checked and laid out for a backend.

    Every float array is in the compute dtype (float32 or float64), with time
    on the last axis. ``gamma`` and ``lam`` are Python floats or arrays shaped
    like ``rewards``.

    Segments: the time axis is cut into ``n`` segments, ``[offsets[i],
    offsets[i+1])`` (packed sequences, ``cu_seqlens``); without ``offsets``
    the whole axis is one segment. Nothing crosses a segment's end in either
    chain: after its last step the value is ``bootstrap[..., i]`` and the
    advantage is ``carry[..., i]`` (0 when ``carry`` is None), so a segment
    whose right neighbour lives elsewhere (a rank's shard, a Dask block) is
    solved by passing the neighbour's numbers there. ``bootstrap`` (and
    ``carry``) have the batch shape plus a trailing axis of n (1 without
    offsets); ``offsets`` is an integer array ``0 = o_0 < o_1 < ... < o_n = T``
    of the inputs' namespace and device. ``terminated``, ``truncated`` and ``mask`` are bool arrays or None.
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
    offsets: Array | None = None
    carry: Array | None = None

    @property
    def is_constant(self) -> bool:
        """True when the coefficient gamma*lam is one Python float for every step (no cut but the row's end)."""
        return (isinstance(self.gamma, float) and isinstance(self.lam, float) and self.terminated is None
                and self.truncated is None and self.mask is None and self.offsets is None)


@dataclass(frozen=True)
class PreparedCall:
    """A checked call: the problem (time last, compute dtype), its backend, and how to lay results out again."""

    problem: GaeProblem
    solver: Any
    chunk_size: int | None
    out_dtype: Any
    axis: int

    def restore(self, result):
        """A result in the output dtype, with time back on the caller's axis."""
        return restore(self.problem.xp, result, self.out_dtype, self.axis)


def prepare(rewards, values=None, *, gamma=0.99, lam=0.95, bootstrap_value=None, next_values=None,
            terminated=None, truncated=None, mask=None, axis=-1, chunk_size=None, backend="auto",
            extra=None, fill_masked=False, needs_values=True, cu_seqlens=None, pieces=False) -> PreparedCall:
    """Check the arguments shared by gae() and the estimators, and lay them out as a GaeProblem.

    ``needs_values=False`` is for estimators without a value function
    (``values`` must then be None). ``extra`` names further per-step float
    arrays (shape of rewards) to check, cast and lay out the same way: they
    land in ``problem.extra``. ``cu_seqlens`` (packed sequences) becomes the
    problem's ``offsets``; ``bootstrap_value`` is then per sequence.
    ``pieces=True`` says the caller will give the problem segments or a carry
    (a rank's shard): the backend chosen must take them.
    """
    extra = extra or {}
    require_array("rewards", rewards)
    if needs_values:
        require_array("values", values)
    per_step = {"values": values, "next_values": next_values, **extra}
    arrays = {"rewards": rewards, **per_step, "terminated": terminated, "truncated": truncated, "mask": mask,
              "gamma": gamma, "lam": lam, "bootstrap_value": bootstrap_value, "cu_seqlens": cu_seqlens}
    present = {name: value for name, value in arrays.items() if is_array(value)}
    xp = namespace_of(present)
    check_same_device(present, "rewards")
    shape = tuple(rewards.shape)
    axis = check_axis(axis, len(shape))
    offsets = None if cu_seqlens is None else check_offsets(xp, cu_seqlens, shape[axis])
    chunk_size = check_chunk_size(chunk_size)
    check_bool("fill_masked", fill_masked)
    for name, value in per_step.items():
        if value is not None:
            if name not in present:
                require_array(name, value)
            same_shape(name, value, shape)
    one_boundary(bootstrap_value, next_values)
    out_dtype, dtype = compute_dtypes(xp, {"rewards": rewards, **per_step, "bootstrap_value": bootstrap_value},
                                      rewards)
    batch_shape = shape[:axis] + shape[axis + 1:]
    problem = GaeProblem(
        xp=xp,
        rewards=time_last(xp, rewards, dtype, axis),
        values=None if values is None else time_last(xp, values, dtype, axis),
        gamma=coefficient(xp, "gamma", gamma, shape, dtype, axis, bounds=(0.0, 1.0)),
        lam=coefficient(xp, "lam", lam, shape, dtype, axis, bounds=(0.0, 1.0)),
        bootstrap=boundary(xp, "bootstrap_value", 0.0 if bootstrap_value is None else bootstrap_value,
                           batch_shape, dtype, rewards,
                           segments=None if offsets is None else int(offsets.shape[0]) - 1),
        next_values=None if next_values is None else time_last(xp, next_values, dtype, axis),
        terminated=None if terminated is None else flag(xp, "terminated", terminated, shape, axis),
        truncated=None if truncated is None else flag(xp, "truncated", truncated, shape, axis),
        mask=None if mask is None else bool_mask(xp, mask, shape, axis),
        fill_masked=fill_masked,
        extra={name: time_last(xp, value, dtype, axis) for name, value in extra.items()},
        offsets=offsets,
    )
    solver = backends.select(backend, xp, list(present.values()), segments=pieces or offsets is not None)
    return PreparedCall(problem, solver, chunk_size, out_dtype, axis)


@dataclass(frozen=True)
class PreparedScan:
    """A checked ``discounted_cumsum`` call: x (time last, compute dtype, this package's own copy) and the discount."""

    xp: Any
    x: Array
    discount: float | Array
    reverse: bool
    solver: Any
    chunk_size: int | None
    out_dtype: Any
    axis: int


def prepare_scan(x, discount, *, axis, reverse, initial, chunk_size, backend, name: str = "discount",
                 bounds: tuple[float, float] = (-1.0, 1.0)) -> PreparedScan:
    """Check ``discounted_cumsum``'s arguments; the boundary value ``initial`` is folded into the returned x.

    ``name`` and ``bounds`` are the discount's, as errors name it and as it
    is checked (the adapters' importance-weighted traces take any real value).
    """
    require_array("x", x)
    present = {name: value for name, value in {"x": x, "discount": discount, "initial": initial}.items()
               if is_array(value)}
    xp = namespace_of(present)
    check_same_device(present, "x")
    shape = tuple(x.shape)
    axis = check_axis(axis, len(shape), "x")
    chunk_size = check_chunk_size(chunk_size)
    check_bool("reverse", reverse)
    out_dtype, dtype = compute_dtypes(xp, {"x": x, "initial": initial}, x)
    a = coefficient(xp, name, discount, shape, dtype, axis, bounds=bounds)
    y = owned_copy(xp, time_last(xp, x, dtype, axis))
    if initial is not None and shape[axis] > 0:
        start = boundary(xp, "initial", initial, shape[:axis] + shape[axis + 1:], dtype, x)
        y = fold_boundary(xp, y, a, start, reverse=reverse)
    solver = backends.select(backend, xp, list(present.values()))
    return PreparedScan(xp, y, a, reverse, solver, chunk_size, out_dtype, axis)


def restore(xp, result, dtype, axis: int):
    """result in ``dtype`` with time moved from the last axis back to ``axis``."""
    result = xp.astype(result, dtype, copy=False)
    return result if axis == result.ndim - 1 else xp.moveaxis(result, -1, axis)


# --- the checks ------------------------------------------------------------------------------------------------


def require_array(name: str, value) -> None:
    if isinstance(value, np.ma.MaskedArray):
        raise TypeError(f"{name} is a numpy.ma.MaskedArray, whose mask gae_xp does not read: pass "
                        f"{name}.filled(...) or its .data, and give the real steps as mask=~{name}.mask")
    if not is_array(value):
        raise TypeError(f"{name} must be an array (NumPy, PyTorch, CuPy, JAX, ...), got {type(value).__name__}")


def one_boundary(bootstrap_value, next_values) -> None:
    """V after the last step comes from bootstrap_value or from next_values, never both."""
    if next_values is not None and bootstrap_value is not None:
        raise ValueError("pass bootstrap_value or next_values, not both: next_values already holds every V(s_{t+1})")


def namespace_of(arrays: dict[str, Any]):
    """The array namespace shared by the named arrays (the arguments that are arrays); TypeError naming the odd
    one out."""
    for name, value in arrays.items():
        require_array(name, value)
    if all(type(value) is np.ndarray for value in arrays.values()):
        return _numpy_namespace()  # the common case, without array_namespace's tour of the libraries
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


def _numpy_namespace():
    import array_api_compat.numpy

    return array_api_compat.numpy


def check_same_device(arrays: dict[str, Any], anchor: str) -> None:
    """ValueError naming the first array on another device than ``anchor`` (a traced array, device None, is not
    compared)."""
    if all(type(value) is np.ndarray for value in arrays.values()):
        return  # NumPy arrays all live on the CPU
    where = device_of(arrays[anchor])
    for name, value in arrays.items():
        other = device_of(value)
        if where is not None and other is not None and other != where:
            raise ValueError(f"{name} is on device {other}, but {anchor} is on {where}: move them to one device")


def check_axis(axis, ndim: int, name: str = "rewards") -> int:
    if isinstance(axis, bool) or not isinstance(axis, numbers.Integral):
        raise TypeError(f"axis must be an int, got {type(axis).__name__}")
    if ndim == 0:
        raise ValueError(f"{name} must have at least one dimension (time)")
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


def check_bool(name: str, value) -> None:
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name} must be a bool, got {type(value).__name__}")


def check_number(name: str, value, *, low: float, strict: bool) -> float:
    """A real number (Python or NumPy scalar) above ``low`` (or at least ``low`` when not strict), as a float."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a real number, got {type(value).__name__}")
    value = float(value)
    if not (value > low if strict else value >= low):
        raise ValueError(f"{name} must be {'above' if strict else 'at least'} {low}, got {value}")
    return value


def compute_dtypes(xp, arrays: dict[str, Any], anchor):
    """(output dtype, compute dtype) for the floating inputs; see the module docstring."""
    floats = []
    for name, value in arrays.items():
        if not is_array(value):
            continue
        if value.dtype in (xp.float32, xp.float64):  # the common case, without isdtype's lookups
            if not (name in ("bootstrap_value", "initial") and value.ndim == 0):
                floats.append(value.dtype)
            continue
        if xp.isdtype(value.dtype, "complex floating"):
            raise TypeError(f"{name} must be real, got dtype {value.dtype}")
        if not xp.isdtype(value.dtype, ("real floating", "integral", "bool")):
            raise TypeError(f"{name} must have a real or bool dtype, got {value.dtype}")
        weak = name in ("bootstrap_value", "initial") and value.ndim == 0
        if xp.isdtype(value.dtype, "real floating") and not weak:
            floats.append(value.dtype)
    if floats:
        out = floats[0] if all(f == floats[0] for f in floats) else xp.result_type(*floats)
    else:
        out = xp.__array_namespace_info__().default_dtypes(device=device_of(anchor))["real floating"]
    if out in (xp.float32, xp.float64):
        return out, out
    wider = np.dtype(out).itemsize > 8 if isinstance(out, np.dtype) else False
    return out, xp.float64 if wider else xp.float32


def same_shape(name: str, value, shape) -> None:
    if tuple(value.shape) != tuple(shape):
        raise ValueError(f"{name} must have the shape of rewards {tuple(shape)}, got {tuple(value.shape)}")


def coefficient(xp, name: str, value, shape, dtype, axis: int, *, bounds: tuple[float, float]):
    """A discount-like argument within ``bounds``: a Python float, or an array broadcast to ``shape``, time last."""
    low, high = bounds
    if isinstance(value, numbers.Real) and not isinstance(value, bool):
        value = float(value)
        if not low <= value <= high:  # NaN fails too
            raise ValueError(f"{name} must be in [{low:g}, {high:g}], got {value}")
        return value
    if not is_array(value):
        raise TypeError(f"{name} must be a float or an array, got {type(value).__name__}")
    if not xp.isdtype(value.dtype, ("real floating", "integral")):
        raise TypeError(f"{name} must have a real dtype, got {value.dtype}")
    try:
        value = xp.broadcast_to(xp.astype(value, dtype, copy=False), tuple(shape))
    except (ValueError, RuntimeError, TypeError):
        raise ValueError(f"{name} of shape {tuple(value.shape)} does not broadcast to the inputs' shape "
                         f"{tuple(shape)}") from None
    if values_are_readable(value) and not bool(xp.all((value >= low) & (value <= high))):
        raise ValueError(f"{name} must hold values in [{low:g}, {high:g}] (NaN is not allowed), got one outside")
    return value if axis == value.ndim - 1 else xp.moveaxis(value, axis, -1)


def boundary(xp, name: str, value, batch_shape, dtype, like, *, segments: int | None = None):
    """A per-row boundary value (bootstrap_value, initial): a number or an array broadcastable to the batch shape.

    Returned with a trailing axis of 1, or, for packed sequences
    (``segments`` = their count), one value per sequence: then ``value``
    broadcasts to the batch shape plus a trailing axis of ``segments``.
    """
    if isinstance(value, numbers.Real) and not isinstance(value, bool):
        return xp.full((*batch_shape, segments or 1), float(value), dtype=dtype, device=device_of(like))
    if not is_array(value):
        raise TypeError(f"{name} must be a float or an array, got {type(value).__name__}")
    if not xp.isdtype(value.dtype, ("real floating", "integral", "bool")):
        raise TypeError(f"{name} must have a real dtype, got {value.dtype}")
    if segments is not None:
        target = (*batch_shape, segments)
        try:
            return xp.broadcast_to(xp.astype(value, dtype, copy=False), target)
        except (ValueError, RuntimeError, TypeError):
            raise ValueError(
                f"{name} of shape {tuple(value.shape)} does not broadcast to {target}: with cu_seqlens it holds one "
                "value per sequence (the batch shape plus a trailing axis of len(cu_seqlens) - 1)"
            ) from None
    try:
        value = xp.broadcast_to(xp.astype(value, dtype, copy=False), tuple(batch_shape))
    except (ValueError, RuntimeError, TypeError):
        raise ValueError(
            f"{name} of shape {tuple(value.shape)} does not broadcast to the batch shape {tuple(batch_shape)} "
            "(the inputs' shape without the time axis)"
        ) from None
    return xp.expand_dims(value, axis=-1)


def check_offsets(xp, value, length: int):
    """cu_seqlens: a 1-D integer array of the inputs' library and device with ``0 = o_0 < o_1 < ... < o_n = T``.

    Namespace and device are checked with the other arrays; the values
    wherever they can be read (a CUDA array is read once: a small
    synchronisation). Returned as int64.
    """
    require_array("cu_seqlens", value)
    if not xp.isdtype(value.dtype, "integral"):
        raise TypeError(f"cu_seqlens must have an integer dtype (sequence offsets), got {value.dtype}")
    if value.ndim != 1 or value.shape[0] < 2:
        raise ValueError(f"cu_seqlens must be 1-D with at least 2 entries (0 and the total length {length}), "
                         f"got shape {tuple(value.shape)}")
    value = xp.astype(value, xp.int64, copy=False)
    if values_are_readable(value):
        first, last = int(value[0]), int(value[-1])
        if first != 0:
            raise ValueError(f"cu_seqlens must start at 0, got {first}")
        if last != length:
            raise ValueError(f"cu_seqlens must end at the length of the time axis, {length}, got {last}")
        if not bool(xp.all(value[1:] > value[:-1])):
            raise ValueError("cu_seqlens must be strictly increasing (every sequence has at least one step)")
    return value


def flag(xp, name: str, value, shape, axis: int):
    """terminated / truncated: bool, or numbers read as value != 0; time moved last."""
    require_array(name, value)
    same_shape(name, value, shape)
    if not xp.isdtype(value.dtype, "bool"):
        if not xp.isdtype(value.dtype, ("real floating", "integral")):
            raise TypeError(f"{name} must be bool or real, got dtype {value.dtype}")
        value = value != 0
    return value if axis == value.ndim - 1 else xp.moveaxis(value, axis, -1)


def bool_mask(xp, value, shape, axis: int):
    require_array("mask", value)
    same_shape("mask", value, shape)
    if not xp.isdtype(value.dtype, "bool"):
        raise TypeError(f"mask must have dtype bool (True = a real step), got {value.dtype}")
    return value if axis == value.ndim - 1 else xp.moveaxis(value, axis, -1)


def time_last(xp, value, dtype, axis: int):
    value = xp.astype(value, dtype, copy=False)
    return value if axis == value.ndim - 1 else xp.moveaxis(value, axis, -1)
