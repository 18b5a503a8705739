"""Each adapter against its framework's per-step loop (restated in gae_xp.bench.baselines from the framework's description),
on random cases with holes, padding and dones; and against torchrl itself where it is installed."""

from __future__ import annotations

import numpy as np
import pytest

from gae_xp.bench import baselines
from gae_xp.adapters import openrlhf, slime, torchrl, verl
from helpers import assert_close


def torchrl_vtrace_loop(gamma, log_pi, log_mu, value, next_value, reward, done, terminated, rho_thresh, c_thresh):
    rho = np.exp(log_pi - log_mu)
    clipped_rho, clipped_c = np.minimum(rho, rho_thresh), np.minimum(rho, c_thresh)
    deltas = clipped_rho * (reward + gamma * (1 - terminated) * next_value - value)
    corrections, following = np.zeros_like(reward), np.zeros_like(reward[..., 0, :])
    for t in reversed(range(reward.shape[-2])):
        following = deltas[..., t, :] + gamma * (1 - done[..., t, :]) * clipped_c[..., t, :] * following
        corrections[..., t, :] = following
    vs = corrections + value
    vs_next = np.concatenate([vs[..., 1:, :], next_value[..., -1:, :]], axis=-2)
    vs_next = np.where(done != 0, next_value, vs_next)
    return clipped_rho * (reward + gamma * (1 - terminated) * vs_next - value), vs


def _llm_batch(rng, batch=3, length=300):
    rewards, values = rng.standard_normal((batch, length)), rng.standard_normal((batch, length))
    lengths = rng.integers(length // 2, length + 1, batch)
    mask = (np.arange(length) < lengths[:, None]) & (rng.random((batch, length)) > 0.15)
    return rewards, values, mask.astype(np.float64)


@pytest.mark.parametrize("seed", range(3))
def test_verl(xp, seed):
    rewards, values, mask = _llm_batch(np.random.default_rng(seed))
    want_a, want_r = baselines.verl_gae_loop(rewards, values, mask, 0.99, 0.95)
    got_a, got_r = verl.compute_gae_advantage_return(xp.asarray(rewards), xp.asarray(values), xp.asarray(mask),
                                                      0.99, 0.95)
    assert_close(xp, got_a, want_a)
    assert_close(xp, got_r, want_r)


@pytest.mark.parametrize("chunk", [64, 128, 256])
def test_slime(xp, chunk):
    rewards, values, _ = _llm_batch(np.random.default_rng(chunk))
    want = baselines.slime_serial_gae(rewards, values, 0.99, 0.95)
    for got in (slime.vanilla_gae(xp.asarray(rewards), xp.asarray(values), 0.99, 0.95),
                slime.chunked_gae(xp.asarray(rewards), xp.asarray(values), 0.99, 0.95, chunk_size=chunk)):
        assert_close(xp, got[0], want[0])
        assert_close(xp, got[1], want[1])


@pytest.mark.parametrize("seed", range(3))
def test_openrlhf(xp, seed):
    rewards, values, mask = _llm_batch(np.random.default_rng(seed))
    want_a, want_r = baselines.openrlhf_gae_loop(values, rewards, mask, 0.99, 0.95)
    got_a, got_r = openrlhf.get_advantages_and_returns(xp.asarray(values), xp.asarray(rewards), xp.asarray(mask),
                                                        0.99, 0.95)
    assert_close(xp, got_a, want_a)
    assert_close(xp, got_r, want_r)


def _torchrl_case(seed, shape=(2, 3, 150, 2)):
    rng = np.random.default_rng(seed)
    case = {name: rng.standard_normal(shape) for name in ("value", "next_value", "reward")}
    case["done"] = (rng.random(shape) < 0.05).astype(np.float64)
    case["terminated"] = case["done"] * (rng.random(shape) < 0.5)
    case["log_pi"], case["log_mu"] = rng.normal(0, 0.5, shape), rng.normal(0, 0.5, shape)
    return case


@pytest.mark.parametrize("seed", range(2))
def test_torchrl_gae(xp, seed):
    c = _torchrl_case(seed)
    want_a, want_t = baselines.torchrl_gae_loop(0.98, 0.9, c["value"], c["next_value"], c["reward"], c["done"],
                                              c["terminated"])
    args = [xp.asarray(c[k]) for k in ("value", "next_value", "reward")]
    got_a, got_t = torchrl.generalized_advantage_estimate(
        0.98, 0.9, *args, xp.asarray(c["done"] != 0), xp.asarray(c["terminated"] != 0))
    assert_close(xp, got_a, want_a)
    assert_close(xp, got_t, want_t)


@pytest.mark.parametrize("thresholds", [(1.0, 1.0), (0.8, 1.5)])
def test_torchrl_vtrace(xp, thresholds):
    c = _torchrl_case(7)
    want_a, want_vs = torchrl_vtrace_loop(0.98, c["log_pi"], c["log_mu"], c["value"], c["next_value"], c["reward"],
                                          c["done"], c["terminated"], *thresholds)
    got_a, got_vs = torchrl.vtrace_advantage_estimate(
        0.98, *(xp.asarray(c[k]) for k in ("log_pi", "log_mu", "value", "next_value", "reward")),
        xp.asarray(c["done"] != 0), xp.asarray(c["terminated"] != 0), *thresholds)
    assert_close(xp, got_a, want_a)
    assert_close(xp, got_vs, want_vs)


def test_against_torchrl_itself():
    torch = pytest.importorskip("torch")
    functional = pytest.importorskip("torchrl.objectives.value.functional")
    c = {k: torch.from_numpy(v) for k, v in _torchrl_case(3).items()}
    done, terminated = c["done"] != 0, c["terminated"] != 0
    want_a, want_t = functional.generalized_advantage_estimate(0.98, 0.9, c["value"], c["next_value"], c["reward"],
                                                               done, terminated)
    got_a, got_t = torchrl.generalized_advantage_estimate(0.98, 0.9, c["value"], c["next_value"], c["reward"],
                                                          done, terminated)
    # torchrl's vectorised GAE drops the filter's terms below 1e-7 of the first: close, not equal.
    torch.testing.assert_close(got_a, want_a, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got_t, want_t, rtol=1e-5, atol=1e-5)
    exact, _ = baselines.torchrl_gae_loop(0.98, 0.9, *(c[k].numpy() for k in ("value", "next_value", "reward", "done",
                                                                                 "terminated")))
    assert np.abs(got_a.numpy() - exact).max() <= np.abs(want_a.numpy() - exact).max()
    want_a, want_vs = functional.vtrace_advantage_estimate(0.98, c["log_pi"], c["log_mu"], c["value"],
                                                           c["next_value"], c["reward"], done, terminated)
    got_a, got_vs = torchrl.vtrace_advantage_estimate(0.98, c["log_pi"], c["log_mu"], c["value"], c["next_value"],
                                                      c["reward"], done, terminated)
    torch.testing.assert_close(got_a, want_a, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(got_vs, want_vs, rtol=1e-6, atol=1e-6)
