"""Argument checks and layout: every public function turns its arguments into a problem for a backend here.

Every check names the argument and what was expected. Nothing here writes
into an input: arrays are cast with ``astype(copy=False)`` and moved with
``moveaxis``, which return new arrays or views; a backend that needs to
write gets its own copy (see ``gae_xp._scan.scan``).

Conventions settled here, for every namespace:

* time goes last (``axis`` is moved to -1) and comes back in ``restore``;
* the compute dtype is float32 for float16/bfloat16/float32 data (NumPy's
  bfloat16 and float8 from ml_dtypes too), float64 for float64 and wider
  floats (NumPy's longdouble is computed in float64 and returned as
  longdouble); integer or bool data gives the namespace's default float;
  NumPy data of non-native byte order (``'>f8'`` on a little-endian host)
  is computed and returned in its native counterpart (float64 for
  ``'>f8'``), as NumPy's own arithmetic returns it;
* Python numbers, NumPy scalars and 0-d arrays given as a boundary value
  (``bootstrap_value``, ``initial``) are weakly typed: they never change
  the output dtype;
* value checks (gamma and lam in [0, 1], a discount in [-1, 1]) run on
  every array whose values can be read now (NumPy, PyTorch, CuPy, eager
  JAX); only traced values (``jax.jit``, ``torch.compile``, ``torch.func``,
  meta tensors, Dask) skip them.
"""

from __future__ import annotations

import math
import numbers
import operator
from dataclasses import dataclass
from typing import Any

import numpy as np

from ._compat import (
    array_namespace,
    device_of,
    is_array,
    is_cupy_array,
    is_extension_float,
    is_torch_array,
    isdtype,
    owned_copy,
    to_device,
    torch_cpu_view,
    values_are_readable,
)
from ._problem import GaeProblem, PreparedCall, PreparedScan
from ._scan import fold_boundary

Array = Any


