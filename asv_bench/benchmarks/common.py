"""The base of every benchmark class: one ``backend`` parameter over the array libraries.

Modelled on SciPy's ``XPBenchmark``: ``setup`` raises ``NotImplementedError``
(asv's "skip") for a library that is not installed or has no device, and each
timed call waits for the device (CUDA synchronize, JAX ``block_until_ready``).
"""

from __future__ import annotations

import numpy as np

from gae_xp import backends
from gae_xp.bench import libraries, paths

BACKENDS = list(libraries.NAMES)
DISPATCH = ["xp", "numba", "numba-cuda"]
CHUNKS = ["auto", 64, 128, 256]
LENGTHS = [4096, 65536, 131072]


def chunk_size(value):
    return None if value == "auto" else int(value)


class XPBenchmark:
    """Subclasses list ``backend`` first in ``param_names``."""

    timeout = 300

    def setup_library(self, backend):
        reason = libraries.unavailable(backend)
        if reason is not None:
            raise NotImplementedError(reason)
        self.library = libraries.load(backend)

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
