r"""Turn-level GAE for multi-turn agentic trajectories: one step per turn, each turn's advantage on its tokens.

AReaL's ``gae_timestep_unit: turn`` (areal-project/AReaL PR #1600,
``areal/trainer/ppo/gae.py``), without a loop over turns or sequences: a
reduction from tokens to turns (compaction of the real tokens, neighbour
comparisons of their turn ids, sorted offsets), the scan of ``gae_xp.gae``
over the turns of every row or sequence at once, and a gather back
(``repeat``) to the tokens. Every operation is in the array API standard, so
the same code runs on NumPy, PyTorch, CuPy, JAX (eagerly) and array-api-strict;
the two scans inside go through ``gae()``, whose ``backend="auto"`` takes the
numba kernel on NumPy and torch CPU arrays.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from . import _prepare as prepare_
from ._compat import device_of, is_array, is_numpy_array, is_torch_array, isdtype, known_finite, values_are_readable
from ._problem import restore
from .estimators import gae

Array = Any

__all__ = ["turn_gae", "turn_counts"]


def turn_gae(rewards: Array, values: Array, turn_ids: Array, *, gamma: float | Array = 0.99,
             lam: float | Array = 0.95, critic_lam: float | Array | None = None, mask: Array | None = None,
             bootstrap_value: float | Array | None = None, cu_seqlens: Array | None = None, axis: int = -1,
             chunk_size: int | None = None, backend: str = "auto") -> tuple[Array, Array]:
    r"""Turn-level GAE: every turn of a trajectory is one step; returns ``(advantages, returns)`` per token.

    A *turn* is a maximal run of real tokens (``mask`` True; default:
    ``turn_ids >= 0``) of one row, or of one packed sequence with
    ``cu_seqlens``, that share a turn id; masked tokens between them (a
    prompt, a tool's output) belong to no turn and do not split one. For the
    turns ``k = 0 .. K-1`` of a row, in order::

        R_k      = sum of r_t over the real tokens t of turn k
        V_k      = V_s at the turn's first real token s
        gamma_k, lam_k = gamma_s, lam_s
        Vnext_k  = V_{k+1}, or bootstrap_value after the last turn
        delta_k  = R_k + gamma_k Vnext_k - V_k
        A_k      = delta_k + gamma_k lam_k A_{k+1},      A_K = 0

    and every real token of turn k gets ``advantages = A_k`` and
    ``returns = A_k + V_k`` (with ``critic_lam``, A_k of the same recurrence
    with ``critic_lam`` in place of ``lam``: VAPO's decoupled GAE, as in
    ``gae()``); tokens outside every turn get 0 in both.

    This is AReaL's ``_compute_turn_level_gae`` with three deliberate
    differences: a masked token's return is 0 here (AReaL writes the token's
    own value there: ``xp.where(mask, returns, values)`` gives it), turn ids
    need no upper bound (AReaL asks for ``turn_ids < T``: its turns live in T
    slots), and a masked reward or value, NaN included, cannot leak (AReaL
    multiplies by the mask). AReaL's bootstrap is ``values[:, -1]`` where a
    sequence has no EOS, else 0: pass it as ``bootstrap_value``.

    Parameters
    ----------
    rewards, values : array
        Per token, of one shape (any array-API library); time is ``axis``.
    turn_ids : array of an integer dtype
        The turn of each token, the shape of ``rewards``: non-decreasing
        over the real tokens of a row (of a sequence), at least 0 on every
        real token; equal ids in different rows or sequences are different
        turns, and ids need not be consecutive (an unused id takes no step).
    gamma, lam : float or array
        In [0, 1]: numbers, or arrays broadcastable to ``rewards`` (one per
        row, e.g. from ``gae_xp.length_adaptive_lambda``, or per token: a
        turn takes the value at its first real token).
    critic_lam : float or array, optional
        The lambda of the returns (the critic's targets), like ``lam``;
        default ``lam``.
    mask : bool array, optional
        True for a token that belongs to a turn (AReaL's ``loss_mask``).
        Default ``turn_ids >= 0`` (AReaL marks prompt and tool tokens -1).
    bootstrap_value : float or array, optional
        The value after a row's last turn (default 0): a number or an array
        of the batch shape; with ``cu_seqlens``, one per sequence (the batch
        shape plus a trailing axis of ``len(cu_seqlens) - 1``).
    cu_seqlens : integer array, optional
        Packed sequences along the time axis, as in ``gae()``: each sequence
        is a trajectory of its own (its turns, its bootstrap value).
    axis : int
        The time axis.
    chunk_size, backend
        Passed to the two ``gae()`` calls inside (the turns' reward sums and
        the scan over turns).

    Returns
    -------
    advantages, returns : array
        Per token, in the inputs' namespace, device, shape and floating
        dtype (float16 computed in float32, as in ``gae()``).

    Raises
    ------
    TypeError
        ``turn_ids`` not of an integer dtype, ``mask`` not bool, arrays of
        different libraries.
    ValueError
        Shapes that differ, gamma or lam outside [0, 1], a negative turn id
        on a real token, turn ids that decrease within a row or sequence,
        traced or lazy arrays (the number of turns is read from the data).

    Examples
    --------
    Two turns of two tokens each, the outcome reward on the last token:

    >>> import numpy as np
    >>> from gae_xp import turn_gae
    >>> rewards = np.array([[0.0, 0.0, 0.0, 1.0]])
    >>> values = np.array([[0.5, 0.0, 0.25, 0.0]])
    >>> advantages, returns = turn_gae(rewards, values, np.array([[0, 0, 1, 1]]), gamma=1.0, lam=0.5)
    >>> advantages   # A_1 = 1 - 0.25, A_0 = 0 + 0.25 - 0.5 + 0.5 * 0.75
    array([[0.125, 0.125, 0.75 , 0.75 ]])
    >>> returns
    array([[0.625, 0.625, 1.   , 1.   ]])
    """
    call = _prepare(rewards, values, turn_ids, gamma, lam, critic_lam, mask, bootstrap_value, cu_seqlens, axis)
    xp = call.xp
    if call.tokens.real_positions.shape[0] == 0:
        zero = xp.zeros(call.shape, dtype=call.out_dtype, device=device_of(call.rewards))
        return zero, xp.asarray(zero, copy=True)
    turns = call.tokens.turns()
    reward_sums = _sum_per_turn(xp, call, turns, chunk_size=chunk_size, backend=backend)
    first = turns.first_positions
    advantages, returns = gae(
        reward_sums, xp.take(call.values, first), gamma=_per_turn(xp, call.gamma, call, first),
        lam=_per_turn(xp, call.lam, call, first), critic_lam=_per_turn(xp, call.critic_lam, call, first),
        bootstrap_value=call.bootstrap, cu_seqlens=turns.segment_bounds, chunk_size=chunk_size, backend=backend)
    advantages, returns = _on_tokens(xp, call, turns, [advantages, returns])
    return call.restore(advantages), call.restore(returns)


def turn_counts(turn_ids: Array, *, mask: Array | None = None, cu_seqlens: Array | None = None,
                axis: int = -1) -> Array:
    """The number of turns of every row, or of every packed sequence: a trajectory's length in turns.

    Turns as in ``turn_gae``; AReaL's ``turn_counts`` (the distinct ids on the
    real tokens of a row), the lengths its turn mode gives a lambda function
    (``length_adaptive_lambda(alpha, lengths=turn_counts(...))``).

    Parameters
    ----------
    turn_ids : array of an integer dtype
        The turn of each token, as in ``turn_gae``.
    mask : bool array, optional
        True for a token that belongs to a turn; default ``turn_ids >= 0``.
    cu_seqlens : integer array, optional
        Packed sequences along the time axis: count the turns of each.
    axis : int
        The time axis.

    Returns
    -------
    array
        Integer counts: the shape of ``turn_ids`` with ``axis`` of size 1, or,
        with ``cu_seqlens``, the batch shape plus a trailing axis of one per
        sequence. An empty time axis gives 0 turns in that shape (every row,
        and every sequence of ``cu_seqlens=[0, 0, ...]``, has none).

    Raises
    ------
    TypeError, ValueError
        As ``turn_gae`` for its ``turn_ids``, ``mask`` and ``cu_seqlens``.

    Examples
    --------
    >>> import numpy as np
    >>> from gae_xp import turn_counts
    >>> turn_counts(np.array([[0, 0, -1, 2, 2], [0, 0, 0, 0, -1], [-1, -1, -1, -1, -1]]))
    array([[2],
           [1],
           [0]])
    """
    prepare_.require_array("turn_ids", turn_ids)
    arrays = {"turn_ids": turn_ids, "mask": mask}
    if not prepare_.is_host_offsets(cu_seqlens, turn_ids):
        arrays["cu_seqlens"] = cu_seqlens
    present = {name: value for name, value in arrays.items() if is_array(value)}
    xp = prepare_.namespace_of(present)
    prepare_.check_same_device(present, "turn_ids")
    shape = tuple(turn_ids.shape)
    axis = prepare_.check_axis(axis, len(shape), "turn_ids")
    _require_readable(present)
    tokens = _Tokens.lay_out(xp, turn_ids, mask, cu_seqlens, shape, axis)
    batch_shape = shape[:axis] + shape[axis + 1:]
    if tokens.real_positions.shape[0] == 0:
        counts = xp.zeros(tokens.segment_starts.shape[0] - 1, dtype=xp.int64, device=device_of(turn_ids))
    else:
        bounds = tokens.turns().segment_bounds
        counts = bounds[1:] - bounds[:-1]
    if cu_seqlens is None:
        return xp.expand_dims(xp.reshape(counts, batch_shape), axis=axis)
    return xp.reshape(counts, (*batch_shape, -1))


# --- the tokens, their turns ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Turns:
    """The turns of every row and sequence, in order (K of them), on the flattened tokens."""

    #: flattened token position of each turn's first real token (K, increasing).
    first_positions: Array
    #: index of each turn's first real token among the real tokens (K, increasing, from 0).
    first_real: Array
    #: for every segment (row, or row and sequence) and the end: its first turn (segments + 1, non-decreasing): the
    #: turns' ``cu_seqlens``, a repeated offset for a segment without turns.
    segment_bounds: Array


@dataclass(frozen=True)
class _Tokens:
    """Tokens flattened to one axis (rows one after another, time last), and where their real ones and segments are."""

    xp: Any
    #: the flattened token position of every real token (N, increasing).
    real_positions: Array
    #: the turn id of every real token (N).
    real_ids: Array
    #: every segment's first flattened position, then the number of tokens (segments + 1, non-decreasing).
    segment_starts: Array
    #: True for a real token (flattened).
    real: Array
    #: packed sequences per row (1 without cu_seqlens).
    sequences: int

    @classmethod
    def lay_out(cls, xp, turn_ids, mask, cu_seqlens, shape, axis: int) -> "_Tokens":
        prepare_.require_array("turn_ids", turn_ids)
        prepare_.same_shape("turn_ids", turn_ids, shape)
        if not isdtype(xp, turn_ids.dtype, "integral"):
            raise TypeError(f"turn_ids must have an integer dtype (one id per turn), got {turn_ids.dtype}")
        length = shape[axis]
        device = device_of(turn_ids)
        ids = _flat(xp, turn_ids, axis)
        real = ids >= 0 if mask is None else _flat(xp, prepare_.flag(xp, "mask", mask, shape, axis), -1)
        positions = xp.nonzero(real)[0]
        real_ids = xp.take(ids, positions)
        rows = math.prod(shape[:axis] + shape[axis + 1:])  # from the shape: an empty time axis still has rows
        if cu_seqlens is None:
            inner = xp.zeros(1, dtype=positions.dtype, device=device)
        else:  # every row's sequences start at the same offsets
            offsets, _ = prepare_.check_offsets(xp, cu_seqlens, length, turn_ids)
            inner = xp.astype(offsets[:-1], positions.dtype)
        row_starts = xp.arange(rows, dtype=positions.dtype, device=device) * length
        starts = xp.reshape(xp.expand_dims(row_starts, axis=1) + xp.expand_dims(inner, axis=0), (-1,))
        end = xp.full(1, ids.shape[0], dtype=positions.dtype, device=device)
        return cls(xp, positions, real_ids, xp.concat([starts, end]), real, int(inner.shape[0]))

    def turns(self) -> _Turns:
        """The turns (there is at least one real token): a turn starts at a segment's first real token and at
        every change of id between neighbouring real tokens of one segment."""
        xp = self.xp
        ids = self.real_ids
        count = ids.shape[0]
        # each segment's first token and the end, as indices among the real tokens (repeated for an empty one)
        segment_firsts = xp.searchsorted(self.real_positions, self.segment_starts)
        changes = xp.nonzero(ids[1:] != ids[:-1])[0] + 1
        _check_order(xp, ids, changes, segment_firsts)
        if bool(xp.any(xp.take(ids, xp.minimum(segment_firsts, _index(xp, count - 1, segment_firsts))) < 0)):
            # ids do not decrease within a segment: its first real token holds its smallest id
            raise ValueError("turn_ids must be at least 0 on every real token (mask True); mark tokens outside every "
                             "turn with mask False (or with a negative id and mask=None)")
        # the turns' first tokens: the changes and the segments' firsts (sorted, each once, the end dropped)
        merged = xp.sort(xp.concat([changes, segment_firsts]))
        first_real = merged[xp.concat([merged[:1] < count, (merged[1:] != merged[:-1]) & (merged[1:] < count)])]
        bounds = xp.searchsorted(first_real, segment_firsts)
        return _Turns(xp.take(self.real_positions, first_real), first_real, bounds)


def _check_order(xp, ids, changes, segment_firsts) -> None:
    """ValueError if a turn id decreases between neighbouring real tokens of one segment (a new segment may start
    lower)."""
    if changes.shape[0] == 0:
        return
    lower = changes[xp.take(ids, changes) < xp.take(ids, changes - 1)]
    if lower.shape[0] == 0:
        return
    at = xp.minimum(xp.searchsorted(segment_firsts, lower), _index(xp, segment_firsts.shape[0] - 1, lower))
    if not bool(xp.all(xp.take(segment_firsts, at) == lower)):
        raise ValueError("turn_ids must not decrease between the real tokens of one row (of one sequence with "
                         "cu_seqlens): a turn is a run of equal ids")


def _index(xp, value: int, like):
    """A 0-d index array of like's dtype and device."""
    return xp.asarray(value, dtype=like.dtype, device=device_of(like))


# --- one call --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Call:
    xp: Any
    shape: tuple
    axis: int
    out_dtype: Any
    rewards: Array  # flattened, compute dtype
    values: Array
    gamma: float | Array  # a float, or (rows,) per row, or flattened per token
    lam: float | Array
    critic_lam: float | Array | None
    bootstrap: Array  # flattened, one per segment
    tokens: _Tokens

    def restore(self, flat):
        """A flattened per-token result in the caller's shape, time axis and dtype."""
        xp = self.xp
        moved = (*self.shape[:self.axis], *self.shape[self.axis + 1:], self.shape[self.axis])
        return restore(xp, xp.reshape(flat, moved), self.out_dtype, self.axis)


def _prepare(rewards, values, turn_ids, gamma, lam, critic_lam, mask, bootstrap_value, cu_seqlens, axis) -> _Call:
    prepare_.require_array("rewards", rewards)
    prepare_.require_array("values", values)
    prepare_.require_array("turn_ids", turn_ids)
    arrays = {"rewards": rewards, "values": values, "turn_ids": turn_ids, "mask": mask, "gamma": gamma, "lam": lam,
              "critic_lam": critic_lam, "bootstrap_value": bootstrap_value}
    if not prepare_.is_host_offsets(cu_seqlens, rewards):
        arrays["cu_seqlens"] = cu_seqlens  # an array of the inputs' library: checked with them
    present = {name: value for name, value in arrays.items() if is_array(value)}
    xp = prepare_.namespace_of(present)
    prepare_.check_same_device(present, "rewards")
    shape = tuple(rewards.shape)
    axis = prepare_.check_axis(axis, len(shape))
    prepare_.same_shape("values", values, shape)
    _require_readable(present)
    out_dtype, dtype = prepare_.compute_dtypes(
        xp, {"rewards": rewards, "values": values, "bootstrap_value": bootstrap_value}, rewards)
    tokens = _Tokens.lay_out(xp, turn_ids, mask, cu_seqlens, shape, axis)
    segments = None if cu_seqlens is None else tokens.sequences
    bootstrap = prepare_.boundary(xp, "bootstrap_value", 0.0 if bootstrap_value is None else bootstrap_value,
                                  shape[:axis] + shape[axis + 1:], dtype, rewards, segments=segments)
    return _Call(xp, shape, axis, out_dtype, _flat(xp, rewards, axis, dtype), _flat(xp, values, axis, dtype),
                 *(None if value is None else _coefficient(xp, name, value, shape, dtype, axis)
                   for name, value in (("gamma", gamma), ("lam", lam), ("critic_lam", critic_lam))),
                 xp.reshape(bootstrap, (-1,)), tokens)


def _require_readable(arrays) -> None:
    for name, value in arrays.items():
        if not values_are_readable(value):
            raise ValueError(f"{name} is traced or lazy: turn-level GAE reads the number of turns from the data, "
                             "so it runs on eager arrays only (outside jax.jit, torch.compile, Dask)")


def _flat(xp, x, axis: int, dtype=None):
    """x with time moved last and every axis flattened into one (rows one after another)."""
    if dtype is not None:
        x = xp.astype(x, dtype, copy=False)
    if axis != x.ndim - 1:
        x = xp.moveaxis(x, axis, -1)
    return xp.reshape(x, (-1,))


def _coefficient(xp, name: str, value, shape, dtype, axis: int):
    """gamma or lam checked as ``gae()`` checks it (a float in [0, 1], or an array broadcastable to the inputs with
    values in [0, 1]), kept as one value per row (rows,) where it does not vary along time, else per token."""
    checked = prepare_.coefficient(xp, name, value, shape, dtype, axis, bounds=(0.0, 1.0))  # time last
    if not is_array(value):
        return checked
    aligned = (1,) * (len(shape) - value.ndim) + tuple(value.shape)
    return _flat(xp, checked if aligned[axis] != 1 else checked[..., :1], -1)


def _per_turn(xp, coefficient, call: _Call, first_positions):
    """The coefficient at each turn's first real token (a float or None stays as it is)."""
    if coefficient is None or isinstance(coefficient, float):
        return coefficient
    if coefficient.shape[0] == call.rewards.shape[0]:
        return xp.take(coefficient, first_positions)
    length = call.shape[call.axis]
    return xp.take(coefficient, first_positions // length)


def _sum_per_turn(xp, call: _Call, turns: _Turns, *, chunk_size, backend):
    """R_k, the sum of each turn's real rewards: the scan of gae() with gamma = lam = 1 and values 0 over the real
    tokens, cut at every turn's start (one packed sequence per turn), read at the turns' first tokens. It sums in
    order (the numba kernel in float64), and a NaN or inf stays inside its turn."""
    real_rewards = xp.take(call.rewards, call.tokens.real_positions)
    count = xp.full(1, real_rewards.shape[0], dtype=turns.first_real.dtype, device=device_of(real_rewards))
    suffix_sums, _ = gae(real_rewards, xp.zeros_like(real_rewards), gamma=1.0, lam=1.0,
                         cu_seqlens=xp.concat([turns.first_real, count]), chunk_size=chunk_size, backend=backend)
    return xp.take(suffix_sums, turns.first_real)


def _on_tokens(xp, call: _Call, turns: _Turns, per_turn: list):
    """Each token gets the value of its turn (0 outside every turn): ``repeat`` over the runs from one turn's first
    token to the next one's, then the tokens that are not real are set to 0."""
    positions = turns.first_positions
    device = device_of(positions)
    edges = xp.concat([xp.zeros(1, dtype=positions.dtype, device=device), positions,
                       xp.full(1, call.rewards.shape[0], dtype=positions.dtype, device=device)])
    runs = edges[1:] - edges[:-1]
    zero = xp.zeros(1, dtype=per_turn[0].dtype, device=device_of(per_turn[0]))
    spread = [xp.repeat(xp.concat([zero, values]), runs) for values in per_turn]
    real = call.tokens.real
    if call.tokens.real_positions.shape[0] == real.shape[0]:
        return spread
    if all(known_finite(xp, values) for values in per_turn):  # a 0/1 factor costs less than where; exact if finite
        # NumPy and PyTorch multiply by a bool array as it is; the array API asks for one float dtype
        factor = real if is_numpy_array(real) or is_torch_array(real) else xp.astype(real, zero.dtype)
        for i in range(len(spread)):
            spread[i] *= factor  # our own array: in place where the library allows (JAX makes a new one)
        return spread
    return [xp.where(real, out, zero) for out in spread]
