"""GPU benchmark: gae_xp's fused kernels against the best published GPU scans, side by side in one run.

For every shape (rl-triton's grid, slime's shape, short horizons) and case
(constant; terminated; terminated and a holed mask), float32, gamma 0.99,
lam 0.95, on torch CUDA tensors, it times:

* ``copy``: a device-to-device copy of the case's floor bytes (read r, V and
  the flags once, write A and R once): the memory roofline of this run;
* ``gae_xp fused`` (torch, and CuPy where installed): ``backend="numba-cuda"``;
* ``gae_xp generic, torch.compile``: ``backend="xp"`` under ``torch.compile``
  (on ``COMPILE_SHAPES`` only: each shape compiles anew);
* ``slime chunk scan``: slime's published chunk scan at its best chunk size;
* ``triton, program per row``: rl-triton's design (``triton_gae.py``);
* ``cccl scan``: ``cuda.compute``'s inclusive scan with a struct operator
  (``cccl_gae.py``), the scan alone and the whole GAE;
* ``thread per row``: PufferLib's design (``row_gae.py``).

Per call: **device time** (CUDA events around one call, with a spin kernel
queued first so that the host's enqueueing is hidden: what the GPU spends from
the call's first kernel to its last), **wall time** (synchronize, call,
synchronize: the full call as a trainer sees it) and **host time** (the Python
call without waiting: everything up to the launches). Medians. Bandwidth: the
case's floor bytes over the device time, as a share of the copy's; for the
fused path also the traffic model's bytes (``tools.traffic``, checked
against the PTX on the CPU) and the time they predict at the copy's measured
bandwidth, beside the measurement, so the first GPU run checks the model.
Every output is compared with gae_xp's generic path in float64.

A baseline that cannot be imported or built prints why in its row; the rest
runs. Shapes start while the time spent is under ``--budget`` seconds; the
ones left are listed. Results go to ``--out`` (JSON and Markdown). Run by
``tests/gpu/check.sh``; ``tests/gpu/README.md`` lists what it needs.
"""

from __future__ import annotations

import argparse
import functools
import importlib
import json
import math
import statistics
import sys
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
GAMMA, LAM = 0.99, 0.95
#: (rows, steps): rl-triton's published grid, slime's shape, short horizons (PufferLib-style training).
GRID = [(8192, 1024), (8192, 2048), (8192, 4096), (2048, 4096), (16, 524288)]
SLIME = [(256, 131072)]
SHORT = [(4096, 8), (4096, 32), (4096, 128), (32768, 8), (32768, 32), (32768, 128)]
#: rl-triton's whole-call figure (68 us on an H200, issue 29): a trainer's batch of short rows.
TRAINER = [(38400, 128)]
SHAPES = TRAINER + GRID + SLIME + SHORT
#: torch.compile compiles every shape anew (tens of seconds each): this shape only, to fit the time budget.
COMPILE_SHAPES = [(256, 131072)]
CASES = ("constant", "terminated", "dones+mask")
#: Bytes per element a case must move at least: read r, V (4 + 4) and each bool flag (1), write A and R (4 + 4).
FLOOR_BYTES = {"constant": 16, "terminated": 17, "dones+mask": 18}
SLIME_CHUNKS = (128, 256, 512)
#: Published figures (H100 for rl-triton, slime's GPU for slime), ms: quoted beside ours, never as ours.
PUBLISHED_MS = {("rl-triton", 8192, 1024): 0.0457, ("rl-triton", 8192, 2048): 0.1036,
                ("rl-triton", 8192, 4096): 0.2997, ("rl-triton", 16, 524288): 1.07, ("slime", 256, 131072): 18.4}
#: The issue's targets on an H200.
TARGETS = {"copy_share": 0.85, "slime_ms": {"constant": 0.20, "dones+mask": 0.23}, "slime_speedup": 90,
           "triton_speedup_long": 5, "short_wall_us": 25}
SPIN_CLOCK_HZ = 2.0e9


@dataclass
class Row:
    shape: tuple[int, int]
    case: str
    path: str
    device_ms: float | None = None
    wall_ms: float | None = None
    host_us: float | None = None
    runs: int = 0
    floor_gbs: float | None = None
    copy_share: float | None = None
    model_bytes: float | None = None
    moved_share: float | None = None
    predicted_ms: float | None = None
    error: float | None = None
    note: str = ""
    failed: str = ""
    extra: dict = field(default_factory=dict)

    def as_dict(self) -> dict:
        out = dict(self.__dict__)
        out["shape"] = list(self.shape)
        return out


# ------------------------------------------------------------------------------------------------------- timing

