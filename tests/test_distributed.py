"""Context parallelism and whitening across ranks: real multi-process runs on the gloo backend (CPU), and JAX.

Each test spawns 2-4 processes that join one gloo group through a file
store (no port to pick) and run a list of scenarios on their shards: every
rank's result is compared with the single-process function (and the float64
oracle) on the gathered sequence, and the hostile scenarios check that a
peer's bad argument or a disagreement raises a clear error on *every* rank.
A process that hangs is killed after ``TIMEOUT`` seconds and fails the test;
the group's own timeout is shorter, so a collective left waiting raises
(and fails the scenario) instead of hanging the run. The JAX tests run
``jax.shard_map`` over 4 host devices in a subprocess (``XLA_FLAGS`` must be
set before jax is imported).
"""

from __future__ import annotations

import importlib
import multiprocessing
import os
import subprocess
import sys
import textwrap
import traceback
import warnings
from datetime import timedelta

import numpy as np
import pytest

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")
pytestmark = pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(),
                                reason="torch.distributed with gloo is not available")

#: The harness's limit per test (a hung rank is killed), and the gloo group's (a waiting collective raises).
TIMEOUT = 240
GROUP_TIMEOUT = 60

CASES = {
    "plain": {},
    "dones+holes": {"holes": 0.3, "dones": 0.03, "bootstrap": True},
    "masked across shards": {"masked_run": True, "dones": 0.02, "bootstrap": True},
    "dones at shard edges": {"edge_dones": True, "holes": 0.1, "bootstrap": True},
    "per-step gamma": {"per_step_gamma": True, "dones": 0.02, "holes": 0.2},
    "next_values": {"next_values": True, "holes": 0.2},
    "fill_masked": {"holes": 0.3, "bootstrap": True, "fill_masked": True},
    "critic_lam": {"holes": 0.2, "dones": 0.03, "bootstrap": True, "critic_lam": True},
}


def make_case(seed, world, name, *, batch=3, per_chunk=37, dtype=np.float64):
    rng = np.random.default_rng(seed)
    options = CASES[name]
    length = 2 * world * per_chunk
    shape = (batch, length)
    case = {"rewards": rng.standard_normal(shape), "values": rng.standard_normal(shape), "gamma": 0.99, "lam": 0.95}
    mask = np.ones(shape, bool)
    if options.get("holes"):
        mask &= rng.random(shape) >= options["holes"]
    if options.get("masked_run"):  # a masked run over two chunk edges, and one over a whole chunk
        mask[:, per_chunk - 5:3 * per_chunk + 4] = False
        mask[1, :] = True
    if not mask.all():
        case["mask"] = mask
    if options.get("dones"):
        case["terminated"] = rng.random(shape) < options["dones"]
        case["truncated"] = rng.random(shape) < options["dones"]
    if options.get("edge_dones"):
        edges = np.arange(per_chunk - 1, length, per_chunk)
        case["terminated"] = np.zeros(shape, bool)
        case["terminated"][0, edges] = True
        case["truncated"] = np.zeros(shape, bool)
        case["truncated"][2, edges + 1 if edges[-1] + 1 < length else edges] = True
    if options.get("per_step_gamma"):
        case["gamma"] = rng.uniform(0.5, 1.0, shape)
        case["lam"] = rng.uniform(0.0, 1.0, (batch, 1))
    if options.get("next_values"):
        case["next_values"] = rng.standard_normal(shape)
    elif "truncated" in case:  # random truncations, no final observations
        case["truncated_bootstrap"] = "next_step"
    if options.get("bootstrap"):
        case["bootstrap_value"] = rng.standard_normal(batch)
    if options.get("fill_masked"):
        case["fill_masked"] = True
    if options.get("critic_lam"):
        case["critic_lam"] = 1.0
    return {k: v.astype(dtype) if isinstance(v, np.ndarray) and v.dtype == np.float64 else v for k, v in case.items()}


