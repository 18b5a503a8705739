"""GPU benchmark: gae_xp's routes against a device copy and the published GPU scans, side by side in one run.

For every shape of "The GPU at the copy floor" (``SHAPES``), dtype (float32,
bfloat16) and case (constant; terminated; terminated and a holed mask), gamma
0.99, lam 0.95, on torch CUDA tensors, it times:

* ``copy``: a device-to-device copy of the case's floor bytes (read r, V and
  the flags once, write A and R once): the memory floor of this run;
* ``gae_xp triton (torch)`` (``backend="triton"``) and each of its tuning
  variants (``gae_xp.backends.triton.TUNING_VARIANTS``, the call made inside
  ``gae_xp.backends.triton.tuned(**variant)``), the best kept per shape;
* ``gae_xp numba-cuda (torch)``; both torch routes again under CUDA-graph
  replay; on CuPy (float32) ``auto`` and ``numba-cuda``;
* the baselines: rl-triton 0.1.3 where it is installed, ``triton_gae.py``
  (one Triton program per row), ``torch.compile`` of the generic path (on
  ``COMPILE_SHAPES``), slime's chunk scan, ``cuda.compute``'s scan
  (``cccl_gae.py``) and one thread per row (``row_gae.py``).

Per call: **device time** (CUDA events around one call, a spin kernel queued
first so that the host's enqueueing is hidden), **wall time** (synchronize,
call, synchronize: the eager call as a trainer sees it) and **host time** (the
Python call without waiting). Medians. ``x copy``: device time over the copy's
at the same shape, dtype and case. Every output is compared with gae_xp's
generic path in float64 on the same (rounded) inputs. Then the first call at
a new T and B, per route: a route that compiles nothing there answers in
milliseconds; and, in a process of its own with an empty Triton cache, the
same after ``gae_xp.warm_up(device="cuda")`` (its seconds in the entries).

A route or baseline that cannot be imported or built says why in its row; the
rest runs. Shapes start while the time spent is under ``--budget`` seconds;
the ones left are listed. ``--out`` gets bench_gpu.json and bench_gpu.md,
rewritten after every shape, so a run stopped from outside keeps the shapes it
finished. ``--dry-run`` runs the same code on the CPU at tiny shapes with the
generic path standing in for every gae_xp route (nothing measured: it checks
the script). Run by ``tests/gpu/check.sh``, whose verdicts
(``tests/gpu/report_check.py``) read the JSON.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import importlib
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
GAMMA, LAM = 0.99, 0.95
#: (rows, steps), in the order they run: the trainer's whole-call shape and the short horizons first, then
#: rl-triton's grid with the few long rows, slime's shape last (its torch.compile baseline compiles for tens of
#: seconds: the budget spends that only once every other shape ran).
TRAINER = [(38400, 128)]
SHORT = [(4096, 32), (32768, 128)]
GRID = [(8192, 1024), (8192, 4096), (2048, 4096), (16, 524288)]
SLIME = [(256, 131072)]
SHAPES = [(38400, 128), (4096, 32), (8192, 1024), (16, 524288), (32768, 128), (8192, 4096), (2048, 4096),
          (256, 131072)]
#: The few long rows: the Triton route's target there is 1.6x the copy, 1.25x elsewhere.
FEW_LONG_ROWS = (16, 524288)
#: torch.compile compiles every shape anew (tens of seconds each): this shape only, to fit the time budget.
COMPILE_SHAPES = [(256, 131072)]
CASES = ("constant", "terminated", "dones+mask")
DTYPES = ("float32", "bfloat16")
FLAGS = {"constant": (), "terminated": ("terminated",), "dones+mask": ("terminated", "mask")}
#: Bytes per float32 element a case must move at least: read r, V and each bool flag (1), write A and R.
FLOOR_BYTES = {case: 4 * 4 + len(flags) for case, flags in FLAGS.items()}
#: The first call at a new T and B (after every route ran at ``SHAPES[0]``).
NEW_T_SHAPES = [(1000, 77), (1000, 1000)]
#: The first call after ``warm_up`` (a process of its own): T in three of the heuristic's classes, both alignments.
AFTER_WARM_UP_SHAPES = [(1000, 77), (700, 1000), (96, 5001)]
SLIME_CHUNKS = (128, 256, 512)
SPIN_CLOCK_HZ = 2.0e9
#: --dry-run: tiny shapes on the CPU, the generic path standing in for every gae_xp route.
DRY_RUN_SHAPES = [(4, 16)]
DRY_RUN_NEW_T = [(3, 7)]
TRITON_ROUTE = "gae_xp triton (torch)"
NUMBA_ROUTE = "gae_xp numba-cuda (torch)"


def floor_bytes(case: str, dtype: str) -> int:
    """Bytes per element the case must move at ``dtype``: r and V read, A and R written, one byte per flag."""
    itemsize = 2 if dtype in ("bfloat16", "float16") else 4 if dtype == "float32" else 8
    return 4 * itemsize + len(FLAGS[case])


@dataclass
class Row:
    shape: tuple[int, int]
    case: str
    path: str
    dtype: str = "float32"
    device_ms: float | None = None
    wall_ms: float | None = None
    host_us: float | None = None
    runs: int = 0
    copy_ratio: float | None = None
    error: float | None = None
    variant: str = ""
    note: str = ""
    failed: str = ""
    extra: dict = field(default_factory=dict)

    def as_dict(self) -> dict:
        out = dict(self.__dict__)
        out["shape"] = list(self.shape)
        return out


@dataclass
class Device:
    """Where the run happens: torch CUDA, or the CPU of a dry run (device time is then the wall time)."""

    name: str = "cuda"

    @property
    def dry(self) -> bool:
        return self.name == "cpu"

    def synchronize(self):
        if not self.dry:
            import torch

            torch.cuda.synchronize()


DEVICE = Device()


# ------------------------------------------------------------------------------------------------------- timing

def spin_cycles(host_s: float) -> int:
    """Cycles of the spin kernel queued before a timed call: enough to cover the host's enqueueing."""
    return int(min(max(2 * host_s, 20e-6), 0.1) * SPIN_CLOCK_HZ)


