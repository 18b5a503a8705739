"""The bench command's outputs: what is measured (the header), the table and its legend, the verdicts, JSON, plot.

One rule for every comparison in a verdict: two times whose medians differ by
no more than the spread of both (the sum of their half interquartile ranges)
are a tie, whichever side is ahead: "no measurable difference" when both
spreads are narrow on a machine that was not busy, else "too noisy to tell",
with the spreads, the load average and a rerun to try (``gae_xp.bench.noise``).
"""

from __future__ import annotations

import dataclasses
import glob
import importlib.util
import json
import os
import platform
import shlex
import sys
from collections import defaultdict
from importlib import metadata, resources
from typing import Iterable

from gae_xp import _config
from gae_xp.bench import noise
from gae_xp.bench.noise import Conditions
from gae_xp.bench.paths import FLOOR_ARRAYS, all_paths, loop_baseline
from gae_xp.bench.runner import COPY, MIN_SAMPLES_FOR_A_VERDICT, Measurement
from gae_xp.testing.libraries import CPU_NAMES

COLUMNS = ("library", "case", "path", "B", "T", "C", "median", "spread", "x floor", "vs loop", "max error",
           "peak mem")

LEGEND = (
    "~          the time is extrapolated linearly in T from a run on the first steps (a Python loop over time "
    "expected to take longer than --serial-budget)",
    "spread     half the interquartile range of the samples, as a share of the median (0% with a single sample)",
    "x floor    this time over the copy row's: a copy of the same bytes (rewards and values into two preallocated "
    "arrays, what every GAE must read and write), same library, device and shape, timed in the same turns; "
    "on a CPU NumPy's one-thread copy",
    "C          the chunk size that ran: auto (C) = chunk_size=None and the size gae_xp's rule chose; "
    "- = the path has no chunks",
    "vs loop    the library's serial loop (lax.scan under jax.jit on JAX) divided by this path, same shape and case",
    "max error  max |advantage - float64 loop| over the whole output (- where the time was extrapolated)",
    "peak mem   peak bytes allocated by one call where the library tells (tracemalloc on the CPU, torch CUDA)",
)

#: The copy row's entry in the paths' legend (it is the yardstick, not a path).
COPY_DESCRIPTION = ("not a path: a copy of the same bytes (rewards and values into two preallocated arrays), the "
                    "yardstick of x floor")


def path_legend(names: Iterable[str]) -> list[str]:
    """One line per path named in the table, saying what it is (``Path.description``), in the registry's order."""
    described = {p.name: p.description for p in all_paths()}
    described[COPY] = COPY_DESCRIPTION
    present = set(names)
    shown = [name for name in described if name in present]
    width = max((len(name) for name in shown), default=0)
    return [f"  {name.ljust(width)}  {described[name]}" for name in shown]


#: A chunk size must also save at least this share of auto's time to be recommended: a smaller gain is not
#: worth a setting that the next machine may not repeat.
MIN_GAIN = 0.05

#: Figures measured by this project for the extras' hints (``recorded.json`` beside this module; its
#: ``command`` entry is how they were made, on the machine its ``machine`` entry describes).
RECORDED = "recorded.json"
#: extra -> (what to install, the backend it adds, the libraries whose arrays it serves)
EXTRAS = {
    "numba": ("pip install 'gae_xp[numba]'", "numba", ("numpy", "torch:cpu")),
    "numba-cuda": ("pip install 'gae_xp[cuda12]' (or [cuda13]: CuPy and numba-cuda)", "numba-cuda",
                   ("torch:cuda", "cupy")),
}


def chunk_label(m: Measurement) -> str:
    if m.effective_chunk is None:
        return "-"
    if m.chunk_size is None:
        return f"auto ({m.effective_chunk})"
    return str(m.effective_chunk) if m.effective_chunk == m.chunk_size else f"{m.chunk_size}->{m.effective_chunk}"


def rows(results: list[Measurement]) -> list[tuple[str, ...]]:
    out = []
    for m in results:
        approx = "~" if m.extrapolated_from else ""
        out.append((
            m.library, m.case, m.path, str(m.B), str(m.T), chunk_label(m),
            f"{approx}{seconds(m.median_s)}",
            f"±{100 * m.spread_s / m.median_s:.0f}%",
            "-" if m.floor_ratio is None else ratio(m.floor_ratio),
            "-" if m.speedup_vs_serial is None else ratio(m.speedup_vs_serial),
            "-" if m.max_abs_error is None else f"{m.max_abs_error:.1e}",
            "-" if m.peak_bytes is None else _bytes(m.peak_bytes),
        ))
    return out


