"""Cost model: a GPU kernel's device time from the bytes it moves and the instructions it issues, calibrated on
the measured H200 table.

Per launch, in one of two forms::

    max: time = max(bytes / bandwidth, thread instructions / issue rate) + latency   (overlapped)
    sum: time = bytes / bandwidth + thread instructions / issue rate + latency        (added)

and a call's time is the sum over its launches; both forms are fit, and the one
with the smaller residual on the rows fit is used (``choose``: ``sum`` on the
H200 table, where ``max`` models the Triton baseline 10-41 % fast). A copy is bound by bytes; the
first fused numba-CUDA kernels, measured at 7-12x a copy, by their own
instructions (about 1,100 SASS instructions a step): bytes alone, the traffic
model, predicted 23 us at 38400x128 where 163 us was measured.

* **Bytes**: the case's per-step arrays read once by every launch that streams
  them and the outputs written once (16 B a float32 step, 17 with a bool
  ``terminated``, 18 with a mask too); the numba-CUDA routes' from
  ``tools.traffic.fused_launches``, the traffic model.
* **Thread instructions** of a launch: blocks x threads x the SASS
  instructions one thread issues (``tools.sass.per_thread``: a static count of
  the compiled loop bodies, both sides of every branch, times their trips). The
  numba-CUDA kernels are compiled as ``tests/test_cuda_compile.py`` compiles
  them (sm_90, launch bounds, ptxas), the Triton kernels as
  ``tests/triton_ptx.py`` does (``triton.compile`` for sm_90 without a GPU),
  with the launch settings the route picks for each shape, on the path of
  the benchmark's blocks: finite numbers, without what only a block holding
  a NaN or an inf (the exact second scan, ``_triton_parts.solve_block``) or
  only a chunk's last blocks in the chunks' maps (``_reach``) runs
  (``RARE_PATHS`` False); with the case dones+mask, whose random mask (a
  step masked in five) holes every block, on the value chain's path
  (``_triton_gae.HOLED``). The lean numba-CUDA kernels are counted without
  the value chain's scan, which only a tile where a thread holding steps of
  it holds no real one runs (``lean_kernel``'s ``rare_paths``): a thread's
  steps are all masked with a chance of 0.2 ** 8 or less there.
* **Calibration**: ``bandwidth`` and ``latency`` by linear least squares on the
  measured copies (time = bytes / bandwidth + latency); the ``issue rate`` by
  least squares on the logarithm of the time (relative residuals) over the
  calibration rows of the fused kernels and of ``tests/gpu/triton_gae.py``'s
  program-per-row baseline (``CALIBRATION``); every other measured row is held
  out and only predicted.

The rates absorb what the count misses: a static count over-counts a branchy
kernel, and the issue rate is an average over the kernels fit, not the
hardware's peak (132 SMs x 4 schedulers x 32 lanes x 1.98 GHz = 33.4e12 thread
instructions a second). Latency- and occupancy-bound launches (few programs,
16x524288) are outside what the two rates can express.

``python -m tools.cost_model`` prints the tables of docs/gpu.md (``--write`` writes them between their markers);
``tests/test_cost_model.py`` checks the fit and that the page holds the tables. Predicted, never measured.
"""

from __future__ import annotations

import functools
import math
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
#: The run the calibration reads: ``tests/gpu/bench_gpu.py --budget 70`` on an NVIDIA H200 (132 SMs), commit af65dea
#: (the general numba-CUDA kernels, before the lean ones and the Triton route), float32, gamma 0.99, lam 0.95;
#: device milliseconds, medians of CUDA events around one call. The 4096x32 row is the run's summary table's.
RUN = "NVIDIA H200, 2026-12-04, commit af65dea, tests/gpu/bench_gpu.py, float32"
MULTIPROCESSORS = 132
CASES = ("constant", "terminated", "dones+mask")
COPY_MS = {(38400, 128): 0.0226, (8192, 1024): 0.0357, (8192, 2048): 0.0668, (8192, 4096): 0.1286,
           (2048, 4096): 0.0351, (16, 524288): 0.0357, (256, 131072): 0.1288, (4096, 32): 0.0022}