def time_call(call, runs: int, warmup: int = 2) -> tuple[list[float], list[float], list[float]]:
    """(device s, wall s, host s) per call, ``runs`` of each, after ``warmup`` calls."""
    for _ in range(warmup):
        call()
    DEVICE.synchronize()
    wall, host = [], []
    for _ in range(runs):
        DEVICE.synchronize()
        start = time.perf_counter()
        call()
        host.append(time.perf_counter() - start)
        DEVICE.synchronize()
        wall.append(time.perf_counter() - start)
    if DEVICE.dry:
        return list(wall), wall, host
    import torch

    cycles = spin_cycles(statistics.median(host))
    events = []
    for _ in range(runs):
        torch.cuda._sleep(cycles)
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        call()
        stop.record()
        events.append((start, stop))
    torch.cuda.synchronize()
    return [start.elapsed_time(stop) / 1e3 for start, stop in events], wall, host


def runs_for(wall_s: float, budget_s: float = 0.1) -> int:
    """Samples to take of a call of ``wall_s`` seconds: about ``budget_s`` of each timing, 3 to 50."""
    return max(3, min(50, int(budget_s / max(wall_s, 1e-6))))


# -------------------------------------------------------------------------------------------------------- inputs

def make_inputs(shape, dtype: str, seed: int = 0) -> dict:
    import torch

    generator = torch.Generator(device=DEVICE.name).manual_seed(seed)
    options = dict(device=DEVICE.name, generator=generator)
    r = torch.randn(shape, **options).to(getattr(torch, dtype))
    v = torch.randn(shape, **options).to(getattr(torch, dtype))
    terminated = torch.rand(shape, **options) < 0.01
    mask = torch.rand(shape, **options) >= 0.2
    return {"rewards": r, "values": v, "terminated": terminated, "mask": mask}


