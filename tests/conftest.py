"""Fixtures: one test body, every installed array library and every gae_xp backend that can serve it.

The targets come from the registry the bench and asv use
(``gae_xp.testing.libraries.TARGETS``: "numpy/xp", "numpy/numba",
"torch:cpu/numba", "cupy/numba-cuda", ...). A test that asks for ``backend``
runs once per target; a test that asks only for ``library`` or ``xp`` runs
once per library, with ``backend="auto"``. Fixtures:

* ``target``: the (library, backend) pair, with how large an array it takes;
* ``library``: the ``gae_xp.testing.libraries.Library`` (asarray, to_numpy, device);
* ``xp``: the library's array namespace itself;
* ``backend``: the backend name to force.

A target that is not installed, needs a GPU that is not there, or cannot run
its backend is skipped with the reason; the targets and libraries named in
``GAE_XP_REQUIRE`` (comma-separated, e.g. ``numpy/numba,torch:cpu,jax:cpu``)
fail instead. ``numpy/numba-cuda`` is numba's CUDA simulator: it needs
``NUMBA_ENABLE_CUDASIM=1`` before numba is imported (its own pytest run, see
``.ci/run``).

Two runs share the suite (tests/matrix.py): ``python -m pytest`` is the quick
run (pyproject's ``-m "not slow"``: each test's parameter grid thinned to a
covering subset per target, 10 hypothesis examples per property, 3 on a JAX target); ``pytest -m
"slow or hypothesis"`` with ``GAE_XP_HYPOTHESIS_PROFILE=full`` is the rest of
the full matrix (every case the quick run leaves out, every property again at
40 examples). A heavy new test takes ``@pytest.mark.slow``.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings
from matrix import ONE_CASE_LIBRARIES, mark_the_full_matrix

from gae_xp.testing import libraries
from gae_xp.testing.libraries import Library

#: The clone's root, where the developer tools (``tools/``: the traffic models, the PTX reader, the stand-in CUDA
#: driver) live, not installed: appended, so that the tests find them whatever the command, and an installed
#: gae_xp stays the one imported where the tests run from outside the clone.
_ROOT = str(Path(__file__).resolve().parents[1])
if _ROOT not in sys.path:
    sys.path.append(_ROOT)

_SETTINGS = dict(deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
#: ``python -m pytest`` (the quick run) draws 10 examples per property; CI's full-matrix step draws 40 and reruns
#: every property test (``GAE_XP_HYPOTHESIS_PROFILE=full pytest -m "slow or hypothesis"``).
settings.register_profile("default", max_examples=10, **_SETTINGS)
settings.register_profile("full", max_examples=40, **_SETTINGS)
settings.register_profile("thorough", max_examples=400, **_SETTINGS)
# numba's CUDA simulator runs Python per thread: its CI step draws fewer examples (the CPU targets draw the default).
settings.register_profile("simulator", max_examples=10, **_SETTINGS)
# tests/gpu/check.sh: the GPU tests share about two minutes of a GPU machine, compiles included.
settings.register_profile("gpu", max_examples=3, **_SETTINGS)
PROFILE = os.environ.get("GAE_XP_HYPOTHESIS_PROFILE", "default")
settings.load_profile(PROFILE)
#: Examples per property on a JAX target, per profile: eager JAX compiles every operation anew for each shape an
#: example brings (seconds an example, and most of the quick run's memory), so the quick run draws 3 there and the
#: full matrix 20 (its 40 on every other target check the same algorithm; JAX targets held 12 of its 25 slowest
#: tests).
JAX_EXAMPLES = {"default": 3, "full": 20}


@pytest.fixture(autouse=True)
def _fewer_examples_on_jax(request):
    """A property test on a JAX target draws ``JAX_EXAMPLES`` of the profile (its settings are put back after it:
    the same test function serves the other targets)."""
    test = request.function
    target = str(getattr(getattr(request.node, "callspec", None), "params", {}).get("target", ""))
    if PROFILE not in JAX_EXAMPLES or target.partition("/")[0] not in ONE_CASE_LIBRARIES or \
            getattr(test, "hypothesis", None) is None:
        yield
        return
    # Hypothesis keeps a test's settings on it (its own @settings, else the profile's when it first ran), under a
    # name of its own: @settings itself refuses a second application, so the attribute is set and put back.
    attribute = "_hypothesis_internal_use_settings"
    kept = getattr(test, attribute, None)
    now = kept or settings.default
    setattr(test, attribute, settings(now, max_examples=min(now.max_examples, JAX_EXAMPLES[PROFILE])))
    try:
        yield
    finally:
        if kept is None:
            delattr(test, attribute)
        else:
            setattr(test, attribute, kept)

# Without an NVIDIA GPU the tests run Triton under its interpreter (tests/test_triton*.py,
# tests/test_gpu_baselines.py); Triton reads the variable when it is first imported, which torch may do before those
# tests run, so it is set for the whole test run. On a GPU machine the kernels are compiled (tests/gpu).
if not os.path.exists("/dev/nvidiactl"):
    os.environ.setdefault("TRITON_INTERPRET", "1")


TRITON_INTERPRET = os.environ.get("TRITON_INTERPRET")


@pytest.fixture(autouse=True)
def _triton_interpret_kept():
    """A test (or its fixtures) that changes ``TRITON_INTERPRET`` where the run set it fails: the Triton tests
    after it in the same worker would find their interpreter off (compile instead in a process of its own, as
    tests/test_cost_model.py does). On a GPU machine the run leaves it unset and the interpreter's tests set it
    for a module at a time (tests/test_gpu_baselines.py)."""
    yield
    now = os.environ.get("TRITON_INTERPRET")
    assert TRITON_INTERPRET is None or now == TRITON_INTERPRET, \
        f"TRITON_INTERPRET was {TRITON_INTERPRET!r} when the run began, {now!r} now"

REQUIRED = {name.strip() for name in os.environ.get("GAE_XP_REQUIRE", "").split(",") if name.strip()}
#: The CUDA simulator runs Python per thread: tests hand it small arrays only.
SIMULATOR_MAX_ELEMENTS = 20_000


@dataclass(frozen=True)
class Target:
    """A library and the backend forced on its arrays ("auto" when the test does not ask for one)."""

    name: str
    library: Library
    backend: str
    #: the largest array (elements) a test should hand this target.
    max_elements: int

    def __repr__(self):
        return self.name


def load_target(name: str) -> Target:
    """The target ``library/backend`` (backend "auto": the library alone), or a skip (a failure if required)."""
    library_name, _, backend = name.partition("/")
    reason = libraries.unavailable(library_name) if backend == "auto" else libraries.target_unavailable(name)
    if reason is not None:
        if name in REQUIRED or library_name in REQUIRED:
            pytest.fail(f"{name} unavailable: {reason} (required by GAE_XP_REQUIRE)")
        pytest.skip(f"{name} unavailable: {reason}")
    simulated = name == "numpy/numba-cuda"
    return Target(name, libraries.load(library_name), backend, SIMULATOR_MAX_ELEMENTS if simulated else 2**40)


def pytest_configure(config):
    known = set(libraries.TARGETS) | set(libraries.NAMES)
    unknown = REQUIRED - known
    if unknown:
        raise pytest.UsageError(f"GAE_XP_REQUIRE names unknown targets {sorted(unknown)}; known: {sorted(known)}")


def _param(name: str):
    library_name = name.partition("/")[0]
    marks = [pytest.mark.gpu] if library_name in libraries.GPU_NAMES else []
    if name == "numpy/numba-cuda":
        marks.append(pytest.mark.cudasim)
    return pytest.param(name, id=name.replace(":", "_").replace("/", "-").replace("numba-cuda", "numba_cuda")
                        .removesuffix("-auto"), marks=marks)


def pytest_generate_tests(metafunc):
    if "target" not in metafunc.fixturenames:
        return
    names = libraries.TARGETS if "backend" in metafunc.fixturenames else [f"{n}/auto" for n in libraries.NAMES]
    metafunc.parametrize("target", [_param(name) for name in names], indirect=True, scope="session")


@pytest.fixture(scope="session")
def target(request) -> Target:
    return load_target(request.param)


@pytest.fixture(scope="session")
def library(target) -> Library:
    return target.library


@pytest.fixture(scope="session")
def xp(target):
    return target.library.xp


@pytest.fixture(scope="session")
def backend(target) -> str:
    return target.backend


@pytest.hookimpl(tryfirst=True)  # before -m deselects: ``pytest -m slow`` must see the markers
def pytest_collection_modifyitems(items):
    mark_the_full_matrix(items)


#: pytest_plugins: each process's peak resident memory, reported at the end of the run (tests/peak_memory.py).
pytest_plugins = ["peak_memory"]

#: A worker whose resident memory passes this (bytes) while JAX is loaded empties JAX's caches after the test; the
#: bar then rises to what stayed resident plus the margin, so that the emptying (seconds) stays rare.
JAX_MEMORY_BAR = 1.0e9
JAX_MEMORY_MARGIN = 0.3e9
_jax_bar = [JAX_MEMORY_BAR]


def _resident() -> int:
    """This process's resident memory now (bytes; 0 where /proc is absent)."""
    try:
        with open("/proc/self/statm") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, AttributeError):
        return 0


def _return_freed_memory():
    """glibc's malloc keeps freed blocks in its arenas: ``malloc_trim(0)`` hands them back to the system (Linux)."""
    if sys.platform.startswith("linux"):
        import ctypes

        try:
            ctypes.CDLL("libc.so.6").malloc_trim(0)
        except (OSError, AttributeError):
            pass


def pytest_runtest_teardown(item, nextitem):
    """JAX keeps every program it compiled (one per shape and option set, eager operations included) for the life
    of the process, and freeing them returns nothing to the system unless malloc is trimmed: a worker grew past
    3.8 GB. Its caches are emptied, and the freed memory returned, whenever the next test comes from another module,
    and after any test that leaves the worker above the bar (a JAX module can compile 1 GB on its own)."""
    jax = sys.modules.get("jax")
    if jax is None:
        return
    if nextitem is None or nextitem.module is not item.module or _resident() > _jax_bar[0]:
        jax.clear_caches()
        _return_freed_memory()
        _jax_bar[0] = max(JAX_MEMORY_BAR, _resident() + JAX_MEMORY_MARGIN)
