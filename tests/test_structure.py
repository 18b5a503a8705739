"""The package's structure: no import loop among its modules, and the problem's per-step fields written once.

Imports are read from the source (``ast``), the way a reader sees them: every module-level import, those under
``if TYPE_CHECKING:`` included, and the backends folder as the package ``gae_xp.backends`` it is installed as
(the source tree reaches it through the ``gae_xp/backends`` symlink). Imports inside functions are how the
package defers a framework or a backend until its arrays arrive: a loop through them cannot fail at import, but
it still ties two modules into one, so they are read too (``test_no_import_loop_through_deferred_imports``),
except imports of a package itself (its ``__init__``: the backends' registry, which names the modules it loads).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = {"gae_xp": ROOT / "gae_xp", "gae_xp.backends": ROOT / "backends"}


def _modules() -> dict[str, Path]:
    found = {}
    for package, folder in FOLDERS.items():
        for path in sorted(folder.rglob("*.py")):
            relative = path.relative_to(folder).with_suffix("")
            if relative.parts[0] == "backends":  # the symlink, seen from gae_xp/
                continue
            parts = [p for p in relative.parts if p != "__init__"]
            found[".".join([package, *parts])] = path
    return found


def _imports(name: str, path: Path, known: set[str], *, deferred: bool = False) -> set[str]:
    """The modules of ``known`` that module ``name`` imports at module level (``deferred``: anywhere, inside
    functions too)."""
    tree = ast.parse(path.read_text())
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    nodes = list(tree.body)
    for node in tree.body:  # if TYPE_CHECKING: ... blocks are read too
        if isinstance(node, ast.If):
            nodes.extend(node.body)
    if deferred:
        nodes = list(ast.walk(tree))
    targets = set()
    for node in nodes:
        if isinstance(node, ast.Import):
            targets.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            submodules = {f"{module}.{alias.name}" for alias in node.names} & known
            targets.update(submodules or {module})  # "from . import x" depends on x, not on the package
    return {t for t in targets if t in known and t != name}


def _graph(*, deferred: bool = False) -> dict[str, set[str]]:
    modules = _modules()
    return {name: _imports(name, path, set(modules), deferred=deferred) for name, path in modules.items()}


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node):
        state[node] = 1
        stack.append(node)
        for target in sorted(graph[node]):
            if state.get(target) == 1:
                return stack[stack.index(target):] + [target]
            if state.get(target) is None:
                found = visit(target)
                if found:
                    return found
        state[node] = 2
        stack.pop()
        return None

    for node in sorted(graph):
        if node not in state:
            found = visit(node)
            if found:
                return found
    return None


def test_the_graph_is_read():
    graph = _graph()
    assert "gae_xp._problem" in graph and "gae_xp.backends.dask" in graph
    assert "gae_xp._problem" in graph["gae_xp.backends.dask"]


def test_no_import_loop():
    cycle = _cycle(_graph())
    assert cycle is None, "import loop: " + " -> ".join(cycle)


#: The one loop left through a deferred import: ``_prepare`` hands torch CPU offsets to ``torch_ops``'s operator
#: (checked when the graph runs), which checks them with ``_prepare``'s own function.
DEFERRED_LOOPS_LEFT = {("gae_xp._prepare", "gae_xp.backends.torch_ops")}


def test_no_import_loop_through_deferred_imports():
    """No modules import each other in a loop through imports inside functions either: a backend's plan module
    imports its backend (the registry names the plan module, ``backends.PLAN_MODULES``), the checks import the
    problem type, never the reverse."""
    packages = {name for name, path in _modules().items() if path.name == "__init__.py"}
    deferred = _graph(deferred=True)
    graph = {name: {target for target in targets
                    if target not in packages and (name, target) not in DEFERRED_LOOPS_LEFT}
             for name, targets in deferred.items()}
    cycle = _cycle(graph)
    assert cycle is None, "import loop: " + " -> ".join(cycle)
    assert all(target in deferred[source] for source, target in DEFERRED_LOOPS_LEFT), \
        "a loop listed as left is gone: remove it from DEFERRED_LOOPS_LEFT"


def test_the_package_never_imports_the_developer_tools():
    """tools/ (the traffic models, the PTX reader, the stand-in driver) is the clone's, not the wheel's: no module
    of the installed package imports it, inside functions either."""
    importers = []
    for path in _modules().values():
        for node in ast.walk(ast.parse(path.read_text())):
            names = [alias.name for alias in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else []
            if any(name == "tools" or name.startswith("tools.") for name in names):
                importers.append(str(path.relative_to(ROOT)))
    assert (ROOT / "tools" / "traffic.py").is_file()
    assert not importers, f"{importers} import tools/, which is not installed"


def test_the_problem_type_is_a_leaf():
    assert _graph(deferred=True)["gae_xp._problem"] <= {"gae_xp._compat"}


def test_per_step_fields_are_written_once():
    """Adding a per-step input is one edit: the list lives in gae_xp/_problem.py, and other modules walk it with
    ``GaeProblem.steps()`` / ``map_steps()`` instead of naming the fields in a tuple of their own."""
    fields = ("next_values", "terminated", "truncated", "mask")
    # the names as strings ("mask", ...) or as attributes of a problem (p.mask, p.mask is not None, ...), one after
    # the other
    listing = re.compile(r"\s*,\s*".join(rf"(?:[\"']{field}[\"']|\w+\.{field}\b(?:\s+is\s+not\s+None)?)"
                                          for field in fields))
    offenders = [str(path.relative_to(ROOT)) for name, path in _modules().items()
                 if name != "gae_xp._problem" and listing.search(path.read_text())]
    assert not offenders, f"the per-step fields are listed by hand in {offenders}: use GaeProblem.steps()"
    assert listing.search((ROOT / "gae_xp" / "_problem.py").read_text())


def test_a_checkout_without_symlinks_imports(tmp_path):
    """git with core.symlinks=false writes gae_xp/backends as a text file holding "../backends": the package
    still finds its backends (in the clone's root) and computes."""
    import shutil
    import subprocess
    import sys

    clone = tmp_path / "clone"
    shutil.copytree(ROOT / "gae_xp", clone / "gae_xp", symlinks=True, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(ROOT / "backends", clone / "backends", ignore=shutil.ignore_patterns("__pycache__"))
    link = clone / "gae_xp" / "backends"
    link.unlink()
    link.write_text("../backends")
    code = ("import numpy as np, gae_xp, gae_xp.backends as b; "
            "assert b.__file__.startswith(%r); print(gae_xp.gae(np.ones(3), np.zeros(3), gamma=1.0, lam=1.0)[0])"
            % str(clone / "backends"))
    done = subprocess.run([sys.executable, "-c", code], cwd=clone, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[3. 2. 1.]"
