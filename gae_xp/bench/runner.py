"""Time every (library, workload, path, chunk size) of a sweep, side by side in one process."""

from __future__ import annotations

import statistics
import time
from dataclasses import asdict, dataclass, field
from typing import Callable, Iterable

import numpy as np

from gae_xp.bench.libraries import Library
from gae_xp.bench.paths import Path, Workload, exact_advantages, prefix

#: Seconds the first case of each library runs untimed before any timing.
WARM_UP_S = 0.3
#: Steps of the first, probing run of a path with a Python loop over time.
PROBE_STEPS = 512


@dataclass
class Measurement:
    library: str
    path: str
    B: int
    T: int
    chunk_size: int | None
    dtype: str
    dones: float
    holes: float
    median_s: float
    p25_s: float
    p75_s: float
    runs: int
    #: T of the prefix actually run when the time is extrapolated (linearly in T) from a shorter run; else None.
    extrapolated_from: int | None = None
    speedup_vs_serial: float | None = None
    max_abs_error: float | None = None
    peak_bytes: int | None = None
    notes: list[str] = field(default_factory=list)

    def as_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class Sweep:
    libraries: tuple[Library, ...]
    workloads: tuple[Workload, ...]
    paths: tuple[Path, ...]
    chunk_sizes: tuple[int | None, ...]
    repeat: int = 5
    serial_budget_s: float = 1.0

    def cases(self) -> list[tuple[Library, Workload, Path, int | None]]:
        """Every case to time, in order; paths that do not apply are left out."""
        out = []
        for library in self.libraries:
            for workload in self.workloads:
                for path in self.paths:
                    if path.skip_reason(library, workload) is not None:
                        continue
                    sizes = self.chunk_sizes if path.chunked else (None,)
                    if path.chunked and not path.name.startswith("gae_xp"):
                        sizes = tuple(c for c in sizes if c is not None)
                    out.extend((library, workload, path, c) for c in sizes)
        return out


def run(sweep: Sweep, *, on_case_done: Callable[[Measurement], None] = lambda m: None) -> list[Measurement]:
    results = []
    converted: dict = {}
    warmed = set()
    for library, workload, path, chunk in sweep.cases():
        key = (library.name, workload)
        if key not in converted:
            # The float64 reference first: every case then meets the allocator in the same state
            # (glibc raises its mmap threshold once large blocks were freed, which spares later
            # calls their page faults; the first case timed would otherwise pay them alone).
            exact_advantages(workload)
            converted = {key: {k: library.asarray(v) for k, v in workload.arrays().items()}}
        # The first case of a library runs for a while untimed: thread pools, caches and the
        # CPU's clock settle there, not in the first timed case.
        settle = WARM_UP_S if library.name not in warmed else 0.0
        warmed.add(library.name)
        measurement = _measure(library, workload, path, chunk, converted[key], sweep, settle)
        results.append(measurement)
        on_case_done(measurement)
    _add_speedups(results)
    return results


def _measure(library, workload, path, chunk, arrays, sweep, settle_s) -> Measurement:
    def once(data):
        result = path.run(data, workload, chunk, library)
        library.synchronize(result)
        return result

    steps = workload.T
    repeat = sweep.repeat
    if path.python_loop and workload.T > PROBE_STEPS:
        probe = _times(lambda: once(prefix(arrays, PROBE_STEPS)), 1)[0]
        estimate = probe * workload.T / PROBE_STEPS
        if estimate > sweep.serial_budget_s:
            steps = max(PROBE_STEPS, int(workload.T * sweep.serial_budget_s / estimate))
        repeat = max(1, min(repeat, int(sweep.serial_budget_s / max(estimate * steps / workload.T, 1e-9))))
    data = arrays if steps == workload.T else prefix(arrays, steps)
    result = once(data)  # warm-up: compilation, caches, lazy imports
    deadline = time.perf_counter() + settle_s
    while time.perf_counter() < deadline:
        result = once(data)
    times = [t * workload.T / steps for t in _times(lambda: once(data), repeat)]
    q25, q75 = (np.percentile(times, [25, 75]) if len(times) > 1 else (times[0], times[0]))
    measurement = Measurement(
        library.name, path.name, workload.B, workload.T, chunk, workload.dtype, workload.dones, workload.holes,
        statistics.median(times), float(q25), float(q75), len(times),
        extrapolated_from=None if steps == workload.T else steps,
    )
    if steps == workload.T:
        advantages = library.to_numpy(result[0]).astype(np.float64)
        measurement.max_abs_error = float(np.max(np.abs(advantages - exact_advantages(workload)), initial=0.0))
        if not path.python_loop:
            measurement.peak_bytes = library.peak_memory(lambda: once(data))
    return measurement


def _times(call, repeat: int) -> list[float]:
    out = []
    for _ in range(repeat):
        start = time.perf_counter()
        call()
        out.append(time.perf_counter() - start)
    return out


def _add_speedups(results: Iterable[Measurement]) -> None:
    serial = {(m.library, m.B, m.T, m.dtype, m.dones, m.holes): m.median_s for m in results if m.path == "serial"}
    for m in results:
        base = serial.get((m.library, m.B, m.T, m.dtype, m.dones, m.holes))
        if base is not None:
            m.speedup_vs_serial = base / m.median_s
