"""backend="triton" on torch CUDA tensors, compiled (not interpreted), against ``gae_xp.reference`` in float64.

Run by ``test_triton_cuda.py`` (and its cupy part by ``test_routes.py``) in a
process without ``TRITON_INTERPRET``:
``python triton_cuda_checks.py options|layouts|compiling|cupy``. Each part prints
one line per case and "checked N cases"; the first mismatch raises.

* options: every option alone and together (``tests/test_triton.py``'s grid)
  in float32, with rows many enough for one program each (300x129) and few
  enough to be cut into chunks (2x8193); plain and every option at once in
  float64, bfloat16 and float16, at T = 1 and 31, and packed with host and
  with device offsets (empty sequences included); then the options of
  ``PIPELINED`` with chunks of several blocks, the walk pipelined (``tuned``:
  by default only rows of about a million steps are). About 55 kernel variants
  are compiled: a minute or so of the run is Triton's compiler;
* layouts: time on axis 0, a 3-D batch, strided rows, time-strided inputs,
  NaN and inf in masked slots;
* compiling: a new T (of one row of the heuristic's table and one alignment)
  and a new B add no entry to the kernel's compile cache;
* cupy: CuPy arrays (torch views of their memory, on CuPy's current stream;
  each case called three times, so that its plan launches on the arrays'
  addresses, checked once against the call through torch views), ``auto``
  choosing the route where torch is imported, a call on a busy non-blocking
  stream returning at once and queued behind the stream's work, a call
  captured in a CUDA graph and replayed on new rewards.
"""

from __future__ import annotations

import os
import sys

import numpy as np
import torch

import gae_xp
from gae_xp import reference
from gae_xp.backends import triton as route
from gae_xp.testing import make_case, option_grid, xp_assert_close

DEVICE = torch.device("cuda")
DTYPES = (torch.float64, torch.float32, torch.bfloat16, torch.float16)
OPTIONS = option_grid(dones=0.05)
SHAPES = ((300, 129), (2, 8193))
#: Options checked again with the chunks' walk pipelined, and the settings that make it so at the last of the
#: shapes (2x8193: 256-step blocks, at most 8 chunks: 7 chunks of 5 blocks, 3 stages).
PIPELINED = ("plain", "dones", "holes", "holes+next_values", "everything")
PIPELINED_SETTINGS = {"block": 256, "num_stages": 3, "chunks": 8}


def build(seed: int, shape, options: dict, *, axis: int = -1) -> dict:
    return make_case(np.random.default_rng(seed), shape, axis=axis, **options)


def on_gpu(case: dict, dtype, device=DEVICE) -> dict:
    """The case's arrays as torch tensors on ``device`` (CPU tensors: tests/test_gpu_calls_on_cpu.py, under Triton's
    interpreter), the floating ones in ``dtype``."""
    out = {}
    for name, value in case.items():
        if isinstance(value, np.ndarray):
            value = torch.from_numpy(value.copy()).to(device)
            if value.is_floating_point():
                value = value.to(dtype)
        out[name] = value
    return out


def widened(given: dict) -> dict:
    return {name: value.to(torch.float64).cpu().numpy() if torch.is_tensor(value) and value.is_floating_point()
            else value.cpu().numpy() if torch.is_tensor(value) else value for name, value in given.items()}


def check(label: str, given: dict, *, axis: int = -1, cu_seqlens=None, **options):
    dtype = given["rewards"].dtype
    advantages, returns = gae_xp.gae(**given, axis=axis, backend="triton", cu_seqlens=cu_seqlens, **options)
    case = {**widened(given), **options}
    if cu_seqlens is None:
        want = reference.gae_loop(**case, axis=axis)
    else:
        want = packed_loop(case, np.asarray(cu_seqlens.cpu() if torch.is_tensor(cu_seqlens) else cu_seqlens))
    like = torch.zeros((), dtype=dtype, device=given["rewards"].device)
    xp_assert_close(advantages, want[0], like=like)
    xp_assert_close(returns, want[1], like=like)
    print("ok", label, flush=True)


