"""The bench command's outputs: the table, the verdicts, the JSON file and the plot."""

from __future__ import annotations

import json
import os
import platform
import sys
from collections import defaultdict
from importlib import metadata

from gae_xp.bench.runner import Measurement

COLUMNS = ("library", "path", "B", "T", "C", "median", "spread", "vs serial", "max error", "peak mem")


def rows(results: list[Measurement]) -> list[tuple[str, ...]]:
    out = []
    for m in results:
        approx = "~" if m.extrapolated_from else ""
        out.append((
            m.library, m.path, str(m.B), str(m.T),
            "auto" if m.chunk_size is None and m.path.startswith("gae_xp") else (str(m.chunk_size) if m.chunk_size else "-"),
            f"{approx}{_ms(m.median_s)}",
            f"±{50 * (m.p75_s - m.p25_s) / m.median_s:.0f}%",
            "-" if m.speedup_vs_serial is None else f"{m.speedup_vs_serial:.1f}x",
            "-" if m.max_abs_error is None else f"{m.max_abs_error:.1e}",
            "-" if m.peak_bytes is None else _bytes(m.peak_bytes),
        ))
    return out


def verdicts(results: list[Measurement]) -> list[str]:
    """One line per library: the fastest gae_xp path and chunk size at its largest workload, and its speed-up."""
    by_library = defaultdict(list)
    for m in results:
        by_library[m.library].append(m)
    lines = []
    for library, measured in by_library.items():
        largest = max((m.B * m.T, m.T) for m in measured)
        here = [m for m in measured if (m.B * m.T, m.T) == largest]
        ours = [m for m in here if m.path.startswith("gae_xp")]
        if not ours:
            lines.append(f"{library}: no gae_xp path ran")
            continue
        best = min(ours, key=lambda m: m.median_s)
        auto = next((m for m in ours if m.path == best.path and m.chunk_size is None), None)
        size = "chunk_size=None (auto)" if best.chunk_size is None else f"chunk_size={best.chunk_size}"
        line = f"{library}: use {size} ({best.path}) at B={best.B}, T={best.T}: {_ms(best.median_s)}"
        if best.speedup_vs_serial is not None:
            marked = " (serial time extrapolated)" if _serial_extrapolated(here) else ""
            line += f", {best.speedup_vs_serial:.0f}x faster than the serial loop{marked}"
        if auto is not None and auto is not best:
            line += f"; auto takes {_ms(auto.median_s)}"
        lines.append(line)
    return lines


def _serial_extrapolated(measured):
    return any(m.path == "serial" and m.extrapolated_from for m in measured)


def print_report(results: list[Measurement], stream=None) -> None:
    stream = stream or sys.stdout
    table = rows(results)
    try:
        from rich.console import Console
        from rich.markup import escape
        from rich.table import Table
    except ImportError:
        widths = [max(len(c), *(len(r[i]) for r in table)) for i, c in enumerate(COLUMNS)]
        for line in [COLUMNS, *table]:
            print("  ".join(cell.rjust(w) for cell, w in zip(line, widths)), file=stream)
    else:
        rich_table = Table(title="gae_xp bench (~ = time extrapolated from a prefix; "
                                 "spread = half the interquartile range)")
        for column in COLUMNS:
            rich_table.add_column(column, justify="left" if column in ("library", "path") else "right")
        for row in table:
            rich_table.add_row(*map(escape, row))
        Console(file=stream, width=None if stream.isatty() else 140).print(rich_table)
    for line in verdicts(results):
        print(line, file=stream)


def write_json(results: list[Measurement], path: str, argv: list[str], libraries) -> None:
    document = {
        "command": " ".join(argv),
        "machine": {"platform": platform.platform(), "processor": platform.processor(), "python": sys.version,
                    "cpus": os.cpu_count()},
        "versions": {"gae_xp": _version("gae_xp"), "numpy": _version("numpy"),
                     "array-api-compat": _version("array-api-compat"),
                     **{library.name: library.version for library in libraries}},
        "results": [m.as_dict() for m in results],
    }
    with open(path, "w") as handle:
        json.dump(document, handle, indent=2)


def write_plot(results: list[Measurement], path: str) -> None:
    """Time against T, log-log, one panel per library, one line per path (chunked paths at their best C)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise SystemExit("--plot needs matplotlib: pip install 'gae_xp[bench]'") from None
    libraries = list(dict.fromkeys(m.library for m in results))
    figure, axes = plt.subplots(1, len(libraries), figsize=(5 * len(libraries), 4), squeeze=False)
    for ax, library in zip(axes[0], libraries):
        best = {}
        for m in results:
            if m.library != library:
                continue
            key = (m.path, m.T)
            if key not in best or m.median_s < best[key].median_s:
                best[key] = m
        for name in dict.fromkeys(p for p, _ in best):
            points = sorted((t, m) for (p, t), m in best.items() if p == name)
            ts = [t for t, _ in points]
            ax.plot(ts, [m.median_s for _, m in points], marker="o", label=name,
                    linestyle="--" if any(m.extrapolated_from for _, m in points) else "-")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("T (steps)")
        ax.set_ylabel("seconds per call (median)")
        ax.set_title(library)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize="small")
    figure.suptitle("GAE time against sequence length (dashed: extrapolated from a prefix)")
    figure.tight_layout()
    figure.savefig(path, dpi=90)
    plt.close(figure)


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.3g} ms" if seconds < 1 else f"{seconds:.3g} s"


def _bytes(n: int) -> str:
    return f"{n / 2**20:.1f} MiB"


def _version(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None
