"""Property-based tests: random shapes, chunk sizes, discounts, dones, masks, dtypes, against the float64 loop."""

from __future__ import annotations

import numpy as np
from helpers import converted, xp_assert_close
from hypothesis import given
from hypothesis import strategies as st

import gae_xp
from gae_xp import reference

# Coefficients of float32's range: a gamma * lam below it is 0 in float32, which cuts (as it should) where the
# float64 oracle's tiny product does not.
discount = st.one_of(st.sampled_from([0.0, 0.5, 0.99, 1.0]), st.floats(1e-15, 1.0))


@st.composite
def gae_cases(draw):
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


@given(gae_cases())
def test_gae_equals_the_loop(library, backend, drawn):
    case, options, dtype = drawn
    want_a, want_r = reference.gae_loop(**case, axis=options["axis"])
    arrays = converted(library, case, getattr(library.xp, dtype))
    got_a, got_r = gae_xp.gae(**arrays, **options, backend=backend)
    xp_assert_close(got_a, want_a, like=arrays["rewards"])
    xp_assert_close(got_r, want_r, like=arrays["rewards"])


@given(
    length=st.integers(0, 200),
    chunk=st.one_of(st.none(), st.integers(1, 40)),
    reverse=st.booleans(),
    kind=st.sampled_from(["float", "negative float", "array", "signed array", "zeros"]),
    value=discount,
    poison=st.sampled_from([None, np.nan, np.inf, -np.inf]),
    seed=st.integers(0, 2**32 - 1),
)
def test_discounted_cumsum_equals_the_loop(library, backend, length, chunk, reverse, kind, value, poison, seed):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((2, length))
    if poison is not None and length:  # a non-finite entry, whose sign a negative discount flips step by step
        x[rng.integers(0, 2), rng.integers(0, length)] = poison
    a = {"float": value, "negative float": -value, "array": rng.uniform(0, 1, (2, length)),
         "signed array": rng.uniform(-1, 1, (2, length)),
         "zeros": np.where(rng.random((2, length)) < 0.3, 0.0, value)}[kind]
    initial = rng.standard_normal(2)
    want = reference.discounted_cumsum_loop(x, a, reverse=reverse, initial=initial)
    got = gae_xp.discounted_cumsum(library.asarray(x), a if isinstance(a, float) else library.asarray(a),
                                   reverse=reverse,
                                   initial=library.asarray(initial), chunk_size=chunk, backend=backend)
    xp_assert_close(got, want, like=library.asarray(x))