def prepare(rewards, values=None, *, gamma=0.99, lam=0.95, bootstrap_value=None, next_values=None,
            terminated=None, truncated=None, mask=None, axis=-1, chunk_size=None, backend="auto",
            extra=None, fill_masked=False, needs_values=True, cu_seqlens=None, critic_lam=None,
            sequences: int | None = None, truncated_bootstrap="next_values") -> PreparedCall:
    """Check the arguments shared by gae() and the estimators, and lay them out as a GaeProblem.

    ``needs_values=False`` is for estimators without a value function
    (``values`` must then be None). ``extra`` names further per-step float
    arrays (shape of rewards) to check, cast and lay out the same way: they
    land in ``problem.extra``. ``cu_seqlens`` (packed sequences) becomes the
    problem's ``offsets``; ``bootstrap_value`` is then per sequence.
    ``sequences`` says the bootstrap holds one value per sequence of that
    many although these steps carry no offsets (a rank's shard of packed
    sequences: its offsets are the CP context's). The backend is not chosen
    here: ``gae_xp.backends.solver(call)`` does that. ``truncated_bootstrap``
    is checked for estimators with a value function (``check_truncation``).
    """
    extra = extra or {}
    require_array("rewards", rewards)
    if needs_values:
        require_array("values", values)
    per_step = {"values": values, "next_values": next_values, **extra}
    arrays = {"rewards": rewards, **per_step, "terminated": terminated, "truncated": truncated, "mask": mask,
              "gamma": gamma, "lam": lam, "critic_lam": critic_lam, "bootstrap_value": bootstrap_value}
    if not is_host_offsets(cu_seqlens, rewards):
        arrays["cu_seqlens"] = cu_seqlens  # an array of the inputs' library: checked with them
    present = {name: value for name, value in arrays.items() if is_array(value)}
    xp = namespace_of(present)
    check_same_device(present, "rewards")
    shape = tuple(rewards.shape)
    axis = check_axis(axis, len(shape))
    offsets, host_offsets = (None, None) if cu_seqlens is None else check_offsets(xp, cu_seqlens, shape[axis],
                                                                                   rewards)
    offsets, offsets_valid = traced_offsets(xp, offsets, shape[axis]) if host_offsets is None else (offsets, None)
    chunk_size = check_chunk_size(chunk_size)
    check_bool("fill_masked", fill_masked)
    for name, value in per_step.items():
        if value is not None:
            if name not in present:
                require_array(name, value)
            if name == "values":
                values_one_step_longer(value, shape, axis)
            same_shape(name, value, shape)
    one_boundary(bootstrap_value, next_values)
    if is_array(bootstrap_value) and cu_seqlens is None and sequences is None:
        time_first_hint(bootstrap_value, shape, axis)
    out_dtype, dtype = compute_dtypes(xp, {"rewards": rewards, **per_step, "bootstrap_value": bootstrap_value},
                                      rewards)
    # float16/bfloat16 per-step arrays stay as they are for a backend that widens them in registers (no copy)
    steps = out_dtype if _reads_narrow(out_dtype, backend, xp, present, cu_seqlens is not None) else dtype
    batch_shape = shape[:axis] + shape[axis + 1:]
    problem = GaeProblem(
        xp=xp,
        rewards=time_last(xp, rewards, steps, axis),
        values=None if values is None else time_last(xp, values, steps, axis),
        gamma=coefficient(xp, "gamma", gamma, shape, steps, axis, bounds=(0.0, 1.0)),
        lam=coefficient(xp, "lam", lam, shape, steps, axis, bounds=(0.0, 1.0)),
        critic_lam=None if critic_lam is None else coefficient(xp, "critic_lam", critic_lam, shape, steps, axis,
                                                               bounds=(0.0, 1.0)),
        bootstrap=boundary(xp, "bootstrap_value", 0.0 if bootstrap_value is None else bootstrap_value,
                           batch_shape, dtype, rewards,
                           segments=sequences if offsets is None else int(offsets.shape[0]) - 1),
        next_values=None if next_values is None else time_last(xp, next_values, steps, axis),
        terminated=None if terminated is None else flag(xp, "terminated", terminated, shape, axis),
        truncated=None if truncated is None else flag(xp, "truncated", truncated, shape, axis),
        mask=None if mask is None else flag(xp, "mask", mask, shape, axis),
        fill_masked=fill_masked,
        extra={name: time_last(xp, value, steps, axis) for name, value in extra.items()},
        offsets=offsets,
        host_offsets=host_offsets,
    )
    if needs_values:  # after the flags' own checks (a flag of the wrong dtype is named as that first)
        check_truncation(truncated, next_values, truncated_bootstrap)
    return PreparedCall(problem, tuple(present.values()), backend, chunk_size, out_dtype, axis, offsets_valid)


def traced_offsets(xp, offsets, length: int):
    """(offsets, valid) for offsets whose values cannot be read now (``torch.compile``, ``jax.jit``, meta tensors):
    checked where the kernels run, so that none of them reads or writes outside its arrays.

    torch CPU tensors go through the operator ``gae_xp::checked_offsets``,
    which raises the ValueError of eager offsets when the graph runs (valid
    None); offsets elsewhere (CUDA, JAX) are guarded on their device
    (``guarded_offsets``: no synchronisation) and the outputs are NaN where they
    break the contract (``PreparedCall.restore``).
    """
    if offsets is None:
        return None, None
    if is_torch_array(offsets) and offsets.device.type == "cpu":
        from .backends import torch_ops

        return torch_ops.checked_offsets(offsets, length), None
    return guarded_offsets(xp, offsets, length)


def _reads_narrow(out_dtype, backend, xp, arrays, segments: bool) -> bool:
    """True when the output dtype is float16/bfloat16 and the backend that will serve these arrays reads such
    arrays itself (``narrow_floats``): the problem then keeps them (its bootstrap stays in the compute dtype)."""
    if str(out_dtype).rsplit(".", 1)[-1] not in ("float16", "bfloat16") or is_extension_float(out_dtype):
        return False  # ml_dtypes' NumPy bfloat16 is widened here, for every backend
    from . import backends

    try:
        solver = backends.select(backend, xp, list(arrays.values()), segments=segments)
    except (ValueError, backends._fallback.RouteUnavailableError):  # a forced backend that cannot run: solver says why
        return False
    return getattr(solver, "narrow_floats", False)


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
    return PreparedScan(xp, y, a, reverse, tuple(present.values()), backend, chunk_size, out_dtype, axis)


