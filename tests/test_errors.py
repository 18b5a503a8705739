"""Every bad input raises ValueError or TypeError whose message names the argument: one table."""

from __future__ import annotations

import os

import numpy as np
import pytest
from conftest import load_target

import gae_xp

R = np.zeros((2, 10))
V = np.zeros((2, 10))


def _gae(**changes):
    arguments = {"rewards": R, "values": V, **changes}
    return lambda: gae_xp.gae(arguments.pop("rewards"), arguments.pop("values"), **arguments)


def _cumsum(*args, **kwargs):
    return lambda: gae_xp.discounted_cumsum(*args, **kwargs)


def _with_nan(shape, at):
    array = np.full(shape, 0.9)
    array[at] = np.nan
    return array


#: (what, call, error, the message names)
BAD_INPUTS = [
    ("values of another shape", _gae(values=np.zeros((2, 9))), ValueError, "values"),
    ("mask of another shape", _gae(mask=np.ones((2, 9), dtype=bool)), ValueError, "mask"),
    ("terminated of another shape", _gae(terminated=np.zeros((3, 10), dtype=bool)), ValueError, "terminated"),
    ("truncated of another shape", _gae(truncated=np.zeros(10, dtype=bool)), ValueError, "truncated"),
    ("next_values of another shape", _gae(next_values=np.zeros((2, 11))), ValueError, "next_values"),
    ("gamma not broadcastable", _gae(gamma=np.full((3,), 0.9)), ValueError, "gamma"),
    ("lam not broadcastable", _gae(lam=np.full((2, 3), 0.9)), ValueError, "lam"),
    ("bootstrap_value not broadcastable", _gae(bootstrap_value=np.zeros(3)), ValueError, "bootstrap_value"),
    *[(f"gamma {bad}", _gae(gamma=bad), ValueError, "gamma") for bad in (-0.1, 1.5, float("nan"))],
    *[(f"lam {bad}", _gae(lam=bad), ValueError, "lam") for bad in (-0.1, 1.5, float("nan"))],
    *[(f"gamma array holding {bad}", _gae(gamma=np.where(np.arange(10) == 3, bad, 0.9) + np.zeros((2, 10))),
       ValueError, "gamma") for bad in (-0.5, 2.0, np.nan)],
    ("gamma a string", _gae(gamma="0.99"), TypeError, "gamma"),
    *[(f"chunk_size {bad!r}", _gae(chunk_size=bad), TypeError, "chunk_size") for bad in (1.5, "8", True)],
    *[(f"chunk_size {bad}", _gae(chunk_size=bad), ValueError, "chunk_size") for bad in (0, -4)],
    ("an unknown backend", _gae(backend="fortran"), ValueError, "backend"),
    *[(f"axis {bad}", _gae(axis=bad), ValueError, "axis") for bad in (2, -3)],
    ("axis a float", _gae(axis=1.0), TypeError, "axis"),
    ("rewards without a time axis", _gae(rewards=np.ones(()), values=np.ones(())), ValueError, "rewards"),
    *[(f"mask of dtype {dtype.__name__}", _gae(mask=np.ones((2, 10), dtype=dtype)), TypeError, "mask")
      for dtype in (np.float32, np.int8, np.uint8)],
    ("rewards a list", _gae(rewards=[0.0, 1.0], values=V[0]), TypeError, "rewards"),
    ("values a number", _gae(values=0.0), TypeError, "values"),
    ("values missing (None)", _gae(values=None), TypeError, "values"),
    ("complex rewards", _gae(rewards=R + 0j), TypeError, "rewards"),
    ("bootstrap_value and next_values together", _gae(next_values=V, bootstrap_value=1.0), ValueError, "next_values"),
    ("terminated of strings", _gae(terminated=np.full((2, 10), "x")), TypeError, "terminated"),
    ("fill_masked not a bool", _gae(fill_masked="yes"), TypeError, "fill_masked"),
    ("rewards a masked array", _gae(rewards=np.ma.array(R, mask=R > 0)), TypeError, "rewards"),
    ("mask a masked array", _gae(mask=np.ma.array(np.ones((2, 10), bool))), TypeError, "mask"),
    ("discount NaN", _cumsum(R, float("nan")), ValueError, "discount"),
    ("discount above 1", _cumsum(R, 1.5), ValueError, "discount"),
    ("discount array holding NaN", _cumsum(R, _with_nan((2, 10), (1, 4))), ValueError, "discount"),
    ("discount not broadcastable", _cumsum(R, np.zeros(3)), ValueError, "discount"),
    ("initial not broadcastable", _cumsum(R, 0.5, initial=np.zeros(3)), ValueError, "initial"),
    ("reverse a string", _cumsum(R, 0.5, reverse="yes"), TypeError, "reverse"),
    ("axis out of range for x", _cumsum(R, 0.5, axis=5), ValueError, "axis"),
    ("x a list", _cumsum([1.0], 0.5), TypeError, "x must be an array"),
    ("discounted_returns gamma above 1", lambda: gae_xp.discounted_returns(R, gamma=1.5), ValueError, "gamma"),
    ("lambda_returns next_values of another shape", lambda: gae_xp.lambda_returns(R, np.zeros((2, 4))),
     ValueError, "next_values"),
    ("vtrace clip threshold 0", lambda: gae_xp.vtrace(R, R, R, clip_rho_threshold=0), ValueError,
     "clip_rho_threshold"),
    ("vtrace clip threshold a string", lambda: gae_xp.vtrace(R, R, R, clip_c_threshold="1"), TypeError,
     "clip_c_threshold"),
    ("vtrace log_rhos of another shape", lambda: gae_xp.vtrace(np.zeros(3), R, R), ValueError, "log_rhos"),
    ("whiten mask of complex numbers", lambda: gae_xp.whiten(R, R + 0j), TypeError, "mask"),
    ("whiten mask a list", lambda: gae_xp.whiten(R, [[True] * 10] * 2), TypeError, "mask"),
    ("whiten eps negative", lambda: gae_xp.whiten(R, eps=-1), ValueError, "eps"),
    ("whiten eps a string", lambda: gae_xp.whiten(R, eps="0"), TypeError, "eps"),
    ("whiten unbiased a string", lambda: gae_xp.whiten(R, unbiased="no"), TypeError, "unbiased"),
    ("whiten shift_mean a number", lambda: gae_xp.whiten(R, shift_mean=1), TypeError, "shift_mean"),
    ("whiten masked_fill a string", lambda: gae_xp.whiten(R, R > 0, masked_fill="a"), TypeError, "masked_fill"),
    ("whiten masked_fill an array", lambda: gae_xp.whiten(R, R > 0, masked_fill=np.array([1.0, 2.0])), TypeError,
     "masked_fill"),
    ("whiten mask of another shape names whiten's x, not rewards",
     lambda: gae_xp.whiten(R, np.ones((2, 9), bool)), ValueError, r"mask must have the shape of x \(2, 10\)"),
    *[(f"{flag} of dtype {dtype.__name__} (bool only: 0.5 would count as done)",
       _gae(**{flag: np.full((2, 10), 0.5 if dtype is np.float32 else 1, dtype=dtype)}), TypeError,
       f"{flag} must have dtype bool") for flag in ("terminated", "truncated") for dtype in (np.float32, np.int64)],
    *[(f"critic_lam {bad}", _gae(critic_lam=bad), ValueError, "critic_lam") for bad in (-0.1, 1.5, float("nan"))],
    ("critic_lam not broadcastable", _gae(critic_lam=np.full((3,), 0.9)), ValueError, "critic_lam"),
]


