"""What the test modules of the numba-CUDA kernels in numba's CUDA simulator share.

Such a module runs in a process of its own with ``NUMBA_ENABLE_CUDASIM=1``
(see ``.ci/run``) and calls ``require_simulator()`` before it imports the
backend; it is skipped otherwise. Results are NumPy arrays in host memory
(the simulator's arrays), checked against ``float64_loop``.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

from gae_xp import reference

BACKEND = "numba-cuda"
#: What a float64 result is checked against (``xp_assert_close``'s ``like``): results are host NumPy arrays.
HOST = np.zeros(())
MARKS = [
    pytest.mark.cudasim,
    pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning"),  # inf - inf in poisoned rows
]


def require_simulator() -> None:
    """Skip the calling module unless numba's CUDA simulator is on (it must be before numba is imported)."""
    if os.environ.get("NUMBA_ENABLE_CUDASIM") != "1":
        pytest.skip("needs NUMBA_ENABLE_CUDASIM=1 before numba is imported (its own pytest run: .ci/run)",
                    allow_module_level=True)


def float64_loop(**case):
    """The float64 oracle (``reference.gae_loop``) on the case's values, whatever their dtype."""
    wide = {k: v.astype(np.float64) if isinstance(v, np.ndarray) and v.dtype.kind == "f" else v
            for k, v in case.items()}
    return reference.gae_loop(**wide)
