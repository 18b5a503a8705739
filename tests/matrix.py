"""The quick run and the full matrix: which parametrised cases of a test the default ``python -m pytest`` keeps.

A test parametrised over several axes (chunk sizes x discounts x dtypes...) runs
its whole cross product only in the full matrix (``pytest -m slow``). The quick
run keeps, for every target (library/backend) the test runs on, a covering
subset of its other axes: every value of every axis at least once, in
``max(len(axis))`` cases instead of ``prod(len(axis))``. Case r takes value
``(r + t) % len(axis)`` on each axis, t being the target's position, so that the
targets do not all draw the same combinations. Every case the quick run leaves
out gets the ``slow`` marker: ``pytest`` (``-m "not slow"``) and ``pytest -m
slow`` run disjoint sets whose union is the whole suite.

JAX's targets are the exception: eager JAX compiles every operation anew for
each shape it meets, so one case of a test costs it seconds where NumPy and
torch take milliseconds (about half of the quick run's time went to them). On
a JAX target the quick run keeps one case of each test, the first covering
round, and runs no test of ``JAX_IN_THE_FULL_MATRIX_ONLY`` at all: the files
whose functions (turn-level GAE, group advantages, the fourth hostile round)
run on JAX through the same array-API code the NumPy, torch and
array-api-strict targets run in the quick run, and which held 131 of its 282 s
of JAX (of 781 s of tests on two workers, measured on a 2-core AMD EPYC VM).
What is JAX's own (tracing, ``jit``, ``grad``, ``shard_map``, the ``jax``
backend) keeps its tests there; the full matrix runs everything.
"""

from __future__ import annotations

from collections import defaultdict

import pytest

#: The fixture whose parameter is the (library, backend) target: each of its values keeps its own covering subset.
TARGET = "target"
#: Libraries whose targets keep one case of each test in the quick run (the module docstring says why).
ONE_CASE_LIBRARIES = ("jax:cpu", "jax:cuda")
#: Test files whose cases on those libraries' targets run in the full matrix only (the module docstring says why).
JAX_IN_THE_FULL_MATRIX_ONLY = ("tests/test_turns.py", "tests/conformance/test_areal_turns.py",
                               "tests/test_hardening4.py", "tests/test_groups.py")


def _function(item) -> str:
    return item.nodeid.partition("[")[0]


def _axes(item) -> list[tuple[str, ...]]:
    """The item's parameter axes: one per parametrize call (its argnames together), one per other parameter."""
    params = getattr(getattr(item, "callspec", None), "params", {})
    axes = []
    for mark in item.iter_markers("parametrize"):
        names = mark.args[0] if mark.args else mark.kwargs["argnames"]
        names = tuple(n.strip() for n in names.split(",") if n.strip()) if isinstance(names, str) else tuple(names)
        if all(name in params for name in names):
            axes.append(names)
    named = {name for axis in axes for name in axis}
    return axes + [(name,) for name in params if name not in named]


def _values(item) -> dict[tuple[str, ...], tuple[int, ...]]:
    """Each axis's value in this case, by identity (the parametrize call's own objects, shared by its cases)."""
    params = item.callspec.params
    return {axis: tuple(id(params[name]) for name in axis) for axis in _axes(item)}


def covered(indices: dict[str, int], sizes: dict[str, int], one_case: bool = False) -> bool:
    """True when the case at ``indices`` (axis -> position) is one of the quick run's covering cases.

    ``sizes`` gives each axis's number of values; the target axis, when present,
    is not thinned. ``one_case``: keep only the first covering round (a JAX
    target).
    """
    shift = indices.get(TARGET, 0)
    axes = [axis for axis in indices if axis != TARGET]
    if not axes:
        return True
    rounds = 1 if one_case else max(sizes[axis] for axis in axes)
    return any(all(indices[axis] == (r + shift) % sizes[axis] for axis in axes) for r in range(rounds))


def mark_the_full_matrix(items) -> None:
    """Give every parametrised case outside its test's covering subset the ``slow`` marker."""
    groups = defaultdict(list)
    for item in items:
        if getattr(item, "callspec", None) is not None and item.callspec.params:
            groups[_function(item)].append(item)
    for cases in groups.values():
        values = [_values(item) for item in cases]
        positions = defaultdict(dict)  # axis -> value -> its position, in the order the cases were generated
        for case in values:
            for axis, value in case.items():
                positions[axis].setdefault(value, len(positions[axis]))
        sizes = {axis[0] if axis == (TARGET,) else axis: len(seen) for axis, seen in positions.items()}
        for item, case in zip(cases, values):
            indices = {axis[0] if axis == (TARGET,) else axis: positions[axis][value] for axis, value in case.items()}
            target = str(item.callspec.params.get(TARGET, ""))
            one_case = target.partition("/")[0] in ONE_CASE_LIBRARIES
            if not covered(indices, sizes, one_case=one_case) or (
                    one_case and item.nodeid.partition("::")[0] in JAX_IN_THE_FULL_MATRIX_ONLY):
                item.add_marker(pytest.mark.slow)