@dataclass(frozen=True)
class PreparedWhiten:
    """A checked ``whiten`` call: x in the compute dtype, the mask (None, bool or weights), its options."""

    xp: Any
    values: Array
    mask: Array | None
    out_dtype: Any
    eps: float
    unbiased: bool
    shift_mean: bool
    masked_fill: float | None

    def weights(self, dtype):
        """(weights in ``dtype``, where they are not 0), or (None, None) without a mask: a bool mask is the
        weights 0/1, and weight-0 entries are left out with ``where``, so nothing there leaks."""
        if self.mask is None:
            return None, None
        weights = self.xp.astype(self.mask, dtype)
        return weights, weights != 0


def prepare_whiten(x, mask, *, unbiased, eps, shift_mean, masked_fill) -> PreparedWhiten:
    """Check ``whiten``'s arguments (``gae_xp.whiten`` and ``gae_xp.distributed.whiten``), each error naming one."""
    arrays = {"x": x} if mask is None else {"x": x, "mask": mask}
    xp = namespace_of(arrays)
    check_same_device(arrays, "x")
    out_dtype, dtype = compute_dtypes(xp, {"x": x}, x)
    eps = check_number("eps", eps, low=0.0, strict=False)
    check_bool("unbiased", unbiased)
    check_bool("shift_mean", shift_mean)
    if masked_fill is not None:
        masked_fill = check_number("masked_fill", masked_fill, low=-math.inf, strict=False)
    if mask is not None:
        same_shape("mask", mask, x.shape, anchor="x")
        if not isdtype(xp, mask.dtype, ("bool", "real floating", "integral")):
            raise TypeError(f"mask must be bool (True = a real entry) or real weights, got dtype {mask.dtype}")
    return PreparedWhiten(xp, xp.astype(x, dtype, copy=False), mask, out_dtype, eps, bool(unbiased),
                          bool(shift_mean), masked_fill)


# --- the checks ------------------------------------------------------------------------------------------------


def require_array(name: str, value) -> None:
    if isinstance(value, np.ma.MaskedArray):
        raise TypeError(f"{name} is a numpy.ma.MaskedArray, whose mask gae_xp does not read: pass "
                        f"{name}.filled(...) or its .data, and give the real steps as mask=~{name}.mask")
    if isinstance(value, (list, tuple)):
        raise TypeError(f"{name} must be an array (NumPy, PyTorch, CuPy, JAX, ...), got a {type(value).__name__}: "
                        f"pass np.asarray({name}) (or your library's asarray)")
    if not is_array(value):
        raise TypeError(f"{name} must be an array (NumPy, PyTorch, CuPy, JAX, ...), got {type(value).__name__}")


def one_boundary(bootstrap_value, next_values) -> None:
    """V after the last step comes from bootstrap_value or from next_values, never both."""
    if next_values is not None and bootstrap_value is not None:
        raise ValueError("pass bootstrap_value or next_values, not both: next_values already holds every V(s_{t+1})")


#: What ``truncated_bootstrap`` may say: where V(s_{t+1}) of a truncated step comes from.
TRUNCATED_BOOTSTRAPS = ("next_values", "next_step")