@pytest.mark.parametrize("call, error, name", [pytest.param(c, e, n, id=what) for what, c, e, n in BAD_INPUTS])
def test_bad_input_names_the_argument(call, error, name):
    with pytest.raises(error, match=name):
        call()


#: (what, call, the message says): a likely mistake, named with its fix.
LIKELY_MISTAKES = [
    ("values one step longer (V(s_T) last)", _gae(values=np.zeros((2, 11))),
     r"values has 11 steps along the time axis \(axis=1\), one more than rewards' 10: if its last entry is the value "
     r"after the last step, pass values=values\[\.\.\., :-1\] and bootstrap_value=values\[\.\.\., -1\]"),
    ("values one step longer, time first", _gae(rewards=R.T, values=np.zeros((11, 2)), axis=0),
     r"pass values=values\[:-1\] and bootstrap_value=values\[-1\]"),
    ("vtrace's values one step longer", lambda: gae_xp.vtrace(R, R, np.zeros((2, 11))),
     r"bootstrap_value=values\[\.\.\., -1\]"),
    ("episode lengths as cu_seqlens", _gae(cu_seqlens=[3, 3, 4]),
     r"cu_seqlens \[3, 3, 4\] looks like sequence lengths \(they sum to the time axis' 10\), not offsets: pass the "
     r"cumulative sum with a leading 0, e\.g\. np\.concatenate\(\[\[0\], np\.cumsum\(lengths\)\]\)"),
    ("episode lengths with an empty first one", _gae(cu_seqlens=np.array([0, 6, 4])), "looks like sequence lengths"),
    ("time-first data without axis=0", _gae(rewards=np.zeros((10, 2)), values=np.zeros((10, 2)),
                                             bootstrap_value=np.zeros(2)),
     r"bootstrap_value of shape \(2,\) does not broadcast to the batch shape \(10,\).*if time is axis 0 "
     r"\(time-first data, \[T, B\]\), pass axis=0"),
]


