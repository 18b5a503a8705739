"""Where the host's microseconds go: cProfile of 2,000 eager ``gae()`` calls per route and shape.

For each route (``backend="triton"``, ``backend="numba-cuda"``) and shape
(38400x128, 4096x32), on torch CUDA float32 tensors (constant case): 20 calls
to warm up, 2,000 calls timed without the profiler (host time per call: the
device is left to queue), then 2,000 under cProfile, and the top 15 functions
by own time (tottime) and by cumulative time. Each profile is appended to
``--out`` as it ends, so a run stopped from outside keeps those done. A route
that cannot run says why. ``--dry-run``: NumPy arrays and the generic path at
tiny shapes, 20 calls (it checks the script on a CPU).
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import sys
import time
from pathlib import Path

ROUTES = ("triton", "numba-cuda")
SHAPES = [(38400, 128), (4096, 32)]
CALLS, WARMUP, TOP = 2000, 20, 15
DRY_RUN_SHAPES, DRY_RUN_CALLS = [(4, 16)], 20


def arrays(shape, dry_run: bool):
    import numpy as np

    rng = np.random.default_rng(0)
    r, v = rng.standard_normal(shape).astype(np.float32), rng.standard_normal(shape).astype(np.float32)
    if dry_run:
        return r, v
    import torch

    return torch.as_tensor(r, device="cuda"), torch.as_tensor(v, device="cuda")


def synchronize(dry_run: bool):
    if not dry_run:
        import torch

        torch.cuda.synchronize()


def profile(backend: str, shape, calls: int, dry_run: bool) -> str:
    """The report of one route at one shape: host us per call, then the two top-15 tables."""
    import gae_xp

    rewards, values = arrays(shape, dry_run)
    stand_in = "xp" if dry_run else backend

    def call():
        return gae_xp.gae(rewards, values, gamma=0.99, lam=0.95, backend=stand_in)

    for _ in range(WARMUP):
        call()
    synchronize(dry_run)
    start = time.perf_counter()
    for _ in range(calls):
        call()
    host = time.perf_counter() - start
    synchronize(dry_run)
    wall = time.perf_counter() - start
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(calls):
        call()
    profiler.disable()
    synchronize(dry_run)
    text = io.StringIO()
    stats = pstats.Stats(profiler, stream=text)
    for order in ("tottime", "cumtime"):
        text.write(f"\n-- top {TOP} by {order}\n")
        stats.sort_stats(order).print_stats(TOP)
    head = (f"== {backend} at {shape[0]}x{shape[1]}{' (dry run: the generic path on NumPy)' if dry_run else ''}: "
            f"{calls} calls, {1e6 * host / calls:.1f} us host per call without the profiler "
            f"({1e6 * wall / calls:.1f} us with the device drained)")
    return head + "\n" + text.getvalue()


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="the report file (appended to as each profile ends)")
    parser.add_argument("--routes", default=",".join(ROUTES))
    parser.add_argument("--dry-run", action="store_true")
    options = parser.parse_args(argv)
    out = Path(options.out)
    out.write_text("# Host profile: cProfile of eager gae() calls, torch CUDA float32, constant case\n\n")
    failed = 0
    for backend in options.routes.split(","):
        for shape in DRY_RUN_SHAPES if options.dry_run else SHAPES:
            try:
                report = profile(backend, shape, DRY_RUN_CALLS if options.dry_run else CALLS, options.dry_run)
            except Exception as error:  # the route cannot run here: said, and the next one runs
                failed += 1
                report = f"== {backend} at {shape[0]}x{shape[1]}: not run ({type(error).__name__}: " \
                         f"{str(error).splitlines()[0][:200]})\n"
            print(report.splitlines()[0], flush=True)
            with out.open("a") as file:
                file.write(report + "\n")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