#: "gae_xp fused (torch)": the general numba-CUDA kernels (one launch for T <= 2048, else tiles, carry and final).
FUSED_MS = {
    (38400, 128): (0.1628, 0.1874, 0.1954), (8192, 1024): (0.2606, 0.2986, 0.3105),
    (8192, 2048): (0.4967, 0.5671, 0.5932), (8192, 4096): (1.3519, 1.5708, 1.6519),
    (2048, 4096): (0.3643, 0.4197, 0.4449), (16, 524288): (0.3626, 0.4180, 0.4418),
    (256, 131072): (1.3394, 1.5577, 1.6357), (4096, 32): (0.0182, 0.0199, 0.0207)}
#: "triton, program per row": ``tests/gpu/triton_gae.py`` (constant and terminated only).
BASELINE_MS = {
    (38400, 128): (0.0345, 0.0364), (8192, 1024): (0.0394, 0.0506), (8192, 2048): (0.0767, 0.0980),
    (8192, 4096): (0.1620, 0.2063), (2048, 4096): (0.0454, 0.0575), (16, 524288): (0.4928, 0.5463),
    (256, 131072): (0.2091, 0.2303)}
#: The rows the issue rate is fit on (fused and baseline, constant and terminated, at these shapes); the others,
#: dones+mask, 8192x2048, 2048x4096, 16x524288 (few long rows: occupancy) and 4096x32, are held out.
CALIBRATION = {"shapes": ((38400, 128), (8192, 1024), (8192, 4096), (256, 131072)), "cases": ("constant", "terminated")}
#: Held-out rows outside what the model can express (docs/gpu.md says why): the baseline's 16 programs at 16x524288
#: (latency of one program's walk, most SMs idle) and 4096x32 (a 2 MB copy in L2, 64 general blocks for 132 SMs).
OUTSIDE = {((16, 524288), "tests/gpu/triton_gae.py"), ((4096, 32), "fused numba-CUDA (general kernels)")}
#: The largest relative residual (model / measured - 1) the fit may leave on a row it was fit on.
FIT_RESIDUAL = 0.30
#: "The GPU at the copy floor": the shapes, and the device-time targets against a copy of the case's floor bytes.
TARGET_SHAPES = ((38400, 128), (4096, 32), (32768, 128), (8192, 1024), (8192, 4096), (2048, 4096), (256, 131072),
                 (16, 524288))
TRITON_TARGET, TRITON_FEW_ROWS_TARGET, NUMBA_TARGET = 1.25, 1.6, 2.0
DTYPES = {"float32": 4, "bfloat16": 2}


@dataclass(frozen=True)
class Launch:
    """One launch: its kernel, the bytes it moves in device memory and the thread instructions it issues."""

    kernel: str
    bytes: float
    instructions: float


@dataclass(frozen=True)
class Rates:
    """The calibrated machine: bytes a second, thread instructions a second, seconds a launch costs on top, and
    whether a launch's memory traffic and instructions overlap (``max``) or add up (``sum``)."""

    bandwidth: float
    issue: float
    latency: float
    form: str = "max"

    def seconds(self, launches) -> float:
        combine = max if self.form == "max" else lambda a, b: a + b
        return sum(combine(launch.bytes / self.bandwidth, launch.instructions / self.issue) + self.latency
                   for launch in launches)


def floor_bytes(case: str, itemsize: int) -> tuple[int, int]:
    """(read, written) bytes a step: rewards and values read and the flags the case has, advantages and returns
    written."""
    if case not in CASES:
        raise ValueError(f"case must be one of {CASES}, got {case!r}")
    return 2 * itemsize + (case != "constant") + (case == "dones+mask"), 2 * itemsize


# ----------------------------------------------------------------------------------------------- counting the work

