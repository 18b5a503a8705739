"""Test data and the one comparison shared by the test modules.

Cases are built in NumPy float64 by ``gae_xp.bench.cases.make_case`` (the
bench draws from the same builder); the oracle is ``gae_xp.reference`` run on
those float64 arrays, and each library under test gets converted copies.
"""

from __future__ import annotations

import numpy as np
from array_api_compat import array_namespace
from array_api_compat import device as device_of

from gae_xp import reference
from gae_xp.bench.cases import make_case
from gae_xp.bench.libraries import to_numpy

__all__ = ["make_case", "converted", "expected", "xp_assert_close", "like", "to_numpy", "tolerance"]

#: Tolerance of a result against the float64 loop, relative to the largest |value|, by the dtype's machine epsilon.
_TOLERANCES = {2.0**-52: 1e-10, 2.0**-23: 2e-5, 2.0**-10: 3e-3, 2.0**-7: 2e-2}


def tolerance(xp, dtype) -> float:
    return _TOLERANCES[float(xp.finfo(dtype).eps)]


def converted(library, case: dict, dtype=None) -> dict:
    """The case with every NumPy array converted to ``library`` (floating arrays cast to ``dtype`` when given)."""
    out = {}
    for key, value in case.items():
        if isinstance(value, np.ndarray):
            value = library.asarray(value)
            if dtype is not None and library.xp.isdtype(value.dtype, "real floating"):
                value = library.xp.astype(value, dtype)
        out[key] = value
    return out


def like(library):
    """A 0-d float64 array of ``library`` on its device: what a float64 result of that library is checked against."""
    return library.asarray(np.array(0.0))


def expected(case: dict, axis: int = -1):
    """(advantages, returns) of the float64 per-step loop."""
    return reference.gae_loop(**case, axis=axis)


def xp_assert_close(actual, desired, *, like, dtype=None, scale: float | None = None):
    """``actual`` is an array of ``like``'s namespace, on its device, with ``dtype`` (default ``like.dtype``),
    shaped like ``desired`` (NumPy) and close to it: the same non-finite entries, and the finite ones within the
    dtype's tolerance of the largest |desired| (or ``scale``)."""
    xp = array_namespace(like)
    assert array_namespace(actual) is xp, f"result is a {type(actual).__module__}.{type(actual).__name__}"
    want_dtype = like.dtype if dtype is None else dtype
    assert actual.dtype == want_dtype, f"dtype {actual.dtype}, expected {want_dtype}"
    desired = np.asarray(desired, dtype=np.float64)
    assert tuple(actual.shape) == desired.shape, f"shape {tuple(actual.shape)}, expected {desired.shape}"
    assert device_of(actual) == device_of(like), f"device {device_of(actual)}, expected {device_of(like)}"
    got = to_numpy(actual).astype(np.float64)
    finite = np.isfinite(desired)
    np.testing.assert_array_equal(np.isfinite(got), finite, err_msg="non-finite entries differ from the loop's")
    np.testing.assert_array_equal(np.isnan(got), np.isnan(desired), err_msg="NaN entries differ from the loop's")
    infinite = np.isinf(desired)
    np.testing.assert_array_equal(got[infinite], desired[infinite], err_msg="infinities differ from the loop's")
    if scale is None:
        scale = max(1.0, float(np.abs(desired[finite]).max(initial=0.0)))
    np.testing.assert_allclose(got[finite], desired[finite], rtol=0, atol=tolerance(xp, want_dtype) * scale)
