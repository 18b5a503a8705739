"""Dask arrays: the chunk scan's three steps as Dask's own graph, one task per block and step.

A Dask array chunked along time (and batch) is a row of pieces that live
apart (``gae_xp._pieces``), one per block:

1. **summaries**: one ``blockwise`` task per block runs gae_xp on the block's
   NumPy (or CuPy) arrays, so the backend that serves those arrays does the
   work (the numba kernel on NumPy), and returns the block's five numbers per
   row (for the scan: its edge value and product, two numbers);
2. **carry**: the blocks' summaries are joined from the last time block to the
   first, one small task per block (``_pieces.link``); each waits only for the
   blocks after it, so a computation can stream through the blocks from the
   end instead of holding them all;
3. **fix-up**: one ``blockwise`` task per block solves the block again with
   what enters it (``_pieces.finish`` / ``_pieces.scan_finish``).

The graph grows with the number of blocks, not with T/C, and nothing is
computed while it is built (``prepare`` reads no value of a Dask array). The
results are lazy Dask arrays chunked like the rewards. Dask is imported only
here, when Dask arrays arrive. Packed sequences (``cu_seqlens``) are not
supported on Dask arrays.
"""

from __future__ import annotations

import dataclasses
import functools
import string

from gae_xp import _pieces
from gae_xp._compat import array_namespace, is_dask_array
from gae_xp._problem import GaeProblem

NAME = "dask"


class DaskBackend:
    name = NAME
    segments = False  # packed sequences are refused; its blocks are joined by its own graph
    uses_chunk_size = False
    critic_lam = False
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
        # 1. one task per block: its summary, (..., 1, 5) per block
        summaries = _blockwise(functools.partial(_summary_block, spec), index + "s", pairs, dtype,
                               new_axes={"s": len(_pieces.FIELDS)}, adjust_chunks={index[-1]: 1})
        # 2. the carry, one small task per block from the last one back
        bootstrap = p.bootstrap[..., 0].rechunk(p.rewards.chunks[:-1])
        b, c = _chain(p.xp, summaries, bootstrap)
        # 3. one task per block: the block again with (b, c) entering it
        stacked = _blockwise(functools.partial(_finish_block, spec), "o" + index, [*pairs, b, index, c, index], dtype,
                             new_axes={"o": 2})
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


def _chain(xp, summaries, bootstrap):
    """(b, c), each (..., n_blocks) chunked 1 along blocks: ``_pieces.link`` from the last block back, one task each."""
    import dask.array as da

    count = summaries.shape[-2]
    entering = [None] * count
    entering[-1] = da.stack([bootstrap, da.zeros_like(bootstrap)], axis=-1).rechunk({bootstrap.ndim: 2})
    for j in range(count - 2, -1, -1):
        after = summaries[..., j + 1, :]
        entering[j] = da.map_blocks(_link_block, after, entering[j + 1], dtype=summaries.dtype,
                                    chunks=entering[j + 1].chunks)
    b = da.stack([e[..., 0] for e in entering], axis=-1)
    c = da.stack([e[..., 1] for e in entering], axis=-1)
    return b, c


def _scan_chain(summaries, reverse: bool):
    """Each block's incoming carry, (..., n_blocks) chunked 1 along blocks: one link task per block."""
    import dask.array as da

    count = summaries.shape[-2]
    carries = [None] * count
    first = count - 1 if reverse else 0
    carries[first] = da.zeros_like(summaries[..., first, 0])
    order = range(count - 2, -1, -1) if reverse else range(1, count)
    for j in order:
        neighbour = j + 1 if reverse else j - 1
        carries[j] = da.map_blocks(_scan_link_block, summaries[..., neighbour, 0], summaries[..., neighbour, 1],
                                   carries[neighbour], dtype=summaries.dtype)
    return da.stack(carries, axis=-1)


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
    """A block's backend, run without a thread pool of its own: Dask already runs the blocks in parallel."""

    def __init__(self, backend):
        self.backend, self.name, self.segments = backend, backend.name, backend.segments
        self.critic_lam = backend.critic_lam
        self.summarize = None if backend.summarize is None else self._wrap(backend.summarize)
        self.gae, self.scan = self._wrap(backend.gae), self._wrap(backend.scan)

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
    *arrays, b, c = blocks
    b = b[..., 0] if b.ndim == arrays[0].ndim else b
    c = None if c is None else c[..., 0]
    problem = _block_problem(spec, arrays, b, c)
    return problem.xp.stack(_pieces.finish(problem, _solver(arrays), spec.chunk_size))


def _link_block(summary, entering):
    xp = array_namespace(summary)
    b, c = _pieces.link(xp, summary, entering[..., 0], entering[..., 1])
    return xp.stack([b, c], axis=-1)


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


def _scan_link_block(edge, product, carry):
    return _pieces.scan_link(array_namespace(edge), edge, product, carry)


def _scan_finish_block(reverse, chunk_size, constant, *blocks):
    *arrays, carry = blocks
    xp, x, a = _scan_inputs(constant, arrays)
    return _pieces.scan_finish(xp, x, a, carry[..., 0], reverse=reverse, solve=_solver(arrays).scan,
                               chunk_size=chunk_size)


BACKEND = DaskBackend()
