"""``gae_xp.adapters.openrlhf`` against OpenRLHF's ``get_advantages_and_returns``, restated.

Source (OpenRLHF/OpenRLHF): openrlhf/trainer/ppo_utils/experience_maker.py (the method of the experience maker;
restated in frameworks.openrlhf_gae), and the advantage normalisation at the end of its
``compute_advantages_and_returns`` (restated in frameworks.openrlhf_normalize). OpenRLHF's tests/ hold no test of
either, so the cases here are their own branches: a 0/1, bool, fractional or absent action mask, packed samples
given as lists; experiences of different shapes normalised together, ``no_std_norm``, the variance clamp.
"""

from __future__ import annotations

import numpy as np
import pytest
from helpers import like, xp_assert_close

from conformance.frameworks import openrlhf_gae, openrlhf_normalize
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


def _experiences(rng, shapes, scale=1.0):
    advantages = [rng.normal(0.5, scale, shape) for shape in shapes]
    masks = [rng.random(shape) > 0.25 for shape in shapes]
    return advantages, masks


@pytest.mark.parametrize("no_std_norm", [False, True])
@pytest.mark.parametrize("mask_kind", ["bool", "float"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_normalize_against_openrlhf(library, no_std_norm, mask_kind, dtype):
    """Experiences of different shapes normalised together over their real tokens, every position shifted."""
    advantages, masks = _experiences(np.random.default_rng(6), [(4, 30), (2, 57), (1, 1)], scale=3.0)
    advantages = [a.astype(dtype) for a in advantages]
    masks = [m if mask_kind == "bool" else m.astype(np.float32) for m in masks]
    want = openrlhf_normalize(advantages, masks, no_std_norm)
    got = openrlhf.normalize_advantages([library.asarray(a) for a in advantages], [library.asarray(m) for m in masks],
                                        no_std_norm=no_std_norm)
    assert isinstance(got, list) and len(got) == len(want)
    for g, w in zip(got, want):
        xp_assert_close(g, w, like=library.asarray(np.zeros((), dtype)))
    one = openrlhf.normalize_advantages(library.asarray(advantages[0]), library.asarray(masks[0]), no_std_norm)
    xp_assert_close(one, openrlhf_normalize(advantages[:1], masks[:1], no_std_norm)[0],
                    like=library.asarray(np.zeros((), dtype)))


def test_normalize_clamps_the_variance():
    """A variance below 1e-8 is clamped to it (not offset by it, as gae_xp.whiten's eps would)."""
    rng = np.random.default_rng(8)
    advantages = [1.0 + 1e-6 * rng.standard_normal((3, 20))]
    masks = [np.ones((3, 20), bool)]
    got = openrlhf.normalize_advantages(advantages, masks)[0]
    np.testing.assert_allclose(got, openrlhf_normalize(advantages, masks)[0], rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(got, (advantages[0] - advantages[0].mean()) * 1e4, rtol=1e-9, atol=1e-12)


def test_normalize_masked_nan_does_not_leak():
    """Deliberate difference: OpenRLHF multiplies a masked NaN by 0 and every advantage becomes NaN."""
    advantages, masks = _experiences(np.random.default_rng(10), [(3, 12)])
    want = openrlhf_normalize(advantages, masks)[0]
    poisoned = np.where(masks[0], advantages[0], np.nan)
    got = openrlhf.normalize_advantages([poisoned], masks)[0]
    np.testing.assert_allclose(got[masks[0]], want[masks[0]], rtol=1e-12, atol=1e-12)


def test_normalize_keeps_half_dtypes_and_checks_pairs():
    torch = pytest.importorskip("torch")
    advantages = torch.randn(3, 9, dtype=torch.bfloat16)
    out = openrlhf.normalize_advantages(advantages, torch.ones(3, 9, dtype=torch.bool))
    assert out.dtype == torch.bfloat16 and out.data_ptr() != advantages.data_ptr()
    with pytest.raises(ValueError, match="pair up"):
        openrlhf.normalize_advantages([advantages], [torch.ones(3, 8, dtype=torch.bool)])
