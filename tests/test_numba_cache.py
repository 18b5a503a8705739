"""Where numba's cache of gae_xp's code goes (``gae_xp.backends._numba_cache``): one user cache directory, chosen by
``NUMBA_CACHE_DIR``, ``GAE_XP_CACHE_DIR`` or the platform, a folder per source file named by its contents, never
the folder of the installed package (tests/test_packaging.py installs one and checks it)."""

from __future__ import annotations

import os
import shutil
import sys

import pytest

pytest.importorskip("numba")

from gae_xp.backends import _numba_cache  # noqa: E402


@pytest.fixture
def clean_environment(monkeypatch):
    for name in ("NUMBA_CACHE_DIR", "GAE_XP_CACHE_DIR", "XDG_CACHE_HOME"):
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def test_numba_cache_dir_comes_first_then_gae_xp_cache_dir(clean_environment, tmp_path):
    clean_environment.setenv("GAE_XP_CACHE_DIR", str(tmp_path / "ours"))
    assert _numba_cache.cache_dir() == str(tmp_path / "ours")
    clean_environment.setenv("NUMBA_CACHE_DIR", str(tmp_path / "numba"))
    assert _numba_cache.cache_dir() == os.path.join(str(tmp_path / "numba"), "gae_xp")


@pytest.mark.skipif(sys.platform in ("win32", "darwin"), reason="XDG_CACHE_HOME is the Linux and BSD convention")
def test_the_user_cache_dir_respects_xdg_cache_home(clean_environment, tmp_path):
    assert _numba_cache.cache_dir() == os.path.join(os.path.expanduser("~"), ".cache", "gae_xp")
    clean_environment.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert _numba_cache.cache_dir() == os.path.join(str(tmp_path), "gae_xp")


def _kernel():
    """A function for the locator to place."""


def test_gae_xp_files_are_placed_by_contents_other_files_left_to_numba(clean_environment, tmp_path):
    """A copy of the same source at another path (a clone against the installed package), written later, is fresh
    for the same folder; a file outside gae_xp is not this locator's."""
    clean_environment.setenv("GAE_XP_CACHE_DIR", str(tmp_path / "cache"))
    from gae_xp.backends import _numba_groups

    source = _numba_groups.__file__
    here = _numba_cache.ContentCacheLocator.from_function(_numba_groups.group_moments.py_func, source)
    assert here is not None and here.get_cache_path().startswith(str(tmp_path / "cache") + os.sep)
    assert os.path.basename(here.get_cache_path()).startswith("_numba_groups-")
    copy = tmp_path / "elsewhere" / "_numba_groups.py"
    copy.parent.mkdir()
    shutil.copyfile(source, copy)
    os.utime(copy, (1, 1))
    there = _numba_cache.ContentCacheLocator(_numba_groups.group_moments.py_func, str(copy), str(tmp_path / "cache"))
    assert there.get_cache_path() == here.get_cache_path()
    assert there.get_source_stamp() == here.get_source_stamp()
    copy.write_text(copy.read_text() + "\n# edited\n")
    edited = _numba_cache.ContentCacheLocator(_numba_groups.group_moments.py_func, str(copy), str(tmp_path / "cache"))
    assert edited.get_cache_path() != here.get_cache_path() and edited.get_source_stamp() != here.get_source_stamp()
    assert _numba_cache.ContentCacheLocator.from_function(_kernel, __file__) is None
    assert _numba_cache.ContentCacheLocator.from_function(_kernel, str(copy)) is None


def test_an_unwritable_cache_dir_falls_back_to_the_temporary_directory(clean_environment, tmp_path):
    blocker = tmp_path / "a file"
    blocker.write_text("")
    clean_environment.setenv("GAE_XP_CACHE_DIR", str(blocker / "cache"))
    from gae_xp.backends import _numba_groups

    located = _numba_cache.ContentCacheLocator.from_function(_numba_groups.group_moments.py_func,
                                                             _numba_groups.__file__)
    assert located.get_cache_path().startswith(_numba_cache._fallback_dir())


def test_every_cached_kernel_of_gae_xp_gets_the_locator():
    """The CPU kernels, the group kernel and the bench's bare loops are placed by it (numba picks a function's
    locator when the function is made, so install() runs before each of them is)."""
    from gae_xp.backends import _numba_groups, _numba_kernels
    from gae_xp.bench.small_calls import _bare_loops

    kernels = [_numba_groups.group_moments, *_bare_loops()]
    kernels += [value for value in vars(_numba_kernels).values()
                if getattr(value, "_cache", None) is not None and hasattr(value._cache, "_impl")]
    assert len(kernels) > 3
    for kernel in kernels:
        assert isinstance(kernel._cache._impl.locator, _numba_cache.ContentCacheLocator), kernel


def test_numba_cuda_kernels_get_the_locator_too(clean_environment, tmp_path):
    """numba-cuda keeps its own caching module: its cache of a gae_xp function goes to the same directory."""
    caching = pytest.importorskip("numba.cuda.core.caching")
    dispatcher = pytest.importorskip("numba.cuda.dispatcher")
    clean_environment.setenv("GAE_XP_CACHE_DIR", str(tmp_path / "cache"))
    _numba_cache.install_cuda()
    assert caching.CacheImpl._locator_classes[0] is _numba_cache.ContentCacheLocator
    from gae_xp.backends import _numba_groups

    cache = dispatcher.CUDACache(_numba_groups.group_moments.py_func)
    assert isinstance(cache._impl.locator, _numba_cache.ContentCacheLocator)
    assert cache._cache_path.startswith(str(tmp_path / "cache") + os.sep)