def check_truncation(truncated, next_values, truncated_bootstrap) -> None:
    """``truncated`` needs V(s_{t+1}) of each truncated episode's final observation, which only ``next_values``
    holds; the next step's value belongs to the next episode. ValueError naming ``next_values`` unless the caller
    says ``truncated_bootstrap="next_step"`` (the next real step's value, or ``bootstrap_value`` after the last
    one, is the one meant: e.g. truncations only at the end of each row or sequence)."""
    if truncated_bootstrap not in TRUNCATED_BOOTSTRAPS:
        raise ValueError(f"truncated_bootstrap must be one of {TRUNCATED_BOOTSTRAPS}, got {truncated_bootstrap!r}")
    if truncated_bootstrap == "next_step":
        if next_values is not None:
            raise ValueError('truncated_bootstrap="next_step" bootstraps from the next step\'s value, but '
                             "next_values is given and replaces it: drop one of them")
        return
    if truncated is not None and next_values is None:
        raise ValueError(
            "truncated is given without next_values: a truncated step would be bootstrapped from the value at the "
            "next step, which is the next episode's first value. Pass next_values= (an array shaped like rewards "
            "holding V(s_{t+1}): at each truncated step, the value of the truncated episode's final observation; "
            "e.g. next_values = concat(values[..., 1:], bootstrap) with V(final_obs) written where truncated), or "
            'truncated_bootstrap="next_step" if the next step\'s value (bootstrap_value after the last step) is '
            "the one you mean, as when truncations fall only at the end of each row or sequence")


def namespace_of(arrays: dict[str, Any]):
    """The array namespace shared by the named arrays (the arguments that are arrays); TypeError naming the odd
    one out."""
    if all(type(value) is np.ndarray for value in arrays.values()):
        return _numpy_namespace()  # the common case (arrays, none a MaskedArray), without array_namespace's tour
    for name, value in arrays.items():
        require_array(name, value)
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
    if type(axis) is not int and (isinstance(axis, bool) or not isinstance(axis, numbers.Integral)):
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


def check_number(name: str, value, *, low: float, strict: bool, high: float = math.inf,
                 finite: bool = False) -> float:
    """A real number (Python or NumPy scalar) above ``low`` (or at least ``low`` when not strict), at most
    ``high``, and finite when asked, as a float. NaN always fails."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a real number, got {type(value).__name__}")
    value = float(value)
    if finite and not math.isfinite(value):
        raise ValueError(f"{name} must be a finite number, got {value}")
    if not (value > low if strict else value >= low) or not value <= high:
        bound = f"{'above' if strict else 'at least'} {low}" + ("" if high == math.inf else f" and at most {high}")
        raise ValueError(f"{name} must be {bound}, got {value}")
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
        if isdtype(xp, value.dtype, "complex floating"):
            raise TypeError(f"{name} must be real, got dtype {value.dtype}")
        if not isdtype(xp, value.dtype, ("real floating", "integral", "bool")):
            raise TypeError(f"{name} must have a real or bool dtype, got {value.dtype}")
        weak = name in ("bootstrap_value", "initial") and value.ndim == 0
        if isdtype(xp, value.dtype, "real floating") and not weak:
            floats.append(value.dtype)
    if floats:
        out = floats[0] if all(f == floats[0] for f in floats) else _result_type(xp, arrays, floats)
    else:
        out = xp.__array_namespace_info__().default_dtypes(device=device_of(anchor))["real floating"]
    if isinstance(out, np.dtype) and not out.isnative:  # '>f8' on a little-endian host: NumPy's arithmetic
        out = out.newbyteorder("=")  # returns native float64 for it, and so does gae_xp (computed in float64)
    if out in (xp.float32, xp.float64):
        return out, out
    wider = np.dtype(out).itemsize > 8 if isinstance(out, np.dtype) else False
    return out, xp.float64 if wider else xp.float32


def _result_type(xp, arrays, floats):
    """The floats' promoted dtype; NumPy extension floats (ml_dtypes) promote by NumPy's own rules, which
    ml_dtypes registers (bfloat16 with float32 gives float32)."""
    if not any(is_extension_float(f) for f in floats):
        return xp.result_type(*floats)
    try:
        return np.result_type(*floats)
    except TypeError:
        named = ", ".join(f"{name} {value.dtype}" for name, value in arrays.items() if is_array(value))
        raise TypeError(f"the floating dtypes do not combine ({named}): pass one floating dtype") from None


def values_one_step_longer(values, shape, axis: int) -> None:
    """ValueError with the fix when ``values`` has one step more than rewards along the time axis: the layout of
    trainers that store V(s_T), the value after the last step, as values' last entry."""
    got = tuple(values.shape)
    if len(got) != len(shape) or got[:axis] + got[axis + 1:] != shape[:axis] + shape[axis + 1:]:
        return
    if got[axis] != shape[axis] + 1:
        return
    where = "..., " if axis == len(shape) - 1 else ":, " * axis
    raise ValueError(
        f"values has {got[axis]} steps along the time axis (axis={axis}), one more than rewards' {shape[axis]}: if "
        f"its last entry is the value after the last step, pass values=values[{where}:-1] and "
        f"bootstrap_value=values[{where}-1]")


