"""The package anyone may use: its licence, one version, the project's homes in its metadata, a long description
(PyPI's page) whose links and pictures all work from PyPI, and no file that names a tool users cannot install."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest

import gae_xp

ROOT = Path(__file__).resolve().parents[1]
if sys.version_info >= (3, 11):
    import tomllib
else:
    import tomli as tomllib
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())

#: Tools that pip and apt cannot install, once named by the project (a drawing tool that redrew
#: docs/architecture.png). Written in two parts so that this file does not name them itself.
UNINSTALLABLE = ["farm" "-studio"]


def _setup_module():
    spec = importlib.util.spec_from_file_location("gae_xp_setup", ROOT / "setup.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # its setup() runs only as __main__, when a build runs the file
    return module


def _targets(markdown: str) -> list[str]:
    """Every link and picture target of a Markdown text: inline, reference definitions and HTML attributes."""
    inline = re.findall(r"!?\[[^\]]*\]\(([^)\s]+)", markdown)
    definitions = re.findall(r"^\s{0,3}\[[^\]]+\]:\s*(\S+)", markdown, re.MULTILINE)
    attributes = re.findall(r"\b(?:src|href)=\"([^\"]+)\"", markdown)
    return inline + definitions + attributes


def test_the_licence_is_mit_and_ships():
    text = (ROOT / "LICENSE").read_text()
    assert text.startswith("MIT License") and "the gae_xp developers" in text
    assert PYPROJECT["project"]["license"] == "MIT" and PYPROJECT["project"]["license-files"] == ["LICENSE"]


def test_one_version():
    """The version is written in gae_xp/_version.py only: pyproject reads it, gae_xp re-exports it."""
    assert "version" not in PYPROJECT["project"] and "version" in PYPROJECT["project"]["dynamic"]
    assert PYPROJECT["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "gae_xp._version.__version__"}
    from gae_xp._version import __version__

    assert gae_xp.__version__ == __version__
    assert re.fullmatch(r"\d+\.\d+\.\d+", __version__)
    assert (ROOT / "CHANGELOG.md").read_text().count(f"## [{__version__}]") == 1, "CHANGELOG lacks this version"


def test_metadata_names_authors_and_homes():
    project = PYPROJECT["project"]
    assert project["authors"] and project["maintainers"] and project["keywords"] and project["classifiers"]
    assert set(project["urls"]) == {"Repository", "Documentation", "Issues", "Changelog"}
    assert all(url.startswith("https://") for url in project["urls"].values())


def test_the_long_description_has_only_absolute_links():
    """PyPI shows the long description: a relative link or picture there leads nowhere."""
    setup = _setup_module()
    urls = PYPROJECT["project"]["urls"]
    readme = (ROOT / "README.md").read_text()
    described = setup.long_description(ROOT)
    relative = [target for target in _targets(readme) if setup.is_relative(target)]
    assert relative, "the README's relative links are what the rewrite is for"
    assert len(_targets(described)) == len(_targets(readme))
    for target in _targets(described):
        assert target.startswith("https://"), target
    pictures = re.findall(r"!\[[^\]]*\]\(([^)\s]+)", described)
    assert pictures and all(p.startswith("https://raw.githubusercontent.com/gae-xp/gae-xp/main/docs/")
                            for p in pictures)
    assert f"{urls['Documentation']}/en/latest/performance.html" in described
    # the text around the links, the two commands and their markers included, is the README's
    assert re.sub(r"\]\([^)]*\)", "]()", described) == re.sub(r"\]\([^)]*\)", "]()", readme)


def test_the_readmes_relative_links_point_at_files_that_exist():
    setup = _setup_module()
    for target in _targets((ROOT / "README.md").read_text()):
        if setup.is_relative(target):
            assert (ROOT / target.partition("#")[0]).exists(), target


@pytest.mark.parametrize(("address", "picture", "expected"), [
    ("docs/gpu.md", False, "https://gae-xp.readthedocs.io/en/latest/gpu.html"),
    ("docs/gpu.md#traffic", False, "https://gae-xp.readthedocs.io/en/latest/gpu.html#traffic"),
    ("docs/api/index.md", False, "https://gae-xp.readthedocs.io/en/latest/api/index.html"),
    ("CHANGELOG.md", False, "https://github.com/gae-xp/gae-xp/blob/main/CHANGELOG.md"),
    ("docs/bench.png", True, "https://raw.githubusercontent.com/gae-xp/gae-xp/main/docs/bench.png"),
    ("examples/ppo_cartpole.py", False, "https://github.com/gae-xp/gae-xp/blob/main/examples/ppo_cartpole.py"),
    ("https://example.org/x.md", False, "https://example.org/x.md"),
    ("#semantics", False, "#semantics"),
])
def test_a_relative_target_becomes_its_home(address, picture, expected):
    assert _setup_module().absolute(address, picture, PYPROJECT["project"]["urls"]) == expected


def _project_files() -> list[Path]:
    """The tracked files (in a git checkout), else every file outside hidden and build folders (an sdist)."""
    listed = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, text=True)
    if listed.returncode == 0 and listed.stdout:
        return [ROOT / name for name in listed.stdout.split("\0") if name]
    skipped = {"build", "dist", "__pycache__", "_build"}
    return [path for path in ROOT.rglob("*")
            if not any(part.startswith(".") or part in skipped for part in path.relative_to(ROOT).parts)]


def test_no_file_names_a_tool_users_cannot_install():
    found = []
    for path in _project_files():
        name = path.relative_to(ROOT)
        if not path.is_file() or path.suffix in (".png", ".ico", ".gz", ".whl"):
            continue
        text = path.read_text(encoding="utf-8", errors="replace").lower()
        found += [f"{name}: {tool}" for tool in UNINSTALLABLE if tool in text]
    assert not found, found


def test_the_cuda_extras_install_a_numpy_that_numba_cuda_compiles_with():
    """numba-cuda 0.30 fails at its first compile under NumPy 2.5 (numpy.row_stack was removed): every extra that
    installs it as the CUDA kernels' compiler also installs a NumPy before 2.5."""
    from packaging.requirements import Requirement

    extras = {name: [Requirement(text) for text in texts]
              for name, texts in PYPROJECT["project"]["optional-dependencies"].items()}
    compiling = sorted(name for name, requirements in extras.items()
                       if any(r.name == "numba-cuda" for r in requirements))
    assert compiling == ["cuda12", "cuda13", "numba-cuda"]
    for name in compiling:
        numpy = [r for r in extras[name] if r.name == "numpy"]
        assert len(numpy) == 1, f"the {name} extra pins no NumPy"
        assert numpy[0].specifier.contains("2.4.6") and not numpy[0].specifier.contains("2.5.0"), (name, numpy[0])
