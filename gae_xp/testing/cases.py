"""Random GAE problems as NumPy arrays: the one builder of cases shared by the tests and the benchmarks."""

from __future__ import annotations

import numpy as np


def make_case(rng: np.random.Generator, shape, *, axis: int = -1, dones: float = 0.0, holes: float = 0.0,
              padding: int = 0, per_step_gamma: bool = False, per_row_lam: bool = False, bootstrap: bool = False,
              next_values: bool = False, gamma: float = 0.99, lam: float = 0.95, dtype=np.float64) -> dict:
    """``gae()`` keyword arguments as NumPy arrays, time on ``axis``.

    rewards and values are standard normal; ``dones`` is the probability of
    terminated and (independently) of truncated at each step; ``holes`` the
    probability that a step is masked out, and ``padding`` masks the last
    steps of every row; per-step gamma (0.5 to 1) and per-row lam (0 to 1),
    a per-row bootstrap value and next values are drawn when asked for.
    """
    shape = tuple(shape)
    axis = axis % len(shape)
    length = shape[axis]
    case = {"rewards": rng.standard_normal(shape).astype(dtype), "values": rng.standard_normal(shape).astype(dtype),
            "gamma": gamma, "lam": lam}
    if dones:
        case["terminated"] = rng.random(shape) < dones
        case["truncated"] = rng.random(shape) < dones
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
    return case
