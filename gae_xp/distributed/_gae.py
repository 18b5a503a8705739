"""``gae_xp.distributed.gae``: GAE on sequences whose time axis is sharded across ranks."""

from __future__ import annotations

import inspect
import warnings
from typing import Any, Sequence

import numpy as np

from .. import _pieces, backends, estimators
from .. import _prepare as prepare_
from .._compat import device_of, is_jax_array, is_torch_array
from .._problem import Array
from . import _exchange
from ._context import Context

#: the public names (gae_xp.distributed re-exports them)
__all__ = ["gae"]

#: ``gae_xp.gae``'s keyword arguments, forwarded as they are (``cu_seqlens`` belongs to the Context).
GAE_OPTIONS = frozenset(inspect.signature(estimators.gae).parameters) - {"rewards", "values", "cu_seqlens"}


def gae(rewards: Array, values: Array, *, context: Context | None = None, group: Any = None, layout: str | None = None,
        cu_seqlens: Array | Sequence[int] | None = None, **options: Any) -> tuple[Array, Array]:
    r"""GAE of this rank's shard of the time axis: ``(advantages, returns)`` of the shard, equal to ``gae_xp.gae``
    on the whole sequence.

    Every rank calls it with its own shard (``context.layout``). Each rank
    summarises its pieces in five numbers per row (``gae_xp._pieces.FIELDS``;
    eight with ``critic_lam``), **one** all-gather exchanges the summaries
    (with a header that every rank checks), every rank solves the chains
    over all pieces, in time order, of what enters each piece from its right::

        b_k = value_{k+1} + on_value_{k+1} b_{k+1}
        c_k = edge_{k+1} + on_bootstrap_{k+1} b_{k+1} + product_{k+1} c_{k+1}

    and solves its own pieces again with its ``(b, c)`` as their bootstrap
    value and incoming advantage. The sequence itself never crosses.

    Parameters
    ----------
    rewards, values : torch tensors (JAX arrays inside ``jax.shard_map``)
        This rank's shard of the time axis (``axis``), laid out as
        ``context.layout`` says.
    context : Context, optional
        The layout, built once. Default: ``Context()``, the contiguous layout
        over the world group, without packed sequences.
    group, layout, cu_seqlens : deprecated
        The former call form: a Context is built for the call (with a
        ``DeprecationWarning``); build it once instead.
    **options
        ``gae_xp.gae``'s keyword arguments (``gamma``, ``lam``,
        ``terminated``, ``mask``, ``critic_lam``, ``backend``, ...), per-step
        arrays given as this rank's shard. ``bootstrap_value`` is the value
        after the sequence's last step (with packed sequences, one per
        sequence: the batch shape plus a trailing axis of n); only the rank
        that holds a sequence's last step reads it.

    Returns
    -------
    advantages, returns : arrays like ``rewards``
        This rank's shard of ``gae_xp.gae``'s outputs on the gathered
        sequence. No gradient flows across ranks (the summaries are detached).

    Raises
    ------
    ValueError, TypeError
        On **every** rank, when any rank's arguments are wrong (the error of
        that rank, with its message), or when the ranks disagree on the batch
        shape, the dtype, the Context or ``critic_lam``.

    Examples
    --------
    >>> import os, tempfile, torch, torch.distributed as dist, gae_xp, gae_xp.distributed
    >>> store = os.path.join(tempfile.mkdtemp(), "store")
    >>> dist.init_process_group("gloo", init_method=f"file://{store}", rank=0, world_size=1)
    >>> context = gae_xp.distributed.Context(layout="zigzag")
    >>> rewards, values = torch.ones(2, 8, dtype=torch.float64), torch.zeros(2, 8, dtype=torch.float64)
    >>> advantages, _ = gae_xp.distributed.gae(rewards, values, context=context, gamma=0.5, lam=1.0)
    >>> advantages[0, :3].tolist()
    [1.9921875, 1.984375, 1.96875]
    >>> dist.destroy_process_group()
    """
    context = _resolve(context, group, layout, cu_seqlens)
    exchange = context.exchange()
    try:
        unknown = sorted(set(options) - GAE_OPTIONS)
        if unknown:
            raise TypeError(f"gae_xp.distributed.gae() got unexpected keyword arguments {unknown}: it takes "
                            f"gae_xp.gae()'s ({', '.join(sorted(GAE_OPTIONS))}); cu_seqlens belongs to the Context")
        shard = _Shard(context, exchange, rewards, values, options)
        summaries = shard.summarize()
    except Exception as error:
        exchange.fail(error, rewards)  # every rank learns of it in the same one collective
        raise
    return shard.finish(exchange.gather(shard.header(summaries), summaries))


