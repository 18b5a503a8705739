"""``python -m gae_xp.bench.roofline``: the numba kernel against the memory roofline, on one thread and on two.

The floor is a copy of the same bytes: read rewards and values, write
advantages and returns (``np.copyto`` into preallocated arrays), timed in
the same rounds as the kernel. Each round times the floor and every case
once per thread count, in turns, so that a busy machine slows them alike;
the table gives the median over the rounds, the spread (half the
interquartile range over the median), the ratio of the medians, and the
ratio of the fastest samples (what a busy machine leaves least). Cases:
a constant discount, dones + mask (terminated and truncated 1% each, 20%
of the steps masked: ``gae_xp.testing.make_case(rng, shape, dones=0.01,
holes=0.2)``) and the constant case with ``critic_lam=1.0`` (decoupled
lambda, one pass), at B=8, T=131072 and B=1, T=2^20 (float32 by default);
then a small call (B=8, T=128, ``backend="auto"``) in microseconds. Threads
are set with ``numba.set_num_threads`` (at most ``NUMBA_NUM_THREADS``): a
call shares its rows between that many threads, the calling one included
(``gae_xp.backends._sharing``); with one, it runs on the calling thread.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import numpy as np

import gae_xp
from gae_xp.bench.report import machine
from gae_xp.testing import make_case

CASES = {"constant": {}, "dones+mask": {"dones": 0.01, "holes": 0.2}}


def shape_of(text: str) -> tuple[int, int]:
    rows, _, length = text.partition("x")
    try:
        shape = (int(rows), int(length))
    except ValueError:
        raise argparse.ArgumentTypeError(f"a shape is BxT, such as 8x131072, got {text!r}") from None
    if min(shape) < 1:
        raise argparse.ArgumentTypeError(f"a shape has B >= 1 and T >= 1, got {text!r}")
    return shape


def positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def parse(argv):
    parser = argparse.ArgumentParser(prog="python -m gae_xp.bench.roofline", description=__doc__.split("\n\n")[0])
    parser.add_argument("--shapes", type=shape_of, nargs="+", default=[(8, 131072), (1, 1 << 20)],
                        help="BxT shapes (default: 8x131072 1x1048576)")
    parser.add_argument("--threads", type=positive, nargs="+", default=[1, 2],
                        help="numba thread counts to time, each at most NUMBA_NUM_THREADS (default: 1 2)")
    parser.add_argument("--dtype", choices=["float32", "float64"], default="float32")
    parser.add_argument("--repeat", type=positive, default=31, help="rounds (default: 31)")
    return parser.parse_args(argv)


def _spread(samples: list[float]) -> float:
    q1, _, q3 = statistics.quantiles(samples, n=4) if len(samples) > 1 else (samples[0],) * 3
    return (q3 - q1) / 2 / statistics.median(samples)


def measure(shape, dtype, threads, repeat):
    """{(case, threads): [seconds per call]} and the floor's samples, for one shape."""
    import numba

    rng = np.random.default_rng(0)
    cases = {name: make_case(rng, shape, dtype=dtype, **options) for name, options in CASES.items()}
    calls = {name: (lambda case=case: gae_xp.gae(**case, backend="numba")) for name, case in cases.items()}
    plain = cases["constant"]
    calls["decoupled (critic_lam=1)"] = lambda: gae_xp.gae(**plain, critic_lam=1.0, backend="numba")
    advantages, returns = np.empty(shape, dtype), np.empty(shape, dtype)

    def floor():
        np.copyto(advantages, plain["rewards"])
        np.copyto(returns, plain["values"])

    samples = {"floor": []} | {(name, n): [] for name in calls for n in threads}
    for n in threads:  # compile and warm up every build
        numba.set_num_threads(n)
        for call in calls.values():
            call()
    for _ in range(repeat):
        start = time.perf_counter()
        floor()
        samples["floor"].append(time.perf_counter() - start)
        for n in threads:
            numba.set_num_threads(n)
            for name, call in calls.items():
                start = time.perf_counter()
                call()
                samples[(name, n)].append(time.perf_counter() - start)
    return samples


def small_call(dtype, repeat, number=200):
    """Median seconds of one gae() call at B=8, T=128 on auto, over ``repeat`` samples of ``number`` calls."""
    case = make_case(np.random.default_rng(1), (8, 128), dtype=dtype)
    gae_xp.gae(**case)
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        for _ in range(number):
            gae_xp.gae(**case)
        times.append((time.perf_counter() - start) / number)
    return times


def main(argv=None) -> int:
    options = parse(sys.argv[1:] if argv is None else argv)
    import numba

    most = numba.config.NUMBA_NUM_THREADS
    if max(options.threads) > most:
        print(f"--threads: at most NUMBA_NUM_THREADS={most} here", file=sys.stderr)
        return 2
    dtype = np.dtype(options.dtype)
    info = machine()
    print(f"CPU: {info['cpu']} ({info['usable_cpus']} usable of {info['cpus']}), numba {numba.__version__}, "
          f"NUMBA_NUM_THREADS={most}, {options.dtype}, gamma 0.99, lam 0.95, {options.repeat} rounds")
    print("time: median per call; spread: half the interquartile range over the median; x floor: median over "
          "the floor's median (floor: np.copyto of rewards and values into preallocated outputs, same rounds); "
          "best x floor: fastest sample over the floor's fastest")
    header = (f"{'B x T':>14}  {'case':<26}{'threads':>8}{'time ms':>10}{'spread':>8}{'floor ms':>10}{'x floor':>9}"
              f"{'best x floor':>14}")
    print(header)
    print("-" * len(header))
    for shape in options.shapes:
        samples = measure(shape, dtype, options.threads, options.repeat)
        floor, fastest_floor = statistics.median(samples["floor"]), min(samples["floor"])
        medians = {}
        for key, values in samples.items():
            if key == "floor":
                continue
            name, threads = key
            medians[key] = statistics.median(values)
            print(f"{shape[0]:>5} x {shape[1]:<8}  {name:<26}{threads:>8}{medians[key] * 1e3:>10.3f}"
                  f"{_spread(values):>8.0%}{floor * 1e3:>10.3f}{medians[key] / floor:>9.2f}"
                  f"{min(values) / fastest_floor:>14.2f}")
        notes = []
        if 1 in options.threads and len(options.threads) > 1:
            for n in options.threads[1:]:
                ratios = ", ".join(f"{name} {medians[(name, n)] / medians[(name, 1)]:.2f}x" for name in
                                   [*CASES, "decoupled (critic_lam=1)"])
                notes.append(f"{n} threads against 1: {ratios}")
        for n in options.threads:
            notes.append(f"decoupled against one plain call, {n} thread{'s' * (n > 1)}: "
                         f"{medians[('decoupled (critic_lam=1)', n)] / medians[('constant', n)]:.2f}x")
        print("".join(f"{'':>16}{note}\n" for note in notes), end="")
    numba.set_num_threads(most)
    small = small_call(dtype, max(5, options.repeat // 3))
    print(f"small call (B=8, T=128, auto): {statistics.median(small) * 1e6:.1f} us, spread {_spread(small):.0%}")
    print(f"command: python -m gae_xp.bench.roofline {' '.join(sys.argv[1:] if argv is None else argv)}".rstrip())
    return 0


if __name__ == "__main__":
    sys.exit(main())
