"""``python -m gae_xp.bench.small_calls``: where the microseconds of a small ``gae()`` call go, stage by stage.

    python -m gae_xp.bench.small_calls [--B 8] [--T 128] [--cases constant,dones+mask] [--number 2000]
    python -m gae_xp.bench.small_calls --ratio        (gae() against a bare numba loop, side by side)
    python -m gae_xp.bench.small_calls --first-call   (a fresh process's first call: empty cache, then written)
    valgrind --tool=callgrind python -m gae_xp.bench.small_calls --calls N     (instructions, see below)

Each stage of ``gae_xp.gae(rewards, values, ...)`` on NumPy arrays with
``backend="auto"`` is called on its own, ``--number`` times in a row, and
timed by the calling thread's CPU clock (``time.thread_time``: the time the
thread ran, not the time it waited for a core, so a busy machine changes it
less than wall time); the figure is the best of ``--repeat`` such batches,
per call. A stage timed alone runs with its code and data in cache, so the
stages add up to less than the whole call; the difference is printed as
"the rest". The stages: the argument checks and the layout
(``gae_xp._prepare.prepare`` and its parts), the backend's choice
(``gae_xp.backends.solver``: a dictionary lookup after the first call), the
backend's own layout around its kernel, the kernel itself (called directly
with the arguments the backend gives it), and the restoring of the
caller's dtype and axis. docs/small-calls.md has the figures and what was
cut.

``--ratio`` times, in turns in one run (a busy machine slows each alike),
``gae()`` on NumPy arrays and on torch CPU tensors against a bare numba loop
that does the same work on the same arrays (allocates its two outputs, one
pass from the last step; with dones and a mask, the cut and the skip), and
prints each as a multiple of the bare loop: what the call costs beyond its
arithmetic (the issue's targets: at most 3x for NumPy, 4x for torch).

``--first-call`` runs, per case and row length (B=8, T=128 and 4096 float32:
rows shorter than the kernels' window compile the walk alone), a fresh
interpreter that imports gae_xp and makes one call (``backend="auto"``; T=4096
is asv's ``TrackFirstCall``) with an empty numba cache (``NUMBA_CACHE_DIR`` a
new temporary directory: numba compiles the call's kernels), and then another
with that cache written (numba loads them); then the same with
``gae_xp.warm_up()`` called first, as a trainer calls it at start-up (its
time apart, the call's after it); then the case's bare numba loop, the floor
of any numba kernel's first call. It prints each one's wall time from before
the import to after the call, the call's part, the import's and warm_up's,
and the process's CPU time (a busy machine stretches the wall time, not the
CPU).

``--calls N`` times nothing: it makes 50 warm-up calls and then N calls of
the first case, for an instruction count that no other work on the machine
changes: the difference between ``valgrind --tool=callgrind`` runs with two
values of N, divided by their difference, is the instructions per call (run
each N twice: the first run under valgrind compiles the numba kernel for
valgrind's CPU and caches it).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import timeit


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m gae_xp.bench.small_calls", description=__doc__.splitlines()[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--B", type=int, default=8)
    parser.add_argument("--T", type=int, default=128)
    parser.add_argument("--cases", default="constant,dones+mask")
    parser.add_argument("--number", type=int, default=2000, help="calls per batch")
    parser.add_argument("--repeat", type=int, default=7, help="batches; the best is kept")
    parser.add_argument("--calls", type=int, default=None, help="only make this many calls (for valgrind)")
    parser.add_argument("--ratio", action="store_true", help="only gae() against a bare numba loop, side by side")
    parser.add_argument("--first-call", action="store_true",
                        help="only the first call of a fresh process, with an empty numba cache and then a written one")
    return parser


def stages(case: dict) -> list[tuple[str, object]]:
    """(name, call) for every stage of one ``gae()`` call on these NumPy arrays, the whole call first."""
    import numpy as np

    import gae_xp
    from gae_xp import _prepare as prepare_
    from gae_xp import backends
    from gae_xp._compat import array_namespace

    rewards, values = case["rewards"], case["values"]
    options = {k: v for k, v in case.items() if k not in ("rewards", "values")}
    call = prepare_.prepare(rewards, values, **options)
    problem, solver = call.problem, backends.solver(call)
    advantages, returns = backends.solve_gae(problem, solver, None)
    xp = array_namespace(rewards)
    shape, dtype = rewards.shape, problem.rewards.dtype
    present = {"rewards": rewards, "values": values,
               **{k: v for k, v in options.items() if isinstance(v, np.ndarray)}}
    flags = [name for name in ("terminated", "truncated", "mask") if name in options]
    out = [
        ("gae() auto", lambda: gae_xp.gae(rewards, values, **options)),
        ("prepare: all of it", lambda: prepare_.prepare(rewards, values, **options)),
        ("  namespace and device", lambda: (prepare_.namespace_of(present),
                                            prepare_.check_same_device(present, "rewards"))),
        ("  dtypes", lambda: prepare_.compute_dtypes(xp, {"rewards": rewards, "values": values,
                                                          "next_values": None, "bootstrap_value": None}, rewards)),
        ("  rewards, values laid out", lambda: (prepare_.time_last(xp, rewards, dtype, 1),
                                                prepare_.time_last(xp, values, dtype, 1))),
        ("  gamma, lam checked", lambda: (prepare_.coefficient(xp, "gamma", 0.99, shape, dtype, 1, bounds=(0.0, 1.0)),
                                          prepare_.coefficient(xp, "lam", 0.95, shape, dtype, 1, bounds=(0.0, 1.0)))),
        ("  bootstrap value made", lambda: prepare_.boundary(xp, "bootstrap_value", 0.0, shape[:-1], dtype,
                                                             rewards)),
    ]
    if flags:
        out.append((f"  {len(flags)} flags checked", lambda: [prepare_.flag(xp, name, options[name], shape, 1)
                                                               for name in flags]))
    out += [
        ("  the problem's records", lambda: (prepare_.GaeProblem(xp=xp, rewards=rewards, values=values, gamma=0.99,
                                                                lam=0.95, bootstrap=problem.bootstrap),
                                            prepare_.PreparedCall(problem, call.arrays, "auto", None, dtype, 1))),
        ("backend chosen (auto, remembered)", lambda: backends.solver(call)),
        (f"backend {solver.name}: all of it", lambda: backends.solve_gae(problem, solver, None)),
    ]
    out += _kernel_stages(solver, problem)
    out.append(("restore x2", lambda: (call.restore(advantages), call.restore(returns))))
    return out


def _kernel_stages(solver, problem) -> list[tuple[str, object]]:
    """The numba backend's own layout and its kernel called directly (none for another backend)."""
    if solver.name != "numba":
        return []
    import numpy as np

    from gae_xp.backends import numba_cpu

    shape = problem.rewards.shape
    rows = numba_cpu._rows(problem.rewards)
    values = numba_cpu._rows(problem.values)
    bounds = numba_cpu._bounds(problem, shape)
    kernel = numba_cpu._driver(problem)
    steps = numba_cpu._steps(problem, rows.shape, kernel)
    spans = numba_cpu._spans(rows.shape[0], bounds[2], 1)
    outputs = (np.empty(rows.shape, rows.dtype), np.empty(rows.shape, rows.dtype))
    units = rows.shape[0] * (spans.shape[0] - 1)

    def launch():
        kernel(rows, values, steps, bounds, problem.fill_masked, *outputs, spans, 0, units)

    stages = [("  per-segment values laid out", lambda: numba_cpu._bounds(problem, shape)),
              ("  two outputs allocated", lambda: (np.empty(rows.shape, rows.dtype), np.empty(rows.shape, rows.dtype)))]
    if kernel is not numba_cpu._kernels().constant_units:
        stages.append(("  per-step arrays laid out", lambda: numba_cpu._steps(problem, rows.shape, kernel)))
    stages.append(("  the kernel (called directly)", launch))
    return stages


