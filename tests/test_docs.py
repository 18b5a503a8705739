"""The documentation holds: every public function documents itself with a runnable example, the examples run
(on NumPy, as doctests), and the README's two commands are marked for .ci/run, which runs them as written."""

from __future__ import annotations

import doctest
import importlib
import inspect
import pkgutil
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

#: Modules whose docstrings' examples run here, and whose public functions must each carry one.
PUBLIC_MODULES = ["gae_xp.estimators", "gae_xp.turns", "gae_xp.lambdas", "gae_xp.groups", "gae_xp.reinforce",
                  "gae_xp._config", "gae_xp.testing", "gae_xp.testing.assertions",
                  "gae_xp.testing.cases", "gae_xp.reference",
                  *(f"gae_xp.adapters.{name}" for name in ("verl", "slime", "openrlhf", "torchrl", "rlax", "areal",
                                                            "cleanrl", "trl")),
                  "gae_xp.distributed._gae", "gae_xp.distributed._whiten", "gae_xp.distributed._exchange",
                  "gae_xp.distributed._groups"]
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


@pytest.mark.parametrize("package", ["gae_xp", "gae_xp.distributed", "gae_xp.testing"])
def test_every_exported_function_is_annotated(package):
    """Issue 44, 7: length_adaptive_lambda, relative_position_lambda and the distributed gae lacked annotations."""
    module = importlib.import_module(package)
    functions = [getattr(module, name) for name in module.__all__ if inspect.isfunction(getattr(module, name))]
    unannotated = [f"{function.__module__}.{function.__name__}({name})" for function in functions
                   for name in inspect.signature(function).parameters
                   if name not in inspect.get_annotations(function)]
    assert functions and not unannotated, unannotated


def test_warm_up_documents_what_it_returns():
    doc = inspect.getdoc(importlib.import_module("gae_xp").warm_up)
    for section in ("Parameters", "Returns", "Examples"):
        assert re.search(rf"^{section}\n-+$", doc, re.MULTILINE), section


@pytest.mark.parametrize("package", ["gae_xp", "gae_xp.distributed"])
def test_every_exported_function_has_its_examples_run(package):
    """A function exported by ``__all__`` (and so on the docs site's API pages) lives in a module listed above:
    its examples run here and its numpydoc sections are checked."""
    module = importlib.import_module(package)
    functions = [getattr(module, name) for name in module.__all__ if inspect.isfunction(getattr(module, name))]
    assert functions
    unlisted = sorted({f"{function.__module__} ({function.__name__})" for function in functions
                       if function.__module__ not in PUBLIC_MODULES})
    assert not unlisted, f"add {unlisted} to PUBLIC_MODULES"


def test_the_api_pages_cover_every_public_module_and_the_cli():
    """The docs site's API pages (docs/api/, built by Sphinx in CI) list each public module's names by themselves;
    here: every public module and package has its directive, and the adapters' directive finds all of them."""
    pages = "\n".join(path.read_text() for path in (ROOT / "docs" / "api").glob("*.md"))
    for module in ("gae_xp", "gae_xp.distributed", "gae_xp.reference", "gae_xp.testing"):
        assert f".. public-api:: {module}\n" in pages, module
    assert ".. public-modules:: gae_xp.adapters\n" in pages and ".. cli-help::" in pages
    adapters = {f"gae_xp.adapters.{name}" for name in ("verl", "slime", "openrlhf", "torchrl", "rlax", "areal",
                                                       "cleanrl", "trl")}
    assert adapters <= set(PUBLIC_MODULES)
    found = {f"gae_xp.adapters.{info.name}" for info in
             pkgutil.iter_modules(importlib.import_module("gae_xp.adapters").__path__) if not info.name.startswith("_")}
    assert found == adapters, "an adapter module is missing from PUBLIC_MODULES (its examples would not run)"


def test_readme_marks_its_two_commands():
    """.ci/run takes the line after each marker and runs it as written: both markers must be there."""
    readme = (ROOT / "README.md").read_text()
    for marker, needle in (("the main job", "python -m gae_xp bench"), ("the tests", "python -m pytest")):
        found = re.search(rf"<!-- {marker}: \.ci/run runs the next line as written -->\n    (.+)\n", readme)
        assert found, f"README.md lacks the marker for {marker}"
        assert needle in found.group(1), found.group(1)
    assert "readme_command" in (ROOT / ".ci" / "run").read_text()
