"""torchrl's own value-estimator tests, restated against ``gae_xp.adapters.torchrl``, and the adapter against torchrl.

Source (pytorch/rl): test/objectives/test_values.py, class TestValues: test_gae, test_gae_param_as_tensor,
test_gae_multidim, test_vtrace, test_vtrace_multidim, test_successive_traj_gae, test_args_kwargs_timedim, with their
seeds, shapes and tolerances (rtol = atol = 1e-4). Where torchrl compares its vectorised estimator with its loop,
the adapter takes the vectorised estimator's place and torchrl's loop (torchrl.objectives.value.functional,
installed by the test extra) stays the reference. The adapter also runs on every namespace against the loops restated
in frameworks.py.
"""

from __future__ import annotations

import numpy as np
import pytest
from helpers import like, xp_assert_close

from conformance.frameworks import torchrl_gae, torchrl_vtrace
from gae_xp.adapters import torchrl as adapter

torch = pytest.importorskip("torch")
functional = pytest.importorskip("torchrl.objectives.value.functional")

close = {"rtol": 1e-4, "atol": 1e-4}


def _flags(shape, has_done):
    """torchrl's test setup: terminated ~ Bernoulli(0.1), done = another draw | terminated."""
    done = torch.zeros(*shape, dtype=torch.bool)
    terminated = done.clone()
    if has_done:
        terminated = terminated.bernoulli_(0.1)
        done = done.bernoulli_(0.1) | terminated
    return done, terminated


@pytest.mark.parametrize("gamma", [0.99, 0.5, 0.1])
@pytest.mark.parametrize("lmbda", [0.99, 0.5, 0.1])
@pytest.mark.parametrize("N", [(1,), (3,), (7, 3)])
@pytest.mark.parametrize("T", [200, 5, 3])
@pytest.mark.parametrize("dtype", [torch.float, torch.double])
@pytest.mark.parametrize("has_done", [False, True])
def test_gae(gamma, lmbda, N, T, dtype, has_done):
    torch.manual_seed(0)
    done, terminated = _flags((*N, T, 1), has_done)
    reward = torch.randn(*N, T, 1, dtype=dtype)
    state_value = torch.randn(*N, T, 1, dtype=dtype)
    next_state_value = torch.randn(*N, T, 1, dtype=dtype)
    r1 = adapter.generalized_advantage_estimate(gamma, lmbda, state_value, next_state_value, reward, done=done,
                                                terminated=terminated)
    r2 = functional.generalized_advantage_estimate(gamma, lmbda, state_value, next_state_value, reward, done=done,
                                                   terminated=terminated)
    torch.testing.assert_close(r1, r2, **close)


@pytest.mark.parametrize("N", [(1,), (8,), (7, 3)])
@pytest.mark.parametrize("dtype", [torch.float, torch.double])
@pytest.mark.parametrize("has_done", [True, False])
@pytest.mark.parametrize("gamma_tensor", ["scalar", "tensor", "tensor_single_element"])
@pytest.mark.parametrize("lmbda_tensor", ["scalar", "tensor", "tensor_single_element"])
def test_gae_param_as_tensor(N, dtype, has_done, gamma_tensor, lmbda_tensor):
    torch.manual_seed(0)
    gamma, lmbda, T = 0.95, 0.90, 200
    done, terminated = _flags((*N, T, 1), has_done)
    reward = torch.randn(*N, T, 1, dtype=dtype)
    state_value = torch.randn(*N, T, 1, dtype=dtype)
    next_state_value = torch.randn(*N, T, 1, dtype=dtype)
    gamma_vec = {"tensor": torch.full_like(reward, gamma), "tensor_single_element": torch.as_tensor([gamma])}.get(
        gamma_tensor, gamma)
    # torchrl's test picks lmbda's form from gamma_tensor in its second branch; restated as written.
    if lmbda_tensor == "tensor":
        lmbda_vec = torch.full_like(reward, lmbda)
    elif gamma_tensor == "tensor_single_element":
        lmbda_vec = torch.as_tensor([lmbda])
    else:
        lmbda_vec = lmbda
    r1 = adapter.generalized_advantage_estimate(gamma_vec, lmbda_vec, state_value, next_state_value, reward,
                                                done=done, terminated=terminated)
    r2 = functional.generalized_advantage_estimate(gamma, lmbda, state_value, next_state_value, reward, done=done,
                                                   terminated=terminated)
    torch.testing.assert_close(r1, r2, **close)