def packed_loop(case: dict, offsets: np.ndarray):
    advantages = np.zeros(case["rewards"].shape)
    returns = np.zeros(case["rewards"].shape)
    bootstrap = case.get("bootstrap_value")
    length = case["rewards"].shape[-1]
    for i, (lo, hi) in enumerate(zip(offsets[:-1], offsets[1:])):
        piece = {name: value[..., lo:hi] if isinstance(value, np.ndarray) and value.shape[-1] == length else value
                 for name, value in case.items() if name != "bootstrap_value"}
        if bootstrap is not None:
            piece["bootstrap_value"] = bootstrap[..., i]
        advantages[..., lo:hi], returns[..., lo:hi] = reference.gae_loop(**piece)
    return advantages, returns


def options_part(shapes=SHAPES, offsets=(0, 700, 700, 2100, 2101, 2101, 4000), device=DEVICE,
                 pipelined=PIPELINED_SETTINGS) -> int:
    """Every option in float32 at each of ``shapes``; plain and everything in the other dtypes at the first shape,
    at T = 1 and 31, and packed by ``offsets`` (the last: T); the options of ``PIPELINED`` at the last shape within
    ``tuned(**pipelined)``. The defaults are the GPU run's; tests/test_gpu_calls_on_cpu.py takes small ones on the
    CPU."""
    count, offsets = 0, list(offsets)
    for name, options in OPTIONS.items():
        for shape in shapes:
            check(f"{name} {shape} float32", on_gpu(build(count, shape, options), torch.float32, device))
            count += 1
    for name in ("plain", "everything"):
        for dtype in (torch.float64, torch.bfloat16, torch.float16):
            check(f"{name} {shapes[0]} {dtype}", on_gpu(build(count, shapes[0], OPTIONS[name]), dtype, device))
            count += 1
        for length in (1, 31):
            check(f"{name} (3, {length})", on_gpu(build(count, (3, length), OPTIONS[name]), torch.float32, device))
            count += 1
        case = build(count, (2, offsets[-1]), OPTIONS[name])
        if "bootstrap_value" in case:
            case["bootstrap_value"] = np.random.default_rng(count).standard_normal((2, len(offsets) - 1))
        for device_offsets in (False, True):
            cuts = torch.tensor(offsets, device=device) if device_offsets else offsets
            check(f"{name} packed device_offsets={device_offsets}", on_gpu(case, torch.float32, device),
                  cu_seqlens=cuts)
            count += 1
    with route.tuned(**pipelined):
        for name in PIPELINED:
            check(f"{name} {shapes[-1]} float32, chunks pipelined",
                  on_gpu(build(count, shapes[-1], OPTIONS[name]), torch.float32, device))
            count += 1
    return count


def layouts_part() -> int:
    everything = OPTIONS["everything"]
    check("time on axis 0, 3-D batch", on_gpu(build(1, (300, 2, 3, 2), everything, axis=0), torch.float32), axis=0)
    case = on_gpu(build(2, (6, 1000), everything), torch.float32)
    strided = {name: torch.cat([value, value])[::2] if torch.is_tensor(value) and value.shape == (6, 1000) else value
               for name, value in case.items()}
    check("strided rows", strided)
    timed = {name: value[:, ::2] if torch.is_tensor(value) and value.shape[-1] == 1000 else value
             for name, value in case.items()}
    check("time-strided", timed)
    holed = build(3, (4, 3000), {"holes": 0.3, "dones": 0.01, "next_values": True})
    for name in ("rewards", "values", "next_values"):
        holed[name][~holed["mask"]] = np.nan
    check("NaN in masked slots", on_gpu(holed, torch.float32))
    check("NaN in masked slots, fill_masked", on_gpu(holed, torch.float32), fill_masked=True)
    return 5


def compiling_part() -> int:
    from gae_xp.backends import _triton_gae

    def entries() -> int:
        return sum(len(caches[0]) for caches in _triton_gae.gae_kernel.device_caches.values())

    check("first", on_gpu(build(0, (64, 100), OPTIONS["dones"]), torch.float32))
    before = entries()
    for rows, length in ((65, 104), (128, 120), (3000, 68)):
        check(f"{rows}x{length}", on_gpu(build(rows, (rows, length), OPTIONS["dones"]), torch.float32))
    assert entries() == before, f"{entries() - before} kernels compiled for a new T or B"
    return 4


