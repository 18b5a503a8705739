"""Per-sample lambda (``gae_xp.length_adaptive_lambda``, ``gae_xp.relative_position_lambda``) against plain loops.

The loops count each trajectory's steps one at a time and apply the papers' formulas to Python floats. AReaL's
own tests of its ``lambda_fn`` are restated in ``tests/conformance/test_areal_turns.py``.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from helpers import converted, like, xp_assert_close
from hypothesis import given
from hypothesis import strategies as st

import gae_xp


def vapo(length, alpha):
    """VAPO: 1 - 1 / (alpha l), not below 0; 0 for an empty trajectory."""
    return 0.0 if length == 0 else max(0.0, 1.0 - 1.0 / (alpha * length))


def relative(length, q):
    """AReaL: q ** (1 / (l - 1)) for l >= 2, 1 for one step, 0 for none."""
    return 0.0 if length == 0 else 1.0 if length == 1 else q ** (1.0 / (length - 1))


RULES = {"vapo": (gae_xp.length_adaptive_lambda, vapo, 0.05), "relative": (gae_xp.relative_position_lambda, relative,
                                                                           0.3)}


def loop_lengths(mask, offsets):
    """Real steps of every sequence of every row, one step at a time (time last)."""
    out = np.zeros(mask.shape[:-1] + (len(offsets) - 1,))
    for row in np.ndindex(mask.shape[:-1]):
        for j in range(len(offsets) - 1):
            for t in range(offsets[j], offsets[j + 1]):
                out[row + (j,)] += bool(mask[row + (t,)])
    return out


@pytest.mark.parametrize("rule", RULES)
def test_from_lengths(library, rule):
    function, loop, parameter = RULES[rule]
    lengths = np.array([[0, 1, 2, 3], [10, 19, 20, 1000]])
    got = function(parameter, lengths=library.asarray(lengths))
    want = np.vectorize(lambda n: loop(n, parameter))(lengths)
    xp_assert_close(got, want, like=like(library), dtype=got.dtype)
    assert got.dtype == library.xp.__array_namespace_info__().default_dtypes(device=library.device)["real floating"]
    assert function(parameter, lengths=library.asarray(lengths), dtype=library.xp.float32).dtype == library.xp.float32


@pytest.mark.parametrize("rule", RULES)
def test_from_a_mask_one_per_row(library, rule):
    function, loop, parameter = RULES[rule]
    mask = np.random.default_rng(1).random((2, 3, 40)) < 0.6
    mask[0, 0] = False
    want = np.vectorize(lambda n: loop(n, parameter))(loop_lengths(mask, [0, 40]))
    got = function(parameter, mask=library.asarray(mask))
    xp_assert_close(got, want, like=like(library), dtype=got.dtype)
    moved = function(parameter, mask=library.asarray(np.moveaxis(mask, -1, 0)), axis=0)
    xp_assert_close(moved, np.moveaxis(want, -1, 0), like=like(library), dtype=got.dtype)


@pytest.mark.parametrize("rule", RULES)
def test_packed_sequences(library, rule):
    function, loop, parameter = RULES[rule]
    rng = np.random.default_rng(2)
    offsets = np.array([0, 1, 7, 20, 50])
    mask = rng.random((2, 50)) < 0.5
    per_sequence = np.vectorize(lambda n: loop(n, parameter))(loop_lengths(mask, offsets))
    arrays = converted(library, {"mask": mask, "cu_seqlens": offsets})
    got = function(parameter, **arrays)
    xp_assert_close(got, per_sequence, like=like(library), dtype=got.dtype)
    spread = np.repeat(per_sequence, np.diff(offsets), axis=-1)
    xp_assert_close(function(parameter, **arrays, per_token=True), spread, like=like(library), dtype=got.dtype)
    unmasked = np.vectorize(lambda n: loop(n, parameter))(np.diff(offsets))
    xp_assert_close(function(parameter, cu_seqlens=arrays["cu_seqlens"]), unmasked, like=like(library),
                    dtype=got.dtype)
    xp_assert_close(function(parameter, cu_seqlens=arrays["cu_seqlens"], per_token=True),
                    np.repeat(unmasked, np.diff(offsets)), like=like(library), dtype=got.dtype)
    counts = library.asarray(loop_lengths(mask, offsets))
    xp_assert_close(function(parameter, lengths=counts, cu_seqlens=arrays["cu_seqlens"], per_token=True), spread,
                    like=like(library), dtype=got.dtype)


def test_per_token_lambda_is_what_gae_takes_for_packed_rows(library):
    """gae() with one lambda per packed sequence, spread over its steps, equals gae() on each sequence alone."""
    rng = np.random.default_rng(3)
    offsets = np.array([0, 5, 30, 31, 60])
    rewards, values = rng.standard_normal((2, 60)), rng.standard_normal((2, 60))
    lam = gae_xp.length_adaptive_lambda(0.1, cu_seqlens=library.asarray(offsets), per_token=True,
                                        dtype=library.xp.float64)
    packed = gae_xp.gae(library.asarray(rewards), library.asarray(values), lam=lam, cu_seqlens=library.asarray(offsets))
    for j in range(len(offsets) - 1):
        steps = slice(offsets[j], offsets[j + 1])
        alone = gae_xp.gae(rewards[:, steps], values[:, steps], lam=vapo(offsets[j + 1] - offsets[j], 0.1))
        for got, want in zip(packed, alone):
            xp_assert_close(got[:, steps], want, like=like(library))


@given(alpha=st.floats(1e-6, 1e6), q=st.floats(1e-300, 1.0), lengths=st.lists(st.integers(0, 10**9), max_size=20))
def test_lambdas_land_in_the_unit_interval_and_follow_the_formulas(alpha, q, lengths):
    lengths = np.array(lengths, dtype=np.int64)
    vapo_lambdas = gae_xp.length_adaptive_lambda(alpha, lengths=lengths)
    relative_lambdas = gae_xp.relative_position_lambda(q, lengths=lengths)
    for got, rule, parameter in ((vapo_lambdas, vapo, alpha), (relative_lambdas, relative, q)):
        assert got.shape == lengths.shape and np.all((got >= 0) & (got <= 1))
        for value, length in zip(got, lengths):
            assert math.isclose(value, rule(int(length), parameter), rel_tol=1e-12, abs_tol=1e-15)


def test_short_trajectories_get_zero_under_vapo():
    """l < 1 / alpha would give a negative lambda: it is 0 (the advantages are the TD errors)."""
    np.testing.assert_array_equal(gae_xp.length_adaptive_lambda(0.05, lengths=np.array([1, 19, 20, 21])),
                                  [0.0, 0.0, 0.0, 1.0 - 1.0 / (0.05 * 21)])


@pytest.mark.parametrize(("call", "error", "message"), [
    (lambda f: f(0.0, lengths=np.array([3])), ValueError, "must be a positive number"),
    (lambda f: f(-1.0, lengths=np.array([3])), ValueError, "must be a positive number"),
    (lambda f: f(float("inf"), lengths=np.array([3])), ValueError, "must be a positive number"),
    (lambda f: f(True, lengths=np.array([3])), TypeError, "must be a real number"),
    (lambda f: f(np.array(0.5), lengths=np.array([3])), TypeError, "must be a real number"),
    (lambda f: f(0.5, lengths=np.array([-1, 3])), ValueError, "lengths must be at least 0"),
    (lambda f: f(0.5, lengths=np.array([np.nan])), ValueError, "lengths must be at least 0"),
    (lambda f: f(0.5, lengths=np.array([True])), TypeError, "lengths must be integers or real numbers"),
    (lambda f: f(0.5, lengths=[3]), TypeError, "lengths must be an array"),
    (lambda f: f(0.5), ValueError, "give the trajectories' lengths"),
    (lambda f: f(0.5, lengths=np.array([3]), mask=np.ones((1, 3), bool)), ValueError, "not lengths= and mask="),
    (lambda f: f(0.5, mask=np.ones((1, 3))), TypeError, "mask must have dtype bool"),
    (lambda f: f(0.5, mask=np.ones((1, 3), bool), per_token=True), ValueError, "per_token needs cu_seqlens"),
    (lambda f: f(0.5, mask=np.ones((1, 3), bool), per_token=1), TypeError, "per_token must be a bool"),
    (lambda f: f(0.5, mask=np.ones((1, 3), bool), cu_seqlens=np.array([0, 2])), ValueError, "cu_seqlens must end"),
    (lambda f: f(0.5, cu_seqlens=np.array([0.0, 2.0])), TypeError, "cu_seqlens must have an integer dtype"),
    (lambda f: f(0.5, cu_seqlens=np.array([1, 2])), ValueError, "cu_seqlens must start at 0"),
    (lambda f: f(0.5, lengths=np.array([3, 4]), cu_seqlens=np.array([0, 2])), ValueError, "one length per sequence"),
    (lambda f: f(0.5, mask=np.ones((1, 3), bool), axis=2), ValueError, "axis 2 is out of range"),
    (lambda f: f(0.5, lengths=np.array([3]), dtype=np.int64), TypeError, "dtype must be a real floating dtype"),
])
@pytest.mark.parametrize("rule", RULES)
def test_bad_input_is_named(rule, call, error, message):
    function = RULES[rule][0]
    if rule == "relative" and "positive number" in message:
        message = "q must be a finite number"
    with pytest.raises(error, match=message):
        call(function)


def test_relative_position_q_outside_the_unit_interval():
    for q in (0.0, -0.5, 1.5, float("nan")):
        with pytest.raises(ValueError, match=r"q must be a finite number in \(0, 1\]"):
            gae_xp.relative_position_lambda(q, lengths=np.array([2]))


def test_inputs_are_kept():
    mask = np.ones((2, 5), dtype=bool)
    lengths = np.array([3, 4])
    gae_xp.length_adaptive_lambda(0.5, mask=mask)
    gae_xp.relative_position_lambda(0.5, lengths=lengths)
    assert mask.all() and lengths.tolist() == [3, 4]
    assert not np.shares_memory(gae_xp.relative_position_lambda(1.0, lengths=np.array([2.0])), lengths)


def test_one_length_gives_one_lambda():
    lam = gae_xp.length_adaptive_lambda(1.0, lengths=np.array(4))
    assert lam.shape == () and float(lam) == 0.75