def _slices(tensors, D):
    """Every feature slice [..., i:i+1, j] (or [..., i:i+1]) of the tensors, with time back at -2."""
    if len(D) == 2:
        return [[t[..., i:i + 1, j] for t in tensors] for i in range(D[0]) for j in range(D[1])]
    return [[t[..., i:i + 1] for t in tensors] for i in range(D[0])]


def _join(pieces, D):
    joined = [torch.cat([p[k] for p in pieces], -1) for k in range(2)]
    return [j.unflatten(-1, D) for j in joined] if len(D) == 2 else joined


@pytest.mark.parametrize("gamma", [0.99, 0.5, 0.1])
@pytest.mark.parametrize("lmbda", [0.99, 0.5, 0.1])
@pytest.mark.parametrize("N", [(3,), (7, 3)])
@pytest.mark.parametrize("T", [100, 3])
@pytest.mark.parametrize("dtype", [torch.float, torch.double])
@pytest.mark.parametrize("feature_dim", [[5], [2, 5]])
@pytest.mark.parametrize("has_done", [True, False])
def test_gae_multidim(gamma, lmbda, N, T, dtype, has_done, feature_dim):
    D = feature_dim
    time_dim = -1 - len(D)
    torch.manual_seed(0)
    done, terminated = _flags((*N, T, *D), has_done)
    reward = torch.randn(*N, T, *D, dtype=dtype)
    state_value = torch.randn(*N, T, *D, dtype=dtype)
    next_state_value = torch.randn(*N, T, *D, dtype=dtype)
    args = (state_value, next_state_value, reward, done, terminated)
    r1 = adapter.generalized_advantage_estimate(gamma, lmbda, *args, time_dim=time_dim)
    r2 = functional.generalized_advantage_estimate(gamma, lmbda, *args, time_dim=time_dim)
    pieces = [adapter.generalized_advantage_estimate(gamma, lmbda, *piece, time_dim=-2) for piece in _slices(args, D)]
    torch.testing.assert_close(list(r1), _join(pieces, D), **close)
    torch.testing.assert_close(r1, r2, **close)


@pytest.mark.parametrize("gamma", [0.99, 0.5, 0.1])
@pytest.mark.parametrize("N", [(1,), (3,), (7, 3)])
@pytest.mark.parametrize("T", [200, 5, 3])
@pytest.mark.parametrize("dtype", [torch.float, torch.double])
@pytest.mark.parametrize("has_done", [False, True])
def test_vtrace(gamma, N, T, dtype, has_done):
    torch.manual_seed(0)
    done, terminated = _flags((*N, T, 1), has_done)
    reward = torch.randn(*N, T, 1, dtype=dtype)
    state_value = torch.randn(*N, T, 1, dtype=dtype)
    next_state_value = torch.randn(*N, T, 1, dtype=dtype)
    log_pi = torch.log(torch.rand(*N, T, 1, dtype=dtype))
    log_mu = torch.log(torch.rand(*N, T, 1, dtype=dtype))
    args = (gamma, log_pi, log_mu, state_value, next_state_value, reward)
    advantage, value_target = adapter.vtrace_advantage_estimate(*args, done=done, terminated=terminated)
    assert not torch.isnan(value_target).any()
    assert not torch.isinf(value_target).any()
    want = functional.vtrace_advantage_estimate(*args, done=done, terminated=terminated)
    torch.testing.assert_close((advantage, value_target), want, **close)


