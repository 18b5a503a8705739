"""``gae-xp adapters``: each adapter against its framework's own function, side by side, on the bench's harness.

Torch CPU (or ``--device cuda``), B=8, T=131072 by default, float32. The
framework functions are the per-step loops restated in ``gae_xp.bench.baselines``
(verl, OpenRLHF, slime, AReaL, CleanRL, TRL) and torchrl's own functions when
torchrl is installed. AReaL's packed case holds B sequences of T tokens in
one row (its loop walks every token in Python); CleanRL's arrays are
time-major (T, B).
Loops run once (they take seconds); the adapters run ``--repeat`` samples.
Timed by ``gae_xp.bench.runner`` (wall clock, the device waited for; CUDA
events with ``--device cuda``); the cases are ``adapter_cases``, which the asv
class ``TimeAdapters`` times too.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
from typing import Callable

import numpy as np

from gae_xp.bench import baselines, runner
from gae_xp.bench.cli import positive_int
from gae_xp.testing import libraries
from gae_xp.testing.cases import make_case

DESCRIPTION = __doc__.splitlines()[0].split(": ", 1)[1]


def adapter_cases(library: libraries.Library, B: int, T: int) -> list[tuple[str, Callable, Callable]]:
    """(name, the framework's function, gae_xp's adapter) for torch arrays of ``library``, shape (B, T)."""
    from gae_xp.adapters import openrlhf, slime, torchrl, verl

    rng = np.random.default_rng(0)
    flat = {k: library.asarray(v.astype(np.float32) if v.dtype.kind == "f" else v)
            for k, v in make_case(rng, (B, T), holes=0.1).items() if isinstance(v, np.ndarray)}
    r, v, mask = flat["rewards"], flat["values"], flat["mask"]
    numeric_mask = mask.float()
    deep = {k: library.asarray(x.astype(np.float32) if x.dtype.kind == "f" else x)
            for k, x in make_case(rng, (B, T, 1), axis=1, dones=0.01, next_values=True).items()
            if isinstance(x, np.ndarray)}
    r3, v3, v3_next, done = deep["rewards"], deep["values"], deep["next_values"], deep["terminated"]
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
    cases += _new_framework_cases(library, rng, r, v, numeric_mask, B, T)
    if importlib.util.find_spec("torchrl") is not None:
        from torchrl.objectives.value import functional

        cases.append(("torchrl generalized_advantage_estimate",
                      lambda: functional.generalized_advantage_estimate(0.99, 0.95, v3, v3_next, r3, done),
                      lambda: torchrl.generalized_advantage_estimate(0.99, 0.95, v3, v3_next, r3, done)))
        log_pi, log_mu = (library.asarray(0.1 * rng.standard_normal((B, T, 1)).astype(np.float32)) for _ in range(2))
        cases.append(("torchrl vtrace_advantage_estimate",
                      lambda: functional.vtrace_advantage_estimate(0.99, log_pi, log_mu, v3, v3_next, r3, done),
                      lambda: torchrl.vtrace_advantage_estimate(0.99, log_pi, log_mu, v3, v3_next, r3, done)))
    return cases


def _new_framework_cases(library, rng, r, v, numeric_mask, B, T):
    """AReaL (packed and padded), CleanRL and TRL on the shapes their frameworks use."""
    from gae_xp.adapters import areal, cleanrl, trl

    xp = library.xp
    offsets = library.asarray(np.arange(B + 1, dtype=np.int32) * T)
    packed_r = xp.reshape(r, (-1,))
    packed_v = library.asarray(rng.standard_normal(B * T + B).astype(np.float32))
    flags = library.asarray(np.arange(B) % 2 == 0)
    no_eos = library.asarray(np.arange(B) % 2 == 1)
    steps_first = {name: library.asarray(np.ascontiguousarray(library.to_numpy(a).T))
                   for name, a in (("r", r), ("v", v))}
    dones = library.asarray((rng.random((T, B)) < 0.01).astype(np.float32))
    next_value = library.asarray(rng.standard_normal((1, B)).astype(np.float32))
    next_done = library.asarray(np.zeros(B, dtype=np.float32))
    padding = library.asarray(np.arange(T)[None, :] >= rng.integers(T // 2, T + 1, B)[:, None])
    return [
        ("AReaL pygae1d_nolp_misalign (packed)",
         lambda: baselines.areal_packed_gae_loop(packed_r, packed_v, offsets, flags, 0.99, 0.95),
         lambda: areal.pygae1d_nolp_misalign(packed_r, packed_v, offsets, flags, 0.99, 0.95)),
        ("AReaL _compute_advantages (padded)",
         lambda: baselines.areal_padded_gae_loop(r, v, numeric_mask, no_eos, 0.99, 0.95),
         lambda: areal.compute_token_level_gae(r, v, numeric_mask, no_eos, 0.99, 0.95)),
        ("CleanRL ppo.py GAE",
         lambda: baselines.cleanrl_gae_loop(steps_first["r"], steps_first["v"], dones, next_value, next_done,
                                            0.99, 0.95),
         lambda: cleanrl.compute_gae(steps_first["r"], steps_first["v"], dones, next_value, next_done, 0.99, 0.95)),
        ("TRL PPOTrainer advantages",
         lambda: baselines.trl_gae_loop(r, v, padding, 1.0, 0.95),
         lambda: trl.compute_advantages_and_returns(r, v, padding, 1.0, 0.95)),
    ]


def add_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    parser.add_argument("--B", type=positive_int, default=8, help="batch size (default: 8)")
    parser.add_argument("--T", type=positive_int, default=131072, help="sequence length (default: 131072)")
    parser.add_argument("--repeat", type=positive_int, default=5, help="timed samples of each adapter (default: 5)")
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"), help="torch device (default: cpu)")
    return parser


def execute(options: argparse.Namespace) -> int:
    name = f"torch:{options.device}"
    reason = libraries.unavailable(name)
    if reason is not None:
        print(f"cannot run on {name}: {reason}", file=sys.stderr)
        return 1
    library = libraries.load(name)
    timer = runner.cuda_events(name) if options.device == "cuda" else runner.wall_clock(library.synchronize)
    print(f"torch {library.version} on {library.device}, B={options.B}, T={options.T}, float32; "
          f"framework loops: 1 run; adapters: median of {options.repeat} samples "
          f"({'CUDA events' if options.device == 'cuda' else 'wall clock'})")
    print(f"{'function':42} {'framework':>12} {'gae_xp':>10} {'spread':>7} {'speed-up':>9}")
    for label, original, adapter in adapter_cases(library, options.B, options.T):
        ours = runner.time_call(adapter, timer=timer, repeat=options.repeat)
        theirs = runner.time_call(original, timer=timer, repeat=1, warmup=0, number=1)
        spread = 50 * (ours.quartiles[1] - ours.quartiles[0]) / ours.median
        print(f"{label:42} {theirs.median * 1e3:10.1f} ms {ours.median * 1e3:7.2f} ms {spread:6.0f}% "
              f"{theirs.median / ours.median:8.0f}x", flush=True)
    return 0


def main(argv=None) -> int:
    parser = add_arguments(argparse.ArgumentParser(prog="python -m gae_xp.bench.adapters", description=DESCRIPTION))
    return execute(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
