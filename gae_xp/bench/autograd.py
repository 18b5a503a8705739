"""Forward + backward of ``gae()`` on torch CPU tensors that require grad, against the forward alone.

Three calls on the same arrays, their samples taken in turns (a busy machine slows them alike):

* ``forward``: ``gae()`` on tensors without grad (the numba kernel, what ``auto`` runs);
* ``operator``: ``gae()`` on tensors that require grad (the custom operator: the same kernel forward, the adjoint
  scan backward), then ``torch.autograd.backward`` with random upstream gradients for both outputs;
* ``generic``: the same with ``backend="xp"`` (the chunk scan, differentiated by autograd), what such tensors
  ran before the operator.

``python -m gae_xp.bench.autograd [--B 8] [--T 131072] [--repeat 15] [--threads 1]`` prints, per case
(``constant``: a constant discount; ``dones+mask``: terminated and truncated at 1% each, 20% holes in a mask),
the median of each call, its spread (half the interquartile range over the median) and the fastest sample, each
with its ratio to ``forward``'s: on a busy machine the fastest samples are the steadier comparison.
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np

CASES = {"constant": {}, "dones+mask": {"dones": 0.01, "holes": 0.2}}


def measure(B: int, T: int, repeat: int, case: str):
    """{call: seconds per sample, one sample per turn} for the three calls on one case."""
    import torch

    import gae_xp
    from gae_xp.testing import make_case

    arrays = make_case(np.random.default_rng(0), (B, T), dtype=np.float32, **CASES[case])
    plain = {k: torch.from_numpy(v) if isinstance(v, np.ndarray) else v for k, v in arrays.items()}
    upstream = [torch.randn(B, T) for _ in range(2)]

    def forward():
        gae_xp.gae(**plain)

    def with_backward(backend):
        leaves = {**plain, "rewards": plain["rewards"].clone().requires_grad_(),
                  "values": plain["values"].clone().requires_grad_()}

        def call():
            outputs = gae_xp.gae(**leaves, backend=backend)
            torch.autograd.backward(outputs, upstream)
            leaves["rewards"].grad = leaves["values"].grad = None
        return call

    calls = {"forward": forward, "operator": with_backward("auto"), "generic": with_backward("xp")}
    samples = {name: [] for name in calls}
    for call in calls.values():  # compile and warm up
        call()
    for _ in range(repeat):
        for name, call in calls.items():
            start = time.perf_counter()
            call()
            samples[name].append(time.perf_counter() - start)
    return samples


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--B", type=int, default=8)
    parser.add_argument("--T", type=int, default=131072)
    parser.add_argument("--repeat", type=int, default=15)
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
        for name, s in samples.items():
            q1, q3 = np.percentile(s, [25, 75])
            print(f"{case:>10}  {name:>8}  median {medians[name] * 1e3:7.2f} ms ±{(q3 - q1) / 2 / medians[name]:4.0%} "
                  f"({medians[name] / medians['forward']:5.2f}x forward)   fastest {fastest[name] * 1e3:7.2f} ms "
                  f"({fastest[name] / fastest['forward']:5.2f}x forward)")


if __name__ == "__main__":
    main()
