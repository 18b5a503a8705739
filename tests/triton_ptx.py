"""Compile every Triton kernel of the package for sm_90 on a machine without a GPU and describe its PTX (JSON).

Run as a script in a process of its own (``TRITON_INTERPRET`` unset: the
interpreter replaces the kernels' compiler): ``python tests/triton_ptx.py``
prints one JSON object per compiled case: its global loads' and stores'
widths, whether its PTX uses local memory, its static PTX and SASS
instruction counts, its SASS local loads and stores (spills), the steps
each thread handles per block and the bytes each step moves. A kernel that
takes ``RARE_PATHS`` is compiled again without the paths that only a block
holding a NaN or an inf (the exact second scan of
``_triton_parts.solve_block``) or a masked step (GAE's value chain) runs, or
only a chunk's last blocks in GAE's chunk maps (``_triton_gae._reach``):
``sass_finite`` counts the path of a block of finite numbers and real steps.
GAE with a mask and no ``next_values`` is compiled a third time on the path
of a block of finite numbers with masked steps (``_triton_gae.HOLED``: the
value chain's scan, which a random mask sends every block through):
``walk_holed``.
``python tests/triton_ptx.py shared`` prints the shared memory of pipelined
chunks instead (``SHARED_CASES``). ``tests/test_triton_ptx.py`` checks them.
"""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path

os.environ.pop("TRITON_INTERPRET", None)
ROOT = Path(__file__).resolve().parents[1]  # the developer tools (``tools/``) live there, not in the package
if str(ROOT) not in sys.path:
    sys.path.append(str(ROOT))

import triton  # noqa: E402
import triton.language as tl  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402

from gae_xp.backends import _triton_config, _triton_gae, _triton_scan  # noqa: E402
from tools import sass  # noqa: E402

TARGET = GPUTarget("cuda", 90, 32)
ALIGNED = [["tt.divisibility", 16]]


def _case(name, function, types: dict, constexprs: dict, *, warps: int, aligned=(), bytes_per_step: int,
          stages: int = 3):
    """One compilation: the kernel's arguments' types (pointers and scalars; constexprs from ``constexprs``), the
    arguments Triton's launcher would find 16-aligned (every pointer and integer of an aligned layout), its warps
    and stages (Triton's default: 3)."""
    signature = {arg: types.get(arg, "constexpr") for arg in function.arg_names}
    attrs = {(function.arg_names.index(arg),): ALIGNED for arg in aligned}
    return {"name": name, "function": function, "signature": signature, "constexprs": constexprs, "attrs": attrs,
            "warps": warps, "stages": stages, "block": constexprs["BLOCK"], "bytes_per_step": bytes_per_step}


def _pointers(function, dtype: str, flags=(), integers=()) -> dict:
    """Every argument typed: pointers to ``dtype`` (bytes for ``flags``, int64 for offsets), float64 scalars,
    32-bit integers."""
    types = {}
    for arg in function.arg_names:
        if arg.isupper():
            continue
        if arg in integers:
            types[arg] = "i32"
        elif arg in ("gamma", "lam", "coefficient", "clip_rho", "clip_c", "clip_pg"):
            types[arg] = "fp64"
        elif arg == "offsets":
            types[arg] = "*i64"
        else:
            types[arg] = "*u8" if arg in flags else dtype
    return types


