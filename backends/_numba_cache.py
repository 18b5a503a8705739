"""Where numba caches the kernels: one directory per kernel source, whatever path the package is imported from.

numba's own locators keep a module's compiled code beside it (its
``__pycache__``) or, with ``NUMBA_CACHE_DIR``, under a directory named after
the module's path: a clone's ``gae_xp`` and the installed copy of the same
code never share it, so a script run from the clone's root compiles every
kernel again although the installed copy's cache holds them. The locator here
names the directory after the source file's contents instead (its SHA-256,
which numba's index also checks, whatever the path): ``<base>/gae_xp/<stem>-
<hash>``, ``<base>`` being ``NUMBA_CACHE_DIR`` when set, else the user's cache
directory (numba's ``appdirs``, the one numba's own user-wide locator uses).
It serves this package's kernel modules only, and gives way to numba's own
locators when that directory cannot be written. ``install`` puts it first in
numba's list (``numba.core.caching.CacheImpl._locator_classes``); a numba
without that list keeps its own locators.
"""

from __future__ import annotations

import hashlib
import os

from numba.core import caching, config

#: The folder of the modules this locator serves (the backends').
_HERE = os.path.dirname(os.path.abspath(__file__))


class ContentCacheLocator(caching._SourceFileBackedLocatorMixin, caching._CacheLocator):
    """A cache directory named after the kernel source's contents (see the module docstring)."""

    def __init__(self, py_func, py_file):
        self._py_file = py_file
        self._lineno = py_func.__code__.co_firstlineno
        with open(py_file, "rb") as source:
            digest = hashlib.sha256(source.read()).hexdigest()[:16]
        stem = os.path.splitext(os.path.basename(py_file))[0]
        self._cache_path = os.path.join(cache_base(), "gae_xp", f"{stem}-{digest}")

    def get_cache_path(self):
        return self._cache_path

    @classmethod
    def from_function(cls, py_func, py_file):
        if os.path.dirname(os.path.abspath(py_file)) != _HERE:
            return None
        return super().from_function(py_func, py_file)


def cache_base() -> str:
    """``NUMBA_CACHE_DIR`` when set, else the user's cache directory."""
    if config.CACHE_DIR:
        return config.CACHE_DIR
    from numba.misc.appdirs import AppDirs

    return AppDirs(appname="numba", appauthor=False).user_cache_dir


def install() -> None:
    """Put ``ContentCacheLocator`` first among numba's locators (once)."""
    impl = getattr(caching, "CacheImpl", None) or getattr(caching, "_CacheImpl", None)  # its name before numba 0.6x
    classes = getattr(impl, "_locator_classes", None)
    if isinstance(classes, list) and ContentCacheLocator not in classes:
        classes.insert(0, ContentCacheLocator)
