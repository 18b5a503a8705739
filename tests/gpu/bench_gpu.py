"""GPU benchmark: gae() per CUDA library and dispatch path against slime's chunk scan, timed with CUDA events.

The timing is the bench's harness (``gae_xp.bench.runner.time_call`` with
``runner.cuda_events``); asv's ``TimeGAE`` and ``TimeBaselines`` time the same
targets on a GPU machine with ``asv run --python=same``.

B=256, T=131072, float32, gamma 0.99, lam 0.95: median of 50 calls after
warm-up. Prints one table. Run by ``tests/gpu/check.sh``.
"""

from __future__ import annotations

import statistics
import sys

import numpy as np

import gae_xp
from gae_xp.bench import baselines
from gae_xp.bench import libraries, runner

B, T, RUNS = 256, 131072, 50


def cuda_event_times(library: str, call, runs: int) -> list[float]:
    """Milliseconds per call, one per run: the bench's harness with its CUDA-event timer (3 warm-up calls)."""
    timing = runner.time_call(call, timer=runner.cuda_events(library), repeat=runs, warmup=3, number=1)
    return [t * 1e3 for t in timing.samples]


def main() -> int:
    rng = np.random.default_rng(0)
    rewards = rng.standard_normal((B, T), dtype=np.float32)
    values = rng.standard_normal((B, T), dtype=np.float32)
    rows = []
    for name in ("cupy", "torch:cuda"):
        reason = libraries.unavailable(name)
        if reason:
            print(f"skipping {name}: {reason}", file=sys.stderr)
            continue
        library = libraries.load(name)
        r, v = library.asarray(rewards), library.asarray(values)
        kind = "cupy" if name == "cupy" else "torch"
        cases = {f"gae_xp[{b}]": (lambda b=b: gae_xp.gae(r, v, backend=b)) for b in ("numba-cuda", "xp")}
        cases["gae_xp[numba-cuda] dones+mask"] = lambda: gae_xp.gae(
            r, v, terminated=library.asarray(rng.random((B, T)) < 0.01), mask=library.asarray(rng.random((B, T)) > 0.2),
            backend="numba-cuda")
        for size in (64, 128, 256):
            cases[f"slime-chunked C={size}"] = lambda size=size: baselines.slime_chunked_gae(r, v, 0.99, 0.95, size)
        for label, call in cases.items():
            try:
                times = cuda_event_times(kind, call, RUNS if not label.startswith("slime") else 5)
            except Exception as error:  # report and go on: one table for everything that ran
                rows.append((name, label, "failed", f"{type(error).__name__}: {error}"[:60]))
                continue
            rows.append((name, label, f"{statistics.median(times):.3f} ms", f"min {min(times):.3f} ms"))
    print(f"GPU benchmark, B={B}, T={T}, float32 (CUDA events, median)")
    for row in rows:
        print("  ".join(f"{cell:<34}" for cell in row))
    return 0


if __name__ == "__main__":
    sys.exit(main())