def case_arguments(inputs: dict, case: str) -> dict:
    return {"rewards": inputs["rewards"], "values": inputs["values"], **{name: inputs[name] for name in FLAGS[case]}}


def reference(inputs: dict, case: str):
    """Advantages in float64 from gae_xp's generic path (an algorithm independent of every route timed)."""
    import gae_xp

    arguments = {name: (a.double() if a.dtype.is_floating_point else a)
                 for name, a in case_arguments(inputs, case).items()}
    advantages, _ = gae_xp.gae(**arguments, gamma=GAMMA, lam=LAM, backend="xp")
    return advantages


def relative_error(advantages, expected) -> float:
    import torch

    if not isinstance(advantages, torch.Tensor):  # CuPy
        advantages = torch.from_dlpack(advantages)
    scale = max(1.0, float(expected.abs().max()))
    return float((advantages.double() - expected).abs().max()) / scale


# --------------------------------------------------------------------------------------------------------- paths

class Unavailable(Exception):
    """A route or baseline that cannot run here, with the reason."""


def _import(name: str, *, beside: bool = False):
    if beside:
        sys.path.insert(0, str(HERE))
    try:
        return importlib.import_module(name)
    except Exception as error:  # ImportError, or a framework failing to load its driver
        raise Unavailable(f"{name}: {type(error).__name__}: {error}".splitlines()[0][:160]) from None
    finally:
        if beside:
            sys.path.remove(str(HERE))


def triton_variants() -> dict:
    """The Triton route's tuning variants (name -> settings), empty where the route or its variants are absent."""
    try:
        module = importlib.import_module("gae_xp.backends.triton")
    except Exception:  # no Triton route in this gae_xp, or Triton failing to load: no variants to time
        return {}
    variants = getattr(module, "TUNING_VARIANTS", None)
    return dict(variants) if isinstance(variants, dict) and callable(getattr(module, "tuned", None)) else {}


def route(backend: str, library: str = "torch", variant: str = ""):
    """A gae_xp route: ``gae(..., backend=backend)`` on torch tensors or CuPy arrays, under a tuning variant."""
    def build(inputs, case, shape):
        import gae_xp

        arguments = case_arguments(inputs, case)
        if library == "cupy":
            if inputs["rewards"].dtype != _torch().float32:
                raise Unavailable("CuPy has no bfloat16")
            cupy = _import("cupy")
            arguments = {name: cupy.from_dlpack(a) for name, a in arguments.items()}
        call = functools.partial(gae_xp.gae, **arguments, gamma=GAMMA, lam=LAM,
                                 backend="xp" if DEVICE.dry else backend)
        if not variant:
            return call
        module = _import("gae_xp.backends.triton")
        settings = triton_variants()[variant]

        def tuned_call():
            with module.tuned(**settings):
                return call()
        return tuned_call
    return build


def _torch():
    import torch

    return torch


def graph_replay(build):
    """A route's call captured once in a CUDA graph (after a warm-up on a side stream, as torch asks): the timed
    call is the replay, which returns the outputs captured (so the check reads the replay's results)."""
    def graphed(inputs, case, shape):
        torch = _torch()
        if DEVICE.dry:
            raise Unavailable("CUDA graphs need a GPU")
        call = build(inputs, case, shape)
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            call()  # compiles
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            outputs = call()

        def replay():
            graph.replay()
            return outputs
        return replay
    return graphed


def rl_triton(inputs, case, shape):
    """rl-triton 0.1.3's ``compute_gae`` (advantages only; its ``terminateds`` a float32 tensor)."""
    module = _import("rl_triton")
    compute_gae = getattr(module, "compute_gae", None)
    if compute_gae is None:
        raise Unavailable(f"rl_triton {getattr(module, '__version__', '?')} has no compute_gae")
    terminated = inputs["terminated"] if case == "terminated" else _torch().zeros_like(inputs["terminated"])
    call = functools.partial(compute_gae, inputs["rewards"], inputs["values"], terminated.float(), GAMMA, LAM)
    return lambda: (call(),)


