"""Dask arrays: the chunk scan's three steps as Dask's own graph, one task per block and step.

A Dask array chunked along time (and batch) is a row of pieces that live
apart (``gae_xp._pieces``), one per block:

1. **summaries**: one ``blockwise`` task per block runs gae_xp on the block's
   NumPy (or CuPy) arrays, so the backend that serves those arrays does the
   work (the numba kernel on NumPy), and returns the block's summary, five
   numbers per row (for the scan one level down: its ``edge`` and ``product``,
   the two of them that a scan needs);
2. **carry**: the blocks' summaries are joined from the last time block to the
   first, one small task per block (``_pieces.link``); each waits only for the
   blocks after it, so a computation can stream through the blocks from the
   end instead of holding them all;
3. **fix-up**: one ``blockwise`` task per block solves the block again with
   what enters it (``_pieces.finish`` / ``_pieces.scan_finish``).

Each stage is one layer of a ``HighLevelGraph`` (the chain's tasks are
written out in one dictionary), so building the graph and computing it are
linear in the number of blocks: the graph grows with the blocks, not with
T/C, and no graph is merged once per block. Nothing is computed while it is
built (``prepare`` reads no value of a Dask array). Blocks of no steps (as
after boolean indexing and ``compute_chunk_sizes()``) let what enters them
through. A decoupled ``critic_lam`` is a second chain in the same tasks (8
numbers per row and block). The results are lazy Dask arrays chunked like
the rewards. Dask is imported only here, when Dask arrays arrive. Packed
sequences (``cu_seqlens``) are not supported on Dask arrays.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import string

from gae_xp import _pieces
from gae_xp._compat import array_namespace, is_dask_array
from gae_xp._problem import GaeProblem

NAME = "dask"


class DaskBackend:
    name = NAME
    segments = False  # packed sequences are refused; its blocks are joined by its own graph
    uses_chunk_size = False
    critic_lam = True
    summarize = None

    def unavailable_reason(self, xp, arrays, *, forced=False):
        if not any(is_dask_array(a) for a in arrays):
            return "the dask backend takes Dask arrays"
        return None

    def gae(self, problem, *, chunk_size):
        p = problem
        if p.offsets is not None:
            raise ValueError("packed sequences (cu_seqlens) are not supported on Dask arrays")
        if p.rewards.shape[-1] == 0 or p.rewards.numblocks[-1] == 1:
            return _whole(p, chunk_size)
        names, arrays = _per_step_arrays(p)
        index = _index(p.rewards.ndim)
        pairs = [x for array in arrays for x in (array, index)]
        spec = _Spec.of(names, p, chunk_size)
        dtype = p.rewards.dtype
        width = len(_pieces.FIELDS) + (0 if p.critic_lam is None else len(_pieces.CRITIC_FIELDS))
        # 1. one task per block: its summary, (..., 1, 5) per block (8 with critic_lam)
        summaries = _blockwise(functools.partial(_summary_block, spec), index + "s", pairs, dtype,
                               new_axes={"s": width}, adjust_chunks={index[-1]: 1})
        # 2. what enters each block, (..., 1, 1 + chains) per block: one small task per block from the last one back
        bootstrap = p.bootstrap[..., 0].rechunk(p.rewards.chunks[:-1])
        entering = _chain(summaries, bootstrap, len(_pieces.chain_starts(width)))
        # 3. one task per block: the block again with (b, c) entering it
        stacked = _blockwise(functools.partial(_finish_block, spec), "o" + index, [*pairs, entering, index + "s"],
                             dtype, new_axes={"o": 2})
        return stacked[0], stacked[1]

    def scan(self, xp, x, a, *, reverse, chunk_size):
        if x.shape[-1] == 0 or x.numblocks[-1] == 1:
            return x.map_blocks(functools.partial(_scan_whole_block, reverse, chunk_size, a), dtype=x.dtype) \
                if isinstance(a, float) else \
                x.map_blocks(functools.partial(_scan_whole_block, reverse, chunk_size, None),
                             _aligned(a, x), dtype=x.dtype)
        index = _index(x.ndim)
        pairs = [x, index] if isinstance(a, float) else [x, index, _aligned(a, x), index]
        constant = a if isinstance(a, float) else None
        summaries = _blockwise(functools.partial(_scan_summary_block, reverse, chunk_size, constant), index + "s",
                               pairs, x.dtype, new_axes={"s": 2}, adjust_chunks={index[-1]: 1})
        carries = _scan_chain(summaries, reverse)
        return _blockwise(functools.partial(_scan_finish_block, reverse, chunk_size, constant), index,
                          [*pairs, carries, index], x.dtype)


# --- building the graph ------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class _Spec:
    """What a block's task needs besides its arrays: which per-step arrays it gets, and the problem's constants."""

    names: tuple
    #: the problem without its per-step arrays and boundary values (its floats and options), as a template
    template: GaeProblem
    chunk_size: int | None

    @classmethod
    def of(cls, names, p: GaeProblem, chunk_size):
        absent = dict.fromkeys(names)
        return cls(tuple(names), p.replace(xp=None, bootstrap=None, carry=None, **absent), chunk_size)


def _per_step_arrays(p: GaeProblem):
    """(names, arrays): the problem's per-step Dask arrays, rechunked like the rewards."""
    steps = p.steps()
    return list(steps), [_aligned(value, p.rewards) for value in steps.values()]


