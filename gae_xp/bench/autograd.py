"""Forward + backward of ``gae()`` on torch CPU tensors that require grad, against the forward alone.

Three calls on the same arrays, their samples taken in turns (a busy machine slows them alike):

* ``forward``: ``gae()`` on tensors without grad (the numba kernel, what ``auto`` runs);
* ``operator``: ``gae()`` on tensors that require grad (the custom operator: the same kernel forward, the adjoint
  scan backward), then ``torch.autograd.backward`` with random upstream gradients for both outputs;
* ``generic``: the same with ``backend="xp"`` (the chunk scan, differentiated by autograd), what such tensors
  ran before the operator.

``python -m gae_xp.bench.autograd [--B 8] [--T 131072] [--repeat 21] [--threads 1]`` prints, per case
(``constant``: a constant discount; ``dones+mask``: terminated and truncated at 1% each, 20% holes in a mask),
for each call and for the two halves of the others (``.forward``, ``.backward``): the median, its spread (half
the interquartile range over the median) and the fastest sample, each with its ratio to ``forward``'s. On a busy
machine the fastest samples are the steadier comparison, and the sum of the fastest halves the steadier total.
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np

CASES = {"constant": {}, "dones+mask": {"dones": 0.01, "holes": 0.2}}


def measure(B: int, T: int, repeat: int, case: str) -> dict[str, list[float]]:
    """{call or half: seconds, one sample per turn} on one case."""
    import torch

    import gae_xp
    from gae_xp.testing import make_case

    arrays = make_case(np.random.default_rng(0), (B, T), dtype=np.float32, **CASES[case])
    plain = {k: torch.from_numpy(v) if isinstance(v, np.ndarray) else v for k, v in arrays.items()}
    upstream = [torch.randn(B, T) for _ in range(2)]
    leaves = {**plain, "rewards": plain["rewards"].clone().requires_grad_(),
              "values": plain["values"].clone().requires_grad_()}
    samples: dict[str, list[float]] = {}

    def timed(name, call):
        start = time.perf_counter()
        result = call()
        samples.setdefault(name, []).append(time.perf_counter() - start)
        return result

    def turn():
        timed("forward", lambda: gae_xp.gae(**plain))
        for name, backend in (("operator", "auto"), ("generic", "xp")):
            outputs = timed(f"{name}.forward", lambda: gae_xp.gae(**leaves, backend=backend))
            timed(f"{name}.backward", lambda: torch.autograd.backward(outputs, upstream))
            samples.setdefault(name, []).append(samples[f"{name}.forward"][-1] + samples[f"{name}.backward"][-1])
            leaves["rewards"].grad = leaves["values"].grad = None

    turn()  # compile and warm up
    samples.clear()
    for _ in range(repeat):
        turn()
    return samples


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--B", type=int, default=8)
    parser.add_argument("--T", type=int, default=131072)
    parser.add_argument("--repeat", type=int, default=21)
    parser.add_argument("--threads", type=int, default=1, help="torch's and numba's threads (default 1)")
    options = parser.parse_args(argv)
    os.environ["NUMBA_NUM_THREADS"] = str(options.threads)  # before numba is imported
    import torch

    torch.set_num_threads(options.threads)
    print(f"B={options.B} T={options.T} float32, {options.repeat} samples per call, {options.threads} thread(s)")
    for case in CASES:
        samples = measure(options.B, options.T, options.repeat, case)
        medians = {name: float(np.median(s)) for name, s in samples.items()}
        fastest = {name: float(np.min(s)) for name, s in samples.items()}
        for name in ("forward", "operator", "operator.forward", "operator.backward", "generic", "generic.forward",
                     "generic.backward"):
            q1, q3 = np.percentile(samples[name], [25, 75])
            print(f"{case:>10}  {name:>17}  median {medians[name] * 1e3:7.2f} ms ±{(q3 - q1) / 2 / medians[name]:4.0%}"
                  f" ({medians[name] / medians['forward']:5.2f}x forward)   fastest {fastest[name] * 1e3:7.2f} ms "
                  f"({fastest[name] / fastest['forward']:5.2f}x forward)")
        for name in ("operator", "generic"):
            halves = fastest[f"{name}.forward"] + fastest[f"{name}.backward"]
            print(f"{case:>10}  {name:>17}  fastest forward + fastest backward {halves * 1e3:7.2f} ms "
                  f"({halves / fastest['forward']:5.2f}x forward)")


if __name__ == "__main__":
    main()
