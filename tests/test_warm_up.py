"""``gae_xp.warm_up()``: the kernels of the cases it names are ready after it (numba compiled them or loaded them)."""

from __future__ import annotations

import pytest

import gae_xp

numba_cpu = pytest.importorskip("gae_xp.backends.numba_cpu")
pytest.importorskip("numba")


def test_warm_up_readies_the_kernels_of_its_cases():
    gae_xp.warm_up(dtypes=("float32", "float64"), cases=("constant", "mask"))
    kernels = numba_cpu._kernels()
    kinds = {(signature[0].dtype.name, kernel.__name__)
             for kernel in (kernels.constant_units, kernels.general_units, kernels.walk_units)
             for signature in kernel.signatures}
    assert {(dtype, name) for dtype in ("float32", "float64")
            for name in ("constant_units", "general_units", "walk_units")} <= kinds


def test_warm_up_names_a_case_it_does_not_know():
    with pytest.raises(ValueError, match="cases must name some of"):
        gae_xp.warm_up(cases=("constant", "everything"))


_FIRST_CALL = """
import numpy as np, gae_xp
from gae_xp.backends import _numba_kernels as kernels
gae_xp.gae(np.ones((2, 8), np.float32), np.ones((2, 8), np.float32))
print(gae_xp.__file__, len(kernels.walk_units.stats.cache_hits), len(kernels.walk_units.stats.cache_misses))
"""


@pytest.mark.slow
def test_a_warm_cache_serves_every_import_location(tmp_path):
    """The kernels compiled by a process that imported gae_xp from the clone are loaded, not compiled, by one that
    imports a copy of the package from elsewhere (numba's own cache is keyed by the module's path)."""
    import os
    import pathlib
    import shutil
    import subprocess
    import sys

    root = pathlib.Path(gae_xp.__file__).resolve().parent.parent
    elsewhere = tmp_path / "site"
    shutil.copytree(root / "gae_xp", elsewhere / "gae_xp", symlinks=False,
                    ignore=shutil.ignore_patterns("__pycache__"))
    env = {**os.environ, "NUMBA_CACHE_DIR": str(tmp_path / "cache")}
    seen = []
    for where in (root, elsewhere, root):
        done = subprocess.run([sys.executable, "-c", _FIRST_CALL], cwd=tmp_path, capture_output=True, text=True,
                              env={**env, "PYTHONPATH": str(where)}, check=True, timeout=600)
        path, hits, misses = done.stdout.split()
        assert pathlib.Path(path).resolve().is_relative_to(where.resolve())
        seen.append((int(hits), int(misses)))
    assert seen == [(0, 1), (1, 0), (1, 0)]
