"""Traffic model: the bytes each path of a ``gae()`` call reads and writes in device memory, and the time the
bandwidth of a GPU predicts from them.

At (B, T) = (256, 131072) a GPU is bound by memory traffic, not arithmetic, so
bytes per element divided by bandwidth predicts the time of a path (launch
latency and host overhead excluded). Two ways to count:

* the generic path (``backend="xp"``) on torch: every aten operator the call
  runs is recorded with a ``TorchDispatchMode`` on CPU tensors, which run the
  same operator sequence as CUDA tensors would (eager torch: each operator is
  at least one kernel launch). Rule: an operator reads each of its tensor
  arguments once and writes each of its tensor results once, with no reuse
  between operators (no fusion). A tensor counts the bytes its view spans, so
  a broadcast (stride 0) counts its stored row once. Views (an operator whose
  schema returns an alias of an input, plus ``_unsafe_view``), allocations
  (``empty*``) and shape queries move nothing. ``fill_``, ``zero_`` and
  ``copy_`` do not read the tensor they overwrite; ``out=`` arguments are
  written, not read. ``_local_scalar_dense`` (``float(t)``, ``bool(t)``) is
  a device-to-host copy and a host synchronization on a GPU: counted apart;
* the fused numba-CUDA path, twice: ``fused_launches``
  states each launch's loads and stores by hand (inputs once per tile launch,
  outputs once, a few numbers per tile), and ``ptx_launches`` reads them from
  the compiled code: each launch's kernel is compiled to PTX for sm_90 and
  run on the CPU, thread by thread, for the first, a middle and the last
  block of its grid (``tools.ptx``); every global load and store is
  attributed to the kernel argument it falls in. Bytes per element are the
  distinct bytes each launch reads and writes (what reaches device memory
  when the caches keep what a block reuses; the middle block stands for every
  block but the first and the last), beside the bytes its instructions
  request and the 32-byte sectors a warp's request touches against the
  fewest its bytes need (coalescing). ``tests/test_traffic.py`` checks the
  two against each other.

``report()`` returns the rows; ``python -m tools.traffic`` prints the tables of the README and
docs/gpu.md (``tests/test_traffic.py`` checks that the committed pages hold them).
"""

from __future__ import annotations

import importlib.util
import inspect
import math
import os
import sys
from dataclasses import dataclass
from types import SimpleNamespace

import numpy as np

import gae_xp
from gae_xp.backends import _cuda_plan, numba_cuda

#: Bandwidth of an NVIDIA H200 (HBM3e), bytes per second.
H200_BANDWIDTH = 4.8e12
#: The shape the figures are predicted for, and the shape the generic path is recorded at: the same T (the
#: hierarchy of chunk levels depends on it), fewer rows (every operator is whole-array: bytes scale with B).
SHAPE = (256, 131072)
RECORD_SHAPE = (4, 131072)
CASES = ("constant", "dones+mask")
#: Read rewards and values once, write advantages and returns once (float32).
FLOOR_BYTES = 16
#: The target the PTX is compiled for (sm_90: H100, H200).
PTX_TARGET = (9, 0)
#: What the arrays hold while the PTX runs: every step real, nothing cut (the path with the most reads).
PTX_FILL = {"terminated": lambda index: False, "truncated": lambda index: False, "mask": lambda index: True}

_NO_TRAFFIC = {"_unsafe_view", "empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided",
               "sym_size", "sym_stride", "sym_numel", "sym_storage_offset", "is_same_size"}
_OVERWRITES_SELF = {"fill_", "zero_", "copy_"}


@dataclass(frozen=True)
class Row:
    """One path on one case: its launches (operators), bytes per element and predicted time at ``SHAPE``."""

    path: str
    case: str
    launches: int
    bytes_per_element: float
    predicted_ms: float
    host_syncs: int = 0
    #: bytes per element of the element-proportional part alone (the fused path also moves a few per tile).
    streamed_per_element: float | None = None


def case_arrays(case: str, shape, dtype=np.float32, seed: int = 0) -> dict:
    """gae() keyword arguments as NumPy arrays: ``constant`` (rewards, values) or ``dones+mask`` (plus
    terminated with probability 0.01 per step and a mask with 20 % holes)."""
    if case not in CASES:
        raise ValueError(f"case must be one of {CASES}, got {case!r}")
    rng = np.random.default_rng(seed)
    arrays = {"rewards": rng.standard_normal(shape).astype(dtype), "values": rng.standard_normal(shape).astype(dtype)}
    if case == "dones+mask":
        arrays["terminated"] = rng.random(shape) < 0.01
        arrays["mask"] = rng.random(shape) >= 0.2
    return arrays


