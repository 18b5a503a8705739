"""Sphinx directives of gae_xp's API pages: every public function of a module, and the command line's help.

``.. public-api:: MODULE`` documents every public function and class of MODULE in place: the names of its
``__all__`` (or, without one, the functions and classes defined in it whose names do not start with ``_``), a
summary table, then each one's numpydoc docstring. A function added to ``__all__`` appears with no edit here.

``.. public-modules:: PACKAGE`` does so for each public module of PACKAGE (the adapters), one section each.

``.. cli-help::`` prints ``gae-xp --help`` and each command's ``--help`` (the parser of ``gae_xp.__main__``), as
the user sees them at a width of 100 columns.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import inspect
import os
import pkgutil

from docutils import nodes
from docutils.parsers.rst import Directive
from docutils.statemachine import StringList
from sphinx.util.nodes import nested_parse_with_titles


def public_names(module) -> list[str]:
    """The public functions and classes of ``module``, in its ``__all__``'s order (or its source's)."""
    names = getattr(module, "__all__", None)
    if names is None:
        names = [name for name, value in vars(module).items()
                 if not name.startswith("_") and (inspect.isfunction(value) or inspect.isclass(value))
                 and value.__module__ == module.__name__]
    return [name for name in names if inspect.isfunction(getattr(module, name)) or
            inspect.isclass(getattr(module, name))]


class PublicApi(Directive):
    """``.. public-api:: MODULE``: a summary table and the docstring of each public function and class."""

    required_arguments = 1

    def run(self) -> list[nodes.Node]:
        module_name = self.arguments[0]
        module = importlib.import_module(module_name)
        names = public_names(module)
        if not names:
            raise self.error(f"{module_name} has no public function or class")
        lines = [f".. currentmodule:: {module_name}", "", ".. autosummary::", "", *(f"   {name}" for name in names), ""]
        for name in names:
            kind = "autoclass" if inspect.isclass(getattr(module, name)) else "autofunction"
            lines += [f".. {kind}:: {module_name}.{name}", ""]
        container = nodes.container()
        nested_parse_with_titles(self.state, StringList(lines, source=f"<public-api {module_name}>"), container)
        return container.children


class PublicModules(Directive):
    """``.. public-modules:: PACKAGE``: a section per public submodule, its docstring, then its public-api."""

    required_arguments = 1

    def run(self) -> list[nodes.Node]:
        package = importlib.import_module(self.arguments[0])
        lines = []
        for info in pkgutil.iter_modules(package.__path__):
            if info.name.startswith("_"):
                continue
            name = f"{package.__name__}.{info.name}"
            lines += [name, "-" * len(name), "", f".. automodule:: {name}", "   :no-members:", "",
                      f".. public-api:: {name}", ""]
        container = nodes.container()
        nested_parse_with_titles(self.state, StringList(lines, source=f"<public-modules {package.__name__}>"),
                                 container)
        return container.children


@contextlib.contextmanager
def columns(width: int):
    """argparse's line width (it asks the terminal's, through COLUMNS) fixed for the help printed here."""
    former = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = str(width)
    try:
        yield
    finally:
        if former is None:
            del os.environ["COLUMNS"]
        else:
            os.environ["COLUMNS"] = former


def commands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    """The parser's subcommands, by name."""
    found = {}
    for action in parser._actions:  # argparse has no public accessor for its subparsers
        if isinstance(action, argparse._SubParsersAction):
            found.update(action.choices)
    return found


class CliHelp(Directive):
    """``.. cli-help::``: ``gae-xp --help``, then a section per command with its ``--help``."""

    def run(self) -> list[nodes.Node]:
        from gae_xp.__main__ import build_parser

        with columns(100):
            parser = build_parser("gae-xp")
            blocks = [("gae-xp", parser.format_help())]
            blocks += [(f"gae-xp {name}", sub.format_help()) for name, sub in commands(parser).items()]
        result = []
        for title, text in blocks:
            section = nodes.section(ids=[nodes.make_id(title)])
            section += nodes.title(text=title)
            section += nodes.literal_block(text, text)
            result.append(section)
        return result


def setup(app) -> dict:
    app.add_directive("public-api", PublicApi)
    app.add_directive("public-modules", PublicModules)
    app.add_directive("cli-help", CliHelp)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
