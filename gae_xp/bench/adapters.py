"""``gae-xp adapters``: each adapter against its framework's own function, side by side, on the bench's harness.

Torch CPU (or ``--device cuda``), B=8, T=131072 by default, float32. One row
per entry of :data:`ROWS`: the framework functions are the per-step loops
restated in ``gae_xp.bench.baselines`` (verl, slime, OpenRLHF, AReaL, CleanRL,
TRL) and torchrl's own functions, which need torchrl installed: a row whose
framework is not installed is listed under the table with why and how to
install it, never left out silently. AReaL's packed case holds B sequences of
T tokens in one row (its loop walks every token in Python); CleanRL's arrays
are time-major (T, B).

The framework loops run once, the adapters ``--repeat`` samples. A per-step
loop expected to take longer than ``--serial-budget`` (from a probe on the
first ``PROBE_STEPS`` steps) runs on a prefix of T and is extrapolated
linearly to T, as ``gae-xp bench`` does, and marked ``~``; slime's chunk
scan, whose time a prefix does not scale to, always runs at T: a default run stays near
a minute where the full loops took four. Timed by ``gae_xp.bench.runner``
(wall clock, the device waited for; CUDA events with ``--device cuda``); the
cases are :func:`adapter_cases`, which the asv class ``TimeAdapters`` times too.

A new row is one more :class:`Row` in :data:`ROWS`: its label, its framework,
and a function that builds (the framework's call, gae_xp's call) at (B, T).
"""

from __future__ import annotations

import argparse
import functools
import importlib.util
import sys
import time
from dataclasses import dataclass
from typing import Callable

import numpy as np

from gae_xp.bench import baselines, noise, runner
from gae_xp.bench.cli import positive_float, positive_int
from gae_xp.testing import libraries
from gae_xp.testing.cases import make_case

GAMMA, LAM = 0.99, 0.95


@dataclass(frozen=True)
class Row:
    """One row of the table: a framework's own function against gae_xp's adapter for it."""

    label: str
    framework: str
    #: ``build(library, B, T) -> (the framework's call, gae_xp's call)``, on torch arrays of ``library``
    build: Callable[[libraries.Library, int, int], tuple[Callable, Callable]]
    #: the module the framework's function is imported from, when the row needs it installed (else None:
    #: the framework's loop is restated in ``gae_xp.bench.baselines``)
    needs: str | None = None
    #: how to install ``needs``
    install: str | None = None
    #: whether the framework's time grows linearly in T, so that past the budget it may run on a prefix
    linear_in_T: bool = True

    def unavailable(self) -> str | None:
        """Why the row cannot run here (its framework is not installed, with the install hint), or None."""
        if self.needs is None or importlib.util.find_spec(self.needs) is not None:
            return None
        return f"{self.needs} is not installed ({self.install or 'pip install ' + self.needs})"


