"""Every numba-CUDA kernel and signature compiled for real hardware on a machine without a GPU.

``numba.cuda.compile_ptx`` (NVVM from the CUDA toolkit wheels of
``numba-cuda[cu12]``) compiles each kernel of the catalog
(``tools.cuda_catalog``: every family and phase, its plainest and
its fullest structure, every carry kernel) for sm_80 (A100) and sm_90
(H100/H200) with its launch bounds, and ``ptxas`` from the
``nvidia-cuda-nvcc`` wheel assembles it to SASS. This catches what the
simulator cannot: typing errors, accidental float64 arithmetic in the float32
kernels, register spills and local-memory arrays; the PTX shows the
coalesced pattern (striped ``ld.global``/``st.global`` with cache hints and
the shared-memory exchange).

numba-cuda asks the current device for a compute capability when it types a
call to a device function, even inside ``compile_ptx``; the tests answer with
the target's, the only thing the driver would be asked for.

``python tests/test_cuda_compile.py`` prints the registers / shared memory
table of docs/gpu.md.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from test_cuda_launch import ptx_parameters

from tools import sass

ARCHS = {"sm_80": (8, 0), "sm_90": (9, 0)}


def _unavailable() -> str | None:
    if os.environ.get("NUMBA_ENABLE_CUDASIM") == "1":
        return "compile_ptx does not exist in the CUDA simulator"
    if importlib.util.find_spec("numba") is None or importlib.util.find_spec("numba.cuda") is None:
        return "numba-cuda is not installed (pip install 'numba-cuda[cu12]')"
    if sass.ptxas() is None:
        return "ptxas not found (pip install 'numba-cuda[cu12]' brings the nvidia-cuda-nvcc-cu12 wheel)"
    return _nvvm_missing()


@functools.cache
def _nvvm_missing() -> str | None:
    """Why NVVM cannot compile here (numba-cuda finds libNVVM and NVRTC in the toolkit wheels), or None."""
    from numba import cuda

    try:
        cuda.compile_ptx(lambda out: None, "void(float32[:])", cc=ARCHS["sm_80"])
    except Exception as error:  # the library loader's own error types differ between numba-cuda releases
        first_line = str(error).splitlines()[0] if str(error) else type(error).__name__
        return f"NVVM/NVRTC not found ({first_line}): pip install 'numba-cuda[cu12]' brings the toolkit wheels"
    return None


if _unavailable() is not None and os.environ.get("GAE_XP_REQUIRE_PTX") == "1":  # .ci/run, once it installed them
    raise RuntimeError(f"GAE_XP_REQUIRE_PTX=1, but the kernels cannot be compiled here: {_unavailable()}")
# Minutes of NVVM and ptxas: CI's PTX step runs the whole file (the quick run's venv has no toolkit wheels anyway).
pytestmark = [pytest.mark.skipif(_unavailable() is not None, reason=str(_unavailable())), pytest.mark.slow]


def _kernels():
    if _unavailable() is not None:
        return []
    from tools import cuda_catalog

    return list(cuda_catalog.all_kernels())


KERNELS = _kernels()


@functools.cache
def compile_kernel(io: str, spec, arch: str) -> dict:
    """PTX for ``arch`` and ptxas's verdict on it: registers, shared memory, stack, spills, instruction counts."""
    import tempfile

    import numba.cuda.dispatcher
    from numba import cuda

    cc = ARCHS[arch]
    current = numba.cuda.dispatcher.get_current_device
    numba.cuda.dispatcher.get_current_device = lambda: SimpleNamespace(compute_capability=cc)
    bounds = {} if spec.launch_bounds is None else {"launch_bounds": spec.launch_bounds}
    try:
        ptx, _ = cuda.compile_ptx(spec.function, spec.signature, cc=cc, **bounds)
    finally:
        numba.cuda.dispatcher.get_current_device = current
    with tempfile.TemporaryDirectory() as folder:
        source = Path(folder) / f"{io}-{re.sub(r'[^a-z0-9]+', '_', spec.name)}-{arch}.ptx"
        source.write_text(ptx)
        done = subprocess.run([sass.ptxas(), f"-arch={arch}", "-v", str(source), "-o",
                               str(source.with_suffix(".cubin"))], capture_output=True, text=True)
        assert done.returncode == 0, done.stderr
        listing = sass.listing(source.with_suffix(".cubin"))
    info = done.stderr

    def number(pattern):
        found = re.search(pattern, info)
        return int(found.group(1)) if found else 0

    def count(pattern):
        return len(re.findall(pattern, ptx))

    return {
        "registers": number(r"Used (\d+) registers"),
        "smem": number(r"(\d+) bytes smem"),
        "stack": number(r"(\d+) bytes stack frame"),
        "spill_stores": number(r"(\d+) bytes spill stores"),
        "spill_loads": number(r"(\d+) bytes spill loads"),
        "f64": count(r"\.f64\b"),
        "loads_again": count(r"ld\.global\.cg\."),
        "loads_once": count(r"ld\.global\.cs\."),
        "stores_once": count(r"st\.global\.cs\."),
        "shared_stores": count(r"st\.shared\."),
        "shared_loads": count(r"ld\.shared\."),
        "barriers": count(r"bar\.sync"),
        "float64_atomic_adds": count(r"\b(?:atom|red)\.global\.add\.f64\b"),
        "compare_and_swaps": count(r"\batom\.(?:global\.)?cas\b"),
        "ptxas": info,
        "ptx_parameters": ptx_parameters(ptx),
        "sass": listing,
    }


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("io, spec", KERNELS, ids=[f"{io}-{spec.name}" for io, spec in KERNELS])
def test_kernel_compiles_without_spills(io, spec, arch):
    """ptxas's verdict on every catalog kernel; on sm_90 also its ``.param`` list against the driver launch's
    argument block (``_cuda_launch.layout``: as many parameters, in order, each of its type and size;
    tests/test_cuda_launch.py checks the values numba's launcher would pass), from the same compilation."""
    from test_cuda_launch import check_parameters

    result = compile_kernel(io, spec, arch)
    if arch == "sm_90":
        check_parameters(spec.signature.args, result["ptx_parameters"])
    assert result["spill_stores"] == 0 and result["spill_loads"] == 0, result["ptxas"]
    assert result["stack"] == 0, f"local memory in use (a local array indexed at run time?): {result['ptxas']}"
    threads, blocks = spec.launch_bounds or (128, 1)
    assert 0 < result["registers"] <= min(255, 65536 // (threads * blocks)), result["ptxas"]
    assert result["smem"] <= 48 * 1024, result["ptxas"]
    if io != "float64":
        assert result["f64"] == 0, "float64 arithmetic in a kernel that computes in float32"


TILE_KERNELS = [(io, spec) for io, spec in KERNELS if not spec.name.startswith(("carry", "lean"))]
LEAN_KERNELS = [(io, spec) for io, spec in KERNELS if spec.name.startswith("lean")]


@pytest.mark.parametrize("io, spec", TILE_KERNELS, ids=[f"{io}-{spec.name}" for io, spec in TILE_KERNELS])
def test_tile_kernels_load_and_store_coalesced(io, spec):
    """The streamed arrays move only through striped global loads and stores with cache hints (ITEMS of them per
    array and thread, unrolled: a warp's instruction reads 32 consecutive elements) and a shared-memory exchange:
    launch 1 (``tiles``) loads with ``ld.global.cg`` (launch 3 reads the data again), launch 3 (``final``) with
    ``ld.global.cs``, or ``ld.global.cg`` for a broadcast array (stride 0: other steps or rows read it again, from
    L2), and stores its outputs with ``st.global.cs``. The few numbers per tile or segment (maps, boundary values,
    offsets) are plain loads and stores (read-only ones may become ``ld.global.nc``)."""
    from gae_xp.backends._cuda_plan import ITEMS

    result = compile_kernel(io, spec, "sm_90")
    final = "_final[" in spec.name
    options = set(spec.name[spec.name.index("[") + 1:-1].split(","))
    arrays = len(options & STREAMED) + (0 if spec.name.startswith("adjoint") else 1)  # the rewards (the scan's x)
    assert result["loads_again"] >= ITEMS * arrays, result  # launch 1's loads, or launch 3's of broadcast arrays
    assert (result["loads_once"] >= ITEMS * arrays) if final else (result["loads_once"] == 0), result
    assert result["shared_stores"] >= ITEMS and result["shared_loads"] >= ITEMS, result
    if final:
        outputs = 3 if "next_values" in options and spec.name.startswith("adjoint") else 2 if spec.name.startswith(
            ("gae", "vtrace", "adjoint")) else 1
        assert result["stores_once"] >= ITEMS * outputs, result
    else:
        assert result["stores_once"] == 0, "launch 1 writes the tiles' maps only"


@pytest.mark.parametrize("io, spec", LEAN_KERNELS, ids=[f"{io}-{spec.name}" for io, spec in LEAN_KERNELS])
def test_lean_kernels_stream_through_shared_memory(io, spec):
    """A lean kernel moves its streamed arrays only through loads and stores with cache hints (the maps launch:
    ``ld.global.cg``, its data read again by the final launch; the final launch: ``ld.global.cs``, and
    ``ld.global.cg`` for gamma and lam, which rows may share; its outputs ``st.global.cs``) and a shared-memory
    exchange, and scans with barriers (no warp intrinsics: the simulator runs the same code). The maps launch
    writes no output."""
    result = compile_kernel(io, spec, "sm_90")
    final = spec.name.startswith("lean_final")
    coefficients = "gamma" in spec.name or "lam" in spec.name
    assert result["shared_stores"] > 0 and result["shared_loads"] > 0 and result["barriers"] >= 3, result
    if final:
        assert result["loads_once"] > 0 and result["stores_once"] >= 2, result
        assert (result["loads_again"] > 0) == coefficients, result
    else:
        assert result["loads_again"] > 0 and result["loads_once"] == 0 and result["stores_once"] == 0, result


#: The structures whose instructions per step the lean and the general kernels are compared on.
COMPARED = {"plain": [], "terminated": ["terminated", "truncated"],
            "next_values": ["next_values", "terminated", "truncated"], "dones+mask": ["terminated", "mask"]}


def compared(io: str, structure: str):
    """(lean final kernel, general final kernel) of one structure of ``COMPARED``, short rows (one launch each)."""
    from gae_xp.backends import _cuda_gae, _cuda_lean

    inputs = frozenset(COMPARED[structure])
    general = frozenset(["values", *inputs])
    return (_cuda_lean.lean_kernel(io, _cuda_lean.LeanStructure(inputs, "final")),
            _cuda_gae.forward_kernel(io, _cuda_gae.Structure("gae", "final", general,
                                                             value_chain=_cuda_gae.value_chain("gae", general))))


def per_step_counts(io: str, structure: str) -> tuple[float, float]:
    """(lean, general) SASS instructions per step on sm_90 (``tools.sass.per_step``; a block of the most threads
    scans in log2(threads) steps)."""
    from gae_xp.backends._cuda_plan import ITEMS, LEAN_THREADS, THREADS, lean_items

    lean, general = compared(io, structure)
    return (sass.per_step(compile_kernel(io, lean, "sm_90")["sass"], lean_items(io),
                                  LEAN_THREADS.bit_length() - 1),
            sass.per_step(compile_kernel(io, general, "sm_90")["sass"], ITEMS, THREADS.bit_length() - 1))


@pytest.mark.skipif(sass.cuobjdump() is None, reason="cuobjdump not found (Triton's wheel bundles one)")
@pytest.mark.parametrize("structure", COMPARED)
@pytest.mark.parametrize("io", ["float32", "bfloat16"])
def test_lean_kernels_issue_fewer_instructions_per_step(io, structure):
    """The general kernels' ~1,100 instructions per step match their measured H200 rate (25 G steps/s, about
    1,300 thread instructions per step at the SMs' issue rate): the lean kernels must issue at most a quarter."""
    lean, general = per_step_counts(io, structure)
    assert lean <= general / 4, (lean, general)


@pytest.mark.skipif(sass.cuobjdump() is None, reason="cuobjdump not found (Triton's wheel bundles one)")
@pytest.mark.parametrize("phase", ["final", "maps"])
def test_the_value_chain_scan_follows_a_vote_the_count_leaves_out(phase):
    """A mask without next_values: the value chain's block scan starts at a vote of the block (``BAR.RED.OR``) and
    runs its loop only where a thread holds no real step; ``rare_paths`` False (what the cost model counts)
    compiles the kernel without that loop: one barrier loop fewer, fewer instructions a step, the same loads."""
    from gae_xp.backends._cuda_lean import LeanStructure, lean_kernel
    from gae_xp.backends._cuda_plan import LEAN_THREADS, lean_items

    structure = LeanStructure(frozenset({"terminated", "mask"}), phase)
    real, counted = (compile_kernel("float32", lean_kernel("float32", structure, rare_paths=rare), "sm_90")
                     for rare in (True, False))
    votes = [sum("BAR.RED.OR" in instruction for _, instruction in result["sass"]) for result in (real, counted)]
    assert votes == [1, 0], votes
    loops = [sass.loops(result["sass"]) for result in (real, counted)]
    assert len(loops[1].scans) == len(loops[0].scans) - 1, loops
    steps = [sass.per_step(result["sass"], lean_items("float32"), LEAN_THREADS.bit_length() - 1)
             for result in (real, counted)]
    assert steps[1] < steps[0], steps
    loads = [sum("LDG" in instruction for _, instruction in result["sass"]) for result in (real, counted)]
    assert loads[0] == loads[1], loads


#: The per-step arrays a tile kernel's name may list: each is streamed in with ITEMS striped loads per thread.
STREAMED = {"values", "next_values", "gamma", "lam", "critic_lam", "log_rhos", "terminated", "truncated", "mask",
            "grad_advantages", "grad_returns", "coefficient"}


def table() -> str:
    """Markdown: registers per thread (sm_80 / sm_90) and static shared memory per block, per kernel and dtype."""
    dtypes = list(dict.fromkeys(io for io, _ in KERNELS))
    cells: dict[str, dict[str, str]] = {}
    for io, spec in KERNELS:
        results = {arch: compile_kernel(io, spec, arch) for arch in ARCHS}
        registers = " / ".join(str(results[arch]["registers"]) for arch in ARCHS)
        cells.setdefault(spec.name, {})[io] = f"{registers} ({results['sm_90']['smem']} B)"
    lines = ["| kernel | " + " | ".join(f"{io}: registers sm_80 / sm_90 (shared memory)" for io in dtypes) + " |",
             "|---|" + "---|" * len(dtypes)]
    lines += [f"| `{name}` | " + " | ".join(row.get(io, "") for io in dtypes) + " |" for name, row in cells.items()]
    return "\n".join(lines)


def instructions_table() -> str:
    """Markdown: SASS instructions per step on sm_90, lean against general, per structure and dtype."""
    lines = ["| structure | dtype | lean | general | ratio |", "|---|---|---|---|---|"]
    for structure in COMPARED:
        for io in ("float32", "bfloat16", "float64"):
            lean, general = per_step_counts(io, structure)
            lines.append(f"| {structure} | {io} | {lean:.0f} | {general:.0f} | {general / lean:.1f}x |")
    return "\n".join(lines)


if __name__ == "__main__":
    if _unavailable():
        sys.exit(_unavailable())
    print(instructions_table() if sys.argv[1:] == ["instructions"] else table())


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("io", ["float32", "float64"])
def test_group_moments_kernels_compile_without_spills(io, arch):
    """group_advantages' two launches (backends/_cuda_groups.py): no spills, no local memory, few registers, and
    their float64 atomics native adds (sm_60 and later), two per score and launch, never a compare-and-swap loop
    (what the traffic model, tools.group_traffic, counts: one read and write of each group's slot)."""
    from gae_xp.backends import _cuda_groups

    for spec in _cuda_groups.specs(io):
        result = compile_kernel(io, spec, arch)
        assert result["spill_stores"] == 0 and result["spill_loads"] == 0 and result["stack"] == 0, result["ptxas"]
        assert 0 < result["registers"] <= 64, result["ptxas"]
        assert result["smem"] == 0, result["ptxas"]
        assert result["float64_atomic_adds"] == 2 and result["compare_and_swaps"] == 0, spec.name


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("io", ["float32", "float64"])
def test_consecutive_group_kernels_compile_without_spills(io, arch):
    """group_advantages(scores, k)'s fused launches (backends/_cuda_consecutive.py): no spills, no local memory,
    few registers, no atomics; the batch's two launches hold their tree of (3, THREADS) float64 sums in shared
    memory, the one-launch kernel none."""
    from gae_xp.backends import _cuda_consecutive

    tree = 3 * _cuda_consecutive.THREADS * 8
    for spec, smem in zip(_cuda_consecutive.specs(io), (0, tree, tree)):
        result = compile_kernel(io, spec, arch)
        assert result["spill_stores"] == 0 and result["spill_loads"] == 0 and result["stack"] == 0, result["ptxas"]
        assert 0 < result["registers"] <= 64, result["ptxas"]
        assert result["smem"] == smem, result["ptxas"]
        assert result["float64_atomic_adds"] == 0 and result["compare_and_swaps"] == 0, spec.name
        assert (result["barriers"] > 0) == (smem > 0), spec.name
