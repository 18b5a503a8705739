"""The base of every benchmark class: an array-library parameter, skipped cleanly where it cannot run.

Modelled on SciPy's ``XPBenchmark``: ``setup`` raises ``NotImplementedError``
(asv's "skip") for a library that is not installed or has no device, and each
timed call waits for the device (CUDA synchronize, JAX ``block_until_ready``).
asv runs every parameter combination in a process of its own, so the
parameters list the meaningful combinations only (a library with the gae_xp
backends that can serve it), which keeps ``asv run --quick`` short.
"""

from __future__ import annotations

import numpy as np

from gae_xp import backends
from gae_xp.bench import libraries, paths

#: "library/dispatch": every gae_xp backend on every library it can serve.
TARGETS = ["numpy/xp", "numpy/numba", "array_api_strict/xp", "torch:cpu/xp", "jax:cpu/xp",
           "torch:cuda/xp", "torch:cuda/numba-cuda", "cupy/xp", "cupy/numba-cuda", "jax:cuda/xp"]
GENERIC_TARGETS = ["numpy/xp", "torch:cpu/xp", "jax:cpu/xp", "torch:cuda/xp", "cupy/xp"]
CPU_LIBRARIES = ["numpy", "array_api_strict", "torch:cpu", "jax:cpu"]
GPU_LIBRARIES = ["torch:cuda", "cupy"]
CHUNKS = ["auto", 64, 128, 256]
LENGTHS = [4096, 65536, 131072]
TIME_VARYING = {"constant": (0.0, 0.0), "dones": (0.01, 0.0), "mask": (0.0, 0.2), "dones+mask": (0.01, 0.2)}


def chunk_size(value):
    return None if value == "auto" else int(value)


class XPBenchmark:
    timeout = 300

    def setup_library(self, name):
        reason = libraries.unavailable(name)
        if reason is not None:
            raise NotImplementedError(reason)
        self.library = libraries.load(name)

    def setup_target(self, target, workload: paths.Workload):
        """Load the library of "library/dispatch", lay the workload out in it, and pick the gae_xp path."""
        name, dispatch = target.split("/")
        self.setup_library(name)
        self.setup_workload(workload)
        self.path = self.gae_path(dispatch)

    def setup_workload(self, workload: paths.Workload):
        self.workload = workload
        self.arrays = {k: self.library.asarray(v) for k, v in workload.arrays().items()}

    def gae_path(self, dispatch: str):
        if dispatch not in backends.REGISTRY:
            raise NotImplementedError(f"backend {dispatch!r} is not registered in this version")
        path = next(p for p in paths.all_paths() if p.name == f"gae_xp[{dispatch}]")
        reason = path.skip_reason(self.library, self.workload)
        if reason is not None:
            raise NotImplementedError(reason)
        return path

    def run(self, path, chunk=None):
        result = path.run(self.arrays, self.workload, chunk, self.library)
        self.library.synchronize(result)
        return result

    def max_error(self, result) -> float:
        got = self.library.to_numpy(result[0]).astype(np.float64)
        return float(np.max(np.abs(got - paths.exact_advantages(self.workload)), initial=0.0))