# ---------------------------------------------------------------------------------------------------- verdicts


def measurably_different(a: Measurement, b: Measurement) -> bool:
    """Whether two medians differ by more than the spread of both (the sum of their half interquartile ranges)."""
    return abs(a.median_s - b.median_s) > a.spread_s + b.spread_s


def relative(m: Measurement, base: Measurement, base_time: str, conditions: Conditions | None = None) -> str:
    """``2.4x <base_time>`` (marked rough on noisy samples), or a tie (:func:`gae_xp.bench.noise.tie`) from it."""
    if not measurably_different(m, base):
        verdict, detail = noise.tie(m, base, conditions)
        return f"{verdict} from {base_time}" + (f": {detail}" if detail else "")
    return f"{ratio(m.median_s / base.median_s)} {base_time}{noise.rough(m, base)}"


def ratio(value: float) -> str:
    """``0.0385x``, ``2.07x``, ``3680x``: three significant digits, no exponent."""
    return f"{value:.0f}x" if value >= 1000 else f"{value:.3g}x"


def recommend_chunk(auto: Measurement, others: Iterable[Measurement]) -> Measurement | None:
    """The explicit chunk size to recommend over auto, or None: keep the default.

    A size is recommended only when its median beats auto's by more than the
    measured spread of both (the sum of their half interquartile ranges) and
    by at least ``MIN_GAIN`` of auto's time, from at least
    ``MIN_SAMPLES_FOR_A_VERDICT`` samples each, and when it runs a different
    piece length than auto does.
    """
    candidates = [m for m in others if m.effective_chunk != auto.effective_chunk and not m.extrapolated_from]
    if not candidates or auto.runs < MIN_SAMPLES_FOR_A_VERDICT:
        return None
    best = min(candidates, key=lambda m: m.median_s)
    if best.runs < MIN_SAMPLES_FOR_A_VERDICT:
        return None
    gain = auto.median_s - best.median_s
    return best if gain > auto.spread_s + best.spread_s and gain >= MIN_GAIN * auto.median_s else None


def chunk_verdict(measured: list[Measurement], path: str, conditions: Conditions | None = None) -> str | None:
    """One line on ``path``'s chunk size at one shape and case, from the rule of :func:`recommend_chunk`."""
    mine = [m for m in measured if m.path == path]
    auto = next((m for m in mine if m.chunk_size is None), None)
    if auto is None or auto.effective_chunk is None:
        return None
    others = [m for m in mine if m is not auto]
    if not others:
        return f"{path}: only auto (C={auto.effective_chunk}) timed: {_timed(auto)}"
    best = recommend_chunk(auto, others)
    if best is None:
        fastest = min(others, key=lambda m: m.median_s)
        if fastest.median_s >= auto.median_s:
            why = "slower"
        elif min(auto.runs, fastest.runs) < MIN_SAMPLES_FOR_A_VERDICT:
            why = f"faster on fewer than {MIN_SAMPLES_FOR_A_VERDICT} samples: not enough to tell"
        elif auto.median_s - fastest.median_s <= auto.spread_s + fastest.spread_s:
            why = "faster by less than the measured spread"
            verdict, detail = noise.tie(auto, fastest, conditions)
            why += f", {verdict}: {detail}" if detail else ""
        else:
            why = f"faster by less than {MIN_GAIN:.0%}"
        return (f"{path}: keep the default chunk_size=None (auto, C={auto.effective_chunk}: {_timed(auto)}); "
                f"the fastest other size, C={fastest.effective_chunk} ({_timed(fastest)}), is {why}")
    return (f"{path}: set chunk_size={best.chunk_size}: {_timed(best)} against auto's {_timed(auto)} "
            f"(C={auto.effective_chunk}), faster by more than the spread of both")


