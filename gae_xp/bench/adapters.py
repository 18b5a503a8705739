"""``python -m gae_xp.bench.adapters``: each adapter against its framework's own function, side by side.

Torch CPU (or ``--device cuda``), B=8, T=131072 by default, float32. The
framework functions are the per-step loops restated in ``gae_xp.bench.baselines``
(verl, OpenRLHF, slime) and torchrl's own functions when torchrl is installed.
Loops run once (they take seconds); the adapters run ``--repeat`` times.
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import sys
import time

from gae_xp.bench import baselines
from gae_xp.adapters import openrlhf, slime, torchrl, verl


def _time(call, repeat, synchronize):
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        call()
        synchronize()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m gae_xp.bench.adapters", description=__doc__.splitlines()[0])
    parser.add_argument("--B", type=int, default=8)
    parser.add_argument("--T", type=int, default=131072)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--device", default="cpu")
    options = parser.parse_args(argv)
    import torch

    device = torch.device(options.device)
    synchronize = (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else (lambda: None)
    generator = torch.Generator().manual_seed(0)
    shape = (options.B, options.T)
    r, v = (torch.randn(shape, generator=generator).to(device) for _ in range(2))
    mask = (torch.rand(shape, generator=generator) > 0.1).to(device)
    numeric_mask = mask.float()
    shape3 = (options.B, options.T, 1)
    r3, v3, v3_next = (torch.randn(shape3, generator=generator).to(device) for _ in range(3))
    done = (torch.rand(shape3, generator=generator) < 0.01).to(device)
    cases = [
        ("verl compute_gae_advantage_return",
         lambda: baselines.verl_gae_loop(r, v, numeric_mask, 0.99, 0.95),
         lambda: verl.compute_gae_advantage_return(r, v, numeric_mask, 0.99, 0.95)),
        ("slime vanilla_gae", lambda: baselines.slime_serial_gae(r, v, 0.99, 0.95),
         lambda: slime.vanilla_gae(r, v, 0.99, 0.95)),
        ("slime chunked_gae (C=128)", lambda: baselines.slime_chunked_gae(r, v, 0.99, 0.95, 128),
         lambda: slime.chunked_gae(r, v, 0.99, 0.95, 128)),
        ("OpenRLHF get_advantages_and_returns", lambda: baselines.openrlhf_gae_loop(v, r, numeric_mask, 0.99, 0.95),
         lambda: openrlhf.get_advantages_and_returns(v, r, numeric_mask, 0.99, 0.95)),
    ]
    if importlib.util.find_spec("torchrl") is not None:
        from torchrl.objectives.value import functional

        cases.append(("torchrl generalized_advantage_estimate",
                      lambda: functional.generalized_advantage_estimate(0.99, 0.95, v3, v3_next, r3, done),
                      lambda: torchrl.generalized_advantage_estimate(0.99, 0.95, v3, v3_next, r3, done)))
        log_pi, log_mu = (0.1 * torch.randn(shape3, generator=generator).to(device) for _ in range(2))
        cases.append(("torchrl vtrace_advantage_estimate",
                      lambda: functional.vtrace_advantage_estimate(0.99, log_pi, log_mu, v3, v3_next, r3, done),
                      lambda: torchrl.vtrace_advantage_estimate(0.99, log_pi, log_mu, v3, v3_next, r3, done)))
    print(f"torch {torch.__version__} on {device}, B={options.B}, T={options.T}, float32")
    print(f"{'function':42} {'framework':>12} {'gae_xp':>10} {'speed-up':>9}")
    for name, original, adapter in cases:
        adapter()  # warm-up
        ours = _time(adapter, options.repeat, synchronize)
        theirs = _time(original, 1, synchronize)
        print(f"{name:42} {theirs * 1e3:10.1f} ms {ours * 1e3:7.2f} ms {theirs / ours:8.0f}x", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
