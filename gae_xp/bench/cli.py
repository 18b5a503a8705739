"""``gae-xp bench``: the options, the run they describe, and what is printed."""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import math
import os
import shlex
import sys
import time

import numpy as np

from gae_xp.bench import noise, paths, report, runner
from gae_xp.testing import libraries

DEFAULT_T = (4096, 32768, 131072)
DEFAULT_B = (8,)
DEFAULT_CHUNKS = (None, 8, 16, 32, 64, 128)
DEFAULT_DONES = 0.01
DEFAULT_HOLES = 0.2
ALIASES = {"torch": "torch:cpu", "jax": "jax:cpu"}
#: ``--load`` without a number: one busy process per usable core.
PER_CORE = -1
DESCRIPTION = ("Is GAE my bottleneck, and what should I set? Times gae_xp's paths against the serial GAE loop "
               "you have now (and slime's chunk scan, scipy's lfilter, a bare numba loop, JAX's lax.scan and "
               "lax.associative_scan; the O(T^2) matrix with --all-paths) on the installed array libraries, side "
               "by side in one process, next to a copy of the same bytes (the memory roofline); prints what is "
               "measured, a table, and a verdict per library: the time per call against the loop and against the "
               "copy floor, the seconds saved per PPO step, every shape where gae_xp is not ahead, whether a chunk "
               "size beats the default on the path auto runs, the first call of a fresh process, and what an "
               "uninstalled extra would give; on a busy machine or wide spreads, which comparisons were too noisy "
               "to tell.")


class _DeprecatedAlias(argparse.Action):
    """An option's old name: it still works, and says which name to use instead."""

    def __init__(self, option_strings, dest, replacement: str, why: str, **kwargs):
        self.replacement, self.why = replacement, why
        super().__init__(option_strings, dest, **kwargs)

    def __call__(self, parser, namespace, values, option_string=None):
        print(f"{parser.prog}: warning: {option_string} is deprecated, use {self.replacement} ({self.why})",
              file=sys.stderr)
        setattr(namespace, self.dest, values)


def _listing(values) -> str:
    return ",".join("auto" if v is None else f"{v:g}" if isinstance(v, float) else str(v) for v in values)


