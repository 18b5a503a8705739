"""The one timing harness of gae_xp's benchmarks: ``gae-xp bench``, the adapter benchmark and the GPU benchmark.

Two layers:

* timing a call: :func:`time_call` and :func:`time_side_by_side` run
  untimed warm-up calls, calibrate how many calls make one sample (at least
  ``MIN_SAMPLE_S`` long, so that microsecond calls are not lost in the
  timer's resolution), then take ``repeat`` samples; side by side, the
  candidates take turns sample by sample, so that a shared machine's slow
  moments fall on all of them alike. A :data:`Timer` says what a sample
  measures: :func:`wall_clock` (wall time, the device waited for after every
  call) or :func:`cuda_events` (CUDA events on the current stream);
* a sweep: :func:`run` times every (library, workload, path, chunk size) of
  a :class:`Sweep`, one library and workload at a time, side by side, and
  returns :class:`Measurement` records with the error against the float64
  loop and the peak memory.

Every (library, workload) group also times :func:`gae_xp.bench.paths.copy_floor`,
a copy of the same bytes, in the same turns: each measurement carries its time
as a multiple of that floor. Around the timing, :func:`busy_neighbours` starts
processes that keep the cores busy (``--load``), :func:`first_call` measures
the first call of a fresh process in a subprocess (compilation and cache
loads, kept out of the medians), and :func:`profile` says where a call's time
goes.

asv times with its own machinery; the asv benchmarks share the registry
(``gae_xp.testing.libraries``) and the cases (``gae_xp.testing.cases``) with the
bench instead, and time the same calls.
"""

from __future__ import annotations

import contextlib
import cProfile
import json
import os
import pstats
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Hashable, Iterable, Mapping

import numpy as np

from gae_xp.bench.paths import Path, Workload, copy_floor, exact_advantages, loop_baseline, prefix
from gae_xp.testing.libraries import Library

#: Seconds the first case of each library runs untimed before any timing.
WARM_UP_S = 0.3
#: Steps of the first, probing run of a path with a Python loop over time.
PROBE_STEPS = 512
#: The shortest sample: calls faster than this are repeated inside one sample.
MIN_SAMPLE_S = 0.005
#: Fewer samples than this give no spread worth the name: no chunk size is recommended from them.
MIN_SAMPLES_FOR_A_VERDICT = 3
#: The name of the copy floor's rows (not a path: the yardstick of every row of its library and workload).
COPY = "copy"
#: Seconds a first call in a fresh process may take before it is given up.
FIRST_CALL_TIMEOUT_S = 600

#: ``timer(call, number) -> seconds`` for ``number`` calls of ``call`` (the device waited for).
Timer = Callable[[Callable[[], Any], int], float]


def wall_clock(synchronize: Callable[[Any], None] = lambda result: None) -> Timer:
    """Wall time of ``number`` calls, each followed by ``synchronize(result)`` (a CUDA synchronize, JAX's wait)."""
    def timer(call, number):
        start = time.perf_counter()
        for _ in range(number):
            synchronize(call())
        return time.perf_counter() - start

    return timer


def cuda_events(library: str) -> Timer:
    """Device time of ``number`` calls between two CUDA events on the current stream (``library``: torch or cupy).

    What the GPU spent from the first launch to the last kernel's end,
    launch gaps included, host-side time before the first launch excluded.
    """
    if library.startswith("cupy"):
        import cupy

        def pair():
            return cupy.cuda.Event(), cupy.cuda.Event()

        def elapsed_ms(start, stop):
            return cupy.cuda.get_elapsed_time(start, stop)
    else:
        import torch

        def pair():
            return torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)

        def elapsed_ms(start, stop):
            return start.elapsed_time(stop)

    def timer(call, number):
        start, stop = pair()
        start.record()
        for _ in range(number):
            call()
        stop.record()
        stop.synchronize()
        return elapsed_ms(start, stop) / 1e3

    return timer


@dataclass(frozen=True)
class Timing:
    """Seconds per call, one figure per sample (a sample is ``number`` calls)."""

    samples: tuple[float, ...]
    number: int = 1

    @property
    def median(self) -> float:
        return statistics.median(self.samples)

    @property
    def quartiles(self) -> tuple[float, float]:
        if len(self.samples) < 2:
            return self.samples[0], self.samples[0]
        q25, q75 = np.percentile(self.samples, [25, 75])
        return float(q25), float(q75)

    @property
    def minimum(self) -> float:
        return min(self.samples)


