"""Command-line options of ``python -m gae_xp bench`` and the run they describe."""

from __future__ import annotations

import argparse
import sys

from gae_xp.bench import libraries, paths, report, runner

DEFAULT_T = (4096, 32768, 131072)
DEFAULT_CHUNKS = (None, 32, 64, 128, 256)
ALIASES = {"torch": "torch:cpu", "jax": "jax:cpu"}


def build_parser(prog: str = "python -m gae_xp bench") -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=prog,
        description="Time gae_xp against the serial GAE loop (and slime's chunk scan, the O(T^2) matrix, "
                    "scipy's lfilter) on the installed array libraries; print a table and a verdict per library.",
    )
    parser.add_argument("--backend", type=_libraries, default=None, metavar="LIST",
                        help=f"comma-separated array libraries, from {', '.join(libraries.NAMES)} "
                             "(torch = torch:cpu, jax = jax:cpu); default: every installed one but array_api_strict")
    parser.add_argument("--T", type=_positive_ints, default=DEFAULT_T, metavar="LIST",
                        help="comma-separated sequence lengths (default: %(default)s)")
    parser.add_argument("--B", type=_positive_ints, default=(8,), metavar="LIST",
                        help="comma-separated batch sizes (default: 8)")
    parser.add_argument("--chunk-size", type=_chunk_sizes, default=DEFAULT_CHUNKS, metavar="LIST",
                        help="comma-separated chunk sizes, 'auto' for gae_xp's rule (default: auto,32,64,128,256)")
    parser.add_argument("--dtype", choices=("float32", "float64"), default="float32")
    parser.add_argument("--dones", type=_fraction, default=0.0, metavar="P",
                        help="probability of terminated and of truncated at each step (default 0)")
    parser.add_argument("--mask-holes", type=_fraction, default=0.0, metavar="P",
                        help="probability that a step is masked out (default 0)")
    parser.add_argument("--gamma", type=_unit, default=0.99)
    parser.add_argument("--lam", type=_unit, default=0.95)
    parser.add_argument("--repeat", type=_positive_int, default=5, help="timed runs per case (default 5)")
    parser.add_argument("--serial-budget", type=_positive_float, default=1.0, metavar="SECONDS",
                        help="a path with a Python loop over time (serial, slime-chunked) expected to take longer "
                             "than this runs on a prefix and is extrapolated linearly to T, marked ~ (default 1)")
    parser.add_argument("--paths", type=_path_names, default=None, metavar="LIST",
                        help="comma-separated paths to run (default: all): "
                             + ", ".join(p.name for p in paths.all_paths()))
    parser.add_argument("--json", metavar="PATH", help="write every measurement, the machine and versions here")
    parser.add_argument("--plot", metavar="PATH", help="write a PNG of time against T (needs matplotlib)")
    return parser


def run(argv: list[str]) -> int:
    options = build_parser().parse_args(argv)
    names = options.backend or [n for n in libraries.NAMES if n != "array_api_strict" and libraries.unavailable(n) is None]
    skipped = {n: libraries.unavailable(n) for n in names if libraries.unavailable(n)}
    for name, reason in skipped.items():
        print(f"skipping {name}: {reason}", file=sys.stderr)
    loaded = tuple(libraries.load(n) for n in names if n not in skipped)
    if not loaded:
        print("no array library to benchmark", file=sys.stderr)
        return 1
    workloads = tuple(paths.Workload(b, t, options.dtype, options.dones, options.mask_holes, options.gamma, options.lam)
                      for b in options.B for t in options.T)
    chosen = tuple(p for p in paths.all_paths() if options.paths is None or p.name in options.paths)
    sweep = runner.Sweep(loaded, workloads, chosen, options.chunk_size, options.repeat, options.serial_budget)
    results = _run_with_progress(sweep)
    report.print_report(results)
    if options.json:
        report.write_json(results, options.json, ["python", "-m", "gae_xp", "bench", *argv], loaded)
        print(f"wrote {options.json}")
    if options.plot:
        report.write_plot(results, options.plot)
        print(f"wrote {options.plot}")
    return 0


def _run_with_progress(sweep):
    total = len(sweep.cases())
    try:
        from rich.progress import Progress
    except ImportError:
        done = []

        def step(m):
            done.append(m)
            print(f"[{len(done)}/{total}] {m.library} {m.path} T={m.T} C={m.chunk_size}", file=sys.stderr)

        return runner.run(sweep, on_case_done=step)
    with Progress(transient=True) as progress:
        task = progress.add_task("benchmarking", total=total)
        return runner.run(sweep, on_case_done=lambda m: progress.update(
            task, advance=1, description=f"{m.library} {m.path} T={m.T}"))


def _split(text: str) -> list[str]:
    items = [item.strip() for item in text.split(",") if item.strip()]
    if not items:
        raise argparse.ArgumentTypeError("expected a comma-separated list")
    return items


def _libraries(text):
    names = [ALIASES.get(n, n) for n in _split(text)]
    unknown = [n for n in names if n not in libraries.NAMES]
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown {', '.join(unknown)}; choose from {', '.join(libraries.NAMES)}")
    return names


def _path_names(text):
    known = [p.name for p in paths.all_paths()]
    names = _split(text)
    unknown = [n for n in names if n not in known]
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown path {', '.join(unknown)}; choose from {', '.join(known)}")
    return names


def _positive_int(text):
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{value} is not positive")
    return value


def _positive_ints(text):
    return tuple(_positive_int(item) for item in _split(text))


def _chunk_sizes(text):
    return tuple(None if item == "auto" else _positive_int(item) for item in _split(text))


def _number(text):
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None


def _positive_float(text):
    value = _number(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"{value} is not positive")
    return value


def _fraction(text):
    value = _number(text)
    if not 0 <= value < 1:
        raise argparse.ArgumentTypeError(f"{value} is not in [0, 1)")
    return value


def _unit(text):
    value = _number(text)
    if not 0 <= value <= 1:
        raise argparse.ArgumentTypeError(f"{value} is not in [0, 1]")
    return value