def cases() -> list[dict]:
    """The kernels of the package in the configurations the tests check: aligned contiguous float32 rows."""
    scan = _triton_scan._scan_rows
    scan_ints = ("length", "x_row", "x_time", "a_row", "a_time")
    out = [_case("scan reverse, float coefficient", scan, _pointers(scan, "*fp32", integers=scan_ints),
                 {"REVERSE": True, "STEPS": False, "WIDE": False, "BLOCK": 1024, "x_time": 1, "a_time": 1,
                  "RARE_PATHS": True},
                 warps=8, aligned=("out", "x", "a", "length", "x_row", "a_row"), bytes_per_step=8),
           _case("scan forward, per-step coefficient", scan, _pointers(scan, "*fp32", integers=scan_ints),
                 {"REVERSE": False, "STEPS": True, "WIDE": False, "BLOCK": 1024, "x_time": 1, "a_time": 1,
                  "RARE_PATHS": True},
                 warps=8, aligned=("out", "x", "a", "length", "x_row", "a_row"), bytes_per_step=12)]
    adjoint = _triton_scan._adjoint_rows
    rows = [arg for arg in adjoint.arg_names if arg.endswith("_row")]
    times = {arg: 1 for arg in adjoint.arg_names if arg.endswith("_time")}
    flags = ("terminated", "truncated", "mask")
    for name, options, extra_bytes in (("adjoint", {}, 0), ("adjoint, terminated and mask",
                                                            {"HAS_TERMINATED": True, "HAS_MASK": True}, 2)):
        constexprs = {"HAS_ADVANTAGES": True, "HAS_RETURNS": True, "HAS_NEXT": False, "HAS_CARRY": False,
                      "HAS_TERMINATED": False, "HAS_TRUNCATED": False, "HAS_MASK": False, "GAMMA_STEPS": False,
                      "LAM_STEPS": False, "HAS_OFFSETS": False, "FILL": False, "WIDE": False, "BLOCK": 1024,
                      **times, **options}
        pointers = [arg for arg in adjoint.arg_names[:13]]
        out.append(_case(name, adjoint, _pointers(adjoint, "*fp32", flags, ("length", "segments", "search_steps",
                                                                           *rows)),
                         constexprs, warps=8, aligned=(*pointers, "length", *rows), bytes_per_step=16 + extra_bytes))
    reverse = _triton_scan._reverse_rows
    rows = [arg for arg in reverse.arg_names if arg.endswith("_row")]
    times = {arg: 1 for arg in reverse.arg_names if arg.endswith("_time")}
    for name, family, options, step_bytes in (("discounted returns", _triton_scan.RETURNS, {}, 8),
                                              ("lambda-returns, mask", _triton_scan.LAMBDA, {"HAS_MASK": True}, 13),
                                              ("V-trace, terminated and mask", _triton_scan.VTRACE,
                                               {"HAS_TERMINATED": True, "HAS_MASK": True}, 26)):
        constexprs = {"FAMILY": family, "HAS_NEXT": family == _triton_scan.LAMBDA, "HAS_TERMINATED": False,
                      "HAS_TRUNCATED": False, "HAS_MASK": False, "GAMMA_STEPS": False, "LAM_STEPS": False,
                      "HAS_OFFSETS": False, "HAS_BOOTSTRAP": family != _triton_scan.LAMBDA, "WIDE": False,
                      "BLOCK": 1024, "RARE_PATHS": True, **times, **options}
        pointers = [arg for arg in reverse.arg_names[:13]]
        out.append(_case(name, reverse, _pointers(reverse, "*fp32", flags, ("length", "segments", "search_steps",
                                                                           "bootstrap_segment", *rows)),
                         constexprs, warps=8, aligned=(*pointers, "length", *rows), bytes_per_step=step_bytes))
    # as the launches run them: a row of blocks unpipelined, chunks pipelined (``_triton_launch._config``)
    for name, options, step_bytes, stages in (
            ("GAE, constant", {}, 16, 1),
            ("GAE, terminated and mask", {"HAS_TERMINATED": True, "HAS_MASK": True}, 18, 1),
            ("GAE, chunks' final pass, constant", {"MODE": 2}, 16, 3),
            ("GAE, chunks' final pass, terminated and mask", {"HAS_TERMINATED": True, "HAS_MASK": True, "MODE": 2}, 18,
             3)):
        out.append(_gae_case(name, options, step_bytes, stages=stages))
    # short rows sharing a program (``tuned(tile=1024)``): 8 rows of 128 steps
    out.append(_gae_case("GAE, a tile of 8 rows, terminated and mask",
                         {"HAS_TERMINATED": True, "HAS_MASK": True, "ROWS": 8}, 18, stages=1))
    return out


def _gae_case(name: str, options: dict, bytes_per_step: int, *, dtype: str = "fp32", block: int = 1024,
              warps: int = 4, stages: int = 3) -> dict:
    """``_triton_gae.gae_kernel`` on aligned contiguous rows of ``dtype`` (a Triton pointer type: fp32, bf16, fp16,
    fp64) with the options given (one launch, ``MODE`` 0, unless ``options`` says otherwise), as
    ``_triton_launch`` launches it; by default with the heuristic's block of 1024 (4 warps)."""
    kernel = _triton_gae.gae_kernel
    compute = tl.float64 if dtype == "fp64" else tl.float32
    constexprs = {"HAS_NEXT": False, "HAS_TERMINATED": False, "HAS_TRUNCATED": False, "HAS_MASK": False, "GAMMA": 1,
                  "LAM": 1, "CRITIC": 0, "HAS_CARRY": False, "HAS_OFFSETS": False, "FILL": False, "MODE": 0,
                  "CONTIGUOUS": True, "DTYPE": compute, "BLOCK": block, "CHUNKS": _triton_config.MAX_CHUNKS,
                  "ALIGN": 128 // int(dtype[2:]), "TWO_AXES": False, "RARE_PATHS": True, "STAGES": stages, "ROWS": 1,
                  **options}
    arrays = kernel.arg_names[:kernel.arg_names.index("length")]
    types = {}
    for arg in kernel.arg_names:
        if arg in constexprs:
            continue
        if arg in ("terminated", "truncated", "mask"):
            types[arg] = "*u8"
        elif arg == "offsets":
            types[arg] = "*i64"
        elif arg in ("bootstrap", "carry", "maps"):  # in the compute dtype
            types[arg] = f"*{'fp64' if dtype == 'fp64' else 'fp32'}"
        elif arg in arrays:
            types[arg] = f"*{dtype}"
        else:
            types[arg] = "fp64" if arg.endswith("_value") else "i32"  # Triton's type of a Python int below 2**31
    pointers = [arg for arg in arrays]
    return _case(name, kernel, types, constexprs, warps=warps, aligned=pointers, bytes_per_step=bytes_per_step,
                 stages=stages)


