"""slime's ``vanilla_gae``, ``chunked_gae`` and ``chunked_discounted_returns`` (slime/utils/ppo_utils.py), on
the chunk scan.

Right-padded [B, T] rewards and values, time on the last axis; the value
after the last step is 0; ``returns = advantages + values``;
``chunked_discounted_returns`` is ``G_t = r_t + discount G_{t+1}``, ``G_T = 0``.
``chunk_size`` is handed to the scan (slime's chunk scan loops over the
chunks in Python; here they are carried by the same scan one level up).

Deliberate differences from slime:

* any chunk size gives the serial loop's numbers, to float32 rounding no
  worse than the loop's own (slime's chunk scan drifts with the chunk size).
* float16/bfloat16 are computed in float32 and cast back (slime computes in
  the input dtype).
* gamma, lambd and discount must lie in [0, 1] (ValueError); a chunk size
  that is not a positive int raises ValueError/TypeError.
* inputs that are not 2-D raise ``ShapeError``, both a ValueError (as
  vanilla_gae's unpacking) and an AssertionError (as chunked_gae's assert).
"""

from __future__ import annotations

import gae_xp
from gae_xp.adapters._util import ShapeError


def vanilla_gae(rewards, values, gamma, lambd):
    """(advantages, returns) of slime's serial loop."""
    _two_dimensional(rewards, values)
    return gae_xp.gae(rewards, values, gamma=gamma, lam=lambd)


def chunked_gae(rewards, values, gamma, lambd, chunk_size=128):
    """(advantages, returns) of slime's chunked GAE."""
    _two_dimensional(rewards, values)
    return gae_xp.gae(rewards, values, gamma=gamma, lam=lambd, chunk_size=chunk_size)


def chunked_discounted_returns(rewards, discount, chunk_size=128):
    """[B, T] discounted returns, as slime's chunked_discounted_returns (REINFORCE++)."""
    _two_dimensional(rewards)
    return gae_xp.discounted_returns(rewards, gamma=discount, chunk_size=chunk_size)


def _two_dimensional(*arrays):
    for a in arrays:
        if a.ndim != 2:
            raise ShapeError(f"slime takes [B, T] arrays, got shape {tuple(a.shape)}")
    if len(arrays) == 2 and tuple(arrays[0].shape) != tuple(arrays[1].shape):
        raise ShapeError(f"rewards {tuple(arrays[0].shape)} and values {tuple(arrays[1].shape)} differ in shape")
