"""``gae_xp.warm_up()``: compile (or load) the numba kernels a trainer's calls will need, at start-up."""

from __future__ import annotations

#: The kinds of call ``warm_up`` prepares by default: a constant discount, and terminations, truncations (with
#: next_values) and a mask, each of which the kernels are specialised on.
CASES = ("constant", "dones+mask")


def warm_up(dtypes=("float32",), cases=CASES) -> None:
    """Compile, or load from numba's disk cache, the numba CPU kernels for these dtypes and cases.

    Each combination of options (which of ``terminated``, ``truncated``,
    ``mask``, ``next_values`` are given; float or array coefficients) and
    dtype runs a kernel of its own, compiled on its first call in a process
    when numba's cache does not hold it yet (seconds per kernel on a cold
    cache, tenths of a second to load a cached one). A trainer that calls
    ``warm_up`` at start-up, before its first rollout, pays that there
    instead of in its first step. NumPy arrays and torch CPU tensors share
    the kernels. Without numba installed it does nothing.

    Parameters
    ----------
    dtypes : sequence of str, default ("float32",)
        The dtypes of ``rewards`` and ``values``: "float32", "float64".
    cases : sequence of str, default ("constant", "dones+mask")
        "constant" (``gae(rewards, values)``), "dones+mask" (``terminated``,
        ``truncated`` with ``next_values``, and ``mask``), "dones"
        (``terminated`` only), "mask" (``mask`` only).
    """
    import numpy as np

    from . import backends
    from .estimators import gae

    if backends.load("numba").unavailable_reason(None, []) is not None:
        return
    for dtype in dtypes:
        rewards = np.zeros((2, 8), dtype=np.dtype(dtype))
        flags = np.zeros((2, 8), dtype=bool)
        options = {"constant": {}, "dones": {"terminated": flags}, "mask": {"mask": ~flags},
                   "dones+mask": {"terminated": flags, "truncated": flags, "next_values": rewards, "mask": ~flags}}
        for case in cases:
            if case not in options:
                raise ValueError(f"cases must name some of {', '.join(map(repr, options))}, got {case!r}")
            gae(rewards, rewards, backend="numba", **options[case])