@dataclass
class Candidate:
    """One call to time side by side with others."""

    call: Callable[[], Any]
    timer: Timer
    #: samples to take (a slow candidate may take fewer than the others)
    repeat: int
    #: calls per sample; None: calibrate after the warm-up
    number: int | None = None
    #: seconds per call are multiplied by this (a loop run on a prefix of T, extrapolated)
    scale: float = 1.0
    #: samples already taken (seconds per call, unscaled): a slow call's calibration counts as its first sample
    taken: tuple[float, ...] = ()


def calibrate(call: Callable[[], Any], timer: Timer, min_sample_s: float | None = None) -> tuple[int, float]:
    """(calls per sample, seconds per call): the fewest calls that last ``min_sample_s``, doubling from one."""
    min_sample_s = MIN_SAMPLE_S if min_sample_s is None else min_sample_s
    number = 1
    while True:
        elapsed = timer(call, number)
        if elapsed >= min_sample_s or number >= 1 << 20:
            return number, elapsed / number
        number = min(1 << 20, max(2 * number, int(number * min_sample_s / max(elapsed, 1e-9) * 1.2)))


def time_side_by_side(candidates: dict[Hashable, Candidate], *, warmup: int = 1,
                      min_sample_s: float | None = None) -> dict[Hashable, Timing]:
    """Warm each candidate up, calibrate it, then take samples in turns: round r samples every candidate once."""
    for candidate in candidates.values():
        for _ in range(warmup):
            candidate.timer(candidate.call, 1)
        if candidate.number is None:
            candidate.number, _ = calibrate(candidate.call, candidate.timer, min_sample_s)
    samples = {key: [t * c.scale for t in c.taken[:c.repeat]] for key, c in candidates.items()}
    for round_ in range(max((c.repeat for c in candidates.values()), default=0)):
        for key, c in candidates.items():
            if len(samples[key]) < c.repeat:
                samples[key].append(c.timer(c.call, c.number) / c.number * c.scale)
    return {key: Timing(tuple(samples[key]), candidates[key].number) for key in candidates}


def time_call(call: Callable[[], Any], *, timer: Timer | None = None, repeat: int = 5, warmup: int = 1,
              number: int | None = None, min_sample_s: float | None = None) -> Timing:
    """One call's :class:`Timing` (wall clock by default; pass ``cuda_events(...)`` for device time)."""
    candidate = Candidate(call, timer or wall_clock(), repeat, number)
    return time_side_by_side({0: candidate}, warmup=warmup, min_sample_s=min_sample_s)[0]


@dataclass
class Measurement:
    library: str
    path: str
    B: int
    T: int
    #: the chunk size asked for (None: auto, or a path without chunks)
    chunk_size: int | None
    dtype: str
    dones: float
    holes: float
    median_s: float
    p25_s: float
    p75_s: float
    #: samples taken
    runs: int
    #: calls per sample
    number: int = 1
    #: the piece length that ran (auto resolved, capped by gae_xp's rule); None for paths without chunks
    effective_chunk: int | None = None
    #: T of the prefix actually run when the time is extrapolated (linearly in T) from a shorter run; else None.
    extrapolated_from: int | None = None
    #: the library's loop (serial; lax.scan on JAX) over this path, same workload
    speedup_vs_serial: float | None = None
    #: this path's time over the copy floor's (a copy of the same bytes, same library, device and workload)
    floor_ratio: float | None = None
    max_abs_error: float | None = None
    peak_bytes: int | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def case(self) -> str:
        return "+".join(n for n, p in (("dones", self.dones), ("mask", self.holes)) if p > 0) or "constant"

    @property
    def ours(self) -> bool:
        return self.path.startswith("gae_xp[")

    @property
    def baseline(self) -> bool:
        """A user's alternative to gae_xp (the serial loop, slime's scan, lfilter...): not ours, not the floor."""
        return not self.ours and self.path != COPY

    @property
    def spread_s(self) -> float:
        """Half the interquartile range of the samples, in seconds."""
        return (self.p75_s - self.p25_s) / 2

    def as_dict(self) -> dict:
        return {**asdict(self), "case": self.case}


