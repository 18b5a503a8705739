"""GPU benchmark: the fused numba-CUDA path, the generic path, slime's chunk scan and the serial loop, B=256,
T=131072, float32, gamma 0.99, lam 0.95, on every CUDA library present (torch CUDA, CuPy).

Times come from the bench's harness (``gae_xp.bench.runner``): CUDA events
around one call on the current stream (median and minimum of 50 after 3
warm-ups; slime's chunk scan 5 runs; the serial loop
runs on a prefix of T and is extrapolated linearly, marked ~). Bandwidth: the
useful 16 bytes per element (read r and V, write A and R) over the time, and,
where the traffic model knows the path, its bytes over the time. "host ms" is
the wall time of the Python call alone (no synchronization): above the GPU
time, launch overhead is what bounds the call. A case that fails prints its
error in its row; the table goes on. Run by ``tests/gpu/check.sh``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys

import numpy as np

import gae_xp
from gae_xp.bench import baselines, runner, traffic
from gae_xp.testing import libraries

B, T, RUNS = 256, 131072, 50
SERIAL_PREFIX = 2048
TARGETS_MS = {"fused, constant": 0.3, "fused, dones+mask": 0.5}


def time_call(library: str, call, runs: int, warmup: int = 3) -> tuple[list[float], float]:
    """(GPU ms per run, host ms per call) on the bench's harness: CUDA events on the current stream, and the
    wall time of the Python call alone (nothing waited for: above the GPU time, launch overhead bounds a call)."""
    device = runner.time_call(call, timer=runner.cuda_events(library), repeat=runs, warmup=warmup, number=1)
    host = runner.time_call(call, repeat=runs, warmup=0, number=1)
    return [t * 1e3 for t in device.samples], host.median * 1e3


def cases(library, rng):
    """name -> (call, runs, scale of the time to the full T, modelled bytes per element or None)."""
    r = library.asarray(rng.standard_normal((B, T), dtype=np.float32))
    v = library.asarray(rng.standard_normal((B, T), dtype=np.float32))
    flags = {"terminated": library.asarray(rng.random((B, T)) < 0.01),
             "mask": library.asarray(rng.random((B, T)) >= 0.2)}
    model = {(row.path, row.case): row.bytes_per_element for row in traffic.report(generic=False)}
    prefix_r, prefix_v = r[:, :SERIAL_PREFIX], v[:, :SERIAL_PREFIX]
    return {
        "fused, constant": (lambda: gae_xp.gae(r, v, backend="numba-cuda"), RUNS, 1,
                            model["numba-cuda (fused)", "constant"]),
        "fused, dones+mask": (lambda: gae_xp.gae(r, v, **flags, backend="numba-cuda"), RUNS, 1,
                              model["numba-cuda (fused)", "dones+mask"]),
        "generic xp, constant": (lambda: gae_xp.gae(r, v, backend="xp"), RUNS, 1, None),
        "generic xp, dones+mask": (lambda: gae_xp.gae(r, v, **flags, backend="xp"), RUNS, 1, None),
        "slime chunk scan C=256": (lambda: baselines.slime_chunked_gae(r, v, 0.99, 0.95, 256), 5, 1, None),
        "serial loop": (lambda: baselines.slime_serial_gae(prefix_r, prefix_v, 0.99, 0.95), 3, T / SERIAL_PREFIX,
                        None),
    }


def run(names) -> list[dict]:
    rng = np.random.default_rng(0)
    rows = []
    for name in names:
        reason = libraries.unavailable(name)
        if reason:
            print(f"skipping {name}: {reason}", file=sys.stderr)
            continue
        library = libraries.load(name)
        kind = "cupy" if name == "cupy" else "torch"
        try:
            built = cases(library, rng)
        except Exception as error:  # e.g. out of memory: report and go on
            rows.append({"library": name, "case": "inputs", "error": f"{type(error).__name__}: {error}"[:120]})
            continue
        for label, (call, runs, scale, model) in built.items():
            row = {"library": name, "case": label}
            try:
                times, host = time_call(kind, call, runs)
            except Exception as error:  # report and go on: one table for everything that ran
                row["error"] = f"{type(error).__name__}: {error}"[:120]
                rows.append(row)
                continue
            median = statistics.median(times) * scale
            row.update(ms=median, min_ms=min(times) * scale, host_ms=host, extrapolated=scale != 1,
                       effective_gbs=traffic.FLOOR_BYTES * B * T / median / 1e6,
                       model_gbs=None if model is None else model * B * T / median / 1e6)
            rows.append(row)
    return rows


def verdicts(rows) -> list[str]:
    """The issue's targets on an H200, per library: fused times and the ratio to slime's chunk scan."""
    lines = []
    for name in {row["library"] for row in rows}:
        ms = {row["case"]: row.get("ms") for row in rows if row["library"] == name}
        for case, target in TARGETS_MS.items():
            if ms.get(case) is not None:
                lines.append(f"{name}: {case} {ms[case]:.3f} ms (target <= {target} ms): "
                             f"{'met' if ms[case] <= target else 'MISSED'}")
        slime, fused = ms.get("slime chunk scan C=256"), ms.get("fused, constant")
        if slime and fused:
            lines.append(f"{name}: slime chunk scan / fused = {slime / fused:.0f}x (target >= 50x): "
                         f"{'met' if slime / fused >= 50 else 'MISSED'}")
    return lines


def table(rows) -> str:
    lines = [f"GPU benchmark, B={B}, T={T}, float32 (CUDA events, median of {RUNS}; ~ = extrapolated from "
             f"T={SERIAL_PREFIX})", "",
             "| library | path | median ms | min ms | host ms | GB/s (16 B/elem) | GB/s (modelled bytes) |",
             "|---|---|---|---|---|---|---|"]
    for row in rows:
        if "error" in row:
            lines.append(f"| {row['library']} | {row['case']} | failed: {row['error']} | | | | |")
            continue
        mark = "~" if row["extrapolated"] else ""
        model = "" if row["model_gbs"] is None else f"{row['model_gbs']:.0f}"
        lines.append(f"| {row['library']} | {row['case']} | {mark}{row['ms']:.3f} | {mark}{row['min_ms']:.3f} | "
                     f"{row['host_ms']:.3f} | {row['effective_gbs']:.0f} | {model} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--libraries", default="torch:cuda,cupy", help="comma-separated (default: %(default)s)")
    parser.add_argument("--json", metavar="PATH", help="also write the rows here")
    options = parser.parse_args(argv)
    rows = run(options.libraries.split(","))
    print(table(rows))
    print()
    print("\n".join(verdicts(rows)))
    if options.json:
        with open(options.json, "w") as handle:
            json.dump(rows, handle, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
