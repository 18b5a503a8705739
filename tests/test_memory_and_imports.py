"""Peak memory of gae() on NumPy, lazy imports, and the backend registry."""

from __future__ import annotations

import subprocess
import sys
import tracemalloc

import numpy as np
import pytest
from conftest import load_target

import gae_xp
from gae_xp import backends


@pytest.mark.parametrize("backend", ["xp", "numba"])
@pytest.mark.parametrize("time_varying", [False, True])
def test_peak_memory_is_a_small_multiple_of_one_input(backend, time_varying):
    load_target(f"numpy/{backend}")
    rng = np.random.default_rng(0)
    shape = (4, 2**20)
    rewards = rng.standard_normal(shape, dtype=np.float32)
    values = rng.standard_normal(shape, dtype=np.float32)
    options = {}
    if time_varying:
        options = {"terminated": rng.random(shape) < 0.01, "truncated": rng.random(shape) < 0.01,
                   "mask": rng.random(shape) >= 0.2, "truncated_bootstrap": "next_step"}
    tracemalloc.start()
    try:
        advantages, returns = gae_xp.gae(rewards, values, backend=backend, **options)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert advantages.dtype == np.float32
    assert peak <= 16 * rewards.nbytes, f"peak {peak / rewards.nbytes:.1f} x one input"


HEAVY = "{'torch', 'jax', 'cupy', 'numba', 'scipy', 'array_api_strict', 'matplotlib', 'rich'}"


def _modules_after(code: str) -> str:
    script = f"import sys\n{code}\nprint(sorted({HEAVY} & set(sys.modules)))\n"
    return subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True).stdout.strip()


def test_import_loads_no_framework_and_no_compiler():
    assert _modules_after("import gae_xp") == "[]"


def test_generic_path_on_numpy_loads_nothing_more():
    code = ("import numpy as np, gae_xp\n"
            "gae_xp.gae(np.ones((2, 300)), np.ones((2, 300)), mask=np.ones((2, 300), bool), backend='xp')")
    assert _modules_after(code) == "[]"


def test_registry_names_and_forced_xp():
    assert backends.names()[0] == "auto" and "xp" in backends.names()
    rewards = np.ones((1, 10))
    np.testing.assert_allclose(gae_xp.gae(rewards, rewards, backend="xp")[0], gae_xp.gae(rewards, rewards)[0])


def test_unknown_backend_lists_the_known_ones():
    with pytest.raises(ValueError, match="'xp'"):
        gae_xp.gae(np.ones(3), np.ones(3), backend="nope")
