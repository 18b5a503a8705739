r"""Pieces of a row that live apart: the few numbers that cross between them, and the chains that join them.

A *piece* is a run of steps of a row whose right neighbour lives elsewhere:
another rank's shard (context parallelism), another Dask block, the other
piece of a sequence in the zigzag layout. In a ``GaeProblem`` a piece is a segment (see
``offsets``): ``[offsets[i], offsets[i+1])``, one segment when there are no
offsets. GAE on a piece is linear in two numbers per row that come from its
right:

* ``b``: the value entering "V at the next real step" (the first real V of
  the pieces to the right, or the bootstrap value after the last one);
* ``c``: the advantage entering from the right (``A`` just after the piece).

So a piece's *summary* is five numbers per row, its response to (b, c) at
its first step (``FIELDS``)::

    value         "V at the next real step" seen from the first step, with b = 0
    on_value      its coefficient on b: 1 if the piece has no real step, else 0
    edge          A at the first step with b = c = 0 (the running advantage:
                  at a masked first step, that of the next real step)
    on_bootstrap  the coefficient of edge on b (through the last real step's Vnext)
    product       the coefficient of edge on c: the product of the coefficients

These are two of the scan skeleton's (edge, product) pairs (``gae_xp._scan``,
step 1): ``(value, on_value)`` for the value chain and ``(edge +
on_bootstrap b, product)`` for the advantage chain. Joined in time order::

    b_k = value_{k+1} + on_value_{k+1} b_{k+1}                          (bootstrap after the last)
    c_k = edge_{k+1} + on_bootstrap_{k+1} b_{k+1} + product_{k+1} c_{k+1}  (0 after the last)

A piece that ends its sequence is ``close``d by whoever holds it: its own
bootstrap and c = 0 go in, and its coefficients become 0, so nothing from
its right crosses it.

Decoupled lambda (``critic_lam``: the returns from ``gamma * critic_lam``)
adds a second advantage chain over the same deltas, cuts and value chain:
three more numbers per row and piece (``CRITIC_FIELDS``), joined like the
first, so a summary of 8 numbers still crosses between pieces once.

``incoming`` solves both chains for all pieces at once with ``_scan.scan``
over the pieces' axis (step 2 of the skeleton: context parallelism, after
one all-gather of the summaries); ``link`` takes one step of them (Dask: one
small task per block). Step 3, the fix-up, solves each piece again with its
b and c known (``finish``: the backend's own ``gae`` with ``bootstrap=b`` and
``carry=c``), so every piece's steps are computed in the serial loop's order
by whichever backend serves the piece (the numba kernel on the CPU).
A zero coefficient cuts exactly here too: nothing, NaN included, crosses it.

The same holds one level down for the scan itself (``discounted_cumsum`` and
the estimators on Dask arrays): a piece's summary is its local solution at
the edge the recurrence leaves it by and the product of its coefficients
(``scan_summary``), joined by ``scan_link`` and fixed up by ``scan_finish``.
"""

from __future__ import annotations

import math

from . import backends
from ._compat import device_of
from ._problem import GaeProblem
from ._recurrences import Picker, gae_on_scan, latest_real_values
from ._scan import cut_product, fold_boundary, neighbour, scan

#: A piece's summary, in this order along the last axis.
FIELDS = ("value", "on_value", "edge", "on_bootstrap", "product")


def identity_map(xp, dtype, device):
    """The map of no steps in ``FIELDS`` order, ``[0, 1, 0, 0, 1]`` (``Y -> Y``, ``X -> X``), made on ``device``:
    no host-to-device copy (from a list it would block a torch CUDA caller)."""
    slot = xp.arange(len(FIELDS), device=device)
    return xp.astype((slot == FIELDS.index("on_value")) | (slot == FIELDS.index("product")), dtype)


#: With a decoupled ``critic_lam`` the returns come from a second advantage chain over the same deltas and cuts
#: (``gamma * critic_lam``): its (edge, on_bootstrap, product) follow ``FIELDS``, so such a summary has 8 numbers.
CRITIC_FIELDS = ("critic_edge", "critic_on_bootstrap", "critic_product")


def summarize(p: GaeProblem, solver, chunk_size: int | None = None):
    """Each segment's summary as if nothing came after it: an array (..., n, 5) in the compute dtype, or
    (..., n, 8) when the problem has a ``critic_lam`` (``CRITIC_FIELDS`` last).

    A backend with a ``summarize`` of its own (the numba kernel: one
    read-only pass) computes it; otherwise the summary is read off the
    backend's scan on three variants of the problem stacked on a new axis:
    the problem itself with b = c = 0, and zero rewards and values with
    b = 1, then c = 1 (the responses to unit inputs are the coefficients).
    An empty segment's summary is the identity: (0, 1, 0, 0, 1). The critic's
    chain is summarised as the problem with ``lam = critic_lam`` (its value
    chain is the same, so only its last three numbers are kept).
    """
    if p.critic_lam is None:
        return _summarize_chain(p, solver, chunk_size)
    actor = _summarize_chain(p.replace(critic_lam=None), solver, chunk_size)
    critic = _summarize_chain(p.replace(lam=p.critic_lam, critic_lam=None), solver, chunk_size)
    return p.xp.concat([actor, critic[..., 2:]], axis=-1)


