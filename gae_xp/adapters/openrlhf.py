"""OpenRLHF's ``get_advantages_and_returns``, on the chunk scan.

OpenRLHF multiplies values and rewards by the action mask, then runs the
plain loop with value 0 after the end: a hole is a zero-reward, zero-value
step that still decays (unlike verl, which skips it). ``returns =
advantages + values`` with the masked values. Note the argument order:
values first.
"""

from __future__ import annotations

import gae_xp


def get_advantages_and_returns(values, rewards, action_mask, gamma, lambd):
    """(advantages, returns) as OpenRLHF computes them, for [B, T] arrays."""
    if action_mask is not None:
        values = values * action_mask
        rewards = rewards * action_mask
    return gae_xp.gae(rewards, values, gamma=gamma, lam=lambd)