def time_first_hint(bootstrap_value, shape, axis: int) -> None:
    """ValueError with the fix when ``bootstrap_value`` (one value per row) does not fit the batch shape for this
    ``axis`` but does fit it for another axis: time-first data (``[T, B]``) passed without ``axis=0``."""
    got = tuple(bootstrap_value.shape)
    batch = shape[:axis] + shape[axis + 1:]
    if broadcastable(got, batch):
        return
    for other in range(len(shape)):
        if other != axis and got == shape[:other] + shape[other + 1:]:
            raise ValueError(
                f"bootstrap_value of shape {got} does not broadcast to the batch shape {batch} (rewards' shape {shape} "
                f"without the time axis {axis}), but it is that shape without axis {other}: if time is axis {other} "
                f"(time-first data, [T, B]), pass axis={other}")


def broadcastable(a: tuple, b: tuple) -> bool:
    """Whether shapes ``a`` and ``b`` broadcast together (``np.broadcast_shapes`` would not raise), in plain Python
    on their sizes: under ``torch.compile`` with dynamic shapes ``np.broadcast_shapes`` on symbolic sizes would
    be traced into the graph as an operation of its own."""
    return all(x == y or x == 1 or y == 1 for x, y in zip(reversed(a), reversed(b)))


def same_shape(name: str, value, shape, anchor: str = "rewards") -> None:
    """ValueError naming ``name`` unless it has ``anchor``'s shape."""
    if tuple(value.shape) != tuple(shape):
        if any(isinstance(n, float) and math.isnan(n) for n in (*value.shape, *shape)):
            raise ValueError(f"{name} and {anchor} have shapes {tuple(value.shape)} and {tuple(shape)} with unknown "
                             "(NaN) chunk sizes, as after boolean indexing of a Dask array: call "
                             ".compute_chunk_sizes() on both first")
        raise ValueError(f"{name} must have the shape of {anchor} {tuple(shape)}, got {tuple(value.shape)}")


def coefficient(xp, name: str, value, shape, dtype, axis: int, *, bounds: tuple[float, float]):
    """A discount-like argument within ``bounds``: a Python float, or an array broadcast to ``shape``, time last."""
    low, high = bounds
    if type(value) is float or isinstance(value, numbers.Real) and not isinstance(value, bool):
        value = float(value)
        if not low <= value <= high:  # NaN fails too
            raise ValueError(f"{name} must be in [{low:g}, {high:g}], got {value}")
        return value
    if not is_array(value):
        raise TypeError(f"{name} must be a float or an array, got {type(value).__name__}")
    if not isdtype(xp, value.dtype, ("real floating", "integral")):
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
    if type(value) is float or isinstance(value, numbers.Real) and not isinstance(value, bool):
        if type(like) is np.ndarray:  # the common case, without array-api-compat's device checks
            return np.full((*batch_shape, segments or 1), float(value), dtype=dtype)
        return xp.full((*batch_shape, segments or 1), float(value), dtype=dtype, device=device_of(like))
    if not is_array(value):
        raise TypeError(f"{name} must be a float or an array, got {type(value).__name__}")
    if not isdtype(xp, value.dtype, ("real floating", "integral", "bool")):
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


def is_host_offsets(value, like) -> bool:
    """True for offsets given in host memory for arrays of another library: a list or tuple, or a NumPy array
    beside non-NumPy inputs (flash-attention's ``cu_seqlens_cpu``)."""
    if isinstance(value, (list, tuple)):
        return True
    return type(value) is np.ndarray and type(like) is not np.ndarray