def spin_cycles(host_s: float) -> int:
    """Cycles of the spin kernel queued before a timed call: enough to cover the host's enqueueing."""
    return int(min(max(2 * host_s, 20e-6), 0.1) * SPIN_CLOCK_HZ)


def time_torch(call, runs: int, warmup: int = 2) -> tuple[list[float], list[float], list[float]]:
    """(device s, wall s, host s) per call, ``runs`` of each, after ``warmup`` calls."""
    import torch

    for _ in range(warmup):
        call()
    torch.cuda.synchronize()
    wall, host = [], []
    for _ in range(runs):
        torch.cuda.synchronize()
        start = time.perf_counter()
        call()
        host.append(time.perf_counter() - start)
        torch.cuda.synchronize()
        wall.append(time.perf_counter() - start)
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
    device = [start.elapsed_time(stop) / 1e3 for start, stop in events]
    return device, wall, host


def runs_for(wall_s: float, budget_s: float = 0.3) -> int:
    """Samples to take of a call of ``wall_s`` seconds: about ``budget_s`` of each timing, 3 to 50."""
    return max(3, min(50, int(budget_s / max(wall_s, 1e-6))))


# -------------------------------------------------------------------------------------------------------- inputs

def make_inputs(shape, seed: int = 0) -> dict:
    import torch

    generator = torch.Generator(device="cuda").manual_seed(seed)
    rows, length = shape
    r = torch.randn(shape, device="cuda", generator=generator)
    v = torch.randn(shape, device="cuda", generator=generator)
    terminated = torch.rand(shape, device="cuda", generator=generator) < 0.01
    mask = torch.rand(shape, device="cuda", generator=generator) >= 0.2
    return {"rewards": r, "values": v, "terminated": terminated, "mask": mask}


def case_arguments(inputs: dict, case: str) -> dict:
    flags = {"constant": (), "terminated": ("terminated",), "dones+mask": ("terminated", "mask")}[case]
    return {"rewards": inputs["rewards"], "values": inputs["values"], **{name: inputs[name] for name in flags}}


def reference(inputs: dict, case: str):
    """Advantages in float64 from gae_xp's generic path (an algorithm independent of every path timed)."""
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
    """A baseline that cannot run here, with the reason."""


def _import_baseline(name: str):
    sys.path.insert(0, str(HERE))
    try:
        return importlib.import_module(name)
    except Exception as error:  # ImportError, or a framework failing to load its driver
        raise Unavailable(f"{name}: {type(error).__name__}: {error}".splitlines()[0][:160]) from None
    finally:
        sys.path.remove(str(HERE))


def fused(library: str):
    def build(inputs, case, shape):
        import gae_xp

        arguments = case_arguments(inputs, case)
        if library == "cupy":
            try:
                import cupy
            except ImportError as error:
                raise Unavailable(f"CuPy: {error}") from None
            arguments = {name: cupy.from_dlpack(a) for name, a in arguments.items()}
        return functools.partial(gae_xp.gae, **arguments, gamma=GAMMA, lam=LAM, backend="numba-cuda")
    return build


def graph_replay(build):
    """A path's call captured once in a CUDA graph (after a warm-up on a side stream, as torch asks): the timed
    call is the replay, which returns the outputs captured (so the check reads the replay's results)."""
    def graphed(inputs, case, shape):
        import torch

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


def compiled_generic(inputs, case, shape):
    import torch

    import gae_xp

    if tuple(shape) not in COMPILE_SHAPES:
        raise Unavailable("not compiled at this shape (each shape compiles anew: COMPILE_SHAPES)")
    compiled = torch.compile(functools.partial(gae_xp.gae, gamma=GAMMA, lam=LAM, backend="xp"))
    arguments = case_arguments(inputs, case)
    return lambda: compiled(**arguments)


def slime_best(inputs, case, shape):
    """slime's chunk scan at the chunk size that is fastest here (each size timed briefly first)."""
    import torch

    from gae_xp.bench import baselines

    r, v = inputs["rewards"], inputs["values"]
    timings = {}
    for chunk in [c for c in SLIME_CHUNKS if c <= max(shape[1], SLIME_CHUNKS[0])]:
        call = functools.partial(baselines.slime_chunked_gae, r, v, GAMMA, LAM, chunk)
        call()
        torch.cuda.synchronize()
        start = time.perf_counter()
        call()
        torch.cuda.synchronize()
        timings[chunk] = time.perf_counter() - start
    best = min(timings, key=timings.get)
    call = functools.partial(baselines.slime_chunked_gae, r, v, GAMMA, LAM, best)
    call.note = f"C={best} (of {', '.join(map(str, timings))})"
    return call


