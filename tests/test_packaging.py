"""The package anyone may use: its licence, one version, the project's homes in its metadata, a long description
(PyPI's page) whose links and pictures all work from PyPI, and no file that names a tool users cannot install."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import re
import shutil
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
#: Words of the environment the project was built in, not of the project (issue 44, 5), as regular expressions,
#: written in parts so that this file does not match them itself; pytest's own use of one of them (a fixture's
#: scope, its hook's argument) is allowed.
ENVIRONMENT_WORDS = [r"\bwork" r"place", r"\bdevice" r" tool", r"\ble" r"nt\b", r"\ble" r"ase[sd]?\b",
                     r"\bsess" r"ions?\b", r"\bthe le" r"ad\b", r"\bengin" r"eers?\b"]
PYTEST_SESSION = r'scope="sess' r'ion"|\(sess' r'ion\)|sess' r'ion\.config'


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
    assert set(project["urls"]) == {"Homepage", "Repository", "Documentation", "Issues", "Changelog"}
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


def test_the_project_speaks_of_itself_alone():
    """No tracked file speaks of the environment the project was built in, only of what a user can use: "a GPU
    machine without a package registry", "a shared 2-core VM"."""
    found = []
    for path in _project_files():
        if not path.is_file() or path.suffix in (".png", ".ico", ".gz", ".whl"):
            continue
        text = re.sub(PYTEST_SESSION, "", path.read_text(encoding="utf-8", errors="replace"))
        for number, line in enumerate(text.splitlines(), 1):
            found += [f"{path.relative_to(ROOT)}:{number}: {line.strip()}" for word in ENVIRONMENT_WORDS
                      if re.search(word, line, re.IGNORECASE)]
    assert not found, "\n".join(found)


def test_no_file_names_a_tool_users_cannot_install():
    found = []
    for path in _project_files():
        name = path.relative_to(ROOT)
        if not path.is_file() or path.suffix in (".png", ".ico", ".gz", ".whl"):
            continue
        text = path.read_text(encoding="utf-8", errors="replace").lower()
        found += [f"{name}: {tool}" for tool in UNINSTALLABLE if tool in text]
    assert not found, found


def test_the_wheel_ships_the_package_and_not_the_developer_tools():
    """The wheel's packages are gae_xp's (tools/, the clone's developer tooling, is none of them), and every folder
    of gae_xp/ with modules is one of them: ``gae_xp.bench`` keeps the benchmarks a user runs."""
    packages = PYPROJECT["tool"]["setuptools"]["packages"]
    assert all(package == "gae_xp" or package.startswith("gae_xp.") for package in packages), packages
    folders = {".".join(("gae_xp", *path.parent.relative_to(ROOT / "gae_xp").parts))
               for path in (ROOT / "gae_xp").rglob("__init__.py") if "backends" not in path.parts}
    assert folders | {"gae_xp.backends"} == set(packages)
    assert (ROOT / "tools" / "__init__.py").is_file() and not (ROOT / "gae_xp" / "bench" / "traffic.py").exists()


def _site_packages(python: Path) -> Path:
    found = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                           capture_output=True, text=True, check=True)
    return Path(found.stdout.strip())


def _installed_files(site: Path) -> tuple[set[str], set[str]]:
    """(the files under site-packages/gae_xp, the files gae_xp's RECORD lists there), relative to site-packages."""
    (record,) = site.glob("gae_xp-*.dist-info/RECORD")
    listed = {line.split(",")[0] for line in record.read_text().splitlines() if line.startswith("gae_xp/")}
    present = {path.relative_to(site).as_posix() for path in (site / "gae_xp").rglob("*") if path.is_file()}
    return present, listed


