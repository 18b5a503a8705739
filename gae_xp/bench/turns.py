"""Turn-level GAE against token-level GAE on the same packed arrays: ``python -m gae_xp.bench.turns``.

Packed multi-turn trajectories (``cu_seqlens``): every sequence alternates
masked runs (a prompt, a tool's output) and turns of real tokens, about
``--turns`` turns each. Both calls read the same rewards, values, mask and
offsets; the samples of the two calls are taken in turns, so that a busy
machine slows both alike. Prints the median time per call of each and their
ratio.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np


def packed_turns(rng: np.random.Generator, tokens: int, sequences: int, turns: int, dtype=np.float32) -> dict:
    """A packed batch: rewards, values, turn_ids (-1 outside every turn), mask, cu_seqlens, bootstrap_value."""
    cuts = np.sort(rng.choice(np.arange(1, tokens), size=sequences - 1, replace=False))
    cu_seqlens = np.concatenate([[0], cuts, [tokens]]).astype(np.int64)
    # 2 * turns runs per sequence on average: even runs are masked, odd runs are turns (ids rise along the row)
    edges = np.sort(rng.choice(np.arange(1, tokens), size=2 * turns * sequences - 1, replace=False))
    run = np.searchsorted(edges, np.arange(tokens), side="right")
    mask = run % 2 == 1
    return {
        "rewards": rng.standard_normal(tokens).astype(dtype),
        "values": rng.standard_normal(tokens).astype(dtype),
        "turn_ids": np.where(mask, run // 2, -1).astype(np.int32),  # AReaL's dtype
        "mask": mask,
        "cu_seqlens": cu_seqlens,
        "bootstrap_value": rng.standard_normal(sequences).astype(dtype),
    }


def measure(calls: dict, samples: int) -> dict:
    """Median seconds per call of each named call, their samples taken in turns."""
    times = {name: [] for name in calls}
    for call in calls.values():
        call()  # compile and warm up
    for _ in range(samples):
        for name, call in calls.items():
            start = time.perf_counter()
            call()
            times[name].append(time.perf_counter() - start)
    return {name: statistics.median(values) for name, values in times.items()}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m gae_xp.bench.turns", description=__doc__.splitlines()[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--tokens", type=int, default=2**20, help="tokens in the packed row")
    parser.add_argument("--sequences", type=int, default=1024, help="packed sequences (trajectories)")
    parser.add_argument("--turns", type=int, default=16, help="turns per sequence, on average")
    parser.add_argument("--samples", type=int, default=21, help="timed calls of each")
    parser.add_argument("--backend", default="auto", help="gae_xp backend of both calls")
    parser.add_argument("--threads", type=int, default=1, help="numba threads (0: numba's default)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    import gae_xp

    if args.threads:
        import numba

        numba.set_num_threads(args.threads)
    case = packed_turns(np.random.default_rng(args.seed), args.tokens, args.sequences, args.turns)
    common = {"mask": case["mask"], "cu_seqlens": case["cu_seqlens"], "bootstrap_value": case["bootstrap_value"],
              "backend": args.backend}
    calls = {
        "token-level gae()": lambda: gae_xp.gae(case["rewards"], case["values"], **common),
        "turn_gae()": lambda: gae_xp.turn_gae(case["rewards"], case["values"], case["turn_ids"], **common),
    }
    turns = int(np.asarray(gae_xp.turn_counts(case["turn_ids"], cu_seqlens=case["cu_seqlens"])).sum())
    print(f"{args.tokens} tokens, {args.sequences} sequences, {turns} turns, {case['mask'].mean():.0%} real tokens, "
          f"float32, backend={args.backend}, numba threads={args.threads or 'default'}, {args.samples} samples")
    medians = measure(calls, args.samples)
    for name, seconds in medians.items():
        print(f"{name:>20}: {seconds * 1e3:8.2f} ms")
    ratio = medians["turn_gae()"] / medians["token-level gae()"]
    print(f"{'turn / token':>20}: {ratio:8.2f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
