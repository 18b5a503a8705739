"""Dask arrays: lazy results from Dask's own graph, equal to NumPy on the same data, for every chunking."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

import gae_xp
from gae_xp.reference import gae_loop

da = pytest.importorskip("dask.array")
dask = pytest.importorskip("dask")

T = 240
#: Chunkings of a (3, 240) array: block edges at 60, 120, 180 fall inside the masked run [50, 130) and at the
#: dones placed at steps 59, 60, 119, 179; one has a block of a single step; one a single block along time.
CHUNKINGS = {
    "60": (3, 60),
    "37, rows 2+1": ((2, 1), 37),
    "irregular with a 1-step block": ((1, 2), (60, 1, 59, 70, 50)),
    "one block": (3, T),
}


def make_case(seed=0, *, holes=0.25, dones=0.02, per_step_gamma=False, next_values=False, dtype=np.float64):
    rng = np.random.default_rng(seed)
    shape = (3, T)
    case = {"rewards": rng.standard_normal(shape), "values": rng.standard_normal(shape)}
    mask = rng.random(shape) >= holes
    mask[:, 50:130] = False
    mask[2, :] = True
    case["mask"] = mask
    terminated = rng.random(shape) < dones
    terminated[0, [59, 119]] = True
    truncated = rng.random(shape) < dones
    truncated[1, [60, 179]] = True
    case.update(terminated=terminated, truncated=truncated)
    if per_step_gamma:
        case["gamma"] = rng.uniform(0.5, 1.0, shape)
        case["lam"] = rng.uniform(0.0, 1.0, (3, 1))
    if next_values:
        case["next_values"] = rng.standard_normal(shape)
    else:
        case["bootstrap_value"] = rng.standard_normal(3)
        case["truncated_bootstrap"] = "next_step"  # random truncations, no final observations
    return {k: v.astype(dtype) if isinstance(v, np.ndarray) and v.dtype == np.float64 else v for k, v in case.items()}


def to_dask(case, chunks):
    out = {}
    for key, value in case.items():
        if isinstance(value, np.ndarray):
            value = da.from_array(value, chunks=chunks if value.shape == (3, T) else -1)
        out[key] = value
    return out


def computes_during(function):
    """(result, number of Dask computations started while ``function`` ran)."""
    from dask.callbacks import Callback

    started = []

    class Count(Callback):
        def _start(self, dsk):
            started.append(dsk)

    with Count():
        result = function()
    return result, len(started)


OPTIONS = {
    "dones+holes": {},
    "per-step gamma": {"per_step_gamma": True},
    "next_values": {"next_values": True},
}


@pytest.mark.parametrize("chunking", list(CHUNKINGS))
@pytest.mark.parametrize("option", list(OPTIONS))
@pytest.mark.parametrize("fill_masked", [False, True])
def test_gae_equals_numpy(chunking, option, fill_masked):
    case = make_case(list(OPTIONS).index(option), **OPTIONS[option])
    want_a, want_r = gae_xp.gae(**case, fill_masked=fill_masked)
    (a, r), computed = computes_during(lambda: gae_xp.gae(**to_dask(case, CHUNKINGS[chunking]),
                                                          fill_masked=fill_masked))
    assert computed == 0, "building the graph computed something"
    assert isinstance(a, da.Array) and a.chunks == da.from_array(case["rewards"], CHUNKINGS[chunking]).chunks
    got_a, got_r = dask.compute(a, r, scheduler="synchronous")
    np.testing.assert_allclose(got_a, want_a, rtol=0, atol=1e-12)
    np.testing.assert_allclose(got_r, want_r, rtol=0, atol=1e-12)
    if not fill_masked:
        np.testing.assert_allclose(got_a, gae_loop(**case)[0], rtol=0, atol=1e-10)


def test_float32_no_worse_than_the_float32_loop():
    case = make_case(3)
    want, _ = gae_loop(**case)
    single = {k: v.astype(np.float32) if isinstance(v, np.ndarray) and v.dtype == np.float64 else v
              for k, v in case.items()}
    loop, _ = gae_loop(**single)
    got = gae_xp.gae(**to_dask(single, (3, 60)))[0].compute(scheduler="synchronous")
    assert got.dtype == np.float32
    assert np.abs(got - want).max() <= np.abs(loop - want).max()


@pytest.mark.parametrize("chunking", list(CHUNKINGS))
@pytest.mark.parametrize("reverse", [True, False])
@pytest.mark.parametrize("discount", ["constant", "per-step"])
def test_discounted_cumsum_equals_numpy(chunking, reverse, discount):
    rng = np.random.default_rng(4)
    x = rng.standard_normal((3, T))
    a = 0.9 if discount == "constant" else np.where(rng.random((3, T)) < 0.05, 0.0, rng.uniform(0, 1, (3, T)))
    want = gae_xp.discounted_cumsum(x, a, reverse=reverse, initial=np.arange(3.0))
    chunks = CHUNKINGS[chunking]
    lazy_a = a if isinstance(a, float) else da.from_array(a, chunks=chunks)
    got = gae_xp.discounted_cumsum(da.from_array(x, chunks=chunks), lazy_a, reverse=reverse,
                                   initial=da.from_array(np.arange(3.0)))
    np.testing.assert_allclose(got.compute(scheduler="synchronous"), want, rtol=0, atol=1e-12)


@pytest.mark.parametrize("chunking", ["60", "irregular with a 1-step block"])
def test_estimators_equal_numpy(chunking):
    case = make_case(5, next_values=True)
    lazy = to_dask(case, CHUNKINGS[chunking])
    flags = {k: case[k] for k in ("mask", "terminated", "truncated")}
    lazy_flags = {k: lazy[k] for k in flags}
    np.testing.assert_allclose(
        gae_xp.discounted_returns(lazy["rewards"], gamma=0.9, **lazy_flags).compute(scheduler="synchronous"),
        gae_xp.discounted_returns(case["rewards"], gamma=0.9, **flags), rtol=0, atol=1e-12)
    np.testing.assert_allclose(
        gae_xp.lambda_returns(lazy["rewards"], lazy["next_values"], **lazy_flags).compute(scheduler="synchronous"),
        gae_xp.lambda_returns(case["rewards"], case["next_values"], **flags), rtol=0, atol=1e-12)
    log_rhos = np.random.default_rng(6).normal(0, 0.3, (3, T))
    got = gae_xp.vtrace(da.from_array(log_rhos, chunks=CHUNKINGS[chunking]), lazy["rewards"], lazy["values"],
                        **lazy_flags, truncated_bootstrap="next_step")
    want = gae_xp.vtrace(log_rhos, case["rewards"], case["values"], **flags, truncated_bootstrap="next_step")
    for g, w in zip(dask.compute(*got, scheduler="synchronous"), want):
        np.testing.assert_allclose(g, w, rtol=0, atol=1e-12)


@pytest.mark.parametrize("fill_masked", [False, True])
@pytest.mark.parametrize("chunking", ["60", "irregular with a 1-step block"])
def test_decoupled_critic_lam_equals_numpy(chunking, fill_masked):
    case = make_case(8, per_step_gamma=True)
    want_a, want_r = gae_xp.gae(**case, critic_lam=1.0, fill_masked=fill_masked)
    a, r = gae_xp.gae(**to_dask(case, CHUNKINGS[chunking]), critic_lam=1.0, fill_masked=fill_masked)
    got_a, got_r = dask.compute(a, r, scheduler="synchronous")
    np.testing.assert_allclose(got_a, want_a, rtol=0, atol=1e-12)
    np.testing.assert_allclose(got_r, want_r, rtol=0, atol=1e-12)
    if not fill_masked:
        np.testing.assert_allclose(got_r, gae_loop(**case, critic_lam=1.0)[1], rtol=0, atol=1e-10)


@pytest.mark.parametrize("blocks", [(10, 10, 0, 0), (0, 7, 0, 13), (0, 20)])
def test_blocks_of_no_steps_let_everything_through(blocks):
    """Time blocks of length 0 (boolean indexing, then compute_chunk_sizes()): every estimator as on NumPy."""
    rng = np.random.default_rng(9)
    shape = (2, 20)
    r, v, nv, log_rhos = (rng.standard_normal(shape) for _ in range(4))
    flags = {"mask": rng.random(shape) > 0.3, "terminated": rng.random(shape) < 0.1}
    lazy = {name: da.from_array(x, chunks=(2, blocks)) for name, x in
            {"r": r, "v": v, "nv": nv, "log_rhos": log_rhos, **flags}.items()}
    lazy_flags = {name: lazy[name] for name in flags}
    calls = {
        "discounted_cumsum": (lambda m, x: m.discounted_cumsum(x["r"], 0.9),),
        "discounted_cumsum forward": (lambda m, x: m.discounted_cumsum(x["r"], 0.9, reverse=False),),
        "discounted_returns": (lambda m, x, f: m.discounted_returns(x["r"], gamma=0.9, **f),),
        "lambda_returns": (lambda m, x, f: m.lambda_returns(x["r"], x["nv"], **f),),
        "vtrace": (lambda m, x, f: m.vtrace(x["log_rhos"], x["r"], x["v"], **f),),
        "gae": (lambda m, x, f: m.gae(x["r"], x["v"], **f),),
        "gae critic_lam": (lambda m, x, f: m.gae(x["r"], x["v"], critic_lam=1.0, **f),),
    }
    eager = {"r": r, "v": v, "nv": nv, "log_rhos": log_rhos}
    for name, (call,) in calls.items():
        takes_flags = call.__code__.co_argcount == 3
        want = call(gae_xp, eager, flags) if takes_flags else call(gae_xp, eager)
        got = call(gae_xp, lazy, lazy_flags) if takes_flags else call(gae_xp, lazy)
        want, got = (want, got) if isinstance(want, tuple) else ((want,), (got,))
        for w, g in zip(want, dask.compute(*got, scheduler="synchronous")):
            np.testing.assert_allclose(g, w, rtol=0, atol=1e-12, err_msg=name)


def test_unknown_chunk_sizes_are_named():
    rng = np.random.default_rng(10)
    x = da.from_array(rng.random((2, 20)), chunks=(2, 5))
    kept = x[:, x[0] > 0.3]  # chunk sizes unknown (NaN)
    with pytest.raises(ValueError, match=r"unknown \(NaN\) chunk sizes.*compute_chunk_sizes\(\)"):
        gae_xp.gae(kept, kept * 2)
    eager = kept.compute()
    # one array: nothing to compare, the graph runs as it is
    np.testing.assert_allclose(gae_xp.gae(kept, kept)[0].compute(), gae_xp.gae(eager, eager)[0], rtol=0, atol=1e-12)
    np.testing.assert_allclose(gae_xp.discounted_cumsum(kept, 0.5).compute(), gae_xp.discounted_cumsum(eager, 0.5),
                               rtol=0, atol=1e-12)
    kept = kept.compute_chunk_sizes()
    np.testing.assert_allclose(gae_xp.gae(kept, kept * 2)[0].compute(), gae_xp.gae(eager, eager * 2)[0], rtol=0,
                               atol=1e-12)


def test_each_stage_is_one_graph_layer():
    """Building is linear in the blocks: the layers do not grow with them, the tasks grow by the same number per
    block (a graph merged once per block made 4,000 blocks take 48 s to build)."""
    def graph(blocks):
        x = da.ones((2, 10 * blocks), chunks=(2, 10))
        a, r = gae_xp.gae(x, x, mask=x > 0, critic_lam=1.0)
        y = gae_xp.discounted_cumsum(x, 0.9)
        return [(len(g.layers), len(dict(g))) for g in (a.__dask_graph__(), y.__dask_graph__())]

    small, large, larger = graph(4), graph(40), graph(400)
    for (layers_4, tasks_4), (layers_40, tasks_40), (layers_400, tasks_400) in zip(small, large, larger):
        assert layers_4 == layers_40 == layers_400
        assert tasks_400 - tasks_40 == 10 * (tasks_40 - tasks_4)


def test_graph_grows_with_blocks_not_with_length():
    def tasks(length, chunk):
        x = da.ones((2, length), chunks=(2, chunk))
        a, r = gae_xp.gae(x, x, mask=x > 0)
        return len(dict(a.__dask_graph__()))

    assert tasks(1000, 250) == tasks(10**6, 250_000)  # 4 blocks either way
    assert tasks(4000, 250) < 5 * tasks(1000, 250)  # 16 blocks against 4


def test_a_local_cluster_computes_the_same(tmp_path):
    distributed = pytest.importorskip("dask.distributed")
    case = make_case(7)
    want_a, want_r = gae_xp.gae(**case)
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None,
                                  local_directory=str(tmp_path)) as cluster, distributed.Client(cluster) as client:
        a, r = gae_xp.gae(**to_dask(case, (2, 60)))
        got_a, got_r = client.compute([a, r], sync=True)
        y = gae_xp.discounted_cumsum(da.from_array(case["rewards"], chunks=(3, 50)), 0.95)
        got_y = client.compute(y, sync=True)
    np.testing.assert_allclose(got_a, want_a, rtol=0, atol=1e-12)
    np.testing.assert_allclose(got_r, want_r, rtol=0, atol=1e-12)
    np.testing.assert_allclose(got_y, gae_xp.discounted_cumsum(case["rewards"], 0.95), rtol=0, atol=1e-12)


def test_packed_sequences_are_refused_on_dask():
    x = da.ones(10, chunks=5)
    with pytest.raises(ValueError, match="not supported on Dask"):
        gae_xp.gae(x, x, cu_seqlens=da.from_array(np.array([0, 4, 10])))
    with pytest.raises(ValueError, match="not supported on Dask"):  # empty sequences too, host offsets too
        gae_xp.gae(x, x, cu_seqlens=np.array([0, 0, 4, 4, 10]))


def test_numpy_calls_do_not_import_dask():
    code = ("import sys, numpy as np, gae_xp\n"
            "gae_xp.gae(np.ones((2, 300)), np.ones((2, 300)), mask=np.ones((2, 300), bool))\n"
            "print('dask' in sys.modules)")
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True).stdout.strip() == "False"