def _summarize_chain(p: GaeProblem, solver, chunk_size):
    if solver.summarize is not None:
        return solver.summarize(p)
    return _summarize_on_scan(p, solver.scan, chunk_size)


def _summarize_on_scan(p: GaeProblem, solve, chunk_size):
    xp = p.xp
    shape = (3, *p.rewards.shape)
    zero, one = xp.zeros_like(p.bootstrap), xp.ones_like(p.bootstrap)

    def variant(name, x):
        if name in ("rewards", "values", "next_values"):  # the inputs: once as given, then zero twice
            return xp.stack([x, xp.zeros_like(x), xp.zeros_like(x)])
        return xp.broadcast_to(x, shape)  # flags and coefficients: the same in all three

    stacked = p.replace(extra={}).map_steps(variant).replace(
        bootstrap=xp.stack([zero, one, zero]), carry=xp.stack([zero, zero, one]), fill_masked=True)
    identity = identity_map(xp, p.rewards.dtype, device_of(p.rewards))
    count = 1 if p.offsets is None else p.offsets.shape[0] - 1
    if p.length == 0:
        return xp.broadcast_to(identity, (*p.rewards.shape[:-1], count, 5))
    advantages, _ = gae_on_scan(stacked, solve=solve, chunk_size=chunk_size)
    pick = Picker(stacked, stacked.rewards, stacked.values)
    latest = latest_real_values(stacked, pick, solve=solve, chunk_size=chunk_size)
    if p.offsets is None:
        starts = xp.zeros((1,), dtype=xp.int64, device=device_of(p.rewards))
    else:  # an empty segment's start may be T: it is read clamped, then replaced by the identity
        starts = xp.minimum(p.offsets[:-1], xp.full((), p.length - 1, dtype=p.offsets.dtype,
                                                    device=device_of(p.offsets)))  # made there: no host copy
    edges = xp.take(advantages, starts, axis=advantages.ndim - 1)
    values = xp.take(latest, starts, axis=latest.ndim - 1)
    summary = xp.stack([values[0], values[1], edges[0], edges[1], edges[2]], axis=-1)
    if p.offsets is None:
        return summary
    empty = p.offsets[1:] == p.offsets[:-1]
    return xp.where(empty[:, None], identity, summary)


def chain_starts(width: int) -> range:
    """Where each advantage chain's (edge, on_bootstrap, product) starts in a summary of ``width`` numbers."""
    return range(2, width, 3)


def incoming(xp, summaries, bootstrap):
    """``(b, c)``, each (..., n): what enters every piece from its right, for pieces laid in time order; with
    ``CRITIC_FIELDS`` in the summaries, ``(b, c, critic_c)``.

    ``summaries`` is (..., n, 5) or (..., n, 8) (see ``FIELDS``); ``bootstrap``
    (broadcastable to (...,)) is the value after the last piece. The chains
    are solved by ``_scan.scan`` along the pieces' axis, exactly (a zero
    coefficient cuts). A piece that ends a sequence is ``close``d first:
    nothing enters it.
    """
    value, on_value = summaries[..., 0], summaries[..., 1]
    last = xp.broadcast_to(xp.asarray(bootstrap, dtype=value.dtype, device=device_of(value)), value.shape[:-1])
    last = xp.expand_dims(last, axis=-1)
    # z_k = value_k + on_value_k b_k with b_k = z_{k+1}: the value chain; b_{n-1} = bootstrap.
    z = scan(xp, fold_boundary(xp, value + xp.zeros_like(value), on_value, last, reverse=True), on_value,
             reverse=True)
    b = xp.concat([z[..., 1:], last], axis=-1)
    carries = []
    for j in chain_starts(summaries.shape[-1]):
        # y_k = edge_k + on_bootstrap_k b_k + product_k y_{k+1}: an advantage chain; c_k = y_{k+1}, c_{n-1} = 0.
        edge, on_bootstrap, product = summaries[..., j], summaries[..., j + 1], summaries[..., j + 2]
        y = scan(xp, edge + cut_product(xp, on_bootstrap, b), product, reverse=True)
        carries.append(neighbour(xp, y, reverse=True))
    return (b, *carries)


