"""``gae-xp groups``: the group-relative estimators (GRPO, RLOO, REINFORCE++, TRL's GRPO block) against the
frameworks' own code, at LLM-RL shapes, on torch.

Shapes are prompts x samples x response tokens (default 1024x16x512 and
4096x8x2048), float32 token rewards with the outcome score on the last
response token, verl's int64 response mask (right padding), uid strings in
the consecutive layout verl's rollout repeats them in (and shuffled with
``--shuffle``). The frameworks' code is written here as they write it:

* verl's reference ``compute_grpo_outcome_advantage`` and
  ``compute_rloo_outcome_advantage`` (a Python loop over the batch with a
  dict of lists), its ``compute_grpo_vectorized_outcome_advantage`` (PR
  #3635 with #6348's two-pass variance), and its REINFORCE++ loop over the
  tokens (PR #7300);
* TRL's GRPO advantage block (nanmean, nanstd, repeat_interleave,
  nan_to_num) on the (N,) rewards.

gae_xp's rows are the adapters with the same signatures, and the core
``gae_xp.group_advantages`` on the consecutive layout followed by
``gae_xp.to_tokens``. The token broadcast is timed next to a copy of the
token array (``clone`` of the float32 (B, T) rewards), the floor any
broadcast must pay, and verl's GRPO next to its two token passes alone
(the scores' sum over the tokens, and the scores times verl's int64 mask,
in torch): the floor of any GRPO with verl's signature, whose ratio to the
frameworks' rows bounds what an adapter can reach. One thread by default
(``torch.set_num_threads``), as the issue's targets are stated. Loops run once; the rest ``--repeat``
samples, timed by ``gae_xp.bench.runner``.
"""

from __future__ import annotations

import argparse
import sys
import uuid
from collections import defaultdict
from typing import Callable

import numpy as np

from gae_xp.bench import runner
from gae_xp.bench.cli import positive_int

DESCRIPTION = __doc__.splitlines()[0].split(": ", 1)[1] + " " + __doc__.splitlines()[1]
DEFAULT_SHAPES = ((1024, 16, 512), (4096, 8, 2048))


def verl_grpo_loop(token_level_rewards, response_mask, index, epsilon=1e-6, norm_adv_by_std_in_grpo=True):
    """verl's reference ``compute_grpo_outcome_advantage``: a dict of lists of 0-d scores, per-row assignments."""
    import torch

    scores = token_level_rewards.sum(dim=-1)
    id2score, id2mean, id2std = defaultdict(list), {}, {}
    with torch.no_grad():
        bsz = scores.shape[0]
        for i in range(bsz):
            id2score[index[i]].append(scores[i])
        for idx in id2score:
            if len(id2score[idx]) == 1:
                id2mean[idx], id2std[idx] = torch.tensor(0.0), torch.tensor(1.0)
            else:
                stacked = torch.stack(id2score[idx])
                id2mean[idx], id2std[idx] = torch.mean(stacked), torch.std(stacked)
        for i in range(bsz):
            if norm_adv_by_std_in_grpo:
                scores[i] = (scores[i] - id2mean[index[i]]) / (id2std[index[i]] + epsilon)
            else:
                scores[i] = scores[i] - id2mean[index[i]]
        scores = scores.unsqueeze(-1) * response_mask
    return scores, scores


def verl_rloo_loop(token_level_rewards, response_mask, index):
    """verl's reference ``compute_rloo_outcome_advantage``: the same dict of lists, s n/(n-1) - mean n/(n-1)."""
    import torch

    scores = token_level_rewards.sum(dim=-1)
    id2score, id2mean = defaultdict(list), {}
    with torch.no_grad():
        bsz = scores.shape[0]
        for i in range(bsz):
            id2score[index[i]].append(scores[i])
        for idx in id2score:
            id2mean[idx] = torch.mean(torch.stack(id2score[idx])) if len(id2score[idx]) > 1 else torch.tensor(0.0)
        for i in range(bsz):
            n = len(id2score[index[i]])
            if n > 1:
                scores[i] = scores[i] * n / (n - 1) - id2mean[index[i]] * n / (n - 1)
        scores = scores.unsqueeze(-1) * response_mask
    return scores, scores


