"""The README's examples run as written and print what the README says under each (its ``# `` lines)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BLOCKS = re.findall(r"```python\n(.*?)```", (ROOT / "README.md").read_text(), re.S)


def _split(block: str) -> tuple[str, str]:
    """(the code, the output it promises): the block's trailing lines that start with '# '."""
    lines = block.rstrip("\n").split("\n")
    promised = []
    while lines and lines[-1].startswith("# "):
        promised.insert(0, lines.pop()[2:])
    return "\n".join(lines) + "\n", "\n".join(promised)


def test_the_readme_has_five_examples_each_promising_output():
    assert len(BLOCKS) == 5
    assert all(_split(block)[1] for block in BLOCKS)


@pytest.mark.parametrize("block", BLOCKS, ids=[f"example {i + 1}" for i in range(len(BLOCKS))])
def test_readme_example_prints_what_it_promises(block):
    code, promised = _split(block)
    if "import torch" in code:
        pytest.importorskip("torch")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == promised.strip()
