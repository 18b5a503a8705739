"""Output dtypes, low precision, gradients (torch, JAX) and jax.jit."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import load_target
from helpers import converted, expected, make_case, to_numpy, xp_assert_close

import gae_xp
from gae_xp import reference


@pytest.mark.parametrize("time_varying", [False, True])
def test_float32(library, backend, time_varying):
    case = make_case(np.random.default_rng(0), (4, 3000), dones=0.01 if time_varying else 0.0,
                     holes=0.1 if time_varying else 0.0)
    arrays = converted(library, case, library.xp.float32)
    advantages, returns = gae_xp.gae(**arrays, backend=backend)
    want_a, want_r = expected(case)
    xp_assert_close(advantages, want_a, like=arrays["rewards"])
    xp_assert_close(returns, want_r, like=arrays["rewards"])


LOW_PRECISION = [("numpy", "float16"), ("torch:cpu", "float16"), ("torch:cpu", "bfloat16"), ("jax:cpu", "float16"),
                 ("jax:cpu", "bfloat16")]


@pytest.mark.parametrize("name, dtype", LOW_PRECISION)
def test_low_precision_is_computed_in_float32(name, dtype):
    library = load_target(f"{name}/auto").library
    case = make_case(np.random.default_rng(1), (2, 500), dones=0.02)
    arrays = converted(library, case, getattr(library.xp, dtype))
    advantages, returns = gae_xp.gae(**arrays)
    exact = {k: (to_numpy(v).astype(np.float64) if k in ("rewards", "values") else case[k]) for k, v in arrays.items()}
    want_a, want_r = expected(exact)
    xp_assert_close(advantages, want_a, like=arrays["rewards"])
    xp_assert_close(returns, want_r, like=arrays["rewards"])


@pytest.mark.parametrize("backend", ["auto", "xp", "numba"])
def test_numpy_bfloat16_is_computed_in_float32(backend):
    """ml_dtypes' bfloat16 NumPy arrays, in every estimator: computed in float32, returned as bfloat16."""
    ml_dtypes = pytest.importorskip("ml_dtypes")
    if backend == "numba":
        load_target("numpy/numba")
    bf16 = np.dtype(ml_dtypes.bfloat16)
    rng = np.random.default_rng(9)
    case = make_case(rng, (2, 300), dones=0.02, holes=0.1)
    narrow = {k: v.astype(bf16) if isinstance(v, np.ndarray) and v.dtype == np.float64 else v for k, v in case.items()}
    exact = {k: v.astype(np.float64) if isinstance(v, np.ndarray) and v.dtype == bf16 else v for k, v in narrow.items()}
    r, v, rr = narrow["rewards"], narrow["values"], exact["rewards"]
    flags = {k: case[k] for k in ("terminated", "truncated", "mask")}
    log_rhos = rng.normal(0, 0.3, r.shape).astype(bf16)
    nearby = {"truncated_bootstrap": "next_step"}
    checks = [
        (gae_xp.gae(**narrow, backend=backend), reference.gae_loop(**exact)),
        (gae_xp.gae(r, v, cu_seqlens=[0, 100, 300], backend=backend)[0],
         np.concatenate([reference.gae_loop(rr[:, s], exact["values"][:, s])[0] for s in (slice(0, 100),
                                                                                        slice(100, 300))], -1)),
        (gae_xp.discounted_cumsum(r, 0.9, backend=backend), reference.discounted_cumsum_loop(rr, 0.9)),
        (gae_xp.discounted_returns(r, **flags, backend=backend), reference.discounted_returns_loop(rr, **flags)),
        (gae_xp.lambda_returns(r, v, **flags, backend=backend),
         reference.lambda_returns_loop(rr, exact["values"], **flags)),
        (gae_xp.vtrace(log_rhos, r, v, **flags, **nearby, backend=backend),
         reference.vtrace_loop(log_rhos.astype(np.float64), rr, exact["values"], **flags, **nearby)),
        (gae_xp.whiten(r, case["mask"]), gae_xp.whiten(rr, case["mask"])),
        (gae_xp.turn_gae(r, v, np.repeat(np.arange(150), 2)[None].repeat(2, 0)),
         gae_xp.turn_gae(rr, exact["values"], np.repeat(np.arange(150), 2)[None].repeat(2, 0))),
    ]
    for got, want in checks:
        for out, exact_out in zip(got if isinstance(got, tuple) else (got,), want if isinstance(want, tuple) else
                                  (want,)):
            assert out.dtype == bf16
            xp_assert_close(out, exact_out, like=r)