def verl_grpo_vectorized(token_level_rewards, response_mask, index, epsilon=1e-6, norm_adv_by_std_in_grpo=True):
    """verl's ``compute_grpo_vectorized_outcome_advantage`` with ``as_torch_index`` (np.unique of the uids after
    a failed int cast) and ``group_mean_std`` (index_add_ sums in float32, the two-pass variance of #6348)."""
    import torch

    with torch.no_grad():
        scores = token_level_rewards.sum(dim=-1)
        labels = np.asarray(index)
        try:
            g = torch.from_numpy(labels.astype(np.int64))
        except (TypeError, ValueError):
            g = torch.from_numpy(np.unique(labels, return_inverse=True)[1].astype(np.int64))
        s = scores.reshape(-1).to(torch.float32)
        groups = int(torch.max(g).item()) + 1
        count = torch.zeros(groups).index_add_(0, g, torch.ones_like(s))
        total = torch.zeros(groups).index_add_(0, g, s)
        mean = total / count.clamp_min(1.0)
        centred = s - mean[g]
        variance = torch.zeros(groups).index_add_(0, g, centred * centred) / (count - 1.0).clamp_min(1.0)
        std = torch.sqrt(torch.clamp(variance, min=0.0))
        single = count <= 1.0
        if torch.any(single):
            mean, std = mean.clone(), std.clone()
            mean[single], std[single] = 0.0, 1.0
        if norm_adv_by_std_in_grpo:
            scalars = (scores - mean[g]) / (std[g] + epsilon)
        else:
            scalars = scores - mean[g]
        advantages = scalars.unsqueeze(-1) * response_mask
        return advantages, advantages


def verl_reinforce_plus_plus_loop(token_level_rewards, response_mask, gamma=1.0):
    """verl's ``compute_reinforce_plus_plus_outcome_advantage`` (PR #7300): a loop over the tokens, then
    ``masked_whiten`` (masked_mean over sum + 1e-8, Bessel-corrected variance, rsqrt(var + 1e-8))."""
    import torch

    with torch.no_grad():
        returns = torch.zeros_like(token_level_rewards)
        running = 0
        for t in reversed(range(token_level_rewards.shape[1])):
            new_running = token_level_rewards[:, t] + gamma * running
            returns[:, t] = new_running * response_mask[:, t]
            running = new_running * response_mask[:, t] + running * (1 - response_mask[:, t])
        total = response_mask.sum()
        mean = (returns * response_mask).sum() / (total + 1e-8)
        variance = ((returns - mean) ** 2 * response_mask).sum() / (total + 1e-8) * (total / (total - 1))
        advantages = (returns - mean) * torch.rsqrt(variance + 1e-8) * response_mask
    return advantages, returns


def trl_grpo_block(rewards, num_generations, scale_rewards="group"):
    """TRL's GRPO advantages ("sum_then_normalize"): nanmean per group, TRL's nanstd, std + 1e-4, nan_to_num."""
    import torch

    def nanstd(tensor, dim=None):
        mean = torch.nanmean(tensor, dim=dim, keepdim=True)
        variance = torch.nanmean((tensor - mean) ** 2, dim=dim, keepdim=True)
        count = torch.sum(~torch.isnan(tensor), dim=dim, keepdim=True)
        correction = torch.where(count > 1, count / (count - 1), torch.full_like(variance, float("nan")))
        std = torch.sqrt(variance * correction)
        return std.squeeze() if dim is None else std.squeeze(dim)

    mean = torch.nanmean(rewards.view(-1, num_generations), dim=1).repeat_interleave(num_generations, dim=0)
    if scale_rewards == "batch":
        std = nanstd(rewards).expand_as(rewards)
    else:
        std = nanstd(rewards.view(-1, num_generations), dim=1).repeat_interleave(num_generations, dim=0)
    advantages = rewards - mean
    if scale_rewards != "none":
        advantages = advantages / (std + 1e-4)
    return torch.nan_to_num(advantages, nan=0.0)


