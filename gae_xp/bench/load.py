"""``python -m gae_xp.bench.load``: the generic path on a busy machine, the libraries' default threads against one.

    python -m gae_xp.bench.load [--targets numpy/xp,torch:cpu/xp] [--cases constant,dones+mask]
                                [--B 8] [--T 131072] [--repeat 5] [--busy N] [--nice 0]

A trainer's CPU is never quiet, and thread pools (OpenBLAS behind NumPy's
matmul, PyTorch's intra-op pool) that wait for a busy core or spin between
calls can turn a millisecond call into a much slower one. This measures it,
side by side in one run:

* **threads**: two worker processes time the same calls, one with the
  libraries' default threads and one with ``OMP_NUM_THREADS``,
  ``OPENBLAS_NUM_THREADS`` and ``MKL_NUM_THREADS`` set to 1 (each library
  reads them when it starts, so a worker's setting holds for its lifetime);
* **load**: ``--busy`` processes (default: one per usable core) spinning in
  a Python loop, at ``--nice``, paused (SIGSTOP) while "no load" is
  measured and resumed (SIGCONT) for "load", so that both are taken in the
  same minute;
* **rounds**: ``--repeat`` rounds; each takes one sample of every target,
  case and copy in every (load, threads) setting, in an order that
  alternates from round to round, so a slow moment of the machine falls on
  all of them alike;
* **the copy floor**: in every sample set, a copy of the bytes GAE must
  move at least (read rewards and values, write advantages and returns
  into preallocated arrays), in the same worker, under the same setting.

The table: per target, case, threads and load, the median time per call, the
spread (half the interquartile range as a share of the median), the time as a
multiple of the copy floor measured under that setting, against one thread
(same load) and against no load (same threads), and the CPU model. "No load"
is whatever else the machine runs: the header prints the load average. Every
sample is at least ``--sample-ms`` of calls.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import time

#: The thread variables a worker with one thread sets (and a worker with the default threads removes).
THREAD_VARIABLES = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")
#: The probabilities of the dones + mask case (terminated and truncated each, masked holes), as ``gae-xp bench``.
DONES, HOLES = 0.01, 0.2
COPY = "copy"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m gae_xp.bench.load", description=__doc__.splitlines()[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--targets", default="numpy/xp,torch:cpu/xp",
                        help="library/backend pairs: library numpy or torch:cpu, backend any of gae()'s")
    parser.add_argument("--cases", default="constant,dones+mask", help="constant, dones+mask")
    parser.add_argument("--B", type=int, default=8)
    parser.add_argument("--T", type=int, default=131072)
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--repeat", type=int, default=5, help="rounds (samples per row)")
    parser.add_argument("--sample-ms", type=float, default=50.0, help="the shortest sample")
    parser.add_argument("--busy", type=int, default=None, help="busy processes for 'load' (default: usable cores)")
    parser.add_argument("--nice", type=int, default=0, help="niceness of the busy processes")
    parser.add_argument("--json", default=None, help="also write the rows to this file")
    parser.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    return parser


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    options = build_parser().parse_args(argv)
    if options.worker is not None:
        return worker(options)
    return coordinate(options, argv)


# ------------------------------------------------------------------------------------------------ the coordinator


def coordinate(options, argv: list[str]) -> int:
    from gae_xp.bench.report import machine

    targets = [t for t in options.targets.split(",") if t]
    cases = [c for c in options.cases.split(",") if c]
    for case in cases:
        if case not in ("constant", "dones+mask"):
            raise SystemExit(f"--cases: unknown case {case!r} (constant, dones+mask)")
    busy_count = options.busy if options.busy is not None else len(os.sched_getaffinity(0))
    cpu = machine()["cpu"]
    start, load_before = time.perf_counter(), os.getloadavg()
    workers = {threads: Worker(threads, options) for threads in ("default", "1")}
    busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"], preexec_fn=_niced(options.nice))
            for _ in range(busy_count)]
    samples: dict[tuple, list[float]] = {}
    try:
        _pause(busy)
        calls = [(COPY, COPY)] + [(target, case) for target in targets for case in cases]
        for worker_ in workers.values():
            worker_.threads = worker_.ask({"warm": calls})
        for round_ in range(options.repeat):
            loads = ("no load", "load") if round_ % 2 == 0 else ("load", "no load")
            for load in loads:
                (_resume if load == "load" else _pause)(busy)
                time.sleep(0.2)
                order = list(workers) if round_ % 2 == 0 else list(reversed(workers))
                for threads in order:
                    for target, case in calls:
                        seconds = workers[threads].ask({"time": [target, case]})
                        samples.setdefault((target, case, threads, load), []).append(seconds)
    finally:
        for process in busy:
            process.kill()
            process.wait()
        for worker_ in workers.values():
            worker_.close()
    rows = table(samples, targets, cases, cpu)
    print(f"B={options.B}, T={options.T}, {options.dtype}, gamma 0.99, lam 0.95; dones+mask: terminated and "
          f"truncated {DONES:.0%} each, mask {HOLES:.0%} holes")
    print(f"CPU: {cpu}; usable cores {len(os.sched_getaffinity(0))}; load: {busy_count} busy process(es) at nice "
          f"{options.nice}; load average before {load_before[0]:.2f}, after {os.getloadavg()[0]:.2f}")
    print(f"{options.repeat} rounds, samples of at least {options.sample_ms:g} ms; default threads: "
          + ", ".join(f"{k}={v}" for k, v in workers["default"].threads.items()) + "\n")
    header = ["path", "case", "threads", "load", "time", "spread", "x copy floor", "vs 1 thread", "vs no load",
              "CPU"]
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    for row in rows:
        print("| " + " | ".join(str(row[k]) for k in header) + " |")
    print(f"\n{time.perf_counter() - start:.0f} s; python -m gae_xp.bench.load {' '.join(argv)}".rstrip())
    if options.json:
        with open(options.json, "w") as handle:
            json.dump({"rows": rows, "samples": {"|".join(k): v for k, v in samples.items()}}, handle, indent=1)
    return 0


def table(samples, targets, cases, cpu) -> list[dict]:
    """One row per target, case, threads and load, with its ratios (see the module docstring)."""
    median = {key: statistics.median(values) for key, values in samples.items()}
    rows = []
    for target in [COPY, *targets]:
        for case in ([COPY] if target == COPY else cases):
            for threads in ("default", "1"):
                for load in ("no load", "load"):
                    key = (target, case, threads, load)
                    values = sorted(samples[key])
                    quartiles = statistics.quantiles(values, n=4) if len(values) > 1 else [values[0]] * 3
                    rows.append({
                        "path": target, "case": "-" if case == COPY else case, "threads": threads, "load": load,
                        "time": f"{median[key] * 1e3:.3g} ms",
                        "spread": f"±{(quartiles[2] - quartiles[0]) / 2 / median[key]:.0%}",
                        "x copy floor": f"{median[key] / median[(COPY, COPY, threads, load)]:.1f}",
                        "vs 1 thread": f"{median[key] / median[(target, case, '1', load)]:.2f}",
                        "vs no load": f"{median[key] / median[(target, case, threads, 'no load')]:.2f}",
                        "CPU": cpu, "median_s": median[key],
                    })
    return rows


class Worker:
    """A process that times calls on request, with its own thread settings (one JSON line each way)."""

    def __init__(self, threads: str, options):
        env = {k: v for k, v in os.environ.items() if k not in THREAD_VARIABLES}
        if threads == "1":
            env.update({name: "1" for name in THREAD_VARIABLES})
        arguments = ["--worker", threads, "--B", str(options.B), "--T", str(options.T), "--dtype", options.dtype,
                     "--sample-ms", str(options.sample_ms)]
        self.process = subprocess.Popen([sys.executable, "-m", "gae_xp.bench.load", *arguments], env=env,
                                        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self.threads = self.ask({"threads": None})

    def ask(self, request):
        self.process.stdin.write(json.dumps(request) + "\n")
        self.process.stdin.flush()
        line = self.process.stdout.readline()
        if not line:
            raise RuntimeError(f"a timing worker stopped (exit code {self.process.wait()})")
        return json.loads(line)

    def close(self):
        """Both pipes closed (the worker exits at the end of its input) and the worker waited for."""
        with self.process:  # Popen's exit closes stdout, then stdin, and waits
            pass


def _niced(nice: int):
    return (lambda: os.nice(nice)) if nice else None


def _pause(processes):
    for process in processes:
        process.send_signal(signal.SIGSTOP)


def _resume(processes):
    for process in processes:
        process.send_signal(signal.SIGCONT)


# ------------------------------------------------------------------------------------------------------ a worker


def worker(options) -> int:
    import numpy as np

    from gae_xp.testing import make_case

    dtype = np.dtype(options.dtype)
    shape = (options.B, options.T)
    rng = np.random.default_rng(0)
    cases = {"constant": make_case(rng, shape, dtype=dtype),
             "dones+mask": make_case(rng, shape, dones=DONES, holes=HOLES, dtype=dtype)}
    outputs = (np.empty(shape, dtype), np.empty(shape, dtype))
    constant = cases["constant"]

    def copy():
        np.copyto(outputs[0], constant["rewards"])
        np.copyto(outputs[1], constant["values"])

    made = {}

    def call_of(target, case):
        if (target, case) not in made:
            made[target, case] = copy if target == COPY else _gae_call(target, cases[case])
        return made[target, case]

    for line in sys.stdin:
        request = json.loads(line)
        if "threads" in request:
            answer = _thread_settings()
        elif "warm" in request:
            for target, case in request["warm"]:
                _sample(call_of(target, case), 0.2 * options.sample_ms)
            answer = _thread_settings()
        else:
            answer = _sample(call_of(*request["time"]), options.sample_ms)
        print(json.dumps(answer), flush=True)
    return 0


def _gae_call(target: str, case: dict):
    import numpy as np

    import gae_xp

    library, _, backend = target.partition("/")
    if library == "numpy":
        arrays = case
    elif library == "torch:cpu":
        import torch

        arrays = {k: torch.from_numpy(v) if isinstance(v, np.ndarray) else v for k, v in case.items()}
    else:
        raise SystemExit(f"--targets: library {library!r} is not measured here (numpy, torch:cpu)")
    return lambda: gae_xp.gae(**arrays, backend=backend or "auto")


def _sample(call, milliseconds: float) -> float:
    """Seconds per call over at least ``milliseconds`` of calls."""
    call()
    count, start = 0, time.perf_counter()
    while True:
        call()
        count += 1
        elapsed = time.perf_counter() - start
        if elapsed * 1e3 >= milliseconds:
            return elapsed / count


def _thread_settings() -> dict:
    settings = {name: os.environ.get(name, "unset") for name in THREAD_VARIABLES}
    if "torch" in sys.modules:
        settings["torch"] = sys.modules["torch"].get_num_threads()
    return settings


if __name__ == "__main__":
    sys.exit(main())
