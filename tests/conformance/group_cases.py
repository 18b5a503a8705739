"""Shared by the group adapters' conformance tests: random grouped scores (hypothesis) and a float64 reference.

Scores are dyadic (k / 8): a group of equal dyadic scores has an exact mean in any float, so the frameworks'
own code and gae_xp agree on random cases, and the float32 bugs are tested on purpose elsewhere.
"""

from __future__ import annotations

import math

import numpy as np
from hypothesis import strategies as st

dyadic = st.integers(-40, 40).map(lambda k: k / 8)


@st.composite
def labelled_scores(draw, rows=12, max_size=5):
    """(scores (rows,) float64, uid strings (rows,) object array): groups of 1..max_size rows, rows shuffled.

    The number of rows is fixed so that JAX compiles each operation once, not once per drawn shape."""
    sizes = []
    while sum(sizes) < rows:
        sizes.append(min(draw(st.integers(1, max_size)), rows - sum(sizes)))
    uids = [f"uid-{draw(st.uuids())}" for _ in sizes]
    labels = [uid for uid, size in zip(uids, sizes) for _ in range(size)]
    order = draw(st.permutations(range(len(labels))))
    scores = draw(st.lists(dyadic, min_size=len(labels), max_size=len(labels)))
    return np.array(scores), np.array([labels[i] for i in order], dtype=object)


@st.composite
def consecutive_scores(draw, sizes=(1, 2, 3, 4, 6, 12), rows=12, nan=False):
    """(rewards (rows,) float64, k): consecutive groups of k (a divisor of rows), some rewards NaN when ``nan``."""
    k = draw(st.sampled_from(sizes))
    n = rows
    values = dyadic | st.just(math.nan) if nan else dyadic
    return np.array(draw(st.lists(values, min_size=n, max_size=n))), k


def token_rewards(scores, length, rng):
    """(bs, length) token rewards whose rows sum to ``scores`` (the score on one token, as verl's reward manager
    puts it), and a 0/1 float mask with the scored token real."""
    scores = np.asarray(scores, dtype=np.float64)
    rewards = np.zeros((scores.shape[0], length))
    ends = rng.integers(0, length, scores.shape[0])
    rewards[np.arange(scores.shape[0]), ends] = scores
    mask = (np.arange(length)[None, :] <= ends[:, None]).astype(np.float64)
    return rewards, mask


def exact_group_advantages(scores, labels, *, baseline="mean", scale="group", eps=1e-6, unbiased=True):
    """One group at a time in Python floats (``math.fsum``; equal scores give their value as the mean and M2 0),
    the groups of ``labels`` (any hashable per row): the float64 answer the frameworks' formulas have."""
    values = [float(v) for v in np.asarray(scores, dtype=np.float64)]
    members: dict = {}
    for i, label in enumerate(labels):
        members.setdefault(label, []).append(i)

    def moments(real):
        if not real:
            return 0, 0.0, 0.0
        if all(v == real[0] for v in real):
            return len(real), real[0], 0.0
        mean = math.fsum(real) / len(real)
        return len(real), mean, math.fsum((v - mean) ** 2 for v in real)

    def std(n, m2):
        divisor = n - 1 if unbiased else n
        return math.sqrt(m2 / divisor) if divisor > 0 and m2 > 0 else 0.0

    batch = moments([v for v in values if not math.isnan(v)])
    out = np.zeros(len(values))
    for where in members.values():
        n, mean, m2 = moments([values[i] for i in where if not math.isnan(values[i])])
        for i in where:
            if math.isnan(values[i]):
                continue
            centred = values[i] if baseline is None else values[i] - mean
            if baseline == "leave_one_out":
                centred = centred * n / (n - 1) if n > 1 else 0.0
            if scale == "group":
                out[i] = 0.0 if m2 == 0 else centred / (std(n, m2) + eps)
            elif scale == "batch":
                out[i] = 0.0 if batch[2] == 0 else centred / (std(batch[0], batch[2]) + eps)
            else:
                out[i] = centred
    return out