@dataclass(frozen=True)
class Sweep:
    libraries: tuple[Library, ...]
    workloads: tuple[Workload, ...]
    paths: tuple[Path, ...]
    chunk_sizes: tuple[int | None, ...]
    repeat: int = 5
    #: a case's timed samples stop at about this many seconds; a Python loop over time expected to take
    #: longer per call runs on a prefix and is extrapolated
    serial_budget_s: float = 1.0
    #: library name -> the one gae_xp path whose chunk sizes are swept (the path ``backend="auto"`` runs: a
    #: size on another path changes nothing in the user's call); None: every gae_xp path that has chunks
    swept: Mapping[str, str] | None = None

    def largest(self) -> dict[str, Workload]:
        """The largest workload (B*T, then T) of each case: the chunk sizes are swept there only."""
        out: dict[str, Workload] = {}
        for w in self.workloads:
            if w.case not in out or (w.B * w.T, w.T) > (out[w.case].B * out[w.case].T, out[w.case].T):
                out[w.case] = w
        return out

    def cases(self) -> list[tuple[Library, Workload, Path, int | None]]:
        """Every case to time, in order; paths that do not apply are left out.

        Chunk sizes are swept at each case's largest workload, on paths whose
        chunk size changes what runs (of gae_xp's, only the ``swept`` one
        where given); elsewhere gae_xp paths run auto and slime's scan its
        default 128 (or the first size asked for). A size
        that resolves to a piece length already timed (gae_xp caps a constant
        discount's kernel at 32, and never goes past T) is not timed twice.
        """
        out = []
        largest = self.largest()
        explicit = tuple(c for c in self.chunk_sizes if c is not None)
        for library in self.libraries:
            for workload in self.workloads:
                for path in self.paths:
                    if path.skip_reason(library, workload) is not None:
                        continue
                    if not path.chunked:
                        sizes: tuple = (None,)
                    elif workload is largest[workload.case] and self._sweeps(library, path):
                        sizes = self.chunk_sizes if path.ours else explicit
                    elif path.ours:
                        sizes = (None,)
                    else:
                        sizes = (128,) if 128 in explicit or not explicit else explicit[:1]
                    seen = set()
                    for size in sizes:
                        effective = path.effective_chunk(workload, size)
                        if effective in seen:
                            continue
                        seen.add(effective)
                        out.append((library, workload, path, size))
        return out

    def _sweeps(self, library: Library, path: Path) -> bool:
        return not path.ours or self.swept is None or self.swept.get(library.name) == path.name

    def groups(self) -> dict[tuple[Library, Workload], list[tuple[Path, int | None]]]:
        """The cases by (library, workload): each group is timed side by side, with its copy floor."""
        out: dict[tuple, list] = {}
        for library, workload, path, chunk in self.cases():
            out.setdefault((library, workload), []).append((path, chunk))
        return out

    def count(self) -> int:
        """Measurements a run makes: every case, and a copy floor per group."""
        return sum(len(cases) + 1 for cases in self.groups().values())

    def skipped_sizes(self) -> list[str]:
        """Human-readable notes on requested chunk sizes that were not timed, because they resolve to another."""
        notes = []
        largest = set(self.largest().values())
        for library, workload, path in dict.fromkeys((lib, w, p) for lib, w, p, _ in self.cases()):
            if path.ours and path.chunked and workload in largest and self._sweeps(library, path):
                groups: dict[int | None, list] = {}
                for size in self.chunk_sizes:
                    groups.setdefault(path.effective_chunk(workload, size), []).append(size)
                for effective, sizes in groups.items():
                    if len(sizes) > 1:
                        shown = ", ".join("auto" if s is None else str(s) for s in sizes[1:])
                        notes.append(f"{path.name}, {workload.case}, T={workload.T}: chunk_size {shown} "
                                     f"runs C={effective} like {'auto' if sizes[0] is None else sizes[0]}: "
                                     "timed once")
        return list(dict.fromkeys(notes))


def run(sweep: Sweep, *, on_case_done: Callable[[Measurement], None] = lambda m: None) -> list[Measurement]:
    """Time a sweep: per library and workload, every path and the copy floor side by side (see the module docstring)."""
    results = []
    warmed = set()
    for (library, workload), cases in sweep.groups().items():
        # The float64 reference first: every case then meets the allocator in the same state
        # (glibc raises its mmap threshold once large blocks were freed, which spares later
        # calls their page faults; the first case timed would otherwise pay them alone).
        exact = exact_advantages(workload)
        arrays = {k: library.asarray(v) for k, v in workload.arrays().items()}
        prepared = {}
        for index, (path, chunk) in enumerate(cases):
            # The first case of a library runs for a while untimed: thread pools, caches and the
            # CPU's clock settle there, not in the first timed case.
            settle = WARM_UP_S if library.name not in warmed else 0.0
            warmed.add(library.name)
            prepared[index] = _prepare(library, workload, path, chunk, arrays, exact, sweep, settle)
        floor = copy_floor(library, arrays)
        library.synchronize(floor())  # its outputs' first touch, and JAX's compilation
        candidates = {i: p["candidate"] for i, p in prepared.items()}
        candidates[COPY] = Candidate(floor, wall_clock(library.synchronize), sweep.repeat)
        timings = time_side_by_side(candidates, warmup=0)
        for index, (path, chunk) in enumerate(cases):
            p = prepared[index]
            m = _measurement(library, workload, path.name, chunk, timings[index],
                             effective_chunk=path.effective_chunk(workload, chunk),
                             extrapolated_from=p["extrapolated_from"], max_abs_error=p["error"])
            if p["extrapolated_from"] is None and not path.python_loop:
                m.peak_bytes = library.peak_memory(p["candidate"].call)
            results.append(m)
            on_case_done(m)
        m = _measurement(library, workload, COPY, None, timings[COPY])
        results.append(m)
        on_case_done(m)
    add_ratios(results)
    return results


