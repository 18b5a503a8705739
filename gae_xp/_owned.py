"""Updates of the temporaries this package owns: in place where the library allows it.

NumPy, PyTorch and CuPy arrays are updated in place, which saves a fresh
allocation per step: on glibc, a multi-megabyte array is page-faulted in anew
on every call, and that costs as much as the arithmetic on it. JAX arrays,
read-only views and tensors that record autograd history get a new array
instead, so the same code stays purely functional where it must be.

Only arrays created by this package are ever passed here, never an input.
"""

from __future__ import annotations

from array_api_compat import is_writeable_array


def writable(x) -> bool:
    """True when x may be updated in place: a mutable library, and no autograd history to keep."""
    return is_writeable_array(x) and not getattr(x, "requires_grad", False)


def add(x, y):
    """x + y, written into x when it is writable."""
    if writable(x):
        x += y
        return x
    return x + y


def mul(x, y):
    """x * y, written into x when it is writable."""
    if writable(x):
        x *= y
        return x
    return x * y


def sub(x, y):
    """x - y, written into x when it is writable."""
    if writable(x):
        x -= y
        return x
    return x - y


def add_to_columns(xp, x, start: int, stop: int, value, *, in_place: bool):
    """x with ``value`` added to ``x[..., start:stop]``: in place when allowed and writable, else a new array."""
    if in_place and writable(x):
        view = x[..., start:stop]
        view += value
        return x
    parts = [x[..., :start], x[..., start:stop] + value, x[..., stop:]]
    return xp.concat([part for part in parts if part.shape[-1]], axis=-1)
