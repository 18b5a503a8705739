"""Hostile and unusual input: no silent wrong number, no crash, no aliasing (one test or more per case, numbered
as in the hardening issue), and the property that a NaN or inf in one episode leaves every other episode exact."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import numpy as np
import pytest
from conftest import load_target
from helpers import converted, expected, like, make_case, to_numpy, xp_assert_close
from hypothesis import given
from hypothesis import strategies as st

import gae_xp
from gae_xp import _scan, reference

# --- 1. discounted_cumsum: |discount| > 1 is refused (test_errors), and |discount| <= 1 never overflows ----------


@pytest.mark.parametrize("discount", [1.0, -1.0, 0.999])
def test_1_long_unit_discount_has_no_nan_or_overflow(target, library, backend, discount):
    x = np.zeros((1, min(40_000 if library.name == "numpy" else 300, target.max_elements // 100)))
    x[0, 0] = 1.0
    arrays = library.asarray(x)
    for dtype in (library.xp.float32, library.xp.float64):
        got = gae_xp.discounted_cumsum(library.xp.astype(arrays, dtype), discount, backend=backend)
        xp_assert_close(got, reference.discounted_cumsum_loop(x, discount), like=library.xp.astype(arrays, dtype))


# --- 2. range checks on every array whose values can be read, eager JAX included; traced values skip them --------


@pytest.mark.parametrize("name, value", [("gamma", 1.5), ("lam", -3.0), ("gamma", float("nan"))])
def test_2_eager_jax_coefficients_are_checked(name, value):
    library = load_target("jax:cpu/auto").library
    r = library.asarray(np.zeros((2, 10)))
    with pytest.raises(ValueError, match=name):
        gae_xp.gae(r, r, **{name: library.xp.asarray(value)})


def test_2_eager_jax_discount_is_checked():
    library = load_target("jax:cpu/auto").library
    with pytest.raises(ValueError, match="discount"):
        gae_xp.discounted_cumsum(library.asarray(np.zeros((2, 10))), library.xp.asarray(float("nan")))


def test_2_traced_coefficients_are_not_checked_but_used():
    library = load_target("jax:cpu/auto").library
    import jax

    case = make_case(np.random.default_rng(0), (2, 50), per_step_gamma=True)
    arrays = converted(library, case)
    got, _ = jax.jit(lambda r, v, g: gae_xp.gae(r, v, gamma=g, lam=0.9))(arrays["rewards"], arrays["values"],
                                                                         arrays["gamma"])
    xp_assert_close(got, expected({**case, "lam": 0.9})[0], like=arrays["rewards"])


# --- 3. longdouble is computed in float64 at least, and returned as longdouble -----------------------------------


@pytest.mark.parametrize("backend", ["xp", "numba", "auto"])
def test_3_longdouble_is_computed_in_float64(backend):
    load_target("numpy/numba" if backend == "numba" else "numpy/xp")
    case = make_case(np.random.default_rng(1), (3, 4000), dones=0.01, holes=0.1)
    wide = {k: v.astype(np.longdouble) if isinstance(v, np.ndarray) and v.dtype.kind == "f" else v
            for k, v in case.items()}
    advantages, returns = gae_xp.gae(**wide, backend=backend)
    assert advantages.dtype == np.longdouble and returns.dtype == np.longdouble
    want_a, _ = expected(case)
    assert np.abs(advantages.astype(np.float64) - want_a).max() < 1e-12


# --- 4. a done step cuts the trace exactly: nothing, NaN and inf included, crosses it --------------------------


@pytest.mark.parametrize("bad", [np.inf, -np.inf, np.nan])
def test_4_a_non_finite_reward_after_a_termination(library, backend, bad):
    r = np.array([0.0, 0.0, 0.0, bad, 0.0, 0.0])
    terminated = np.arange(6) == 2
    arrays = converted(library, {"rewards": r, "values": np.zeros(6), "terminated": terminated})
    advantages, _ = gae_xp.gae(**arrays, backend=backend)
    xp_assert_close(advantages, [0.0, 0.0, 0.0, bad, 0.0, 0.0], like=arrays["rewards"])


def test_4_truncation_with_next_values_and_nan_after_the_cut(library, backend):
    r = np.array([1.0, 2.0, np.nan, 0.5])
    case = {"rewards": r, "values": np.zeros(4), "next_values": np.array([0.5, 0.25, 0.0, 0.0]),
            "truncated": np.arange(4) == 1}
    arrays = converted(library, case)
    advantages, _ = gae_xp.gae(**arrays, gamma=0.9, lam=0.8, backend=backend)
    want, _ = expected({**case, "gamma": 0.9, "lam": 0.8})
    assert np.isfinite(want[:2]).all()
    xp_assert_close(advantages, want, like=arrays["rewards"])


@st.composite
def episodes(draw):
    """A packed row of several episodes, with one NaN or inf placed in one of them."""
    lengths = draw(st.lists(st.integers(1, 40), min_size=2, max_size=6))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    total = sum(lengths)
    ends = np.cumsum(lengths) - 1
    case = {"rewards": rng.standard_normal(total), "values": rng.standard_normal(total),
            "gamma": draw(st.sampled_from([0.9, 0.99, 1.0])), "lam": draw(st.sampled_from([0.0, 0.95, 1.0]))}
    end_kind = draw(st.sampled_from(["terminated", "truncated"]))
    case[end_kind] = np.isin(np.arange(total), ends)
    if end_kind == "truncated":
        case["next_values"] = rng.standard_normal(total)
    if draw(st.booleans()):  # holes inside episodes; an episode's end is a real step (a masked step is absent)
        case["mask"] = (rng.random(total) > 0.25) | case[end_kind]
    episode = draw(st.integers(0, len(lengths) - 1))
    start = int(ends[episode]) - lengths[episode] + 1
    where = start + draw(st.integers(0, lengths[episode] - 1))
    field = draw(st.sampled_from(["rewards", "values"] + (["next_values"] if end_kind == "truncated" else [])))
    case[field][where] = draw(st.sampled_from([np.nan, np.inf, -np.inf]))
    spans = [(int(e) - n + 1, int(e) + 1) for e, n in zip(ends, lengths)]
    return case, spans[episode], spans, draw(st.sampled_from([None, 1, 4, 16]))


@given(episodes())
def test_4_a_non_finite_value_stays_in_its_episode(library, backend, drawn):
    case, poisoned, spans, chunk = drawn
    arrays = converted(library, case)
    advantages, returns = gae_xp.gae(**arrays, chunk_size=chunk, backend=backend)
    want_a, want_r = expected(case)
    for start, stop in spans:
        if (start, stop) != poisoned:
            assert np.isfinite(to_numpy(advantages)[start:stop]).all(), (start, stop)
    xp_assert_close(advantages, want_a, like=arrays["rewards"])
    xp_assert_close(returns, want_r, like=arrays["rewards"])


# --- 5. no output shares memory with an input, at any T ----------------------------------------------------------


def _shares_memory(a, b) -> bool:
    if isinstance(a, np.ndarray):
        return np.shares_memory(a, b)
    storage = getattr(a, "untyped_storage", None)
    return storage is not None and a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()


@pytest.mark.parametrize("length", [0, 1, 2, 40])
def test_5_no_output_shares_memory_with_an_input(library, backend, length):
    if library.name not in ("numpy", "torch:cpu"):
        pytest.skip("memory sharing is checked on NumPy and torch CPU (the libraries whose arrays expose it)")
    x = library.asarray(np.random.default_rng(0).standard_normal((2, length)))
    outputs = [gae_xp.discounted_cumsum(x, discount, backend=backend)
               for discount in (0.9, 0.0, library.asarray(np.full((2, length), 0.5)))]
    outputs += [gae_xp.discounted_cumsum(library.xp.astype(x, library.xp.float32), 0.9, backend=backend)]
    outputs += list(gae_xp.gae(x, x, gamma=0.5, lam=0.0, backend=backend))
    for out in outputs:
        assert not _shares_memory(out, x)


# --- 7. a kernel cached under torch.inference_mode serves autograd later -----------------------------------------


def test_7_inference_mode_then_autograd():
    load_target("torch:cpu/auto")
    import torch

    _scan.KERNELS.clear()
    r, v = torch.randn(2, 300, dtype=torch.float64), torch.randn(2, 300, dtype=torch.float64)
    with torch.inference_mode():
        gae_xp.gae(r, v, gamma=0.97, lam=0.9, backend="xp")
    rg = r.clone().requires_grad_()
    advantages, _ = gae_xp.gae(rg, v, gamma=0.97, lam=0.9)
    advantages.sum().backward()
    assert torch.isfinite(rg.grad).all()


# --- 8. scalar boundary values are weakly typed, NumPy scalars included ------------------------------------------


@pytest.mark.parametrize("scalar", [np.float64(0.5), np.float32(0.5), np.int64(1), 0.5, "0-d float64"])
def test_8_scalar_bootstrap_keeps_the_dtype(library, backend, scalar):
    case = make_case(np.random.default_rng(2), (2, 30))
    arrays = converted(library, case, library.xp.float32)
    value = library.asarray(np.array(0.5)) if isinstance(scalar, str) else scalar
    advantages, returns = gae_xp.gae(**arrays, bootstrap_value=value, backend=backend)
    want_a, want_r = expected({**case, "bootstrap_value": float(value)})
    xp_assert_close(advantages, want_a, like=arrays["rewards"])
    xp_assert_close(returns, want_r, like=arrays["rewards"])
    x = arrays["rewards"]
    got = gae_xp.discounted_cumsum(x, 0.9, initial=value, backend=backend)
    xp_assert_close(got, reference.discounted_cumsum_loop(case["rewards"], 0.9, initial=float(value)), like=x)


# --- 9. concurrent calls share helpers safely, and numba's own thread pool is never started ----------------------


def test_9_threads_calling_at_once():
    load_target("numpy/numba")
    code = textwrap.dedent("""
        import threading, numpy as np, gae_xp
        from gae_xp import reference
        from gae_xp.backends import numba_cpu
        rng = np.random.default_rng(0)
        r, v = rng.standard_normal((8, 50_000)), rng.standard_normal((8, 50_000))
        mask = rng.random((8, 50_000)) > 0.2
        assert numba_cpu._threads_for(r.size, 8) == 2
        want = reference.gae_loop(r[:, :2000], v[:, :2000], mask=mask[:, :2000])[0]
        alone = gae_xp.gae(r, v, mask=mask, backend="numba")[0]
        failures = []
        def work():
            for _ in range(10):
                a = gae_xp.gae(r, v, mask=mask, backend="numba")[0]
                b = gae_xp.gae(r, v, backend="numba")[0]
                if not (np.array_equal(a, alone) and np.isfinite(b).all()):
                    failures.append("differs")
            got = gae_xp.gae(r[:, :2000], v[:, :2000], mask=mask[:, :2000], backend="numba")[0]
            if np.abs(got - want).max() > 1e-9:
                failures.append("wrong")
        threads = [threading.Thread(target=work) for _ in range(4)]
        [t.start() for t in threads]
        [t.join() for t in threads]
        import numba
        try:
            layer = numba.threading_layer()
        except ValueError:
            layer = "no-pool"
        print(layer, failures)
    """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600,
                          env={**__import__("os").environ, "NUMBA_NUM_THREADS": "2"})
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["no-pool", "[]"], done.stdout


# --- 10. clear errors (test_errors), meta tensors, NumPy scalars wherever Python numbers are taken ----------------


def test_10_meta_tensors_give_meta_results():
    load_target("torch:cpu/auto")
    import torch

    r = torch.empty(2, 100, device="meta")
    mask = torch.empty(2, 100, dtype=torch.bool, device="meta")
    advantages, returns = gae_xp.gae(r, r, mask=mask, gamma=torch.full((2, 100), 0.9, device="meta"))
    assert advantages.device.type == "meta" and tuple(advantages.shape) == (2, 100)
    assert gae_xp.discounted_cumsum(r, 0.9).device.type == "meta"


def test_10_numpy_scalars_are_numbers():
    r = np.random.default_rng(3).standard_normal((2, 20))
    vs, _ = gae_xp.vtrace(np.zeros((2, 20)), r, r, clip_rho_threshold=np.float32(1.0),
                          clip_c_threshold=np.float64(1.0), clip_pg_rho_threshold=np.int64(1))
    np.testing.assert_allclose(vs, gae_xp.vtrace(np.zeros((2, 20)), r, r)[0])
    np.testing.assert_allclose(gae_xp.whiten(r, eps=np.float32(1e-8)), gae_xp.whiten(r, eps=1e-8))
    np.testing.assert_allclose(gae_xp.gae(r, r, gamma=np.float32(0.5), lam=np.float64(0.5))[0],
                               gae_xp.gae(r, r, gamma=0.5, lam=0.5)[0])


# --- 11. the kernel cache is bounded by bytes, and memory stays flat across varied lengths -----------------------


def test_11_kernel_cache_is_bounded_by_bytes():
    cache = _scan.KernelCache(max_bytes=3 * 8 * 8 * 8)
    for size in range(1, 40):
        cache.get(("numpy", size), lambda size=size: np.zeros((8, 8)))
    assert cache.nbytes <= 3 * 8 * 8 * 8
    assert cache.get(("too big",), lambda: np.zeros((100, 100))).shape == (100, 100)
    assert cache.nbytes <= 3 * 8 * 8 * 8


def test_11_memory_stays_flat_across_lengths():
    code = textwrap.dedent("""
        import resource, numpy as np, gae_xp
        from gae_xp import _scan
        def rss():
            with open("/proc/self/statm") as f:
                return int(f.read().split()[1]) * resource.getpagesize()
        x = np.random.default_rng(0).standard_normal((2, 1600))
        gae_xp.gae(x[:, :1500], x[:, :1500], chunk_size=2048, backend="xp")
        before = rss()
        for length in range(1500, 1520):
            for w in (0.9, 0.95, 0.99):
                gae_xp.gae(x[:, :length], x[:, :length], gamma=w, lam=1.0, chunk_size=2048, backend="xp")
        print(rss() - before, _scan.KERNELS.nbytes, _scan.KERNELS.max_bytes)
    """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=True)
    grown, cached, bound = map(int, done.stdout.split())
    assert cached <= bound
    assert grown < 32 * 2**20, f"RSS grew by {grown / 2**20:.1f} MiB"


# --- 12. torch.compile(fullgraph=True), torch.func.vmap, jax.jit and jax.vmap -----------------------------------


TRACED_OPTIONS = [{}, {"dones": 0.05, "holes": 0.2}, {"per_step_gamma": True, "bootstrap": True}]


@pytest.mark.parametrize("options", TRACED_OPTIONS)
def test_12_torch_compile_fullgraph_matches_eager(options):
    library = load_target("torch:cpu/auto").library
    import torch

    case = make_case(np.random.default_rng(4), (3, 200), **options)
    case["rewards"][1, 50] = np.inf  # the traceable route keeps the loop's non-finite pattern
    arrays = converted(library, case)
    compiled = torch.compile(lambda kw: gae_xp.gae(**kw, chunk_size=16), fullgraph=True)
    got_a, got_r = compiled(arrays)
    want_a, want_r = expected(case)
    xp_assert_close(got_a, want_a, like=arrays["rewards"])
    xp_assert_close(got_r, want_r, like=arrays["rewards"])
    xp_assert_close(gae_xp.discounted_cumsum(arrays["rewards"], 0.9), torch.compile(
        lambda x: gae_xp.discounted_cumsum(x, 0.9), fullgraph=True)(arrays["rewards"]).numpy(), like=like(library))


def _rows_apart(case):
    """The case with a per-step gamma given for every row, so that a vmap over rows hands each row its own."""
    gamma = case["gamma"]
    return {**case, "gamma": np.broadcast_to(gamma, case["rewards"].shape).copy()} if isinstance(gamma, np.ndarray) \
        else case


@pytest.mark.parametrize("options", TRACED_OPTIONS)
def test_12_torch_vmap_matches_the_loop(options):
    library = load_target("torch:cpu/auto").library
    import torch

    case = _rows_apart(make_case(np.random.default_rng(5), (3, 120), **options))
    arrays = converted(library, case)
    per_row = {k: v for k, v in arrays.items() if not isinstance(v, (float, str)) and v.shape[:1] == (3,)}
    rest = {k: v for k, v in arrays.items() if k not in per_row}
    names = list(per_row)
    got_a, got_r = torch.func.vmap(lambda *rows: gae_xp.gae(**dict(zip(names, rows)), **rest))(*per_row.values())
    want_a, want_r = expected(case)
    xp_assert_close(got_a, want_a, like=arrays["rewards"])
    xp_assert_close(got_r, want_r, like=arrays["rewards"])


@pytest.mark.parametrize("options", TRACED_OPTIONS)
def test_12_jax_jit_and_vmap_match_the_loop(options):
    library = load_target("jax:cpu/auto").library
    import jax

    case = _rows_apart(make_case(np.random.default_rng(6), (3, 120), **options))
    case["rewards"][2, 30] = np.nan
    arrays = converted(library, case)
    per_row = {k: v for k, v in arrays.items() if not isinstance(v, (float, str)) and v.shape[:1] == (3,)}
    rest = {k: v for k, v in arrays.items() if k not in per_row}
    names = list(per_row)
    want_a, want_r = expected(case)
    for transform in (jax.vmap, lambda f: jax.jit(jax.vmap(f))):
        got_a, got_r = transform(lambda *rows: gae_xp.gae(**dict(zip(names, rows)), **rest))(*per_row.values())
        xp_assert_close(got_a, want_a, like=arrays["rewards"])
        xp_assert_close(got_r, want_r, like=arrays["rewards"])


# --- 13. a child forked after a shared call, or after the caller started numba's pool, can call gae() -----------


@pytest.mark.parametrize("layer", [None, "omp", "workqueue", "tbb"])
def test_13_a_forked_child_runs_gae_after_a_shared_call(layer):
    """Helper threads do not survive a fork: the child makes its own. With ``layer``, the parent has also started
    numba's pool on that layer itself (GNU OpenMP kills a child that enters a parallel region; gae_xp enters none)."""
    load_target("numpy/numba")
    code = textwrap.dedent("""
        import os, sys, time, numpy as np, numba, gae_xp
        from gae_xp.backends import numba_cpu
        from gae_xp.testing import make_case
        case = make_case(np.random.default_rng(0), (8, 20_000), dones=0.01, holes=0.2)
        assert numba_cpu._threads_for(case["rewards"].size, 8) == 2
        if os.environ.get("NUMBA_THREADING_LAYER"):
            @numba.njit(parallel=True)
            def user_loop(x):
                for i in numba.prange(x.shape[0]):
                    x[i] += 1.0
            try:
                user_loop(np.zeros(1000))
            except ValueError as error:  # this threading layer is not installed
                print("unavailable", str(error).splitlines()[0])
                sys.exit(0)
            print(numba.threading_layer(), flush=True)
        want = gae_xp.gae(**case, backend="numba")[0]
        pid = os.fork()
        if pid == 0:
            got = gae_xp.gae(**case, backend="numba")[0]
            os._exit(0 if np.array_equal(got, want) else 3)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                print("child", os.waitstatus_to_exitcode(status))
                break
            time.sleep(0.05)
        else:
            os.kill(pid, 9)
            print("child hung")
    """)
    env = {**__import__("os").environ, "NUMBA_NUM_THREADS": "2"}
    if layer:
        env["NUMBA_THREADING_LAYER"] = layer
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600, env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    if done.stdout.startswith("unavailable"):
        pytest.skip(f"numba's {layer} threading layer: {done.stdout.strip()}")
    assert done.stdout.split() == [*([layer] if layer else []), "child", "0"], (done.stdout, done.stderr[-2000:])
