"""Property-based tests: random shapes, chunk sizes, discounts, dones, masks, dtypes, against the float64 loop."""

from __future__ import annotations

import numpy as np
from helpers import converted, discount, gae_cases, xp_assert_close
from hypothesis import given
from hypothesis import strategies as st

import gae_xp
from gae_xp import reference


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
