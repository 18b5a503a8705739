"""The generic path: the chunk scan on the array API, for every namespace and device."""

from __future__ import annotations

from gae_xp._compat import calling_thread_only
from gae_xp._recurrences import gae_on_scan
from gae_xp._scan import scan


class ArrayAPIBackend:
    name = "xp"
    segments = True
    uses_chunk_size = True
    critic_lam = True
    summarize = None

    def unavailable_reason(self, xp, arrays, *, forced=False):
        return None

    def scan(self, xp, x, a, *, reverse, chunk_size):
        with calling_thread_only(x):
            return scan(xp, x, a, reverse=reverse, chunk_size=chunk_size)

    def gae(self, problem, *, chunk_size):
        with calling_thread_only(problem.rewards):
            return gae_on_scan(problem, chunk_size=chunk_size, solve=self.scan)


BACKEND = ArrayAPIBackend()
