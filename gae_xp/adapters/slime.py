"""slime's ``vanilla_gae`` and ``chunked_gae``, on the chunk scan.

Right-padded [B, T] rewards and values; the value after the last step is 0;
``returns = advantages + values``. ``chunk_size`` is handed to ``gae()``
(slime's chunk scan loops over chunks in Python; here the chunks are carried
by the same scan one level up, so any chunk size gives the same numbers).
"""

from __future__ import annotations

import gae_xp


def vanilla_gae(rewards, values, gamma, lambd):
    """(advantages, returns) of slime's serial loop."""
    return gae_xp.gae(rewards, values, gamma=gamma, lam=lambd)


def chunked_gae(rewards, values, gamma, lambd, chunk_size=128):
    """(advantages, returns) of slime's chunked GAE."""
    return gae_xp.gae(rewards, values, gamma=gamma, lam=lambd, chunk_size=chunk_size)