@pytest.mark.parametrize("gamma", [0.99, 0.5, 0.1])
@pytest.mark.parametrize("N", [(3,), (7, 3)])
@pytest.mark.parametrize("T", [100, 3])
@pytest.mark.parametrize("dtype", [torch.float, torch.double])
@pytest.mark.parametrize("feature_dim", [[5], [2, 5]])
@pytest.mark.parametrize("has_done", [True, False])
def test_vtrace_multidim(gamma, N, T, dtype, has_done, feature_dim):
    D = feature_dim
    time_dim = -1 - len(D)
    torch.manual_seed(0)
    done, terminated = _flags((*N, T, *D), has_done)
    reward = torch.randn(*N, T, *D, dtype=dtype)
    state_value = torch.randn(*N, T, *D, dtype=dtype)
    next_state_value = torch.randn(*N, T, *D, dtype=dtype)
    log_pi = torch.log(torch.rand(*N, T, *D, dtype=dtype))
    log_mu = torch.log(torch.rand(*N, T, *D, dtype=dtype))
    tensors = (log_pi, log_mu, state_value, next_state_value, reward, done, terminated)
    r1 = adapter.vtrace_advantage_estimate(gamma, *tensors[:5], done=done, terminated=terminated, time_dim=time_dim)
    pieces = [adapter.vtrace_advantage_estimate(gamma, *p[:5], done=p[5], terminated=p[6], time_dim=-2)
              for p in _slices(tensors, D)]
    torch.testing.assert_close(list(r1), _join(pieces, D), **close)
    want = functional.vtrace_advantage_estimate(gamma, *tensors[:5], done=done, terminated=terminated,
                                                time_dim=time_dim)
    torch.testing.assert_close(r1, want, **close)