@functools.lru_cache(maxsize=4)
def _inputs(library: libraries.Library, B: int, T: int) -> dict:
    """The arrays every row takes its own from, at (B, T): one seeded draw, the same for every run."""
    rng = np.random.default_rng(0)

    def torch_arrays(case):
        return {k: library.asarray(v.astype(np.float32) if v.dtype.kind == "f" else v)
                for k, v in case.items() if isinstance(v, np.ndarray)}

    flat = torch_arrays(make_case(rng, (B, T), holes=0.1))
    deep = torch_arrays(make_case(rng, (B, T, 1), axis=1, dones=0.01, next_values=True))
    r, v = flat["rewards"], flat["values"]
    out = {"r": r, "v": v, "mask": flat["mask"].float(), "r3": deep["rewards"], "v3": deep["values"],
           "v3_next": deep["next_values"], "done3": deep["terminated"]}
    out["log_pi"], out["log_mu"] = (library.asarray(0.1 * rng.standard_normal((B, T, 1)).astype(np.float32))
                                    for _ in range(2))
    out["offsets"] = library.asarray(np.arange(B + 1, dtype=np.int32) * T)
    out["packed_r"] = library.xp.reshape(r, (-1,))
    out["packed_v"] = library.asarray(rng.standard_normal(B * T + B).astype(np.float32))
    out["flags"] = library.asarray(np.arange(B) % 2 == 0)
    out["no_eos"] = library.asarray(np.arange(B) % 2 == 1)
    out["r_tb"], out["v_tb"] = (library.asarray(np.ascontiguousarray(library.to_numpy(a).T)) for a in (r, v))
    out["dones_tb"] = library.asarray((rng.random((T, B)) < 0.01).astype(np.float32))
    out["next_value"] = library.asarray(rng.standard_normal((1, B)).astype(np.float32))
    out["next_done"] = library.asarray(np.zeros(B, dtype=np.float32))
    out["padding"] = library.asarray(np.arange(T)[None, :] >= rng.integers(T // 2, T + 1, B)[:, None])
    return out


def _verl(library, B, T):
    from gae_xp.adapters import verl

    a = _inputs(library, B, T)
    return (lambda: baselines.verl_gae_loop(a["r"], a["v"], a["mask"], GAMMA, LAM),
            lambda: verl.compute_gae_advantage_return(a["r"], a["v"], a["mask"], GAMMA, LAM))


def _slime_vanilla(library, B, T):
    from gae_xp.adapters import slime

    a = _inputs(library, B, T)
    return (lambda: baselines.slime_serial_gae(a["r"], a["v"], GAMMA, LAM),
            lambda: slime.vanilla_gae(a["r"], a["v"], GAMMA, LAM))


def _slime_chunked(library, B, T):
    from gae_xp.adapters import slime

    a = _inputs(library, B, T)
    return (lambda: baselines.slime_chunked_gae(a["r"], a["v"], GAMMA, LAM, 128),
            lambda: slime.chunked_gae(a["r"], a["v"], GAMMA, LAM, 128))


def _openrlhf(library, B, T):
    from gae_xp.adapters import openrlhf

    a = _inputs(library, B, T)
    return (lambda: baselines.openrlhf_gae_loop(a["v"], a["r"], a["mask"], GAMMA, LAM),
            lambda: openrlhf.get_advantages_and_returns(a["v"], a["r"], a["mask"], GAMMA, LAM))


def _areal_packed(library, B, T):
    from gae_xp.adapters import areal

    a = _inputs(library, B, T)
    args = (a["packed_r"], a["packed_v"], a["offsets"], a["flags"], GAMMA, LAM)
    return (lambda: baselines.areal_packed_gae_loop(*args), lambda: areal.pygae1d_nolp_misalign(*args))


def _areal_padded(library, B, T):
    from gae_xp.adapters import areal

    a = _inputs(library, B, T)
    args = (a["r"], a["v"], a["mask"], a["no_eos"], GAMMA, LAM)
    return (lambda: baselines.areal_padded_gae_loop(*args), lambda: areal.compute_token_level_gae(*args))


def _cleanrl(library, B, T):
    from gae_xp.adapters import cleanrl

    a = _inputs(library, B, T)
    args = (a["r_tb"], a["v_tb"], a["dones_tb"], a["next_value"], a["next_done"], GAMMA, LAM)
    return (lambda: baselines.cleanrl_gae_loop(*args), lambda: cleanrl.compute_gae(*args))


def _trl(library, B, T):
    from gae_xp.adapters import trl

    a = _inputs(library, B, T)
    args = (a["r"], a["v"], a["padding"], 1.0, LAM)
    return (lambda: baselines.trl_gae_loop(*args), lambda: trl.compute_advantages_and_returns(*args))


def _torchrl_gae(library, B, T):
    from torchrl.objectives.value import functional

    from gae_xp.adapters import torchrl

    a = _inputs(library, B, T)
    args = (GAMMA, LAM, a["v3"], a["v3_next"], a["r3"], a["done3"])
    return (lambda: functional.generalized_advantage_estimate(*args),
            lambda: torchrl.generalized_advantage_estimate(*args))


def _torchrl_vtrace(library, B, T):
    from torchrl.objectives.value import functional

    from gae_xp.adapters import torchrl

    a = _inputs(library, B, T)
    args = (GAMMA, a["log_pi"], a["log_mu"], a["v3"], a["v3_next"], a["r3"], a["done3"])
    return (lambda: functional.vtrace_advantage_estimate(*args), lambda: torchrl.vtrace_advantage_estimate(*args))


#: Every row the command times, in the order printed.
ROWS = (
    Row("verl compute_gae_advantage_return", "verl", _verl),
    Row("slime vanilla_gae", "slime", _slime_vanilla),
    # a chunk scan, not a per-step loop: a fixed part (its C x C kernel, torch's set-up) and a Python loop over T/C
    # chunks of batched work whose cost per chunk is not the prefix's; scaled from a prefix it read 292.9 ms where
    # the full T=131072 took 84-105 ms (issue 44, 4), so it is always timed at the T reported
    Row("slime chunked_gae (C=128)", "slime", _slime_chunked, linear_in_T=False),
    Row("OpenRLHF get_advantages_and_returns", "OpenRLHF", _openrlhf),
    Row("AReaL pygae1d_nolp_misalign (packed)", "AReaL", _areal_packed),
    Row("AReaL _compute_advantages (padded)", "AReaL", _areal_padded),
    Row("CleanRL ppo.py GAE", "CleanRL", _cleanrl),
    Row("TRL PPOTrainer advantages", "TRL", _trl),
    Row("torchrl generalized_advantage_estimate", "torchrl", _torchrl_gae, needs="torchrl",
        install="pip install torchrl"),
    Row("torchrl vtrace_advantage_estimate", "torchrl", _torchrl_vtrace, needs="torchrl",
        install="pip install torchrl"),
)

#: The frameworks of :data:`ROWS`, for the help texts.
FRAMEWORKS = ", ".join(dict.fromkeys(row.framework for row in ROWS))
DESCRIPTION = (f"Each framework adapter ({FRAMEWORKS}) against the framework's own function, side by side, on "
               "torch; a framework loop past --serial-budget is extrapolated from a prefix and marked ~")
LEGEND = ("~  the framework's time is extrapolated linearly in T from one run on the first steps (a loop expected to "
          "take longer than --serial-budget)")


def adapter_cases(library: libraries.Library, B: int, T: int) -> list[tuple[str, Callable, Callable]]:
    """(label, the framework's function, gae_xp's adapter) of every row that can run here, at shape (B, T)."""
    return [(row.label, *row.build(library, B, T)) for row in ROWS if row.unavailable() is None]


def left_out() -> list[str]:
    """One line per row that cannot run here: its label and why (with the install hint)."""
    return [f"{row.label}: {row.unavailable()}" for row in ROWS if row.unavailable() is not None]


def time_framework(row: Row, library, B: int, T: int, timer, budget_s: float) -> tuple[float, int | None]:
    """(seconds per call of the framework's function at T, the prefix it ran on where extrapolated, else None).

    A linear row longer than ``runner.PROBE_STEPS`` is probed on that prefix,
    twice (the faster run counts: the first of a process pays torch's lazy
    set-up, which a linear extrapolation would multiply by T over the prefix);
    when the probe predicts more than ``budget_s`` at T, it runs once on the
    prefix the budget allows and its time is scaled by T over that prefix.
    """
    steps = T
    if row.linear_in_T and T > runner.PROBE_STEPS:
        probe_call, _ = row.build(library, B, runner.PROBE_STEPS)
        probe = runner.time_call(probe_call, timer=timer, repeat=2, warmup=0, number=1).minimum
        estimate = probe * T / runner.PROBE_STEPS
        if estimate > budget_s:
            steps = max(runner.PROBE_STEPS, int(T * budget_s / estimate))
    call, _ = row.build(library, B, steps)
    seconds = runner.time_call(call, timer=timer, repeat=1, warmup=0, number=1).median
    return seconds * T / steps, None if steps == T else steps


def add_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    parser.add_argument("--B", type=positive_int, default=8, help="batch size (default: 8)")
    parser.add_argument("--T", type=positive_int, default=131072, help="sequence length (default: 131072)")
    parser.add_argument("--repeat", type=positive_int, default=5, help="timed samples of each adapter (default: 5)")
    parser.add_argument("--serial-budget", type=positive_float, default=1.0, metavar="SECONDS",
                        help="seconds a framework loop may take at T; one expected to take longer (from a probe on "
                             f"its first {runner.PROBE_STEPS} steps) runs once on a prefix and is extrapolated "
                             "linearly to T, marked ~ (default: 1)")
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"), help="torch device (default: cpu)")
    return parser


def execute(options: argparse.Namespace, stream=None) -> int:
    stream = stream or sys.stdout
    started = time.perf_counter()
    name = f"torch:{options.device}"
    reason = libraries.unavailable(name)
    if reason is not None:
        print(f"cannot run on {name}: {reason}", file=sys.stderr)
        return 1
    library = libraries.load(name)
    timer = runner.cuda_events(name) if options.device == "cuda" else runner.wall_clock(library.synchronize)
    print(f"torch {library.version} on {library.device}, B={options.B}, T={options.T}, float32; "
          f"framework functions: 1 run (~: extrapolated from a prefix past --serial-budget {options.serial_budget:g} "
          f"s); adapters: median of {options.repeat} samples "
          f"({'CUDA events' if options.device == 'cuda' else 'wall clock'}); {_load_words()} before the run",
          file=stream)
    print(f"{'function':42} {'framework':>12} {'gae_xp':>10} {'spread':>7} {'speed-up':>9}", file=stream)
    for row in ROWS:
        if row.unavailable() is not None:
            continue
        _, adapter = row.build(library, options.B, options.T)
        ours = runner.time_call(adapter, timer=timer, repeat=options.repeat)
        theirs, prefix = time_framework(row, library, options.B, options.T, timer, options.serial_budget)
        spread = 50 * (ours.quartiles[1] - ours.quartiles[0]) / ours.median
        approx = "~" if prefix else " "
        print(f"{row.label:42} {approx}{theirs * 1e3:9.1f} ms {ours.median * 1e3:7.2f} ms {spread:6.0f}% "
              f"{approx}{theirs / ours.median:7.0f}x", flush=True, file=stream)
    print("", file=stream)
    print(LEGEND, file=stream)
    missing = left_out()
    if missing:
        print(f"left out, {len(missing)} of {len(ROWS)} rows (their framework is not installed here):", file=stream)
        for line in missing:
            print(f"  {line}", file=stream)
    print(f"took {time.perf_counter() - started:.1f} s; {_load_words()} at the end", file=stream)
    return 0


def _load_words() -> str:
    """``load average 5.2 on 2 usable cores``: how busy the machine is now (1 minute)."""
    return noise.Conditions(noise.load_average(), noise.usable_cores()).words()


def main(argv=None) -> int:
    parser = add_arguments(argparse.ArgumentParser(prog="python -m gae_xp.bench.adapters", description=DESCRIPTION))
    return execute(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
