"""Where numba caches what gae_xp compiles: one user cache directory, never inside the installed package.

numba's own locators keep a module's compiled code beside it (its
``__pycache__``), which for an installed gae_xp is inside ``site-packages``:
``pip uninstall`` leaves those files behind, and the leftover ``gae_xp`` folder
then imports as an empty namespace package. With ``NUMBA_CACHE_DIR`` they name
the directory after the module's path, so a clone's ``gae_xp`` and the
installed copy of the same code never share it.

The locator here serves every function defined in gae_xp's own files (the
package's folder and the backends' folder), the numba CPU kernels, the group
kernel, the bench's bare loops and the numba-CUDA kernels alike. It writes to
``cache_dir()``, the first of

1. ``$NUMBA_CACHE_DIR/gae_xp`` when ``NUMBA_CACHE_DIR`` is set;
2. ``$GAE_XP_CACHE_DIR`` when set;
3. the platform's user cache directory: ``$XDG_CACHE_HOME/gae_xp`` (default
   ``~/.cache/gae_xp``) on Linux, ``~/Library/Caches/gae_xp`` on macOS,
   ``%LOCALAPPDATA%\\gae_xp`` on Windows;

and, when that directory cannot be written, ``<temp dir>/gae_xp-cache-<user>``.
Inside it, one folder per source file, ``<stem>-<digest>``, ``<digest>`` being
the first 16 hex digits of the SHA-256 of the file's contents, which also
stands for the file's freshness in numba's index (numba's own locators use its
modification time): the installed copy and a clone of the same code share one
cache, and an edited file gets a fresh folder. ``install`` puts the locator
first in a numba caching module's ``CacheImpl._locator_classes`` (numba's CPU
one and numba-cuda's); a numba without that list keeps its own locators.
"""

from __future__ import annotations

import getpass
import hashlib
import os
import sys
import tempfile

#: The package this module belongs to (``gae_xp``, imported before its ``backends``), read without an import.
_PACKAGE_FILE = getattr(sys.modules.get((__package__ or "").rpartition(".")[0]), "__file__", None)
#: The folders whose functions (their subfolders' too) the locator serves: the backends' (this file's; in a clone,
#: ``gae_xp/backends`` links to the top-level ``backends/``) and the package's.
_SERVED = tuple(os.path.join(os.path.dirname(os.path.realpath(path)), "") for path in (__file__, _PACKAGE_FILE)
                if path)


def user_cache_dir() -> str:
    """The platform's user cache directory for gae_xp (``XDG_CACHE_HOME`` respected on Linux)."""
    if sys.platform == "win32":
        base = os.environ.get("LOCALAPPDATA") or os.path.join(os.path.expanduser("~"), "AppData", "Local")
    elif sys.platform == "darwin":
        base = os.path.join(os.path.expanduser("~"), "Library", "Caches")
    else:
        base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "gae_xp")


def cache_dir() -> str:
    """``$NUMBA_CACHE_DIR/gae_xp``, else ``$GAE_XP_CACHE_DIR``, else ``user_cache_dir()``."""
    if os.environ.get("NUMBA_CACHE_DIR"):
        return os.path.join(os.environ["NUMBA_CACHE_DIR"], "gae_xp")
    return os.environ.get("GAE_XP_CACHE_DIR") or user_cache_dir()


def _fallback_dir() -> str:
    """Where the cache goes when ``cache_dir()`` cannot be written: a per-user folder in the temporary directory."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = "user"
    return os.path.join(tempfile.gettempdir(), f"gae_xp-cache-{user}")


def _writable(path: str) -> bool:
    try:
        os.makedirs(path, exist_ok=True)
        tempfile.TemporaryFile(dir=path).close()
    except OSError:
        return False
    return True


def _served(py_file: str) -> bool:
    return os.path.realpath(py_file).startswith(_SERVED)


class ContentCacheLocator:
    """numba's locator interface for gae_xp's files: a cache folder named after the source file's contents."""

    def __init__(self, py_func, py_file: str, base: str):
        self._py_file = py_file
        self._lineno = py_func.__code__.co_firstlineno
        with open(py_file, "rb") as source:
            self._digest = hashlib.sha256(source.read()).hexdigest()[:16]
        stem = os.path.splitext(os.path.basename(py_file))[0]
        self._cache_path = os.path.join(base, f"{stem}-{self._digest}")

    def ensure_cache_path(self):
        os.makedirs(self._cache_path, exist_ok=True)
        tempfile.TemporaryFile(dir=self._cache_path).close()

    def get_cache_path(self) -> str:
        return self._cache_path

    def get_source_stamp(self) -> str:
        """The contents' digest: the same code at another path or with another modification time is fresh."""
        return self._digest

    def get_disambiguator(self) -> str:
        return str(self._lineno)

    @classmethod
    def from_function(cls, py_func, py_file: str):
        """A locator for a function of gae_xp's files, None for any other (numba's own locators take those)."""
        if not os.path.isfile(py_file) or not _served(py_file):
            return None
        for base in (cache_dir(), _fallback_dir()):
            if _writable(base):
                return cls(py_func, py_file, base)
        return None


def install(caching=None) -> None:
    """Put ``ContentCacheLocator`` first among the locators of ``caching`` (default: ``numba.core.caching``),
    once; call it before the ``cache=True`` functions are made (numba picks their locator then)."""
    if caching is None:
        from numba.core import caching
    impl = getattr(caching, "CacheImpl", None) or getattr(caching, "_CacheImpl", None)  # its name before numba 0.6x
    classes = getattr(impl, "_locator_classes", None)
    if isinstance(classes, list) and ContentCacheLocator not in classes:
        classes.insert(0, ContentCacheLocator)


def install_cuda() -> None:
    """``install`` for numba-cuda's kernels: its own caching module (``numba.cuda.core.caching``), else numba's."""
    try:
        from numba.cuda.core import caching
    except ImportError:  # a numba-cuda that caches through numba's module
        from numba.core import caching
    install(caching)