def _aligned(value, like):
    """value (a Dask array shaped like ``like``) chunked like ``like``."""
    return value if value.chunks == like.chunks else value.rechunk(like.chunks)


def _index(ndim: int) -> str:
    """blockwise index letters: batch axes, then "t" for time."""
    return string.ascii_lowercase[:ndim - 1] + "t"


def _blockwise(function, out_index, pairs, dtype, **options):
    import dask.array as da
    from dask.array.utils import meta_from_array

    meta = meta_from_array(pairs[0], ndim=len(out_index), dtype=dtype)
    return da.blockwise(function, out_index, *pairs, dtype=dtype, meta=meta, align_arrays=False,
                        concatenate=True, **options)


def _chain(summaries, bootstrap, chains: int):
    """(..., n_blocks, 1 + chains), chunked 1 along blocks: the (b, c[, critic_c]) entering each block, by
    ``_pieces.link`` from the last block back: one task per block, all in one graph layer."""
    count = summaries.numblocks[-2]
    name = "gae-xp-chain-" + _token(summaries, bootstrap)
    tasks = {}
    for rows in itertools.product(*map(range, summaries.numblocks[:-2])):
        tasks[(name, *rows, count - 1, 0)] = (_last_entering, (bootstrap.name, *rows), chains)
        for j in range(count - 2, -1, -1):
            tasks[(name, *rows, j, 0)] = (_link_block, (summaries.name, *rows, j + 1, 0), (name, *rows, j + 1, 0))
    chunks = (*summaries.chunks[:-2], (1,) * count, (1 + chains,))
    return _layer(name, tasks, [summaries, bootstrap], chunks, summaries)


def _scan_chain(summaries, reverse: bool):
    """Each block's incoming carry, (..., n_blocks) chunked 1 along blocks: one link task per block, in one graph
    layer."""
    count = summaries.numblocks[-2]
    name = "gae-xp-scan-chain-" + _token(summaries, reverse)
    first = count - 1 if reverse else 0
    order = range(count - 2, -1, -1) if reverse else range(1, count)
    tasks = {}
    for rows in itertools.product(*map(range, summaries.numblocks[:-2])):
        tasks[(name, *rows, first)] = (_zero_carry, (summaries.name, *rows, first, 0))
        for j in order:
            neighbour = j + 1 if reverse else j - 1
            tasks[(name, *rows, j)] = (_scan_link_block, (summaries.name, *rows, neighbour, 0),
                                       (name, *rows, neighbour))
    chunks = (*summaries.chunks[:-2], (1,) * count)
    return _layer(name, tasks, [summaries], chunks, summaries)


def _token(*parts) -> str:
    from dask.base import tokenize

    return tokenize(*parts)


def _layer(name, tasks, dependencies, chunks, like):
    """A Dask array made of one new graph layer of ``tasks`` over ``dependencies``."""
    import dask.array as da
    from dask.array.utils import meta_from_array
    from dask.highlevelgraph import HighLevelGraph

    graph = HighLevelGraph.from_collections(name, tasks, dependencies=dependencies)
    return da.Array(graph, name, chunks, meta=meta_from_array(like, ndim=len(chunks)))


def _whole(p: GaeProblem, chunk_size):
    """One block along time: the block's own backend on each block, no carry."""
    names, arrays = _per_step_arrays(p)
    index = _index(p.rewards.ndim)
    pairs = [x for array in arrays for x in (array, index)]
    bootstrap = p.bootstrap[..., 0].rechunk(p.rewards.chunks[:-1])
    stacked = _blockwise(functools.partial(_finish_block, _Spec.of(names, p, chunk_size)), "o" + index,
                         [*pairs, bootstrap, index[:-1], None, None], p.rewards.dtype, new_axes={"o": 2})
    return stacked[0], stacked[1]


# --- the tasks (module-level functions of NumPy/CuPy blocks: picklable for dask.distributed) -----------------------


