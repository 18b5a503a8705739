"""``Context``: a context-parallel layout, built once and passed to every call that uses it."""

from __future__ import annotations

from . import _layouts
from ._exchange import AxisExchange, TorchExchange, digest


class Context:
    """Where every rank's steps lie, built once (per batch of packed sequences) and passed to each call.

    Parameters
    ----------
    group : torch.distributed.ProcessGroup, optional
        The ranks that share the sequences (default: the world). Building a
        Context asks the group for its size and this rank's place (no
        collective).
    layout : {"contiguous", "zigzag"}
        ``"contiguous"``: rank k holds the k-th of W pieces of the time axis.
        ``"zigzag"``: Megatron's load-balanced layout: every sequence is cut
        into 2W equal chunks and rank k holds chunks k and 2W-1-k.
    cu_seqlens : array or list of int, optional
        Packed sequences: the *global* offsets ``0 = o_0 <= ... <= o_n = N``,
        the same on every rank (a repeated offset is an empty sequence). A
        list, a tuple or a NumPy array is used as it is; a device tensor is
        read to the host once, here, never in a call.
    axis_name : hashable, optional
        JAX instead of torch.distributed: the ``jax.shard_map`` axis the
        sequence is sharded over; the Context is then used inside the mapped
        function.

    Notes
    -----
    The host arithmetic of the layout (each rank's local cuts, which
    sequences it holds, which of its pieces end a sequence) is done here,
    vectorised over the offsets, once per world size. Errors in
    ``cu_seqlens`` are not raised here but by the first call that uses the
    Context, on every rank at once (the call's one collective carries them),
    so that a rank whose offsets are wrong cannot leave the others waiting
    in the collective; with ``axis_name`` they are raised here.

    Examples
    --------
    On every rank of a ``torch.distributed`` group::

        context = gae_xp.distributed.Context(layout="zigzag", cu_seqlens=[0, 4096, 12288])
        advantages, returns = gae_xp.distributed.gae(rewards, values, context=context, gamma=1.0, lam=0.95)
    """

    def __init__(self, group=None, layout: str = "contiguous", cu_seqlens=None, *, axis_name=None):
        if layout not in _layouts.LAYOUTS:
            raise ValueError(f"layout must be one of {', '.join(map(repr, _layouts.LAYOUTS))}, got {layout!r}")
        if group is not None and axis_name is not None:
            raise TypeError("pass group (torch.distributed) or axis_name (a jax.shard_map axis), not both")
        self.layout, self.group, self.axis_name = layout, group, axis_name
        self.offsets = None
        self._error = None
        if cu_seqlens is not None:
            try:
                self.offsets = _layouts.host_offsets(cu_seqlens)
            except (TypeError, ValueError) as error:
                if axis_name is not None:
                    raise
                self._error = error
        self.digest = digest(layout, b"" if self.offsets is None else self.offsets.tobytes())
        self._exchange = TorchExchange(group) if axis_name is None else None
        self._cache: dict = {}

    @property
    def packed(self) -> bool:
        """True for packed sequences (``cu_seqlens`` given)."""
        return self.offsets is not None or self._error is not None

    @property
    def sequences(self) -> int:
        """The number of sequences (1 without ``cu_seqlens``)."""
        return 1 if self.offsets is None else self.offsets.shape[0] - 1

    def exchange(self):
        """The collectives for this call: the group's (torch), or the mapped axis's (JAX, inside the trace)."""
        return self._exchange if self.axis_name is None else AxisExchange(self.axis_name)

    def check(self, world: int, length: int) -> None:
        """Raise what was wrong with ``cu_seqlens``, or a total that does not fit W shards of ``length`` steps."""
        if self._error is not None:
            raise self._error
        _layouts.check_total(self.offsets, world, length)

    def shard(self, world: int, rank: int, length: int) -> _layouts.Shard:
        """This rank's local segments in the contiguous layout."""
        return self._cached(("shard", world, rank, length),
                            lambda: _layouts.contiguous(self.offsets, world, rank, length))

    def tables(self, world: int, length: int) -> _layouts.Tables:
        """Every rank's local segments in the contiguous layout, padded and stacked (a traced rank picks its row)."""
        return self._cached(("tables", world, length),
                            lambda: _layouts.contiguous_tables(self.offsets, world, length))

    def zigzag_cuts(self, world: int, length: int):
        """The local segments' boundaries in the zigzag layout (the same on every rank)."""
        return self._cached(("zigzag", world, length), lambda: _layouts.zigzag_cuts(self.offsets, world, length))

    def _cached(self, key, build):
        if key not in self._cache:
            if self.offsets is None:  # without offsets the layout depends on the shard's length only: cheap
                return build()
            self._cache[key] = build()
        return self._cache[key]

    def __repr__(self) -> str:
        where = f"axis_name={self.axis_name!r}" if self.axis_name is not None else f"group={self.group!r}"
        return f"Context({where}, layout={self.layout!r}, sequences={self.sequences})"
