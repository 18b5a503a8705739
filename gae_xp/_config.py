"""``gae_xp.show_config()``: the routes ``backend="auto"`` may take on this machine, which can run and why not.

A route's compiler is imported here only where it is installed (a framework
that is not installed is never imported), and a compiler that fails to import
is reported, never raised: the point is to say why a route is not taken.
Versions come from the installed distributions' metadata, without imports.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import os
import sys
from typing import Callable, TextIO

from . import backends
from ._version import __version__
from .backends import _fallback

__all__ = ["show_config"]

#: The distributions whose versions decide the routes (cupy under each of its wheel names).
PACKAGES = ("numpy", "array-api-compat", "numba", "llvmlite", "numba-cuda", "numba-cuda-mlir", "triton", "torch",
            "cupy", "cupy-cuda12x", "cupy-cuda13x", "jax", "jaxlib", "dask")

#: What each route serves, in words.
SERVES = {
    "triton": "torch CUDA tensors, and CuPy arrays through torch (Triton kernels)",
    "numba-cuda": "CuPy arrays and torch CUDA tensors (numba-CUDA kernels)",
    "numba": "NumPy arrays and torch CPU tensors (numba kernels)",
    "jax": "JAX arrays on a CPU (lax.scan)",
    "dask": "Dask arrays (Dask's own graph)",
    "xp": "every array-API library (the generic chunk scan)",
    "torch-op": "torch tensors that require grad (custom operator: numba on the CPU, Triton or numba-cuda on CUDA)",
}


def versions() -> dict[str, str | None]:
    """The installed version of each of ``PACKAGES`` (None where not installed), read from metadata."""
    found = {}
    for package in PACKAGES:
        try:
            found[package] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            found[package] = None
    return found


def routes() -> dict[str, str | None]:
    """Each route, in the order "auto" tries them: None where it can run on this machine, else why not."""
    names = [*backends.REGISTRY, "torch-op"]
    return {name: _why_not(name) for name in names}


def show_config(file: TextIO | None = None) -> dict:
    """Print, and return, gae_xp's version, the versions of the packages it may use, and its routes.

    Each route ``backend="auto"`` may take is listed with what it serves and
    whether it can run on this machine, with the reason where it cannot: a
    package not installed, a compiler that does not import or compile with
    the installed NumPy (and what to install), no GPU. Nothing that is not
    installed is imported, and a broken compiler is reported, not raised.

    Parameters
    ----------
    file : text stream, optional
        Where to print (default ``sys.stdout``); the data is returned either way.

    Returns
    -------
    dict
        ``{"gae_xp": version, "python": version, "versions": {package: version or None},
        "routes": {route: {"serves": str, "usable": bool, "why_not": str or None}}}``.

    Examples
    --------
    >>> import io
    >>> import gae_xp
    >>> config = gae_xp.show_config(file=io.StringIO())
    >>> config["routes"]["xp"]["usable"]
    True
    """
    config = {
        "gae_xp": __version__,
        "python": sys.version.split()[0],
        "versions": versions(),
        "routes": {name: {"serves": SERVES.get(name, ""), "usable": why is None, "why_not": why}
                   for name, why in routes().items()},
    }
    print("\n".join(lines(config)), file=file or sys.stdout)
    return config


def lines(config: dict) -> list[str]:
    """``show_config``'s data as text."""
    installed = ", ".join(f"{package} {version}" for package, version in config["versions"].items() if version)
    missing = ", ".join(package for package, version in config["versions"].items() if not version)
    out = [f"gae_xp {config['gae_xp']} on Python {config['python']}", f"installed: {installed}",
           f"not installed: {missing or 'none'}", 'routes, in the order backend="auto" tries them:']
    width = max(map(len, config["routes"]))
    for name, route in config["routes"].items():
        state = "usable" if route["usable"] else f"not usable: {route['why_not']}"
        out.append(f"  {name.ljust(width)}  {route['serves']}: {state}")
    return out


#: The module each kernel route needs, for ``summary``: found without importing it (``numba_cuda`` is numba-cuda's
#: own top-level module; ``numba.cuda`` would import numba).
ROUTE_MODULES = {"triton": "triton", "numba-cuda": "numba_cuda", "numba": "numba", "jax": "jax", "dask": "dask",
                 "torch-op": "torch"}


def summary() -> str:
    """One line for the bench's header, importing nothing: each route "installed", "not installed" or "failed in
    this process (why)"; the generic path "yes". ``show_config`` probes further (compilers, GPUs)."""
    states = []
    for name in [*backends.REGISTRY, "torch-op"]:
        module, cause = ROUTE_MODULES.get(name), _fallback.broken(name)
        if cause is not None:
            state = f"failed in this process ({cause})"
        elif module is None:
            state = "yes"
        else:
            state = "installed" if _installed(module) else "not installed"
        states.append(f"{name} {state}")
    return "; ".join(states)


def _why_not(name: str) -> str | None:
    cause = _fallback.broken(name)
    if cause is not None:
        return f"failed in this process: {cause}"
    probe = _PROBES.get(name)
    if probe is None:
        return None
    try:
        return probe()
    except Exception as error:  # a route's probe must not take show_config down
        if _fallback.is_compiler_failure(error):
            return _fallback.describe(name, error)
        return f"{type(error).__name__}: {error}"


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a parent package that does not import
        return False


def _numba() -> str | None:
    if not _installed("numba"):
        return "numba is not installed (pip install 'gae_xp[numba]')"
    importlib.import_module("numba.np.arrayobj")  # what the kernels' first compile loads
    return None


def _numba_cuda() -> str | None:
    if os.environ.get("NUMBA_ENABLE_CUDASIM", "0") == "1":
        return "NUMBA_ENABLE_CUDASIM=1: the CUDA simulator serves backend='numba-cuda' only, never 'auto'"
    if not (_installed("numba_cuda_mlir") or _installed("numba") and _installed("numba.cuda")):
        return "neither numba-cuda nor numba-cuda-mlir is installed (pip install 'gae_xp[cuda12]' or 'gae_xp[cuda13]')"
    from .backends import _cuda_import

    if _cuda_import.NAME == _cuda_import.NUMBA_CUDA:
        importlib.import_module("numba.cuda.np.arrayobj")  # what the kernels' first compile loads
    if not _cuda_import.cuda.is_available():
        return f"{_cuda_import.NAME} finds no usable CUDA driver or GPU"
    return None


def _triton() -> str | None:
    if not _installed("triton"):
        return "triton is not installed (it comes with torch's Linux CUDA wheels)"
    from .backends import triton as route

    if route.interpreted():
        return "TRITON_INTERPRET=1: the interpreter serves backend='triton' only, never 'auto'"
    importlib.import_module("triton")
    return _torch_cuda()


def _torch_cuda() -> str | None:
    if not _installed("torch"):
        return "torch is not installed"
    import torch

    return None if torch.cuda.is_available() else "no CUDA GPU (torch.cuda.is_available() is False)"


def _torch_op() -> str | None:
    if not _installed("torch"):
        return "torch is not installed"
    return _fallback.broken("numba") or _numba()


def _package(module: str, extra: str) -> Callable[[], str | None]:
    return lambda: None if _installed(module) else f"{module} is not installed (pip install 'gae_xp[{extra}]')"


_PROBES: dict[str, Callable[[], str | None]] = {
    "triton": _triton,
    "numba-cuda": _numba_cuda,
    "numba": _numba,
    "jax": _package("jax", "jax"),
    "dask": _package("dask", "dask"),
    "torch-op": _torch_op,
}
