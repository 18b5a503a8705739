"""Output dtypes, low precision, gradients (torch, JAX) and jax.jit."""

from __future__ import annotations

import numpy as np
import pytest

import gae_xp
from conftest import load_namespace
from helpers import assert_close, expected, make_case, to_namespace


@pytest.mark.parametrize("time_varying", [False, True])
def test_float32(xp, time_varying):
    case = make_case(np.random.default_rng(0), (4, 3000), dones=0.01 if time_varying else 0.0,
                     holes=0.1 if time_varying else 0.0)
    advantages, returns = xp.gae(**to_namespace(xp, case, "float32"))
    want_a, want_r = expected(case)
    assert_close(xp, advantages, want_a, "float32")
    assert_close(xp, returns, want_r, "float32")


LOW_PRECISION = [("numpy", "float16"), ("torch", "float16"), ("torch", "bfloat16"), ("jax", "float16"),
                 ("jax", "bfloat16")]


@pytest.mark.parametrize("library, dtype", LOW_PRECISION)
def test_low_precision_is_computed_in_float32(library, dtype):
    ns = load_namespace(library)
    case = make_case(np.random.default_rng(1), (2, 500), dones=0.02)
    converted = to_namespace(ns, case, ns.xp.float16 if dtype == "float16" else _bfloat16(library))
    advantages, returns = ns.gae(**converted)
    exact = {k: (ns.to_numpy(ns.xp.astype(v, ns.xp.float64)) if k in ("rewards", "values") else case[k])
             for k, v in converted.items()}
    want_a, want_r = expected(exact)
    assert_close(ns, advantages, want_a, dtype)
    assert_close(ns, returns, want_r, dtype)


def _bfloat16(library):
    if library == "torch":
        import torch

        return torch.bfloat16
    import jax.numpy as jnp

    return jnp.bfloat16


def test_integer_rewards_give_the_default_float(xp):
    rewards = xp.asarray(np.arange(12, dtype=np.int32).reshape(2, 6))
    values = xp.asarray(np.zeros((2, 6), dtype=np.int32))
    advantages, _ = xp.gae(rewards, values)
    default = xp.xp.__array_namespace_info__().default_dtypes()["real floating"]
    assert advantages.dtype == default
    want, _ = expected({"rewards": np.arange(12.0).reshape(2, 6), "values": np.zeros((2, 6))})
    np.testing.assert_allclose(xp.to_numpy(advantages), want, rtol=1e-6)


def test_mixed_float_dtypes_promote(xp):
    rewards = xp.xp.astype(xp.asarray(np.ones((2, 5))), xp.xp.float32)
    values = xp.asarray(np.ones((2, 5)))
    advantages, returns = xp.gae(rewards, values)
    assert advantages.dtype == xp.xp.float64 and returns.dtype == xp.xp.float64


@pytest.mark.parametrize("options", [{}, {"dones": 0.1, "holes": 0.2, "per_step_gamma": True}])
def test_torch_gradcheck(options):
    load_namespace("torch")
    import torch

    case = make_case(np.random.default_rng(2), (2, 37), **options)
    flags = {k: torch.from_numpy(v) for k, v in case.items() if k in ("terminated", "truncated", "mask")}
    gamma = torch.from_numpy(case["gamma"]) if isinstance(case["gamma"], np.ndarray) else case["gamma"]
    rewards = torch.from_numpy(case["rewards"]).requires_grad_()
    values = torch.from_numpy(case["values"]).requires_grad_()

    def advantages_and_returns(r, v):
        return gae_xp.gae(r, v, gamma=gamma, lam=case["lam"], chunk_size=8, **flags)

    assert torch.autograd.gradcheck(advantages_and_returns, (rewards, values))
    advantages, _ = advantages_and_returns(rewards, values)
    advantages.sum().backward()
    assert rewards.grad is not None and torch.isfinite(rewards.grad).all()


@pytest.mark.parametrize("options", [{}, {"dones": 0.1, "holes": 0.2}])
def test_jax_grad_and_jit_match_the_loop(options):
    ns = load_namespace("jax")
    import jax

    from gae_xp import reference

    case = make_case(np.random.default_rng(3), (2, 40), **options)
    converted = to_namespace(ns, case)
    rest = {k: v for k, v in converted.items() if k not in ("rewards", "values")}

    def ours(r, v):
        return ns.xp.sum(gae_xp.gae(r, v, chunk_size=8, **rest)[0] ** 2)

    def loop(r, v):
        return ns.xp.sum(reference.gae_loop(r, v, **rest)[0] ** 2)

    args = (converted["rewards"], converted["values"])
    for got, want in zip(jax.grad(ours, argnums=(0, 1))(*args), jax.grad(loop, argnums=(0, 1))(*args)):
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-9, atol=1e-9)
    jitted = jax.jit(lambda r, v: gae_xp.gae(r, v, chunk_size=8, **rest))
    want_a, want_r = expected(case)
    got_a, got_r = jitted(*args)
    assert_close(ns, got_a, want_a)
    assert_close(ns, got_r, want_r)
