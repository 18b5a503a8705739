"""A call's work units shared between the calling thread and helper threads that are never waited for idle.

The numba kernels solve work units ``first .. stop - 1`` (spans of rows,
segments, rows) and release the GIL. ``share`` cuts a call's units into a
few items and hands them out one at a time, under a lock, to whoever asks
first: the calling thread, which works until no item is left, and up to
``threads - 1`` helpers of a process-wide pool. The call returns when every
item that was *taken* is done; a helper that has not started by then takes
nothing and is cancelled.

Why not numba's own ``prange``: an OpenMP-style team ends every parallel
region at a barrier that waits for each of its threads, so on a machine
whose other cores are taken (a data loader, environment workers, other
ranks) the call waits for the operating system to give each thread a turn.
Measured on this project's 2-core machine with one core busy, B=8,
T=131072, float32: ``prange`` over two threads 8.0 ms per call, one thread
1.0 ms. Here the caller never waits for a thread that took no item, so a
busy machine costs at most an item that a helper was preempted in.
"""

from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor

#: Items per thread a call is cut into: few (each is a kernel call from Python, a few microseconds), but more
#: than one, so that a thread that starts late or runs slowly leaves its share to the others.
ITEMS_PER_THREAD = 2


def share(kernel, args: tuple, units: int, threads: int) -> None:
    """Run ``kernel(*args, first, stop)`` over the units ``[0, units)``: on the calling thread alone when
    ``threads <= 1``, else also on up to ``threads - 1`` helpers. An error in any item is raised here, after
    every taken item has finished."""
    items = min(units, ITEMS_PER_THREAD * threads) if threads > 1 else 1
    if items <= 1:
        kernel(*args, 0, units)
        return
    work = _Work(kernel, args, [units * i // items for i in range(items + 1)])
    pool = _POOL.executor(threads - 1)
    helpers = [pool.submit(work.run) for _ in range(min(threads, items) - 1)]
    work.run()
    work.wait()
    for helper in helpers:
        helper.cancel()
    if work.error is not None:
        raise work.error


class _Work:
    """One call's items: ``bounds[i] .. bounds[i + 1]`` is item i; ``taken`` and ``finished`` count them."""

    def __init__(self, kernel, args, bounds):
        self.kernel, self.args, self.bounds = kernel, args, bounds
        self.taken = self.finished = 0
        self.error: BaseException | None = None
        self.changed = threading.Condition()

    def run(self) -> None:
        while True:
            with self.changed:
                if self.taken == len(self.bounds) - 1 or self.error is not None:
                    return
                item = self.taken
                self.taken += 1
            try:
                self.kernel(*self.args, self.bounds[item], self.bounds[item + 1])
            except BaseException as error:  # handed to the caller, which raises it
                with self.changed:
                    self.error = self.error or error
            finally:
                with self.changed:
                    self.finished += 1
                    self.changed.notify_all()

    def wait(self) -> None:
        """Until every taken item is done (called by the caller once it found none left)."""
        with self.changed:
            self.changed.wait_for(lambda: self.finished == self.taken)


class _Pool:
    """The process-wide helper threads, made on first use and grown when more are asked for; a forked child
    starts without any (threads do not survive a fork)."""

    def __init__(self):
        self._lock = threading.Lock()
        self._executor: ThreadPoolExecutor | None = None
        self._size = 0

    def executor(self, helpers: int) -> ThreadPoolExecutor:
        with self._lock:
            if self._executor is None or self._size < helpers:
                if self._executor is not None:
                    self._executor.shutdown(wait=False)
                self._executor = ThreadPoolExecutor(helpers, thread_name_prefix="gae_xp")
                self._size = helpers
            return self._executor

    def after_in_child(self) -> None:
        self.__init__()


_POOL = _Pool()
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_POOL.after_in_child)