def triton_rows(inputs, case, shape):
    module = _import_baseline("triton_gae")
    terminated = inputs["terminated"] if case == "terminated" else None
    return functools.partial(module.gae, inputs["rewards"], inputs["values"], GAMMA, LAM, terminated)


def thread_per_row(inputs, case, shape):
    module = _import_baseline("row_gae")
    terminated = inputs["terminated"] if case == "terminated" else None
    return functools.partial(module.gae, inputs["rewards"], inputs["values"], GAMMA, LAM, terminated)


def cccl(part: str):
    def build(inputs, case, shape):
        module = _import_baseline("cccl_gae")
        try:
            scan = module.GaeScan(*shape, inputs["rewards"].device, GAMMA, LAM)
        except Exception as error:  # cuda.compute's build (NVRTC, nvJitLink, the operator's compile)
            raise Unavailable(f"cuda.compute: {type(error).__name__}: {error}".splitlines()[0][:160]) from None
        if part == "scan":
            scan.pairs(inputs["rewards"], inputs["values"])
            return scan.scan
        return functools.partial(scan.gae, inputs["rewards"], inputs["values"])
    return build


#: (path, builder, cases, gives advantages to check)
PATHS = [
    ("gae_xp fused (torch)", fused("torch"), CASES, True),
    ("gae_xp fused (torch), CUDA-graph replay", graph_replay(fused("torch")), CASES, True),
    ("gae_xp fused (CuPy)", fused("cupy"), ("constant",), True),
    ("gae_xp generic, torch.compile", compiled_generic, ("constant", "dones+mask"), True),
    ("slime chunk scan, best C", slime_best, ("constant",), True),
    ("triton, program per row", triton_rows, ("constant", "terminated"), True),
    ("cccl scan (struct op), scan alone", cccl("scan"), ("constant",), False),
    ("cccl scan (struct op), whole GAE", cccl("gae"), ("constant",), True),
    ("thread per row (numba-cuda)", thread_per_row, ("constant", "terminated"), True),
]


# ------------------------------------------------------------------------------------------------------- the run

def copy_bandwidth(shape) -> tuple[float, Row]:
    """Bytes per second of a device-to-device copy that moves 16 bytes per element (8 read, 8 written)."""
    import torch

    elements = math.prod(shape)
    source = torch.empty(8 * elements, dtype=torch.uint8, device="cuda").random_(0, 255)
    target = torch.empty_like(source)
    device, wall, host = time_torch(lambda: target.copy_(source), runs=30)
    seconds = statistics.median(device)
    row = Row(tuple(shape), "constant", "copy (16 B/element)", seconds * 1e3, statistics.median(wall) * 1e3,
              statistics.median(host) * 1e6, 30, 16 * elements / seconds / 1e9, 1.0)
    return 16 * elements / seconds, row


def _traffic_model():
    """``tools.traffic``, from the clone's root (not installed): appended to the path, so that the installed gae_xp
    stays the one imported."""
    root = str(HERE.parents[1])
    if root not in sys.path:
        sys.path.append(root)
    from tools import traffic

    return traffic


def measure(shape, case, name, build, inputs, expected, bandwidth, checks: bool) -> Row:
    traffic = _traffic_model()

    row = Row(tuple(shape), case, name)
    elements = math.prod(shape)
    try:
        started = time.perf_counter()
        call = build(inputs, case, shape)
        result = call()  # the first call compiles (numba, Triton, torch.compile, cuda.compute)
        row.extra["first_call_s"] = round(time.perf_counter() - started, 2)
        row.note = getattr(call, "note", "")
        if checks and expected is not None:
            row.error = relative_error(result[0], expected)
        del result
        import torch

        torch.cuda.synchronize()
        start = time.perf_counter()
        call()
        torch.cuda.synchronize()
        runs = runs_for(time.perf_counter() - start)
        device, wall, host = time_torch(call, runs)
    except Unavailable as reason:
        row.failed = str(reason)
        return row
    except Exception as error:  # report it in the row and go on: one table for everything that ran
        row.failed = f"{type(error).__name__}: {error}".splitlines()[0][:200]
        row.extra["traceback"] = traceback.format_exc(limit=4)
        return row
    seconds = statistics.median(device)
    row.device_ms, row.wall_ms, row.host_us, row.runs = seconds * 1e3, statistics.median(wall) * 1e3, \
        statistics.median(host) * 1e6, runs
    row.floor_gbs = FLOOR_BYTES[case] * elements / seconds / 1e9
    row.copy_share = row.floor_gbs * 1e9 / bandwidth
    if name.startswith("gae_xp fused") and case in traffic.CASES:
        model = traffic.fused_row(case, shape=tuple(shape)).bytes_per_element
        row.model_bytes = model
        row.moved_share = model * elements / seconds / bandwidth
        row.predicted_ms = model * elements / bandwidth * 1e3
    elif name.startswith("gae_xp fused"):
        row.predicted_ms = FLOOR_BYTES[case] * elements / bandwidth * 1e3
    return row


