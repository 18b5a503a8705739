"""The documentation holds: every public function documents itself with a runnable example, the examples run
(on NumPy, as doctests), and the README's two commands are marked for .ci/run, which runs them as written."""

from __future__ import annotations

import doctest
import importlib
import inspect
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

#: Modules whose docstrings' examples run here, and whose public functions must each carry one.
PUBLIC_MODULES = ["gae_xp.estimators", "gae_xp.turns", "gae_xp.lambdas", "gae_xp.groups", "gae_xp.reinforce",
                  "gae_xp.testing", "gae_xp.testing.assertions",
                  "gae_xp.testing.cases", "gae_xp.reference",
                  *(f"gae_xp.adapters.{name}" for name in ("verl", "slime", "openrlhf", "torchrl", "rlax", "areal",
                                                            "cleanrl", "trl"))]
#: numpydoc sections every public function's docstring has.
SECTIONS = ("Parameters", "Returns", "Examples")


def _public_functions(module):
    names = getattr(module, "__all__", None) or [n for n in dir(module) if not n.startswith("_")]
    for name in names:
        value = getattr(module, name)
        if inspect.isfunction(value) and value.__module__ == module.__name__:
            yield name, value


@pytest.mark.parametrize("name", PUBLIC_MODULES)
def test_examples_run(name):
    module = importlib.import_module(name)
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE, verbose=False)
    assert result.failed == 0, f"{result.failed} of {result.attempted} examples in {name} failed (run python -m " \
                               f"doctest -v on its file)"
    assert result.attempted > 0, f"{name} has no examples"


@pytest.mark.parametrize("name", PUBLIC_MODULES)
def test_public_functions_are_documented(name):
    module = importlib.import_module(name)
    for function_name, function in _public_functions(module):
        doc = inspect.getdoc(function) or ""
        hints = inspect.get_annotations(function)
        assert "return" in hints, f"{name}.{function_name} has no return type hint"
        wanted = [s for s in SECTIONS if s != "Returns" or hints["return"] not in (None, "None")]
        missing = [section for section in wanted if not re.search(rf"^{section}\n-+$", doc, re.MULTILINE)]
        assert not missing, f"{name}.{function_name} lacks the numpydoc sections {missing}"


def test_readme_marks_its_two_commands():
    """.ci/run takes the line after each marker and runs it as written: both markers must be there."""
    readme = (ROOT / "README.md").read_text()
    for marker, needle in (("the main job", "python -m gae_xp bench"), ("the tests", "python -m pytest")):
        found = re.search(rf"<!-- {marker}: \.ci/run runs the next line as written -->\n    (.+)\n", readme)
        assert found, f"README.md lacks the marker for {marker}"
        assert needle in found.group(1), found.group(1)
    assert "readme_command" in (ROOT / ".ci" / "run").read_text()
