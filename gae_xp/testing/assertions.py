"""``xp_assert_close``: one comparison of any library's result with a float64 NumPy oracle."""

from __future__ import annotations

from typing import Any

import numpy as np

from gae_xp._compat import array_namespace, device_of, is_extension_float

from .libraries import to_numpy

#: Tolerance of a result against the float64 loop, relative to the largest |value|, by the dtype's machine epsilon.
_TOLERANCES = {2.0**-52: 1e-10, 2.0**-23: 2e-5, 2.0**-10: 3e-3, 2.0**-7: 2e-2}


def tolerance(xp: Any, dtype: Any) -> float:
    """The absolute tolerance, per unit of the largest ``|value|``, of a result in ``dtype`` against the float64 loop.

    Parameters
    ----------
    xp : namespace
        The result's array namespace (for ``finfo``).
    dtype : dtype
        The result's floating dtype: float64, float32, float16 or bfloat16.

    Returns
    -------
    float
        1e-10 for float64, 2e-5 for float32, 3e-3 for float16, 2e-2 for bfloat16.

    Examples
    --------
    >>> import array_api_compat.numpy as xp
    >>> from gae_xp.testing import tolerance
    >>> tolerance(xp, xp.float32)
    2e-05
    """
    if is_extension_float(dtype):  # NumPy's bfloat16 (ml_dtypes), which np.finfo does not know
        import ml_dtypes

        return _TOLERANCES[float(ml_dtypes.finfo(dtype).eps)]
    return _TOLERANCES[float(xp.finfo(dtype).eps)]


def xp_assert_close(actual: Any, desired: Any, *, like: Any, dtype: Any = None, scale: float | None = None) -> None:
    """Assert that ``actual`` is an array of ``like``'s namespace, on its device, close to ``desired``.

    Checked, in order: the namespace (``array_namespace``), the dtype
    (default ``like.dtype``), the shape (that of ``desired``), the device, the
    pattern of non-finite entries (NaN where ``desired`` has NaN, each
    infinity with its sign), and the finite entries within
    ``tolerance(dtype)`` times the largest finite ``|desired|`` (or ``scale``).

    Parameters
    ----------
    actual : array
        The result under test, of any array library.
    desired : array_like
        The expected values, usually a float64 NumPy oracle (``gae_xp.reference``).
    like : array
        An array of the library and device ``actual`` must have (its dtype is the default ``dtype``).
    dtype : dtype, optional
        The dtype ``actual`` must have.
    scale : float, optional
        The magnitude the tolerance is relative to (default: the largest finite ``|desired|``, at least 1).

    Raises
    ------
    AssertionError
        Naming the first property that differs.

    Examples
    --------
    >>> import numpy as np
    >>> import gae_xp
    >>> from gae_xp import reference
    >>> from gae_xp.testing import xp_assert_close
    >>> r, v = np.ones((2, 5)), np.zeros((2, 5))
    >>> xp_assert_close(gae_xp.gae(r, v)[0], reference.gae_loop(r, v)[0], like=r)
    """
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
