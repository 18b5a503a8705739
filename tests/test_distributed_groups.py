"""gae_xp.distributed.group_advantages on real gloo groups (the harness of test_distributed): every rank's
advantages equal the single-process function on all ranks' scores, groups spanning ranks included."""

from __future__ import annotations

import numpy as np
import pytest
from test_distributed import spawn

torch = pytest.importorskip("torch")


def scenario_groups(check, rank, world):
    """Ids that span ranks, consecutive groups, constant and NaN groups, an empty rank; a bad argument or a
    layout that differs raises on every rank."""
    import gae_xp
    import gae_xp.distributed as cp

    rng = np.random.default_rng(51)
    sizes = [int(s) for s in rng.integers(5, 40, world)]
    if world > 2:
        sizes[-1] = 0  # an empty rank
    total = sum(sizes)
    ids = rng.choice(np.array([-(2**62), -3, 0, 7, 2**40, 2**62 + 5]), total)
    scores = rng.normal(2.0, 3.0, total)
    scores[ids == 7] = 0.1  # a constant group over several ranks
    scores[rng.random(total) < 0.1] = np.nan
    edges = np.concatenate([[0], np.cumsum(sizes)])

    def mine(full):
        return full[edges[rank]:edges[rank + 1]]

    for options in ({}, {"baseline": "leave_one_out", "scale": "batch"}, {"baseline": None, "unbiased": False},
                    {"scale": None}, {"scale": "batch", "eps": 0.0}):
        want = gae_xp.group_advantages(scores, ids, **options)
        got = cp.group_advantages(torch.from_numpy(mine(scores)), torch.from_numpy(mine(ids)), **options)
        check.close(f"ids {options}", got, mine(want), 1e-12)
    got = cp.group_advantages(torch.from_numpy(mine(scores)).float(), torch.from_numpy(mine(ids)))
    check.close("ids float32", got, mine(gae_xp.group_advantages(scores.astype(np.float32), ids)), 1e-6)
    constant = cp.group_advantages(torch.from_numpy(mine(np.where(ids == 7, 0.1, np.nan))),
                                   torch.from_numpy(mine(ids)), eps=0.0)
    if not bool((constant == 0).all()):
        check.failures.append(f"rank {rank}: a constant group over ranks gave {constant.tolist()}")
    k = 4
    consecutive = rng.normal(size=(world * 3 * k))
    shard = consecutive[rank * 3 * k:(rank + 1) * 3 * k]
    for options in ({}, {"scale": "batch"}):
        want = gae_xp.group_advantages(consecutive, k, **options)[rank * 3 * k:(rank + 1) * 3 * k]
        check.close(f"k {options}", cp.group_advantages(torch.from_numpy(shard), k, **options), want, 1e-12)
    x = torch.from_numpy(shard)
    check.raises("eps < 0 on rank 0", ValueError, "eps must be at least 0" if rank == 0 else "rank 0 of",
                 lambda: cp.group_advantages(x, k, eps=-1.0 if rank == 0 else 1e-6))
    check.raises("ids on some ranks only", ValueError, "ids on every rank or an int k",
                 lambda: cp.group_advantages(x, k if rank == 0 else torch.zeros(x.shape[0], dtype=torch.int64)))
    check.close("after the errors", cp.group_advantages(x, k), gae_xp.group_advantages(
        consecutive, k)[rank * 3 * k:(rank + 1) * 3 * k], 1e-12)


@pytest.mark.parametrize("world", [2, 3])
def test_group_advantages_across_ranks_equal_one_process(world, tmp_path):
    failures = spawn(world, tmp_path, ["test_distributed_groups:scenario_groups"])
    assert not failures, "\n".join(failures[:20])