@functools.cache
def _tests():
    """``tests/test_cuda_compile.py`` and ``tests/triton_ptx.py`` (their compilations), and the baseline module."""
    import importlib.util

    tests = str(ROOT / "tests")
    if tests not in sys.path:
        sys.path.insert(0, tests)
    import test_cuda_compile
    import triton_ptx

    spec = importlib.util.spec_from_file_location("triton_gae_baseline", ROOT / "tests" / "gpu" / "triton_gae.py")
    baseline = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(baseline)
    return test_cuda_compile, triton_ptx, baseline


def unavailable() -> str | None:
    """Why the kernels cannot be compiled here (one line), or None."""
    from tools import sass, traffic

    reason = traffic.ptx_unavailable()
    if reason is None and sass.ptxas() is None:
        reason = "ptxas not found"
    if reason is None and sass.cuobjdump() is None:
        reason = "cuobjdump not found (Triton's wheel bundles one)"
    if reason is None:
        import importlib.util

        if importlib.util.find_spec("triton") is None:
            reason = "triton is not installed"
    return reason


@functools.cache
def _numba_loops(io: str, spec):
    from tools import sass

    test_cuda_compile, _, _ = _tests()
    return sass.loops(test_cuda_compile.compile_kernel(io, spec, "sm_90")["sass"])


@functools.cache
def _triton_loops(case_key):
    from tools import sass

    _, triton_ptx, _ = _tests()
    case = _triton_case(*case_key)
    return sass.loops(sass.listing(triton_ptx.compile_case(case).asm["cubin"]), scan_loops=False)


def _torch_problem(shape, case: str, io: str):
    """The problem ``prepare`` makes for a case on torch CPU tensors of zeros (16-bit floats kept, as the CUDA
    backends keep them)."""
    from unittest import mock

    import torch

    from gae_xp import _prepare

    dtype = getattr(torch, io)
    arrays = {"rewards": torch.zeros(shape, dtype=dtype), "values": torch.zeros(shape, dtype=dtype)}
    if case != "constant":
        arrays["terminated"] = torch.zeros(shape, dtype=torch.bool)
    if case == "dones+mask":
        arrays["mask"] = torch.ones(shape, dtype=torch.bool)
    with mock.patch.object(_prepare, "_reads_narrow", lambda *args: io != "float32"):
        return _prepare.prepare(**arrays, backend="numba-cuda").problem


@functools.cache
def _factories() -> dict:
    """The kernel factories the model counts, taken before ``numba_launches`` patches them: the general kernels of
    ``_cuda_gae``, and the lean ones on the path of a tile of real steps (``lean_kernel``'s ``rare_paths``)."""
    from gae_xp.backends import _cuda_gae, _cuda_lean

    return {"general": _cuda_gae.forward_kernel, "lean": functools.partial(_cuda_lean.lean_kernel, rare_paths=False)}


@functools.cache
def _kernel_spec(kind: str, io: str, structure):
    """One kernel spec per structure for the whole model, so that each kernel is compiled and counted once
    (``_numba_loops`` keys on the spec; the backend makes a new one per call)."""
    return _factories()[kind](io, structure)


