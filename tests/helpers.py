"""Test data and comparisons shared by the test modules.

Cases are built in NumPy float64; the oracle is ``gae_xp.reference`` run on
those float64 arrays, and each library under test gets converted copies.
"""

from __future__ import annotations

import numpy as np

from gae_xp import reference

#: Tolerances of a result in the given dtype against the float64 loop, relative to the largest |value|.
TOLERANCE = {"float64": 1e-10, "float32": 2e-5, "float16": 3e-3, "bfloat16": 2e-2}


def make_case(rng, shape, *, axis=-1, dones=0.0, holes=0.0, padding=0, per_step_gamma=False, per_row_lam=False,
              bootstrap=False, next_values=False, gamma=0.99, lam=0.95):
    """gae() keyword arguments as NumPy float64 / bool arrays, time on ``axis``."""
    shape = tuple(shape)
    case = {"rewards": rng.standard_normal(shape), "values": rng.standard_normal(shape), "gamma": gamma, "lam": lam}
    length = shape[axis] if shape else 0
    if dones:
        case["terminated"] = rng.random(shape) < dones
        case["truncated"] = rng.random(shape) < dones
    if holes or padding:
        mask = rng.random(shape) >= holes
        if padding:
            steps = np.arange(length).reshape([-1 if i == axis % len(shape) else 1 for i in range(len(shape))])
            mask &= steps < length - padding
        case["mask"] = mask
    if per_step_gamma:
        gamma_shape = [1] * len(shape)
        gamma_shape[axis] = length
        case["gamma"] = rng.uniform(0.5, 1.0, gamma_shape)
    if per_row_lam:
        lam_shape = list(shape)
        lam_shape[axis] = 1
        case["lam"] = rng.uniform(0.0, 1.0, lam_shape)
    if bootstrap:
        batch = shape[:axis % len(shape)] + shape[axis % len(shape) + 1:]
        case["bootstrap_value"] = rng.standard_normal(batch)
    if next_values:
        case["next_values"] = rng.standard_normal(shape)
    return case


def to_namespace(ns, case, dtype=None):
    """The case with every array converted to the library under test (floating arrays cast to ``dtype``)."""
    out = {}
    for key, value in case.items():
        if isinstance(value, np.ndarray):
            if dtype is not None and value.dtype.kind == "f":
                value = ns.xp.astype(ns.asarray(value), getattr(ns.xp, dtype) if isinstance(dtype, str) else dtype)
            else:
                value = ns.asarray(value)
        out[key] = value
    return out


def expected(case, axis=-1):
    """(advantages, returns) of the float64 per-step loop."""
    return reference.gae_loop(**case, axis=axis)


def assert_close(ns, got, want, dtype_name="float64", *, scale=None):
    """``got`` is an array of the library under test, of dtype ``dtype_name``, close to the float64 ``want``."""
    assert type(got) is type(ns.asarray(np.zeros(1))), f"result is a {type(got)}, not an array of {ns.id}"
    assert str(got.dtype).endswith(dtype_name), f"dtype {got.dtype}, expected {dtype_name}"
    if ns.device is not None:
        assert got.device == ns.device
    got = ns.to_numpy(ns.xp.astype(got, ns.xp.float64))
    want = np.asarray(want, dtype=np.float64)
    assert got.shape == want.shape
    finite = np.isfinite(want)
    np.testing.assert_array_equal(np.isfinite(got), finite, err_msg="non-finite entries differ from the loop's")
    if scale is None:
        scale = max(1.0, float(np.abs(want[finite]).max(initial=0.0)))
    tol = TOLERANCE[dtype_name] * scale
    np.testing.assert_allclose(got[finite], want[finite], rtol=0, atol=tol)