#: The cases of ``--ratio``: constant discount, and terminations (1 %) with a mask (20 % holes).
RATIO_CASES = ("constant", "dones+mask")


def _bare_loops():
    """The bare numba loops a user would write for the two cases (compiled on first use, cached in gae_xp's cache
    directory: ``gae_xp.backends._numba_cache``)."""
    import numba
    import numpy as np

    from gae_xp.backends._numba_cache import install

    install()

    @numba.njit(cache=True)
    def constant(rewards, values, gamma, lam):
        advantages, returns = np.empty_like(rewards), np.empty_like(rewards)
        for row in range(rewards.shape[0]):
            following = next_value = 0.0
            for t in range(rewards.shape[1] - 1, -1, -1):
                following = rewards[row, t] + gamma * next_value - values[row, t] + gamma * lam * following
                next_value = values[row, t]
                advantages[row, t] = following
                returns[row, t] = following + next_value
        return advantages, returns

    @numba.njit(cache=True)
    def dones_mask(rewards, values, terminated, mask, gamma, lam):
        advantages, returns = np.empty_like(rewards), np.empty_like(rewards)
        for row in range(rewards.shape[0]):
            following = next_value = 0.0
            for t in range(rewards.shape[1] - 1, -1, -1):
                if not mask[row, t]:
                    advantages[row, t] = returns[row, t] = 0.0
                    continue
                if terminated[row, t]:
                    following = rewards[row, t] - values[row, t]
                else:
                    following = rewards[row, t] + gamma * next_value - values[row, t] + gamma * lam * following
                next_value = values[row, t]
                advantages[row, t] = following
                returns[row, t] = following + next_value
        return advantages, returns

    return constant, dones_mask


