"""The tables of docs/gpu.md's design part, generated from the code (no GPU involved).

    python docs/gpu_tables.py traffic      # launches and bytes per element per case (tools.traffic.fused_launches)
    python docs/gpu_tables.py arguments    # arrays, absent arrays and scalars per launch (the kernels' signatures)
    python docs/gpu_tables.py registers    # registers and shared memory per kernel (ptxas, numba-cuda[cu12])
    python docs/gpu_tables.py groups       # group_advantages' moments: launches and bytes per score per layout
    python docs/gpu_tables.py host         # Python-side microseconds of a call up to its launches (this CPU)
    python docs/gpu_tables.py launch       # ... up to the driver call: numba's launcher's part, the driver launch
    python docs/gpu_tables.py full         # a repeated call at the trainer's shapes: host (here) + device (model)
    python docs/gpu_tables.py --write traffic arguments   # the same, written into docs/gpu.md between its markers

``traffic``, ``arguments`` and ``groups`` (torch records the route) are deterministic (``check()`` compares
them with the page); ``registers`` takes the compile test's time; ``host`` is a timing.

``arguments`` and ``host`` run the backend with its launches recorded instead
of made (``tools.traffic.LaunchRecorder``): every array view, plan and kernel choice happens as on
a GPU; numba's own marshalling of the arguments and the driver call do not.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import math
import re
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np

#: The clone's root: the developer tools (``tools/``) live there, not in the installed package.
ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.append(str(ROOT))

from tools.driver import driven  # noqa: E402 (found through ROOT)
from tools.traffic import LaunchRecorder as Recorder  # noqa: E402

SHAPE = (256, 131072)
BANDWIDTH = 4.8e12  # an H200's HBM3e, bytes per second


def _spec(shape, dtype):
    dtype = np.dtype(dtype)
    strides = tuple(int(np.prod(shape[i + 1:])) * dtype.itemsize for i in range(len(shape)))
    return SimpleNamespace(shape=shape, dtype=dtype, strides=strides)


def traffic_cases():
    """(case, family, problem stand-in): the cases issue 18 and 19 name."""
    f32, f16, flags = (functools.partial(_spec, dtype=dtype) for dtype in (np.float32, np.float16, np.bool_))
    packed = (1, 2**20)
    offsets = SimpleNamespace(shape=(1025,))
    short = (32768, 32)
    return [
        ("constant", "gae", dict(rewards=f32(SHAPE), values=f32(SHAPE))),
        ("dones+mask", "gae", dict(rewards=f32(SHAPE), values=f32(SHAPE), terminated=flags(SHAPE), mask=flags(SHAPE))),
        ("packed: 1024 sequences, 2^20 tokens", "gae", dict(rewards=f32(packed), values=f32(packed), offsets=offsets)),
        ("CP shard: summary, all-gather, fix-up", "gae", dict(rewards=f32(SHAPE), values=f32(SHAPE))),
        ("critic_lam (a float)", "gae", dict(rewards=f32(SHAPE), values=f32(SHAPE), critic_lam=1.0)),
        ("16-bit (bfloat16, float16) in and out, constant", "gae", dict(rewards=f16(SHAPE), values=f16(SHAPE))),
        ("V-trace", "vtrace", dict(rewards=f32(SHAPE), values=f32(SHAPE))),
        ("lambda-returns", "lambda", dict(rewards=f32(SHAPE))),
        ("discounted returns", "returns", dict(rewards=f32(SHAPE))),
        ("backward (gae_backward), constant", "adjoint", dict(rewards=f32(SHAPE), values=f32(SHAPE))),
        ("short rows: 32768 x 32, constant", "gae", dict(rewards=f32(short), values=f32(short))),
    ]


def traffic_table() -> str:
    from tools.traffic import fused_launches

    base = None
    lines = ["| case | shape | launches | bytes/element | x the padded constant case | predicted ms at 4.8 TB/s |",
             "|---|---|---|---|---|---|"]
    for case, family, fields in traffic_cases():
        problem = SimpleNamespace(**fields)
        launches = fused_launches(problem, family)
        elements = math.prod(problem.rewards.shape)
        per_element = sum(a + b for a, b in launches.values()) / elements
        base = base or per_element
        shape = " x ".join(str(n) for n in problem.rewards.shape)
        lines.append(f"| {case} | {shape} | {len(launches)} | {per_element:.2f} | {per_element / base:.2f} | "
                     f"{per_element * elements / BANDWIDTH * 1e3:.3f} |")
    return "\n".join(lines)


@contextlib.contextmanager
def recorded():
    """The backend with its kernels named instead of compiled and its launches recorded."""
    from unittest import mock

    from gae_xp.backends import numba_cuda

    def compiled(module, io, structure):
        return f"{structure.name}"

    def carry(io, value_chain, critic, reverse, complete):
        from gae_xp.backends._cuda_kernels import Fields

        live = Fields(value_chain, critic, True).live()
        return "carry[" + ",".join((*live, "reverse" if reverse else "forward", *(["summaries"] if complete else [])))\
            + "]"

    def clear():  # the kernel choices cached with names in them, or with compiled kernels where names are wanted
        numba_cuda._forward_kernels.cache_clear()
        numba_cuda._lean_kernels.cache_clear()

    Recorder.launches = []
    clear()
    with mock.patch.object(numba_cuda, "_Launch", Recorder), mock.patch.object(numba_cuda, "_compiled", compiled), \
            mock.patch.object(numba_cuda, "_carry", carry):
        yield
    clear()


def _problem(xp, shape, dones_mask: bool, dtype=np.float32):
    from gae_xp import _prepare

    rng = np.random.default_rng(0)
    case = {"rewards": rng.standard_normal(shape).astype(dtype), "values": rng.standard_normal(shape).astype(dtype)}
    if dones_mask:
        case["terminated"] = rng.random(shape) < 0.01
        case["mask"] = rng.random(shape) > 0.2
    case = {k: xp.asarray(v) for k, v in case.items()}
    return case, _prepare.prepare(**case, backend="xp").problem


def arguments_table() -> str:
    from gae_xp.backends import numba_cuda

    lines = ["| case | launch | arrays | absent (None) | scalars and tuples |", "|---|---|---|---|---|"]
    for case, shape, dones_mask in (("plain", (256, 131072), False), ("dones+mask", (256, 131072), True),
                                    ("plain, short rows", (4096, 64), False),
                                    ("dones+mask, short rows", (4096, 64), True)):
        _, p = _problem(np, (2, shape[1]), dones_mask)
        with recorded():
            numba_cuda.BACKEND.gae(p)
            for kernel, _, _, args in Recorder.launches:
                arrays = sum(isinstance(a, np.ndarray) for a in args)
                absent = sum(a is None for a in args)
                lines.append(f"| {case} | `{kernel}` | {arrays} | {absent} | {len(args) - arrays - absent} |")
    return "\n".join(lines)


def host_table(repeat: int = 2000) -> str:
    """Microseconds of Python per call up to the launches (torch CPU tensors stand in for CUDA ones: the same
    views and checks), median of ``repeat`` calls after a warm-up: ``prepare`` (the checks, on the generic route),
    and the backend (views, plan, structures, scratch arrays) with its launches recorded."""
    import torch

    from gae_xp import _prepare
    from gae_xp.backends import numba_cuda

    lines = ["| case (torch CPU stand-ins) | prepare (us) | backend up to the launches (us) | launches |",
             "|---|---|---|---|"]
    for case, shape, dones_mask in (("plain, 4096 x 32", (4096, 32), False),
                                    ("dones+mask, 4096 x 32", (4096, 32), True),
                                    ("plain, 256 x 131072", (256, 131072), False)):
        arrays, p = _problem(torch, shape, dones_mask)
        prepare_times, backend_times = [], []
        with recorded():
            for _ in range(repeat):
                start = time.perf_counter()
                _prepare.prepare(**arrays, backend="xp")
                middle = time.perf_counter()
                numba_cuda.BACKEND.gae(p)
                prepare_times.append(middle - start)
                backend_times.append(time.perf_counter() - middle)
            launches = len(Recorder.launches) // repeat
        lines.append(f"| {case} | {np.median(prepare_times) * 1e6:.1f} | {np.median(backend_times) * 1e6:.1f} | "
                     f"{launches} |")
    return "\n".join(lines)


def _numba_flattening(recorded_launches, item: int):
    """A function that flattens the recorded launches' arguments as numba-cuda's launcher does
    (``_Kernel._prepare_args`` with the backend's extension, then cuda.core's ``ParamHolder``, as its ``launch``
    does before the driver call), arrays given as what numba reads of a device array."""
    from cuda.core._kernel_arg_handler import ParamHolder
    from numba.cuda.cudadrv import devicearray
    from numba.cuda.dispatcher import _Kernel

    from gae_xp.backends import numba_cuda

    class Kernel:
        extensions = numba_cuda._EXTENSIONS
        _prepare_args = _Kernel._prepare_args

    def device(a):
        strides = tuple(int(s) * item for s in a.stride())
        view = devicearray._StridedMemoryViewShim(
            ptr=a.data_ptr(), shape=tuple(a.shape), dtype=np.dtype(np.float32), size=a.numel(),
            _layout=devicearray._StridedLayoutShim(strides_in_bytes=strides, is_contiguous_c=False,
                                                   is_contiguous_f=False, is_contiguous_any=False))
        return SimpleNamespace(__cuda_memory__=True, _strided_memory_view_shim=view)

    launches = [(spec.signature.args, [device(a) if hasattr(a, "data_ptr") else a for a in args])
                for spec, _, _, args in recorded_launches]
    kernel = Kernel()

    def flatten():
        for argtypes, args in launches:
            kernelargs: list = []
            for ty, value in zip(argtypes, args):
                kernel._prepare_args(ty, value, 0, [], kernelargs)
            ParamHolder(kernelargs)

    return flatten


def _repeated_call(arrays: dict):
    """A repeated ``gae_xp.gae()`` call on these arrays with ``backend="numba-cuda"``, as a trainer makes it: the
    first call (made here) leaves its plan in the cache, and each later one is the key, the lookup and the plan
    (``BoundLayoutPlan``: the first call's checked problem with the arrays bound in). Under ``driven()``."""
    import gae_xp
    from gae_xp import _plans

    r, v, terminated, mask = arrays["rewards"], arrays["values"], arrays.get("terminated"), arrays.get("mask")
    _plans.PLANS.clear()

    def call():
        return gae_xp.gae(r, v, gamma=0.99, lam=0.95, terminated=terminated, mask=mask, backend="numba-cuda")

    call()
    return call


def _fastest(function, batches: int, calls: int) -> float:
    """Microseconds of the calling thread's CPU time (``time.thread_time``: not the time other work on a busy
    machine holds the core) per call of ``function``: the mean of ``calls`` calls in the fastest of ``batches``
    batches, after one call."""
    function()
    best = math.inf
    for _ in range(batches):
        start = time.thread_time()
        for _ in range(calls):
            function()
        best = min(best, (time.thread_time() - start) / calls)
    return best * 1e6


def launch_table(batches: int = 30, calls: int = 100) -> str:
    """Microseconds of Python per call up to the driver call, torch CPU tensors standing in for CUDA ones: the
    calling thread's CPU time (``time.thread_time``: not the time other work on a busy machine holds the core)
    per call, the mean of ``calls`` calls in the fastest of ``batches`` batches: ``prepare``; the backend up to
    its launches (recorded); numba's launcher's flattening of those launches' arguments (the part of its
    per-call work that runs without a GPU: its per-argument typing, its device-array objects and cuda.core's
    launch call are not included); the backend through
    ``_cuda_launch`` (descriptors, packing) up to a stand-in ``cuLaunchKernel``; and a repeated ``gae()`` call, the
    whole public call, served by its plan (``_repeated_call``) through the same launch."""
    import torch

    from gae_xp import _prepare
    from gae_xp.backends import numba_cuda
    from tools.traffic import recorded_launches

    def fastest(function):
        return _fastest(function, batches, calls)

    lines = ["| case (torch CPU stand-ins) | prepare | backend, launches recorded | + numba's argument flattening "
             "(lower bound) | = before (numba's launcher, lower bound) | backend through the driver launch "
             "(stand-in driver) | = after | a repeated `gae()` call served by its plan, through the driver launch | "
             "launches |", "|---|---|---|---|---|---|---|---|---|"]
    for case, shape, dones_mask in (("plain, 4096 x 32", (4096, 32), False),
                                    ("dones+mask, 4096 x 32", (4096, 32), True),
                                    ("plain, 256 x 131072", (256, 131072), False)):
        arrays, p = _problem(torch, shape, dones_mask)
        prepare = fastest(lambda: _prepare.prepare(**arrays, backend="xp"))
        with recorded():
            recorded_backend = fastest(lambda: numba_cuda.BACKEND.gae(p))
        specs = [(kernel, blocks, threads, [value for _, value in named])
                 for kernel, blocks, threads, named in recorded_launches(p)]  # the kernels' specs, not compiled
        flattening = fastest(_numba_flattening(specs, 4))
        with driven(checked=False) as made:
            driver = fastest(lambda: numba_cuda.BACKEND.gae(p))
            launches = len(made) // (batches * calls + 1)
            planned = fastest(_repeated_call(arrays))
        before = prepare + recorded_backend + flattening
        lines.append(f"| {case} | {prepare:.1f} | {recorded_backend:.1f} | {flattening:.1f} | {before:.1f} | "
                     f"{driver:.1f} | {prepare + driver:.1f} | {planned:.1f} | {launches} |")
    return "\n".join(lines)


#: An assumption of the ``full`` table, not a measurement: a launch's driver call on the host and the kernel's start
#: on the device together (a few microseconds on current GPUs and drivers; nothing here has run on one).
LAUNCH_US = 4.0
#: The trainer's shapes of issue 29 (rows, T, dtype) and rl-triton's published whole call where there is one (us).
FULL_CALL_SHAPES = [((38400, 128), "float32", 68.0), ((8192, 64), "bfloat16", None), ((4096, 32), "float32", None),
                    ((256, 131072), "float32", None)]


def _heap_allocations() -> None:
    """Stand-in outputs of up to 32 MiB from glibc's heap, not a fresh ``mmap`` each (``mallopt``; nothing where
    glibc is not the allocator): a CUDA tensor of the same size comes from torch's caching allocator, a lookup in
    its pool, so a page-faulted CPU allocation would measure something a GPU call does not do (the 38,400 x 128
    outputs took 13 or 50 us a call, by glibc's mood)."""
    import ctypes
    import ctypes.util

    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return
    m_trim_threshold, m_mmap_threshold = -1, -3
    mallopt(m_mmap_threshold, 32 << 20)
    mallopt(m_trim_threshold, 1 << 30)


def full_call_table(batches: int = 30, calls: int = 100) -> str:
    """A predicted whole call (synchronize, call, synchronize) of a repeated ``gae()`` on an H200, per trainer
    shape: the host's part measured here (the call served by its plan, torch CPU stand-ins, through the stand-in
    driver: ``_repeated_call``), ``LAUNCH_US`` per launch (assumed), and the device's part from the traffic
    model (``tools.traffic.fused_launches``: the bytes of every launch at 4.8 TB/s). Host and device add up: the first
    kernel starts after the host has launched it, and the host waits for the last."""
    import torch

    from tools.traffic import fused_launches

    _heap_allocations()

    def fastest(function):
        return _fastest(function, batches, calls)

    lines = ["| shape | dtype | launches | host, measured (us) | launches, assumed (us) | device at 4.8 TB/s (us) | "
             "predicted whole call (us) | rl-triton, published (us) |", "|---|---|---|---|---|---|---|---|"]
    for shape, dtype, published in FULL_CALL_SHAPES:
        arrays = {name: torch.zeros(shape, dtype=getattr(torch, dtype)) for name in ("rewards", "values")}
        with driven(checked=False) as made:
            host = fastest(_repeated_call(arrays))
            launches = len(made) // (batches * calls + 2)
        launched = launches * LAUNCH_US
        stand_in = SimpleNamespace(rewards=_spec(shape, np.float16 if dtype == "bfloat16" else dtype),
                                   values=_spec(shape, np.float16 if dtype == "bfloat16" else dtype))
        moved = sum(a + b for a, b in fused_launches(stand_in).values())
        device = moved / BANDWIDTH * 1e6
        lines.append(f"| {shape[0]} x {shape[1]} | {dtype} | {launches} | {host:.1f} | {launched:.1f} | "
                     f"{device:.1f} | {host + launched + device:.1f} | {'' if published is None else published} |")
    return "\n".join(lines)


def groups_table() -> str:
    from tools import group_traffic

    return group_traffic.table()


def registers_table() -> str:
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
    import test_cuda_compile

    reason = test_cuda_compile._unavailable()
    if reason:
        sys.exit(reason)
    return test_cuda_compile.table()


TABLES = {"traffic": traffic_table, "arguments": arguments_table, "registers": registers_table, "host": host_table,
          "groups": groups_table, "launch": launch_table, "full": full_call_table}
PAGE = Path(__file__).resolve().parent / "gpu.md"


def fill(text: str, name: str, table: str) -> str:
    """``text`` with ``table`` between the page's markers of ``name``."""
    start = re.search(rf"<!-- gpu_tables:{name} .*?-->\n", text)
    end = text.index(f"<!-- gpu_tables:{name} end -->")
    return text[:start.end()] + table + "\n" + text[end:]


def check(names=("traffic", "arguments")) -> list[str]:
    """The deterministic tables that docs/gpu.md does not hold as generated (empty: the page is current)."""
    text = PAGE.read_text()
    return [name for name in names if fill(text, name, TABLES[name]()) != text]


def main(argv: list[str] | None = None) -> int:
    """Print the tables named in ``argv`` (default: traffic and arguments), or write them into docs/gpu.md."""
    summary, _, usage = __doc__.partition("\n\n")
    parser = argparse.ArgumentParser(prog="python docs/gpu_tables.py", description=summary,
                                     epilog=usage, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("tables", nargs="*", metavar="TABLE", default=["traffic", "arguments"],
                        help=f"one or more of {', '.join(TABLES)} (default: traffic arguments)")
    parser.add_argument("--write", action="store_true", help="write the tables into docs/gpu.md between its markers")
    options = parser.parse_args(argv)
    unknown = [name for name in options.tables if name not in TABLES]
    if unknown:
        parser.error(f"unknown table {', '.join(unknown)}: choose from {', '.join(TABLES)}")
    text = PAGE.read_text()
    for name in options.tables:
        table = TABLES[name]()
        if options.write:
            text = fill(text, name, table)
        else:
            print(table, end="\n\n")
    if options.write:
        PAGE.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