@pytest.mark.parametrize("call, message", [pytest.param(c, m, id=what) for what, c, m in LIKELY_MISTAKES])
def test_a_likely_mistake_is_named_with_its_fix(call, message):
    with pytest.raises(ValueError, match=message):
        call()


@pytest.mark.parametrize("call, name", [
    (lambda: gae_xp.gae([1.0, 2.0], np.zeros(2)), "rewards"),
    (lambda: gae_xp.gae(np.zeros(2), (0.0, 0.0)), "values"),
    (lambda: gae_xp.gae(np.zeros(2), np.zeros(2), mask=[True, False]), "mask"),
    (lambda: gae_xp.whiten([1.0, 2.0]), "x"),
])
def test_a_list_for_an_array_is_told_to_use_asarray(call, name):
    """Issue 44, 7: a list passed as rewards could be told to use np.asarray."""
    told = rf"^{name} must be an array .*, got a (list|tuple): pass np\.asarray\({name}\)"
    with pytest.raises(TypeError, match=told):
        call()


@pytest.mark.parametrize("call, plain", [
    (_gae(values=np.zeros((3, 10))), "values must have the shape of rewards"),  # a batch axis differs: no guess
    (_gae(values=np.zeros((2, 12))), "values must have the shape of rewards"),  # two steps longer
    (_gae(cu_seqlens=[0, 3, 9]), "cu_seqlens must end at the length of the time axis"),  # sums to 12, not 10
    (_gae(bootstrap_value=np.zeros(3)), "does not broadcast to the batch shape"),
], ids=["batch axis", "two steps", "offsets not lengths", "another bootstrap"])
def test_no_fix_is_guessed_where_the_mistake_is_another(call, plain):
    with pytest.raises(ValueError, match=plain) as raised:
        call()
    assert "pass" not in str(raised.value) or "axis=" not in str(raised.value)


def test_lengths_as_torch_cu_seqlens_get_the_torch_fix():
    torch = _torch()
    with pytest.raises(ValueError, match=r"torch\.nn\.functional\.pad\(lengths\.cumsum\(0\), \(1, 0\)\)"):
        gae_xp.gae(torch.zeros(2, 10), torch.zeros(2, 10), cu_seqlens=torch.tensor([4, 6]))


def _torch():
    load_target("torch:cpu/auto")
    import torch

    return torch


MIXED = [
    ("values of another library", lambda torch: _gae(values=torch.zeros(2, 10)), TypeError, "values"),
    ("a mask of another library", lambda torch: _gae(mask=torch.ones(2, 10, dtype=torch.bool)), TypeError, "mask"),
    ("numba forced on tensors that record history",
     lambda torch: lambda: gae_xp.gae(torch.zeros(2, 10, requires_grad=True), torch.zeros(2, 10), backend="numba"),
     ValueError, "numba"),
]


@pytest.mark.parametrize("make, error, name", [pytest.param(m, e, n, id=what) for what, m, e, n in MIXED])
def test_bad_torch_input_names_the_argument(make, error, name):
    with pytest.raises(error, match=name):
        make(_torch())()


def test_mixed_devices():
    target = load_target("torch:cuda/auto")
    import torch

    with pytest.raises(ValueError, match="values"):
        gae_xp.gae(torch.zeros(2, 10), torch.zeros(2, 10, device=target.library.device))


def test_mixed_devices_on_jax_cpu_devices():
    load_target("jax:cpu/auto")
    import jax

    cpus = jax.devices("cpu")
    if len(cpus) < 2:
        pytest.skip("one JAX CPU device (set XLA_FLAGS=--xla_force_host_platform_device_count=2 for two)")
    r = jax.device_put(jax.numpy.zeros((2, 10)), cpus[0])
    v = jax.device_put(jax.numpy.zeros((2, 10)), cpus[1])
    with pytest.raises(ValueError, match="values"):
        gae_xp.gae(r, v)


def test_forced_numba_cuda_refuses_host_arrays():
    if os.environ.get("NUMBA_ENABLE_CUDASIM") == "1":
        pytest.skip("under the CUDA simulator the kernels take NumPy arrays")
    with pytest.raises(ValueError, match="numba-cuda"):
        _gae(backend="numba-cuda")()