def add_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """The bench's options, each with its default in words."""
    parser.add_argument("--library", type=_libraries, default=None, metavar="LIST",
                        help=f"comma-separated array libraries, from {', '.join(libraries.NAMES)} "
                             "(torch = torch:cpu, jax = jax:cpu) (default: every installed one but array_api_strict)")
    parser.add_argument("--backend", dest="library", type=_libraries, default=None, metavar="LIST",
                        action=_DeprecatedAlias, replacement="--library",
                        why="it selects the array libraries, while gae(backend=...) selects the compute path",
                        help="deprecated name of --library (default: as --library)")
    parser.add_argument("--B", type=_positive_ints, default=DEFAULT_B, metavar="LIST",
                        help=f"comma-separated batch sizes: put yours here (default: {_listing(DEFAULT_B)})")
    parser.add_argument("--T", type=_positive_ints, default=DEFAULT_T, metavar="LIST",
                        help="comma-separated sequence lengths: put yours here; the verdict speaks of the largest "
                             f"B*T (default: {_listing(DEFAULT_T)})")
    parser.add_argument("--chunk-size", type=_chunk_sizes, default=DEFAULT_CHUNKS, metavar="LIST",
                        help="comma-separated chunk sizes, 'auto' for chunk_size=None; swept at the largest B*T "
                             "on the paths that have chunks (the numba kernel has none); a size that runs the "
                             f"same piece length as another is timed once (default: {_listing(DEFAULT_CHUNKS)})")
    parser.add_argument("--cases", type=_cases, default=None, metavar="LIST",
                        help=f"comma-separated cases, from {', '.join(paths.CASES)} (default: constant, or the "
                             "case that --dones and --mask-holes imply when given)")
    parser.add_argument("--dones", type=_fraction, default=None, metavar="P",
                        help="probability of terminated and (independently) of truncated at each step, in the cases "
                             f"with dones (default: {DEFAULT_DONES:g})")
    parser.add_argument("--mask-holes", type=_fraction, default=None, metavar="P",
                        help=f"probability that a step is masked out, in the cases with a mask "
                             f"(default: {DEFAULT_HOLES:g})")
    parser.add_argument("--dtype", choices=("float32", "float64"), default="float32",
                        help="dtype of rewards and values (default: float32)")
    parser.add_argument("--gamma", type=_unit, default=0.99, metavar="G", help="discount (default: 0.99)")
    parser.add_argument("--lam", type=_unit, default=0.95, metavar="L", help="GAE lambda (default: 0.95)")
    parser.add_argument("--repeat", type=positive_int, default=5, metavar="N",
                        help="timed samples per case, each at least "
                             f"{runner.MIN_SAMPLE_S * 1e3:g} ms of calls (default: 5)")
    parser.add_argument("--serial-budget", type=positive_float, default=1.0, metavar="SECONDS",
                        help="seconds of timed samples per case; a Python loop over time (serial, slime-chunked) "
                             "expected to take longer per call runs on a prefix and is extrapolated linearly to T, "
                             "marked ~ (default: 1)")
    parser.add_argument("--threads", type=positive_int, default=None, metavar="N",
                        help="threads for torch's and numba's parallel loops (torch.set_num_threads, "
                             "numba.set_num_threads); on a machine shared with other work, 1 spares torch the "
                             "stalls of a thread pool that waits for a busy core (default: the libraries' own)")
    parser.add_argument("--load", type=_count, nargs="?", const=PER_CORE, default=0, metavar="N",
                        help="start N busy neighbour processes (--load alone: one per usable core) that spin while "
                             "the runs are timed, so that figures under load are reproducible (default: 0, none)")
    parser.add_argument("--no-first-call", dest="first_call", action="store_false",
                        help="do not measure the first call of a fresh process (a subprocess per library and case, "
                             "at the largest shape, after the sweep) (default: measured)")
    parser.add_argument("--no-small-call", dest="small_call", action="store_false",
                        help="do not time the small call (B=8, T=128 float32) against a bare numba loop of the same "
                             "work, side by side, after the sweep (default: timed where numba is installed)")
    parser.add_argument("--profile", action="store_true",
                        help="instead of the sweep, profile backend='auto' calls of every library, case and shape "
                             "asked for (e.g. --B 8 --T 128): where each microsecond of a repeated call goes, after an "
                             "untimed first call has compiled and made the call's plan (default: off)")
    parser.add_argument("--paths", type=_path_names, default=None, metavar="LIST",
                        help="comma-separated paths to run, from " + ", ".join(p.name for p in paths.all_paths())
                             + " (default: all that apply to each library and case, but "
                             + _opt_in_words() + ")")
    parser.add_argument("--all-paths", action="store_true",
                        help=f"also the baselines that cost more than they tell, left out by default: "
                             f"{_opt_in_words()} (default: off)")
    parser.add_argument("--json", metavar="PATH",
                        help="write every measurement, the machine, versions and the command here (default: none)")
    parser.add_argument("--plot", metavar="PATH",
                        help="write a PNG of time against T, needs matplotlib (default: none)")
    return parser


def build_parser(prog: str = "python -m gae_xp bench") -> argparse.ArgumentParser:
    return add_arguments(argparse.ArgumentParser(prog=prog, description=DESCRIPTION))


def run(argv: list[str], prog: str = "python -m gae_xp bench") -> int:
    return execute(build_parser(prog).parse_args(argv), argv, prog)


