"""``gae_xp.adapters.cleanrl`` against CleanRL's GAE loop and ``norm_adv``, restated.

Source (vwxyzjn/cleanrl): cleanrl/ppo.py and cleanrl/ppo_continuous_action.py, the block after the rollout
("bootstrap value if not done", the same loop in both files; restated in frameworks.cleanrl_gae) and the
minibatch normalisation (frameworks.cleanrl_normalize). CleanRL has no tests of these lines, so the cases here are
its conventions: time-major arrays, dones stored one step late, ``next_value`` as (1, num_envs), T = 1, several
env axes, float32 and float64; and the two silent mistakes the adapter exists to prevent.
"""

from __future__ import annotations

import numpy as np
import pytest
from helpers import xp_assert_close
from hypothesis import given
from hypothesis import strategies as st

import gae_xp
from conformance.frameworks import cleanrl_gae, cleanrl_normalize
from gae_xp.adapters import cleanrl
from gae_xp.adapters._util import ShapeError


def _rollout(rng, num_steps, envs, dtype=np.float64, done_rate=0.1, flat_next_value=False):
    """CleanRL's storage after a rollout: rewards, values, dones (float 0/1, stored before each step)."""
    shape = (num_steps, *envs)
    rewards = rng.standard_normal(shape).astype(dtype)
    values = rng.standard_normal(shape).astype(dtype)
    dones = (rng.random(shape) < done_rate).astype(dtype)
    next_value = rng.standard_normal(envs if flat_next_value else (1, *envs)).astype(dtype)
    next_done = (rng.random(envs) < done_rate).astype(dtype)
    return rewards, values, dones, next_value, next_done


@pytest.mark.parametrize("num_steps,envs", [(128, (4,)), (1, (4,)), (1, (1,)), (37, (1,)), (16, (3, 2)), (0, (4,)),
                                            (0, (3, 2))])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("flat_next_value", [False, True], ids=["next_value(1,N)", "next_value(N)"])
def test_against_cleanrl_loop(library, num_steps, envs, dtype, flat_next_value):
    rng = np.random.default_rng(num_steps)
    rollout = _rollout(rng, num_steps, envs, dtype, done_rate=0.2, flat_next_value=flat_next_value)
    want_adv, want_ret = cleanrl_gae(*rollout, 0.99, 0.95)
    got_adv, got_ret = cleanrl.compute_gae(*(library.asarray(a) for a in rollout), 0.99, 0.95)
    expect = library.asarray(np.zeros((), dtype))
    xp_assert_close(got_adv, want_adv, like=expect)
    xp_assert_close(got_ret, want_ret, like=expect)


def test_float64_equals_the_loop_to_rounding():
    """The issue's claim: float64, torch, CleanRL's default shape (128 steps, 4 envs), within 1e-15 relative."""
    torch = pytest.importorskip("torch")
    rollout = _rollout(np.random.default_rng(1), 128, (4,), done_rate=0.05)
    want_adv, want_ret = cleanrl_gae(*rollout, 0.99, 0.95)
    got_adv, got_ret = cleanrl.compute_gae(*(torch.from_numpy(a) for a in rollout), 0.99, 0.95)
    np.testing.assert_allclose(got_adv.numpy(), want_adv, rtol=0, atol=1e-15 * np.abs(want_adv).max() * 16)
    np.testing.assert_allclose(got_ret.numpy(), want_ret, rtol=0, atol=1e-15 * np.abs(want_ret).max() * 16)


@given(num_steps=st.integers(1, 40), envs=st.integers(1, 5), gamma=st.floats(0, 1), lam=st.floats(0, 1),
       done_rate=st.sampled_from([0.0, 0.1, 0.5, 1.0]), seed=st.integers(0, 2**16))
def test_property(num_steps, envs, gamma, lam, done_rate, seed):
    rollout = _rollout(np.random.default_rng(seed), num_steps, (envs,), done_rate=done_rate)
    for got, want in zip(cleanrl.compute_gae(*rollout, gamma, lam), cleanrl_gae(*rollout, gamma, lam)):
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)


def test_the_two_silent_mistakes():
    """What the adapter prevents: CleanRL's dones passed as gae's terminated (one step early), or time-major
    arrays scanned along the env axis (gae's default axis=-1). Both run without an error and give other numbers."""
    rollout = _rollout(np.random.default_rng(0), 128, (4,), done_rate=0.05)
    rewards, values, dones, next_value, next_done = rollout
    want, _ = cleanrl_gae(*rollout, 0.99, 0.95)
    got, _ = cleanrl.compute_gae(*rollout, 0.99, 0.95)
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)
    shifted, _ = gae_xp.gae(rewards, values, terminated=dones != 0, bootstrap_value=next_value[0], axis=0)
    assert np.abs(shifted - want).max() > 0.1
    step_done = np.concatenate([dones[1:], next_done[None]]) != 0
    wrong_axis, _ = gae_xp.gae(rewards, values, terminated=step_done)
    assert np.abs(wrong_axis - want).max() > 0.1


def test_nan_after_a_done_step_does_not_leak():
    """Deliberate difference: CleanRL multiplies V after a done step by 0 (NaN * 0 = NaN); the adapter cuts."""
    rewards, values, dones, next_value, next_done = _rollout(np.random.default_rng(4), 20, (3,), done_rate=0.0)
    dones[10] = 1.0  # step 9 ended its episode: obs[10] starts a new one
    want, _ = cleanrl_gae(rewards, values, dones, next_value, next_done, 0.99, 0.95)
    poisoned = values.copy()
    poisoned[10:] = np.nan
    got, _ = cleanrl.compute_gae(rewards, poisoned, dones, next_value, next_done, 0.99, 0.95)
    np.testing.assert_allclose(got[:10], want[:10], rtol=1e-12, atol=1e-12)
    assert np.isnan(cleanrl_gae(rewards, poisoned, dones, next_value, next_done, 0.99, 0.95)[0][:10]).all()


@pytest.mark.parametrize("size", [2, 64, 512])
def test_normalize_as_norm_adv(library, size):
    """``(x - mean) / (std + 1e-8)``: the 1e-8 joins the std, not the variance (no whiten eps gives it)."""
    x = np.random.default_rng(size).normal(3.0, 2.0, size)
    xp_assert_close(cleanrl.normalize_advantages(library.asarray(x)), cleanrl_normalize(x),
                    like=library.asarray(np.zeros(())))
    constant = np.full(8, 2.5)  # std 0: CleanRL divides 0 by 1e-8
    np.testing.assert_array_equal(library.to_numpy(cleanrl.normalize_advantages(library.asarray(constant))), 0.0)


def test_normalize_matches_torch():
    torch = pytest.importorskip("torch")
    x = torch.randn(128, dtype=torch.float32)
    torch.testing.assert_close(cleanrl.normalize_advantages(x), (x - x.mean()) / (x.std() + 1e-8), rtol=0, atol=1e-6)


@pytest.mark.parametrize("kwargs", [{"values": np.zeros((5, 3))}, {"dones": np.zeros((4, 4))},
                                    {"next_done": np.zeros(4)}, {"next_value": np.zeros((2, 3))}],
                         ids=["values", "dones", "next_done", "next_value"])
def test_shapes_raise(kwargs):
    arrays = {"rewards": np.zeros((4, 3)), "values": np.zeros((4, 3)), "dones": np.zeros((4, 3)),
              "next_value": np.zeros((1, 3)), "next_done": np.zeros(3)}
    with pytest.raises(ShapeError):
        cleanrl.compute_gae(**{**arrays, **kwargs})