def _block_problem(spec: _Spec, blocks, bootstrap, carry=None) -> GaeProblem:
    named = dict(zip(spec.names, blocks))
    xp = array_namespace(named["rewards"])
    return spec.template.replace(xp=xp, bootstrap=xp.expand_dims(bootstrap, axis=-1),
                                 carry=None if carry is None else xp.expand_dims(carry, axis=-1), **named)


def _solver(blocks):
    from gae_xp import backends

    xp = array_namespace(blocks[0])
    return _SingleThreaded(backends.select("auto", xp, list(blocks), segments=True))


class _SingleThreaded:
    """A block's backend, run without a thread pool of its own: Dask already runs the blocks in parallel. It is
    guarded (``backends.Guarded``): where its compiler fails inside a task, the block is solved on the generic
    path, so a broken compiler never fails the graph."""

    def __init__(self, backend):
        from gae_xp import backends

        guarded = backends.Guarded(backend)
        self.backend, self.name, self.segments = backend, backend.name, backend.segments
        self.critic_lam = backend.critic_lam
        self.summarize = None if guarded.summarize is None else self._wrap(guarded.summarize)
        self.gae, self.scan = self._wrap(guarded.gae), self._wrap(guarded.scan)

    @staticmethod
    def _wrap(method):
        from gae_xp.backends import single_threaded

        def call(*args, **kwargs):
            with single_threaded():
                return method(*args, **kwargs)

        return call


def _summary_block(spec: _Spec, *blocks):
    xp = array_namespace(blocks[0])
    zero = xp.zeros(blocks[0].shape[:-1], dtype=blocks[0].dtype)
    problem = _block_problem(spec, blocks, zero)
    return _pieces.summarize(problem, _solver(blocks), spec.chunk_size)  # (..., 1, 5)


def _finish_block(spec: _Spec, *blocks):
    *arrays, entering = blocks
    if entering is None:  # one block along time: the bootstrap value alone enters (``_whole``)
        arrays, b = arrays[:-1], arrays[-1]
        carries = [None, None]
    else:  # (..., 1, 1 + chains)
        b, *carries = (entering[..., 0, j] for j in range(entering.shape[-1]))
        carries += [None] * (2 - len(carries))
    problem = _block_problem(spec, arrays, b, carries[0])
    critic = None if carries[1] is None else problem.xp.expand_dims(carries[1], axis=-1)
    return problem.xp.stack(_pieces.finish(problem, _solver(arrays), spec.chunk_size, critic))


def _last_entering(bootstrap, chains: int):
    """What enters the last block: the bootstrap value, and no advantage."""
    xp = array_namespace(bootstrap)
    return xp.stack([bootstrap, *([xp.zeros_like(bootstrap)] * chains)], axis=-1)[..., None, :]


def _link_block(summary, entering):
    xp = array_namespace(summary)
    linked = _pieces.link(xp, summary[..., 0, :], *(entering[..., 0, j] for j in range(entering.shape[-1])))
    return xp.stack(linked, axis=-1)[..., None, :]


def _scan_inputs(constant, blocks):
    """(x as this package's own copy, a) of a block's task arguments."""
    xp = array_namespace(blocks[0])
    x = xp.astype(blocks[0], blocks[0].dtype, copy=True)  # the scan may overwrite x; a block is not ours
    return xp, x, constant if constant is not None else blocks[1]


def _scan_whole_block(reverse, chunk_size, constant, *blocks):
    xp, x, a = _scan_inputs(constant, blocks)
    return _solver(blocks).scan(xp, x, a, reverse=reverse, chunk_size=chunk_size)


def _scan_summary_block(reverse, chunk_size, constant, *blocks):
    xp, x, a = _scan_inputs(constant, blocks)
    edge, product = _pieces.scan_summary(xp, x, a, reverse=reverse, solve=_solver(blocks).scan, chunk_size=chunk_size)
    return xp.stack([edge, product], axis=-1)[..., None, :]  # (..., 1, 2)


def _zero_carry(summary):
    """No carry enters the block the recurrence starts from."""
    return array_namespace(summary).zeros_like(summary[..., 0, 0:1])


def _scan_link_block(summary, carry):
    return _pieces.scan_link(array_namespace(summary), summary[..., 0, 0:1], summary[..., 0, 1:2], carry)


def _scan_finish_block(reverse, chunk_size, constant, *blocks):
    *arrays, carry = blocks
    xp, x, a = _scan_inputs(constant, arrays)
    return _pieces.scan_finish(xp, x, a, carry[..., 0], reverse=reverse, solve=_solver(arrays).scan,
                               chunk_size=chunk_size)


BACKEND = DaskBackend()
