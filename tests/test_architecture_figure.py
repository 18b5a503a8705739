"""docs/architecture_figure.py reads the imports from the code and draws them with matplotlib alone."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def figure():
    spec = importlib.util.spec_from_file_location("architecture_figure", ROOT / "docs" / "architecture_figure.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_arrows_are_the_codes_imports(figure):
    lines, edges = figure.graph()
    assert {"estimators", "_prepare", "_scan", "_compat", "backends", "distributed", "adapters", "bench"} <= set(lines)
    # estimators.py: "from . import _prepare", "from .backends import ..."; backends/numba_cpu.py: "from .._problem"
    assert {("estimators", "_prepare"), ("estimators", "backends"), ("backends", "_problem"),
            ("__init__", "estimators"), ("__main__", "bench")} <= set(edges)
    assert not [edge for edge in edges if edge[0] == "_compat"], "_compat imports no module of gae_xp"
    assert ("reference", "estimators") not in edges, "the oracle shares no code with the implementation"


def test_every_importer_stands_left_of_what_it_imports(figure):
    lines, edges = figure.graph()
    column = {name: c for c, names in enumerate(figure.rows(sorted(lines), edges)) for name in names}
    assert sorted(column) == sorted(lines)
    for source, target in edges:
        if (target, source) not in edges:
            assert column[source] < column[target], (source, target)


def test_it_draws_a_png(figure, tmp_path):
    pytest.importorskip("matplotlib")
    out = tmp_path / "architecture.png"
    assert figure.main([str(out)]) == 0
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
