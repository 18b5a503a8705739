"""Hardening, round three (issue 30): cases 1, 2, 4 and 5, numbered as in the issue.

1. offsets that nobody could read (traced, or given to the operator directly) reach no kernel unchecked;
2. forward-mode AD keeps its tangents on every route ``auto`` takes for torch;
4. a gradient to a coefficient alone (meta-gradients);
5. host offsets (a list, a NumPy array) under ``torch.compile(fullgraph=True)``.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import gae_xp
from gae_xp import _prepare, reference

torch = pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parents[1]
FUZZ = Path(__file__).with_name("offsets_fuzz.py")


def run_fuzz(*arguments: str, timeout: int) -> None:
    """tests/offsets_fuzz.py in a process of its own: a crash fails here, with the child's output."""
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    done = subprocess.run([sys.executable, "-W", "ignore", str(FUZZ), *arguments], capture_output=True, text=True,
                          timeout=timeout, env=env, cwd=ROOT)
    assert done.returncode == 0, f"exit status {done.returncode}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    assert done.stdout.split()[-2] == "ok" and int(done.stdout.split()[-1]) > 0


# --- 1. invalid offsets that nobody could read -----------------------------------------------------------------


def test_1_hostile_offsets_given_to_the_operators_directly():
    """torch.ops.gae_xp.gae and gae_backward on the CPU check their offsets themselves: a ValueError naming
    cu_seqlens, never a crash or uninitialised memory (this killed the process with SIGSEGV before)."""
    run_fuzz("24", "0", timeout=600)


@pytest.mark.slow
def test_1_fuzz_hostile_offsets_under_torch_compile():
    """Random and hostile offsets under torch.compile(fullgraph=True) on every CPU path: the operator's forward and
    backward, the generic path, lam that requires grad, critic_lam, the estimators."""
    run_fuzz("30", "1", "--compile", timeout=3600)  # about 9 compilations, then each case runs compiled


HOSTILE = [[2, 5, 10], [0, 3, 8], [0, 3, 1000], [0, 7, 3, 10], [0, -4, 10], [0, 1 << 40, 10], [-1, 10],
           [0, 0, 10, 10]]


@pytest.mark.parametrize("offsets", HOSTILE)
def test_1_guarded_offsets_are_safe_and_say_whether_they_were_valid(offsets):
    xp = _prepare.namespace_of({"x": np.zeros(1)})
    safe, valid = _prepare.guarded_offsets(xp, np.asarray(offsets, dtype=np.int64), 10)
    want = offsets[0] == 0 and offsets[-1] == 10 and all(a <= b for a, b in zip(offsets, offsets[1:]))
    assert bool(valid) == want
    assert safe[0] == 0 and safe[-1] == 10 and np.all(np.diff(safe) >= 0)
    assert safe.tolist() == (offsets if want else [0] + [10] * (len(offsets) - 1))


@pytest.mark.parametrize("offsets", [[2, 5, 10], [0, 3, 8], [0, 3, 1000], [0, 7, 3, 10]])
def test_1_traced_jax_offsets_give_nan(offsets):
    """Under jax.jit the offsets are tracers: checked on the device, the outputs NaN where they break the contract
    (valid ones exact)."""
    jax = pytest.importorskip("jax")
    jax.config.update("jax_enable_x64", True)
    jnp = jax.numpy
    rng = np.random.default_rng(0)
    r, v = rng.standard_normal(10), rng.standard_normal(10)
    solve = jax.jit(lambda r, v, cu: gae_xp.gae(r, v, cu_seqlens=cu))
    for advantages in solve(jnp.asarray(r), jnp.asarray(v), jnp.asarray(offsets)):
        assert np.all(np.isnan(np.asarray(advantages)))
    got = solve(jnp.asarray(r), jnp.asarray(v), jnp.asarray([0, 3, 10]))
    want = [np.concatenate(pair) for pair in zip(reference.gae_loop(r[:3], v[:3]), reference.gae_loop(r[3:], v[3:]))]
    for out, ref in zip(got, want):
        np.testing.assert_allclose(np.asarray(out), ref, rtol=1e-12)


# --- 2. forward-mode AD -----------------------------------------------------------------------------------------

ROUTES = {
    "plain": lambda r, v, case: gae_xp.gae(r, v),
    "dones and mask": lambda r, v, case: gae_xp.gae(r, v, terminated=case["terminated"], truncated=case["truncated"],
                                                    mask=case["mask"], truncated_bootstrap="next_step"),
    "packed cu_seqlens": lambda r, v, case: gae_xp.gae(r, v, cu_seqlens=case["cu_seqlens"]),
    "critic_lam": lambda r, v, case: gae_xp.gae(r, v, critic_lam=0.5),
    "vtrace": lambda r, v, case: gae_xp.vtrace(case["log_rhos"], r, v),
    "lambda_returns": lambda r, v, case: gae_xp.lambda_returns(r, v, cu_seqlens=case["cu_seqlens"]),
    "discounted_cumsum": lambda r, v, case: gae_xp.discounted_cumsum(r, 0.9),
}