def close(xp, summary, bootstrap):
    """The summary (..., 5 or 8) of a piece that ends its sequence: b = bootstrap (...,) and c = 0 in; nothing
    enters."""
    value, on_value = summary[..., 0], summary[..., 1]
    zero = xp.zeros_like(value)
    fields = [value + cut_product(xp, on_value, bootstrap), zero]
    for j in chain_starts(summary.shape[-1]):
        fields += [summary[..., j] + cut_product(xp, summary[..., j + 1], bootstrap), zero, zero]
    return xp.stack(fields, axis=-1)


def link(xp, summary, b, *carries):
    """``(b, c)`` (or ``(b, c, critic_c)``) entering a piece, from the summary (..., 5 or 8) of the piece after it
    and the numbers entering that one."""
    value, on_value = summary[..., 0], summary[..., 1]
    out = [value + cut_product(xp, on_value, b)]
    for j, c in zip(chain_starts(summary.shape[-1]), carries):
        edge, on_bootstrap, product = summary[..., j], summary[..., j + 1], summary[..., j + 2]
        out.append(edge + cut_product(xp, on_bootstrap, b) + cut_product(xp, product, c))
    return tuple(out)


def finish(p: GaeProblem, solver, chunk_size, critic_carry=None):
    """(advantages, returns) of pieces whose b and c are known, as ``p.bootstrap`` and ``p.carry`` (..., n): the
    backend's own gae once more. The backend must take segments and a carry (``Backend.segments``).

    With ``critic_lam`` the returns' chain has a carry of its own, ``critic_carry``
    (..., n): two passes, the advantages with ``lam`` and the returns with
    ``lam = critic_lam`` (``backends.solve_gae``).
    """
    if not solver.segments:
        raise ValueError(f"backend {getattr(solver, 'name', solver)!r} cannot take an incoming carry: pieces are "
                         "solved by a backend with segments (backends.solver(call, segments=True) selects one)")
    return backends.solve_gae(p, solver, chunk_size, critic_carry)


# --- the scan one level down (discounted_cumsum and the estimators' scans) ---------------------------------------


def scan_summary(xp, x, a, *, reverse: bool, solve, chunk_size=None):
    """(edge, product), each (...,): the local solution where the recurrence leaves the piece, and the product of
    its coefficients.

    ``x`` is an array this package owns (the scan may overwrite it); ``a`` a
    float or an array shaped like x.
    """
    length = x.shape[-1]
    if length == 0:  # an empty piece (a Dask block of no steps) lets the carry through: (0, 1)
        return xp.zeros(x.shape[:-1], dtype=x.dtype, device=device_of(x)), xp.ones(x.shape[:-1], dtype=x.dtype,
                                                                                   device=device_of(x))
    y = solve(xp, x, a, reverse=reverse, chunk_size=chunk_size)
    edge = y[..., 0] if reverse else y[..., length - 1]
    if isinstance(a, float):
        try:
            product = a ** length  # a Python float: an underflow is only a cut when a itself is 0
        except OverflowError:  # |a| > 1 (importance-weighted traces): the product overflows, as the loop's would
            product = math.copysign(math.inf, a) if length % 2 else math.inf
        smallest = float(xp.finfo(x.dtype).smallest_normal)
        product = product if product != 0.0 or a == 0.0 else (smallest if a > 0 or length % 2 == 0 else -smallest)
        return edge, xp.full(edge.shape, product, dtype=x.dtype, device=device_of(x))
    return edge, _product_along(xp, a)


def scan_link(xp, edge, product, carry):
    """The carry leaving a piece: ``edge + product * carry`` (a zero product cuts exactly)."""
    return edge + cut_product(xp, product, carry)


def scan_finish(xp, x, a, carry, *, reverse: bool, solve, chunk_size=None):
    """The piece solved with the neighbour's carry (...,) entering through the step next to it."""
    if x.shape[-1] == 0:
        return x
    return solve(xp, fold_boundary(xp, x, a, carry[..., None], reverse=reverse), a, reverse=reverse,
                 chunk_size=chunk_size)


def _product_along(xp, a):
    """The product of a's coefficients along its last axis; an underflow of nonzero ones is kept at the smallest
    normal number of its sign (only a true zero cuts, as ``_scan.nonzero_product`` keeps it within a piece)."""
    product = xp.prod(a, axis=-1)
    smallest = xp.asarray(xp.finfo(a.dtype).smallest_normal, dtype=a.dtype, device=device_of(a))
    odd = xp.sum(xp.astype(a < 0, xp.int64), axis=-1) % 2 == 1
    underflow = (product == 0) & xp.all(a != 0, axis=-1)
    return xp.where(underflow, xp.where(odd, -smallest, smallest), product)