def ratio_case(case_name: str, B: int, T: int, seed: int = 0):
    """(gae()'s keyword arguments as NumPy arrays, the bare loop's call) for a case of ``--ratio``."""
    import numpy as np

    from gae_xp.testing import make_case

    extra = {} if case_name == "constant" else {"dones": 0.01, "holes": 0.2}
    case = make_case(np.random.default_rng(seed), (B, T), dtype=np.float32, **extra)
    case.pop("truncated", None)  # the bare loop's dones are terminations
    constant, dones_mask = _bare_loops()
    if case_name == "constant":
        return case, lambda c: constant(c["rewards"], c["values"], c["gamma"], c["lam"])
    return case, lambda c: dones_mask(c["rewards"], c["values"], c["terminated"], c["mask"], c["gamma"], c["lam"])


def ratios(B: int = 8, T: int = 128, number: int = 2000, repeat: int = 7, cases=RATIO_CASES) -> list[dict]:
    """Per case, microseconds per call (CPU time of the calling thread, the best of ``repeat`` rounds of
    ``number`` calls, the contenders timed in turns within each round) of the bare numba loop, of ``gae()`` on
    NumPy arrays and (where torch is installed) on torch CPU tensors, and the multiples of the bare loop. The
    results are compared first: the bare loop does the same work."""
    import importlib.util

    import numpy as np

    import gae_xp

    out = []
    for case_name in cases:
        case, bare = ratio_case(case_name, B, T)
        contenders = {"bare numba loop": lambda: bare(case), "gae() NumPy": lambda: gae_xp.gae(**case)}
        if importlib.util.find_spec("torch") is not None:
            import torch

            tensors = {k: torch.from_numpy(v) if isinstance(v, np.ndarray) else v for k, v in case.items()}
            contenders["gae() torch CPU"] = lambda: gae_xp.gae(**tensors)
        expected = bare(case)
        for name, call in contenders.items():
            for got, want in zip(call(), expected):
                np.testing.assert_allclose(np.asarray(got), want, rtol=1e-4, atol=1e-4, err_msg=name)
        best = dict.fromkeys(contenders, float("inf"))
        for _ in range(repeat):
            for name, call in contenders.items():
                best[name] = min(best[name], timeit.timeit(call, number=number, timer=time.thread_time))
        us = {name: seconds / number * 1e6 for name, seconds in best.items()}
        base = us["bare numba loop"]
        out.append({"case": case_name, "B": B, "T": T, "us": us,
                    "ratio": {name: value / base for name, value in us.items() if name != "bare numba loop"}})
    return out


def ratio_lines(measured: list[dict]) -> list[str]:
    """What ``ratios`` measured, one line per contender."""
    lines = []
    for m in measured:
        lines.append(f"{m['case']} (B={m['B']}, T={m['T']}, float32):")
        for name, us in m["us"].items():
            ratio = m["ratio"].get(name)
            lines.append(f"  {name:18s} {us:7.2f} us" + ("" if ratio is None else f"   {ratio:5.2f}x the bare loop"))
    return lines


def _cpu_name() -> str:
    import platform

    try:
        with open("/proc/cpuinfo") as info:
            for line in info:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


#: Run by ``first_call`` in a fresh interpreter: seconds to import gae_xp and to make the first call, CPU seconds.
_FIRST_CALL = """
import sys, time
import numpy as np
started = time.perf_counter()
import gae_xp
imported = time.perf_counter()
rng = np.random.default_rng(0)
shape = (8, int(sys.argv[2]))
r = rng.standard_normal(shape).astype(np.float32)
options = {} if sys.argv[1] == "constant" else {"terminated": rng.random(shape) < 0.01,
                                                 "mask": rng.random(shape) >= 0.2}
warmed = time.perf_counter()
if sys.argv[3] == "warm_up":  # a trainer's start-up, then its first call
    gae_xp.warm_up()
called = time.perf_counter()
if sys.argv[3] in ("gae", "warm_up"):
    gae_xp.gae(r, r, **options)
else:  # the bare numba loop of the case, numba's import included as in gae()'s first call
    from gae_xp.bench.small_calls import ratio_case
    case, bare = ratio_case(sys.argv[1], *shape)
    bare(case)
print(imported - started, time.perf_counter() - called, time.perf_counter() - started, time.process_time(),
      called - warmed)
"""


#: The first call's row lengths (B=8, float32): shorter than the kernels' window (their walk alone is compiled) and
#: longer (the window kernels).
FIRST_CALL_LENGTHS = (128, 4096)