def execute(options: argparse.Namespace, argv: list[str], prog: str = "python -m gae_xp bench",
            stream=None) -> int:
    stream = stream or sys.stdout
    started = time.perf_counter()
    problem = _output_problems(options)
    if problem:
        print(f"{prog}: {problem}", file=sys.stderr)
        return 2
    names = options.library or [n for n in libraries.NAMES
                                if n != "array_api_strict" and libraries.unavailable(n) is None]
    skipped = {n: libraries.unavailable(n) for n in names if libraries.unavailable(n)}
    for name, reason in skipped.items():
        print(f"skipping {name}: {reason}", file=sys.stderr)
    loaded = tuple(libraries.load(n) for n in names if n not in skipped)
    if not loaded:
        print("no array library to benchmark", file=sys.stderr)
        return 1
    if options.threads is not None:
        set_threads(options.threads)
    dones = DEFAULT_DONES if options.dones is None else options.dones
    holes = DEFAULT_HOLES if options.mask_holes is None else options.mask_holes
    cases = options.cases or [paths.Workload(1, 1, dones=options.dones or 0.0, holes=options.mask_holes or 0.0).case]
    for case in cases:
        p_dones, p_holes = paths.case_probabilities(case, dones, holes)
        if paths.Workload(1, 1, dones=p_dones, holes=p_holes).case != case:
            print(f"{prog}: case {case} needs --dones and --mask-holes above 0 where it names them", file=sys.stderr)
            return 2
    workloads = tuple(paths.Workload(b, t, options.dtype, *paths.case_probabilities(case, dones, holes),
                                     options.gamma, options.lam)
                      for case in cases for b in options.B for t in options.T)
    offered = paths.all_paths() if options.all_paths else paths.default_paths()
    chosen = tuple(p for p in paths.all_paths() if p.name in options.paths) if options.paths else offered
    auto = auto_paths(loaded, options.dtype)
    sweep = runner.Sweep(loaded, workloads, chosen, options.chunk_size, options.repeat, options.serial_budget,
                         swept=auto if options.paths is None else None)
    if not options.profile:
        unmatched = _unmatched_paths(sweep, options.paths is not None)
        if unmatched:
            print(f"{prog}: {unmatched}", file=sys.stderr)
            return 2
    machine = report.machine()
    load = machine["usable_cpus"] if options.load == PER_CORE else options.load
    settings = {
        "what": (f"profile of backend='auto' on {', '.join(library.name for library in loaded)}" if options.profile
                 else f"{sweep.count()} measurements on {', '.join(library.name for library in loaded)}"),
        "B": _listing(options.B), "T": _listing(options.T), "dtype": options.dtype, "gamma": options.gamma,
        "lam": options.lam,
        "cases": ", ".join(f"{c} (dones {d:g}, mask holes {h:g})" if c != "constant" else c
                           for c in cases for d, h in [paths.case_probabilities(c, dones, holes)]),
        "paths": (",".join(options.paths) if options.paths else "all that apply" if options.all_paths
                  else f"all that apply but {_opt_in_words()}, opt in with --all-paths"),
        "chunks": _listing(options.chunk_size), "repeat": options.repeat,
        "min_sample_ms": runner.MIN_SAMPLE_S * 1e3, "serial_budget": options.serial_budget,
        "load": report.load_words(load, machine["usable_cpus"]) + _load_average_words(machine),
    }
    for line in report.header(settings, loaded, machine):
        print(line, file=stream)
    print("", file=stream, flush=True)
    first_calls = []
    seen_load = [machine["load_average"]]
    with runner.busy_neighbours(load):
        if options.profile:
            for library in loaded:
                for workload in workloads:
                    _print_profile(library, workload, auto[library.name], stream)
        else:
            first_call_count = len(sweep.libraries) * len(sweep.largest()) if options.first_call else 0
            with _progress(sweep.count() + first_call_count) as step:
                def on_step(what):
                    seen_load.append(noise.load_average())
                    step(what)

                results = runner.run(sweep, on_case_done=lambda m: on_step(
                    f"{m.library} {m.case} {m.path} T={m.T} C={report.chunk_label(m)}"))
                if options.first_call:
                    first_calls = _first_calls(sweep, options.threads, on_step)
    known = [value for value in seen_load if value is not None]
    conditions = noise.Conditions(max(known) if known else None, machine["usable_cpus"], load)
    machine["load_average_highest"] = conditions.load_average
    if not options.profile:
        report.print_report(results, stream, auto_paths=auto, missing_extras=missing_extras(loaded),
                            notes=sweep.skipped_sizes(), first_calls=first_calls, conditions=conditions)
        if options.small_call and importlib.util.find_spec("numba") is not None:
            from gae_xp.bench import small_calls

            print("\nthe small call against a bare numba loop of the same work (python -m gae_xp.bench.small_calls "
                  "--ratio; targets: 3x NumPy, 4x torch CPU):", file=stream)
            for line in small_calls.ratio_lines(small_calls.ratios(number=500, repeat=5)):
                print(f"  {line}", file=stream)
    elapsed = time.perf_counter() - started
    if options.json:
        report.write_json(results, options.json, [*prog.split(), *argv], loaded, machine, elapsed, load=load,
                          first_calls=first_calls)
        print(f"wrote {options.json}", file=stream)
    if options.plot:
        report.write_plot(results, options.plot)
        print(f"wrote {options.plot}", file=stream)
    print(f"took {_duration(elapsed)} ({' '.join([prog, *map(shlex.quote, argv)])})", file=stream)
    return 0


