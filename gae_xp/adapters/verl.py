"""verl's ``compute_gae_advantage_return``, on the chunk scan.

verl skips masked tokens: their rewards and values are ignored and no decay
is applied across a hole; a masked position receives the advantage of the
next valid token (0 in trailing padding); ``returns = advantages + values``
at every position; then the advantages are whitened with the mean and the
unbiased variance of the valid tokens, ``(A - mean) * rsqrt(var + 1e-8)``,
applied to every position. The mask is numeric (0/1) or bool.

One difference: verl mixes the mask in by multiplication, so a NaN in a
masked value or reward would reach the outputs; here masks act through
``where`` and NaN in masked slots changes nothing.
"""

from __future__ import annotations

from array_api_compat import array_namespace

import gae_xp


def compute_gae_advantage_return(token_level_rewards, values, response_mask, gamma, lam):
    """(advantages, returns) as verl computes them, for [B, T] arrays of any array-API library."""
    xp = array_namespace(response_mask)
    real = response_mask if xp.isdtype(response_mask.dtype, "bool") else response_mask != 0
    advantages, returns = gae_xp.gae(token_level_rewards, values, gamma=gamma, lam=lam, mask=real, fill_masked=True)
    return gae_xp.whiten(advantages, real, unbiased=True, eps=1e-8, masked_fill=None), returns
