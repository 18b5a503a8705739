"""The base of every benchmark class: a ``library/backend`` target from gae_xp's registry, skipped where it cannot run.

Modelled on SciPy's ``XPBenchmark``: ``setup`` raises ``NotImplementedError``
(asv's "skip") for a target that is not installed, has no device or whose
backend cannot serve those arrays (``libraries.target_unavailable``, the same
answer the tests and ``gae-xp bench`` get), and each timed call waits for the
device (CUDA synchronize, JAX ``block_until_ready``). The targets and the
libraries come from ``gae_xp.testing.libraries``; the workloads and the calls
timed are the bench's (``gae_xp.bench.paths``: ``gae_xp.gae`` forced on one
backend, under ``jax.jit`` on JAX, and the baselines), so asv, the bench and
the tests time and check the same things.

These modules import the registry from the gae_xp installed in asv's
environment: commits from the registry's introduction on can be benchmarked;
on an older commit every benchmark skips. Two things are deliberately not
taken from the installed gae_xp: the copy floor (:func:`copy_floor`) and the
interleaved timing of :func:`ratio_to_floor`, the denominator of the
``track_x_copy_floor`` benchmarks. A yardstick that changed with the commit
measured would not compare commits; these stay the same for every commit (they
restate what ``gae-xp bench`` does: ``gae_xp.bench.paths.copy_floor``).
"""

from __future__ import annotations

import statistics
import time

import numpy as np

try:
    from gae_xp.bench import paths
    try:
        from gae_xp.testing import libraries
    except ImportError:  # a commit from before gae_xp.testing kept the registry in gae_xp.bench
        from gae_xp.bench import libraries
except ImportError as error:  # a commit from before the registry
    libraries = paths = None
    _MISSING = f"this commit has no gae_xp.bench registry: {error}"
else:
    _MISSING = None

#: The CUDA simulator target serves the tests (NUMBA_ENABLE_CUDASIM=1), not timing.
_NOT_TIMED = {"numpy/numba-cuda"}
# Without the registry every benchmark skips in setup, but asv rejects an empty parameter list ("Invalid
# benchmark parameter permutation index: 0"): each list keeps one name to skip on.
_ALL_TARGETS = list(libraries.TARGETS) if libraries else ["numpy/xp"]
#: "library/backend": every gae_xp backend on every library it can serve.
TARGETS = [t for t in _ALL_TARGETS if t not in _NOT_TIMED]
#: The generic array-API path on each library (the one whose chunk size means something).
GENERIC_TARGETS = [t for t in TARGETS if t.endswith("/xp") and not t.startswith("array_api_strict")]
CPU_LIBRARIES = list(libraries.CPU_NAMES) if libraries else ["numpy"]
GPU_LIBRARIES = list(libraries.GPU_NAMES) if libraries else ["torch:cuda"]
CHUNKS = ["auto", 8, 16, 32, 64, 128]
LENGTHS = [4096, 65536, 131072]
TIME_VARYING = {"constant": (0.0, 0.0), "dones": (0.01, 0.0), "mask": (0.0, 0.2), "dones+mask": (0.01, 0.2)}


def copy_floor(library, arrays):
    """A copy of the same bytes as a GAE call: rewards and values into two preallocated arrays, on the same device.

    On a CPU, NumPy's one-thread ``copyto`` for every library; on a GPU, the
    library's device-to-device copy (JAX: a copy under ``jax.jit``).
    """
    sources = (arrays["rewards"], arrays["values"])
    if library.name.startswith("jax") and library.name not in CPU_LIBRARIES:
        import jax

        copy = jax.jit(lambda r, v: (library.xp.copy(r), library.xp.copy(v)))
        return lambda: copy(*sources)
    if library.name in CPU_LIBRARIES:
        sources = tuple(library.to_numpy(source) for source in sources)
        targets = tuple(np.empty_like(source) for source in sources)

        def write(target, source):
            np.copyto(target, source)
    elif library.name == "cupy":
        import cupy

        targets = tuple(library.xp.empty_like(source) for source in sources)

        def write(target, source):
            cupy.copyto(target, source)
    else:
        targets = tuple(library.xp.empty_like(source) for source in sources)

        def write(target, source):
            target.copy_(source)

    def call():
        for target, source in zip(targets, sources):
            write(target, source)
        return targets

    return call


def ratio_to_floor(call, floor, synchronize, rounds: int = 7, min_sample_s: float = 0.005) -> float:
    """Median time of ``call`` over median time of ``floor``, sampled in turns (a busy moment falls on both)."""
    def sample(function, number):
        start = time.perf_counter()
        for _ in range(number):
            synchronize(function())
        return (time.perf_counter() - start) / number

    numbers = []
    for function in (call, floor):
        sample(function, 1)  # warm-up
        number = 1
        while sample(function, number) * number < min_sample_s and number < 1 << 16:
            number *= 2
        numbers.append(number)
    times = ([], [])
    for _ in range(rounds):
        for index, function in enumerate((call, floor)):
            times[index].append(sample(function, numbers[index]))
    return statistics.median(times[0]) / statistics.median(times[1])


def chunk_size(value):
    return None if value == "auto" else int(value)


class XPBenchmark:
    timeout = 300

    def setup_library(self, name):
        if _MISSING:
            raise NotImplementedError(_MISSING)
        reason = libraries.unavailable(name)
        if reason is not None:
            raise NotImplementedError(reason)
        self.library = libraries.load(name)

    def setup_target(self, target, workload):
        """Load the library of "library/backend", lay the workload out in it, and pick the gae_xp path."""
        if _MISSING:
            raise NotImplementedError(_MISSING)
        reason = libraries.target_unavailable(target)
        if reason is not None:
            raise NotImplementedError(reason)
        name, backend = target.split("/")
        self.setup_library(name)
        self.setup_workload(workload)
        self.path = self.find_path(f"gae_xp[{backend}]")

    def setup_workload(self, workload):
        self.workload = workload
        self.arrays = {k: self.library.asarray(v) for k, v in workload.arrays().items()}

    def find_path(self, name: str):
        path = next((p for p in paths.all_paths() if p.name == name), None)
        if path is None:
            raise NotImplementedError(f"no path {name!r} in this version")
        reason = path.skip_reason(self.library, self.workload)
        if reason is not None:
            raise NotImplementedError(reason)
        return path

    def run(self, path, chunk=None):
        result = path.run(self.arrays, self.workload, chunk, self.library)
        self.library.synchronize(result)
        return result

    def max_error(self, result) -> float:
        got = self.library.to_numpy(result[0]).astype(np.float64)
        return float(np.max(np.abs(got - paths.exact_advantages(self.workload)), initial=0.0))


def workload(B, T, case="constant", **kwargs):
    if _MISSING:
        raise NotImplementedError(_MISSING)
    dones, holes = TIME_VARYING[case]
    return paths.Workload(B, T, dones=dones, holes=holes, **kwargs)