def compiled_generic(inputs, case, shape):
    import gae_xp

    if tuple(shape) not in COMPILE_SHAPES:
        raise Unavailable("not compiled at this shape (each shape compiles anew: COMPILE_SHAPES)")
    compiled = _torch().compile(functools.partial(gae_xp.gae, gamma=GAMMA, lam=LAM, backend="xp"))
    arguments = case_arguments(inputs, case)
    return lambda: compiled(**arguments)


def slime_best(inputs, case, shape):
    """slime's chunk scan at the chunk size that is fastest here (each size timed briefly first)."""
    from gae_xp.bench import baselines

    r, v = inputs["rewards"], inputs["values"]
    timings = {}
    for chunk in [c for c in SLIME_CHUNKS if c <= max(shape[1], SLIME_CHUNKS[0])]:
        call = functools.partial(baselines.slime_chunked_gae, r, v, GAMMA, LAM, chunk)
        call()
        DEVICE.synchronize()
        start = time.perf_counter()
        call()
        DEVICE.synchronize()
        timings[chunk] = time.perf_counter() - start
    best = min(timings, key=timings.get)
    call = functools.partial(baselines.slime_chunked_gae, r, v, GAMMA, LAM, best)
    call.note = f"C={best} (of {', '.join(map(str, timings))})"
    return call


def triton_rows(inputs, case, shape):
    module = _import("triton_gae", beside=True)
    terminated = inputs["terminated"] if case == "terminated" else None
    return functools.partial(module.gae, inputs["rewards"], inputs["values"], GAMMA, LAM, terminated)


def triton_tiles(inputs, case, shape):
    module = _import("triton_gae", beside=True)
    if shape[-1] > module.MAX_BLOCK:
        raise Unavailable(f"rows of at most {module.MAX_BLOCK} steps (one block a row)")
    terminated = inputs["terminated"] if case == "terminated" else None
    call = functools.partial(module.gae_tiles, inputs["rewards"], inputs["values"], GAMMA, LAM, terminated)
    call.note = f"{module.rows_per_program(shape[-1])} rows a program"
    return call


def thread_per_row(inputs, case, shape):
    module = _import("row_gae", beside=True)
    terminated = inputs["terminated"] if case == "terminated" else None
    return functools.partial(module.gae, inputs["rewards"], inputs["values"], GAMMA, LAM, terminated)


def cccl(part: str):
    def build(inputs, case, shape):
        module = _import("cccl_gae", beside=True)
        try:
            scan = module.GaeScan(*shape, inputs["rewards"].device, GAMMA, LAM)
        except Exception as error:  # cuda.compute's build (NVRTC, nvJitLink, the operator's compile)
            raise Unavailable(f"cuda.compute: {type(error).__name__}: {error}".splitlines()[0][:160]) from None
        if part == "scan":
            scan.pairs(inputs["rewards"], inputs["values"])
            return scan.scan
        return functools.partial(scan.gae, inputs["rewards"], inputs["values"])
    return build


@dataclass(frozen=True)
class Timed:
    """A timed path: its builder, the cases and dtypes it runs, whether its first output is the advantages."""

    name: str
    build: object
    cases: tuple = CASES
    dtypes: tuple = DTYPES
    checks: bool = True
    variant: str = ""


