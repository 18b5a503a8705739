"""OpenRLHF's ``get_advantages_and_returns`` (openrlhf/trainer/ppo_utils/experience_maker.py), on the chunk scan.

OpenRLHF multiplies values and rewards by ``action_mask`` (any numeric or
bool mask; None for none), then runs the plain loop over time with value 0
after the end: a hole is a zero-reward, zero-value step that still decays
(unlike verl, which skips it). ``returns = advantages + values`` with the
masked values. Values come first in the signature. Lists of 1-D tensors
(packed samples) are handled one sample at a time with the same
``action_mask``, and lists come back. Runs under ``torch.no_grad()`` for
torch tensors, as OpenRLHF does.

Deliberate differences from OpenRLHF: results equal up to rounding (a tree of
sums, not a chain); gamma and lambd must lie in [0, 1] (ValueError).
"""

from __future__ import annotations

import gae_xp
from gae_xp._compat import array_namespace
from gae_xp.adapters._util import no_grad


def get_advantages_and_returns(values, rewards, action_mask, gamma, lambd):
    """(advantages, returns) as OpenRLHF computes them, for [B, T] arrays or lists of [T_i] arrays."""
    if isinstance(values, list):
        pairs = [get_advantages_and_returns(_unsqueeze(v), _unsqueeze(r), action_mask, gamma, lambd)
                 for v, r in zip(values, rewards)]
        return [a[0, ...] for a, _ in pairs], [r[0, ...] for _, r in pairs]
    with no_grad(values):
        if action_mask is not None:
            xp = array_namespace(values, rewards, action_mask)
            if not xp.isdtype(action_mask.dtype, "real floating"):
                action_mask = xp.astype(action_mask, values.dtype)
            values = action_mask * values
            rewards = action_mask * rewards
        return gae_xp.gae(rewards, values, gamma=gamma, lam=lambd)


def _unsqueeze(a):
    return array_namespace(a).expand_dims(a, axis=0)
