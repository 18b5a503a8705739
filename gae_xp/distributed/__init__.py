r"""Context parallelism: GAE and whitening on sequences whose time axis is split across ranks.

Each rank passes its own shard of the time axis and gets back its shard of
the outputs, equal to the single-process function on the whole sequence.
The sequence never crosses between ranks: every rank summarises its pieces
in five numbers per row (``gae_xp._pieces``), **one all-gather** exchanges
the summaries, every rank solves the small chains over all pieces (the
scan skeleton's step 2, ``_scan.scan`` over the pieces' axis) and solves
its own pieces again with what enters them from the right (step 3).

* ``Context(group, layout, cu_seqlens)``: the layout, built once
  (``"contiguous"``, or Megatron's ``"zigzag"``; packed sequences with
  their global offsets), over a ``torch.distributed`` group or, with
  ``axis_name``, a ``jax.shard_map`` axis;
* ``gae(rewards, values, context=..., **gae_options)``: ``gae_xp.gae``'s
  arguments, forwarded;
* ``whiten(x, mask, group=...)``: ``gae_xp.whiten`` with the mean and
  variance of every rank's entries, from one all-gather of 64 bytes per rank;
* ``group_advantages(scores, group_ids, group=...)``: ``gae_xp.group_advantages``
  on a batch split over data-parallel ranks (groups may span ranks).

Every collective carries a header (``_exchange``): a rank whose arguments
are wrong, or ranks that disagree on the batch shape, the dtype or the
Context, raise on every rank at once, never a hang or numbers built from
half-received summaries. torch is imported when a Context over
``torch.distributed`` is built, jax when one over an axis is used.
"""

from ._context import Context
from ._exchange import all_gather_flat
from ._gae import gae
from ._groups import group_advantages
from ._layouts import LAYOUTS
from ._whiten import whiten

__all__ = ["LAYOUTS", "Context", "all_gather_flat", "gae", "group_advantages", "whiten"]
