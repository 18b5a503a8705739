"""The quick run's covering subsets (tests/matrix.py): every value of every axis, on every target, in few cases."""

from __future__ import annotations

import itertools

import pytest
from matrix import TARGET, covered


@pytest.mark.parametrize("sizes", [{"a": 1}, {"a": 4}, {"a": 7, "b": 3}, {"a": 2, "b": 5, "c": 4},
                                   {"a": 3, "b": 3, "c": 2, "d": 6}])
@pytest.mark.parametrize("targets", [1, 13])
def test_each_target_sees_every_value_of_every_axis_in_as_many_cases_as_the_longest_axis(sizes, targets):
    all_sizes = {**sizes, TARGET: targets}
    for target in range(targets):
        cases = [dict(zip(sizes, values), **{TARGET: target})
                 for values in itertools.product(*(range(n) for n in sizes.values()))]
        kept = [case for case in cases if covered(case, all_sizes)]
        assert len(kept) == max(sizes.values())
        for axis, n in sizes.items():
            assert {case[axis] for case in kept} == set(range(n)), (target, axis)


@pytest.mark.parametrize("sizes", [{"a": 4}, {"a": 7, "b": 3}, {"a": 2, "b": 5, "c": 4}])
def test_a_one_case_target_keeps_exactly_one_case_of_each_test(sizes):
    all_sizes = {**sizes, TARGET: 13}
    for target in range(13):
        cases = [dict(zip(sizes, values), **{TARGET: target})
                 for values in itertools.product(*(range(n) for n in sizes.values()))]
        assert sum(covered(case, all_sizes, one_case=True) for case in cases) == 1


def test_a_test_without_other_axes_keeps_every_target():
    assert all(covered({TARGET: target}, {TARGET: 13}) for target in range(13))
