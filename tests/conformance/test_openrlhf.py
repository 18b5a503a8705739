"""``gae_xp.adapters.openrlhf`` against OpenRLHF's ``get_advantages_and_returns``, restated.

Source (OpenRLHF/OpenRLHF): openrlhf/trainer/ppo_utils/experience_maker.py (the method of the experience maker;
restated in frameworks.openrlhf_gae). OpenRLHF's tests/ hold no test of this function, so the cases here are the
function's own branches: a 0/1, bool, fractional or absent action mask, and packed samples given as lists.
"""

from __future__ import annotations

import numpy as np
import pytest
from helpers import like, xp_assert_close

from conformance.frameworks import openrlhf_gae
from gae_xp.adapters import openrlhf


def _batch(rng, batch=3, length=300):
    values, rewards = rng.standard_normal((batch, length)), rng.standard_normal((batch, length))
    lengths = rng.integers(length // 2, length + 1, batch)
    mask = (np.arange(length) < lengths[:, None]) & (rng.random((batch, length)) > 0.15)
    return values, rewards, mask


@pytest.mark.parametrize("kind", ["float", "bool", "fractional", "none"])
@pytest.mark.parametrize("seed", range(2))
def test_against_openrlhf_loop(library, kind, seed):
    rng = np.random.default_rng(seed)
    values, rewards, mask = _batch(rng)
    given = {"float": mask.astype(np.float64), "bool": mask, "none": None,
             "fractional": mask * rng.choice([0.5, 1.0], size=mask.shape)}[kind]
    want_adv, want_ret = openrlhf_gae(values, rewards, given, 0.99, 0.95)
    got_adv, got_ret = openrlhf.get_advantages_and_returns(
        library.asarray(values), library.asarray(rewards), None if given is None else library.asarray(given),
        0.99, 0.95)
    xp_assert_close(got_adv, want_adv, like=like(library))
    xp_assert_close(got_ret, want_ret, like=like(library))


def test_packed_samples_as_lists(library):
    """OpenRLHF's packing branch: lists of 1-D tensors, each computed on its own, lists back."""
    rng = np.random.default_rng(4)
    lengths = [5, 17, 1]
    values = [rng.standard_normal(n) for n in lengths]
    rewards = [rng.standard_normal(n) for n in lengths]
    got_adv, got_ret = openrlhf.get_advantages_and_returns([library.asarray(v) for v in values],
                                                           [library.asarray(r) for r in rewards], None, 0.9, 0.8)
    assert isinstance(got_adv, list) and isinstance(got_ret, list) and len(got_adv) == len(lengths)
    for v, r, a, g in zip(values, rewards, got_adv, got_ret):
        want_adv, want_ret = openrlhf_gae(v[None], r[None], None, 0.9, 0.8)
        xp_assert_close(a, want_adv[0], like=like(library))
        xp_assert_close(g, want_ret[0], like=like(library))


def test_torch_no_grad_as_openrlhf():
    torch = pytest.importorskip("torch")
    values = torch.randn(2, 6, dtype=torch.float64, requires_grad=True)
    advantages, returns = openrlhf.get_advantages_and_returns(values, torch.randn(2, 6, dtype=torch.float64),
                                                              torch.ones(2, 6, dtype=torch.bool), 0.99, 0.95)
    assert not advantages.requires_grad and not returns.requires_grad
