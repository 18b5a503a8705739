r"""Context parallelism: GAE on sequences whose time axis is split across the ranks of a ``torch.distributed`` group.

Each rank passes its own shard of the time axis and gets back its shard of
the advantages and returns, equal to ``gae_xp.gae`` on the whole sequence.
The sequence never crosses between ranks: every rank summarises its pieces
in five numbers per row (``gae_xp._pieces``), **one all-gather** exchanges
the summaries, every rank solves the small chains over all pieces (the
scan skeleton's step 2, ``_scan.scan`` over the pieces' axis), and solves
its own pieces again with what enters them from the right (step 3).

Layouts (world size W, rank k):

* ``"contiguous"``: rank k holds the k-th of W equal pieces of the time axis;
* ``"zigzag"``: Megatron's load-balanced layout: the sequence is cut into
  2W equal chunks and rank k holds chunks k and 2W-1-k, concatenated.

Packed sequences (``cu_seqlens``: the *global* offsets, the same on every
rank; ``bootstrap_value`` one per sequence) work with both:

* ``"contiguous"``: the packed row is cut into W equal pieces wherever the
  sequences fall; sequences wholly inside a shard need nothing from other
  ranks, and each rank's summary is that of its first sequence's piece;
* ``"zigzag"``: Megatron's THD layout with CP: *every sequence* (its length
  a multiple of 2W) is cut into 2W chunks, and rank k holds chunks k and
  2W-1-k of each sequence, sequence after sequence; the chains run per
  sequence (batched), with 2 summaries per sequence and rank.

The rank holding a sequence's last step reads its bootstrap value and
closes that piece itself; other ranks' bootstrap values are not read.
Communication per call: one all-gather (``all_gather_flat``) of ``5 * rows * pieces``
numbers per rank in the compute dtype (pieces: 1 contiguous, 2 zigzag, 2
per sequence packed zigzag), whatever the length. No gradient flows across
ranks (the summaries are detached).
"""

from __future__ import annotations

import numpy as np

from . import _pieces, backends
from . import _prepare as prepare_
from ._compat import device_of, is_torch_array

LAYOUTS = ("contiguous", "zigzag")


def gae(rewards, values, *, group=None, layout="contiguous", gamma=0.99, lam=0.95, bootstrap_value=None,
        next_values=None, terminated=None, truncated=None, mask=None, axis=-1, chunk_size=None, backend="auto",
        fill_masked=False, cu_seqlens=None):
    """``(advantages, returns)`` of this rank's shard; arguments as in ``gae_xp.gae`` on the shard.

    Args:
        rewards, values (and every per-step argument): torch tensors, this
            rank's shard of the time axis (``axis``) in the ``layout``.
        group: the ``torch.distributed`` process group (default: the world).
        layout: "contiguous" or "zigzag" (see the module docstring).
        bootstrap_value: the value after the sequence's last step (per
            sequence with ``cu_seqlens``); read on the rank that holds that step.
        cu_seqlens: the global offsets of packed sequences (an integer tensor
            on every rank, the same everywhere), ``0 = o_0 < ... < o_n =``
            the global length (W times the shard's length).
    """
    import torch.distributed as dist

    if not is_torch_array(rewards):
        raise TypeError(f"gae_xp.distributed.gae takes torch tensors, got {type(rewards).__name__}")
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {', '.join(map(repr, LAYOUTS))}, got {layout!r}")
    packed = cu_seqlens is not None
    call = prepare_.prepare(rewards, values, gamma=gamma, lam=lam, next_values=next_values, terminated=terminated,
                            truncated=truncated, mask=mask, axis=axis, chunk_size=chunk_size, backend=backend,
                            fill_masked=fill_masked, bootstrap_value=None if packed else bootstrap_value)
    p = call.problem
    solver = backends.solver(call, segments=True)
    xp = p.xp
    world, rank = dist.get_world_size(group), dist.get_rank(group)
    length = p.rewards.shape[-1]
    if not packed:
        offsets, bootstrap = None, p.bootstrap[..., 0]  # (...)
    else:
        prepare_.one_boundary(bootstrap_value, next_values)
        offsets = _global_offsets(xp, cu_seqlens, world * length, p.rewards)
        bootstrap = prepare_.boundary(xp, "bootstrap_value", 0.0 if bootstrap_value is None else bootstrap_value,
                                      p.rewards.shape[:-1], p.rewards.dtype, p.rewards,
                                      segments=len(offsets) - 1)  # (..., n)
    solve = _zigzag if layout == "zigzag" else _contiguous
    advantages, returns = solve(call, solver, p, bootstrap, offsets, world, rank, group)
    return call.restore(advantages), call.restore(returns)


