"""``gae_xp.warm_up()``: the kernels of the cases it names are ready after it (numba compiled them or loaded them)."""

from __future__ import annotations

import pytest

import gae_xp

numba_cpu = pytest.importorskip("gae_xp.backends.numba_cpu")
pytest.importorskip("numba")


def test_warm_up_readies_the_kernels_of_its_cases():
    gae_xp.warm_up(dtypes=("float32", "float64"), cases=("constant", "mask"))
    kernels = numba_cpu._kernels()
    kinds = {(signature[0].dtype.name, kernel is kernels.constant_units)
             for kernel in (kernels.constant_units, kernels.general_units) for signature in kernel.signatures}
    assert {("float32", True), ("float64", True), ("float32", False), ("float64", False)} <= kinds


def test_warm_up_names_a_case_it_does_not_know():
    with pytest.raises(ValueError, match="cases must name some of"):
        gae_xp.warm_up(cases=("constant", "everything"))