def paths() -> list[Timed]:
    """Every path of the run: the routes, the Triton route's tuning variants (constant case), the baselines."""
    out = [Timed(TRITON_ROUTE, route("triton")),
           Timed(f"{TRITON_ROUTE}, CUDA-graph replay", graph_replay(route("triton"))),
           Timed(NUMBA_ROUTE, route("numba-cuda")),
           Timed(f"{NUMBA_ROUTE}, CUDA-graph replay", graph_replay(route("numba-cuda"))),
           Timed("gae_xp auto (CuPy)", route("auto", "cupy"), dtypes=("float32",)),
           Timed("gae_xp numba-cuda (CuPy)", route("numba-cuda", "cupy"), dtypes=("float32",))]
    out += [Timed(f"{TRITON_ROUTE} [{name}]", route("triton", variant=name), cases=("constant",), variant=name)
            for name in triton_variants()]
    out += [Timed("rl-triton 0.1.3", rl_triton, cases=("constant", "terminated"), dtypes=("float32",)),
            Timed("triton_gae.py, program per row", triton_rows, cases=("constant", "terminated"),
                  dtypes=("float32",)),
            Timed("triton_gae.py, rows per program", triton_tiles, cases=("constant", "terminated")),
            Timed("gae_xp generic, torch.compile", compiled_generic, cases=("constant",), dtypes=("float32",)),
            Timed("slime chunk scan, best C", slime_best, cases=("constant",), dtypes=("float32",)),
            Timed("cccl scan (struct op), scan alone", cccl("scan"), cases=("constant",), dtypes=("float32",),
                  checks=False),
            Timed("cccl scan (struct op), whole GAE", cccl("gae"), cases=("constant",), dtypes=("float32",)),
            Timed("thread per row (numba-cuda)", thread_per_row, cases=("constant", "terminated"),
                  dtypes=("float32",))]
    return out


# ------------------------------------------------------------------------------------------------------- the run

