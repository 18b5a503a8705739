"""The float32 accuracy table of docs/performance.md: max |error| of float32 advantages against the float64
loop, per path and chunk.

    python tests/conformance/float32_accuracy.py [--B 8] [--T 131072] [--chunks 16,32,64,128,256]

Rows: the float32 serial loop (slime's vanilla_gae, restated in frameworks.py), then gae_xp's generic path on NumPy
and on torch (``backend="xp"``) and the numba kernel, at each chunk size; columns gamma .99 / lam .95 and
gamma = lam = 1. Inputs: standard normal rewards and values (NumPy seed 0), cast to float32; the oracle is the same
loop in float64 on those float32 values. A path passes when its error is no worse than the float32 loop's.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import gae_xp  # noqa: E402
from conformance.frameworks import slime_vanilla_gae  # noqa: E402

SETTINGS = [(0.99, 0.95), (1.0, 1.0)]


def paths():
    """(name, function of (rewards, values, gamma, lam, chunk) -> float32 advantages as NumPy) for what is installed."""
    found = [("gae_xp generic path, NumPy", lambda r, v, g, lam, c: gae_xp.gae(r, v, gamma=g, lam=lam, chunk_size=c,
                                                                             backend="xp")[0])]
    if importlib.util.find_spec("torch") is not None:
        import torch

        found.append(("gae_xp generic path, torch CPU", lambda r, v, g, lam, c: gae_xp.gae(
            torch.from_numpy(r), torch.from_numpy(v), gamma=g, lam=lam, chunk_size=c, backend="xp")[0].numpy()))
    if importlib.util.find_spec("numba") is not None:
        found.append(("gae_xp numba kernel, NumPy", lambda r, v, g, lam, c: gae_xp.gae(r, v, gamma=g, lam=lam,
                                                                                     chunk_size=c, backend="numba")[0]))
    return found


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--B", type=int, default=8)
    parser.add_argument("--T", type=int, default=131072)
    parser.add_argument("--chunks", default="16,32,64,128,256")
    options = parser.parse_args(argv)
    chunks = [int(c) for c in options.chunks.split(",")]
    rng = np.random.default_rng(0)
    rewards = rng.standard_normal((options.B, options.T)).astype(np.float32)
    values = rng.standard_normal((options.B, options.T)).astype(np.float32)
    exact = {s: slime_vanilla_gae(rewards.astype(np.float64), values.astype(np.float64), *s)[0] for s in SETTINGS}
    loop = {s: float(np.abs(slime_vanilla_gae(rewards, values, *s)[0] - exact[s]).max()) for s in SETTINGS}

    header = " | ".join(f"gamma {g:g}, lam {lam:g}" for g, lam in SETTINGS)
    print(f"B={options.B}, T={options.T}, float32; max |error| of the advantages against the float64 loop\n")
    print(f"| path | chunk | {header} |")
    print("|---|---|" + "---|" * len(SETTINGS))
    print("| float32 serial loop (what slime, verl, CleanRL run) | - | "
          + " | ".join(f"{loop[s]:.2e}" for s in SETTINGS) + " |")
    worse = []
    for name, run in paths():
        for chunk in chunks:
            cells = []
            for s in SETTINGS:
                error = float(np.abs(np.asarray(run(rewards, values, *s, chunk), dtype=np.float64) - exact[s]).max())
                cells.append(f"{error:.2e}" + ("" if error <= loop[s] else " (worse)"))
                if error > loop[s]:
                    worse.append((name, chunk, s, error))
            print(f"| {name} | {chunk} | " + " | ".join(cells) + " |", flush=True)
    if worse:
        print(f"\n{len(worse)} entries worse than the float32 loop")
    return 1 if worse else 0


if __name__ == "__main__":
    raise SystemExit(main())