def verdicts(results: list[Measurement], auto_paths: dict[str, str] | None = None,
             missing_extras: Iterable[str] = (), conditions: Conditions | None = None) -> list[str]:
    """What the run means, per library and case: at the largest shape, and every shape where gae_xp is not ahead.

    ``auto_paths`` maps a library to the path ``backend="auto"`` runs for its
    arrays (gae_xp[numba] for NumPy with numba installed...): chunk-size
    advice is given for that path only, since a size on another path changes
    nothing in the user's call. ``missing_extras`` lists the extras (numba,
    numba-cuda) not installed here. ``conditions`` is the machine's load while
    the samples were taken: a tie on a busy machine is "too noisy to tell".
    """
    auto_paths = auto_paths or {}
    noisy = noise.summary(results, conditions)
    lines = [] if noisy is None else [noisy]
    by_library = defaultdict(list)
    for m in results:
        by_library[m.library].append(m)
    for library, measured in by_library.items():
        auto_path = auto_paths.get(library)
        for case in dict.fromkeys(m.case for m in measured):
            in_case = [m for m in measured if m.case == case]
            largest = max((m.B * m.T, m.T) for m in in_case)
            here = [m for m in in_case if (m.B * m.T, m.T) == largest]
            lines.append(_step_line(library, case, here, auto_path, conditions))
            lines.extend("  " + line for line in _chunk_lines(here, auto_path, conditions))
            lines.extend("  " + line for line in _behind_lines(in_case, auto_path, conditions))
            lines.extend("  " + line for line in _jax_lines(here, conditions))
            lines.extend("  " + line for line in _bare_loop_lines(here, conditions))
            lines.extend("  " + line for line in _case_cost_lines(measured, here, conditions))
            lines.extend("  " + line for line in _cross_library_lines(results, here, conditions))
    lines.extend(extra_hints(missing_extras, by_library))
    return lines


def _chunk_lines(here, auto_path, conditions) -> list[str]:
    """Chunk-size advice for the path auto runs; for another gae_xp path only where its sizes were swept."""
    lines = []
    for path in dict.fromkeys(m.path for m in here if m.ours):
        chunked = any(m.path == path and m.effective_chunk is not None for m in here)
        if auto_path is None or path == auto_path:
            if chunked:
                line = chunk_verdict(here, path, conditions)
                lines.extend([] if line is None else ["chunk size: " + line])
            else:
                what = ", what backend='auto' runs," if path == auto_path else ""
                lines.append(f"chunk size: {path}{what} has no chunks: chunk_size changes nothing there, "
                             "so not swept")
        elif chunked and sum(m.path == path for m in here) > 1:
            line = chunk_verdict(here, path, conditions)
            backend = path[len("gae_xp["):-1]
            lines.append(f"chunk size, for calls that force backend='{backend}' only (auto runs {auto_path}, "
                         f"where chunk_size changes nothing): {line}")
    return lines


def _behind_lines(in_case, auto_path, conditions) -> list[str]:
    """Every shape where what auto runs is not ahead of the fastest baseline timed (slower, or within the spread)."""
    shapes = sorted({(m.B, m.T) for m in in_case})
    lines, compared = [], []
    for B, T in shapes:
        at = [m for m in in_case if (m.B, m.T) == (B, T)]
        ours = _ours_at_auto(at, auto_path)
        baselines = [m for m in at if m.baseline]
        if ours is None or not baselines:
            continue
        best = min(baselines, key=lambda m: m.median_s)
        compared.append((B, T))
        name = best.path + (f" (C={best.effective_chunk})" if best.effective_chunk is not None else "")
        if not measurably_different(ours, best):
            verdict, detail = noise.tie(ours, best, conditions)
            lines.append(f"{verdict} at B={B}, T={T}: {ours.path} {_timed(ours)} against {name}'s {_timed(best)}, "
                         "the fastest baseline there" + (f"; {detail}" if detail else ""))
        elif best.median_s < ours.median_s:
            lines.append(f"behind at B={B}, T={T}: {ours.path} {_timed(ours)} against {name}'s {_timed(best)}, "
                         f"the fastest baseline there ({ours.median_s / best.median_s:.3g}x its time)"
                         f"{noise.rough(ours, best)}")
    if compared and not lines:
        batches = {B for B, _ in compared}
        where = (f"B={compared[0][0]}, T={', '.join(str(T) for _, T in compared)}" if len(batches) == 1
                 else "; ".join(f"B={B}, T={T}" for B, T in compared))
        lines.append(f"ahead of the fastest baseline timed at every shape ({where})")
    return lines


def _ours_at_auto(measured, auto_path) -> Measurement | None:
    """The row of what auto runs at its automatic chunk size, or the fastest gae_xp row at auto where unknown."""
    if auto_path is not None:
        return next((m for m in measured if m.path == auto_path and m.chunk_size is None), None)
    timed = [m for m in measured if m.ours and m.chunk_size is None]
    return min(timed, key=lambda m: m.median_s) if timed else None