def _measurement(library, workload, path: str, chunk, timing: Timing, **details) -> Measurement:
    q25, q75 = timing.quartiles
    return Measurement(library.name, path, workload.B, workload.T, chunk, workload.dtype, workload.dones,
                       workload.holes, timing.median, q25, q75, len(timing.samples), timing.number, **details)


def _prepare(library, workload, path, chunk, arrays, exact, sweep, settle_s) -> dict:
    """Warm a case up, decide its prefix (loops past the budget) and its samples; measure its error once."""
    def once(data):
        result = path.run(data, workload, chunk, library)
        library.synchronize(result)
        return result

    steps = workload.T
    if path.python_loop and workload.T > PROBE_STEPS:
        probe = wall_clock()(lambda: once(prefix(arrays, PROBE_STEPS)), 1)
        estimate = probe * workload.T / PROBE_STEPS
        if estimate > sweep.serial_budget_s:
            steps = max(PROBE_STEPS, int(workload.T * sweep.serial_budget_s / estimate))
    data = arrays if steps == workload.T else prefix(arrays, steps)
    start = time.perf_counter()
    result = once(data)  # warm-up: compilation, caches, lazy imports
    first = time.perf_counter() - start
    error = None
    if steps == workload.T:
        advantages = library.to_numpy(result[0]).astype(np.float64)
        error = float(np.max(np.abs(advantages - exact), initial=0.0))
    del result
    deadline = time.perf_counter() + settle_s
    while time.perf_counter() < deadline:
        once(data)
    call = lambda: path.run(data, workload, chunk, library)  # noqa: E731
    timer = wall_clock(library.synchronize)
    taken: tuple[float, ...] = ()
    if path.python_loop:  # nothing compiles in a Python loop: its first call tells its time
        number, per_call = 1, first
    else:
        number, per_call = calibrate(call, timer)
        taken = (per_call,) if number == 1 else ()  # a slow call: its calibration is a sample already
    repeat = max(1, min(sweep.repeat, int(sweep.serial_budget_s / max(per_call * number, 1e-9))))
    return {"candidate": Candidate(call, timer, repeat, number, workload.T / steps, taken),
            "extrapolated_from": None if steps == workload.T else steps, "error": error}


def add_ratios(results: Iterable[Measurement]) -> None:
    """Each measurement's speed-up over its library's loop and its multiple of the copy floor, same workload."""
    results = list(results)

    def key(m):
        return m.library, m.B, m.T, m.dtype, m.dones, m.holes

    loops = {key(m): m.median_s for m in results if m.path == loop_baseline(m.library)}
    floors = {key(m): m.median_s for m in results if m.path == COPY}
    for m in results:
        base, floor = loops.get(key(m)), floors.get(key(m))
        if base is not None and m.path != COPY:
            m.speedup_vs_serial = base / m.median_s
        if floor is not None:
            m.floor_ratio = m.median_s / floor


# ---------------------------------------------------------------------------------------------------- around the timing


#: A busy neighbour: spins until its parent is gone (so that a bench killed outright leaves no spinner behind).
_SPIN = """
import os
parent = os.getppid()
while os.getppid() == parent:
    for _ in range(1_000_000):
        pass
"""


@contextlib.contextmanager
def busy_neighbours(count: int):
    """``count`` processes that each keep one core busy while the block runs: a machine that is not quiet.

    What a trainer's machine has beside GAE (data loaders, environment
    workers, other ranks), made reproducible: thread pools that spin or wait
    for a core show their cost under it (``gae-xp bench --load``).
    """
    spinners = [subprocess.Popen([sys.executable, "-c", _SPIN], stdin=subprocess.DEVNULL,
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) for _ in range(count)]
    try:
        yield spinners
    finally:
        for spinner in spinners:
            spinner.terminate()
        for spinner in spinners:
            try:
                spinner.wait(timeout=5)
            except subprocess.TimeoutExpired:
                spinner.kill()
                spinner.wait()