@pytest.mark.slow  # the full matrix: a venv, two installs and a bench (15-35 s)
def test_an_installed_copy_gets_nothing_compiled_inside_it_and_reinstalls_editable(tmp_path):
    """Issue 44, 1: the bench compiled numba's cache into site-packages/gae_xp/bench/__pycache__; pip uninstall left
    those files, and the leftover folder then imported as an empty namespace package (``gae_xp.gae`` missing after
    ``pip install -e .``). Here: a fresh venv, ``pip install .``, the bench and the group kernel run from outside
    the source with an empty cache directory, nothing in the package but what the install wrote, the compiled code
    in the cache directory, then ``pip install -e .`` and ``import gae_xp; gae_xp.gae``."""
    pytest.importorskip("numba")
    # setuptools>=77 here: the build uses it, offline; else pip's isolated build fetches it from the registry
    builders = [dist for dist in importlib.metadata.distributions(name="setuptools")
                if int(dist.version.split(".")[0]) >= 77]
    source = tmp_path / "source"  # a copy, so that the build writes nothing into this checkout
    shutil.copytree(ROOT, source, symlinks=True, ignore=shutil.ignore_patterns(
        ".git", "build", "dist", "*.egg-info", "__pycache__", "_build", ".hypothesis", ".pytest_cache", ".venv*"))
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / ("Scripts" if os.name == "nt" else "bin") / "python"
    site = _site_packages(python)
    # The dependencies (and the build's setuptools) come from this environment, as plain folders: the .pth files
    # there, an editable gae_xp's among them, are not read.
    import array_api_compat
    import llvmlite
    import numba
    import numpy

    folders = {str(Path(module.__file__).parents[1]) for module in (numpy, array_api_compat, numba, llvmlite)}
    folders |= {str(builder.locate_file("")) for builder in builders[:1]}
    (site / "gae_xp_test_dependencies.pth").write_text("\n".join(sorted(folders)) + "\n")
    pip = [sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps", "--quiet",
           *(["--no-build-isolation", "--no-index"] if builders else [])]
    env = {key: value for key, value in os.environ.items() if key not in ("NUMBA_CACHE_DIR", "PYTHONPATH")}
    env["GAE_XP_CACHE_DIR"] = str(tmp_path / "cache")
    run = dict(cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)

    done = subprocess.run([*pip, str(source)], **run)
    if done.returncode != 0 and not builders and "setuptools" in done.stderr:
        pytest.skip(f"setuptools>=77 is neither installed nor reachable: {done.stderr.strip().splitlines()[-1]}")
    assert done.returncode == 0, done.stderr
    present, listed = _installed_files(site)
    assert present == listed and any(name.endswith(".pyc") for name in listed)
    # Issue 44, 7: pip 23's `pip show` printed a blank Home-page (it reads only that field)
    (metadata,) = site.glob("gae_xp-*.dist-info/METADATA")
    fields = metadata.read_text().split("\n\n")[0].splitlines()
    assert f"Home-page: {PYPROJECT['project']['urls']['Homepage']}" in fields
    assert "License-Expression: MIT" in fields and "License-File: LICENSE" in fields
    bench = [str(python), "-m", "gae_xp", "bench", "--library", "numpy", "--T", "512", "--chunk-size", "auto",
             "--repeat", "3", "--no-first-call"]
    done = subprocess.run(bench, **run)
    assert done.returncode == 0, done.stderr
    assert "bare numba loop" in done.stdout, "the bench's small-call part (its bare numba loops) did not run"
    groups = "import numpy as np, gae_xp; print(gae_xp.group_advantages(np.arange(6.0), np.array([0, 0, 1, 1, 2, 2])))"
    done = subprocess.run([str(python), "-c", groups], **run)
    assert done.returncode == 0, done.stderr
    assert _installed_files(site) == (listed, listed), "something was written inside the installed package"
    cached = {path.name.rsplit("-", 1)[0] for path in (tmp_path / "cache").iterdir()}
    assert {"_numba_kernels", "_numba_groups", "small_calls"} <= cached, cached
    assert any((tmp_path / "cache").rglob("*.nbc")) and any((tmp_path / "cache").rglob("*.nbi"))

    done = subprocess.run([*pip, "--editable", str(source)], **run)
    assert done.returncode == 0, done.stderr
    assert not (site / "gae_xp").exists(), sorted(map(str, (site / "gae_xp").rglob("*")))
    imported = "import gae_xp; gae_xp.gae; print(gae_xp.__file__)"
    done = subprocess.run([str(python), "-c", imported], **run)
    assert done.returncode == 0, done.stderr
    assert Path(done.stdout.strip()).resolve().is_relative_to(source.resolve()), done.stdout


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
