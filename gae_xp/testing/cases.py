"""Random GAE problems as NumPy arrays: the one builder of cases shared by the tests and the benchmarks."""

from __future__ import annotations

from typing import Any

import numpy as np


def make_case(rng: np.random.Generator, shape: tuple[int, ...], *, axis: int = -1, dones: float = 0.0,
              holes: float = 0.0, padding: int = 0, per_step_gamma: bool = False, per_row_lam: bool = False,
              bootstrap: bool = False, next_values: bool = False, gamma: float = 0.99, lam: float = 0.95,
              critic_lam: float | None = None, per_step_critic_lam: bool = False, fill_masked: bool = False,
              dtype: Any = np.float64) -> dict:
    """``gae()`` keyword arguments as NumPy arrays, time on ``axis``.

    Parameters
    ----------
    rng : numpy.random.Generator
        Where the numbers come from.
    shape : tuple of int
        The shape of rewards and values (standard normal).
    axis : int, default -1
        The time axis.
    dones : float, default 0
        The probability of terminated and, independently, of truncated at each step. Without ``next_values``
        the case says ``truncated_bootstrap="next_step"`` (its truncations have no final observations: the
        next step's value bootstraps them), which ``gae()`` otherwise refuses.
    holes, padding : float and int, default 0
        The probability that a step is masked out, and a count of last steps masked in every row.
    per_step_gamma, per_row_lam : bool, default False
        Draw gamma per step (0.5 to 1) and lam per row (0 to 1) instead of the numbers ``gamma`` and ``lam``.
    bootstrap, next_values : bool, default False
        Draw a per-row bootstrap value, or next values per step.
    gamma, lam : float, default 0.99 and 0.95
        The discounts when not drawn.
    critic_lam : float, optional
        Decoupled GAE's lambda for the returns, passed on; ``per_step_critic_lam`` draws it per step (0 to 1).
    fill_masked : bool, default False
        Passed on: ``gae()`` fills the masked steps' outputs instead of zeroing them.
    dtype : numpy dtype, default float64
        The dtype of rewards and values.

    Returns
    -------
    dict
        Keyword arguments for ``gae_xp.gae`` and ``gae_xp.reference.gae_loop``.

    Examples
    --------
    >>> import numpy as np
    >>> from gae_xp.testing import make_case
    >>> case = make_case(np.random.default_rng(0), (2, 5), dones=0.1)
    >>> sorted(case)
    ['gamma', 'lam', 'rewards', 'terminated', 'truncated', 'truncated_bootstrap', 'values']
    """
    shape = tuple(shape)
    axis = axis % len(shape)
    length = shape[axis]
    case = {"rewards": rng.standard_normal(shape).astype(dtype), "values": rng.standard_normal(shape).astype(dtype),
            "gamma": gamma, "lam": lam}
    if dones:
        case["terminated"] = rng.random(shape) < dones
        case["truncated"] = rng.random(shape) < dones
        if not next_values:
            case["truncated_bootstrap"] = "next_step"
    if holes or padding:
        mask = rng.random(shape) >= holes
        if padding:
            steps = np.arange(length).reshape([-1 if i == axis else 1 for i in range(len(shape))])
            mask &= steps < length - padding
        case["mask"] = mask
    if per_step_gamma:
        gamma_shape = [1] * len(shape)
        gamma_shape[axis] = length
        case["gamma"] = rng.uniform(0.5, 1.0, gamma_shape)
    if per_row_lam:
        lam_shape = list(shape)
        lam_shape[axis] = 1
        case["lam"] = rng.uniform(0.0, 1.0, lam_shape)
    if bootstrap:
        case["bootstrap_value"] = rng.standard_normal(shape[:axis] + shape[axis + 1:])
    if next_values:
        case["next_values"] = rng.standard_normal(shape)
    if critic_lam is not None:
        case["critic_lam"] = critic_lam
    if per_step_critic_lam:
        critic_shape = [1] * len(shape)
        critic_shape[axis] = length
        case["critic_lam"] = rng.uniform(0.0, 1.0, critic_shape)
    if fill_masked:
        case["fill_masked"] = True
    return case


def option_grid(dones: float = 0.2) -> dict[str, dict]:
    """Every option of ``gae()`` alone and in the combinations kernels treat apart, as ``make_case`` options.

    Parameters
    ----------
    dones : float, default 0.2
        The probability of terminated (and of truncated) per step where a case has them: small for long rows,
        large for short ones, so that every row has some. The case with every option draws 3/4 of it, and the
        per-step critic lambda's half.

    Returns
    -------
    dict
        name -> keyword arguments for ``make_case``: ``plain``, ``bootstrap``, ``next_values``, ``dones``,
        ``dones+next_values``, ``holes``, ``holes+fill``, ``holes+next_values``, ``padding+bootstrap``,
        ``coefficients`` (gamma per step, lam per row), ``critic_lam``, ``per_step_critic_lam`` and
        ``everything``.

    Examples
    --------
    >>> import numpy as np
    >>> from gae_xp.testing import make_case, option_grid
    >>> case = make_case(np.random.default_rng(0), (2, 8), **option_grid()["holes+fill"])
    >>> case["fill_masked"], case["mask"].shape
    (True, (2, 8))
    """
    return {
        "plain": {},
        "bootstrap": {"bootstrap": True},
        "next_values": {"next_values": True},
        "dones": {"dones": dones},
        "dones+next_values": {"dones": dones, "next_values": True},
        "holes": {"holes": 0.3},
        "holes+fill": {"holes": 0.3, "fill_masked": True},
        "holes+next_values": {"holes": 0.3, "next_values": True, "fill_masked": True},
        "padding+bootstrap": {"padding": 5, "bootstrap": True},
        "coefficients": {"per_step_gamma": True, "per_row_lam": True},
        "critic_lam": {"critic_lam": 1.0},
        "per_step_critic_lam": {"per_step_critic_lam": True, "dones": dones / 2},
        "everything": {"dones": 0.75 * dones, "holes": 0.25, "padding": 2, "per_step_gamma": True,
                       "per_row_lam": True, "bootstrap": True, "per_step_critic_lam": True, "fill_masked": True},
    }
