"""``gae_xp.show_config()``: the routes, whether each can run here and why not, and the packages' versions."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys

import gae_xp
from gae_xp import _config, backends


def test_show_config_prints_and_returns_every_route_and_version():
    stream = io.StringIO()
    config = gae_xp.show_config(file=stream)
    assert list(config["routes"]) == [*backends.REGISTRY, "torch-op"]
    assert config["routes"]["xp"] == {"serves": _config.SERVES["xp"], "usable": True, "why_not": None}
    for name, route in config["routes"].items():
        assert route["usable"] == (route["why_not"] is None), name
    assert set(config["versions"]) == set(_config.PACKAGES)
    assert config["versions"]["numpy"] == __import__("numpy").__version__
    assert config["gae_xp"] == gae_xp.__version__
    text = stream.getvalue()
    assert text.startswith(f"gae_xp {gae_xp.__version__} on Python ")
    for name, route in config["routes"].items():
        assert f"  {name}" in text and (route["why_not"] or "usable") in text


_SHOW = """
import json, sys
import gae_xp
config = gae_xp.show_config()
imported = sorted({m.split(".")[0] for m in sys.modules} & {"torch", "jax", "dask", "cupy", "triton"})
print(json.dumps({"routes": config["routes"], "imported": imported}))
"""


def _show(env: dict | None = None) -> dict:
    done = subprocess.run([sys.executable, "-c", _SHOW], capture_output=True, text=True, timeout=300, check=True,
                          env={**os.environ, **(env or {})})
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_show_config_imports_no_framework_it_does_not_need():
    """Versions come from metadata: JAX, Dask, CuPy and Triton are not imported to list them (torch neither on a
    machine without the Triton route)."""
    shown = _show()
    needs = {"triton", "torch"} if "triton" in backends.REGISTRY else set()
    assert set(shown["imported"]) <= needs, shown["imported"]


def test_show_config_reports_a_numba_that_does_not_import(tmp_path):
    (tmp_path / "numba").mkdir()
    (tmp_path / "numba" / "__init__.py").write_text('raise ImportError("Numba needs NumPy 2.4 or less. Got 2.5.")\n')
    path = os.pathsep.join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")]))
    routes = _show({"PYTHONPATH": path})["routes"]
    assert routes["numba"]["usable"] is False
    assert "does not import with NumPy" in routes["numba"]["why_not"]
    assert "Numba needs NumPy 2.4 or less" in routes["numba"]["why_not"]
    assert routes["torch-op"]["usable"] is False and routes["xp"]["usable"] is True


def test_show_config_reports_numpy_without_row_stack():
    script = "import numpy\ndel numpy.row_stack\nnumpy.__all__.remove('row_stack')\n" + _SHOW
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300, check=True)
    routes = json.loads(done.stdout.strip().splitlines()[-1])["routes"]
    assert "numpy.row_stack was removed): pip install 'numpy<2.5'" in routes["numba"]["why_not"]


def test_a_route_failed_in_this_process_is_shown_with_its_cause(monkeypatch):
    from gae_xp.backends import _fallback

    monkeypatch.setattr(_fallback, "_BROKEN", {"numba": "numba 0.0 cannot compile"})
    assert _config.routes()["numba"] == "failed in this process: numba 0.0 cannot compile"
    assert "numba failed in this process (numba 0.0 cannot compile)" in _config.summary()


def test_the_bench_headers_summary_imports_no_framework_or_compiler():
    """The bench's header line says what is installed without importing it: a NumPy bench's process must not load
    torch, triton or numba-cuda (and start a CUDA driver) to print its header."""
    import subprocess
    import sys

    script = ("import sys; from gae_xp import _config; line = _config.summary(); "
              "print(line); print(sorted(m for m in ('torch', 'triton', 'numba', 'jax', 'dask') if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    line, imported = done.stdout.strip().splitlines()
    assert imported == "[]", imported
    assert line.startswith("triton ") and "; xp yes" in line