def _output_problems(options) -> str | None:
    """Why ``--json``/``--plot`` could not be written, found before anything runs (a run's results are not lost)."""
    if options.profile and (options.json or options.plot):
        return "--profile prints a profile: --json and --plot take the sweep's measurements, so not with --profile"
    if options.plot and importlib.util.find_spec("matplotlib") is None:
        return "--plot needs matplotlib: pip install 'gae_xp[bench]'"
    for option, path in (("--json", options.json), ("--plot", options.plot)):
        problem = None if path is None else unwritable(path)
        if problem:
            return f"{option} {path}: {problem}"
    return None


def unwritable(path: str) -> str | None:
    """Why a file cannot be written at ``path`` (tried, then removed again if it was not there), or None."""
    existed = os.path.exists(path)
    try:
        with open(path, "a"):
            pass
    except OSError as error:
        return f"cannot write there ({error.strerror or error})"
    if not existed:
        os.remove(path)
    return None


def _unmatched_paths(sweep: runner.Sweep, named: bool) -> str | None:
    """What matched nothing: a path of ``--paths`` that runs on no library and case of this run (or no case at all).

    A named path that runs on some of them only is noted on stderr, with why not on the others.
    """
    cases = sweep.cases()
    if not named:
        return None if cases else "nothing to run: no path applies to these libraries and cases"
    used = {path.name for _, _, path, _ in cases}
    problems = []
    every_case = list(dict.fromkeys(w.case for w in sweep.workloads))
    for path in sweep.paths:
        reasons: dict[tuple[str, str], list[str]] = {}
        for library in sweep.libraries:
            for workload in sweep.workloads:
                reason = path.skip_reason(library, workload)
                if reason is not None:
                    cases = reasons.setdefault((library.name, reason), [])
                    cases.extend([] if workload.case in cases else [workload.case])
        listed = "; ".join(f"{name}{'' if cases == every_case else ' ' + ', '.join(cases)}: {why}"
                           for (name, why), cases in reasons.items())
        if path.name not in used:
            problems.append(f"--paths {path.name} matches nothing in this run ({listed})")
        elif reasons:
            print(f"note: {path.name} does not run on {listed}", file=sys.stderr)
    return "; ".join(problems) or None


def _first_calls(sweep: runner.Sweep, threads: int | None, on_step=lambda what: None) -> list[dict]:
    """``runner.first_call`` per library and case, at the case's largest workload (``on_step`` after each)."""
    out = []
    for library in sweep.libraries:
        for workload in sweep.largest().values():
            out.append({"library": library.name, "B": workload.B, "T": workload.T, "case": workload.case,
                        **runner.first_call(library.name, workload, threads)})
            on_step(f"first call of a fresh process: {library.name} {workload.case}")
    return out


def _print_profile(library, workload, auto_path: str, stream) -> None:
    import gae_xp

    arrays = {k: library.asarray(v) for k, v in workload.arrays().items()}

    def call():
        library.synchronize(gae_xp.gae(**arrays, gamma=workload.gamma, lam=workload.lam,
                                       truncated_bootstrap="next_step"))  # the workload's truncations

    call()  # compilation and caches, outside the profile
    timing, profiled, lines = runner.profile(call)
    title = f"{library.name}, B={workload.B}, T={workload.T}, {workload.case}: backend='auto' runs {auto_path}"
    for line in report.profile_lines(title, timing, profiled, lines):
        print(line, file=stream)
    print("", file=stream, flush=True)