def record_torch(call) -> tuple[int, int, int]:
    """(operators that move data, bytes they read and write, host synchronizations) of ``call()`` on torch."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_leaves

    totals = [0, 0, 0]

    class Recorder(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            out = func(*args, **kwargs)
            name = func.overloadpacket.__name__
            if name == "_local_scalar_dense":
                totals[2] += 1
            elif not func.is_view and name not in _NO_TRAFFIC:
                inputs = tree_leaves((args[1:] if name in _OVERWRITES_SELF else args,
                                      {k: v for k, v in kwargs.items() if k != "out"}))
                moved = sum(_span(t) for t in inputs if isinstance(t, torch.Tensor))
                moved += sum(_span(t) for t in tree_leaves(out) if isinstance(t, torch.Tensor))
                totals[0] += 1
                totals[1] += moved
            return out

    with Recorder():
        call()
    return totals[0], totals[1], totals[2]


def _span(tensor) -> int:
    """Bytes a tensor's view spans (stride-0 axes count once)."""
    if tensor.numel() == 0:
        return 0
    elements = 1 + sum((n - 1) * abs(s) for n, s in zip(tensor.shape, tensor.stride()))
    return min(elements, tensor.numel()) * tensor.element_size()


def generic_rows(case: str, *, shape=SHAPE, record_shape=RECORD_SHAPE, bandwidth=H200_BANDWIDTH) -> list[Row]:
    """The generic path recorded on torch CPU tensors, on the route it takes on a GPU.

    On a GPU the generic path never reads a value back to the host (a
    finiteness check would synchronise), so it takes its exact route: with a
    constant discount, the matmul on the finite part plus the serial loop's
    non-finite pattern; with dones and a mask, the doubling local scan with
    ``where`` at the cuts. The call is recorded warm (after one call: what is
    cached, the chunk kernel, is not rebuilt). The recording runs with the arrays taken as device
    arrays (``_compat.on_cpu`` answering False), so that CPU tensors follow
    that same operator sequence.
    """
    from unittest import mock

    import torch

    from gae_xp import _compat

    arrays = {k: torch.from_numpy(v) for k, v in case_arrays(case, record_shape).items()}
    with mock.patch.object(_compat, "on_cpu", lambda x: False):
        # a warm call first: what a trainer's every later call runs (the chunk kernel is cached by then)
        gae_xp.gae(**arrays, backend="xp")
        launches, moved, syncs = record_torch(lambda: gae_xp.gae(**arrays, backend="xp"))
    per_element = moved / math.prod(record_shape)
    return [Row("xp (generic, on a GPU's route)", case, launches, per_element, _ms(per_element, shape, bandwidth),
                syncs)]


def fused_row(case: str, *, shape=SHAPE, bandwidth=H200_BANDWIDTH, itemsize: int = 4) -> Row:
    """The fused numba-CUDA path from ``fused_launches`` (no GPU needed: shapes and dtypes only)."""
    def spec(dtype):
        dtype = np.dtype(dtype)
        strides = (shape[1] * dtype.itemsize, dtype.itemsize)
        return SimpleNamespace(shape=shape, dtype=dtype, strides=strides)

    data = spec(f"f{itemsize}")
    flags = case == "dones+mask"
    problem = SimpleNamespace(rewards=data, values=data, next_values=None, gamma=0.99, lam=0.95,
                              terminated=spec(bool) if flags else None, truncated=None,
                              mask=spec(bool) if flags else None, fill_masked=False)
    launches = fused_launches(problem)
    elements = math.prod(shape)
    streamed = sum(part for part, _ in launches.values()) / elements
    total = sum(part + tiles for part, tiles in launches.values()) / elements
    return Row("numba-cuda (fused)", case, len(launches), total, _ms(total, shape, bandwidth), 0, streamed)