@pytest.mark.parametrize("N", [(3,), (3, 7)])
@pytest.mark.parametrize("T", [3, 5, 200])
def test_successive_traj_gae(N, T):
    torch.manual_seed(0)
    lmbda = torch.rand([]).item()
    terminated = torch.zeros(*N, T, 1, dtype=torch.bool)
    terminated[..., T // 2 - 1, :] = 1
    done = terminated.clone()
    done[..., -1, :] = 1
    reward = torch.randn(*N, T, 1)
    state_value = torch.randn(*N, T, 1)
    next_state_value = torch.randn(*N, T, 1)
    gamma = 0.95
    tensors = (state_value, next_state_value, reward, done, terminated)
    v1 = adapter.generalized_advantage_estimate(gamma, lmbda, *tensors[:3], done=done, terminated=terminated)[0]
    halves = [adapter.generalized_advantage_estimate(gamma, lmbda, *(t[..., part, :] for t in tensors[:3]),
                                                     done=done[..., part, :], terminated=terminated[..., part, :])[0]
              for part in (slice(None, T // 2), slice(T // 2, None))]
    torch.testing.assert_close(v1, torch.cat(halves, -2), **close)
    want = functional.generalized_advantage_estimate(gamma, lmbda, *tensors[:3], done=done, terminated=terminated)[0]
    torch.testing.assert_close(v1, want, **close)


def test_args_kwargs_timedim():
    """torchrl's GAE takes time_dim by keyword only; -3 and 2 name the same axis of a 5-D input."""
    torch.manual_seed(0)
    lmbda, gamma, N, B, T = 0.95, 0.95, (2, 3), (4,), 20
    terminated = torch.zeros(*N, T, *B, 1, dtype=torch.bool)
    terminated[..., T // 2 - 1, :, :] = 1
    done = terminated.clone()
    done[..., -1, :, :] = 1
    reward = torch.randn(*N, T, *B, 1)
    state_value = torch.randn(*N, T, *B, 1)
    next_state_value = torch.randn(*N, T, *B, 1)
    args = (state_value, next_state_value, reward, done, terminated)
    v1 = adapter.generalized_advantage_estimate(gamma, lmbda, *args[:3], done=done, terminated=terminated,
                                                time_dim=-3)[0]
    v2 = adapter.generalized_advantage_estimate(gamma=gamma, lmbda=lmbda, state_value=state_value,
                                                next_state_value=next_state_value, reward=reward, done=done,
                                                terminated=terminated, time_dim=-3)[0]
    with pytest.raises(TypeError, match="positional argument"):
        adapter.generalized_advantage_estimate(gamma, lmbda, *args, -3)
    v3 = adapter.generalized_advantage_estimate(gamma, lmbda, *args, time_dim=-3)[0]
    v4 = adapter.generalized_advantage_estimate(gamma, lmbda, *args, time_dim=2)[0]
    for other in (v2, v3, v4):
        torch.testing.assert_close(v1, other)
    torch.testing.assert_close(v1, functional.generalized_advantage_estimate(gamma, lmbda, *args, time_dim=-3)[0],
                               **close)


# --- the cases and the adapter's own contract -------------------------------------------------------------

def test_terminated_outside_done_drops_only_the_bootstrap():
    """r=1, V=0, V'=1, gamma .5, lmbda 1, terminated (not done) at step 0: the trace continues (torchrl: 2.125)."""
    reward, state_value, next_state_value = torch.ones(1, 3, 1), torch.zeros(1, 3, 1), torch.ones(1, 3, 1)
    done = torch.zeros(1, 3, 1, dtype=torch.bool)
    terminated = done.clone()
    terminated[0, 0, 0] = True
    args = (0.5, 1.0, state_value, next_state_value, reward, done, terminated)
    advantage, _ = adapter.generalized_advantage_estimate(*args)
    assert advantage[0, 0, 0].item() == 2.125
    torch.testing.assert_close(advantage, functional.generalized_advantage_estimate(*args)[0])


def _case(rng, shape=(2, 3, 150, 2)):
    case = {name: rng.standard_normal(shape) for name in ("value", "next_value", "reward")}
    case["done"] = rng.random(shape) < 0.05
    case["terminated"] = rng.random(shape) < 0.05  # terminated also outside done
    case["log_pi"], case["log_mu"] = rng.normal(0, 0.5, shape), rng.normal(0, 0.5, shape)
    return case


@pytest.mark.parametrize("seed", range(2))
def test_gae_every_namespace(library, seed):
    c = _case(np.random.default_rng(seed))
    want = torchrl_gae(0.98, 0.9, c["value"], c["next_value"], c["reward"], c["done"], c["terminated"])
    got = adapter.generalized_advantage_estimate(0.98, 0.9, *(library.asarray(c[k]) for k in (
        "value", "next_value", "reward", "done", "terminated")))
    for g, w in zip(got, want):
        xp_assert_close(g, w, like=like(library))


@pytest.mark.parametrize("thresholds", ["floats", "above_one", "tensors"])
def test_vtrace_every_namespace(library, thresholds):
    rng = np.random.default_rng(7)
    c = _case(rng)
    rho_thresh, c_thresh = {"floats": (1.0, 1.0), "above_one": (0.8, 1.5),
                            "tensors": (rng.uniform(0.5, 2.0, c["value"].shape), rng.uniform(0.5, 2.0, (150, 1)))
                            }[thresholds]
    want = torchrl_vtrace(0.98, c["log_pi"], c["log_mu"], c["value"], c["next_value"], c["reward"], c["done"],
                          c["terminated"], rho_thresh, c_thresh)
    as_given = [library.asarray(t) if isinstance(t, np.ndarray) else t for t in (rho_thresh, c_thresh)]
    got = adapter.vtrace_advantage_estimate(0.98, *(library.asarray(c[k]) for k in (
        "log_pi", "log_mu", "value", "next_value", "reward", "done", "terminated")), *as_given)
    for g, w in zip(got, want):
        xp_assert_close(g, w, like=like(library))


def test_vtrace_tensor_thresholds_and_positional_time_dim_as_torchrl():
    """torchrl takes per-element threshold tensors and time_dim as the tenth positional argument."""
    c = {k: torch.from_numpy(v) for k, v in _case(np.random.default_rng(3), shape=(2, 40, 3, 2)).items()}
    rho_thresh = torch.rand(2, 40, 3, 2, dtype=torch.float64) + 0.5
    c_thresh = torch.rand(40, 1, 1, dtype=torch.float64) * 2
    # gamma 0.75 is exact in float32, the dtype torchrl gives gamma * not_done: then the two agree to float64 rounding.
    args = [0.75] + [c[k] for k in ("log_pi", "log_mu", "value", "next_value", "reward", "done", "terminated")]
    got = adapter.vtrace_advantage_estimate(*args, rho_thresh, c_thresh, -3)
    want = functional.vtrace_advantage_estimate(*args, rho_thresh, c_thresh, time_dim=-3)
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10)
    by_keyword = adapter.vtrace_advantage_estimate(*args, rho_thresh=rho_thresh, c_thresh=c_thresh, time_dim=-3)
    torch.testing.assert_close(got, by_keyword, rtol=0, atol=0)


def test_against_torchrl_itself():
    """Random cases with terminated outside done: the loop to rounding, the vectorised GAE within its 1e-7 filter."""
    c = {k: torch.from_numpy(v) for k, v in _case(np.random.default_rng(3)).items()}
    gae_args = (0.98, 0.9, c["value"], c["next_value"], c["reward"], c["done"], c["terminated"])
    got = adapter.generalized_advantage_estimate(*gae_args)
    exact = torchrl_gae(0.98, 0.9, *(c[k].numpy() for k in ("value", "next_value", "reward", "done", "terminated")))
    loop = functional.generalized_advantage_estimate(*gae_args)
    vectorised = functional.vec_generalized_advantage_estimate(*gae_args)
    torch.testing.assert_close(got, loop, rtol=1e-5, atol=1e-5)  # torchrl rounds gamma to float32
    torch.testing.assert_close(got, vectorised, rtol=1e-5, atol=1e-5)
    assert np.abs(got[0].numpy() - exact[0]).max() <= np.abs(vectorised[0].numpy() - exact[0]).max()
    assert np.abs(got[0].numpy() - exact[0]).max() < 1e-12
    vt_args = (0.98, c["log_pi"], c["log_mu"], c["value"], c["next_value"], c["reward"], c["done"], c["terminated"])
    torch.testing.assert_close(adapter.vtrace_advantage_estimate(*vt_args),
                               functional.vtrace_advantage_estimate(*vt_args), rtol=1e-5, atol=1e-5)


def test_errors_as_torchrl():
    x = torch.zeros(2, 5, 1)
    flag = torch.zeros(2, 5, 1, dtype=torch.bool)
    with pytest.raises(RuntimeError, match="must share a unique shape"):
        adapter.generalized_advantage_estimate(0.9, 0.9, x, torch.zeros(2, 4, 1), x, flag)
    with pytest.raises(RuntimeError, match="must share a unique shape"):
        adapter.vtrace_advantage_estimate(0.9, x, x, x, x, torch.zeros(2, 4, 1), flag)
    with pytest.raises(TypeError):
        adapter.generalized_advantage_estimate(0.9, 0.9, x, x, x, torch.zeros(2, 5, 1))
    with pytest.raises(TypeError):
        functional.generalized_advantage_estimate(0.9, 0.9, x, x, x, torch.zeros(2, 5, 1))


def test_nan_beyond_a_cut_does_not_leak():
    """Deliberate difference: NaN in V' at a terminated step stays there (torchrl multiplies it by 0: NaN)."""
    c = {k: torch.from_numpy(v) for k, v in _case(np.random.default_rng(5), shape=(1, 60, 1)).items()}
    terminated = torch.zeros(1, 60, 1, dtype=torch.bool)
    terminated[0, 30, 0] = True
    poisoned = c["next_value"].clone()
    poisoned[0, 30, 0] = float("nan")
    got, _ = adapter.generalized_advantage_estimate(0.98, 0.9, c["value"], poisoned, c["reward"], terminated,
                                                    terminated)
    clean, _ = adapter.generalized_advantage_estimate(0.98, 0.9, c["value"], c["next_value"], c["reward"],
                                                      terminated, terminated)
    torch.testing.assert_close(got, clean, rtol=0, atol=0)
    theirs, _ = functional.generalized_advantage_estimate(0.98, 0.9, c["value"], poisoned, c["reward"], terminated,
                                                          terminated)
    assert torch.isnan(theirs).any()
