"""``gae_xp.distributed.group_advantages``: group-relative advantages of a batch split over data-parallel ranks."""

from __future__ import annotations

from typing import Any

import numpy as np

from .. import _segments
from .. import groups as groups_
from .._compat import is_torch_array
from .._problem import Array
from . import _exchange
from ._whiten import merge

#: The numbers each rank sends first (float64): a header, its scores' (n, mean, M2), the layout (0: consecutive
#: groups of k, 1: ids) and, with ids, its number of distinct ids.
ROW = ("protocol", "status", "world", "dtype", "count", "mean", "m2", "layout", "slots", "reserved")
#: Per distinct id, in the second all-gather: the id's int64 bits, and its (n, mean, M2) on this rank.
TABLE = ("id", "count", "mean", "m2")


def group_advantages(scores: Array, group_ids: Array | int, *, baseline: str | None = "mean",
                     scale: str | None = "group", eps: float = 1e-6, unbiased: bool = True, group: Any = None) -> Array:
    r"""``gae_xp.group_advantages`` over the scores of every rank of ``group``: this rank's advantages, equal to
    the single-process function on all ranks' scores concatenated in rank order.

    * ``group_ids`` an int k: consecutive groups of k on every rank (each
      rank's N a multiple of k), so no group spans ranks. **One all-gather**
      of 10 float64 numbers per rank: a header and this rank's (n, mean, M2)
      (``scale="batch"`` takes the batch's from their merge, Chan's formula as
      in ``distributed.whiten``).
    * ``group_ids`` an integer array: ids are global, and a group's members
      may sit on any ranks. The same all-gather, then a second one of 4
      numbers per distinct id of the rank with the most (padded to it): each
      id's (n, mean, M2) on each rank, merged per id by the corrected
      two-pass sum of ``gae_xp._segments`` (the moments of a group split over
      ranks equal those of the group whole; equal scores still give exactly
      0).

    Parameters
    ----------
    scores : torch tensor (N,)
        This rank's scores (N may differ between ranks; 0 is allowed).
    group_ids : torch integer tensor (N,) or int
    baseline, scale, eps, unbiased
        As in ``gae_xp.group_advantages``.
    group : torch.distributed.ProcessGroup, optional
        Default: the world.

    Returns
    -------
    torch tensor (N,)
        Like ``gae_xp.group_advantages``'s.

    Raises
    ------
    ValueError, TypeError
        On **every** rank, when any rank's arguments are wrong (that rank
        raises its own error), the ranks' dtypes differ, or some ranks pass ids
        and others an int.

    Examples
    --------
    >>> import os, tempfile, torch, torch.distributed as dist, gae_xp.distributed
    >>> store = os.path.join(tempfile.mkdtemp(), "store")
    >>> dist.init_process_group("gloo", init_method=f"file://{store}", rank=0, world_size=1)
    >>> scores = torch.tensor([1.0, 3.0, 0.1, 0.1], dtype=torch.float64)
    >>> gae_xp.distributed.group_advantages(scores, 2, eps=0.0).tolist()  # -+1/sqrt(2), its last digit the CPU's
    [-0.707106781186547..., 0.707106781186547..., 0.0, 0.0]
    >>> dist.destroy_process_group()
    """
    import torch

    exchange = _exchange.TorchExchange(group)
    try:
        if not is_torch_array(scores):
            raise TypeError(f"gae_xp.distributed.group_advantages takes torch tensors, got {type(scores).__name__}")
        call = groups_._Call.prepare(scores, group_ids)
        groups_._check_options(baseline, scale, eps, unbiased)
        moments = call.moments()
        row = _row(call, moments, exchange.world)
    except Exception as error:
        status = np.zeros(len(ROW))
        status[:4] = (_exchange.PROTOCOL, _exchange.error_status(error), exchange.world, 0)
        exchange.gather_fixed(torch.from_numpy(status).to(exchange.device(scores)))
        raise
    table = exchange.gather_fixed(row.to(exchange.device(scores)))
    _exchange.check_headers(table, exchange.rank, names=ROW, operation="gae_xp.distributed.group_advantages")
    layouts = table[:, ROW.index("layout")]
    if np.unique(layouts).shape[0] > 1:
        given = ", ".join(f"rank {k}: {'ids' if v else 'an int k'}" for k, v in enumerate(layouts.tolist()))
        raise ValueError(f"gae_xp.distributed.group_advantages: group_ids must be ids on every rank or an int k on "
                         f"every rank ({given})")
    count, _, m2 = merge(table[:, ROW.index("count")], table[:, ROW.index("mean")], table[:, ROW.index("m2")])
    xp, like = call.xp, {"dtype": call.dtype, "device": scores.device}
    batch = (xp.asarray(count, **like), xp.asarray(m2, **like))
    if call.k is None and int(table[:, ROW.index("slots")].max()) > 0:
        moments = _merged_ids(exchange, call, moments, table[:, ROW.index("slots")].astype(np.int64))
    if scores.shape[0] == 0:
        return xp.zeros(0, dtype=call.out_dtype, device=scores.device)
    return groups_.advantages_of(call, moments, baseline=baseline, scale=scale, eps=eps, unbiased=unbiased,
                                 batch=batch)


