"""What the group adapters share: a framework's group labels as dense ids, and verl's token broadcast."""

from __future__ import annotations

from typing import Any

import numpy as np

from gae_xp._compat import device_of, is_torch_array
from gae_xp.adapters._util import Array, float_dtype


class Groups:
    """A batch's groups from host labels: dense ids in the order groups first appear, and which rows are alone.

    Labels are compared as a dict compares keys (verl groups rows by ``index[i]`` in a dict of lists), so any
    hashable labels work: uid strings in an object array, ints, NumPy strings. Integer arrays take NumPy's
    ``unique`` instead of the Python loop.
    """

    def __init__(self, ids: np.ndarray, counts: np.ndarray):
        self.ids, self.counts = ids, counts

    @classmethod
    def of(cls, index: Any, size: int, name: str = "index") -> "Groups":
        labels = np.asarray(index) if not isinstance(index, np.ndarray) else index
        if labels.ndim != 1 or labels.shape[0] != size:
            raise ValueError(f"{name} must hold one group label per row ({size},), got shape {labels.shape}")
        if labels.dtype.kind in "iub":
            _, ids, counts = np.unique(labels, return_inverse=True, return_counts=True)
            return cls(ids.reshape(-1).astype(np.int64, copy=False), counts)
        table: dict = {}
        ids = np.fromiter((table.setdefault(label, len(table)) for label in labels.tolist()), dtype=np.int64,
                          count=size)
        return cls(ids, np.bincount(ids, minlength=len(table)))

    def ids_like(self, xp: Any, like: Array) -> Array | int:
        """``group_ids`` for ``gae_xp.group_advantages``: the int k when the rows come in consecutive groups of k
        (verl's rollout repeats each prompt's uid n times in a row: a reshape, no sort), else the dense ids as an
        int64 array of ``like``'s library, on its device."""
        size = self.ids.shape[0]
        groups = self.counts.shape[0]
        if size and size % groups == 0 and (self.counts == size // groups).all() and bool(
                (self.ids == np.arange(size) // (size // groups)).all()):
            return size // groups
        return xp.asarray(self.ids, device=device_of(like))

    def alone_like(self, xp: Any, like: Array) -> Array | None:
        """Per row, True where the row is its group's only member (None when no row is)."""
        alone = self.counts[self.ids] == 1
        return xp.asarray(alone, device=device_of(like)) if alone.any() else None


def rows_times_mask(xp: Any, scalars: Array, response_mask: Array) -> Array:
    """verl's ``scalars.unsqueeze(-1) * response_mask``: (B,) by (B, T), in torch's promoted floating dtype.

    Torch multiplies by an integer or bool mask without a cast (as verl does); other libraries get the mask cast
    to the result's floating dtype first (NumPy would widen float32 by an int64 mask).
    """
    dtype = float_dtype(xp, scalars, response_mask)
    rows = xp.astype(scalars, dtype, copy=False)[:, None]
    if is_torch_array(response_mask) or xp.isdtype(response_mask.dtype, "real floating"):
        return rows * response_mask
    return rows * xp.astype(response_mask, dtype)
