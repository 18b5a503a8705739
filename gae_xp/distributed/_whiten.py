"""``gae_xp.distributed.whiten``: whitening with the mean and variance of every rank's entries."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from .. import _prepare as prepare_
from .._compat import device_of, is_torch_array
from .._problem import Array
from . import _exchange

#: the public names (gae_xp.distributed re-exports them)
__all__ = ["whiten"]

#: The numbers each rank sends (float64, 64 bytes): a header and its entries' weighted count, mean and M2.
ROW = ("protocol", "status", "world", "dtype", "count", "mean", "m2", "reserved")


def whiten(x: Array, mask: Array | None = None, *, group: Any = None, unbiased: bool = True, eps: float = 1e-8,
           shift_mean: bool = True, masked_fill: float | None = 0.0) -> Array:
    r"""``gae_xp.whiten`` over the entries of every rank of ``group``: this rank's ``x`` normalised with the
    mean and variance of all ranks' real entries together.

    With the weights ``w`` (the mask as 0/1, or numeric weights; 1 without a
    mask) of every rank's entries taken together::

        n = sum w,    mean = sum(w x) / n,    var = sum(w (x - mean)^2) / (n - 1 if unbiased else n)
        out = (x - mean) / sqrt(var + eps)      (+ mean again if not shift_mean)

    Each rank reduces its own entries to (n_k, mean_k, M2_k) in float64
    (``M2_k = sum w (x - mean_k)^2``, two passes, no cancellation), one
    all-gather exchanges these 3 numbers and a header (8 float64 numbers,
    64 bytes per rank), and every rank merges them in rank order with Chan's
    pairwise formula (``delta = mean_b - mean_a``, ``M2 = M2_a + M2_b +
    delta^2 n_a n_b / n``), which stays accurate where a sum of squares
    minus a squared sum would cancel. Every rank gets the same numbers. A
    rank without a real entry (n_k = 0) adds nothing. Entries with mask
    False or weight 0 are left out with ``where``, so NaN or inf there
    cannot leak; they get ``masked_fill`` (or are whitened like the rest
    with ``masked_fill=None``).

    Parameters
    ----------
    x : torch tensor
        This rank's entries (any shape).
    mask : torch tensor, optional
        Shaped like x: bool (True = a real entry) or numeric weights.
    group : torch.distributed.ProcessGroup, optional
        The ranks whose entries are whitened together (default: the world).
    unbiased, eps, shift_mean, masked_fill
        As in ``gae_xp.whiten``.

    Returns
    -------
    array like x
        In x's floating dtype (float16/bfloat16 computed in float32). For an
        ``x`` that requires grad, the gradient flows through ``x`` with the
        statistics held constant: the mean and variance are computed from
        detached entries (as a gathered batch statistic, like a running
        normaliser), so ``d out / d x = 1 / sqrt(var + eps)`` elementwise on
        the real entries. Single-process ``gae_xp.whiten`` differentiates
        through its statistics too.

    Raises
    ------
    ValueError, TypeError
        On **every** rank, when any rank's arguments are wrong (that rank
        raises its own error) or the ranks' dtypes differ.

    Examples
    --------
    >>> import os, tempfile, torch, torch.distributed as dist, gae_xp.distributed
    >>> store = os.path.join(tempfile.mkdtemp(), "store")
    >>> dist.init_process_group("gloo", init_method=f"file://{store}", rank=0, world_size=1)
    >>> x = torch.tensor([1.0, 2.0, 3.0, 100.0], dtype=torch.float64)
    >>> gae_xp.distributed.whiten(x, x < 50, eps=0.0).tolist()
    [-1.0, 0.0, 1.0, 0.0]
    >>> dist.destroy_process_group()
    """
    exchange = _exchange.TorchExchange(group)
    try:
        if not is_torch_array(x):
            raise TypeError(f"gae_xp.distributed.whiten takes torch tensors, got {type(x).__name__}")
        local = _Entries(prepare_.prepare_whiten(x, mask, unbiased=unbiased, eps=eps, shift_mean=shift_mean,
                                                 masked_fill=masked_fill))
        row = local.row(exchange.world)
    except Exception as error:
        import torch

        status = np.zeros(len(ROW))
        status[:4] = (_exchange.PROTOCOL, _exchange.error_status(error), exchange.world, 0)
        exchange.gather_fixed(torch.from_numpy(status).to(exchange.device(x)))
        raise
    table = exchange.gather_fixed(row.to(exchange.device(x)))
    _exchange.check_headers(table, exchange.rank, names=ROW, operation="gae_xp.distributed.whiten")
    count, mean, m2 = merge(table[:, ROW.index("count")], table[:, ROW.index("mean")], table[:, ROW.index("m2")])
    return local.apply(count, mean, m2)


def merge(counts, means, m2s):
    """(n, mean, M2) of all ranks' entries from each rank's, merged in rank order (Chan et al.'s pairwise update);
    float64 host numbers. With no real entry anywhere the mean is NaN, as ``gae_xp.whiten``'s 0 / 0."""
    n, mean, m2 = 0.0, 0.0, 0.0
    for n_k, mean_k, m2_k in zip(counts.tolist(), means.tolist(), m2s.tolist()):
        if n_k == 0:
            continue
        total = n + n_k
        delta = mean_k - mean
        mean += delta * (n_k / total)
        m2 += m2_k + delta * delta * (n * n_k / total)
        n = total
    return n, (mean if n != 0 else float("nan")), m2


class _Entries:
    """This rank's checked entries and their float64 moments."""

    def __init__(self, call: prepare_.PreparedWhiten):
        self.call, self.xp = call, call.xp
        self.values, self.mask, self.out_dtype, self.eps = call.values, call.mask, call.out_dtype, call.eps
        self.weights, self.real = call.weights(call.xp.float64)

    def row(self, world: int):
        """The 8 numbers this rank sends: header, then (n, mean, M2) of its entries in float64 (on its device).
        Computed from detached entries: the statistics carry no gradient (see ``whiten``)."""
        xp = self.xp
        x = xp.astype(self.values.detach(), xp.float64)
        weights = None if self.weights is None else self.weights.detach()
        zero = xp.asarray(0.0, dtype=xp.float64, device=device_of(x))
        if weights is None:
            count = xp.asarray(float(math.prod(x.shape)), dtype=xp.float64, device=device_of(x))
            weighted = x
        else:
            count = xp.sum(weights)
            weighted = xp.where(self.real, weights * x, zero)
        mean = xp.sum(weighted) / xp.where(count != 0, count, xp.ones_like(count))
        centred = x - mean
        squares = centred * centred
        m2 = xp.sum(squares if weights is None else xp.where(self.real, weights * squares, zero))
        head = xp.asarray([_exchange.PROTOCOL, _exchange.OK, world, _exchange.dtype_code(self.out_dtype)],
                          dtype=xp.float64, device=device_of(x))
        return xp.concat([head, xp.stack([count, mean, m2, zero])])

    def apply(self, count, mean, m2):
        xp, call = self.xp, self.call
        with np.errstate(divide="ignore", invalid="ignore"):  # 0 / 0 is NaN, as in gae_xp.whiten
            var = np.float64(m2) / np.float64(count - 1 if call.unbiased else count)
            scale = float(np.sqrt(var + self.eps))
        out = (self.values - mean) / scale
        if not call.shift_mean:
            out = out + mean
        if self.mask is not None and call.masked_fill is not None:
            out = xp.where(self.real, out, xp.zeros_like(out) + call.masked_fill)
        return xp.astype(out, self.out_dtype, copy=False)
