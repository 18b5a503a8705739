"""``truncated`` takes its bootstrap from ``next_values``; the next step's value only when the caller says so.

At a truncation the episode goes on in the environment, but the next step of the
row is the next episode's first: its value is the wrong bootstrap. ``gae()`` and
``vtrace()`` refuse ``truncated`` without ``next_values`` (a ValueError naming
``next_values``) unless ``truncated_bootstrap="next_step"`` says that the next
step's value is the one meant.
"""

from __future__ import annotations

import numpy as np
import pytest
from helpers import converted, make_case, to_numpy, xp_assert_close

import gae_xp
from gae_xp import reference

# One row, two episodes: the first is truncated at step 1 (its final observation's value is 7), the second
# starts at step 2 with value 28.
REWARDS = np.array([0.0, 0.0, 1.0, 0.0])
VALUES = np.array([10.0, 20.0, 28.0, 5.0])
TRUNCATED = np.array([False, True, False, False])
NEXT_VALUES = np.array([20.0, 7.0, 5.0, 0.0])


def _row(library):
    return {name: library.asarray(value) for name, value in
            (("rewards", REWARDS), ("values", VALUES), ("truncated", TRUNCATED))}


def test_truncated_without_next_values_raises_naming_it(library, backend):
    arrays = _row(library)
    for call in (lambda: gae_xp.gae(**arrays, gamma=1.0, lam=1.0, backend=backend),
                 lambda: gae_xp.vtrace(library.asarray(np.zeros(4)), **arrays, gamma=1.0, backend=backend)):
        with pytest.raises(ValueError, match="truncated is given without next_values") as raised:
            call()
        message = str(raised.value)
        assert "next_values=" in message and "final observation" in message
        assert 'truncated_bootstrap="next_step"' in message


def test_next_values_bootstrap_the_truncated_episode(library, backend):
    arrays = {**_row(library), "next_values": library.asarray(NEXT_VALUES)}
    advantages, _ = gae_xp.gae(**arrays, gamma=1.0, lam=1.0, backend=backend)
    # A[1] = r_1 + V(final observation) - V_1 = 0 + 7 - 20: not the next episode's 28
    assert to_numpy(advantages).tolist() == [-3.0, -13.0, -27.0, -5.0]


def test_next_step_is_an_explicit_opt_in(library, backend):
    advantages, _ = gae_xp.gae(**_row(library), gamma=1.0, lam=1.0, backend=backend, truncated_bootstrap="next_step")
    assert to_numpy(advantages).tolist() == [18.0, 8.0, -27.0, -5.0]  # A[1] = 0 + 28 - 20, as asked
    case = make_case(np.random.default_rng(3), (3, 40), dones=0.1, holes=0.2, bootstrap=True)
    assert case["truncated_bootstrap"] == "next_step"
    arrays = converted(library, case)
    got_a, got_r = gae_xp.gae(**arrays, backend=backend)
    want_a, want_r = reference.gae_loop(**case)
    xp_assert_close(got_a, want_a, like=arrays["rewards"])
    xp_assert_close(got_r, want_r, like=arrays["rewards"])


def test_truncated_bootstrap_is_checked():
    arrays = {"rewards": REWARDS, "values": VALUES, "truncated": TRUNCATED}
    with pytest.raises(ValueError, match="truncated_bootstrap must be one of"):
        gae_xp.gae(**arrays, truncated_bootstrap="next_state")
    with pytest.raises(ValueError, match="next_values is given and replaces it"):
        gae_xp.gae(**arrays, next_values=NEXT_VALUES, truncated_bootstrap="next_step")
    # without truncated, nothing needs next_values
    gae_xp.gae(REWARDS, VALUES, terminated=TRUNCATED)


def test_the_oracle_has_the_same_rule():
    with pytest.raises(ValueError, match="next_values"):
        reference.gae_loop(REWARDS, VALUES, truncated=TRUNCATED)
    with pytest.raises(ValueError, match="next_values"):
        reference.vtrace_loop(np.zeros(4), REWARDS, VALUES, truncated=TRUNCATED)
    got = reference.gae_loop(REWARDS, VALUES, truncated=TRUNCATED, next_values=NEXT_VALUES, gamma=1.0, lam=1.0)[0]
    assert got.tolist() == [-3.0, -13.0, -27.0, -5.0]


def test_estimators_without_a_value_function_take_truncated_as_a_cut():
    """discounted_returns has no V to bootstrap from and lambda_returns always has next_values: no option needed."""
    got = gae_xp.discounted_returns(REWARDS, gamma=1.0, truncated=TRUNCATED)
    assert got.tolist() == [0.0, 0.0, 1.0, 0.0]
    got = gae_xp.lambda_returns(REWARDS, NEXT_VALUES, gamma=1.0, lam=1.0, truncated=TRUNCATED)
    np.testing.assert_array_equal(got, reference.lambda_returns_loop(REWARDS, NEXT_VALUES, gamma=1.0, lam=1.0,
                                                                     truncated=TRUNCATED))


def test_torchrl_adapter_builds_next_values_itself():
    torch = pytest.importorskip("torch")
    from gae_xp.adapters import torchrl

    reward = torch.tensor([[0.0], [0.0], [1.0], [0.0]])
    value = torch.tensor(VALUES).float()[:, None]
    next_value = torch.tensor(NEXT_VALUES).float()[:, None]
    done = torch.tensor(TRUNCATED)[:, None]
    advantage, _ = torchrl.generalized_advantage_estimate(1.0, 1.0, value, next_value, reward, done, done & False,
                                                          time_dim=0)
    assert advantage[:, 0].tolist() == [-3.0, -13.0, -27.0, -5.0]