def cupy_part() -> int:
    """CuPy arrays through torch views on CuPy's current stream (``gae_xp.backends._triton_cupy``), and repeated
    calls launched by their plan on the arrays' addresses (``_triton_cupy_plan``): the results are CuPy arrays on
    the arrays' device, equal to the loop, with no direct launch refused; ``auto`` takes the route (torch is
    imported here); a call on a busy non-blocking stream returns before the stream is done and its kernels run
    after the stream's work."""
    import cupy

    from gae_xp import _plans, backends
    from gae_xp.backends import _triton_cupy_plan, _triton_plan

    def on_cupy(case: dict) -> dict:
        return {name: cupy.asarray(value) if isinstance(value, np.ndarray) else value for name, value in case.items()}

    def check_cupy(label, case, backend):
        # three calls: the first makes the layout's plan, the second takes and checks its kernels (through torch
        # views, then on the arrays' addresses), the third launches on the addresses alone
        given = on_cupy(case)
        want = reference.gae_loop(**case)
        for _ in range(3):
            advantages, returns = gae_xp.gae(**given, backend=backend)
            for got, expected in zip((advantages, returns), want):
                assert type(got) is cupy.ndarray and got.device.id == given["rewards"].device.id, label
                np.testing.assert_allclose(cupy.asnumpy(got), expected, rtol=2e-4, atol=2e-4, err_msg=label)
        assert _triton_plan.direct_refused() is None, _triton_plan.direct_refused()
        print("ok", label, flush=True)

    count = 0
    for name in ("plain", "dones+next_values", "holes+fill", "coefficients", "everything"):
        for backend in ("triton", "auto"):
            case = build(count, (300, 129), OPTIONS[name])
            case = {k: v.astype(np.float32) if isinstance(v, np.ndarray) and v.dtype == np.float64 else v
                    for k, v in case.items()}
            check_cupy(f"cupy {name} {backend}", case, backend)
            count += 1
    arrays = on_cupy(build(99, (8, 64), OPTIONS["plain"]))
    chosen = backends.select("auto", cupy, [arrays["rewards"], arrays["values"]])
    assert chosen.name == "triton", f"auto chose {chosen.name} for CuPy arrays with torch imported"
    served = [plan for plan in _plans.PLANS._plans.values() if type(plan) is _triton_cupy_plan.CuPyPlan]
    assert served and all(plan.launches for plan in served), "no CuPy plan launched on the arrays' addresses"
    print(f"ok cupy plans: {len(served)} launching on addresses", flush=True)
    reversed_case = build(98, (4, 1000), OPTIONS["dones"])
    given = on_cupy(reversed_case)
    given["rewards"] = given["rewards"][:, ::-1]  # a view with a negative stride, on the device
    advantages, _ = gae_xp.gae(**given, backend="triton")
    want = reference.gae_loop(**{**reversed_case, "rewards": reversed_case["rewards"][:, ::-1]})[0]
    np.testing.assert_allclose(cupy.asnumpy(advantages), want, rtol=1e-10, atol=1e-10)
    print("ok cupy negative strides", flush=True)
    with cupy.cuda.Stream.ptds:  # CuPy's per-thread default stream, which torch exports to by no name
        check_cupy("cupy per-thread default stream", build(95, (64, 300), OPTIONS["everything"]), "triton")
    managed_case = build(94, (16, 500), OPTIONS["dones"])
    managed = {}
    for name, value in managed_case.items():
        if isinstance(value, np.ndarray):
            memory = cupy.cuda.malloc_managed(value.nbytes)
            managed[name] = cupy.ndarray(value.shape, value.dtype, memptr=memory)
            managed[name][...] = cupy.asarray(value)
        else:
            managed[name] = value
    chosen = backends.select("auto", cupy, [managed["rewards"], managed["values"]])
    assert chosen.name != "triton", "auto chose the Triton route for CuPy arrays in managed memory"
    for _ in range(2):  # the second call served by the layout's plan
        advantages, _ = gae_xp.gae(**managed, backend="auto")
        np.testing.assert_allclose(cupy.asnumpy(advantages), reference.gae_loop(**managed_case)[0], rtol=1e-10,
                                   atol=1e-10)
    print(f"ok cupy managed memory ({chosen.name})", flush=True)
    mixed = dict(on_cupy(managed_case), values=managed["values"])  # device memory first, managed memory second
    gae_xp.gae(**on_cupy(managed_case), backend="auto")  # auto's choice for all-device arrays of this kind first
    chosen = backends.select("auto", cupy, [mixed["rewards"], mixed["values"]])
    assert chosen.name != "triton", "auto chose the Triton route for a call holding managed memory"
    advantages, _ = gae_xp.gae(**mixed, backend="auto")
    np.testing.assert_allclose(cupy.asnumpy(advantages), reference.gae_loop(**managed_case)[0], rtol=1e-10,
                               atol=1e-10)
    empty_a, empty_r = gae_xp.gae(cupy.zeros((3, 0)), cupy.zeros((3, 0)), backend="triton")
    assert type(empty_a) is cupy.ndarray and empty_a.shape == empty_r.shape == (3, 0)
    print("ok cupy managed memory after device memory, empty arrays", flush=True)
    x = np.random.default_rng(97).standard_normal((5, 3000))
    got = gae_xp.discounted_cumsum(cupy.asarray(x), 0.97, backend="triton")
    np.testing.assert_allclose(cupy.asnumpy(got), reference.discounted_cumsum_loop(x, 0.97), rtol=1e-10)
    case = build(96, (8, 100_000), {"dones": 0.01, "holes": 0.1})
    spin = cupy.ElementwiseKernel("int64 n", "int64 y", "long long x = 0; for (long long i = 0; i < n; ++i) "
                                  "{ x += i ^ (x >> 3); } y = x;", "gae_xp_spin")
    busy = cupy.empty(1, dtype=cupy.int64)
    spin(cupy.int64(1), busy)
    stream = cupy.cuda.Stream(non_blocking=True)
    with stream:
        given = on_cupy({k: np.zeros_like(v) if k == "rewards" else v for k, v in case.items()})
        for _ in range(2):  # compiled, planned and its kernels checked here (one synchronisation), not below
            gae_xp.gae(**given, backend="triton")
        stream.synchronize()
        spin(cupy.int64(1 << 28), busy)  # keeps the stream busy
        given["rewards"][...] = cupy.asarray(case["rewards"])  # queued behind the spin: the kernels must wait
        advantages, _ = gae_xp.gae(**given, backend="triton")
        assert not stream.done, "gae() waited for CuPy's stream (a host synchronization)"
        assert torch.cuda.default_stream().query(), "torch's default stream was made to wait for CuPy's"
    stream.synchronize()
    np.testing.assert_allclose(cupy.asnumpy(advantages), reference.gae_loop(**case)[0], rtol=1e-10, atol=1e-10)
    print("ok cupy stream", flush=True)
    for shape in ((300, 129), (2, 8193)):  # one program per row; few long rows cut into chunks (the maps' buffer)
        case = build(93, shape, {"dones": 0.05, "holes": 0.1})
        given = on_cupy(case)
        given["bootstrap_value"] = 0.5
        with cupy.cuda.Stream(non_blocking=True) as capturing:
            for _ in range(3):  # planned, its kernels taken and checked on addresses: then the capture launches them
                gae_xp.gae(**given, backend="triton")
            capturing.begin_capture()
            advantages, returns = gae_xp.gae(**given, backend="triton")
            graph = capturing.end_capture()
            cupy.get_default_memory_pool().free_all_blocks()
            noise = [cupy.full(shape, 1e9, dtype=cupy.float32) for _ in range(4)]  # takes memory freed after capture
            renewed = build(92, shape, {})["rewards"]
            given["rewards"][...] = cupy.asarray(renewed)
            graph.launch()
            capturing.synchronize()
        want = reference.gae_loop(**{**case, "rewards": renewed, "bootstrap_value": 0.5})
        for got, expected in zip((advantages, returns), want):
            np.testing.assert_allclose(cupy.asnumpy(got), expected, rtol=2e-4, atol=2e-4)
        del noise
        print(f"ok cupy graph capture and replay at {shape[0]}x{shape[1]}", flush=True)
    return count + 10


if __name__ == "__main__":
    assert os.environ.get("TRITON_INTERPRET", "0") in ("0", ""), "run without TRITON_INTERPRET"
    part = sys.argv[1]
    count = {"options": options_part, "layouts": layouts_part, "compiling": compiling_part,
             "cupy": cupy_part}[part]()
    torch.cuda.synchronize()
    print(f"checked {count} cases")