def copy_row(shape, case: str, dtype: str) -> Row:
    """A device-to-device copy of the case's floor bytes at ``dtype`` (half read, half written)."""
    torch = _torch()
    moved = floor_bytes(case, dtype) * math.prod(shape)
    source = torch.empty(moved // 2, dtype=torch.uint8, device=DEVICE.name).random_(0, 255)
    target = torch.empty_like(source)
    device, wall, host = time_call(lambda: target.copy_(source), runs=30)
    return Row(tuple(shape), case, "copy", dtype, statistics.median(device) * 1e3, statistics.median(wall) * 1e3,
               statistics.median(host) * 1e6, 30, 1.0, note=f"{floor_bytes(case, dtype)} B/element")


def measure(shape, case, dtype, path: Timed, inputs, expected, copy_ms: float) -> Row:
    row = Row(tuple(shape), case, path.name, dtype, variant=path.variant)
    try:
        started = time.perf_counter()
        call = path.build(inputs, case, shape)
        result = call()  # the first call compiles (numba, Triton, torch.compile, cuda.compute)
        row.extra["first_call_s"] = round(time.perf_counter() - started, 3)
        row.note = getattr(call, "note", "") or ("dry run: the generic path on the CPU" if DEVICE.dry else "")
        if path.checks and expected is not None:
            row.error = relative_error(result[0], expected)
        del result
        DEVICE.synchronize()
        start = time.perf_counter()
        call()
        DEVICE.synchronize()
        runs = runs_for(time.perf_counter() - start)
        device, wall, host = time_call(call, runs)
    except Unavailable as reason:
        row.failed = str(reason)
        return row
    except Exception as error:  # report it in the row and go on: one table for everything that ran
        row.failed = f"{type(error).__name__}: {error}".splitlines()[0][:200]
        row.extra["traceback"] = traceback.format_exc(limit=4)
        return row
    row.device_ms, row.wall_ms = statistics.median(device) * 1e3, statistics.median(wall) * 1e3
    row.host_us, row.runs = statistics.median(host) * 1e6, runs
    row.copy_ratio = row.device_ms / copy_ms
    return row


def run_shape(shape, every_path: list[Timed], report=print) -> list[Row]:
    """Every path, case and dtype at one shape: the copy first, then the paths against the float64 reference."""
    rows = []
    for dtype in DTYPES:
        inputs = make_inputs(shape, dtype)
        for case in CASES:
            copy = copy_row(shape, case, dtype)
            rows.append(copy)
            report(line(copy))
            try:
                expected = reference(inputs, case)
            except Exception as error:  # out of memory, say: the rows still run, unchecked
                expected = None
                report(f"  {shape} {dtype} {case}: no float64 reference ({type(error).__name__}: {error})")
            for path in every_path:
                if case in path.cases and dtype in path.dtypes:
                    rows.append(measure(shape, case, dtype, path, inputs, expected, copy.device_ms))
                    report(line(rows[-1]))
            del expected
        del inputs
    return rows


def first_calls_at_a_new_t(shapes) -> list[dict]:
    """Per torch route and case, float32: the first call at each new (B, T), then a repeat, wall ms."""
    out = []
    for name, backend in ((TRITON_ROUTE, "triton"), (NUMBA_ROUTE, "numba-cuda")):
        for shape in shapes:
            inputs = make_inputs(shape, "float32", seed=1)
            for case in CASES:
                entry = {"path": name, "shape": list(shape), "case": case}
                try:
                    entry.update(_first_and_repeat(route(backend)(inputs, case, shape)))
                except Exception as error:  # the route cannot run here: said in the entry
                    entry["failed"] = f"{type(error).__name__}: {error}".splitlines()[0][:200]
                out.append(entry)
    return out


def _first_and_repeat(call) -> dict:
    """The wall ms of ``call``'s first run and of a repeat, the device drained around each."""
    times = {}
    for key in ("first_ms", "repeat_ms"):
        DEVICE.synchronize()
        start = time.perf_counter()
        call()
        DEVICE.synchronize()
        times[key] = (time.perf_counter() - start) * 1e3
    return times


#: ``warm_up``'s name of each case.
WARM_UP_CASES = {"constant": "constant", "terminated": "dones", "dones+mask": "dones+mask"}
AFTER_WARM_UP = f"{TRITON_ROUTE}, after warm_up"


def first_calls_after_warm_up(shapes) -> list[dict]:
    """The first call at each new (B, T) per case, float32, ``auto`` on torch CUDA tensors, in a new process with an
    empty Triton cache (``TRITON_CACHE_DIR``) after ``gae_xp.warm_up(device="cuda")``: wall ms, and warm_up's s
    (``warmed_first_calls`` in that process)."""
    command = [sys.executable, __file__, "--warmed-first-calls", json.dumps(shapes)] + (
        ["--dry-run"] if DEVICE.dry else [])
    with tempfile.TemporaryDirectory() as cache:
        done = subprocess.run(command, capture_output=True, text=True, timeout=120,
                              env={**os.environ, "TRITON_CACHE_DIR": cache})
    if done.returncode != 0:
        failure = (done.stderr.strip().splitlines() or ["no output"])[-1][:200]
        return [{"path": AFTER_WARM_UP, "shape": list(shape), "case": case, "failed": failure}
                for shape in shapes for case in CASES]
    return json.loads(done.stdout.strip().splitlines()[-1])


def warmed_first_calls(shapes) -> list[dict]:
    """``gae_xp.warm_up(device="cuda")`` of the cases (time last), timed, then per shape and case the first call
    of ``auto`` and a repeat (a dry run: no warm-up, the generic path)."""
    import gae_xp

    start = time.perf_counter()
    if not DEVICE.dry:
        gae_xp.warm_up(cases=[WARM_UP_CASES[case] for case in CASES], layouts="time-last", device=DEVICE.name)
    warm_up_s, out = time.perf_counter() - start, []
    for shape in shapes:
        inputs = make_inputs(shape, "float32", seed=1)
        for case in CASES:
            out.append({"path": AFTER_WARM_UP, "shape": list(shape), "case": case, "warm_up_s": warm_up_s,
                        **_first_and_repeat(route("auto")(inputs, case, shape))})
    return out


# ------------------------------------------------------------------------------------------------------ reporting

def line(row: Row) -> str:
    head = f"  {row.shape[0]}x{row.shape[1]} {row.dtype:8} {row.case:10} {row.path:44}"
    if row.failed:
        return f"{head} not run: {row.failed}"
    error = "" if row.error is None else f" err {row.error:.1e}"
    return (f"{head} {1e3 * row.device_ms:10.1f} us device ({row.copy_ratio:5.2f}x copy), "
            f"{1e3 * row.wall_ms:9.1f} us wall, {row.host_us:7.1f} us host{error}")


def _cell(value, fmt: str) -> str:
    return "" if value is None else format(value, fmt)


def _us(milliseconds: float | None) -> float | None:
    return None if milliseconds is None else 1e3 * milliseconds


def markdown(rows: list[Row], skipped=(), header: str = "", new_t=()) -> str:
    """The rows as one Markdown table, the Triton variants' best per shape, the first calls at a new T."""
    lines = [header, "", "| shape | dtype | case | path | device us | x copy | wall us | host us | max rel. error "
             "| note |", "|" + "---|" * 10]
    for row in rows:
        shape = f"{row.shape[0]}x{row.shape[1]}"
        if row.failed:
            lines.append(f"| {shape} | {row.dtype} | {row.case} | {row.path} | not run: {row.failed} | | | | | |")
            continue
        lines.append(" | ".join([
            f"| {shape}", row.dtype, row.case, row.path, _cell(_us(row.device_ms), ".1f"),
            _cell(row.copy_ratio, ".2f"), _cell(_us(row.wall_ms), ".1f"), _cell(row.host_us, ".1f"),
            _cell(row.error, ".1e"), row.note]) + " |")
    lines += ["", "device: CUDA events around one call, a spin kernel queued first (host enqueueing hidden); wall: "
              "synchronize, call, synchronize; host: the Python call without waiting; medians. x copy: device "
              "time over a device-to-device copy of the case's floor bytes (r and V read, A and R written, a byte "
              "per bool flag) at the same shape and dtype. Error: max |A - A64| / max(1, max |A64|) against "
              "gae_xp's generic path in float64 on the same inputs."]
    best = best_variants(rows)
    if best:
        lines += ["", "Triton tuning variants, the fastest per shape and dtype (constant case):", "",
                  "| shape | dtype | best variant | device us | x copy | default route's us |", "|" + "---|" * 6]
        for (shape, dtype), (row, default) in best.items():
            lines.append(f"| {shape[0]}x{shape[1]} | {dtype} | {row.variant} | {1e3 * row.device_ms:.1f} | "
                         f"{row.copy_ratio:.2f} | {_cell(default and _us(default.device_ms), '.1f')} |")
    if new_t:
        lines += ["", "The first call at a new B and T (float32, after every route ran at the first shape; \"after "
                  "warm_up\": in a process of its own with an empty Triton cache, after "
                  "gae_xp.warm_up(device=\"cuda\"), whose seconds are in the note), ms wall:",
                  "", "| path | shape | case | first call | repeated | note |", "|---|---|---|---|---|---|"]
        for entry in new_t:
            shape = "x".join(map(str, entry["shape"]))
            if "failed" in entry:
                lines.append(f"| {entry['path']} | {shape} | {entry['case']} | not run: {entry['failed']} | | |")
            else:
                note = f"warm_up {entry['warm_up_s']:.1f} s" if "warm_up_s" in entry else ""
                lines.append(f"| {entry['path']} | {shape} | {entry['case']} | {entry['first_ms']:.2f} | "
                             f"{entry['repeat_ms']:.2f} | {note} |")
    if skipped:
        lines.append(f"\nNot run (over the time budget): {', '.join(f'{b}x{t}' for b, t in skipped)}.")
    return "\n".join(lines)


def best_variants(rows: list[Row]) -> dict:
    """(shape, dtype) -> (the fastest variant's row, the default route's row or None), constant case."""
    best, default = {}, {}
    for row in rows:
        if row.failed or row.case != "constant":
            continue
        key = (tuple(row.shape), row.dtype)
        if row.variant and (key not in best or row.device_ms < best[key].device_ms):
            best[key] = row
        elif row.path == TRITON_ROUTE:
            default[key] = row
    return {key: (row, default.get(key)) for key, row in best.items()}


def environment() -> dict:
    torch = _torch()
    versions = {"torch": torch.__version__, "cuda": torch.version.cuda}
    for module in ("numpy", "numba_cuda", "numba", "cupy", "triton", "cuda.compute", "numba_cuda_mlir", "rl_triton",
                   "gae_xp"):
        try:
            versions[module] = getattr(importlib.import_module(module), "__version__", "?")
        except Exception as error:  # absent, or present but failing to load: say which
            versions[module] = f"not loaded ({type(error).__name__})"
    versions["triton variants"] = sorted(triton_variants())
    versions["gpu"] = torch.cuda.get_device_name() if not DEVICE.dry else "none (dry run)"
    return versions


def write(out: Path, info: dict, rows: list[Row], skipped, new_t, header: str):
    out.mkdir(parents=True, exist_ok=True)
    (out / "bench_gpu.md").write_text(markdown(rows, skipped, header, new_t) + "\n")
    (out / "bench_gpu.json").write_text(json.dumps({"environment": info, "rows": [r.as_dict() for r in rows],
                                                    "skipped": [list(s) for s in skipped], "new_t": new_t,
                                                    "dry_run": DEVICE.dry}, indent=1))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default="all", help="'all' or BxT,BxT,...")
    parser.add_argument("--paths", default=None, help="comma-separated path names (default: all)")
    parser.add_argument("--budget", type=float, default=330.0, help="seconds after which no new shape starts")
    parser.add_argument("--out", default=None, help="folder for bench_gpu.json and bench_gpu.md")
    parser.add_argument("--dry-run", action="store_true", help="tiny shapes on the CPU, nothing measured")
    parser.add_argument("--warmed-first-calls", default=None, metavar="JSON",
                        help="(the bench's own child process) warm_up, then the first calls at these [B, T]; a JSON "
                             "line out")
    options = parser.parse_args(argv)
    DEVICE.name = "cpu" if options.dry_run else "cuda"
    if options.warmed_first_calls is not None:
        print(json.dumps(warmed_first_calls([tuple(shape) for shape in json.loads(options.warmed_first_calls)])))
        return 0
    shapes = (DRY_RUN_SHAPES if options.dry_run else SHAPES) if options.shapes == "all" else \
        [tuple(int(n) for n in s.split("x")) for s in options.shapes.split(",")]
    if not options.dry_run and not _torch().cuda.is_available():
        print("no CUDA device visible to torch: nothing to measure", file=sys.stderr)
        return 1
    info = environment()
    print(json.dumps(info))
    every_path = [p for p in paths() if options.paths is None or p.name in options.paths.split(",")]
    started = time.perf_counter()
    rows, skipped, new_t = [], [], []
    for index, shape in enumerate(shapes):
        if time.perf_counter() - started > options.budget:
            skipped.append(tuple(shape))
            continue
        shape_started = time.perf_counter()
        rows += run_shape(shape, every_path, report=lambda text: print(text, flush=True))
        if index == 0:
            new_t = first_calls_at_a_new_t(DRY_RUN_NEW_T if options.dry_run else NEW_T_SHAPES)
            new_t += first_calls_after_warm_up(DRY_RUN_NEW_T if options.dry_run else AFTER_WARM_UP_SHAPES)
        with contextlib.suppress(Exception):  # the caching allocator's blocks back to the driver between shapes
            _torch().cuda.empty_cache()
        print(f"== {shape[0]}x{shape[1]}: {time.perf_counter() - shape_started:.1f} s", flush=True)
        header = (f"GPU benchmark on {info['gpu']}, gamma {GAMMA}, lam {LAM} ({time.perf_counter() - started:.0f} s"
                  f"{'; DRY RUN on the CPU, nothing measured' if options.dry_run else '; measured'})")
        if options.out:
            left = [tuple(s) for s in shapes[index + 1:]]
            write(Path(options.out), info, rows, skipped + left, new_t, header)
    if options.out:
        write(Path(options.out), info, rows, skipped, new_t, header if rows else "GPU benchmark: no shape ran")
    print(markdown(rows, skipped, "", new_t))
    return 0


if __name__ == "__main__":
    sys.exit(main())