def fused_launches(problem, family: str = "gae") -> dict[str, tuple[int, int]]:
    """Bytes that each launch of a call moves in device memory, from the kernels' code.

    ``{launch: (streamed, per_tile)}``, read plus written, launches named
    ``tiles`` (1), ``carry`` (2) and ``final`` (3); a row that fits a tile has
    ``final`` only. A ``gae`` problem the lean kernels serve has ``final``, or
    ``maps`` then ``final`` (``_lean_traffic``). ``streamed`` grows with the elements: every per-step input
    once per tile launch (an array counts the bytes its view spans, so a
    per-step gamma broadcast over rows counts one row; a bool flag one byte a
    step), the outputs once. ``per_tile`` is a few numbers per tile: launch 1
    writes each tile's map (its live slots, see ``_cuda_kernels.Fields``),
    launch 2 reads them and writes the maps entering the tiles, launch 3 reads
    those and the boundary values (bootstrap, carry) of the segments it
    resets. ``family`` is "gae", "vtrace", "lambda", "returns" (a problem of
    ``gae_xp._problem.GaeProblem``'s fields; V-trace's log-ratios and
    lambda's V' count as one more array like rewards) or "adjoint"
    (``gae_backward``: two upstream gradients in, the gradients out; rewards
    and values are not read). ``problem`` needs shapes, dtypes and strides
    only (NumPy arrays or stand-ins will do; absent fields count as None).
    """
    r = problem.rewards
    length, rows = r.shape[-1], math.prod(r.shape[:-1])
    item = r.dtype.itemsize
    compute = 8 if item == 8 else 4
    field = {name: getattr(problem, name, None) for name in ("values", "next_values", "gamma", "lam", "critic_lam",
                                                           "terminated", "truncated", "mask", "offsets", "carry")}
    per_step = ("gamma", "lam", "terminated", "truncated", "mask")
    if family == "adjoint":
        read = 2 * _stored_bytes(r)
        outputs = (2 + (field["next_values"] is not None)) * rows * length * item
    else:
        read = _stored_bytes(r) * (1 + (family in ("vtrace", "lambda")))
        per_step += ("values", "next_values", "critic_lam") if family in ("gae", "vtrace") else ()
        outputs = (2 if family in ("gae", "vtrace") else 1) * rows * length * item
    read += sum(_stored_bytes(field[name]) for name in per_step
                if field[name] is not None and not isinstance(field[name], float))
    if family == "gae" and numba_cuda.lean_serves(problem):
        return _lean_traffic(rows, length, item, compute, read, outputs, field["mask"] is not None
                             and field["next_values"] is None)
    p = _cuda_plan.plan(rows, length, threads=256, items=8, warp=32, carry_threads=128)
    segments = 1 if field["offsets"] is None else field["offsets"].shape[0] - 1
    bounds = {"gae": 1 + (field["carry"] is not None), "vtrace": 1, "returns": 1}.get(family, 0)
    boundary = (bounds + (family == "adjoint") * (1 + (field["carry"] is not None))) * rows * segments * compute
    if not p.long_rows:
        return {"final": (read + outputs, boundary)}
    if family == "adjoint":
        value_chain, critic = field["next_values"] is None, False
    else:
        value_chain = family in ("gae", "vtrace") and field["next_values"] is None or (
            family == "lambda" and field["mask"] is not None)
        critic = family == "gae" and field["critic_lam"] is not None
    maps = p.tiles * len(_cuda_plan.Fields(value_chain, critic, True).live()) * compute
    return {"tiles": (read, maps), "carry": (0, 2 * maps),
            "final": (read + outputs, maps + boundary + bounds * p.tiles * compute)}