#: What makes a fresh process's first call: ``gae()``; ``gae_xp.warm_up()`` at start-up, then ``gae()``; the case's
#: bare numba loop of ``--ratio`` (numba's floor).
CONTENDERS = ("gae", "warm_up", "bare")


def first_call(case: str, cache: str, length: int = 4096, contender: str = "gae") -> dict:
    """A fresh interpreter's import and first call of ``case`` ("constant" or "dones+mask") on (8, length) float32
    with ``NUMBA_CACHE_DIR=cache``, by one of ``CONTENDERS``: ``{"import_s", "call_s", "wall_s", "cpu_s",
    "warm_up_s"}`` (``warm_up_s`` 0 but for ``warm_up``, whose ``wall_s`` holds it too)."""
    import subprocess

    done = subprocess.run([sys.executable, "-c", _FIRST_CALL, case, str(length), contender], capture_output=True,
                          text=True,
                          check=True,
                          env={**os.environ, "NUMBA_CACHE_DIR": cache}, timeout=600)
    return dict(zip(("import_s", "call_s", "wall_s", "cpu_s", "warm_up_s"), map(float, done.stdout.split())))


def first_call_lines(cases: list[str]) -> list[str]:
    """Per case, the first call on an empty numba cache and then on the cache it wrote."""
    import tempfile

    lines = ["first call of a fresh process, B=8 float32: wall from before the import to after the call "
             "(the call's part, the import's, warm_up()'s), CPU of the process; gae(); gae_xp.warm_up() at "
             "start-up, then gae(); the case's bare numba loop (its floor: numba's import and set-up, and "
             "compiling or loading ten lines)"]
    for length in FIRST_CALL_LENGTHS:
        for case in cases:
            for contender in CONTENDERS:
                with tempfile.TemporaryDirectory() as cache:
                    for state in ("empty cache", "cache written"):
                        t = first_call(case, cache, length, contender)
                        lines.append(f"  T={length:<5d} {case:11s} {contender:7s} {state:14s} {t['wall_s']:6.2f} s "
                                     f"(call {t['call_s']:5.2f} s, import {t['import_s']:4.2f} s, warm_up "
                                     f"{t['warm_up_s']:5.2f} s), CPU {t['cpu_s']:5.2f} s")
    return lines


def main(argv=None) -> int:
    options = build_parser().parse_args(argv)
    import numpy as np

    from gae_xp.testing import make_case

    if options.first_call:
        print(f"CPU: {_cpu_name()}, {os.cpu_count()} logical cores; load average {os.getloadavg()[0]:.1f}")
        for line in first_call_lines([c for c in options.cases.split(",") if c]):
            print(line)
        return 0

    if options.ratio:
        print(f"CPU: {_cpu_name()}, {os.cpu_count()} logical cores; CPU time of the calling thread per call, the "
              f"best of {options.repeat} rounds of {options.number} calls, the contenders in turns\n")
        cases = [c for c in options.cases.split(",") if c]
        for line in ratio_lines(ratios(options.B, options.T, options.number, options.repeat, cases)):
            print(line)
        return 0

    if options.calls is not None:
        import gae_xp

        extra = {} if options.cases.split(",")[0] == "constant" else {"dones": 0.01, "holes": 0.2}
        case = make_case(np.random.default_rng(0), (options.B, options.T), dtype=np.float32, **extra)
        for _ in range(50 + options.calls):
            gae_xp.gae(**case)
        return 0
    print(f"NumPy, B={options.B}, T={options.T}, float32, backend='auto'; per call, the best of {options.repeat} "
          f"batches of {options.number} calls, CPU time of the calling thread (wall time for the whole call)\n")
    for case_name in [c for c in options.cases.split(",") if c]:
        extra = {} if case_name == "constant" else {"dones": 0.01, "holes": 0.2}
        case = make_case(np.random.default_rng(0), (options.B, options.T), dtype=np.float32, **extra)
        print(f"{case_name}:")
        measured = {}
        for name, call in stages(case):
            call()
            best = min(timeit.repeat(call, number=options.number, repeat=options.repeat, timer=time.thread_time))
            measured[name] = best / options.number * 1e6
        wall = min(timeit.repeat(stages(case)[0][1], number=options.number, repeat=options.repeat))
        whole = measured["gae() auto"]
        for name, us in measured.items():
            print(f"  {name:38s} {us:6.2f} us" + (f"   (wall {wall / options.number * 1e6:.2f} us)"
                                                   if name == "gae() auto" else ""))
        top = [name for name in measured if not name.startswith(" ") and name != "gae() auto"]
        rest = whole - sum(measured[name] for name in top)
        print(f"  {'the rest (gae() itself, cache misses)':38s} {rest:6.2f} us\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