def check_offsets(xp, value, length: int, like):
    """cu_seqlens as ``(offsets, host_offsets)``: ``0 = o_0 <= o_1 <= ... <= o_n = T``, int64.

    ``value`` is a 1-D integer array of the inputs' library and device, or
    host offsets (a list, a tuple, or a NumPy array beside arrays of another
    library). ``offsets`` is an array of the inputs' namespace on their
    device (host offsets are copied there without blocking: ``_compat.to_device``); ``host_offsets``
    a NumPy copy, or None when the values cannot be read now (traced, lazy).
    Device offsets are read to the host once, for these checks (one small
    device-to-host copy, which synchronises the device's stream); host
    offsets need no read. A repeated offset is an empty sequence (AReaL's
    packed batches hold them): it has no steps, so no output, and its
    bootstrap value is not read.
    """
    host = is_host_offsets(value, like)
    if host and is_torch_array(like) and _torch_is_compiling():
        return _traced_host_offsets(value, length, like)
    if host:
        try:
            value = np.asarray(value)
        except (TypeError, ValueError):  # a ragged list
            raise TypeError("cu_seqlens given as a list must hold integers (sequence offsets)") from None
    else:
        require_array("cu_seqlens", value)
    if host and value.size == 0:
        value = value.astype(np.int64)
    integral = np.issubdtype(value.dtype, np.integer) if host else isdtype(xp, value.dtype, "integral")
    if not integral:
        raise TypeError(f"cu_seqlens must have an integer dtype (sequence offsets), got {value.dtype}")
    if value.ndim != 1 or value.shape[0] < 1:
        raise ValueError(f"cu_seqlens must be 1-D with at least 1 entry (0, then each sequence's end; the last is "
                         f"the total length {length}), "
                         f"got shape {tuple(value.shape)}")
    if host:
        host_offsets = value.astype(np.int64)
    elif values_are_readable(value):
        # a tensor's list: inside torch.func.jvp even detach() returns a wrapped tensor, which has no numpy()
        host_offsets = (np.asarray(value.tolist(), dtype=np.int64) if is_torch_array(value)
                        else host_copy(xp.astype(value, xp.int64, copy=False)))
    else:
        host_offsets = None
    if host_offsets is not None:
        check_offset_values(host_offsets, length)
    if host:
        offsets = to_device(xp, host_offsets, like)
    else:
        offsets = xp.astype(value, xp.int64, copy=False)
    return offsets, host_offsets


def check_offset_values(host_offsets, length: int) -> None:
    """ValueError naming cu_seqlens unless the host offsets (a NumPy array, or a list of ints) are
    ``0 = o_0 <= o_1 <= ... <= o_n = T``."""
    first, last = int(host_offsets[0]), int(host_offsets[-1])
    if first != 0 or last != length:
        entries = [int(offset) for offset in host_offsets]
        if min(entries) >= 0 and sum(entries) == length:
            raise ValueError(
                f"cu_seqlens {_shown(host_offsets)} looks like sequence lengths (they sum to the time axis' "
                f"{length}), not offsets: pass the cumulative sum with a leading 0, e.g. "
                f"np.concatenate([[0], np.cumsum(lengths)]) or torch.nn.functional.pad(lengths.cumsum(0), (1, 0))")
    if first != 0:
        raise ValueError(f"cu_seqlens must start at 0, got {first}")
    if last != length:
        raise ValueError(f"cu_seqlens must end at the length of the time axis, {length}, got {last}")
    if isinstance(host_offsets, list):
        decreasing = any(b < a for a, b in zip(host_offsets, host_offsets[1:]))
    else:
        decreasing = np.any(host_offsets[1:] < host_offsets[:-1])
    if decreasing:
        raise ValueError("cu_seqlens must be non-decreasing (sequence offsets; a repeated offset is an empty "
                         "sequence)")


def _torch_is_compiling() -> bool:
    import torch

    return torch.compiler.is_compiling()