def test_integer_rewards_give_the_default_float(library, backend):
    rewards = library.asarray(np.arange(12, dtype=np.int32).reshape(2, 6))
    values = library.asarray(np.zeros((2, 6), dtype=np.int32))
    advantages, _ = gae_xp.gae(rewards, values, backend=backend)
    default = library.xp.__array_namespace_info__().default_dtypes(device=library.device)["real floating"]
    want, _ = expected({"rewards": np.arange(12.0).reshape(2, 6), "values": np.zeros((2, 6))})
    xp_assert_close(advantages, want, like=rewards, dtype=default)


def test_mixed_float_dtypes_promote(library, backend):
    xp = library.xp
    rewards = xp.astype(library.asarray(np.ones((2, 5))), xp.float32)
    values = library.asarray(np.ones((2, 5)))
    advantages, returns = gae_xp.gae(rewards, values, backend=backend)
    assert advantages.dtype == xp.float64 and returns.dtype == xp.float64


@pytest.mark.parametrize("options", [{}, {"dones": 0.1, "holes": 0.2, "per_step_gamma": True}])
def test_torch_gradcheck(options):
    load_target("torch:cpu/auto")
    import torch

    case = make_case(np.random.default_rng(2), (2, 37), **options)
    flags = {k: torch.from_numpy(v) for k, v in case.items() if k in ("terminated", "truncated", "mask")}
    gamma = torch.from_numpy(case["gamma"]) if isinstance(case["gamma"], np.ndarray) else case["gamma"]
    rewards = torch.from_numpy(case["rewards"]).requires_grad_()
    values = torch.from_numpy(case["values"]).requires_grad_()

    def advantages_and_returns(r, v):
        return gae_xp.gae(r, v, gamma=gamma, lam=case["lam"], chunk_size=8, **flags,
                          truncated_bootstrap=case.get("truncated_bootstrap", "next_values"))

    assert torch.autograd.gradcheck(advantages_and_returns, (rewards, values))
    advantages, _ = advantages_and_returns(rewards, values)
    advantages.sum().backward()
    assert rewards.grad is not None and torch.isfinite(rewards.grad).all()


@pytest.mark.parametrize("options", [{}, {"dones": 0.1, "holes": 0.2}])
def test_jax_grad_and_jit_match_the_loop(options):
    library = load_target("jax:cpu/auto").library
    import jax

    case = make_case(np.random.default_rng(3), (2, 40), **options)
    arrays = converted(library, case)
    rest = {k: v for k, v in arrays.items() if k not in ("rewards", "values")}

    def ours(r, v):
        return library.xp.sum(gae_xp.gae(r, v, chunk_size=8, **rest)[0] ** 2)

    def loop(r, v):
        return library.xp.sum(reference.gae_loop(r, v, **rest)[0] ** 2)

    args = (arrays["rewards"], arrays["values"])
    for got, want in zip(jax.grad(ours, argnums=(0, 1))(*args), jax.grad(loop, argnums=(0, 1))(*args)):
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-9, atol=1e-9)
    jitted = jax.jit(lambda r, v: gae_xp.gae(r, v, chunk_size=8, **rest))
    want_a, want_r = expected(case)
    got_a, got_r = jitted(*args)
    xp_assert_close(got_a, want_a, like=args[0])
    xp_assert_close(got_r, want_r, like=args[0])
