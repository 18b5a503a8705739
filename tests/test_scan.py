"""discounted_cumsum() against its loop, and the baselines against the oracle."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import converted, expected, make_case, xp_assert_close

import gae_xp
from gae_xp import reference
from gae_xp.bench import baselines


@pytest.mark.parametrize("reverse", [True, False])
@pytest.mark.parametrize("discount_kind", ["float", "per-step", "per-row", "with zeros", "negative"])
@pytest.mark.parametrize("chunk", [None, 1, 3, 64])
def test_discounted_cumsum(library, backend, reverse, discount_kind, chunk):
    rng = np.random.default_rng(chunk or 0)
    x = rng.standard_normal((3, 200))
    discount = {
        "float": 0.97,
        "per-step": rng.uniform(0, 1, 200),
        "per-row": rng.uniform(0, 1, (3, 1)),
        "with zeros": np.where(rng.random((3, 200)) < 0.1, 0.0, 0.9),
        "negative": rng.uniform(-1, 1, (3, 200)),
    }[discount_kind]
    initial = rng.standard_normal(3)
    want = reference.discounted_cumsum_loop(x, discount, reverse=reverse, initial=initial)
    arg = discount if isinstance(discount, float) else library.asarray(discount)
    got = gae_xp.discounted_cumsum(library.asarray(x), arg, reverse=reverse, initial=library.asarray(initial),
                                   chunk_size=chunk, backend=backend)
    xp_assert_close(got, want, like=library.asarray(x))


@pytest.mark.parametrize("length", [0, 1, 2, 33])
def test_discounted_cumsum_short_and_scalar_initial(library, backend, length):
    x = library.asarray(np.arange(length, dtype=np.float64))
    want = reference.discounted_cumsum_loop(np.arange(length, dtype=np.float64), 0.5, initial=2.0)
    xp_assert_close(gae_xp.discounted_cumsum(x, 0.5, initial=2.0, chunk_size=4, backend=backend), want, like=x)


def test_discounted_cumsum_axis(library, backend):
    x = np.random.default_rng(1).standard_normal((50, 4))
    want = reference.discounted_cumsum_loop(x, 0.8, axis=0, reverse=False)
    got = gae_xp.discounted_cumsum(library.asarray(x), 0.8, axis=0, reverse=False, chunk_size=8, backend=backend)
    xp_assert_close(got, want, like=library.asarray(x))


@pytest.mark.parametrize("discount", [1.05, -1.5, "array"])
def test_discounted_cumsum_rejects_a_discount_beyond_one(library, backend, discount):
    # Products of |discount| > 1 overflow in any parallel form (inf * 0 = NaN) long before the loop's values do.
    x = library.asarray(np.zeros((2, 300)))
    if discount == "array":
        discount = library.asarray(np.concatenate([np.full((2, 299), 0.5), np.full((2, 1), 1.5)], axis=1))
    with pytest.raises(ValueError, match="discount"):
        gae_xp.discounted_cumsum(x, discount, backend=backend)


def test_matrix_method_equals_loop():
    rng = np.random.default_rng(0)
    r, v = rng.standard_normal((3, 500)), rng.standard_normal((3, 500))
    for got, want in zip(baselines.gae_matrix(r, v, gamma=0.9, lam=0.8, bootstrap_value=0.5),
                         reference.gae_loop(r, v, gamma=0.9, lam=0.8, bootstrap_value=0.5)):
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("chunk", [1, 64, 128, 256])
def test_slime_baselines_equal_loop(chunk):
    rng = np.random.default_rng(chunk)
    r, v = rng.standard_normal((2, 1000)), rng.standard_normal((2, 1000))
    want = reference.gae_loop(r, v, gamma=0.99, lam=0.95)
    for got_pair in (baselines.slime_serial_gae(r, v, 0.99, 0.95),
                     baselines.slime_chunked_gae(r, v, 0.99, 0.95, chunk_size=chunk)):
        for got, exact in zip(got_pair, want):
            np.testing.assert_allclose(got, exact, rtol=1e-10, atol=1e-10)


def test_loop_matches_a_hand_computed_case():
    # two steps, one termination: A_1 = r_1 + 0 - V_1 ; A_0 = r_0 + g V_1 - V_0 + g l A_1
    r, v = np.array([1.0, 2.0]), np.array([0.5, 0.25])
    advantages, returns = reference.gae_loop(r, v, gamma=0.5, lam=0.5, terminated=np.array([False, True]))
    a1 = 2.0 - 0.25
    a0 = 1.0 + 0.5 * 0.25 - 0.5 + 0.25 * a1
    np.testing.assert_allclose(advantages, [a0, a1])
    np.testing.assert_allclose(returns, [a0 + 0.5, a1 + 0.25])


def test_loop_cuts_exactly_at_a_done_step():
    # The case: inf in a later episode leaves the earlier one untouched.
    r = np.array([0.0, 0.0, 0.0, np.inf, 0.0, 0.0])
    advantages, _ = reference.gae_loop(r, np.zeros(6), terminated=np.arange(6) == 2)
    np.testing.assert_array_equal(advantages, [0, 0, 0, np.inf, 0, 0])


@pytest.mark.parametrize("options", [{}, {"dones": 0.05, "holes": 0.3, "per_step_gamma": True, "bootstrap": True}])
def test_the_accelerator_route(library, monkeypatch, options):
    # On a GPU nothing is read back to the host: the exact routes run, and the doubling local scan. Taking the
    # arrays for device arrays runs that route here, on every library, against the loop (NaN included).
    from gae_xp import _compat

    monkeypatch.setattr(_compat, "on_cpu", lambda x: False)
    case = make_case(np.random.default_rng(13), (3, 300), **options)
    case["rewards"][1, 100] = np.nan
    arrays = converted(library, case)
    advantages, returns = gae_xp.gae(**arrays, chunk_size=8, backend="xp")
    want_a, want_r = expected(case)
    xp_assert_close(advantages, want_a, like=arrays["rewards"])
    xp_assert_close(returns, want_r, like=arrays["rewards"])
    x = np.random.default_rng(14).standard_normal((2, 200))
    discount = np.where(np.arange(200) % 7 == 0, 0.0, 0.9)
    for reverse in (True, False):
        got = gae_xp.discounted_cumsum(library.asarray(x), library.asarray(discount), reverse=reverse, chunk_size=8,
                                       backend="xp")
        xp_assert_close(got, reference.discounted_cumsum_loop(x, discount, reverse=reverse), like=library.asarray(x))


# --- the generic path on a busy machine: no thread pool for small operations ------------------------------------


@pytest.mark.parametrize("size", [1, 5, 16, 32])
@pytest.mark.parametrize("vector", [False, True])
def test_kernel_product_hands_blas_small_blocks(monkeypatch, size, vector):
    # NumPy's matmul makes one BLAS call per block of a stack: every block at most BLAS_BLOCK elements, too small
    # for BLAS to wake its thread pool; the rows that do not fill a block go in a last product. Same numbers.
    from gae_xp import _scan

    blocks = []
    matmul = np.matmul

    def recording(a, b, **kwargs):
        blocks.append(a.shape[-2] * a.shape[-1])
        return matmul(a, b, **kwargs)

    monkeypatch.setattr(np, "matmul", recording)
    rng = np.random.default_rng(size)
    count = 3 * (_scan.BLAS_BLOCK // size) + 7  # three whole blocks and a remainder
    rows = rng.standard_normal((count, size)).astype(np.float32)
    matrix = rng.standard_normal(size if vector else (size, size)).astype(np.float32)
    got = _scan.kernel_product(None, rows, matrix)
    assert blocks and max(blocks) <= _scan.BLAS_BLOCK
    exact = rows.astype(np.float64) @ matrix.astype(np.float64)
    assert got.shape == exact.shape and got.dtype == np.float32
    np.testing.assert_allclose(got, exact, rtol=1e-5, atol=1e-5 * np.abs(exact).max())


@pytest.mark.parametrize("shape", [(3, 9000), (700, 20), (2, 5 * 8192 + 3)])
@pytest.mark.parametrize("reverse", [True, False])
def test_large_constant_scans_against_the_loop(shape, reverse):
    # Shapes whose products are blocked (with a remainder), one of them solved as a single chunk per row.
    x = np.random.default_rng(shape[0]).standard_normal(shape)
    for dtype in (np.float64, np.float32):
        got = gae_xp.discounted_cumsum(x.astype(dtype), 0.97, reverse=reverse, backend="xp")
        xp_assert_close(got, reference.discounted_cumsum_loop(x.astype(dtype).astype(np.float64), 0.97,
                                                              reverse=reverse), like=x.astype(dtype))


def _other_threads_cpu_ticks() -> dict[int, int]:
    """CPU time (clock ticks) of every thread of this process but the calling one, by thread id, from /proc."""
    import os
    import threading

    own, ticks = threading.get_native_id(), {}
    for task in os.listdir("/proc/self/task"):
        if int(task) == own:
            continue
        try:
            with open(f"/proc/self/task/{task}/stat") as handle:
                fields = handle.read().rsplit(")", 1)[1].split()
        except OSError:  # the thread ended meanwhile
            continue
        ticks[int(task)] = int(fields[11]) + int(fields[12])  # utime, stime
    return ticks


@pytest.mark.skipif(not __import__("os").path.exists("/proc/self/task"), reason="reads thread times from /proc")
@pytest.mark.parametrize("case", ["constant", "dones+mask"])
def test_the_generic_path_on_numpy_runs_on_the_calling_thread(case):
    # Black box: while the generic path runs on NumPy arrays, no other thread of the process computes (BLAS's
    # pool would: a product of the whole array in one BLAS call wakes it). A flat matmul of the same size, run the
    # same way, is the positive control: it must register, or the test could not fail.
    options = {} if case == "constant" else {"dones": 0.01, "holes": 0.2}
    arrays = make_case(np.random.default_rng(0), (8, 65536), dtype=np.float32, **options)
    flat = arrays["rewards"].reshape(-1, 32)
    square = np.ones((32, 32), dtype=np.float32)

    def ticks(call, seconds=0.5):
        call()
        before, start = _other_threads_cpu_ticks(), __import__("time").perf_counter()
        while __import__("time").perf_counter() - start < seconds:
            call()
        return {task: n - before.get(task, 0) for task, n in _other_threads_cpu_ticks().items()}

    # OpenBLAS's threads spin for about 2^28 cycles after their last work (its THREAD_TIMEOUT): let the spin of an
    # earlier product (the other case's control) end first.
    __import__("time").sleep(1.0)
    used = ticks(lambda: gae_xp.gae(**arrays, backend="xp"))
    control = ticks(lambda: flat @ square)  # after: BLAS's threads spin a while once woken
    blas = {task for task, n in control.items() if n > 0}  # other threads of the suite (JAX's, Dask's) may run too
    if not blas:
        pytest.skip("BLAS runs this product on one thread here (a BLAS without a pool, or one core): no control")
    on_blas = sum(used.get(task, 0) for task in blas)
    assert on_blas <= 1, (f"BLAS's threads used {on_blas} ticks during the generic path (the control: "
                          f"{sum(control[task] for task in blas)})")


def test_the_generic_path_on_torch_runs_on_one_thread_and_restores(monkeypatch):
    # Inside the generic backend PyTorch's intra-op pool has one thread (its hand-offs stall behind a busy
    # core); the caller's setting is back afterwards, also after an error, and another thread's is untouched.
    torch = pytest.importorskip("torch")
    import threading

    from gae_xp.backends import xp as generic

    case = make_case(np.random.default_rng(3), (4, 3000), dones=0.02, holes=0.2)
    arrays = {k: torch.from_numpy(v) if isinstance(v, np.ndarray) else v for k, v in case.items()}
    seen, real_scan = [], generic.scan

    def watching(*args, **kwargs):
        seen.append(torch.get_num_threads())
        return real_scan(*args, **kwargs)

    monkeypatch.setattr(generic, "scan", watching)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        advantages, returns = gae_xp.gae(**arrays, backend="xp")
        assert seen and set(seen) == {1}
        assert torch.get_num_threads() == 2
        want_a, want_r = expected(case)
        xp_assert_close(advantages, want_a, like=arrays["rewards"])
        xp_assert_close(returns, want_r, like=arrays["rewards"])

        def failing(*args, **kwargs):
            raise RuntimeError("inside the scan")

        monkeypatch.setattr(generic, "scan", failing)
        with pytest.raises(RuntimeError, match="inside the scan"):
            gae_xp.gae(**arrays, backend="xp")
        assert torch.get_num_threads() == 2

        monkeypatch.setattr(generic, "scan", watching)
        outside, inside = threading.Event(), threading.Event()
        other = []

        def neighbour_thread():
            torch.ones(100000).sum()  # this thread's pool settings are set up
            inside.set()
            outside.wait(10)
            other.append(torch.get_num_threads())

        thread = threading.Thread(target=neighbour_thread)
        thread.start()
        inside.wait(10)
        seen.clear()

        def watching_the_neighbour(*args, **kwargs):
            outside.set()
            thread.join(10)
            return watching(*args, **kwargs)

        monkeypatch.setattr(generic, "scan", watching_the_neighbour)
        gae_xp.gae(**arrays, backend="xp")
        assert other == [2] and set(seen) == {1}
    finally:
        torch.set_num_threads(before)