def run(shapes, *, budget_s: float, paths=None) -> tuple[list[Row], list[tuple[int, int]]]:
    import torch

    rows, skipped, started = [], [], time.perf_counter()
    for shape in shapes:
        if time.perf_counter() - started > budget_s:
            skipped.append(tuple(shape))
            continue
        shape_started = time.perf_counter()
        inputs = make_inputs(shape)
        bandwidth, copy_row = copy_bandwidth(shape)
        rows.append(copy_row)
        for case in CASES:
            try:
                expected = reference(inputs, case)
            except Exception as error:  # out of memory, say: the rows still run, unchecked
                expected = None
                print(f"  {shape} {case}: no float64 reference ({type(error).__name__}: {error})", file=sys.stderr)
            for name, build, cases, checks in PATHS:
                if case in cases and (paths is None or name in paths):
                    row = measure(shape, case, name, build, inputs, expected, bandwidth, checks)
                    rows.append(row)
                    print(line(row), flush=True)
            del expected
        del inputs
        torch.cuda.empty_cache()
        print(f"== {shape[0]}x{shape[1]}: {time.perf_counter() - shape_started:.1f} s", flush=True)
    return rows, skipped


# ------------------------------------------------------------------------------------------------------ reporting

def line(row: Row) -> str:
    if row.failed:
        return f"  {row.shape[0]}x{row.shape[1]} {row.case:11} {row.path:36} not run: {row.failed}"
    error = "" if row.error is None else f" err {row.error:.1e}"
    predicted = "" if row.predicted_ms is None else f" (predicted {row.predicted_ms:.4f})"
    return (f"  {row.shape[0]}x{row.shape[1]} {row.case:11} {row.path:36} {row.device_ms:9.4f} ms device"
            f"{predicted}, {row.wall_ms:8.4f} ms wall, {row.host_us:7.1f} us host, "
            f"{100 * row.copy_share:5.1f} % of copy{error}")


def _cell(value, fmt: str) -> str:
    return "" if value is None else format(value, fmt)


def markdown(rows: list[Row], skipped=(), header: str = "") -> str:
    """The rows as one Markdown table, with a legend."""
    lines = [header, "", "| shape | case | path | device ms | predicted ms | wall ms | host us | GB/s (floor bytes) "
             "| % of copy | % of copy, bytes moved | max rel. error | note |", "|" + "---|" * 12]
    for row in rows:
        shape = f"{row.shape[0]}x{row.shape[1]}"
        if row.failed:
            lines.append(f"| {shape} | {row.case} | {row.path} | not run: {row.failed} | | | | | | | | |")
            continue
        lines.append(" | ".join([
            f"| {shape}", row.case, row.path, _cell(row.device_ms, ".4f"), _cell(row.predicted_ms, ".4f"),
            _cell(row.wall_ms, ".4f"), _cell(row.host_us, ".1f"), _cell(row.floor_gbs, ".0f"),
            _cell(None if row.copy_share is None else 100 * row.copy_share, ".1f"),
            _cell(None if row.moved_share is None else 100 * row.moved_share, ".1f"),
            _cell(row.error, ".1e"), row.note]) + " |")
    lines += ["", "device: CUDA events around one call, a spin kernel queued first (host enqueueing hidden); wall: "
              "synchronize, call, synchronize; host: the Python call without waiting; medians. GB/s: the case's "
              "floor bytes (16 B/element, 17 with terminated, 18 with a mask too) over the device time; % of copy: "
              "that over this run's device-to-device copy at the same shape; bytes moved and predicted ms: the "
              "traffic model's bytes for the fused path, predicted at the copy's measured bandwidth. Error: "
              "max |A - A64| / max(1, max |A64|) against gae_xp's generic path in float64."]
    if skipped:
        lines.append(f"Not run (over the time budget): {', '.join(f'{b}x{t}' for b, t in skipped)}.")
    return "\n".join(lines)


