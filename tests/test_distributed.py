"""Context parallelism over torch.distributed: real multi-process runs on the gloo backend (CPU).

Each test spawns 2 or 4 processes that join one gloo group through a file
store (no port to pick), run every case of the table on their shards, and
compare each rank's result with the single-process ``gae_xp.gae`` (and the
float64 oracle) on the gathered sequence. A process that hangs is killed
after ``TIMEOUT`` seconds and fails the test.
"""

from __future__ import annotations

import multiprocessing
import os
import traceback
from datetime import timedelta

import numpy as np
import pytest

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")
pytestmark = pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(),
                                reason="torch.distributed with gloo is not available")

TIMEOUT = 180

CASES = {
    "plain": {},
    "dones+holes": {"holes": 0.3, "dones": 0.03, "bootstrap": True},
    "masked across shards": {"masked_run": True, "dones": 0.02, "bootstrap": True},
    "dones at shard edges": {"edge_dones": True, "holes": 0.1, "bootstrap": True},
    "per-step gamma": {"per_step_gamma": True, "dones": 0.02, "holes": 0.2},
    "next_values": {"next_values": True, "holes": 0.2},
    "fill_masked": {"holes": 0.3, "bootstrap": True, "fill_masked": True},
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
    if options.get("bootstrap"):
        case["bootstrap_value"] = rng.standard_normal(batch)
    if options.get("fill_masked"):
        case["fill_masked"] = True
    return {k: v.astype(dtype) if isinstance(v, np.ndarray) and v.dtype == np.float64 else v for k, v in case.items()}


def packed_case(seed, world, layout, *, batch=2, dtype=np.float64):
    """Packed sequences: random lengths (multiples of 2W for zigzag), holes and dones, a bootstrap per sequence."""
    rng = np.random.default_rng(seed)
    unit = 2 * world if layout == "zigzag" else 1
    lengths = unit * rng.integers(1, 40, size=7)
    if layout == "contiguous":  # make the total a multiple of W, with sequences falling across shard edges
        lengths[-1] += (-lengths.sum()) % world
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    shape = (batch, int(offsets[-1]))
    case = {"rewards": rng.standard_normal(shape).astype(dtype), "values": rng.standard_normal(shape).astype(dtype),
            "mask": rng.random(shape) >= 0.25, "terminated": rng.random(shape) < 0.02,
            "bootstrap_value": rng.standard_normal((batch, len(lengths))).astype(dtype)}
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


def _run_cases(rank, world):
    """Every case on this rank; returns a list of failure messages."""
    import gae_xp
    import gae_xp.distributed as cp
    from gae_xp.reference import gae_loop

    failures = []

    def check(label, got, want, atol):
        error = float(np.max(np.abs(got - want), initial=0.0))
        if not np.isfinite(got).all() or error > atol:
            failures.append(f"rank {rank} {label}: max error {error:.3g} > {atol:.3g}")

    for layout in ("contiguous", "zigzag"):
        for name in CASES:
            for backend in ("auto", "xp"):
                case = make_case(list(CASES).index(name), world, name)
                want_a, want_r = gae_xp.gae(**case, backend="xp")
                a, r = cp.gae(**rank_inputs(case, layout, world, rank), layout=layout, backend=backend)
                label = f"{layout} {name} {backend}"
                check(label + " advantages", a.numpy(), shard(want_a, layout, world, rank), 1e-12)
                check(label + " returns", r.numpy(), shard(want_r, layout, world, rank), 1e-12)
        # float32: no worse than the float32 serial loop (against the float64 oracle)
        case = make_case(7, world, "dones+holes", dtype=np.float64, per_chunk=512)
        want, _ = gae_loop(**case)
        single = {k: v.astype(np.float32) if isinstance(v, np.ndarray) and v.dtype == np.float64 else v
                  for k, v in case.items()}
        loop, _ = gae_loop(**single)
        a, _ = cp.gae(**rank_inputs(single, layout, world, rank), layout=layout)
        bound = float(np.abs(loop - want).max())  # the loop's worst error on the whole sequence
        check(f"{layout} float32", a.numpy(), shard(want, layout, world, rank), bound)
        # packed sequences with CP
        case, offsets = packed_case(11, world, layout)
        want_a, want_r = gae_xp.gae(**case, cu_seqlens=offsets, backend="xp")
        a, r = cp.gae(**rank_inputs(case, layout, world, rank, offsets), layout=layout,
                      cu_seqlens=torch.from_numpy(offsets))
        check(f"{layout} packed", a.numpy(), shard(want_a, layout, world, rank, offsets), 1e-12)
        check(f"{layout} packed returns", r.numpy(), shard(want_r, layout, world, rank, offsets), 1e-12)
    return failures


def _worker(rank, world, store, results):
    try:
        dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world,
                                timeout=timedelta(seconds=TIMEOUT // 2))
        try:
            failures = _run_cases(rank, world)
        finally:
            dist.destroy_process_group()
        results.put((rank, failures))
    except BaseException:
        results.put((rank, [traceback.format_exc()]))


def spawn(world, tmp_path):
    context = multiprocessing.get_context("spawn")
    results = context.Queue()
    store = tmp_path / "store"
    processes = [context.Process(target=_worker, args=(rank, world, str(store), results)) for rank in range(world)]
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
    failures = spawn(world, tmp_path)
    assert not failures, "\n".join(failures[:20])


def test_layout_and_inputs_are_checked():
    import gae_xp.distributed as cp

    with pytest.raises(TypeError, match="torch tensors"):
        cp.gae(np.zeros(4), np.zeros(4))
    with pytest.raises(ValueError, match="layout"):
        cp.gae(torch.zeros(4), torch.zeros(4), layout="ring")
