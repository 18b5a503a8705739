"""AReaL's own GAE test, restated against ``gae_xp.adapters.areal``, and the adapter against AReaL's loops.

Sources (areal-project/AReaL): tests/cpp_extensions/test_cugae.py::test_gae1d_nolp_misalign (AReaL's CUDA kernel
against its Python loop on packed sequences: max_seqlen 32, 128, 512; bs 2, 4; gamma 0.9, 1.0; lam 0.5, 1.0;
lengths randint(1, max_seqlen); float32; every sequence bootstrapped; atol 1e-5), with gae_xp in the kernel's place
and the Python loop ``pygae1d_nolp_misalign`` (realhf/impl/model/utils/ppo_functional.py, restated in
frameworks.areal_pygae1d_nolp_misalign) as the reference; and the padded block of ``PPOActor._compute_advantages``
(areal/trainer/ppo/gae.py::_compute_token_level_gae, restated in frameworks.areal_token_level_gae). AReaL has no
test of the padded block; the cases here are its branches: 0/1, bool and fractional loss masks, rows with and
without EOS, a lambda per row, T = 1.
"""

from __future__ import annotations

import numpy as np
import pytest
from helpers import like, xp_assert_close
from hypothesis import given
from hypothesis import strategies as st

from conformance.frameworks import areal_pygae1d_nolp_misalign, areal_token_level_gae
from gae_xp.adapters import areal
from gae_xp.adapters._util import ShapeError


def _packed(rng, lengths, dtype=np.float64, float_flags=False):
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    total, count = int(offsets[-1]), len(lengths)
    rewards = rng.standard_normal(total).astype(dtype)
    values = rng.standard_normal(total + count).astype(dtype)
    bootstrap = rng.random(count) < 0.5
    return rewards, values, offsets, bootstrap.astype(np.float32) if float_flags else bootstrap


@pytest.mark.parametrize("max_seqlen", [32, 128, 512])
@pytest.mark.parametrize("bs", [2, 4])
@pytest.mark.parametrize("gamma", [0.9, 1.0])
@pytest.mark.parametrize("lam", [0.5, 1.0])
def test_gae1d_nolp_misalign(max_seqlen, bs, gamma, lam):
    """AReaL's test_cugae: the adapter in the CUDA kernel's place, AReaL's Python loop as the reference."""
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    seqlens = torch.randint(1, max_seqlen, (bs,), dtype=torch.int32)
    rewards = torch.randn(int(seqlens.sum()), dtype=torch.float32)
    values = torch.randn(int(seqlens.sum()) + bs, dtype=torch.float32)
    bootstrap = torch.ones(bs, dtype=torch.bool)
    cu_seqlens = torch.nn.functional.pad(seqlens.cumsum(0), (1, 0)).int()

    adv, ret = areal.cugae1d_nolp_misalign_func(rewards, values, cu_seqlens, bootstrap, gamma, lam)
    py_adv, py_ret = (torch.from_numpy(x) for x in areal_pygae1d_nolp_misalign(
        rewards.numpy(), values.numpy(), cu_seqlens.numpy(), bootstrap.numpy(), gamma, lam))

    assert adv.dtype == ret.dtype == torch.float32
    assert torch.allclose(adv, py_adv, atol=1e-5), (adv - py_adv).abs().max()
    assert torch.allclose(ret, py_ret, atol=1e-5), (ret - py_ret).abs().max()


@pytest.mark.parametrize("lengths", [[5, 17, 1, 40], [1], [1, 1, 1], [64], [3, 0, 7], [0, 4, 0, 0, 2], [0], []],
                         ids=lambda lengths: "-".join(map(str, lengths)) or "none")
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("float_flags", [False, True], ids=["bool-flags", "float-flags"])
def test_packed_against_areal_loop(library, lengths, dtype, float_flags):
    """Random packed cases, length-1 and empty sequences (a repeated offset) included, bool or 0/1 float flags."""
    rng = np.random.default_rng(len(lengths))
    rewards, values, offsets, bootstrap = _packed(rng, lengths, dtype, float_flags)
    want_adv, want_ret = areal_pygae1d_nolp_misalign(rewards, values, offsets, bootstrap, 0.99, 0.95)
    got_adv, got_ret = areal.pygae1d_nolp_misalign(library.asarray(rewards), library.asarray(values),
                                                   library.asarray(offsets), library.asarray(bootstrap), 0.99, 0.95)
    expect = library.asarray(np.zeros((), dtype))
    xp_assert_close(got_adv, want_adv, like=expect)
    xp_assert_close(got_ret, want_ret, like=expect)