def _row(call, moments, world: int):
    """This rank's first numbers: header, (n, mean, M2) of its scores, layout, distinct ids."""
    xp = call.xp
    device = call.scores.device
    if call.scores.shape[0] == 0:
        local = [xp.asarray(0.0, dtype=xp.float64, device=device)] * 3
    else:
        local = [xp.astype(v, xp.float64) for v in groups_._merge(xp, *moments)]
    slots = 0.0 if call.k is not None or call.scores.shape[0] == 0 else xp.max(call.index) + 1
    head = xp.asarray([_exchange.PROTOCOL, _exchange.OK, world, _exchange.dtype_code(call.out_dtype)],
                      dtype=xp.float64, device=device)
    tail = xp.stack([xp.asarray(float(call.k is None), dtype=xp.float64, device=device),
                     xp.asarray(slots, dtype=xp.float64, device=device), xp.asarray(0.0, dtype=xp.float64,
                                                                                    device=device)])
    return xp.concat([head, xp.stack(local), tail])


def _merged_ids(exchange, call, moments, slots):
    """Every local group's moments over all ranks: one all-gather of (id, n, mean, M2) per distinct id, padded to
    the largest rank's count; the entries of one id merged by the corrected two-pass sum."""
    import torch

    xp, rank, width = call.xp, exchange.rank, int(slots.max())
    device = exchange.device(call.scores)
    count, mean, m2 = (v.to(torch.float64) for v in moments)
    mine = int(slots[rank])
    ids = torch.zeros(call.scores.shape[0], dtype=torch.int64, device=call.scores.device)
    ids = ids.scatter(0, call.index, call.group_ids.to(torch.int64))
    local = torch.zeros((width, len(TABLE)), dtype=torch.float64, device=call.scores.device)
    local[:mine, 0] = ids[:mine].view(torch.float64)
    local[:mine, 1], local[:mine, 2], local[:mine, 3] = count[:mine], mean[:mine], m2[:mine]
    gathered = torch.empty(exchange.world * width * len(TABLE), dtype=torch.float64, device=device)
    _exchange.all_gather_flat(gathered, local.detach().reshape(-1).to(device), group=exchange.group)
    entries = gathered.reshape(-1, len(TABLE)).to(call.scores.device)
    index = _segments.dense_index(xp, entries[:, 0].contiguous().view(torch.int64))
    size = entries.shape[0]
    n_i, mean_i, m2_i = entries[:, 1], entries[:, 2], entries[:, 3]
    n = _segments.segment_sum(xp, n_i, index, size)
    divisor = xp.where(n > 0, n, xp.ones_like(n))
    first = _segments.segment_sum(xp, n_i * mean_i, index, size) / divisor
    d = mean_i - xp.take(first, index)
    d_sum = _segments.segment_sum(xp, n_i * d, index, size)
    spread = _segments.segment_sum(xp, n_i * d * d, index, size) - d_sum * (d_sum / divisor)
    total_m2 = _segments.segment_sum(xp, m2_i, index, size) + xp.where(spread < 0, xp.zeros_like(spread), spread)
    global_mean = first + d_sum / divisor
    # this rank's slots are rows [rank * width, rank * width + mine) of the table
    at = index[rank * width:rank * width + mine]
    pad = torch.zeros(call.scores.shape[0] - mine, dtype=torch.float64, device=call.scores.device)
    return tuple(torch.cat([merged[at], pad]).to(moments[0].dtype) for merged in (n, global_mean, total_m2))
