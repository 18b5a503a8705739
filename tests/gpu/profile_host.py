"""Where the host's microseconds go: cProfile of 2,000 eager ``gae()`` calls per route and shape.

For each route (``backend="triton"`` launched through Triton's binder,
the same with the direct launch (the default), ``backend="numba-cuda"``, and
``backend="auto"`` on CuPy arrays in a process that imported torch, the
Triton route's CuPy bridge) and shape (38400x128, 4096x32), on CUDA float32
arrays (torch tensors but for the CuPy route; constant case): 20 calls to
warm up, 2,000 calls timed without the profiler (host time per call: the
device is left to queue), then 2,000 under cProfile, and the
top 15 functions by own time (tottime) and by cumulative time. The direct
launch (``gae_xp.backends._triton_plan``) is first checked: its call's
results must equal the binder's on the same inputs (bit for bit), and its
plan's own check must not have refused it; where either fails, the binder
serves its calls and the head line says why, so the two Triton rows are
read side by side. Each profile is appended to ``--out`` as it ends, so a
run stopped from outside keeps those done. A route that cannot run says
why. ``--dry-run``: NumPy arrays and the generic path at tiny shapes, 20
calls (it checks the script on a CPU).
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import io
import pstats
import sys
import time
import warnings
from pathlib import Path

ROUTES = ("triton", "triton-direct", "numba-cuda", "cupy-auto")
#: route -> (the backend named, the Triton launch mode; None: left as it is)
BACKENDS = {"triton": ("triton", "binder"), "triton-direct": ("triton", "direct"), "numba-cuda": ("numba-cuda", None),
            "cupy-auto": ("auto", None)}
SHAPES = [(38400, 128), (4096, 32)]
CALLS, WARMUP, TOP = 2000, 20, 15
DRY_RUN_SHAPES, DRY_RUN_CALLS = [(4, 16)], 20


def arrays(shape, dry_run: bool, route: str):
    import numpy as np

    rng = np.random.default_rng(0)
    r, v = rng.standard_normal(shape).astype(np.float32), rng.standard_normal(shape).astype(np.float32)
    if dry_run:
        return r, v
    import torch

    if route.startswith("cupy"):
        import cupy

        return cupy.asarray(r), cupy.asarray(v)
    return torch.as_tensor(r, device="cuda"), torch.as_tensor(v, device="cuda")


def synchronize(dry_run: bool):
    if not dry_run:
        import torch

        torch.cuda.synchronize()  # the device: every stream, CuPy's too


def profile(route: str, shape, calls: int, dry_run: bool) -> str:
    """The report of one route at one shape: host us per call, then the two top-15 tables."""
    import gae_xp

    rewards, values = arrays(shape, dry_run, route)
    backend, launch = BACKENDS[route]
    stand_in = "xp" if dry_run else backend

    def call():
        return gae_xp.gae(rewards, values, gamma=0.99, lam=0.95, backend=stand_in)

    with launch_mode(None if dry_run else launch) as checked:
        if launch == "direct":
            checked.append(direct_check(call, dry_run))
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
    head = (f"== {route} at {shape[0]}x{shape[1]}{' (dry run: the generic path on NumPy)' if dry_run else ''}: "
            f"{calls} calls, {1e6 * host / calls:.1f} us host per call without the profiler "
            f"({1e6 * wall / calls:.1f} us with the device drained){''.join(f'; {c}' for c in checked)}")
    return head + "\n" + text.getvalue()


@contextlib.contextmanager
def launch_mode(mode: str | None):
    """Within this block the Triton route launches in ``mode`` ("binder" or "direct"; None: left as it is); yields
    a list for what the direct launch's check says."""
    if mode is None:
        yield []
        return
    from gae_xp.backends import _triton_plan

    before = _triton_plan.launch_mode(mode)
    try:
        yield []
    finally:
        _triton_plan.launch_mode(before)


def direct_check(call, dry_run: bool) -> str:
    """A call launched through Triton's binder and one launched directly, on the same inputs: what they say (the
    direct launch's own check, once per compiled kernel, and the two results compared here)."""
    if dry_run:
        return "direct launch: not run (dry run)"
    import torch

    from gae_xp.backends import _triton_plan

    _triton_plan.launch_mode("binder")
    expected = [t.clone() for t in call()]
    _triton_plan.launch_mode("direct")
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        call()  # the plan's first direct launch: the compiled kernel taken and checked against the binder
        got = call()
    refused = _triton_plan.direct_refused()
    if refused is not None or said:
        return f"direct launch REFUSED, the binder served: {refused or said[0].message}"
    same = all(bool(((a == b) | (a.isnan() & b.isnan())).all()) for a, b in zip(expected, got))
    torch.cuda.synchronize()
    if not same:
        _triton_plan.launch_mode("binder")
        return "direct launch MISMATCH against the binder's results: the binder served"
    return "direct launch: results equal to the binder's"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="the report file (appended to as each profile ends)")
    parser.add_argument("--routes", default=",".join(ROUTES))
    parser.add_argument("--dry-run", action="store_true")
    options = parser.parse_args(argv)
    out = Path(options.out)
    out.write_text("# Host profile: cProfile of eager gae() calls, CUDA float32, constant case\n\n")
    failed = 0
    for route in options.routes.split(","):
        for shape in DRY_RUN_SHAPES if options.dry_run else SHAPES:
            try:
                report = profile(route, shape, DRY_RUN_CALLS if options.dry_run else CALLS, options.dry_run)
            except Exception as error:  # the route cannot run here: said, and the next one runs
                failed += 1
                report = f"== {route} at {shape[0]}x{shape[1]}: not run ({type(error).__name__}: " \
                         f"{str(error).splitlines()[0][:200]})\n"
            print(report.splitlines()[0], flush=True)
            with out.open("a") as file:
                file.write(report + "\n")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