def batch(prompts: int, samples: int, length: int, *, shuffle: bool = False, seed: int = 0) -> dict:
    """One rollout batch as verl holds it: float32 token rewards (the 0/1 score on the last response token),
    an int64 response mask (right padding), uid strings (consecutive, or shuffled), and the bool mask."""
    import torch

    rng = np.random.default_rng(seed)
    rows = prompts * samples
    lengths = rng.integers(length // 4, length + 1, rows)
    mask = torch.from_numpy(np.arange(length)[None, :] < lengths[:, None])
    rewards = torch.zeros(rows, length, dtype=torch.float32)
    rewards[torch.arange(rows), torch.from_numpy(lengths - 1)] = torch.from_numpy(
        (rng.random(rows) < 0.4).astype(np.float32))
    uids = np.repeat(np.array([str(uuid.UUID(int=int(u))) for u in rng.integers(0, 2**62, prompts)],
                              dtype=object), samples)
    order = rng.permutation(rows) if shuffle else np.arange(rows)
    group_ids = torch.from_numpy(order // samples) if shuffle else samples
    return {"rewards": rewards[order].contiguous(), "mask": mask[order].to(torch.int64).contiguous(),
            "bool_mask": mask[order].contiguous(), "uids": uids[order], "samples": samples,
            "group_ids": group_ids, "scores": rewards[order].sum(-1)}


def rows(data: dict) -> list[tuple[str, Callable, Callable]]:
    """(name, the framework's call, gae_xp's call) for one batch. The core's rows take the group size k for the
    consecutive layout, the prompt of each row as ids for shuffled rows."""
    import torch

    import gae_xp
    from gae_xp.adapters import trl, verl

    r, m, uids, k, scores = data["rewards"], data["mask"], data["uids"], data["samples"], data["scores"]
    bool_mask = data["bool_mask"]
    ones = torch.ones(scores.shape[0], 1, dtype=torch.int64)
    ids = data["group_ids"]
    advantages = gae_xp.group_advantages(scores, ids)
    return [
        ("verl GRPO: reference loop vs adapter", lambda: verl_grpo_loop(r, m, uids),
         lambda: verl.compute_grpo_outcome_advantage(r, m, uids)),
        ("verl GRPO: vectorised vs adapter", lambda: verl_grpo_vectorized(r, m, uids),
         lambda: verl.compute_grpo_outcome_advantage(r, m, uids)),
        ("floor: verl GRPO's two token passes vs adapter", lambda: r.sum(-1)[:, None] * m,
         lambda: verl.compute_grpo_outcome_advantage(r, m, uids)),
        ("verl GRPO: vectorised vs core + to_tokens", lambda: verl_grpo_vectorized(r, m, uids),
         lambda: gae_xp.to_tokens(gae_xp.group_advantages(r.sum(-1), ids), response_mask=bool_mask)),
        ("verl RLOO: reference loop vs adapter", lambda: verl_rloo_loop(r, m, uids),
         lambda: verl.compute_rloo_outcome_advantage(r, m, uids)),
        ("verl REINFORCE++: loop vs adapter", lambda: verl_reinforce_plus_plus_loop(r, m, 1.0),
         lambda: verl.compute_reinforce_plus_plus_outcome_advantage(r, m, gamma=1.0)),
        ("scores (N,): verl's loop vs adapter", lambda: verl_grpo_loop(scores[:, None], ones, uids),
         lambda: verl.compute_grpo_outcome_advantage(scores[:, None], ones, uids)),
        ("scores (N,): verl vectorised vs adapter", lambda: verl_grpo_vectorized(scores[:, None], ones, uids),
         lambda: verl.compute_grpo_outcome_advantage(scores[:, None], ones, uids)),
        ("scores (N,): verl vectorised vs core", lambda: verl_grpo_vectorized(scores[:, None], ones, uids)[0][:, 0],
         lambda: gae_xp.group_advantages(scores, ids)),
        ("TRL GRPO block vs grpo_advantages (N,)", lambda: trl_grpo_block(scores, k),
         lambda: trl.grpo_advantages(scores, k)),
        ("copy of the tokens vs to_tokens (bool)", lambda: r.clone(),
         lambda: gae_xp.to_tokens(advantages, response_mask=bool_mask)),
        ("copy of the tokens vs to_tokens (int64)", lambda: r.clone(),
         lambda: gae_xp.to_tokens(advantages, response_mask=m)),
    ]


LOOPS = ("reference loop", "REINFORCE++: loop", "verl's loop")


def add_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    parser.add_argument("--shapes", type=_shapes, default=DEFAULT_SHAPES, metavar="LIST",
                        help="comma-separated PROMPTSxSAMPLESxTOKENS (default: 1024x16x512,4096x8x2048)")
    parser.add_argument("--repeat", type=positive_int, default=5, help="timed samples of each vectorised call "
                                                                    "(default: 5)")
    parser.add_argument("--threads", type=positive_int, default=1, help="torch.set_num_threads (default: 1)")
    parser.add_argument("--shuffle", action="store_true", help="rows in random order, not verl's consecutive "
                                                               "layout (default: consecutive)")
    return parser


def execute(options: argparse.Namespace, stream=None) -> int:
    from gae_xp.testing import libraries

    stream = stream or sys.stdout
    reason = libraries.unavailable("torch:cpu")
    if reason is not None:
        print(f"cannot run on torch:cpu: {reason}", file=sys.stderr)
        return 1
    import torch

    torch.set_num_threads(options.threads)
    print(f"torch {torch.__version__} on the CPU, {options.threads} thread(s); float32; loops: 1 run, the rest: "
          f"median of {options.repeat} samples (wall clock)", file=stream)
    for prompts, samples, length in options.shapes:
        data = batch(prompts, samples, length, shuffle=options.shuffle)
        print(f"\n{prompts} prompts x {samples} samples x {length} tokens ({prompts * samples} rows, "
              f"{'shuffled' if options.shuffle else 'consecutive'} uids)", file=stream)
        print(f"{'row':46} {'framework':>12} {'gae_xp':>11} {'ratio':>8}", file=stream)
        for label, theirs, ours in rows(data):
            loop = any(word in label for word in LOOPS)
            mine = runner.time_call(ours, repeat=options.repeat)
            other = runner.time_call(theirs, repeat=1 if loop else options.repeat, warmup=0 if loop else 1,
                                     number=1 if loop else None)
            print(f"{label:46} {other.median * 1e3:9.2f} ms {mine.median * 1e3:8.2f} ms "
                  f"{other.median / mine.median:7.1f}x", file=stream, flush=True)
        del data
    return 0


def _shapes(text: str) -> tuple[tuple[int, int, int], ...]:
    try:
        shapes = tuple(tuple(int(n) for n in item.lower().split("x")) for item in text.split(","))
    except ValueError:
        shapes = ()
    if not shapes or any(len(s) != 3 or min(s) < 1 for s in shapes):
        raise argparse.ArgumentTypeError(f"expected PROMPTSxSAMPLESxTOKENS[,...] of positive ints, got {text!r}")
    return shapes


def main(argv=None) -> int:
    parser = add_arguments(argparse.ArgumentParser(prog="python -m gae_xp.bench.groups", description=DESCRIPTION))
    return execute(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
