"""The cost of a call beyond its arithmetic: a small gae() call against a bare numba loop, and the first call.

Both yardsticks are this file's own, the same for every commit (as the copy
floor of ``common.py``): the bare loops below (what a user writes in numba
for the same work: two outputs, one pass from the last step), timed in turns
with gae() in the same seconds, and a fresh process with an empty numba
cache for the first call.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import tempfile
import time

import numpy as np

try:
    import numba
except ImportError:  # the benchmarks skip
    numba = None

CASES = ["constant", "dones+mask"]


def _bare_loops():
    @numba.njit(cache=True)
    def constant(rewards, values, gamma, lam):
        advantages, returns = np.empty_like(rewards), np.empty_like(rewards)
        for row in range(rewards.shape[0]):
            following = next_value = 0.0
            for t in range(rewards.shape[1] - 1, -1, -1):
                following = rewards[row, t] + gamma * next_value - values[row, t] + gamma * lam * following
                next_value = values[row, t]
                advantages[row, t] = following
                returns[row, t] = following + next_value
        return advantages, returns

    @numba.njit(cache=True)
    def dones_mask(rewards, values, terminated, mask, gamma, lam):
        advantages, returns = np.empty_like(rewards), np.empty_like(rewards)
        for row in range(rewards.shape[0]):
            following = next_value = 0.0
            for t in range(rewards.shape[1] - 1, -1, -1):
                if not mask[row, t]:
                    advantages[row, t] = returns[row, t] = 0.0
                    continue
                if terminated[row, t]:
                    following = rewards[row, t] - values[row, t]
                else:
                    following = rewards[row, t] + gamma * next_value - values[row, t] + gamma * lam * following
                next_value = values[row, t]
                advantages[row, t] = following
                returns[row, t] = following + next_value
        return advantages, returns

    return constant, dones_mask


def _arrays(case, B=8, T=128):
    rng = np.random.default_rng(0)
    arrays = {"rewards": rng.standard_normal((B, T)).astype(np.float32),
              "values": rng.standard_normal((B, T)).astype(np.float32)}
    if case == "dones+mask":
        arrays["terminated"] = rng.random((B, T)) < 0.01
        arrays["mask"] = rng.random((B, T)) >= 0.2
    return arrays


class TrackSmallCallRatio:
    """gae() at B=8, T=128 float32 as a multiple of the bare numba loop (targets: 3x NumPy, 4x torch CPU)."""

    param_names = ["library", "case"]
    params = [["numpy", "torch"], CASES]
    unit = "x bare numba loop"
    timeout = 300

    def setup(self, library, case):
        if numba is None:
            raise NotImplementedError("numba is not installed")
        try:
            import gae_xp
        except ImportError as error:
            raise NotImplementedError(f"gae_xp is not installed in this environment: {error}") from None

        arrays = _arrays(case)
        constant, dones_mask = _bare_loops()
        if case == "constant":
            self.bare = lambda: constant(arrays["rewards"], arrays["values"], 0.99, 0.95)
        else:
            self.bare = lambda: dones_mask(arrays["rewards"], arrays["values"], arrays["terminated"], arrays["mask"],
                                           0.99, 0.95)
        if library == "torch":
            try:
                import torch
            except ImportError:
                raise NotImplementedError("torch is not installed") from None
            inputs = {name: torch.from_numpy(a) for name, a in arrays.items()}
        else:
            inputs = arrays
        self.call = lambda: gae_xp.gae(**inputs)
        self.bare()
        self.call()

    def track_x_bare_loop(self, library, case):
        best_call = best_bare = float("inf")
        for _ in range(7):
            for which in ("bare", "call"):
                f = self.bare if which == "bare" else self.call
                started = time.thread_time()
                for _ in range(1000):
                    f()
                took = time.thread_time() - started
                if which == "bare":
                    best_bare = min(best_bare, took)
                else:
                    best_call = min(best_call, took)
        return best_call / best_bare


_FIRST_CALL = """
import sys, time
import numpy as np
started = time.perf_counter()
import gae_xp
rng = np.random.default_rng(0)
shape = (8, int(sys.argv[2]))
r = rng.standard_normal(shape).astype(np.float32)
options = {} if sys.argv[1] == "constant" else {"terminated": rng.random(shape) < 0.01,
                                                 "mask": rng.random(shape) >= 0.2}
gae_xp.gae(r, r, **options)
print(time.perf_counter() - started)
"""


class TrackFirstCall:
    """Seconds from ``import gae_xp`` to the end of the first gae() call in a fresh process with an empty numba
    cache (B=8 float32, rows shorter and longer than the kernels' 1,024-step window; target: 1 s on a quiet
    machine)."""

    param_names = ["case", "T"]
    params = [CASES, [128, 4096]]
    unit = "seconds"
    timeout = 600
    number = 1
    repeat = 1

    def setup(self, case, T):
        if numba is None:
            raise NotImplementedError("numba is not installed")
        if importlib.util.find_spec("gae_xp") is None:
            raise NotImplementedError("gae_xp is not installed in this environment")

    def track_first_call_cold_cache(self, case, T):
        with tempfile.TemporaryDirectory() as cache:
            done = subprocess.run([sys.executable, "-c", _FIRST_CALL, case, str(T)], capture_output=True, text=True,
                                  env={**os.environ, "NUMBA_CACHE_DIR": cache}, check=True)
        return float(done.stdout.split()[-1])