def _step_line(library, case, here, auto_path, conditions) -> str:
    m0 = here[0]
    head = f"{library}, B={m0.B}, T={m0.T}, {case}:"
    loop_name = loop_baseline(library)
    loop = next((m for m in here if m.path == loop_name), None)
    ours = _ours_at_auto(here, auto_path)
    if auto_path is not None:
        if ours is None:
            return f"{head} backend='auto' runs {auto_path}, which was not timed (add it to --paths)"
        what = f"backend='auto' runs {auto_path}{' under jax.jit' if library.startswith('jax') else ''}"
    else:
        if ours is None:
            return f"{head} no gae_xp path ran"
        what = f"the fastest gae_xp path at auto chunk size is {ours.path}"
    line = f"{head} {what}: {_timed(ours)} per call{_floor_words(ours, here)}"
    loop_words = "lax.scan under jax.jit" if loop_name == "lax.scan" else "the serial loop"
    if loop is None:
        return line + f"; {loop_words} was not timed (add {loop_name} to --paths)"
    saved = loop.median_s - ours.median_s
    approx = "~" if loop.extrapolated_from else ""
    line += f"; {loop_words}, what you have now: {_timed(loop)} per call"
    if not measurably_different(ours, loop):
        verdict, detail = noise.tie(ours, loop, conditions)
        line += f": {verdict} (the medians differ by less than the spread of both{'; ' + detail if detail else ''})"
    elif saved > 0:
        line += (f" ({ratio(loop.median_s / ours.median_s)}): {approx}{seconds(saved)} saved per PPO step that "
                 "computes GAE once on this batch")
    else:
        line += (f" ({ratio(loop.median_s / ours.median_s)}): gae_xp is slower here by {approx}{seconds(-saved)} "
                 "per call")
    return line + (noise.rough(ours, loop) if measurably_different(ours, loop) else "")


def _floor_words(ours: Measurement, here) -> str:
    """`` = 6.2x the copy floor (0.91 ms, 18.5 GB/s)``: how far the call is from the memory roofline."""
    floor = next((m for m in here if m.path == COPY), None)
    if floor is None or ours.floor_ratio is None:
        return ""
    moved = FLOOR_ARRAYS * _itemsize(floor.dtype) * floor.B * floor.T
    cache = last_level_cache() if floor.library in CPU_NAMES else None
    where = (f"; the {moved / 2**20:.3g} MiB fit in the CPU's {cache / 2**20:.3g} MiB cache, so this is the "
             "cache's floor"
             if cache and moved <= cache else "")
    return (f" = {ratio(ours.floor_ratio)} the copy floor ({seconds(floor.median_s)} to copy the same bytes, "
            f"{moved / floor.median_s / 1e9:.3g} GB/s{where})")


def _itemsize(dtype: str) -> int:
    return {"float16": 2, "bfloat16": 2, "float32": 4, "float64": 8}.get(dtype, 4)


def _jax_lines(here, conditions) -> list[str]:
    refs = [m for m in here if m.path == "lax.associative_scan"]
    ours = [m for m in here if m.ours and m.chunk_size is None]
    if not refs or not ours:
        return []
    best = min(ours, key=lambda m: m.median_s)
    ref = refs[0]
    against = relative(ref, best, f"{best.path}'s time", conditions)
    return [f"JAX's other alternative, lax.associative_scan under jax.jit: {_timed(ref)} ({against})"]


def _bare_loop_lines(here, conditions) -> list[str]:
    """gae_xp's numba kernel against the bare numba loop: what a compiled CPU loop reaches (constant discount only)."""
    bare = next((m for m in here if m.path == "numba-bare"), None)
    ours = next((m for m in here if m.path == "gae_xp[numba]"), None)
    if bare is None or ours is None:
        return []
    against = relative(ours, bare, "the bare loop's time", conditions)
    return [f"gae_xp[numba] {_timed(ours)} against a bare numba loop's {_timed(bare)} "
            f"({against}; it knows only a constant discount)"]


def _case_cost_lines(measured, here, conditions) -> list[str]:
    """A time-varying case against the constant discount, per gae_xp path at auto, at the same shape."""
    constant = {(m.path, m.B, m.T): m for m in measured if m.case == "constant" and m.ours and m.chunk_size is None}
    lines = []
    for m in here:
        if m.case == "constant" or not m.ours or m.chunk_size is not None:
            continue
        base = constant.get((m.path, m.B, m.T))
        if base is not None:
            lines.append(f"{m.case} against the constant discount: {m.path} {_timed(m)} against {_timed(base)}, "
                         f"{relative(m, base, 'its constant time', conditions)}")
    return lines


