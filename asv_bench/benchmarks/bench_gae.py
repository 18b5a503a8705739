"""Speed, memory and accuracy of gae() per array library and dispatch path, and of the baselines."""

from __future__ import annotations

from gae_xp.bench import paths

from .common import (CHUNKS, CPU_LIBRARIES, GENERIC_TARGETS, GPU_LIBRARIES, LENGTHS, TARGETS, TIME_VARYING,
                     XPBenchmark, chunk_size)


class TimeGAE(XPBenchmark):
    """Constant gamma and lam, the automatic chunk size, per library and dispatch path."""

    param_names = ["target", "B", "T"]
    params = [TARGETS, [8, 256], LENGTHS]

    def setup(self, target, B, T):
        self.setup_target(target, paths.Workload(B, T))
        self.run(self.path)  # warm-up, and jax.jit compilation

    def time_gae(self, target, B, T):
        self.run(self.path)


class TimeGAEChunkSize(XPBenchmark):
    """The generic path at each chunk size, B=8, T=131072."""

    param_names = ["target", "chunk_size"]
    params = [GENERIC_TARGETS, CHUNKS]

    def setup(self, target, chunk):
        self.setup_target(target, paths.Workload(8, 131072))
        self.run(self.path, chunk_size(chunk))

    def time_gae(self, target, chunk):
        self.run(self.path, chunk_size(chunk))


class TimeGAETimeVarying(XPBenchmark):
    """Terminations/truncations at 1% and masks with 20% holes (the doubling local scan), B=8, T=131072."""

    param_names = ["target", "case"]
    params = [TARGETS, ["dones", "mask", "dones+mask"]]

    def setup(self, target, case):
        dones, holes = TIME_VARYING[case]
        self.setup_target(target, paths.Workload(8, 131072, dones=dones, holes=holes))
        self.run(self.path)

    def time_gae(self, target, case):
        self.run(self.path)


class TimeBaselines(XPBenchmark):
    """The serial loop, slime's chunk scan (Python loop over chunks) and the O(T^2) matrix, at B=8."""

    param_names = ["library", "baseline", "T"]
    params = [["numpy", "torch:cpu", "jax:cpu", "torch:cuda", "cupy"],
              ["serial", "slime-chunked-64", "slime-chunked-128", "slime-chunked-256", "matrix"], [4096, 131072]]
    number = 1
    repeat = (1, 3, 30.0)
    warmup_time = 0.0
    timeout = 600

    def setup(self, library, baseline, T):
        self.setup_library(library)
        if baseline != "matrix" and library.startswith("jax"):
            raise NotImplementedError("a Python loop over time on eager JAX arrays takes minutes (each step compiles)")
        self.setup_workload(paths.Workload(8, T))
        name, _, size = baseline.partition("-chunked-")
        self.chunk = int(size) if size else None
        self.path = next(p for p in paths.BASELINES if p.name == ("slime-chunked" if size else name))
        reason = self.path.skip_reason(self.library, self.workload)
        if reason is not None:
            raise NotImplementedError(reason)

    def time_baseline(self, library, baseline, T):
        self.run(self.path, self.chunk)


class PeakMemGAE(XPBenchmark):
    """Peak resident memory of a process that runs gae() once on the CPU (asv's peakmem_), B=8, T=131072."""

    param_names = ["library", "case"]
    params = [CPU_LIBRARIES, ["constant", "dones+mask"]]

    def setup(self, library, case):
        dones, holes = TIME_VARYING[case]
        self.setup_target(f"{library}/xp", paths.Workload(8, 131072, dones=dones, holes=holes))

    def peakmem_gae(self, library, case):
        self.run(self.path)


class TrackGPUMemory(XPBenchmark):
    """Bytes allocated on the device at the peak of one gae() call, where the library tells (torch CUDA)."""

    param_names = ["library", "case"]
    params = [GPU_LIBRARIES, ["constant", "dones+mask"]]
    unit = "bytes"

    def setup(self, library, case):
        dones, holes = TIME_VARYING[case]
        self.setup_target(f"{library}/xp", paths.Workload(8, 131072, dones=dones, holes=holes))
        if self.library.peak_memory(lambda: None) is None:
            raise NotImplementedError(f"{library} gives no peak-memory figure")

    def track_device_peak_bytes(self, library, case):
        return self.library.peak_memory(lambda: self.run(self.path))


class TrackAccuracy(XPBenchmark):
    """Max |error| of the advantages against the float64 loop, float32 inputs, B=8, T=131072."""

    param_names = ["target", "discounts"]
    params = [["numpy/xp", "numpy/numba", "numpy/serial", "torch:cpu/xp", "jax:cpu/xp", "torch:cuda/numba-cuda",
               "cupy/numba-cuda"],
              ["gamma=1 lam=1", "gamma=0.99 lam=0.95", "dones+mask"]]
    unit = "absolute error"
    timeout = 600

    def setup(self, target, discounts):
        gamma, lam = (1.0, 1.0) if discounts == "gamma=1 lam=1" else (0.99, 0.95)
        dones, holes = TIME_VARYING["dones+mask"] if discounts == "dones+mask" else (0.0, 0.0)
        workload = paths.Workload(8, 131072, dones=dones, holes=holes, gamma=gamma, lam=lam)
        name, dispatch = target.split("/")
        if dispatch == "serial":
            self.setup_library(name)
            self.setup_workload(workload)
            self.path = next(p for p in paths.BASELINES if p.name == "serial")
        else:
            self.setup_target(target, workload)

    def track_max_abs_error(self, target, discounts):
        return self.max_error(self.run(self.path))