def _contiguous(call, solver, p, bootstrap, offsets, world, rank, group):
    xp = p.xp
    length = p.rewards.shape[-1]
    low, high = rank * length, (rank + 1) * length
    if offsets is None:
        cuts, closed, sequences = np.array([0, length]), [rank == world - 1], [0]
        bootstrap = xp.expand_dims(bootstrap, axis=-1)
    else:
        inner = offsets[(offsets > low) & (offsets < high)] - low
        cuts = np.concatenate([[0], inner, [length]])
        sequences = list(np.searchsorted(offsets, low + cuts[:-1], side="right") - 1)
        closed = [bool(np.isin(low + end, offsets)) for end in cuts[1:]]
    # 1. the summary of this rank's first piece (the steps up to its first sequence end), closed if it ends one
    head = p.head(int(cuts[1]))
    summary = _pieces.summarize(head, solver, call.chunk_size)[..., 0, :]
    if closed[0]:
        summary = _pieces.close(xp, summary, bootstrap[..., sequences[0]])
    # 2. one all-gather; every rank solves the chains over the W pieces
    gathered = _all_gather(xp, summary, world, group)  # (W, ..., 5)
    b, c = _pieces.incoming(xp, xp.moveaxis(gathered, 0, -2), 0.0)
    # 3. this rank's pieces again: closed sequences take their bootstrap, the last open piece b and c
    zero = xp.zeros_like(b[..., rank])
    ends_b = [bootstrap[..., s] if shut else b[..., rank] for s, shut in zip(sequences, closed)]
    ends_c = [zero if shut else c[..., rank] for shut in closed]
    local = _with_segments(p, cuts, xp.stack(ends_b, axis=-1), xp.stack(ends_c, axis=-1))
    return _pieces.finish(local, solver, call.chunk_size)


def _zigzag(call, solver, p, bootstrap, offsets, world, rank, group):
    xp = p.xp
    length = p.rewards.shape[-1]
    chunks = 2 * world
    if offsets is None:
        lengths = np.array([world * length])
        bootstrap = xp.expand_dims(bootstrap, axis=-1)
    else:
        lengths = np.diff(offsets)
    if np.any(lengths % chunks):
        raise ValueError(f"layout='zigzag' cuts every sequence into 2 * world_size = {chunks} equal chunks: "
                         f"sequence lengths {lengths[lengths % chunks != 0][:4].tolist()} are not multiples of it")
    half = lengths // chunks
    cuts = np.concatenate([[0], np.cumsum(np.repeat(half, 2))])  # two chunks per sequence on every rank
    if cuts[-1] != length:
        raise ValueError(f"layout='zigzag': this rank holds {length} steps, but the sequences give it {cuts[-1]}")
    count = len(lengths)
    # 1. summaries of this rank's 2 chunks of every sequence: (..., n, 2, 5); chunk 2W-1 (rank 0's second) is closed
    zeros = xp.zeros((*p.rewards.shape[:-1], 2 * count), dtype=p.rewards.dtype, device=device_of(p.rewards))
    summaries = _pieces.summarize(_with_segments(p, cuts, zeros, None), solver, call.chunk_size)
    summaries = xp.reshape(summaries, (*summaries.shape[:-2], count, 2, 5))
    if rank == 0:
        summaries = xp.stack([summaries[..., 0, :], _pieces.close(xp, summaries[..., 1, :], bootstrap)], axis=-2)
    # 2. one all-gather; the chains over the 2W chunks of every sequence
    gathered = _all_gather(xp, summaries, world, group)  # (W, ..., n, 2, 5)
    order = [gathered[k, ..., 0, :] for k in range(world)] + [gathered[k, ..., 1, :] for k in reversed(range(world))]
    b, c = _pieces.incoming(xp, xp.stack(order, axis=-2), 0.0)  # (..., n, 2W)
    mine = [rank, chunks - 1 - rank]
    own_b = xp.stack([b[..., mine[0]], bootstrap if rank == 0 else b[..., mine[1]]], axis=-1)
    own_c = xp.stack([c[..., mine[0]], c[..., mine[1]]], axis=-1)  # c is 0 after the last chunk
    shape = (*own_b.shape[:-2], 2 * count)
    # 3. this rank's chunks again with what enters them
    local = _with_segments(p, cuts, xp.reshape(own_b, shape), xp.reshape(own_c, shape))
    return _pieces.finish(local, solver, call.chunk_size)


def _all_gather(xp, local, world, group):
    """(W, *local.shape): every rank's ``local`` (the one collective of a call)."""
    flat = xp.reshape(local.detach(), (-1,)).contiguous()
    out = xp.empty((world * flat.shape[0],), dtype=local.dtype, device=device_of(local))
    all_gather_flat(out, flat, group=group)
    return xp.reshape(out, (world, *local.shape))


def all_gather_flat(out, flat, group=None):
    """Every rank's 1-d tensor ``flat``, concatenated in rank order into ``out`` (one collective).

    ``torch.distributed.all_gather_single`` where this torch has it (2.13 on,
    where ``all_gather_into_tensor`` is deprecated), else ``all_gather_into_tensor``.
    """
    import torch.distributed as dist

    gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    gather(out, flat, group=group)


def _global_offsets(xp, cu_seqlens, total, like):
    """The global offsets as host int64 (checked like ``gae()``'s cu_seqlens, against the global length)."""
    if cu_seqlens is None:
        return None
    _, host_offsets = prepare_.check_offsets(xp, cu_seqlens, total, like)
    return host_offsets


def _with_segments(p, cuts, bootstrap, carry):
    """The problem with local segments at ``cuts`` (host ints) and a bootstrap (and carry) per segment."""
    return p.with_segments(cuts, bootstrap, carry)
