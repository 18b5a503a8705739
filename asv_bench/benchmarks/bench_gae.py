"""Speed, memory and accuracy of gae() per array library and dispatch path, and of the baselines."""

from __future__ import annotations

from gae_xp.bench import paths

from .common import BACKENDS, CHUNKS, DISPATCH, LENGTHS, XPBenchmark, chunk_size

TIME_VARYING = {"dones": (0.01, 0.0), "mask": (0.0, 0.2), "dones+mask": (0.01, 0.2)}


class TimeGAE(XPBenchmark):
    """Constant gamma and lam: the matmul local scan."""

    param_names = ["backend", "dispatch", "B", "T", "chunk_size"]
    params = [BACKENDS, DISPATCH, [8, 256], LENGTHS, CHUNKS]

    def setup(self, backend, dispatch, B, T, chunk):
        self.setup_library(backend)
        self.setup_workload(paths.Workload(B, T))
        self.path = self.gae_path(dispatch)
        self.run(self.path, chunk_size(chunk))  # warm-up, and jax.jit compilation

    def time_gae(self, backend, dispatch, B, T, chunk):
        self.run(self.path, chunk_size(chunk))


class TimeGAETimeVarying(XPBenchmark):
    """Terminations/truncations at 1% and masks with 20% holes: the doubling local scan."""

    param_names = ["backend", "dispatch", "T", "case"]
    params = [BACKENDS, DISPATCH, LENGTHS, list(TIME_VARYING)]

    def setup(self, backend, dispatch, T, case):
        self.setup_library(backend)
        dones, holes = TIME_VARYING[case]
        self.setup_workload(paths.Workload(8, T, dones=dones, holes=holes))
        self.path = self.gae_path(dispatch)
        self.run(self.path)

    def time_gae(self, backend, dispatch, T, case):
        self.run(self.path)


class TimeBaselines(XPBenchmark):
    """The serial loop, slime's chunk scan (Python loop over chunks) and the O(T^2) matrix, at B=8."""

    param_names = ["backend", "baseline", "T"]
    params = [BACKENDS, ["serial", "slime-chunked-64", "slime-chunked-128", "slime-chunked-256", "matrix"], LENGTHS]
    number = 1
    repeat = (1, 3, 30.0)
    warmup_time = 0.0
    timeout = 600

    def setup(self, backend, baseline, T):
        self.setup_library(backend)
        if baseline == "serial" and T > 4096 and backend in ("array_api_strict", "jax:cpu", "jax:cuda"):
            raise NotImplementedError("an eager per-step loop on this library takes minutes beyond T=4096")
        self.setup_workload(paths.Workload(8, T))
        name, _, size = baseline.partition("-chunked-")
        self.chunk = int(size) if size else None
        self.path = next(p for p in paths.BASELINES if p.name == ("slime-chunked" if size else name))
        reason = self.path.skip_reason(self.library, self.workload)
        if reason is not None:
            raise NotImplementedError(reason)

    def time_baseline(self, backend, baseline, T):
        self.run(self.path, self.chunk)


class PeakMemGAE(XPBenchmark):
    """Peak resident memory of a process that runs gae() once (asv's peakmem_), B=8."""

    param_names = ["backend", "T", "case"]
    params = [BACKENDS, LENGTHS, ["constant", "dones+mask"]]

    def setup(self, backend, T, case):
        self.setup_library(backend)
        dones, holes = TIME_VARYING.get(case, (0.0, 0.0))
        self.setup_workload(paths.Workload(8, T, dones=dones, holes=holes))
        self.path = self.gae_path("xp")

    def peakmem_gae(self, backend, T, case):
        self.run(self.path)

    def track_device_peak_bytes(self, backend, T, case):
        """Bytes allocated at the peak of one call, where the library can tell (torch CUDA); NaN elsewhere."""
        peak = self.library.peak_memory(lambda: self.run(self.path))
        return float("nan") if peak is None else peak

    track_device_peak_bytes.unit = "bytes"


class TrackAccuracy(XPBenchmark):
    """Max |error| of the advantages against the float64 loop, float32 inputs, B=8, T=131072."""

    param_names = ["backend", "path", "discounts"]
    params = [BACKENDS, ["gae_xp[xp]", "serial"], ["gamma=1 lam=1", "gamma=0.99 lam=0.95", "dones+mask"]]
    timeout = 600

    def setup(self, backend, path, discounts):
        self.setup_library(backend)
        if path == "serial" and backend != "numpy":
            raise NotImplementedError("the float32 serial loop's error is tracked on NumPy only")
        gamma, lam = (1.0, 1.0) if discounts == "gamma=1 lam=1" else (0.99, 0.95)
        dones, holes = TIME_VARYING["dones+mask"] if discounts == "dones+mask" else (0.0, 0.0)
        self.setup_workload(paths.Workload(8, 131072, dones=dones, holes=holes, gamma=gamma, lam=lam))
        self.path = next(p for p in paths.all_paths() if p.name == path)

    def track_max_abs_error(self, backend, path, discounts):
        return self.max_error(self.run(self.path))

    track_max_abs_error.unit = "absolute error"