def _resolve(context, group, layout, cu_seqlens) -> Context:
    if context is not None:
        if not isinstance(context, Context):
            raise TypeError(f"context must be a gae_xp.distributed.Context, got {type(context).__name__}")
        if group is not None or layout is not None or cu_seqlens is not None:
            raise TypeError("group, layout and cu_seqlens belong to the Context: pass them to "
                            "gae_xp.distributed.Context(group, layout, cu_seqlens)")
        return context
    if group is None and layout is None and cu_seqlens is None:
        return Context()
    warnings.warn("gae_xp.distributed.gae(..., group=, layout=, cu_seqlens=) is deprecated: build "
                  "context = gae_xp.distributed.Context(group, layout, cu_seqlens) once and pass context=context",
                  DeprecationWarning, stacklevel=3)
    return Context(group, "contiguous" if layout is None else layout, cu_seqlens)


def _select(flag, when_true, when_false, xp):
    """``when_true if flag else when_false`` for a host flag; ``where`` for a traced one (a JAX rank)."""
    if isinstance(flag, (bool, np.bool_)):
        return when_true if flag else when_false
    return xp.where(flag, when_true, when_false)


class _Shard:
    """This rank's part of a call: its checked problem, the backend that solves its pieces, its local segments."""

    def __init__(self, context: Context, exchange, rewards, values, options: dict):
        library, accepts = ("JAX arrays", is_jax_array) if exchange.traced else ("torch tensors", is_torch_array)
        if not accepts(rewards):
            where = "a jax.shard_map axis" if exchange.traced else "torch.distributed"
            raise TypeError(f"gae_xp.distributed.gae over {where} takes {library}, got {type(rewards).__name__}")
        self.context, self.exchange = context, exchange
        # Packed: one bootstrap value per global sequence, checked with the other arguments (library, device).
        self.call = prepare_.prepare(rewards, values, **options,
                                     sequences=context.sequences if context.packed else None)
        p = self.p = self.call.problem
        self.solver = backends.Guarded(backends.solver(self.call, segments=True), forced=self.call.backend != "auto")
        context.check(exchange.world, p.length)
        self.batch = tuple(p.rewards.shape[:-1])
        self.bootstrap = p.bootstrap  # (..., sequences), or (..., 1) unpacked
        self.width = len(_pieces.FIELDS) + (0 if p.critic_lam is None else len(_pieces.CRITIC_FIELDS))
        if context.layout == "zigzag":
            self.cuts = context.zigzag_cuts(exchange.world, p.length)
        else:
            self.cuts, self.sequences, self.closed = self._contiguous_segments()

    # --- 1. this rank's summaries ---------------------------------------------------------------------------------

    def summarize(self):
        """(..., pieces, width): the summaries this rank sends, closed where a piece ends its sequence."""
        xp, p, rank = self.p.xp, self.p, self.exchange.rank
        if self.context.layout == "zigzag":  # two pieces per sequence; rank 0's second one ends its sequence
            count = self.context.sequences
            zeros = xp.zeros((*self.batch, 2 * count), dtype=p.rewards.dtype, device=device_of(p.rewards))
            summaries = _pieces.summarize(p.with_segments(self.cuts, zeros), self.solver, self.call.chunk_size)
            summaries = xp.reshape(summaries, (*self.batch, count, 2, self.width))
            second = _select(rank == 0, _pieces.close(xp, summaries[..., 1, :], self.bootstrap), summaries[..., 1, :],
                             xp)
            return xp.stack([summaries[..., 0, :], second], axis=-2)
        # contiguous: the summary of the first piece (the steps up to the first sequence end), closed if it ends one
        if isinstance(self.cuts, np.ndarray):
            first = _pieces.summarize(p.head(int(self.cuts[1])), self.solver, self.call.chunk_size)[..., 0, :]
        else:  # a traced rank's cuts: every local segment is summarised, the first kept
            zeros = xp.zeros((*self.batch, self.closed.shape[-1]), dtype=p.rewards.dtype, device=device_of(p.rewards))
            first = _pieces.summarize(self._local(zeros, None), self.solver, self.call.chunk_size)[..., 0, :]
        closed = _pieces.close(xp, first, self.bootstrap[..., self.sequences[0]])
        return _select(self.closed[0], closed, first, xp)[..., None, :]

    def header(self, summaries):
        if self.exchange.traced:
            return None
        same_length = self.context.layout == "zigzag" or self.context.packed
        return _exchange.header(context=self.context.digest, world=self.exchange.world, dtype=self.call.out_dtype,
                                batch_shape=self.batch, length=self.p.length if same_length else -1,
                                pieces=int(np.prod(summaries.shape[len(self.batch):-1])), fields=self.width,
                                size=int(np.prod(summaries.shape)))

    # --- 2. the chains over every rank's pieces, 3. this rank's pieces again -------------------------------------

    def finish(self, gathered):
        """(advantages, returns) of this rank's shard, from every rank's summaries (W, ...) as gathered."""
        xp, p, rank, world = self.p.xp, self.p, self.exchange.rank, self.exchange.world
        summary_shape = (*self.batch, *((self.context.sequences, 2) if self.context.layout == "zigzag" else (1,)),
                         self.width)
        if not self.exchange.traced:  # (W, size) float64 on the collective's device: chains in float64
            gathered = xp.reshape(gathered.to(device_of(p.rewards)), (world, *summary_shape))
        if self.context.layout == "zigzag":
            order = ([gathered[k, ..., 0, :] for k in range(world)]
                     + [gathered[k, ..., 1, :] for k in reversed(range(world))])
            b, *carries = self._incoming(xp.stack(order, axis=-2))  # (..., n, 2W)
            second = 2 * world - 1 - rank
            own_b = xp.stack([b[..., rank], _select(rank == 0, self.bootstrap, b[..., second], xp)], axis=-1)
            shape = (*self.batch, 2 * self.context.sequences)
            own = [xp.reshape(own_b, shape)] + [xp.reshape(xp.stack([c[..., rank], c[..., second]], axis=-1), shape)
                                                for c in carries]
        else:
            b, *carries = self._incoming(xp.moveaxis(gathered[..., 0, :], 0, -2))  # (..., W)
            closed, sequences = self._on_device(self.closed), self._on_device(self.sequences)
            own = [xp.where(closed, xp.take(self.bootstrap, sequences, axis=self.bootstrap.ndim - 1),
                            b[..., rank][..., None])]
            own += [xp.where(closed, xp.zeros_like(own[0]), c[..., rank][..., None]) for c in carries]
        local = self._local(own[0], own[1])
        advantages, returns = _pieces.finish(local, self.solver, self.call.chunk_size,
                                             own[2] if len(own) > 2 else None)
        return self.call.restore(advantages), self.call.restore(returns)

    def _incoming(self, summaries):
        """(b, c[, critic_c]) entering every piece, in the compute dtype (solved in the summaries' dtype)."""
        xp, dtype = self.p.xp, self.p.rewards.dtype
        return [xp.astype(x, dtype) for x in _pieces.incoming(xp, summaries, 0.0)]

    # --- the local segments ---------------------------------------------------------------------------------------

    def _contiguous_segments(self):
        """(cuts, sequences, closed) of this rank's local segments: host arrays, or, for a traced rank, its row of
        every rank's tables (the cuts stay host offsets where every rank has the same)."""
        world, length = self.exchange.world, self.p.length
        if not self.exchange.traced:
            shard = self.context.shard(world, self.exchange.rank, length)
            return shard.cuts, shard.sequences, shard.closed
        xp, tables = self.p.xp, self.context.tables(world, length)

        def row(table):
            return xp.asarray(table)[self.exchange.rank]

        return (tables.cuts[0] if tables.same_cuts else row(tables.cuts)), row(tables.sequences), row(tables.closed)

    def _on_device(self, host):
        if isinstance(host, np.ndarray):
            return self.p.xp.asarray(host, device=device_of(self.p.rewards))
        return host

    def _local(self, bootstrap, carry):
        """The problem cut into this rank's local segments, with a bootstrap value (and a carry) per segment."""
        if isinstance(self.cuts, np.ndarray):
            return self.p.with_segments(self.cuts, bootstrap, carry)
        return self.p.replace(offsets=self.cuts, host_offsets=None, bootstrap=bootstrap, carry=carry)