#: Run in a fresh interpreter by :func:`first_call`: the imports, then the first and the second call, timed.
_FIRST_CALL = """
import json, sys, time
spec = json.loads(sys.argv[1])
start = time.perf_counter()
import gae_xp
imported = time.perf_counter()
from gae_xp.testing import libraries
library = libraries.load(spec["library"])
loaded = time.perf_counter()
from gae_xp.bench.cli import set_threads
from gae_xp.bench.paths import Workload
if spec["threads"] is not None:
    set_threads(spec["threads"])
arrays = {k: library.asarray(v) for k, v in Workload(**spec["workload"]).arrays().items()}
def call():
    result = gae_xp.gae(**arrays, gamma=spec["workload"]["gamma"], lam=spec["workload"]["lam"],
                        truncated_bootstrap="next_step")
    library.synchronize(result)
ready = time.perf_counter()
call()
first = time.perf_counter()
call()
second = time.perf_counter()
print(json.dumps({"import_gae_xp_s": imported - start, "import_library_s": loaded - imported,
                  "first_s": first - ready, "second_s": second - first, "numba": "numba" in sys.modules}))
"""


def first_call(library: str, workload: Workload, threads: int | None = None) -> dict:
    """The first ``gae_xp.gae`` call (``backend="auto"``) of a fresh process, and its second, in a subprocess.

    What a user meets once per process: numba compiling its kernels or
    loading them from its on-disk cache, JAX tracing and compiling. Returns
    ``{"import_gae_xp_s", "import_library_s", "first_s", "second_s", "numba"}`` (``numba``: whether the call
    imported numba, so compiled or loaded a kernel), or
    ``{"error": ...}`` when the subprocess failed. The subprocess imports the
    gae_xp this process imported.
    """
    import gae_xp

    spec = {"library": library, "workload": asdict(workload), "threads": threads}
    where = os.path.dirname(os.path.dirname(os.path.abspath(gae_xp.__file__)))
    try:
        done = subprocess.run([sys.executable, "-c", _FIRST_CALL, json.dumps(spec)], cwd=where, capture_output=True,
                              text=True, timeout=FIRST_CALL_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return {"error": f"no answer within {FIRST_CALL_TIMEOUT_S} s"}
    if done.returncode != 0:
        tail = (done.stderr.strip().splitlines() or [f"exit status {done.returncode}"])[-1]
        return {"error": tail}
    return json.loads(done.stdout.strip().splitlines()[-1])


@dataclass(frozen=True)
class ProfileLine:
    """One function's own time in a profiled call (the time spent in its callees is theirs)."""

    function: str
    #: seconds per call of the profiled function, scaled to the time the call takes without the profiler
    seconds: float
    #: how many times one call enters it
    calls: float


def profile(call: Callable[[], Any], *, seconds: float = 0.5) -> tuple[Timing, float, list[ProfileLine]]:
    """Where ``call``'s time goes: (its timing without the profiler, its time per call under cProfile, lines).

    Each function's own time under cProfile is scaled by the ratio of the
    unprofiled time to the profiled one, so that the lines add up to the
    call's real time; the profiler's own cost falls on every function call
    alike, so many small functions are over-weighted against a few long ones.
    """
    plain = time_call(call, repeat=5)
    number = max(1, int(seconds / max(plain.median, 1e-9)))
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(number):
        call()
    profiler.disable()
    stats = {where: entry for where, entry in pstats.Stats(profiler).stats.items()
             if where[2] != "<method 'disable' of '_lsprof.Profiler' objects>"}
    profiled = sum(own for _, _, own, _, _ in stats.values()) / number
    scale = plain.median / profiled if profiled > 0 else 0.0
    lines = [ProfileLine(_function_name(where), own / number * scale, calls / number)
             for where, (_, calls, own, _, _) in stats.items()]
    return plain, profiled, sorted(lines, key=lambda line: -line.seconds)


def _function_name(where: tuple[str, int, str]) -> str:
    """``gae_xp/_prepare.py:47(prepare)`` for Python code, the built-in's own name for C functions."""
    filename, line, name = where
    if filename == "~":
        return name
    parts = filename.replace(os.sep, "/").split("/")
    for anchor in ("site-packages", "gae_xp", "backends", "lib"):
        if anchor in parts[:-1]:
            index = len(parts) - 1 - parts[::-1].index(anchor)
            parts = parts[index + 1:] if anchor in ("site-packages", "lib") else parts[index:]
            break
    return f"{'/'.join(parts[-3:])}:{line}({name})"
