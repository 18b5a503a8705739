"""Where each rank's steps lie in a context-parallel layout: host arithmetic on the global offsets.

With world size W and global offsets ``0 = o_0 <= ... <= o_n = N`` (without
offsets, one sequence of all the steps):

* ``"contiguous"``: rank k holds steps ``[k L, (k+1) L)`` with L = N / W
  (without offsets the shards may have any lengths). Its local segments are
  cut at the offsets strictly inside the shard; local segment j belongs to
  sequence ``s + j``, where s is the sequence that holds the shard's first
  step. Every local segment but the last ends its sequence (it is *closed*:
  its own bootstrap value enters, nothing from the right); the last one does
  when the shard ends at an offset.
* ``"zigzag"``: every sequence, of a length that is a multiple of 2W, is cut
  into 2W equal chunks; rank k holds chunks k and 2W-1-k of each sequence,
  sequence after sequence. Its local segments are these 2 chunks per
  sequence, cut at the same places on every rank.

Everything here is vectorised NumPy over the offsets (``searchsorted``, no
loop over sequences): a Context over 16,384 sequences is built in
milliseconds.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .. import _prepare
from .._compat import array_namespace, is_array, is_jax_array, values_are_readable

LAYOUTS = ("contiguous", "zigzag")


def host_offsets(cu_seqlens) -> np.ndarray:
    """The global offsets as a checked host int64 array: 1-D integers, from 0, non-decreasing (a repeated offset is
    an empty sequence). A device tensor is read once, here; lists, tuples and NumPy arrays need no read."""
    if isinstance(cu_seqlens, (list, tuple)):
        try:
            cu_seqlens = np.asarray(cu_seqlens)
        except ValueError:  # a ragged list
            raise TypeError("cu_seqlens given as a list must hold integers (sequence offsets)") from None
    if not is_array(cu_seqlens):
        raise TypeError(f"cu_seqlens must be an integer array or a list of offsets, got {type(cu_seqlens).__name__}")
    if is_jax_array(cu_seqlens) and not values_are_readable(cu_seqlens):
        raise TypeError("cu_seqlens of a Context must be concrete (host offsets, or a JAX array outside jax.jit): "
                        "the layout is computed from its values once")
    host = np.asarray(_prepare.host_copy(cu_seqlens))
    total = int(host[-1]) if host.ndim == 1 and host.size and np.issubdtype(host.dtype, np.number) else 0
    _, checked = _prepare.check_offsets(array_namespace(host), host, total, host)
    return checked


def check_total(offsets, world: int, length: int) -> None:
    """The global offsets must end at W times this rank's shard length."""
    if offsets is not None and int(offsets[-1]) != world * length:
        raise ValueError(f"cu_seqlens ends at {int(offsets[-1])} steps, but {world} ranks of this rank's {length} "
                         f"steps hold {world * length}: every rank passes a shard of total / world_size steps")


@dataclass(frozen=True)
class Shard:
    """One rank's local segments (host arrays): their boundaries ``cuts`` (n + 1, from 0 to the shard's length),
    the global sequence of each (n,), and whether each ends its sequence (n,)."""

    cuts: np.ndarray
    sequences: np.ndarray
    closed: np.ndarray


def contiguous(offsets, world: int, rank: int, length: int) -> Shard:
    """Rank ``rank``'s local segments in the contiguous layout (see the module docstring)."""
    if offsets is None:
        return Shard(np.array([0, length], dtype=np.int64), np.zeros(1, dtype=np.int64),
                     np.array([rank == world - 1]))
    low, high = rank * length, (rank + 1) * length
    first = int(np.searchsorted(offsets, low, side="right"))  # offsets up to and at the shard's start
    stop = int(np.searchsorted(offsets, high, side="left"))  # offsets before the shard's end
    cuts = np.concatenate([[0], offsets[first:stop] - low, [length]]).astype(np.int64)
    count = cuts.shape[0] - 1
    sequences = np.minimum(first - 1 + np.arange(count), offsets.shape[0] - 2)  # (an empty last shard: clamped)
    closed = np.ones(count, dtype=bool)
    closed[-1] = stop < offsets.shape[0] and int(offsets[stop]) == high
    return Shard(cuts, sequences.astype(np.int64), closed)


@dataclass(frozen=True)
class Tables:
    """Every rank's ``Shard`` padded to one segment count (empty segments at the end, closed), stacked (W, ...):
    for a rank known only as a traced index (``jax.lax.axis_index``). ``same_cuts``: every rank has the same
    cuts (then they stay host offsets)."""

    cuts: np.ndarray
    sequences: np.ndarray
    closed: np.ndarray
    same_cuts: bool


def contiguous_tables(offsets, world: int, length: int) -> Tables:
    shards = [contiguous(offsets, world, rank, length) for rank in range(world)]
    count = max(s.closed.shape[0] for s in shards)

    def padded(values, size, fill=None):  # fill None: the row's last value
        return np.stack([np.concatenate([v, np.full(size - v.shape[0], v[-1] if fill is None else fill,
                                                     dtype=v.dtype)]) for v in values])

    cuts = padded([s.cuts for s in shards], count + 1)
    same = bool((cuts == cuts[0]).all())
    return Tables(cuts, padded([s.sequences for s in shards], count), padded([s.closed for s in shards], count, True),
                  same)


def zigzag_cuts(offsets, world: int, length: int) -> np.ndarray:
    """The local segments' boundaries in the zigzag layout: two chunks per sequence, the same on every rank."""
    chunks = 2 * world
    lengths = np.array([world * length]) if offsets is None else np.diff(offsets)
    uneven = lengths % chunks != 0
    if np.any(uneven):
        what = ("the sequence of W x this rank's steps" if offsets is None else "sequence lengths")
        raise ValueError(f"layout='zigzag' cuts every sequence into 2 * world_size = {chunks} equal chunks: "
                         f"{what} {lengths[uneven][:4].tolist()} are not multiples of it")
    cuts = np.concatenate([[0], np.cumsum(np.repeat(lengths // chunks, 2))]).astype(np.int64)
    if cuts[-1] != length:
        raise ValueError(f"layout='zigzag': this rank holds {length} steps, but its chunks of the sequences make "
                         f"{int(cuts[-1])}")
    return cuts
