"""The long description (PyPI's page): README.md with its relative links and pictures made absolute.

README.md links its pictures and pages relatively, so that they work in a clone and on the repository's site;
on PyPI a relative link leads nowhere. Building the sdist or the wheel runs this file, which hands setuptools
README.md with every relative target rewritten against the project's homes in pyproject.toml's
``[project.urls]`` (recorded there once):

* a docs page ``docs/NAME.md`` (a guide or an API page of the docs site) -> ``Documentation``/en/latest/NAME.html;
* a picture ``![...](PATH)`` -> the raw file on the repository's ``main`` branch;
* any other file -> its page on the repository (``Repository``/blob/main/PATH).

It also hands setuptools ``Homepage`` as ``url`` (the metadata's ``Home-page``, which older tools read).
Everything else in pyproject.toml is static; tests/test_packaging.py checks the rewrite.
"""

from __future__ import annotations

import pathlib
import re
import sys

ROOT = pathlib.Path(__file__).resolve().parent
BRANCH = "main"
#: a Markdown link or picture ``[text](target)`` / ``![alt](target "title")``: group 1 is "!" for a picture
INLINE = re.compile(r"(!?)\[([^\]]*)\]\(([^)\s]+)((?:\s+\"[^\"]*\")?)\)")
#: a reference definition ``[label]: target``
DEFINITION = re.compile(r"^(\s{0,3}\[[^\]]+\]:\s*)(\S+)", re.MULTILINE)
#: an HTML attribute that holds an address
ATTRIBUTE = re.compile(r"\b(src|href)=\"([^\"]+)\"")
PICTURES = (".png", ".jpg", ".jpeg", ".gif", ".svg", ".webp")


def project_urls(root: pathlib.Path = ROOT) -> dict[str, str]:
    """``[project.urls]`` of pyproject.toml."""
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover (pyproject's build requirements bring tomli there)
        import tomli as tomllib
    return tomllib.loads((root / "pyproject.toml").read_text(encoding="utf-8"))["project"]["urls"]


def is_relative(target: str) -> bool:
    """Whether ``target`` is a path inside the repository (not an address, an anchor or a mail link)."""
    return not re.match(r"^([a-z][a-z0-9+.-]*:|#|/)", target, re.IGNORECASE)


def absolute(target: str, picture: bool, urls: dict[str, str]) -> str:
    """``target`` (relative to the repository's root) as an address that works from PyPI's page."""
    if not is_relative(target):
        return target
    path, _, anchor = target.partition("#")
    path = path.removeprefix("./")
    anchor = f"#{anchor}" if anchor else ""
    repository = urls["Repository"].rstrip("/")
    page = re.fullmatch(r"docs/(?!asv/)(.+)\.md", path)
    if page and not picture:
        return f"{urls['Documentation'].rstrip('/')}/en/latest/{page.group(1)}.html{anchor}"
    if picture or path.lower().endswith(PICTURES):
        owner_name = repository.removeprefix("https://github.com/")
        return f"https://raw.githubusercontent.com/{owner_name}/{BRANCH}/{path}"
    return f"{repository}/blob/{BRANCH}/{path}{anchor}"


def long_description(root: pathlib.Path = ROOT) -> str:
    """README.md with every relative link and picture made absolute (see the module's docstring)."""
    urls = project_urls(root)
    text = (root / "README.md").read_text(encoding="utf-8")
    text = INLINE.sub(lambda m: f"{m[1]}[{m[2]}]({absolute(m[3], m[1] == '!', urls)}{m[4]})", text)
    text = DEFINITION.sub(lambda m: m[1] + absolute(m[2], False, urls), text)
    return ATTRIBUTE.sub(lambda m: f'{m[1]}="{absolute(m[2], m[1] == "src", urls)}"', text)


if __name__ == "__main__":
    from setuptools import setup

    # url: the metadata's Home-page, which older tools read (pip 23's `pip show`); newer ones take the
    # Project-URL labelled Homepage
    setup(long_description=long_description(), long_description_content_type="text/markdown",
          url=project_urls()["Homepage"])
