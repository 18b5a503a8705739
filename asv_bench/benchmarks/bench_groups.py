"""The group-relative estimators against verl's and TRL's code (``gae-xp groups``' rows), torch CPU, one thread."""

from __future__ import annotations

from .common import XPBenchmark

ROWS = ["verl GRPO: reference loop vs adapter", "verl GRPO: vectorised vs adapter",
        "verl GRPO: vectorised vs core + to_tokens", "verl RLOO: reference loop vs adapter",
        "verl REINFORCE++: loop vs adapter", "scores (N,): verl vectorised vs adapter",
        "scores (N,): verl vectorised vs core", "TRL GRPO block vs grpo_advantages (N,)",
        "copy of the tokens vs to_tokens (bool)"]


class TimeGroups(XPBenchmark):
    """Each row of ``gae_xp.bench.groups.rows``: the framework's side and gae_xp's, at the issue's LLM-RL shapes."""

    param_names = ["row", "side", "shape"]
    params = [ROWS, ["framework", "gae_xp"], ["1024x16x512", "4096x8x2048"]]
    number = 1
    repeat = (1, 5, 30.0)
    warmup_time = 0.0
    timeout = 900

    def setup(self, row, side, shape):
        self.setup_library("torch:cpu")
        try:
            from gae_xp.bench import groups
        except ImportError as error:
            raise NotImplementedError(f"this version has no gae_xp.bench.groups: {error}") from None
        import torch

        torch.set_num_threads(1)
        prompts, samples, length = (int(n) for n in shape.split("x"))
        cases = {name: (theirs, ours) for name, theirs, ours in groups.rows(groups.batch(prompts, samples, length))}
        if row not in cases:
            raise NotImplementedError(f"{row} is not a row of this version")
        self.call = cases[row][0 if side == "framework" else 1]
        if "loop" not in row:
            self.call()

    def time_call(self, row, side, shape):
        self.call()