def _cross_library_lines(results, here, conditions) -> list[str]:
    """torch CPU tensors on the numba kernel against NumPy arrays on the same kernel, same shape and case."""
    numpy_side = {(m.B, m.T, m.case): m for m in results if m.library == "numpy" and m.path == "gae_xp[numba]"}
    lines = []
    for m in here:
        if m.library == "torch:cpu" and m.path == "gae_xp[numba]":
            base = numpy_side.get((m.B, m.T, m.case))
            if base is not None:
                against = relative(m, base, "NumPy's time", conditions)
                lines.append(f"torch CPU tensors on the numba kernel: {_timed(m)}; NumPy arrays on the same kernel: "
                             f"{_timed(base)} ({against})")
    return lines


def extra_hints(missing_extras: Iterable[str], libraries: Iterable[str], recorded: dict | None = None) -> list[str]:
    """For each extra not installed that would serve arrays of this run: what to install and what it gave us."""
    present = set(libraries)
    lines = []
    for extra in missing_extras:
        install, backend, serves = EXTRAS[extra]
        served = [name for name in serves if name in present]
        if not served:
            continue
        line = (f"{extra} is not installed: {install} lets backend='auto' run the {backend} kernels on "
                f"{', '.join(served)} arrays")
        gains = recorded_gains(backend, served, recorded)
        lines.append(line + ("; " + "; ".join(gains) if gains else
                             "; this project has not recorded what it gives on these arrays yet"))
    return lines


def load_recorded() -> dict | None:
    try:
        return json.loads(resources.files("gae_xp.bench").joinpath(RECORDED).read_text())
    except (FileNotFoundError, ModuleNotFoundError, json.JSONDecodeError):
        return None


def recorded_gains(backend: str, libraries: Iterable[str], recorded: dict | None = None) -> list[str]:
    """Sentences such as "measured by this project on another machine, not this one (AMD EPYC, 2 cores, load
    average 0.4 during the run: a quiet machine's figures), with `...`: numpy, ...: 2.1 ms ±1% against the generic
    path's 6.4 ms ±2% (3x faster)": the figures are ``recorded.json``'s, never this machine's."""
    recorded = load_recorded() if recorded is None else recorded
    if not recorded:
        return []
    rows_ = recorded.get("results", [])
    machine = recorded.get("machine", {})
    where = f"{machine.get('cpu', 'a CPU')}, {machine.get('cpus', '?')} cores{recorded_load_words(machine)}"
    conditions = Conditions(machine.get("load_average_highest"), machine.get("usable_cpus") or machine.get("cpus"))
    out = []
    for library in libraries:
        for r in rows_:
            if r["library"] != library or r["path"] != f"gae_xp[{backend}]" or r.get("extrapolated_from"):
                continue
            generic = next((x for x in rows_ if x["library"] == library and x["path"] == "gae_xp[xp]"
                            and x["chunk_size"] is None and (x["B"], x["T"], x["dones"], x["holes"])
                            == (r["B"], r["T"], r["dones"], r["holes"])), None)
            if generic is None:
                continue
            ours, xp = _recorded_measurement(r), _recorded_measurement(generic)
            why = noise.noise(ours, xp, conditions)
            if measurably_different(ours, xp):
                against = f"{ratio(xp.median_s / ours.median_s)} faster{noise.rough(ours, xp)}"
            else:
                against = f"too noisy to tell: {why}" if why else "no measurable difference"
            out.append(f"{library}, B={ours.B}, T={ours.T}, {ours.dtype}, {ours.case}: {_timed(ours)} against the "
                       f"generic path's {_timed(xp)} ({against})")
    if out:
        out[0] = (f"measured by this project on another machine, not this one ({where}), with "
                  f"`{recorded.get('command', '?')}`: " + out[0])
    return out


def _recorded_measurement(record: dict) -> Measurement:
    """A :class:`Measurement` back from its ``as_dict`` (``recorded.json``), fields it does not know left out."""
    known = {f.name for f in dataclasses.fields(Measurement)}
    return Measurement(**{k: v for k, v in record.items() if k in known})


def recorded_load_words(machine_: dict) -> str:
    """``, load average 5.2 during the run: a busy machine's figures`` (or ``a quiet machine's``): how busy the
    recording machine was."""
    load = machine_.get("load_average_highest", machine_.get("load_average"))
    if load is None:
        return ""
    busy = Conditions(load, machine_.get("usable_cpus") or machine_.get("cpus")).busy
    verdict = ": a busy machine's figures" if busy else ": a quiet machine's figures"
    return f", load average {load:.2g} during the run{verdict}"


# ---------------------------------------------------------------------------------------------------- the header