def _traced_host_offsets(value, length: int, like):
    """Host offsets for torch tensors under ``torch.compile`` (``check_offsets``'s NumPy calls do not trace): a list
    or tuple becomes a constant tensor of the graph, a NumPy array one of its inputs (dynamo traces it as a tensor);
    their values are checked when the graph runs, as device offsets are (``traced_offsets``: an error raised while
    tracing would reach the caller as dynamo's ``Unsupported``, not as the ValueError). (offsets, None)."""
    import torch

    if isinstance(value, (list, tuple)):
        if not all(isinstance(o, numbers.Integral) and not isinstance(o, bool) for o in value):
            raise TypeError("cu_seqlens given as a list must hold integers (sequence offsets)")
        value = torch.tensor(list(value), dtype=torch.int64)
    offsets = torch.as_tensor(value)
    if offsets.dtype.is_floating_point or offsets.dtype.is_complex or offsets.dtype == torch.bool:
        raise TypeError(f"cu_seqlens must have an integer dtype (sequence offsets), got {value.dtype}")
    if offsets.ndim != 1 or offsets.shape[0] < 1:
        raise ValueError(f"cu_seqlens must be 1-D with at least 1 entry (0, then each sequence's end; the last is "
                         f"the total length {length}), "
                         f"got shape {tuple(offsets.shape)}")
    return offsets.to(device=like.device, dtype=torch.int64), None


def guarded_offsets(xp, offsets, length: int):
    """(offsets a kernel can index by, valid) for offsets whose values cannot be read now (traced), on the device.

    ``valid`` is a 0-d bool array: True when the offsets keep the contract
    ``0 = o_0 <= ... <= o_n = T``. Where they do not, the offsets returned are
    ``[0, T, ..., T]`` (one segment, then empty ones), so that no kernel reads
    or writes outside its arrays, and the caller fills its outputs with NaN
    (``_problem.fill_invalid``). Array operations only: no host synchronisation.
    """
    n = offsets.shape[0]
    valid = (offsets[0] == 0) & (offsets[n - 1] == length) & xp.all(offsets[1:] >= offsets[:-1])
    index = xp.arange(n, dtype=offsets.dtype, device=device_of(offsets))
    fallback = xp.where(index == 0, xp.zeros_like(offsets), xp.full_like(offsets, length))
    return xp.where(valid, offsets, fallback), valid


def _shown(values) -> str:
    """A short form of offsets (a NumPy array or a list) for a message: its entries, or the first and last few."""
    items = [int(value) for value in values]
    if len(items) <= 8:
        return str(items)
    return f"[{', '.join(map(str, items[:4]))}, ..., {', '.join(map(str, items[-2:]))}]"


def host_copy(x) -> np.ndarray:
    """A NumPy copy of a readable array of any library (one device-to-host copy for device arrays)."""
    if is_torch_array(x):
        return torch_cpu_view(x.detach().cpu())  # not Tensor.numpy(): a CPU tensor would stay non-resizable
    if is_cupy_array(x):
        return x.get()
    return np.asarray(x)


#: What each bool flag's True means, for its TypeError.
_FLAG_MEANINGS = {"terminated": "True = the episode ended at this step",
                  "truncated": "True = the episode was cut at this step",
                  "mask": "True = a real step"}


def flag(xp, name: str, value, shape, axis: int):
    """terminated / truncated / mask: a bool array shaped like rewards, time moved last.

    Numbers are refused rather than read as ``value != 0``: a 0.5 would count
    as done, and CleanRL-style float dones shifted by a step would pass
    unnoticed. Convert with ``dones != 0`` (or the framework's own rule).
    """
    require_array(name, value)
    same_shape(name, value, shape)
    if value.dtype != xp.bool and not isdtype(xp, value.dtype, "bool"):  # the first test spares isdtype's lookups
        raise TypeError(f"{name} must have dtype bool ({_FLAG_MEANINGS[name]}), got {value.dtype}: convert it "
                        f"with {name} != 0 if that is what it means")
    return value if axis == value.ndim - 1 else xp.moveaxis(value, axis, -1)


def time_last(xp, value, dtype, axis: int):
    if value.dtype != dtype:  # astype(copy=False) would return value itself, after array-api-compat's checks
        value = xp.astype(value, dtype, copy=False)
    return value if axis == value.ndim - 1 else xp.moveaxis(value, axis, -1)
