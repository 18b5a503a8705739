"""Every bad input raises ValueError or TypeError whose message names the argument."""

from __future__ import annotations

import os

import numpy as np
import pytest

import gae_xp
from conftest import load_namespace

R = np.zeros((2, 10))
V = np.zeros((2, 10))


def check(error, name, **kwargs):
    arguments = {"rewards": R, "values": V, **kwargs}
    with pytest.raises(error, match=name):
        gae_xp.gae(arguments.pop("rewards"), arguments.pop("values"), **arguments)


def test_values_shape_mismatch():
    check(ValueError, "values", values=np.zeros((2, 9)))


def test_mask_shape_mismatch():
    check(ValueError, "mask", mask=np.ones((2, 9), dtype=bool))


def test_terminated_shape_mismatch():
    check(ValueError, "terminated", terminated=np.zeros((3, 10), dtype=bool))


def test_truncated_shape_mismatch():
    check(ValueError, "truncated", truncated=np.zeros(10, dtype=bool))


def test_next_values_shape_mismatch():
    check(ValueError, "next_values", next_values=np.zeros((2, 11)))


def test_gamma_not_broadcastable():
    check(ValueError, "gamma", gamma=np.full((3,), 0.9))


def test_lam_not_broadcastable():
    check(ValueError, "lam", lam=np.full((2, 3), 0.9))


def test_bootstrap_not_broadcastable():
    check(ValueError, "bootstrap_value", bootstrap_value=np.zeros(3))


@pytest.mark.parametrize("bad", [-0.1, 1.5, float("nan")])
def test_gamma_outside_unit_interval(bad):
    check(ValueError, "gamma", gamma=bad)


@pytest.mark.parametrize("bad", [-0.1, 1.5, float("nan")])
def test_lam_outside_unit_interval(bad):
    check(ValueError, "lam", lam=bad)


@pytest.mark.parametrize("bad", [-0.5, 2.0, np.nan])
def test_gamma_array_outside_unit_interval(bad):
    gamma = np.full((2, 10), 0.9)
    gamma[1, 3] = bad
    check(ValueError, "gamma", gamma=gamma)


def test_gamma_of_wrong_type():
    check(TypeError, "gamma", gamma="0.99")


def test_mixed_array_libraries():
    torch = pytest.importorskip("torch")
    check(TypeError, "values", values=torch.zeros(2, 10))


def test_mixed_libraries_in_an_option():
    torch = pytest.importorskip("torch")
    check(TypeError, "mask", mask=torch.ones(2, 10, dtype=torch.bool))


def test_mixed_devices():
    ns = load_namespace("torch_cuda")
    import torch

    with pytest.raises(ValueError, match="values"):
        gae_xp.gae(torch.zeros(2, 10), torch.zeros(2, 10, device=ns.device))


def test_mixed_devices_on_jax_cpu_devices():
    jax = pytest.importorskip("jax")
    cpus = jax.devices("cpu")
    if len(cpus) < 2:
        pytest.skip("one JAX CPU device (set XLA_FLAGS=--xla_force_host_platform_device_count=2 for two)")
    r = jax.device_put(jax.numpy.zeros((2, 10)), cpus[0])
    v = jax.device_put(jax.numpy.zeros((2, 10)), cpus[1])
    with pytest.raises(ValueError, match="values"):
        gae_xp.gae(r, v)


@pytest.mark.parametrize("bad", [1.5, "8", True])
def test_chunk_size_not_an_int(bad):
    check(TypeError, "chunk_size", chunk_size=bad)


@pytest.mark.parametrize("bad", [0, -4])
def test_chunk_size_not_positive(bad):
    check(ValueError, "chunk_size", chunk_size=bad)


def test_unknown_backend():
    check(ValueError, "backend", backend="fortran")


@pytest.mark.parametrize("bad", [2, -3])
def test_axis_out_of_range(bad):
    check(ValueError, "axis", axis=bad)


def test_axis_not_an_int():
    check(TypeError, "axis", axis=1.0)


def test_rewards_without_a_time_axis():
    with pytest.raises(ValueError, match="rewards"):
        gae_xp.gae(np.ones(()), np.ones(()))


@pytest.mark.parametrize("dtype", [np.float32, np.int8, np.uint8])
def test_mask_of_a_non_bool_dtype(dtype):
    check(TypeError, "mask", mask=np.ones((2, 10), dtype=dtype))


def test_rewards_not_an_array():
    with pytest.raises(TypeError, match="rewards"):
        gae_xp.gae([0.0, 1.0], V[0])


def test_values_not_an_array():
    with pytest.raises(TypeError, match="values"):
        gae_xp.gae(R, 0.0)


def test_complex_rewards():
    check(TypeError, "rewards", rewards=R + 0j)


def test_bootstrap_and_next_values_together():
    check(ValueError, "next_values", next_values=V, bootstrap_value=1.0)


def test_terminated_of_a_string_dtype():
    check(TypeError, "terminated", terminated=np.full((2, 10), "x"))


def test_discounted_cumsum_errors():
    with pytest.raises(ValueError, match="discount"):
        gae_xp.discounted_cumsum(R, float("nan"))
    with pytest.raises(ValueError, match="discount"):
        gae_xp.discounted_cumsum(R, np.zeros(3))
    with pytest.raises(ValueError, match="initial"):
        gae_xp.discounted_cumsum(R, 0.5, initial=np.zeros(3))
    with pytest.raises(TypeError, match="reverse"):
        gae_xp.discounted_cumsum(R, 0.5, reverse="yes")
    with pytest.raises(ValueError, match="axis"):
        gae_xp.discounted_cumsum(R, 0.5, axis=5)
    with pytest.raises(TypeError, match="x must be an array"):
        gae_xp.discounted_cumsum([1.0], 0.5)


def test_forced_numba_cuda_refuses_host_arrays():
    if os.environ.get("NUMBA_ENABLE_CUDASIM") == "1":
        pytest.skip("under the CUDA simulator the kernels take NumPy arrays")
    check(ValueError, "numba-cuda", backend="numba-cuda")


def test_forced_numba_refuses_tensors_that_record_history():
    torch = pytest.importorskip("torch")
    with pytest.raises(ValueError, match="numba"):
        gae_xp.gae(torch.zeros(2, 10, requires_grad=True), torch.zeros(2, 10), backend="numba")
