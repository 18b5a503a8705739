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


_AFTER_WARM_UP = """
import sys
import numpy as np, gae_xp
from gae_xp.backends import numba_cpu
cases, layout, library = sys.argv[1].split(","), sys.argv[2], sys.argv[3]
gae_xp.warm_up(cases=cases)
kernels = numba_cpu._kernels()
drivers = (kernels.constant_units, kernels.general_units, kernels.walk_units)
before = [len(kernel.signatures) for kernel in drivers]
rng = np.random.default_rng(0)
if library == "torch":
    import torch
convert = torch.from_numpy if library == "torch" else (lambda a: a)
for length in (128, 4096):
    shape = (8, length)
    rewards = rng.standard_normal(shape).astype(np.float32)
    values = rng.standard_normal((8, length + 1)).astype(np.float32)  # the last column: the bootstrap value
    flags = {"terminated": rng.random(shape) < 0.01, "mask": rng.random(shape) >= 0.2,
             "truncated": rng.random(shape) < 0.01}
    if layout == "time-last":
        arrays = {"rewards": rewards, "values": values[:, :-1].copy(), "next_values": values[:, 1:].copy(), **flags}
        options = {}
    elif layout == "time-first":  # (T, B) arrays, each C-contiguous, and values[:-1] of a (T + 1, B) array
        first = values.T.copy()
        arrays = {"rewards": rewards.T.copy(), "values": first[:-1], "next_values": first[1:],
                  **{name: flag.T.copy() for name, flag in flags.items()}}
        options = {"axis": 0}
    else:  # the README's bootstrap column
        arrays = {"rewards": rewards, "values": values[:, :-1], "next_values": values[:, 1:], **flags}
        options = {"bootstrap_value": convert(values[:, -1])}
    arrays = {name: convert(a) for name, a in arrays.items()}
    for case in cases:
        given = {"constant": (), "dones": ("terminated",), "mask": ("mask",), "dones+mask": ("terminated", "mask"),
                 "truncated": ("terminated", "mask", "truncated", "next_values")}[case]
        # next_values replaces the bootstrap value
        bootstrap = {} if case == "truncated" else {k: v for k, v in options.items() if k == "bootstrap_value"}
        gae_xp.gae(arrays["rewards"], arrays["values"], **{name: arrays[name] for name in given}, **bootstrap,
                   **{k: v for k, v in options.items() if k != "bootstrap_value"})
print(before, [len(kernel.signatures) for kernel in drivers])
"""

CASES = ("constant", "dones", "mask", "dones+mask", "truncated")


def _compiles_nothing_after_warm_up(cases, layout: str, library: str) -> None:
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", _AFTER_WARM_UP, ",".join(cases), layout, library],
                          capture_output=True, text=True, check=True, timeout=600)
    before, after = done.stdout.strip().split("] [")
    assert before + "]" == "[" + after, done.stdout


@pytest.mark.parametrize("case", CASES)
def test_after_warm_up_a_call_of_its_case_compiles_nothing(case):
    """In a fresh process, the calls a case names (the benchmarks' B=8, rows shorter and longer than the window,
    float32) find every kernel they run made by ``warm_up(cases=(case,))``: no kernel gains a signature."""
    _compiles_nothing_after_warm_up([case], "time-last", "numpy")


@pytest.mark.parametrize("library", ["numpy", "torch"])
@pytest.mark.parametrize("layout", ["time-first", "bootstrap column"])
def test_after_warm_up_the_calls_of_its_layouts_compile_nothing(layout, library):
    """The same for every case at once, laid out as ``warm_up``'s other layouts name: time first with ``axis=0``
    (CleanRL's; ``values[:-1]`` of a (T + 1, B) array), and the README's ``values[..., :-1]`` with
    ``bootstrap_value=values[..., -1]`` (``next_values=values[..., 1:]``), on NumPy arrays and torch CPU tensors."""
    if library == "torch":
        pytest.importorskip("torch")
    _compiles_nothing_after_warm_up(CASES, layout, library)


def test_warm_up_names_a_layout_it_does_not_know():
    with pytest.raises(ValueError, match="layouts must name some of 'time-last', 'time-first', 'bootstrap column'"):
        gae_xp.warm_up(layouts="strided")


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