#: Pipelined chunks (the final pass, block 2048, 8 warps) whose shared memory ``tests/test_triton_ptx.py`` bounds by
#: ``_triton_config.pipeline_bytes``: (name, options, pointer dtype, stages, the bytes a step loads as
#: ``_triton_launch._step_bytes`` counts them: the per-step arrays, the values twice without next_values).
_EVERY_OPTION = {"HAS_NEXT": True, "HAS_TERMINATED": True, "HAS_TRUNCATED": True, "HAS_MASK": True,
                 "GAMMA": _triton_gae.PER_STEP, "LAM": _triton_gae.PER_STEP, "CRITIC": _triton_gae.PER_STEP}
SHARED_CASES = (("float32, constant", {}, "fp32", 3, 3 * 4),
                ("float32, terminated and mask", {"HAS_TERMINATED": True, "HAS_MASK": True}, "fp32", 3, 3 * 4 + 2),
                ("float32, every option", _EVERY_OPTION, "fp32", 3, 6 * 4 + 3),
                ("bfloat16, terminated and mask", {"HAS_TERMINATED": True, "HAS_MASK": True}, "bf16", 4, 3 * 2 + 2),
                ("float64, constant", {}, "fp64", 3, 3 * 8),
                ("float64, every option", _EVERY_OPTION, "fp64", 2, 6 * 8 + 3))


def shared_memory() -> list[dict]:
    """The shared memory each of ``SHARED_CASES`` compiles to, with what its launch would count."""
    out = []
    for name, options, dtype, stages, step_bytes in SHARED_CASES:
        case = _gae_case(name, {**options, "MODE": 2}, 0, dtype=dtype, block=2048, warps=8, stages=stages)
        out.append({"name": name, "stages": stages, "block": 2048, "step_bytes": step_bytes,
                    "shared": compile_case(case).metadata.shared})
    return out


def compile_case(case: dict):
    """``triton.compile`` of one case of ``cases`` for sm_90 (its ``asm`` holds the PTX and the cubin)."""
    source = triton.compiler.ASTSource(case["function"], case["signature"], case["constexprs"], case["attrs"])
    return triton.compile(source, target=TARGET, options={"num_warps": case["warps"], "num_stages": case["stages"]})


def describe(case: dict) -> dict:
    compiled = compile_case(case)
    ptx = compiled.asm["ptx"]
    body = [line.strip() for line in ptx.splitlines()]
    instructions = [line for line in body if line.endswith(";") and not line.startswith(("//", ".", "{", "}"))
                    and not re.match(r"^\$?\w+:", line)]
    accesses = [line for line in instructions if re.search(r"\b(ld|st)\.global", line)]
    copies = re.findall(r"cp\.async\.c[ag]\.shared\.global\s*\[[^]]*\],\s*\[[^]]*\],\s*(\w+)", ptx)
    return {"name": case["name"], "loads": sorted({re.search(r"ld\.global[.\w]*", a).group(0) for a in accesses
                                                    if "ld.global" in a}),
            "async_loads": sorted({f"cp.async {int(size, 0)} B" for size in copies}),
            "stores": sorted({re.search(r"st\.global[.\w]*", a).group(0) for a in accesses if "st.global" in a}),
            "local": ".local" in ptx or "local_depot" in ptx, "instructions": len(instructions),
            "pipelined": case["constexprs"].get("STAGES", 1) > 1,
            "steps_per_thread": case["block"] // (32 * case["warps"]),
            "bytes_per_step": case["bytes_per_step"], "sass": len(code := sass.listing(compiled.asm["cubin"])),
            "sass_local": sum(bool(re.search(r"\b(LDL|STL)\b", instruction)) for _, instruction in code),
            "sass_finite": len(finite := code if "RARE_PATHS" not in case["constexprs"] else
                               _listing_on_path(case, False)),
            "walk_finite": sass.loops(finite, scan_loops=False).walk, "walk_holed": _walk_holed(case)}


def _listing_on_path(case: dict, rare_paths):
    """The SASS of ``case`` compiled with its ``RARE_PATHS`` set to ``rare_paths`` (the path the count takes)."""
    return sass.listing(compile_case({**case, "constexprs": {**case["constexprs"], "RARE_PATHS": rare_paths}})
                        .asm["cubin"])


def _walk_holed(case: dict) -> int | None:
    """The walk of GAE's value chain on a block with masked steps (``_triton_gae.HOLED``), or None for a kernel
    without it."""
    constexprs = case["constexprs"]
    if case["function"] is not _triton_gae.gae_kernel or not constexprs["HAS_MASK"] or constexprs["HAS_NEXT"]:
        return None
    return sass.loops(_listing_on_path(case, _triton_gae.HOLED), scan_loops=False).walk


if __name__ == "__main__":
    if sys.argv[1:] == ["shared"]:
        json.dump(shared_memory(), sys.stdout, indent=1)
    else:
        json.dump([describe(case) for case in cases()], sys.stdout, indent=1)
