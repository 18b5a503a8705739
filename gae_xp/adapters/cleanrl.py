"""CleanRL's GAE and advantage normalisation (cleanrl/ppo.py, cleanrl/ppo_continuous_action.py), on the chunk scan.

CleanRL's conventions, which a plain ``gae_xp.gae`` call gets wrong silently:

* time-major: [num_steps, num_envs] (any trailing env axes), time on axis 0;
* ``dones[t]`` is the done flag stored *before* step t (``dones[step] = next_done``):
  it says that ``obs[t]`` starts a new episode. Step t's own flag is
  ``dones[t + 1]``, and ``next_done`` for the last step;
* ``next_value`` is V(next_obs) after the rollout, shaped (1, num_envs)
  (``agent.get_value(next_obs).reshape(1, -1)``) or (num_envs,);
* a done step both drops the bootstrap and cuts the trace
  (``nextnonterminal = 1 - done``): truncations count as terminations,
  since CleanRL stores ``terminations or truncations``.

``compute_gae`` is the loop after the rollout::

    done_t  = dones[t + 1]  (next_done for t = num_steps - 1)
    delta_t = r_t + gamma (1 - done_t) V_{t+1} - V_t      (V_{num_steps} = next_value)
    A_t     = delta_t + gamma lam (1 - done_t) A_{t+1}
    returns = A + V

``normalize_advantages`` is ``norm_adv``'s ``(x - x.mean()) / (x.std() + 1e-8)``
with the Bessel-corrected std (torch's default): the 1e-8 is added to the
std, not to the variance, so no ``gae_xp.whiten(eps=...)`` reproduces it.

Deliberate differences from CleanRL:

* a done flag is read as ``done != 0`` (CleanRL's are 0.0/1.0 floats; a
  fractional one would scale the trace there), and the cut is a ``where``: a
  NaN or inf in V after a done step does not reach earlier steps.
* results equal up to rounding, not bitwise (a tree of sums, not a chain);
  gamma and gae_lambda must lie in [0, 1].
* to keep truncations apart from terminations (bootstrapping a truncated
  episode from its final observation), call ``gae_xp.gae`` with
  ``terminated``, ``truncated`` and ``next_values``: see examples/ppo_cartpole.py.
"""

from __future__ import annotations

import gae_xp
from gae_xp._compat import array_namespace
from gae_xp.adapters._util import Array, ShapeError, no_grad


def compute_gae(rewards: Array, values: Array, dones: Array, next_value: Array, next_done: Array, gamma: float = 0.99,
                gae_lambda: float = 0.95) -> tuple[Array, Array]:
    r"""(advantages, returns) of CleanRL's loop, for time-major [num_steps, num_envs] arrays.

    ::

        done_t  = dones[t + 1] != 0   (next_done for the last step)
        delta_t = r_t + gamma (1 - done_t) V_{t+1} - V_t,   V_{num_steps} = next_value
        A_t     = delta_t + gamma gae_lambda (1 - done_t) A_{t+1},   returns = A + V

    Parameters
    ----------
    rewards, values, dones : arrays, shape ``(num_steps, *envs)``
        CleanRL's storage: ``dones[t]`` is the done flag stored before step t (``obs[t]`` starts an episode).
    next_value : array, shape ``(1, *envs)`` or envs
        V(next_obs) after the rollout.
    next_done : array, shape envs
        The done flag of the last step.
    gamma, gae_lambda : float
        In [0, 1] (CleanRL's defaults 0.99 and 0.95).

    Returns
    -------
    advantages, returns : arrays, shape ``(num_steps, *envs)``
        Of the inputs' library, device and floating dtype (empty for num_steps = 0, as CleanRL's loop gives).

    Raises
    ------
    ShapeError
        (a ValueError and an AssertionError) when the shapes do not match CleanRL's.
    ValueError
        for gamma or gae_lambda outside [0, 1].

    Examples
    --------
    >>> import numpy as np
    >>> from gae_xp.adapters.cleanrl import compute_gae
    >>> rewards, values = np.ones((3, 1)), np.zeros((3, 1))
    >>> dones = np.array([[0.0], [0.0], [1.0]])             # obs[2] starts a new episode: step 1 ended one
    >>> advantages, returns = compute_gae(rewards, values, dones, np.array([[10.0]]), np.array([0.0]), 0.5, 1.0)
    >>> advantages[:, 0].tolist()
    [1.5, 1.0, 6.0]
    """
    xp = array_namespace(rewards, values, dones, next_value, next_done)
    shape = tuple(rewards.shape)
    if rewards.ndim < 1 or tuple(values.shape) != shape or tuple(dones.shape) != shape:
        raise ShapeError(f"rewards, values and dones must share one time-major shape, got {shape}, "
                         f"{tuple(values.shape)} and {tuple(dones.shape)}")
    envs = shape[1:]
    if tuple(next_done.shape) != envs:
        raise ShapeError(f"next_done must have the env shape {envs}, got {tuple(next_done.shape)}")
    if tuple(next_value.shape) not in (envs, (1, *envs)):
        raise ShapeError(f"next_value must have the env shape {envs} or (1, *{envs}), got {tuple(next_value.shape)}")
    with no_grad(values):
        # Step t's own done flag is the one stored before step t + 1 (no steps: none, as CleanRL's loop runs none).
        step_done = (xp.concat([dones[1:, ...], next_done[None, ...]], axis=0) if shape[0] else dones) != 0
        return gae_xp.gae(rewards, values, gamma=gamma, lam=gae_lambda, terminated=step_done,
                          bootstrap_value=xp.reshape(next_value, envs), axis=0)


def normalize_advantages(mb_advantages: Array) -> Array:
    r"""CleanRL's ``norm_adv``: ``(mb_advantages - mean) / (std + 1e-8)``, std with Bessel's correction.

    Parameters
    ----------
    mb_advantages : array
        A minibatch of advantages (every entry counts, over all axes).

    Returns
    -------
    array
        Of the input's library, device and dtype; NaN for a single entry (its corrected std is NaN, as in torch).

    Examples
    --------
    >>> import numpy as np
    >>> from gae_xp.adapters.cleanrl import normalize_advantages
    >>> normalize_advantages(np.array([1.0, 2.0, 3.0])).round(6).tolist()
    [-1.0, 0.0, 1.0]
    """
    xp = array_namespace(mb_advantages)
    return (mb_advantages - xp.mean(mb_advantages)) / (xp.std(mb_advantages, correction=1) + 1e-8)