def machine() -> dict:
    """The machine: platform, CPU model (as /proc/cpuinfo names it), cores, threads, the 1-minute load average now."""
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as handle:
            cpu = next((line.split(":", 1)[1].strip() for line in handle if line.startswith("model name")), cpu)
    except OSError:
        pass
    try:
        usable = len(os.sched_getaffinity(0))
    except AttributeError:
        usable = os.cpu_count()
    threads = {k: v for k, v in os.environ.items()
               if k in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "NUMBA_NUM_THREADS")}
    if "torch" in sys.modules:
        threads["torch"] = sys.modules["torch"].get_num_threads()
    if importlib.util.find_spec("numba") is not None:
        import numba

        threads["numba"] = numba.get_num_threads()
    return {"platform": platform.platform(), "cpu": cpu, "cpus": os.cpu_count(), "usable_cpus": usable,
            "last_level_cache_bytes": last_level_cache(), "python": platform.python_version(), "threads": threads,
            "load_average": noise.load_average()}


def last_level_cache() -> int | None:
    """Bytes of the CPU's largest cache (Linux's sysfs), or None where it does not tell."""
    sizes = []
    for folder in glob.glob("/sys/devices/system/cpu/cpu0/cache/index*"):
        try:
            with open(os.path.join(folder, "size")) as handle:
                text = handle.read().strip()
        except OSError:
            continue
        units = {"K": 2**10, "M": 2**20, "G": 2**30}
        if text[-1:] in units and text[:-1].isdigit():
            sizes.append(int(text[:-1]) * units[text[-1]])
        elif text.isdigit():
            sizes.append(int(text))
    return max(sizes, default=None)


def gpu_names(libraries) -> list[str]:
    names = []
    for library in libraries:
        try:
            if library.name == "torch:cuda":
                import torch

                names.append(torch.cuda.get_device_name(library.device))
            elif library.name == "cupy":
                import cupy

                names.append(cupy.cuda.runtime.getDeviceProperties(library.device.id)["name"].decode())
            elif library.name == "jax:cuda":
                names.append(str(library.device.device_kind))
        except Exception as error:  # a name is nice to have, never worth a failed run
            names.append(f"{library.name}: ({type(error).__name__})")
    return list(dict.fromkeys(names))


def versions(libraries) -> dict:
    """The versions that ran: gae_xp's as imported (a clone shadows an installed copy), the others' as installed."""
    import gae_xp

    out = {"gae_xp": gae_xp.__version__}
    out.update({name: _version(name) for name in ("numpy", "array-api-compat", "scipy", "numba", "numba-cuda")})
    out.update({library.name.split(":")[0]: library.version for library in libraries})
    return {k: v for k, v in out.items() if v is not None}


def load_words(count: int, usable_cpus: int | None) -> str:
    """The header's words for ``--load``."""
    if not count:
        return "none started (--load starts a busy process per usable core during the timed runs)"
    per_core = " (one per usable core)" if count == usable_cpus else ""
    return (f"{count} busy neighbour process{'es' if count > 1 else ''}{per_core} spin during the timed runs and the "
            "first calls (--load): the figures are a busy machine's")


def header(settings: dict, libraries, machine_: dict) -> list[str]:
    """What is measured, before anything is timed."""
    threads = ", ".join(f"{k} {v}" for k, v in machine_["threads"].items()) or "library defaults"
    gpus = gpu_names(libraries)
    return [
        f"gae_xp bench: {settings['what']}",
        f"  shapes  B={settings['B']}, T={settings['T']} (time last), {settings['dtype']}, "
        f"gamma={settings['gamma']}, lam={settings['lam']}",
        f"  cases   {settings['cases']}",
        f"  paths   {settings['paths']}; chunk sizes {settings['chunks']} (swept at the largest B*T only)",
        f"  timing  median of {settings['repeat']} samples of >= {settings['min_sample_ms']:g} ms, taken in turns; "
        f"loops over time past {settings['serial_budget']:g} s per call run on a prefix",
        f"  machine {machine_['cpu']}, {machine_['usable_cpus']} of {machine_['cpus']} cores usable, "
        f"{_cache_words(machine_.get('last_level_cache_bytes'))}threads: {threads}; "
        f"GPU: {', '.join(gpus) if gpus else 'none in this run'}",
        f"  load    {settings['load']}",
        f"  {machine_['platform']}, python {machine_['python']}",
        "  versions " + ", ".join(f"{k} {v}" for k, v in versions(libraries).items()),
        f"  routes  {_config.summary()}",
    ]


# ---------------------------------------------------------------------------------------------------- the profile


#: Functions listed one by one in a profile; the rest are summed on one line.
PROFILE_TOP = 15