def verdicts(rows: list[Row]) -> list[str]:
    """The issue's targets, each met or missed, from the rows that ran."""
    by = {(row.shape, row.case, row.path): row for row in rows if not row.failed}
    fused = "gae_xp fused (torch)"
    out = []
    for shape in GRID + SLIME:
        row = by.get((shape, "constant", fused))
        if row is not None and row.moved_share is not None:
            out.append(_verdict(f"{shape[0]}x{shape[1]} fused: {100 * row.moved_share:.0f} % of the copy's "
                                f"bandwidth, bytes moved", row.moved_share >= TARGETS["copy_share"], ">= 85 %"))
        triton = by.get((shape, "constant", "triton, program per row"))
        if row is not None and triton is not None:
            speedup = triton.device_ms / row.device_ms
            needed = TARGETS["triton_speedup_long"] if shape == (16, 524288) else 1.0
            met = speedup >= needed if needed > 1 else speedup > needed
            out.append(_verdict(f"{shape[0]}x{shape[1]} fused vs Triton per row: {speedup:.2f}x", met,
                                f"{'>=' if needed > 1 else '>'} {needed:g}x"))
    for case, limit in TARGETS["slime_ms"].items():
        row = by.get(((256, 131072), case, fused))
        if row is not None:
            out.append(_verdict(f"256x131072 {case} fused: {row.device_ms:.3f} ms", row.device_ms <= limit,
                                f"<= {limit} ms"))
            if case == "constant":
                published = PUBLISHED_MS["slime", 256, 131072] / row.device_ms
                out.append(_verdict(f"slime's published 18.4 ms / fused: {published:.0f}x", published >=
                                    TARGETS["slime_speedup"], f">= {TARGETS['slime_speedup']}x"))
                slime = by.get(((256, 131072), "constant", "slime chunk scan, best C"))
                if slime is not None:
                    out.append(f"slime's chunk scan measured here / fused: {slime.device_ms / row.device_ms:.0f}x")
    for shape in SHORT:
        row = by.get((shape, "constant", fused))
        if row is not None:
            out.append(_verdict(f"{shape[0]}x{shape[1]} fused full call: {1e3 * row.wall_ms:.1f} us wall",
                                1e3 * row.wall_ms <= TARGETS["short_wall_us"], f"<= {TARGETS['short_wall_us']} us"))
    return out


def _verdict(text: str, met: bool, target: str) -> str:
    return f"{text} (target {target}): {'met' if met else 'MISSED'}"


def environment() -> dict:
    import torch

    versions = {"torch": torch.__version__, "cuda": torch.version.cuda}
    for module in ("numba_cuda", "numba", "cupy", "triton", "cuda.compute", "numba_cuda_mlir", "gae_xp"):
        try:
            versions[module] = getattr(importlib.import_module(module), "__version__", "?")
        except Exception as error:  # absent, or present but failing to load: say which
            versions[module] = f"not loaded ({type(error).__name__})"
    from gae_xp.backends import _cuda_import

    versions["kernel compiler"] = _cuda_import.NAME
    versions["gpu"] = torch.cuda.get_device_name() if torch.cuda.is_available() else "none"
    return versions


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default="all", help="'all', 'grid', 'slime', 'short' or BxT,BxT,...")
    parser.add_argument("--paths", default=None, help="comma-separated path names (default: all)")
    parser.add_argument("--budget", type=float, default=330.0, help="seconds after which no new shape starts")
    parser.add_argument("--out", default=None, help="folder for bench_gpu.json and bench_gpu.md")
    options = parser.parse_args(argv)
    named = {"all": SHAPES, "grid": GRID, "slime": SLIME, "short": SHORT}
    shapes = named.get(options.shapes) or [tuple(int(n) for n in s.split("x")) for s in options.shapes.split(",")]
    import torch

    if not torch.cuda.is_available():
        print("no CUDA device visible to torch: nothing to measure", file=sys.stderr)
        return 1
    info = environment()
    print(json.dumps(info))
    started = time.perf_counter()
    rows, skipped = run(shapes, budget_s=options.budget,
                        paths=None if options.paths is None else set(options.paths.split(",")))
    header = (f"GPU benchmark on {info['gpu']}, float32, gamma {GAMMA}, lam {LAM} "
              f"({time.perf_counter() - started:.0f} s; measured, not predicted, except the predicted column)")
    table = markdown(rows, skipped, header)
    judged = verdicts(rows)
    print(table)
    print("\n".join(judged))
    if options.out:
        out = Path(options.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "bench_gpu.md").write_text(table + "\n\n" + "\n".join(f"- {v}" for v in judged) + "\n")
        (out / "bench_gpu.json").write_text(json.dumps({"environment": info, "rows": [r.as_dict() for r in rows],
                                                        "skipped": skipped, "verdicts": judged}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