def _lean_traffic(rows: int, length: int, item: int, compute: int, read: int, outputs: int,
                  value_chain: bool) -> dict:
    """``fused_launches`` of a problem the lean kernels serve (``numba_cuda.lean_serves``): ``final`` alone, or
    ``maps`` then ``final`` for rows cut into chunks. Per row, every chunk but the last reads the value after it,
    the last the bootstrap value (with the value chain, ``final``'s chunks read the bootstrap value, ``maps``
    none); ``maps`` writes its numbers per chunk (``_cuda_plan.lean_map_rows``), and ``final``'s chunk k reads
    those of the chunks after it (K (K - 1) / 2 maps a row, from L2)."""
    chunks = _lean_traffic_plan(rows, length, item).chunks
    edges = rows * (chunks * compute if value_chain else (chunks - 1) * item + compute)
    if chunks == 1:
        return {"final": (read + outputs, edges)}
    numbers = _cuda_plan.lean_map_rows(value_chain)
    return {"maps": (read, (0 if value_chain else edges) + rows * chunks * numbers * compute),
            "final": (read + outputs, edges + rows * chunks * (chunks - 1) // 2 * numbers * compute)}


def _lean_traffic_plan(rows: int, length: int, item: int) -> _cuda_plan.LeanPlan:
    """The lean plan on a GPU (the simulator's constants are tiny), for an io dtype of ``item`` bytes."""
    return _cuda_plan.lean_plan(rows, length, threads=128, items=4 if item == 8 else 8, fill_blocks=1024)


def _stored_bytes(array) -> int:
    """Bytes an array's view spans (a broadcast axis, stride 0, counts once); numel * itemsize without strides."""
    item = array.dtype.itemsize
    strides = getattr(array, "strides", None)
    if strides is None or any(n == 0 for n in array.shape):
        return math.prod(array.shape) * item
    span = item + sum((n - 1) * abs(s) for n, s in zip(array.shape, strides))
    return min(span, math.prod(array.shape) * item)


@dataclass(frozen=True)
class LaunchTraffic:
    """One launch of the fused path as its PTX runs it: per kernel argument, the distinct bytes read and
    written over the launch, the bytes its instructions request, their widths, and the sectors per warp
    request against the fewest its bytes need."""

    kernel: str
    blocks: int
    threads: int
    elements: int
    read: dict[str, int]
    written: dict[str, int]
    requested: dict[str, int]
    widths: dict[str, tuple[int, ...]]
    sectors: dict[str, tuple[float, float]]

    @property
    def bytes_per_element(self) -> float:
        return (sum(self.read.values()) + sum(self.written.values())) / self.elements


class LaunchRecorder:
    """Stands in for ``numba_cuda._Launch``: arrays pass through, and every launch is recorded in ``launches`` as
    ``(kernel, blocks, threads, args)`` instead of run."""

    stream = 0
    launches: list = []

    def __init__(self, like):
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def array(self, array, *, written=False):
        return array

    def record(self):
        return None

    def wait(self, event):
        pass

    def __call__(self, kernel, blocks, threads, *args):
        LaunchRecorder.launches.append((kernel, blocks, threads, args))


def recorded_launches(problem) -> list[tuple]:
    """``(kernel spec, blocks, threads, [(argument name, value), ...])`` for every launch that the fused
    backend makes for ``problem`` (NumPy arrays), recorded instead of launched: no GPU, nothing compiled."""
    from unittest import mock

    LaunchRecorder.launches = []
    caches = [numba_cuda._compiled, numba_cuda._carry, numba_cuda._forward_kernels, numba_cuda._lean_kernels]
    for cache in caches:
        cache.cache_clear()
    try:
        with mock.patch.object(numba_cuda, "_Launch", LaunchRecorder), \
                mock.patch.object(numba_cuda, "_jit", lambda spec: spec):
            numba_cuda.BACKEND.gae(problem, chunk_size=None)
    finally:
        for cache in caches:
            cache.cache_clear()  # the next real call compiles its kernels, not these specs
    return [(kernel, blocks, threads, list(zip(inspect.signature(kernel.function).parameters, args)))
            for kernel, blocks, threads, args in LaunchRecorder.launches]


def ptx_launches(case: str, *, length: int = SHAPE[1], dtype=np.float32, samples: str = "edges") -> list[LaunchTraffic]:
    """The fused path's launches for one row of ``length`` steps, read from their PTX (see the module's
    docstring). ``samples="edges"`` runs the grid's first, a middle and its last block (the middle one counted
    for every other block); ``"middle"`` the middle block alone, counted for every block (faster, for tests)."""
    from gae_xp import _prepare
    from tools import ptx

    arrays = case_arrays(case, (1, length), dtype)
    problem = _prepare.prepare(**arrays, backend="numba-cuda").problem
    out = []
    for spec, blocks, threads, arguments in recorded_launches(problem):
        source = _compile_ptx(spec)
        program = ptx.load(source, arguments, fill=PTX_FILL)
        blocks, threads = math.prod(blocks) if isinstance(blocks, tuple) else int(blocks), int(threads)
        middle = blocks // 2
        weights = {middle: blocks} if samples == "middle" or blocks == 1 else \
            {0: 1, blocks - 1: 1} if blocks == 2 else {0: 1, middle: blocks - 2, blocks - 1: 1}
        read, written, requested, widths, sectors = {}, {}, {}, {}, {}
        for block, weight in weights.items():
            accesses = ptx.run_block(program, (block, 0, 0), (threads, 1, 1), (blocks, 1, 1))
            for name, row in ptx.bytes_by_argument(accesses).items():
                read[name] = read.get(name, 0) + weight * row["read"]
                written[name] = written.get(name, 0) + weight * row["written"]
                requested[name] = requested.get(name, 0) + weight * row["requested"]
                widths[name] = tuple(sorted(set(widths.get(name, ())) | set(row["widths"])))
            if block == middle:
                sectors = ptx.sectors_per_request(accesses)
        out.append(LaunchTraffic(spec.name, blocks, threads, length, read, written, requested, widths, sectors))
    return out


#: What the PTX tables need, for the message that says it is missing.
PTX_NEEDS = 'numba-cuda with the CUDA toolkit wheels (pip install "numba-cuda[cu12]")'


def ptx_unavailable() -> str | None:
    """Why the kernels' PTX cannot be compiled here (one line), or None: compiling needs numba-cuda with the CUDA
    toolkit's NVVM and runtime (``PTX_NEEDS``), and the CUDA simulator has no compiler. A one-line kernel is
    compiled to find out."""
    if os.environ.get("NUMBA_ENABLE_CUDASIM") == "1":
        return "compile_ptx does not exist in the CUDA simulator (NUMBA_ENABLE_CUDASIM=1)"
    if importlib.util.find_spec("numba") is None or importlib.util.find_spec("numba.cuda") is None:
        return "numba-cuda is not installed"
    try:
        from gae_xp.backends import _cuda_import

        _cuda_import.compile_ptx(lambda out: None, "void(float32[:])", PTX_TARGET)
    except Exception as error:  # the toolkit's loader raises its own types (cuda.pathfinder's DynamicLibNotFoundError)
        lines = str(error).strip().splitlines()
        return f"compiling a kernel failed here ({type(error).__name__}: {lines[0] if lines else 'no message'})"
    return None


def _compile_ptx(spec) -> str:
    return _ptx_cache(spec.name, str(spec.signature), spec)


_PTX_CACHE: dict[tuple[str, str], str] = {}


def _ptx_cache(name: str, signature: str, spec) -> str:
    if (name, signature) not in _PTX_CACHE:
        from gae_xp.backends import _cuda_import

        _PTX_CACHE[name, signature] = _cuda_import.compile_ptx(spec.function, spec.signature, PTX_TARGET)
    return _PTX_CACHE[name, signature]


def ptx_row(case: str, *, shape=SHAPE, bandwidth=H200_BANDWIDTH, samples: str = "edges",
            launches: list[LaunchTraffic] | None = None) -> Row:
    """The fused path's row, its bytes read from the PTX (one row of T = ``shape[1]``: per element, rows do not
    change it); ``launches`` from ``ptx_launches`` if already read."""
    launches = launches or ptx_launches(case, length=shape[1], samples=samples)
    total = sum(launch.bytes_per_element for launch in launches)
    return Row("numba-cuda (fused), read from the PTX", case, len(launches), total, _ms(total, shape, bandwidth))


def report(*, shape=SHAPE, record_shape=RECORD_SHAPE, cases=CASES, bandwidth=H200_BANDWIDTH,
           generic: bool = True, from_ptx: bool | dict = False) -> list[Row]:
    """Rows for every path and case (float32): the floor, the fused path (by hand and, with ``from_ptx``, read
    from its PTX: a dict of ``ptx_launches`` per case if already read) and, with torch installed and ``generic``,
    the generic path. Times are predictions at ``bandwidth``, not measurements."""
    rows = []
    for case in cases:
        rows.append(Row("floor: read r, V; write A, R", case, 1, FLOOR_BYTES, _ms(FLOOR_BYTES, shape, bandwidth)))
        rows.append(fused_row(case, shape=shape, bandwidth=bandwidth))
        if from_ptx:
            launches = from_ptx.get(case) if isinstance(from_ptx, dict) else None
            rows.append(ptx_row(case, shape=shape, bandwidth=bandwidth, launches=launches))
        if generic:
            rows.extend(generic_rows(case, shape=shape, record_shape=record_shape, bandwidth=bandwidth))
    return rows


def _ms(per_element: float, shape, bandwidth: float) -> float:
    return per_element * math.prod(shape) / bandwidth * 1e3


def markdown(rows: list[Row], *, shape=SHAPE, bandwidth=H200_BANDWIDTH) -> str:
    """The rows as a markdown table."""
    lines = [f"Predicted at B={shape[0]}, T={shape[1]}, float32, {bandwidth / 1e12:g} TB/s (traffic model, "
             "not a measurement)", "",
             "| path | case | launches (operators) | bytes/element | predicted time (ms) | host syncs |",
             "|---|---|---|---|---|---|"]
    for row in rows:
        lines.append(f"| {row.path} | {row.case} | {row.launches} | {row.bytes_per_element:.2f} | "
                     f"{row.predicted_ms:.3f} | {row.host_syncs} |")
    return "\n".join(lines)


def ptx_markdown(launches_by_case: dict[str, list[LaunchTraffic]]) -> str:
    """Per launch and argument: bytes per element read and written (distinct), requested by the instructions,
    access widths, and sectors per warp request against the fewest."""
    lines = ["| case | launch | blocks x threads | argument | bytes/element | requested | widths (B) "
             "| sectors per warp request (fewest) |", "|---|---|---|---|---|---|---|---|"]
    for case, launches in launches_by_case.items():
        for launch in launches:
            for name in sorted(set(launch.read) | set(launch.written)):
                moved = (launch.read.get(name, 0) + launch.written.get(name, 0)) / launch.elements
                sectors, fewest = launch.sectors.get(name, (0.0, 0.0))
                lines.append(f"| {case} | {launch.kernel} | {launch.blocks} x {launch.threads} | {name} | "
                             f"{moved:.4f} | {launch.requested[name] / launch.elements:.4f} | "
                             f"{', '.join(map(str, launch.widths[name]))} | {sectors:.1f} ({fewest:.1f}) |")
    return "\n".join(lines)


def pages(*, shape=SHAPE, record_shape=RECORD_SHAPE, bandwidth=H200_BANDWIDTH) -> dict[str, str]:
    """The generated tables of the README and docs/gpu.md: ``{"summary": ..., "ptx": ...}``."""
    launches = {case: ptx_launches(case, length=shape[1]) for case in CASES}
    rows = report(shape=shape, record_shape=record_shape, bandwidth=bandwidth, from_ptx=launches)
    return {"summary": markdown(rows, shape=shape, bandwidth=bandwidth), "ptx": ptx_markdown(launches)}


#: The markers around each generated table in the README and docs/gpu.md.
MARKERS = {name: (f"<!-- traffic:{name} (python -m tools.traffic --write) -->", f"<!-- traffic:{name} end -->")
           for name in ("summary", "ptx")}
DOCUMENTS = {"README.md": ("summary",), "docs/gpu.md": ("summary", "ptx")}


def fill(text: str, tables: dict[str, str], names, markers: dict[str, tuple[str, str]] = MARKERS) -> str:
    """``text`` with each named table between its markers (``markers[name]``: begin, end) replaced by
    ``tables[name]``."""
    for name in names:
        begin, end = markers[name]
        if begin not in text or end not in text:
            raise ValueError(f"the markers of the {name!r} table are missing")
        head, rest = text.split(begin, 1)
        _, tail = rest.split(end, 1)
        text = f"{head}{begin}\n{tables[name]}\n{end}{tail}"
    return text


def main(argv=None) -> int:
    import argparse
    from pathlib import Path

    parser = argparse.ArgumentParser(prog="python -m tools.traffic",
                                     description="The traffic model's tables (predicted, not measured).")
    parser.add_argument("--write", action="store_true", help="write them into README.md and docs/gpu.md")
    parser.add_argument("--root", default=".", help="the checkout holding README.md and docs/ (default: .)")
    options = parser.parse_args(argv)
    reason = ptx_unavailable()
    if reason is not None:
        print(f"{parser.prog}: the tables read the kernels' PTX, which needs {PTX_NEEDS}: {reason}", file=sys.stderr)
        return 1
    tables = pages()
    if not options.write:
        print(tables["summary"])
        print()
        print(tables["ptx"])
        return 0
    for document, names in DOCUMENTS.items():
        path = Path(options.root) / document
        path.write_text(fill(path.read_text(), tables, names))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