def profile_lines(title: str, timing, profiled_s: float, lines, top: int = PROFILE_TOP) -> list[str]:
    """A profile (``runner.profile``) as text: the call's time, its time by module, then by function."""
    total = timing.median
    spread = 50 * (timing.quartiles[1] - timing.quartiles[0]) / total if total else 0.0
    out = [f"{title}: {seconds(total)} ±{spread:.0f}% per call without the profiler, {seconds(profiled_s)} under "
           "cProfile; each function's own time scaled to the former (the profiler's cost per function call makes "
           "many small functions look heavier than a few long ones)"]
    modules: dict[str, float] = defaultdict(float)
    for line in lines:
        modules[_module_of(line.function)] += line.seconds
    out.append(f"  {'us/call':>8}  {'share':>5}  by module")
    for module, spent in sorted(modules.items(), key=lambda item: -item[1]):
        out.append(f"  {spent * 1e6:8.2f}  {spent / total:5.0%}  {module}")
    out.append(f"  {'us/call':>8}  {'share':>5}  {'calls':>5}  by function (own time)")
    for line in lines[:top]:
        out.append(f"  {line.seconds * 1e6:8.2f}  {line.seconds / total:5.0%}  {line.calls:5.3g}  {line.function}")
    rest = lines[top:]
    if rest:
        spent = sum(line.seconds for line in rest)
        out.append(f"  {spent * 1e6:8.2f}  {spent / total:5.0%}  {'':>5}  {len(rest)} other functions")
    return out


def _module_of(function: str) -> str:
    """gae_xp's file (``gae_xp/_prepare.py``) for gae_xp's code, the top package (``numpy``, ``numba``) for others'."""
    if ":" not in function or "/" not in function:
        return "built-in functions (C)"
    parts = function.split(":")[0].split("/")
    if parts[0] in ("gae_xp", "backends"):
        return "/".join(parts)
    return "Python's standard library" if parts[0].startswith("python") else parts[0]


# ---------------------------------------------------------------------------------------------------- output


def print_report(results: list[Measurement], stream=None, *, auto_paths=None, missing_extras=(),
                 notes: Iterable[str] = (), first_calls: Iterable[dict] = (),
                 conditions: Conditions | None = None) -> None:
    stream = stream or sys.stdout
    table = rows(results)
    try:
        from rich.console import Console
        from rich.markup import escape
        from rich.table import Table
    except ImportError:
        widths = [max([len(c), *(len(r[i]) for r in table)]) for i, c in enumerate(COLUMNS)]
        for line in [COLUMNS, *table]:
            print("  ".join(cell.ljust(w) if i < 3 else cell.rjust(w)
                            for i, (cell, w) in enumerate(zip(line, widths))), file=stream)
    else:
        rich_table = Table()
        for column in COLUMNS:
            rich_table.add_column(column, justify="left" if column in ("library", "case", "path") else "right")
        for row in table:
            rich_table.add_row(*map(escape, row))
        Console(file=stream, width=None if stream.isatty() else 160).print(rich_table)
    print("", file=stream)
    for line in LEGEND:
        print(line, file=stream)
    described = path_legend(m.path for m in results)
    if described:
        print("path       what each row runs:", file=stream)
    for line in described:
        print(line, file=stream)
    for note in notes:
        print(f"note: {note}", file=stream)
    print("", file=stream)
    print("verdict (at each library's largest shape; times are median ± spread):", file=stream)
    for line in verdicts(results, auto_paths, missing_extras, conditions):
        print(line, file=stream)
    first_calls = list(first_calls)
    if first_calls:
        print("", file=stream)
        print("first call in a fresh process (a subprocess per library and case, not in the medians above):",
              file=stream)
        for line in first_call_lines(first_calls):
            print("  " + line, file=stream)


def first_call_lines(first_calls: Iterable[dict]) -> list[str]:
    """One line per first call measured by ``runner.first_call``: its time, the second call's, the imports before."""
    lines = []
    for record in first_calls:
        head = f"{record['library']}, B={record['B']}, T={record['T']}, {record['case']}, backend='auto'"
        if "error" in record:
            lines.append(f"{head}: not measured ({record['error']})")
            continue
        module = record["library"].split(":")[0]
        lines.append(f"{head}: {seconds(record['first_s'])}, then {seconds(record['second_s'])} for the second call "
                     f"({_first_call_work(record)}, once per process); before it, import gae_xp took "
                     f"{seconds(record['import_gae_xp_s'])} and {module} {seconds(record['import_library_s'])}")
    return lines


