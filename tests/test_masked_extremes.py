"""A masked step is absent whatever finite values it holds (issue 20, item 1).

Masked steps are given the extremes of the dtype's range (r = 3e38 beside V = -3e38 in float32, +-65504 in
float16): ``r - V`` there overflows, and ``inf * 0`` would be NaN. Every estimator, on every backend, must give
the float64 loop's numbers on the real steps and 0 on the masked ones.
"""

from __future__ import annotations

import numpy as np
import pytest
from helpers import converted, xp_assert_close
from hypothesis import given
from hypothesis import strategies as st

import gae_xp
from gae_xp import reference

#: The largest finite magnitudes each input dtype can hold, and the float64 oracle reads exactly.
EXTREMES = {"float32": 3e38, "float16": 65504.0}


@st.composite
def masked_extremes(draw, dtype: str):
    """A (2, T) case whose masked steps hold extremes of opposite signs in rewards, values and next values."""
    length = draw(st.integers(1, 40))
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    shape = (2, length)
    mask = rng.random(shape) < draw(st.sampled_from([0.3, 0.7, 0.95]))
    big = EXTREMES[dtype]
    signs = rng.choice([-1.0, 1.0], size=shape)
    case = {
        "rewards": np.where(mask, rng.standard_normal(shape), big * signs),
        "values": np.where(mask, rng.standard_normal(shape), -big * signs),
        "mask": mask,
        "terminated": (rng.random(shape) < 0.1) & mask,
        "gamma": 0.99,
        "lam": 0.95,
    }
    log_rhos = np.where(mask, rng.normal(0, 0.5, shape), big * signs)
    next_values = np.where(mask, rng.standard_normal(shape), big * signs)

    def exact(x):  # the values the dtype holds, so that the float64 oracle reads the same inputs
        return x.astype(dtype).astype(np.float64) if x.dtype == np.float64 else x

    return {k: exact(v) if isinstance(v, np.ndarray) else v for k, v in case.items()}, exact(log_rhos), \
        exact(next_values)


def _cast(library, case, dtype):
    return converted(library, case, dtype=getattr(library.xp, dtype))


def _like(library, dtype):
    """A 0-d array of the library in ``dtype`` (a skip where the namespace has no such dtype)."""
    if not hasattr(library.xp, dtype):
        pytest.skip(f"{library.name} has no {dtype}")
    return library.xp.astype(library.asarray(np.array(0.0)), getattr(library.xp, dtype))


@pytest.mark.parametrize("dtype", list(EXTREMES))
@given(data=st.data())
def test_gae_ignores_extremes_at_masked_steps(target, library, backend, dtype, data):
    like = _like(library, dtype)
    case, _, next_values = data.draw(masked_extremes(dtype))
    want_a, want_r = reference.gae_loop(**case)
    arrays = _cast(library, case, dtype)
    a, r = gae_xp.gae(**arrays, backend=backend)
    xp_assert_close(a, want_a, like=like)
    xp_assert_close(r, want_r, like=like)
    with_next = {**case, "next_values": next_values}
    want_a, want_r = reference.gae_loop(**with_next, critic_lam=1.0)
    a, r = gae_xp.gae(**_cast(library, with_next, dtype), critic_lam=1.0, backend=backend)
    xp_assert_close(a, want_a, like=like)
    xp_assert_close(r, want_r, like=like)


@pytest.mark.parametrize("dtype", list(EXTREMES))
@given(data=st.data())
def test_estimators_ignore_extremes_at_masked_steps(target, library, backend, dtype, data):
    like = _like(library, dtype)
    case, log_rhos, next_values = data.draw(masked_extremes(dtype))
    plain = {k: case[k] for k in ("rewards", "mask", "terminated", "gamma")}
    xp_assert_close(gae_xp.discounted_returns(**_cast(library, plain, dtype), backend=backend),
                    reference.discounted_returns_loop(**plain), like=like)
    targets = {**plain, "next_values": next_values, "lam": 0.9}
    xp_assert_close(gae_xp.lambda_returns(**_cast(library, targets, dtype), backend=backend),
                    reference.lambda_returns_loop(**targets), like=like)
    traced = {**case, "log_rhos": log_rhos}
    want_vs, want_pg = reference.vtrace_loop(**traced)
    vs, pg = gae_xp.vtrace(**_cast(library, traced, dtype), backend=backend)
    xp_assert_close(vs, want_vs, like=like)
    xp_assert_close(pg, want_pg, like=like)
