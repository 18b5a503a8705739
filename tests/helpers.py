"""Test data and the one comparison shared by the test modules.

Cases are built in NumPy float64 by ``gae_xp.testing.cases.make_case`` (the
bench draws from the same builder); the oracle is ``gae_xp.reference`` run on
those float64 arrays, and each library under test gets converted copies.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import numpy as np
from hypothesis import strategies as st

from gae_xp import reference
from gae_xp.testing import make_case, to_numpy, tolerance, xp_assert_close

__all__ = ["make_case", "converted", "expected", "xp_assert_close", "like", "to_numpy", "tolerance", "discount",
           "gae_cases", "GPU_DIR", "load_gpu_module"]

#: The GPU check's files (no package: each runs as a script or a test file on a GPU machine).
GPU_DIR = Path(__file__).parent / "gpu"


def load_gpu_module(name: str):
    """tests/gpu/<name>.py imported afresh as module ``gpu_<name>`` (registered, as dataclasses and pickling
    need), with tests/gpu on the path while it imports (its sibling imports: ``triton_process``, say). Afresh:
    Triton reads ``TRITON_INTERPRET`` when it decorates a kernel, and a test may have set it."""
    spec = importlib.util.spec_from_file_location(f"gpu_{name}", GPU_DIR / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    sys.path.insert(0, str(GPU_DIR))
    try:
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(GPU_DIR))
    return module


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


# Coefficients of float32's range: a gamma * lam below it is 0 in float32, which cuts (as it should) where the
# float64 oracle's tiny product does not.
discount = st.one_of(st.sampled_from([0.0, 0.5, 0.99, 1.0]), st.floats(1e-15, 1.0))


@st.composite
def gae_cases(draw):
    """A ``gae()`` case for property tests: (NumPy float64 arguments, ``axis`` and ``chunk_size``, a dtype name)."""
    batch = draw(st.sampled_from([(), (1,), (3,), (2, 2)]))
    length = draw(st.one_of(st.sampled_from([0, 1, 2]), st.integers(0, 160)))
    axis = draw(st.integers(0, len(batch)))
    shape = batch[:axis] + (length,) + batch[axis:]
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    case = {"rewards": rng.standard_normal(shape), "values": rng.standard_normal(shape)}
    step_shape = [1] * len(shape)
    step_shape[axis] = length
    row_shape = list(shape)
    row_shape[axis] = 1
    case["gamma"] = draw(st.one_of(discount, st.just(rng.uniform(0, 1, step_shape))))
    case["lam"] = draw(st.one_of(discount, st.just(rng.uniform(0, 1, row_shape))))
    dones = draw(st.sampled_from([0.0, 0.05, 0.4]))
    if dones:
        case["terminated"] = rng.random(shape) < dones
        case["truncated"] = rng.random(shape) < dones
    holes, padding = draw(st.sampled_from([0.0, 0.2, 0.8])), draw(st.integers(0, 12))
    if holes or padding:
        steps = np.arange(length).reshape(step_shape)
        case["mask"] = (rng.random(shape) >= holes) & (steps < length - padding)
    boundary = draw(st.sampled_from(["none", "bootstrap", "next_values"]))
    if boundary == "bootstrap":
        case["bootstrap_value"] = draw(st.one_of(st.floats(-2, 2), st.just(rng.standard_normal(batch))))
    elif boundary == "next_values":
        case["next_values"] = rng.standard_normal(shape)
    if dones and boundary != "next_values":  # random truncations, no final observations
        case["truncated_bootstrap"] = "next_step"
    poison = draw(st.sampled_from([None, np.nan, np.inf, -np.inf]))
    if poison is not None and length:
        case["rewards"][tuple(rng.integers(0, n) for n in shape)] = poison
    options = {"axis": axis - len(shape) if draw(st.booleans()) else axis,
               "chunk_size": draw(st.one_of(st.none(), st.integers(1, 70)))}
    return case, options, draw(st.sampled_from(["float64", "float32"]))


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