def route_case(seed: int, length: int) -> dict:
    rng = np.random.default_rng(seed)
    cut = int(rng.integers(0, length + 1))
    return {"r": torch.from_numpy(rng.standard_normal((2, length))),
            "v": torch.from_numpy(rng.standard_normal((2, length))),
            "tr": torch.from_numpy(rng.standard_normal((2, length))),
            "tv": torch.from_numpy(rng.standard_normal((2, length))),
            "terminated": torch.from_numpy(rng.random((2, length)) < 0.2),
            "truncated": torch.from_numpy(rng.random((2, length)) < 0.1),
            "mask": torch.from_numpy(rng.random((2, length)) < 0.8),
            "log_rhos": torch.from_numpy(rng.standard_normal((2, length)) * 0.3),
            "cu_seqlens": torch.tensor([0, cut, length])}


def outputs(route, r, v, case) -> tuple:
    out = ROUTES[route](r, v, case)
    return out if isinstance(out, tuple) else (out,)


def finite_difference(route, case, eps=1e-6):
    """The directional derivative along (tr, tv) by central differences (float64: the map is linear in r, v)."""
    plus = outputs(route, case["r"] + eps * case["tr"], case["v"] + eps * case["tv"], case)
    minus = outputs(route, case["r"] - eps * case["tr"], case["v"] - eps * case["tv"], case)
    return [(p - m) / (2 * eps) for p, m in zip(plus, minus)]


@pytest.mark.parametrize("route", ROUTES)
@given(seed=st.integers(0, 2 ** 16), length=st.integers(1, 40))
def test_2_forward_ad_keeps_the_tangent(route, seed, length):
    from torch.autograd import forward_ad

    case = route_case(seed, length)
    want = finite_difference(route, case)
    with forward_ad.dual_level():
        dual = outputs(route, forward_ad.make_dual(case["r"], case["tr"]), forward_ad.make_dual(case["v"], case["tv"]),
                       case)
        tangents = [forward_ad.unpack_dual(out).tangent for out in dual]
        primals = [forward_ad.unpack_dual(out).primal for out in dual]
    for tangent, primal, plain, fd in zip(tangents, primals, outputs(route, case["r"], case["v"], case), want):
        assert tangent is not None, f"{route}: the tangent was dropped"
        torch.testing.assert_close(tangent, fd, rtol=1e-6, atol=1e-6)
        torch.testing.assert_close(primal, plain, rtol=1e-12, atol=1e-12)
    _, jvp = torch.func.jvp(lambda r, v: outputs(route, r, v, case), (case["r"], case["v"]), (case["tr"], case["tv"]))
    for tangent, fd in zip(jvp, want):
        torch.testing.assert_close(tangent, fd, rtol=1e-6, atol=1e-6)


def test_2_the_numba_backend_refuses_dual_tensors():
    from torch.autograd import forward_ad

    with forward_ad.dual_level(), pytest.raises(ValueError, match="forward-mode"):
        gae_xp.gae(forward_ad.make_dual(torch.zeros(3), torch.ones(3)), torch.zeros(3), backend="numba")


# --- 4. a gradient to a coefficient alone ------------------------------------------------------------------------


def coefficient_alone():
    rng = np.random.default_rng(4)
    r, v = torch.from_numpy(rng.standard_normal((2, 37))), torch.from_numpy(rng.standard_normal((2, 37)))
    turn_ids = torch.arange(37).repeat(2, 1) // 5
    return r, v, turn_ids, {
        "lam": lambda c: gae_xp.gae(r, v, lam=c),
        "critic_lam": lambda c: gae_xp.gae(r, v, critic_lam=c)[1],
        "discounted_cumsum's discount": lambda c: gae_xp.discounted_cumsum(r, c),
        "turn_gae's lam": lambda c: gae_xp.turn_gae(r, v, turn_ids, lam=c),
    }


@pytest.mark.parametrize("name", list(coefficient_alone()[3]))
def test_4_gradient_to_a_coefficient_alone(name):
    """Rewards and values need no gradient, the coefficient does (meta-gradient RL): the backward raised "modified
    by an inplace operation" before."""
    r, _, _, functions = coefficient_alone()
    coefficient = torch.full(r.shape, 0.9, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(functions[name], (coefficient,))


# --- 5. host offsets under torch.compile(fullgraph=True) ------------------------------------------------------------


def compiled_gae_with(cu_seqlens):
    rng = np.random.default_rng(5)
    r, v = torch.from_numpy(rng.standard_normal(10)), torch.from_numpy(rng.standard_normal(10))
    got = torch.compile(lambda r, v, cu: gae_xp.gae(r, v, cu_seqlens=cu), fullgraph=True)(r, v, cu_seqlens)
    want = [np.concatenate(pair) for pair in zip(reference.gae_loop(r[:3].numpy(), v[:3].numpy()),
                                                 reference.gae_loop(r[3:].numpy(), v[3:].numpy()))]
    for out, ref in zip(got, want):
        np.testing.assert_allclose(out.numpy(), ref, rtol=1e-12)


def test_5_host_offsets_as_a_list_under_fullgraph():
    """The README's own form ("Unsupported ndarray attribute access" in check_offsets before)."""
    compiled_gae_with([0, 3, 10])


@pytest.mark.slow
def test_5_host_offsets_as_a_numpy_array_under_fullgraph():
    compiled_gae_with(np.array([0, 3, 10]))


@pytest.mark.slow
@pytest.mark.parametrize("host", [[0, 3, 11], np.array([0, 11, 10])])
def test_5_invalid_host_offsets_under_fullgraph_name_cu_seqlens(host):
    r = torch.zeros(10)
    with pytest.raises(ValueError, match="cu_seqlens"):
        torch.compile(lambda r, cu: gae_xp.gae(r, r, cu_seqlens=cu), fullgraph=True)(r, host)
