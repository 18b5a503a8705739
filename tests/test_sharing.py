"""``gae_xp.backends._sharing``: a call's units shared between the calling thread and helpers that are never waited
for unless they took work; the numba kernels (forward and backward) on shared units equal the calling thread's."""

from __future__ import annotations

import threading
import time
from concurrent.futures import Future

import numpy as np
import pytest
from conftest import load_target

from gae_xp import _prepare
from gae_xp.backends import _sharing
from gae_xp.testing import make_case


def _recording():
    seen, lock = [], threading.Lock()

    def kernel(tag, first, stop):
        with lock:
            seen.append((tag, threading.get_ident(), first, stop))

    return kernel, seen


@pytest.mark.parametrize("units", [1, 2, 3, 7, 100])
@pytest.mark.parametrize("threads", [1, 2, 3, 8])
def test_every_unit_runs_exactly_once(units, threads):
    kernel, seen = _recording()
    _sharing.share(kernel, ("x",), units, threads)
    covered = sorted(u for _, _, first, stop in seen for u in range(first, stop))
    assert covered == list(range(units))
    assert len(seen) <= max(1, min(units, _sharing.ITEMS_PER_THREAD * threads))
    if threads == 1:
        assert len(seen) == 1 and seen[0][1] == threading.get_ident()


class _NeverStarts:
    """An executor whose helpers never get a core (a busy machine): their tasks stay queued."""

    def __init__(self):
        self.futures = []

    def submit(self, fn):
        future = Future()
        self.futures.append(future)
        return future


def test_helpers_that_never_start_are_not_waited_for_and_are_cancelled(monkeypatch):
    pool = _NeverStarts()
    monkeypatch.setattr(_sharing._POOL, "executor", lambda helpers: pool)
    kernel, seen = _recording()
    started = time.monotonic()
    _sharing.share(kernel, ("x",), 10, 4)
    assert time.monotonic() - started < 60  # it returned at all: nothing waited for the idle helpers
    assert sorted(u for _, _, first, stop in seen for u in range(first, stop)) == list(range(10))
    assert {ident for _, ident, _, _ in seen} == {threading.get_ident()}
    assert len(pool.futures) == 3 and all(future.cancelled() for future in pool.futures)


def test_a_helper_that_took_an_item_is_waited_for():
    release, entered = threading.Event(), threading.Event()
    done = []

    def kernel(first, stop):
        if threading.current_thread() is not threading.main_thread() and not entered.is_set():
            entered.set()
            release.wait(30)
        done.append((first, stop))

    caller = threading.Thread(target=_sharing.share, args=(kernel, (), 2, 2))
    caller.start()
    if entered.wait(10):  # a helper took an item: the call must not return before that item is done
        time.sleep(0.2)
        assert caller.is_alive()
        release.set()
    caller.join(30)
    assert not caller.is_alive()
    assert sorted(done) == [(0, 1), (1, 2)]


def test_an_error_in_any_item_is_raised_by_the_caller():
    def kernel(first, stop):
        if first == 3:
            raise ZeroDivisionError("item 3")

    with pytest.raises(ZeroDivisionError, match="item 3"):
        _sharing.share(kernel, (), 8, 4)


@pytest.fixture
def numba_cpu():
    load_target("numpy/numba")
    from gae_xp.backends import numba_cpu

    return numba_cpu


@pytest.mark.parametrize("threads", [2, 3])
def test_the_backward_kernel_on_shared_units_equals_the_calling_threads(numba_cpu, monkeypatch, threads):
    from gae_xp.backends import _numba_backward

    rng = np.random.default_rng(4)
    case = make_case(rng, (5, 3000), dones=0.01, holes=0.1)
    call = _prepare.prepare(**{k: case[k] for k in ("rewards", "values", "terminated", "truncated", "mask")},
                            gamma=0.99, lam=0.95, critic_lam=0.5, truncated_bootstrap="next_step")
    grads = rng.standard_normal((2, *case["rewards"].shape))
    monkeypatch.setattr(numba_cpu, "_threads_for", lambda size, units: 1)
    alone = _numba_backward.gae_backward(call.problem, *grads)
    monkeypatch.setattr(numba_cpu, "_threads_for", lambda size, units: threads)
    shared = _numba_backward.gae_backward(call.problem, *grads)
    for name, value in alone.items():
        if value is None:
            assert shared[name] is None
        else:
            np.testing.assert_array_equal(shared[name], value, err_msg=name)