def packed_case(seed, world, layout, *, batch=2, count=7, empty=False, dtype=np.float64):
    """Packed sequences: random lengths (multiples of 2W for zigzag), holes and dones, a bootstrap per sequence;
    with ``empty``, empty sequences first, last and inside (and, contiguous, one at a shard edge)."""
    rng = np.random.default_rng(seed)
    unit = 2 * world if layout == "zigzag" else 1
    lengths = unit * rng.integers(1, 40, size=count)
    if empty:
        lengths[[0, count // 2, count - 1]] = 0
    if layout == "contiguous":  # make the total a multiple of W, with sequences falling across shard edges
        lengths[-2] += (-lengths.sum()) % world
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    if empty and layout == "contiguous":  # an empty sequence at the first shard edge
        edge = int(offsets[-1]) // world
        offsets = np.sort(np.concatenate([offsets, [edge, edge]]))
    shape = (batch, int(offsets[-1]))
    case = {"rewards": rng.standard_normal(shape).astype(dtype), "values": rng.standard_normal(shape).astype(dtype),
            "mask": rng.random(shape) >= 0.25, "terminated": rng.random(shape) < 0.02,
            "bootstrap_value": rng.standard_normal((batch, len(offsets) - 1)).astype(dtype)}
    return case, offsets


def shard(x, layout, world, rank, offsets=None):
    """This rank's part of a global (..., T) array in the layout."""
    if not isinstance(x, np.ndarray) or x.shape[-1] == 1 or x.ndim == 1:
        return x
    if offsets is None:
        offsets = np.array([0, x.shape[-1]])
    if layout == "contiguous":
        size = x.shape[-1] // world
        return x[..., rank * size:(rank + 1) * size]
    parts = []
    for start, stop in zip(offsets[:-1], offsets[1:]):
        size = (stop - start) // (2 * world)
        parts += [x[..., start + rank * size:start + (rank + 1) * size],
                  x[..., start + (2 * world - 1 - rank) * size:start + (2 * world - rank) * size]]
    return np.concatenate(parts, axis=-1)


def rank_inputs(case, layout, world, rank, offsets=None):
    """The case as this rank passes it: per-step arrays sharded, every array a torch tensor."""
    length = case["rewards"].shape[-1]
    out = {}
    for key, value in case.items():
        if isinstance(value, np.ndarray):
            if value.ndim == 2 and value.shape[-1] == length:
                value = shard(value, layout, world, rank, offsets)
            value = torch.from_numpy(np.ascontiguousarray(value))
        out[key] = value
    return out


class Checks:
    """Failures collected on one rank: numbers against the single-process result, errors against what is due."""

    def __init__(self, rank):
        self.rank, self.failures = rank, []

    def close(self, label, got, want, atol):
        """got within atol of want, with want's NaN in the same places (and no other non-finite value)."""
        got = got.numpy() if isinstance(got, torch.Tensor) else got
        if got.shape != want.shape:
            self.failures.append(f"rank {self.rank} {label}: shape {got.shape}, {want.shape} due")
            return
        same_nan = np.array_equal(np.isnan(got), np.isnan(want))
        error = float(np.max(np.abs(got - want)[~np.isnan(want)], initial=0.0))
        if not same_nan or not error <= atol:
            self.failures.append(f"rank {self.rank} {label}: max error {error:.3g} > {atol:.3g}"
                                 + ("" if same_nan else ", NaN elsewhere than due"))

    def raises(self, label, kind, match, call):
        """``call()`` must raise ``kind`` with ``match`` (a string, or several) in its message, promptly (not at
        the group's timeout)."""
        try:
            call()
        except kind as error:
            for part in (match,) if isinstance(match, str) else match:
                if part not in str(error):
                    self.failures.append(f"rank {self.rank} {label}: {kind.__name__} without {part!r}: {error}")
        except Exception as error:  # noqa: BLE001 (a wrong exception is the failure reported)
            self.failures.append(f"rank {self.rank} {label}: expected {kind.__name__}, got "
                                 f"{type(error).__name__}: {error}")
        else:
            self.failures.append(f"rank {self.rank} {label}: expected {kind.__name__}, nothing was raised")


# --- the scenarios (run on every rank) -------------------------------------------------------------------------------


def scenario_layouts(check, rank, world):
    """Every case of CASES on both layouts, float32, packed sequences (empty ones too); at world size 2 on both
    backends and with the offsets in every form, at 4 (twice the processes on the same cores) on auto only."""
    import gae_xp
    import gae_xp.distributed as cp
    from gae_xp.reference import gae_loop

    thorough = world == 2
    for layout in cp.LAYOUTS:
        context = cp.Context(layout=layout)
        for name in CASES:
            for backend in ("auto", "xp") if thorough else ("auto",):
                case = make_case(list(CASES).index(name), world, name)
                want_a, want_r = gae_xp.gae(**case, backend="xp")
                a, r = cp.gae(**rank_inputs(case, layout, world, rank), context=context, backend=backend)
                label = f"{layout} {name} {backend}"
                check.close(label + " advantages", a, shard(want_a, layout, world, rank), 1e-12)
                check.close(label + " returns", r, shard(want_r, layout, world, rank), 1e-12)
                if name == "critic_lam":  # against the oracle loop too: the returns come from lambda = 1
                    loop_a, loop_r = gae_loop(**case)
                    check.close(label + " returns vs loop", r, shard(loop_r, layout, world, rank), 1e-10)
        # float32: no worse than the float32 serial loop (against the float64 oracle)
        case = make_case(7, world, "dones+holes", dtype=np.float64, per_chunk=512)
        want, _ = gae_loop(**case)
        single = {k: v.astype(np.float32) if isinstance(v, np.ndarray) and v.dtype == np.float64 else v
                  for k, v in case.items()}
        loop, _ = gae_loop(**single)
        a, _ = cp.gae(**rank_inputs(single, layout, world, rank), context=context)
        check.close(f"{layout} float32", a, shard(want, layout, world, rank), float(np.abs(loop - want).max()))
        # packed sequences: offsets as a tensor, a NumPy array and a list; empty sequences; critic_lam
        forms = ((11, False, "tensor"), (12, True, "numpy"), (13, True, "list")) if thorough else ((13, True, "list"),)
        for seed, empty, form in forms:
            case, offsets = packed_case(seed, world, layout, empty=empty)
            given = {"tensor": torch.from_numpy(offsets), "numpy": offsets, "list": offsets.tolist()}[form]
            packed = cp.Context(layout=layout, cu_seqlens=given)
            for extra in ({}, {"critic_lam": 0.9}):
                want_a, want_r = gae_xp.gae(**case, **extra, cu_seqlens=offsets, backend="xp")
                a, r = cp.gae(**rank_inputs(case, layout, world, rank, offsets), **extra, context=packed)
                label = f"{layout} packed ({form}{', empty sequences' if empty else ''}{', critic_lam' * bool(extra)})"
                check.close(label, a, shard(want_a, layout, world, rank, offsets), 1e-12)
                check.close(label + " returns", r, shard(want_r, layout, world, rank, offsets), 1e-12)


def scenario_exchange(check, rank, world):
    """A payload larger than the first exchange's capacity: correct, and one collective per call once it grew;
    the former call form (deprecated) gives the same numbers."""
    import gae_xp
    import gae_xp.distributed as cp
    from gae_xp.distributed import _exchange

    calls = []
    original = _exchange.all_gather_flat

    def counting(out, flat, group=None):
        calls.append(flat.shape[0])
        original(out, flat, group=group)

    _exchange.all_gather_flat = counting
    try:
        context = cp.Context(layout="zigzag")
        case = make_case(21, world, "dones+holes", batch=8)  # 8 rows x 2 pieces x 5 > 48 numbers
        want_a, _ = gae_xp.gae(**case, backend="xp")
        for attempt in range(2):
            calls.clear()
            a, _ = cp.gae(**rank_inputs(case, "zigzag", world, rank), context=context)
            check.close(f"large payload, call {attempt}", a, shard(want_a, "zigzag", world, rank), 1e-12)
            due = 2 if attempt == 0 else 1
            if len(calls) != due:
                check.failures.append(f"rank {rank} large payload, call {attempt}: {len(calls)} collectives, "
                                      f"{due} due")
        calls.clear()
        small = make_case(22, world, "plain")
        cp.gae(**rank_inputs(small, "contiguous", world, rank))
        if len(calls) != 1:
            check.failures.append(f"rank {rank} small payload: {len(calls)} collectives, 1 due")
    finally:
        _exchange.all_gather_flat = original
    case, offsets = packed_case(23, world, "contiguous")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        a, _ = cp.gae(**rank_inputs(case, "contiguous", world, rank, offsets), layout="contiguous",
                      cu_seqlens=torch.from_numpy(offsets))
    if not any(issubclass(w.category, DeprecationWarning) for w in caught):
        check.failures.append(f"rank {rank}: the former call form gave no DeprecationWarning")
    want_a, _ = gae_xp.gae(**case, cu_seqlens=offsets, backend="xp")
    check.close("former call form", a, shard(want_a, "contiguous", world, rank, offsets), 1e-12)


def scenario_hostile(check, rank, world):
    """Bad arguments on one rank, and ranks that disagree: a clear error on every rank, then the group still works."""
    import gae_xp
    import gae_xp.distributed as cp

    case = make_case(31, world, "dones+holes")
    mine = rank_inputs(case, "contiguous", world, rank)
    last = world - 1
    context = cp.Context()

    def call(**changes):
        return lambda: cp.gae(**{**mine, **changes}, context=context)

    # one rank's own argument check fails: that rank raises its error, every other rank raises it too, at once
    own = "gamma must be in [0, 1], got 1.5"
    check.raises("bad gamma on the last rank", ValueError, own if rank == last else (f"rank {last} of {world} failed",
                                                                                     own),
                 call(gamma=1.5 if rank == last else 0.99))
    check.raises("a NumPy array on rank 0", TypeError, "torch tensors" if rank == 0 else "rank 0 of",
                 call(rewards=mine["rewards"].numpy() if rank == 0 else mine["rewards"]))
    check.raises("truncated without next_values", ValueError, "truncated is given without next_values",
                 call(truncated_bootstrap="next_values"))
    check.raises("an unknown option on rank 0", TypeError, "unexpected keyword" if rank == 0 else "rank 0 of",
                 lambda: cp.gae(**mine, context=context, **({"gama": 0.9} if rank == 0 else {})))
    # ranks that disagree: batch size, dtype, critic_lam, Context
    rows = mine["rewards"].shape[0] - (1 if rank == 0 else 0)
    smaller = {k: v[:rows] if isinstance(v, torch.Tensor) and v.ndim == 2 else v for k, v in mine.items()}
    smaller = {k: v[:rows] if k == "bootstrap_value" else v for k, v in smaller.items()}
    check.raises("batch sizes differ", ValueError, "batch shape", lambda: cp.gae(**smaller, context=context))
    typed = {k: v.float() if rank == 0 and isinstance(v, torch.Tensor) and v.is_floating_point() else v
             for k, v in mine.items()}
    check.raises("dtypes differ", ValueError, "float32 on rank 0", lambda: cp.gae(**typed, context=context))
    check.raises("critic_lam on rank 0 only", ValueError, "critic_lam",
                 call(**({"critic_lam": 1.0} if rank == 0 else {})))
    other = cp.Context(layout="zigzag" if rank == 0 else "contiguous")
    check.raises("layouts differ", ValueError, "Context", lambda: cp.gae(**mine, context=other))
    # a Context whose offsets are wrong on one rank: raised by the call, on every rank
    total = case["rewards"].shape[-1]
    offsets = [0, 5, 3, total] if rank == last else [0, 5, total]
    bad = cp.Context(cu_seqlens=offsets)
    unbootstrapped = {k: v for k, v in mine.items() if k != "bootstrap_value"}
    check.raises("bad offsets on the last rank", ValueError,
                 "non-decreasing" if rank == last else f"rank {last} of", lambda: cp.gae(**unbootstrapped, context=bad))
    check.raises("offsets that do not fit the shards", ValueError, "cu_seqlens ends at",
                 lambda: cp.gae(**unbootstrapped, context=cp.Context(cu_seqlens=[0, 5, total + 1])))
    # and the group still works
    want_a, _ = gae_xp.gae(**case, backend="xp")
    a, _ = cp.gae(**mine, context=context)
    check.close("after the errors", a, shard(want_a, "contiguous", world, rank), 1e-12)


def scenario_whiten(check, rank, world):
    """Distributed whiten equals gae_xp.whiten over the gathered entries: bool masks, weights, an empty rank,
    every option; a dtype that differs raises on every rank."""
    import gae_xp
    import gae_xp.distributed as cp

    rng = np.random.default_rng(41)
    shape = (3, 50)
    xs = [rng.normal(3.0, 2.0, shape) for _ in range(world)]
    masks = [rng.random(shape) < 0.6 for _ in range(world)]
    masks[1] = np.zeros(shape, bool)  # an empty rank
    xs[1][0, 0] = np.nan  # in a masked entry: must not leak
    weights = [rng.uniform(0, 2, shape) * m for m in masks]
    everyone = np.concatenate(xs, axis=-1)

    def mine(full):
        return full[..., rank * shape[-1]:(rank + 1) * shape[-1]]

    for label, masked in (("no mask", None), ("bool mask", masks), ("weights", weights)):
        for options in ({}, {"unbiased": False, "shift_mean": False}, {"masked_fill": None, "eps": 0.0}):
            if masked is None and options.get("masked_fill", 0.0) is None:
                continue
            full_mask = None if masked is None else np.concatenate(masked, axis=-1)
            want = gae_xp.whiten(np.where(np.isnan(everyone), 0.0, everyone) if masked is None else everyone,
                                 full_mask, **options)
            x = torch.from_numpy(np.where(np.isnan(xs[rank]), 0.0, xs[rank]) if masked is None else xs[rank])
            got = cp.whiten(x, None if masked is None else torch.from_numpy(masked[rank]), **options)
            check.close(f"whiten {label} {options}", got, mine(want), 1e-12)
    got = cp.whiten(torch.from_numpy(xs[rank]).float(), torch.from_numpy(masks[rank]))
    want = gae_xp.whiten(everyone.astype(np.float32), np.concatenate(masks, axis=-1))
    check.close("whiten float32", got, mine(want), 1e-5)
    # a mean 10^6 standard deviations away from 0: a sum of squares minus a squared sum would lose every digit
    far = [1e6 + rng.standard_normal(shape) for _ in range(world)]
    exact = np.concatenate(far, axis=-1).astype(np.longdouble)
    exact = ((exact - exact.mean()) / np.sqrt(((exact - exact.mean()) ** 2).sum() / (exact.size - 1)))
    check.close("whiten far from 0", cp.whiten(torch.from_numpy(far[rank]), eps=0.0), mine(exact.astype(np.float64)),
                1e-9)
    x = torch.from_numpy(xs[rank])
    check.raises("whiten dtypes differ", ValueError, "dtype", lambda: cp.whiten(x.float() if rank == 0 else x))
    check.raises("whiten mask of another shape on rank 0", ValueError,
                 "mask must have the shape of x" if rank == 0 else "rank 0 of",
                 lambda: cp.whiten(x, torch.ones(x.shape[0] + (rank == 0), x.shape[1], dtype=torch.bool)))
    check.close("whiten after the errors", cp.whiten(x, torch.from_numpy(masks[rank])),
                mine(gae_xp.whiten(everyone, np.concatenate(masks, axis=-1))), 1e-12)
    # x that requires grad: the same numbers, and a gradient through x with the statistics held constant
    clean = [np.where(np.isnan(part), 0.0, part) for part in xs]
    together, real = np.concatenate(clean, axis=-1), np.concatenate(masks, axis=-1)
    scale = np.sqrt(np.var(together[real], ddof=1) + 1e-8)
    for fill in (0.0, None):
        leaf = torch.from_numpy(clean[rank]).requires_grad_()
        out = cp.whiten(leaf, torch.from_numpy(masks[rank]), masked_fill=fill)
        check.close(f"whiten requiring grad, masked_fill={fill}", out.detach(),
                    mine(gae_xp.whiten(together, real, masked_fill=fill)), 1e-12)
        out.sum().backward()
        due = (masks[rank] if fill is not None else np.ones(shape)) / scale
        check.close(f"whiten's gradient, masked_fill={fill}", leaf.grad, due, 1e-12)


# --- the harness ------------------------------------------------------------------------------------------------------


def _worker(rank, world, store, scenarios, results):
    try:
        dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world,
                                timeout=timedelta(seconds=GROUP_TIMEOUT))
        check = Checks(rank)
        try:
            for name in scenarios:  # a scenario of this module, or "module:function" of another test module
                module, _, function = name.rpartition(":")
                (getattr(importlib.import_module(module), function) if module else globals()[name])(check, rank,
                                                                                                   world)
        finally:
            dist.destroy_process_group()
        results.put((rank, check.failures))
    except BaseException:
        results.put((rank, [traceback.format_exc()]))


def spawn(world, tmp_path, scenarios):
    context = multiprocessing.get_context("spawn")
    results = context.Queue()
    store = tmp_path / "store"
    processes = [context.Process(target=_worker, args=(rank, world, str(store), scenarios, results))
                 for rank in range(world)]
    env = {"OMP_NUM_THREADS": "1", "NUMBA_NUM_THREADS": "1"}
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        for process in processes:
            process.start()
    finally:
        for k, v in saved.items():
            os.environ.pop(k) if v is None else os.environ.__setitem__(k, v)
    failures, seen = [], set()
    try:
        for _ in range(world):
            rank, messages = results.get(timeout=TIMEOUT)
            seen.add(rank)
            failures += messages
    except Exception:
        failures.append(f"ranks {sorted(set(range(world)) - seen)} gave no result within {TIMEOUT} s")
    finally:
        for process in processes:
            process.join(timeout=10)
            if process.is_alive():
                process.kill()
                process.join()
    return failures


@pytest.mark.parametrize("world", [2, 4])
def test_context_parallel_gae_equals_single_device(world, tmp_path):
    failures = spawn(world, tmp_path, ["scenario_layouts"])
    assert not failures, "\n".join(failures[:20])


@pytest.mark.parametrize("world", [2, 3])
def test_bad_input_and_disagreement_raise_on_every_rank(world, tmp_path):
    failures = spawn(world, tmp_path, ["scenario_hostile", "scenario_exchange", "scenario_whiten"])
    assert not failures, "\n".join(failures[:20])


# --- one process: the layouts' arithmetic, the headers, the checks before any collective ---------------------------


def test_contiguous_segments_match_a_loop_over_sequences():
    from gae_xp.distributed import _layouts

    rng = np.random.default_rng(0)
    for world in (1, 2, 3, 4):
        for trial in range(20):
            lengths = rng.integers(0, 9, size=rng.integers(1, 12))
            lengths[-1] += (-lengths.sum()) % world + (world if lengths.sum() == 0 else 0)
            offsets = np.concatenate([[0], np.cumsum(lengths)])
            length = int(offsets[-1]) // world
            for rank in range(world):
                low, high = rank * length, (rank + 1) * length
                got = _layouts.contiguous(offsets, world, rank, length)
                # the same by a loop: a step belongs to the last sequence that starts at or before it
                owner = [max(i for i in range(len(lengths)) if offsets[i] <= t) for t in range(low, high)]
                cuts = [0] + [o - low for o in offsets if low < o < high] + [length]
                np.testing.assert_array_equal(got.cuts, cuts)
                for j in range(len(cuts) - 1):
                    if cuts[j + 1] > cuts[j]:
                        assert got.sequences[j] == owner[cuts[j]]
                assert got.closed[:-1].all() and got.closed[-1] == (high in offsets)


def test_a_context_over_many_sequences_is_built_at_once():
    """2^17 tokens in 16,384 sequences (the size that took 49.8 s with a loop over sequences): the layout is
    vectorised, and every step lands in one local segment of one rank."""
    from gae_xp.distributed import _layouts

    rng = np.random.default_rng(1)
    total, count, world = 2**17, 16384, 4
    offsets = np.concatenate([[0], np.sort(rng.choice(np.arange(1, total), count - 1, replace=False)), [total]])
    length = total // world
    shards = [_layouts.contiguous(offsets, world, rank, length) for rank in range(world)]
    assert sum(s.closed.shape[0] for s in shards) == count + world - 1 - sum(
        int(rank * length in offsets) for rank in range(1, world))
    tables = _layouts.contiguous_tables(offsets, world, length)
    assert tables.cuts.shape[0] == world and (tables.cuts[:, -1] == length).all()


def test_headers_name_what_differs():
    from gae_xp.distributed import _exchange

    def headers(*rows):
        return np.stack([_exchange.header(world=len(rows), **row) for row in rows])

    base = {"dtype": "float32", "batch_shape": (3, 4), "pieces": 1, "fields": 5, "size": 60}
    _exchange.check_headers(headers(base, base), 0)
    with pytest.raises(ValueError, match=r"batch shape .*\(3, 4\) on rank 0; \(2, 4\) on ranks 1, 2"):
        small = {**base, "batch_shape": (2, 4), "size": 40}
        _exchange.check_headers(headers(base, small, small), 0)
    with pytest.raises(ValueError, match="float32 on rank 0; float64 on rank 1"):
        _exchange.check_headers(headers(base, {**base, "dtype": "torch.float64"}), 1)
    message = _exchange.encode_message(TypeError("oops, ü" * 20), 48)
    assert _exchange.decode_message(message) == "TypeError: " + "oops, ü" * 20
    failed = _exchange.header(status=_exchange.TYPE_ERROR, world=2, size=message.shape[0])
    with pytest.raises(TypeError, match="rank 1 of 2 failed before the exchange, so every rank stops: TypeError: oops"):
        messages = np.zeros((2, 48))
        messages[1, :message.shape[0]] = message
        _exchange.check_headers(np.stack([headers(base)[0], failed]), 0, messages)


def test_layout_and_inputs_are_checked():
    import gae_xp.distributed as cp

    with pytest.raises(ValueError, match="layout"):
        cp.Context(layout="ring")
    with pytest.raises(TypeError, match="not both"):
        cp.Context(group=object(), axis_name="x")
    with pytest.raises(TypeError, match="must be a gae_xp.distributed.Context"):
        cp.gae(torch.zeros(4), torch.zeros(4), context="zigzag")
    jnp = pytest.importorskip("jax.numpy")
    with pytest.raises(ValueError, match="used inside jax.shard_map"):
        cp.gae(jnp.ones((2, 4)), jnp.ones((2, 4)), context=cp.Context(axis_name="cp"))


# --- JAX: shard_map over 4 host devices ---------------------------------------------------------------------------

JAX_SCRIPT = textwrap.dedent("""
    import os, sys
    os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=4"
    import numpy as np, jax
    jax.config.update("jax_enable_x64", True)
    from jax.sharding import NamedSharding, PartitionSpec as P
    sys.path.insert(0, {tests!r})
    import gae_xp, gae_xp.distributed as cp
    from test_distributed import make_case, packed_case, shard

    world = 4
    mesh = jax.make_mesh((world,), ("cp",))
    failures = []

    def global_order(x, layout, offsets):  # the rank-major concatenation of every rank's shard
        return np.concatenate([shard(x, layout, world, k, offsets) for k in range(world)], axis=-1)

    def run(case, layout, offsets=None, **options):
        context = cp.Context(axis_name="cp", layout=layout, cu_seqlens=offsets)
        length = case["rewards"].shape[-1]
        per_step = sorted(k for k, v in case.items() if isinstance(v, np.ndarray) and v.shape[-1:] == (length,)
                          and v.ndim == 2)
        rest = {{k: jax.numpy.asarray(v) if isinstance(v, np.ndarray) else v for k, v in case.items()
                 if k not in per_step}}

        def local(*arrays):
            return cp.gae(**dict(zip(per_step, arrays)), **rest, **options, context=context)

        sharded = [jax.device_put(global_order(case[k], layout, offsets), NamedSharding(mesh, P(None, "cp")))
                   for k in per_step]
        mapped = jax.jit(jax.shard_map(local, mesh=mesh, in_specs=(P(None, "cp"),) * len(per_step),
                                       out_specs=(P(None, "cp"), P(None, "cp"))))
        return [np.asarray(out) for out in mapped(*sharded)]

    def compare(label, got, want, layout, offsets=None):
        want = global_order(want, layout, offsets)
        error = float(np.abs(got - want).max())
        if got.shape != want.shape or not error <= 1e-12:
            failures.append(f"{{label}}: max error {{error:.3g}}")

    for layout, names in (("contiguous", ("masked across shards", "critic_lam")),
                          ("zigzag", ("dones+holes", "per-step gamma"))):
        for name in names:
            case = make_case(3, world, name)
            want = gae_xp.gae(**case, backend="xp")
            for got, w, what in zip(run(case, layout), want, ("advantages", "returns")):
                compare(f"{{layout}} {{name}} {{what}}", got, w, layout)
        case, offsets = packed_case(5, world, layout, empty=True)  # contiguous: every rank has other cuts
        want = gae_xp.gae(**case, cu_seqlens=offsets, backend="xp")
        for got, w, what in zip(run(case, layout, offsets), want, ("advantages", "returns")):
            compare(f"{{layout}} packed with empty sequences {{what}}", got, w, layout, offsets)
    print("\\n".join(failures) if failures else "ok")
""")


def test_jax_shard_map_equals_single_device():
    pytest.importorskip("jax")
    script = JAX_SCRIPT.format(tests=os.path.dirname(__file__))
    env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=4"}
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=TIMEOUT, env=env)
    assert done.returncode == 0, done.stderr[-4000:]
    assert done.stdout.strip().splitlines()[-1] == "ok", done.stdout[-4000:]


def test_doctests():
    """The public functions' Examples (they start a one-process gloo group: their own process)."""
    code = ("import doctest, sys, gae_xp.distributed._gae as g, gae_xp.distributed._whiten as w, "
            "gae_xp.distributed._context as c\n"
            "sys.exit(sum(doctest.testmod(m).failed for m in (g, w, c)))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=TIMEOUT)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