def set_threads(n: int) -> None:
    """Threads of torch's intra-op pool and of numba's parallel loops (where installed); JAX fixes its own at start."""
    import importlib.util

    if "torch" in sys.modules:
        sys.modules["torch"].set_num_threads(n)
    if importlib.util.find_spec("numba") is not None:
        import numba

        numba.set_num_threads(min(n, numba.config.NUMBA_NUM_THREADS))


def auto_paths(loaded, dtype: str) -> dict[str, str]:
    """The path ``backend="auto"`` takes for each library's arrays of this dtype."""
    from gae_xp import backends

    out = {}
    for library in loaded:
        sample = library.asarray(np.zeros((1, 2), dtype=dtype))
        out[library.name] = f"gae_xp[{backends.select('auto', library.xp, [sample]).name}]"
    return out


def missing_extras(loaded) -> list[str]:
    """The extras (numba, numba-cuda) whose backend says 'not installed' for arrays of this run."""
    from gae_xp import backends

    missing = []
    for extra, (_, backend, serves) in report.EXTRAS.items():
        if backend not in backends.REGISTRY:
            continue
        for library in loaded:
            if library.name in serves:
                sample = library.asarray(np.zeros((1, 2), dtype="float32"))
                reason = backends.load(backend).unavailable_reason(library.xp, [sample], forced=True) or ""
                if "not installed" in reason:
                    missing.append(extra)
                    break
    return missing


def _duration(seconds: float) -> str:
    minutes, rest = divmod(round(seconds), 60)
    return f"{minutes} min {rest} s" if minutes else f"{seconds:.1f} s"


@contextlib.contextmanager
def _progress(total: int):
    """``step(what)`` after each of ``total`` steps: rich's transient bar (gone once done), else ``[k/n]`` on stderr."""
    try:
        from rich.progress import Progress
    except ImportError:
        done = [0]

        def step(what):
            done[0] += 1
            print(f"[{done[0]}/{total}] {what}", file=sys.stderr)

        yield step
        return
    with Progress(transient=True, console=None) as progress:
        task = progress.add_task("benchmarking", total=total)
        yield lambda what: progress.update(task, advance=1, description=what)


def _opt_in_words() -> str:
    """``matrix (O(T^2) time and memory: ...)``: the opt-in paths and why each is left out by default."""
    return "; ".join(f"{p.name} ({p.opt_in})" for p in paths.all_paths() if p.opt_in is not None) or "none"


def _load_average_words(machine: dict) -> str:
    """``; load average 2.8 (1 min) before the run, on 2 usable cores``: the others' load, with the figures."""
    if machine.get("load_average") is None:
        return ""
    return (f"; load average {machine['load_average']:.2g} (1 min) before the run, on {machine['usable_cpus']} "
            "usable cores")


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


def _cases(text):
    names = _split(text)
    unknown = [n for n in names if n not in paths.CASES]
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown case {', '.join(unknown)}; choose from {', '.join(paths.CASES)}")
    return list(dict.fromkeys(names))


def _path_names(text):
    known = [p.name for p in paths.all_paths()]
    names = _split(text)
    unknown = [n for n in names if n not in known]
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown path {', '.join(unknown)}; choose from {', '.join(known)}")
    return names


def _integer(text) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None


def positive_int(text) -> int:
    """An argparse type: an integer above 0 (``gae-xp adapters`` takes its sizes and samples with it too)."""
    value = _integer(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{value} is not positive")
    return value


def _count(text) -> int:
    value = _integer(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"{value} is negative")
    return value


def _positive_ints(text):
    return tuple(positive_int(item) for item in _split(text))


def _chunk_sizes(text):
    return tuple(dict.fromkeys(None if item == "auto" else positive_int(item) for item in _split(text)))


def _number(text):
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None


def positive_float(text) -> float:
    """An argparse type: a finite number above 0."""
    value = _number(text)
    if not 0 < value < math.inf:
        raise argparse.ArgumentTypeError(f"{value} is not a finite positive number")
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
