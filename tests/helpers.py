"""Test data and the one comparison shared by the test modules.

Cases are built in NumPy float64 by ``gae_xp.testing.cases.make_case`` (the
bench draws from the same builder); the oracle is ``gae_xp.reference`` run on
those float64 arrays, and each library under test gets converted copies.
"""

from __future__ import annotations

import numpy as np

from gae_xp import reference
from gae_xp.testing import make_case, to_numpy, tolerance, xp_assert_close

__all__ = ["make_case", "converted", "expected", "xp_assert_close", "like", "to_numpy", "tolerance"]


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


class ListRefusing:
    """An array namespace that fails a test on ``asarray`` of a Python list, tuple or number (a host-to-device
    copy, blocking for torch CUDA) and forwards everything else to ``xp``."""

    def __init__(self, xp):
        self._xp = xp

    def __getattr__(self, name):
        return getattr(self._xp, name)

    def asarray(self, obj, *args, **kwargs):
        assert not isinstance(obj, (list, tuple, int, float)), \
            f"asarray of host data {obj!r}: a blocking host-to-device copy"
        return self._xp.asarray(obj, *args, **kwargs)