def _first_call_work(record: dict) -> str:
    """What a first call does once that the second does not: numba's compile or cache load only where it ran."""
    if record["library"].startswith("jax"):
        return "JAX tracing and compiling"
    if record.get("numba"):
        return "numba compiling its kernels or loading them from its cache"
    return "one-time set-up, nothing compiled by gae_xp"


def write_json(results: list[Measurement], path: str, argv: list[str], libraries, machine_: dict | None = None,
               elapsed_s: float | None = None, *, load: int = 0, first_calls: Iterable[dict] = ()) -> None:
    import datetime

    document = {
        "command": shlex.join(argv),
        "date": datetime.date.today().isoformat(),
        "machine": machine_ or machine(),
        "gpus": gpu_names(libraries),
        "versions": versions(libraries),
        "elapsed_s": elapsed_s,
        "load": load,
        "first_calls": list(first_calls),
        "results": [m.as_dict() for m in results],
    }
    with open(path, "w") as handle:
        json.dump(document, handle, indent=2)
        handle.write("\n")


#: The plot's title, wrapped to the figure's width (it clipped at one library's 5 inches).
PLOT_TITLE = ("GAE time against sequence length (dashed: extrapolated from a prefix; dotted: a copy of the same "
              "bytes)")


def plot_figure(results: list[Measurement]):
    """Time against T, log-log, one panel per library, one line per path and case (chunked paths at their best C).

    Constrained layout; one legend for every panel, below them (a path keeps its
    colour from panel to panel), so that no line is hidden behind it; the
    title wrapped to the figure's width.
    """
    import textwrap

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    libraries = list(dict.fromkeys(m.library for m in results))
    several_cases = len({m.case for m in results}) > 1

    def line_name(m):
        return ("copy floor" if m.path == COPY else m.path) + (f" {m.case}" if several_cases else "")

    names = list(dict.fromkeys(line_name(m) for m in results))
    cycle = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    colors = {name: cycle[i % len(cycle)] for i, name in enumerate(n for n in names if not n.startswith("copy"))}
    columns = max(1, min(len(names), 2 * max(1, len(libraries))))
    legend_rows = -(-len(names) // columns)
    width = 4.6 * max(1, len(libraries)) + 0.4
    title = textwrap.fill(PLOT_TITLE, width=int(width * 72 / (12 * 0.55)))
    figure, axes = plt.subplots(1, max(1, len(libraries)), figsize=(width, 3.6 + 0.22 * legend_rows
                                                                    + 0.25 * title.count("\n")),
                                squeeze=False, layout="constrained")
    handles = {}
    for ax, library in zip(axes[0], libraries):
        best = {}
        for m in results:
            if m.library == library:
                key = (line_name(m), m.T)
                if key not in best or m.median_s < best[key].median_s:
                    best[key] = m
        for name in dict.fromkeys(p for p, _ in best):
            points = sorted((t, m) for (p, t), m in best.items() if p == name)
            floor = points[0][1].path == COPY
            (handles[name],) = ax.plot(
                [t for t, _ in points], [m.median_s for _, m in points], marker="" if floor else "o", label=name,
                color="black" if floor else colors[name],
                linestyle=":" if floor else "--" if any(m.extrapolated_from for _, m in points) else "-")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("T (steps)")
        ax.set_ylabel("seconds per call (median)")
        ax.set_title(library)
        ax.grid(True, which="both", alpha=0.3)
    shown = [name for name in names if name in handles]
    figure.legend([handles[name] for name in shown], shown, loc="outside lower center", ncols=columns,
                  fontsize="small", frameon=False)
    figure.suptitle(title)
    return figure


def write_plot(results: list[Measurement], path: str) -> None:
    """:func:`plot_figure` as a PNG at ``path`` (needs matplotlib)."""
    if importlib.util.find_spec("matplotlib") is None:
        raise SystemExit("--plot needs matplotlib: pip install 'gae_xp[bench]'")
    import matplotlib.pyplot as plt

    figure = plot_figure(results)
    figure.savefig(path, dpi=90)
    plt.close(figure)


def seconds(value: float) -> str:
    if value < 1e-3:
        return f"{value * 1e6:.3g} us"
    return f"{value * 1e3:.3g} ms" if value < 1 else f"{value:.3g} s"


def _timed(m: Measurement) -> str:
    approx = "~" if m.extrapolated_from else ""
    return f"{approx}{seconds(m.median_s)} ±{100 * m.spread_s / m.median_s:.0f}%"


def _bytes(n: int) -> str:
    return f"{n / 2**20:.1f} MiB"


def _cache_words(cache: int | None) -> str:
    return "" if not cache else f"largest cache {cache / 2**20:.0f} MiB, "


def _version(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None