def numba_launches(shape, case: str, io: str = "float32", *, general: bool = False) -> list[Launch]:
    """The numba-CUDA route's launches for a case (``general``: the general kernels for every structure, as the
    measured commit ran them), recorded instead of launched (``tools.traffic.recorded_launches``)."""
    from types import SimpleNamespace
    from unittest import mock

    from gae_xp.backends import _cuda_gae, _cuda_lean, _cuda_plan, numba_cuda
    from tools import sass, traffic

    problem = _torch_problem(shape, case, io)
    _factories()  # the originals, before the patches below
    if general:
        with mock.patch.object(numba_cuda, "lean_serves", lambda p: False), \
                mock.patch.object(_cuda_gae, "forward_kernel", functools.partial(_kernel_spec, "general")):
            recorded = traffic.recorded_launches(problem)
        # traffic.fused_launches gives the general kernels' bytes for a problem with offsets: one sequence a row
        fields = ("rewards", "values", "next_values", "gamma", "lam", "critic_lam", "terminated", "truncated", "mask",
                  "carry", "fill_masked")
        stand_in = SimpleNamespace(**{name: getattr(problem, name, None) for name in fields},
                                   offsets=SimpleNamespace(shape=(2,)))
        moved = traffic.fused_launches(stand_in)
    else:
        with mock.patch.object(_cuda_lean, "lean_kernel", functools.partial(_kernel_spec, "lean")):
            recorded = traffic.recorded_launches(problem)
        moved = traffic.fused_launches(problem)
    if [kernel.name.split("[")[0].split("_")[-1] for kernel, *_ in recorded] != list(moved):
        raise RuntimeError(f"the launches {[k.name for k, *_ in recorded]} are not the traffic model's {list(moved)}")
    launches = []
    for (kernel, blocks, threads, arguments), (streamed, per_tile) in zip(recorded, moved.values()):
        blocks = math.prod(blocks) if isinstance(blocks, tuple) else int(blocks)
        if kernel.name.startswith("carry"):  # a few numbers per tile: bytes, no streamed work
            launches.append(Launch(kernel.name, streamed + per_tile, 0.0))
            continue
        loops = _numba_loops(io, kernel)
        if kernel.name.startswith("lean"):
            _, _, _, chunk_steps, group_bits = dict(arguments)["geometry"]
            walks = -(-chunk_steps // ((1 << group_bits) * _cuda_plan.lean_items(io)))
            per_thread = sass.per_thread(loops, walks, group_bits)
        else:
            per_thread = sass.per_thread(loops, 1, threads.bit_length() - 1)
        launches.append(Launch(kernel.name, streamed + per_tile, blocks * threads * per_thread))
    return launches


def _triton_case(kind: str, case: str, io: str, block: int, warps: int, stages: int, mode: int, blocks: int):
    """A compilation of ``tests/triton_ptx.py``: the route's ``gae_kernel`` (``kind`` "route") or the baseline's
    ``_gae_rows`` (``kind`` "baseline", float32, ``blocks`` blocks a row)."""
    _, triton_ptx, baseline = _tests()
    pointer = {"float32": "fp32", "bfloat16": "bf16"}[io]
    if kind == "route":
        from gae_xp.backends._triton_gae import HOLED

        # finite numbers; the benchmark's mask holes every block
        options = {"HAS_TERMINATED": case != "constant", "HAS_MASK": case == "dones+mask", "MODE": mode,
                   "CHUNKS": 256 if mode else 1, "RARE_PATHS": HOLED if case == "dones+mask" else False}
        return triton_ptx._gae_case(f"{case} {io}", options, 0, dtype=pointer, block=block, warps=warps,
                                    stages=stages)
    function = baseline._gae_rows
    types = {"rewards": "*fp32", "values": "*fp32", "terminated": "*u8" if case != "constant" else "*fp32",
             "advantages": "*fp32", "returns": "*fp32", "length": "i32", "row_stride": "i32", "gamma": "fp32",
             "lam": "fp32"}
    constexprs = {"HAS_DONES": case != "constant", "BLOCK": block, "BLOCKS": blocks}
    return triton_ptx._case(f"baseline {case}", function, types, constexprs, warps=warps, stages=stages,
                            aligned=("rewards", "values", "terminated", "advantages", "returns", "length",
                                     "row_stride"), bytes_per_step=0)


def triton_launches(shape, case: str, io: str = "float32") -> list[Launch]:
    """The Triton route's launches (``_triton_launch._config`` on an H200's 132 SMs): one pass, or for few long
    rows the chunks' maps then the final pass (the inputs read twice)."""
    from gae_xp.backends import _triton_launch
    from tools import sass

    rows, length = shape
    block, warps, stages, chunk, chunks, _ = _triton_launch._config(length, rows, 1, MULTIPROCESSORS,
                                                                    (None,) * len(_triton_launch._SETTINGS))
    read, written = (n * rows * length for n in floor_bytes(case, DTYPES[io]))
    modes = ((1, read), (2, read + written)) if chunks > 1 else ((0, read + written),)
    walks = -(-chunk // block)
    launches = []
    for mode, moved in modes:
        loops = _triton_loops(("route", case, io, block, warps, stages, mode, 0))
        programs = rows * chunks
        launches.append(Launch(f"gae_kernel[MODE={mode}, BLOCK={block}, warps={warps}]", moved,
                               programs * 32 * warps * sass.per_thread(loops, walks, 1)))
    return launches


def baseline_launches(shape, case: str) -> list[Launch]:
    """``tests/gpu/triton_gae.py`` as its ``gae()`` launches it (float32): one program per row."""
    from tools import sass

    _, _, baseline = _tests()
    rows, length = shape
    block = min(baseline.MAX_BLOCK, 1 << max(length - 1, 15).bit_length())
    warps, blocks = (8 if block >= 2048 else 4), -(-length // block)
    loops = _triton_loops(("baseline", case, "float32", block, warps, 3, 0, blocks))
    moved = sum(floor_bytes(case, 4)) * rows * length
    return [Launch(f"_gae_rows[BLOCK={block}, warps={warps}]", moved,
                   rows * 32 * warps * sass.per_thread(loops, blocks, 1))]


def copy_launches(shape) -> list[Launch]:
    """The measured copy: the constant case's floor bytes, one launch."""
    return [Launch("copy", 16 * math.prod(shape), 0.0)]


# ------------------------------------------------------------------------------------------------------- the fit

@dataclass(frozen=True)
class Row:
    """One measured row: what ran, its launches, the measured and the modelled device time (ms)."""

    path: str
    shape: tuple[int, int]
    case: str
    launches: tuple[Launch, ...]
    measured_ms: float
    calibrates: bool
    model_ms: float = math.nan

    @property
    def residual(self) -> float:
        return self.model_ms / self.measured_ms - 1


def measured_rows() -> list[Row]:
    """Every measured row of ``RUN`` with its launches counted (compiles the kernels: minutes on a small CPU)."""
    fit_shapes, fit_cases = CALIBRATION["shapes"], CALIBRATION["cases"]
    rows = [Row("copy", shape, "constant", tuple(copy_launches(shape)), ms, shape in fit_shapes)
            for shape, ms in COPY_MS.items()]
    for shape, times in FUSED_MS.items():
        for case, ms in zip(CASES, times):
            rows.append(Row("fused numba-CUDA (general kernels)", shape, case,
                            tuple(numba_launches(shape, case, general=True)), ms,
                            shape in fit_shapes and case in fit_cases))
    for shape, times in BASELINE_MS.items():
        for case, ms in zip(CASES, times):
            rows.append(Row("tests/gpu/triton_gae.py", shape, case, tuple(baseline_launches(shape, case)), ms,
                            shape in fit_shapes and case in fit_cases))
    return rows


def calibrate(rows: list[Row], form: str = "max") -> Rates:
    """Bandwidth and latency from the copies (least squares), then the issue rate (least squares on log time) from
    the other rows that calibrate."""
    copies = [row for row in rows if row.path == "copy" and row.calibrates]
    design = np.array([[sum(launch.bytes for launch in row.launches), len(row.launches)] for row in copies])
    seconds = np.array([row.measured_ms * 1e-3 for row in copies])
    (per_byte, latency), *_ = np.linalg.lstsq(design, seconds, rcond=None)
    fitted = [row for row in rows if row.path != "copy" and row.calibrates]

    def cost(log_issue: float) -> float:
        rates = Rates(1 / per_byte, math.exp(log_issue), latency, form)
        return sum(math.log(rates.seconds(row.launches) / (row.measured_ms * 1e-3)) ** 2 for row in fitted)

    low, high = math.log(1e11), math.log(1e15)  # golden-section search; the cost is unimodal in log issue
    ratio = (math.sqrt(5) - 1) / 2
    for _ in range(200):
        a, b = high - ratio * (high - low), low + ratio * (high - low)
        low, high = (low, b) if cost(a) < cost(b) else (a, high)
    return Rates(1 / per_byte, math.exp((low + high) / 2), latency, form)


def fit(rows: list[Row] | None = None, form: str = "max") -> tuple[Rates, list[Row]]:
    """The calibrated rates and every measured row with its modelled time."""
    rows = measured_rows() if rows is None else rows
    rates = calibrate(rows, form)
    return rates, [Row(row.path, row.shape, row.case, row.launches, row.measured_ms, row.calibrates,
                       rates.seconds(row.launches) * 1e3) for row in rows]


def choose(rows: list[Row]) -> tuple[Rates, list[Row]]:
    """The form (``max`` or ``sum``) whose fit leaves the smaller root-mean-square log residual on the rows it was
    fit on, its rates and rows."""
    fits = [fit(rows, form) for form in ("max", "sum")]
    return min(fits, key=lambda found: rms([row for row in found[1] if row.calibrates and row.path != "copy"]))


def rms(rows: list[Row]) -> float:
    """Root-mean-square log residual of rows."""
    return math.sqrt(sum(math.log(row.model_ms / row.measured_ms) ** 2 for row in rows) / len(rows))


# ------------------------------------------------------------------------------------------------ the predictions

@dataclass(frozen=True)
class Prediction:
    """One route at one shape, case and dtype: its kernels, predicted time, a copy of the floor bytes, the target."""

    route: str
    shape: tuple[int, int]
    case: str
    io: str
    kernels: str
    instructions_per_step: float
    bytes_per_step: float
    ms: float
    copy_ms: float
    target: float

    @property
    def ratio(self) -> float:
        return self.ms / self.copy_ms


def predictions(rates: Rates) -> list[Prediction]:
    """The Triton route and the numba-CUDA route at every target shape, case and dtype (compiles their kernels)."""
    out = []
    for shape in TARGET_SHAPES:
        elements = math.prod(shape)
        for io, itemsize in DTYPES.items():
            for case in CASES:
                copy = rates.seconds([Launch("copy", sum(floor_bytes(case, itemsize)) * elements, 0.0)]) * 1e3
                for route, launches, target in (
                        ("triton", triton_launches(shape, case, io),
                         TRITON_FEW_ROWS_TARGET if shape == (16, 524288) else TRITON_TARGET),
                        ("numba-cuda", numba_launches(shape, case, io), NUMBA_TARGET)):
                    out.append(Prediction(route, shape, case, io, ", ".join(launch.kernel for launch in launches),
                                          sum(launch.instructions for launch in launches) / elements,
                                          sum(launch.bytes for launch in launches) / elements,
                                          rates.seconds(launches) * 1e3, copy, target))
    return out


# ----------------------------------------------------------------------------------------------------- the tables

def fit_table(rates: Rates, rows: list[Row], other: tuple[Rates, list[Row]]) -> str:
    """Markdown: the calibrated rates, and every measured row with its modelled time and residual."""
    other_rates, other_rows = other
    fitted = [row for row in rows if row.calibrates and row.path != "copy"]
    held = [row for row in rows if not row.calibrates and row.path != "copy"]
    inside = [row for row in held if (row.shape, row.path) not in OUTSIDE]
    lines = [f"Calibrated on {RUN}: bandwidth {rates.bandwidth / 1e12:.2f} TB/s and latency "
             f"{rates.latency * 1e6:.1f} us a launch (the copies), issue rate {rates.issue / 1e12:.1f}e12 thread "
             f"instructions a second, form `{rates.form}` (bytes and instructions "
             f"{'overlapped' if rates.form == 'max' else 'added'}). Root-mean-square residual (of log time, about "
             "the relative one), copies aside: "
             f"{rms(fitted):.0%} on the {len(fitted)} rows fit, {rms(held):.0%} on the {len(held)} held out, "
             f"{rms(inside):.0%} on the {len(inside)} of them the model can express (all but "
             f"{', '.join(sorted({f'{path} at {a}x{b}' for (a, b), path in OUTSIDE}))}); the "
             f"form `{other_rates.form}` leaves "
             f"{rms([row for row in other_rows if row.calibrates and row.path != 'copy']):.0%} on the rows fit "
             f"(issue rate {other_rates.issue / 1e12:.1f}e12).", "",
             "| path | shape | case | fit or held out | launches | thread instructions/step | bytes/step "
             "| measured ms | model ms | residual |", "|---|---|---|---|---|---|---|---|---|---|"]
    for row in rows:
        elements = math.prod(row.shape)
        lines.append(f"| {row.path} | {row.shape[0]}x{row.shape[1]} | {row.case} | "
                     f"{'fit' if row.calibrates else 'held out'} | {len(row.launches)} | "
                     f"{sum(launch.instructions for launch in row.launches) / elements:.0f} | "
                     f"{sum(launch.bytes for launch in row.launches) / elements:.2f} | {row.measured_ms:.4f} | "
                     f"{row.model_ms:.4f} | {row.residual:+.1%} |")
    return "\n".join(lines)


def predictions_table(found: list[Prediction]) -> str:
    """Markdown: every prediction against its target (x a copy of the case's floor bytes)."""
    lines = ["| route | shape | dtype | case | kernels (launches) | thread instructions/step | bytes/step "
             "| predicted ms | predicted copy ms | predicted x copy | target |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for p in found:
        verdict = "within (predicted)" if p.ratio <= p.target else "over (predicted)"
        lines.append(f"| {p.route} | {p.shape[0]}x{p.shape[1]} | {p.io} | {p.case} | {p.kernels} | "
                     f"{p.instructions_per_step:.0f} | {p.bytes_per_step:.2f} | {p.ms:.4f} | {p.copy_ms:.4f} | "
                     f"{p.ratio:.2f}x | <= {p.target:g}x: {verdict} |")
    return "\n".join(lines)


def pages() -> dict[str, str]:
    """The generated tables of docs/gpu.md: ``{"fit": ..., "predictions": ...}``."""
    rows = measured_rows()
    rates, fitted = choose(rows)
    other = fit(rows, "sum" if rates.form == "max" else "max")
    return {"fit": fit_table(rates, fitted, other), "predictions": predictions_table(predictions(rates))}


#: The markers around each generated table in docs/gpu.md.
MARKERS = {name: (f"<!-- cost_model:{name} (python -m tools.cost_model --write) -->", f"<!-- cost_model:{name} end -->")
           for name in ("fit", "predictions")}
DOCUMENT = "docs/gpu.md"


def fill(text: str, tables: dict[str, str]) -> str:
    """``text`` with each table between its markers (``MARKERS``) replaced (``tools.traffic.fill``)."""
    from tools import traffic

    return traffic.fill(text, tables, tables, MARKERS)


def main(argv=None) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="python -m tools.cost_model",
                                     description="The cost model's fit and predictions (predicted, not measured).")
    parser.add_argument("--write", action="store_true", help=f"write them into {DOCUMENT}")
    parser.add_argument("--root", default=".", help="the checkout holding docs/ (default: .)")
    options = parser.parse_args(argv)
    reason = unavailable()
    if reason is not None:
        print(f"{parser.prog}: the model counts the kernels' SASS, which needs triton and {_needs()}: {reason}",
              file=sys.stderr)
        return 1
    tables = pages()
    if not options.write:
        print(tables["fit"])
        print()
        print(tables["predictions"])
        return 0
    path = Path(options.root) / DOCUMENT
    path.write_text(fill(path.read_text(), tables))
    return 0


def _needs() -> str:
    from tools import traffic

    return traffic.PTX_NEEDS


if __name__ == "__main__":
    raise SystemExit(main())