@given(lengths=st.lists(st.integers(0, 12), max_size=6), gamma=st.floats(0, 1), lam=st.floats(0, 1),
       seed=st.integers(0, 2**16))
def test_packed_property(lengths, gamma, lam, seed):
    """Any lengths (0 included), gamma and lam: the adapter equals AReaL's loop in float64."""
    rewards, values, offsets, bootstrap = _packed(np.random.default_rng(seed), lengths)
    want = areal_pygae1d_nolp_misalign(rewards, values, offsets, bootstrap, gamma, lam)
    got = areal.pygae1d_nolp_misalign(rewards, values, offsets, bootstrap, gamma, lam)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-12, atol=1e-12)


def test_packed_leaves_values_alone_and_nan_not_bootstrapped_does_not_leak():
    """Deliberate differences: AReaL's loop multiplies the extra slot in place (NaN * 0 = NaN); the adapter
    selects, as AReaL's CUDA kernel does, and writes nothing."""
    rng = np.random.default_rng(3)
    rewards, values, offsets, _ = _packed(rng, [4, 6])
    bootstrap = np.array([False, True])
    want_adv, want_ret = areal_pygae1d_nolp_misalign(rewards, values, offsets, bootstrap, 0.9, 0.8)
    poisoned = values.copy()
    poisoned[offsets[1]] = np.nan  # sequence 0's extra slot, not bootstrapped
    before = poisoned.copy()
    got_adv, got_ret = areal.pygae1d_nolp_misalign(rewards, poisoned, offsets, bootstrap, 0.9, 0.8)
    np.testing.assert_array_equal(poisoned, before)
    np.testing.assert_allclose(got_adv, want_adv, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(got_ret, want_ret, rtol=1e-12, atol=1e-12)
    assert np.isnan(areal_pygae1d_nolp_misalign(rewards, poisoned, offsets, bootstrap, 0.9, 0.8)[0][:4]).all()


@pytest.mark.parametrize("values_length,flags,message", [(9, 2, "one extra slot per sequence"),
                                                         (10, 3, "one flag per sequence")])
def test_packed_shapes_raise_as_areal_asserts(values_length, flags, message):
    rewards, offsets = np.zeros(8), np.array([0, 3, 8], dtype=np.int32)
    for kind in (ValueError, AssertionError):
        with pytest.raises(kind, match=message):
            areal.pygae1d_nolp_misalign(rewards, np.zeros(values_length), offsets, np.ones(flags, bool), 0.9, 0.9)


def _padded(rng, batch, length, dtype=np.float64, kind="float"):
    rewards = rng.standard_normal((batch, length)).astype(dtype)
    values = rng.standard_normal((batch, length)).astype(dtype)
    real = rng.random((batch, length)) > 0.3
    mask = {"float": real.astype(np.float32), "bool": real,
            "fractional": real * rng.choice([0.5, 1.0], size=real.shape).astype(np.float32)}[kind]
    no_eos = rng.random(batch) < 0.5
    return rewards, values, mask, no_eos


@pytest.mark.parametrize("shape", [(3, 40), (1, 1), (4, 1), (2, 2), (5, 129)])
@pytest.mark.parametrize("kind", ["float", "bool", "fractional"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_padded_against_areal_loop(library, shape, kind, dtype):
    rewards, values, mask, no_eos = _padded(np.random.default_rng(shape[1]), *shape, dtype=dtype, kind=kind)
    want_adv, want_ret = areal_token_level_gae(rewards, values, mask.astype(np.float32), no_eos, 0.99, 0.95)
    got_adv, got_ret = areal.compute_token_level_gae(library.asarray(rewards), library.asarray(values),
                                                     library.asarray(mask), library.asarray(no_eos), 0.99, 0.95)
    expect = library.asarray(np.zeros((), dtype))
    xp_assert_close(got_adv, want_adv, like=expect)
    xp_assert_close(got_ret, want_ret, like=expect)


def test_padded_lambda_per_row(library):
    """AReaL's custom lambda functions give one float32 lambda per row."""
    rng = np.random.default_rng(5)
    rewards, values, mask, no_eos = _padded(rng, 4, 30)
    lam = rng.uniform(0.0, 1.0, 4).astype(np.float32)
    want_adv, want_ret = areal_token_level_gae(rewards, values, mask, no_eos, 0.9, lam)
    got_adv, got_ret = areal.compute_token_level_gae(library.asarray(rewards), library.asarray(values),
                                                     library.asarray(mask), library.asarray(no_eos), 0.9,
                                                     library.asarray(lam))
    # AReaL rounds discount * lambda to float32 (its lambda tensor is float32); the adapter keeps float64.
    xp_assert_close(got_adv, want_adv, like=like(library), scale=1e5)
    xp_assert_close(got_ret, want_ret, like=like(library), scale=1e5)


def test_padded_last_position_and_bootstrap():
    """The last column is never a step (advantage 0, return = its value); it bootstraps rows without EOS."""
    rewards = np.array([[1.0, 2.0, 3.0], [1.0, 2.0, 3.0]])
    values = np.array([[0.5, 0.25, 4.0], [0.5, 0.25, 4.0]])
    mask = np.ones((2, 3), dtype=np.float32)
    advantages, returns = areal.compute_token_level_gae(rewards, values, mask, np.array([True, False]), 0.5, 1.0)
    np.testing.assert_array_equal(advantages[:, -1], [0.0, 0.0])
    np.testing.assert_array_equal(returns[:, -1], [4.0, 4.0])
    delta_1 = 2.0 + 0.5 * np.array([4.0, 0.0]) - 0.25
    np.testing.assert_allclose(advantages[:, 1], delta_1)
    np.testing.assert_allclose(advantages[:, 0], 1.0 + 0.5 * 0.25 - 0.5 + 0.5 * delta_1)


def test_padded_nan_in_masked_slots_does_not_leak():
    """Deliberate difference: AReaL multiplies masked values (and the last column of an EOS row) by 0."""
    rng = np.random.default_rng(9)
    rewards, values, mask, no_eos = _padded(rng, 3, 25)
    want_adv, want_ret = areal_token_level_gae(rewards, values, mask, no_eos, 0.99, 0.95)
    poisoned = np.where(mask == 0, np.nan, values)
    poisoned[:, -1] = np.where(no_eos, values[:, -1], np.inf)  # the last column: read only as a bootstrap
    got_adv, got_ret = areal.compute_token_level_gae(rewards, poisoned, mask, no_eos, 0.99, 0.95)
    np.testing.assert_allclose(got_adv, want_adv, rtol=1e-12, atol=1e-12)
    real = (mask != 0) & (np.arange(25) < 24)
    np.testing.assert_allclose(got_ret[real], want_ret[real], rtol=1e-12, atol=1e-12)


def test_padded_float32_results_from_half_inputs():
    """AReaL's float32 accumulator makes bfloat16/float16 inputs give float32 results; the adapter too."""
    torch = pytest.importorskip("torch")
    rewards, values, mask, no_eos = _padded(np.random.default_rng(2), 2, 12)
    got_adv, got_ret = areal.compute_token_level_gae(torch.tensor(rewards, dtype=torch.bfloat16),
                                                     torch.tensor(values, dtype=torch.bfloat16),
                                                     torch.tensor(mask), torch.tensor(no_eos), 0.99, 0.95)
    assert got_adv.dtype == got_ret.dtype == torch.float32


@pytest.mark.parametrize("call", [lambda: areal.compute_token_level_gae(np.zeros((2, 3)), np.zeros((2, 4)),
                                                                        np.ones((2, 3)), np.ones(2, bool), 1.0, 1.0),
                                  lambda: areal.compute_token_level_gae(np.zeros((2, 3)), np.zeros((2, 3)),
                                                                        np.ones((2, 3)), np.ones(3, bool), 1.0, 1.0),
                                  lambda: areal.compute_token_level_gae(np.zeros((2, 0)), np.zeros((2, 0)),
                                                                        np.ones((2, 0)), np.ones(2, bool), 1.0, 1.0),
                                  lambda: areal.compute_token_level_gae(np.zeros((2, 3)), np.zeros((2, 3)),
                                                                        np.ones((2, 3)), np.ones(2, bool), 1.0,
                                                                        np.ones(3))],
                         ids=["values", "seq_no_eos_mask", "max_seqlen 0", "gae_lambda"])
def test_padded_shapes_raise(call):
    with pytest.raises(ShapeError):
        call()
