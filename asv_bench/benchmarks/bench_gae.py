"""Speed, memory and accuracy of gae() per library/backend target, and of the baselines."""

from __future__ import annotations

from .common import (
    CHUNKS,
    CPU_LIBRARIES,
    GENERIC_TARGETS,
    GPU_LIBRARIES,
    LENGTHS,
    TARGETS,
    XPBenchmark,
    chunk_size,
    copy_floor,
    ratio_to_floor,
    workload,
)


class TimeGAE(XPBenchmark):
    """Constant gamma and lam, the automatic chunk size, per library and backend."""

    param_names = ["target", "B", "T"]
    params = [TARGETS, [8, 256], LENGTHS]

    def setup(self, target, B, T):
        self.setup_target(target, workload(B, T))
        self.run(self.path)  # warm-up, and jax.jit compilation

    def time_gae(self, target, B, T):
        self.run(self.path)


class TimeGAETimeVarying(XPBenchmark):
    """Terminations/truncations at 1% and masks with 20% holes, B=8, T=131072, per library and backend.

    ``dones+mask`` is the agentic-RL case (tool-output tokens, right padding,
    packed episodes): a regression of any backend on it shows here.
    """

    param_names = ["target", "case"]
    params = [TARGETS, ["dones", "mask", "dones+mask"]]

    def setup(self, target, case):
        self.setup_target(target, workload(8, 131072, case))
        self.run(self.path)

    def time_gae(self, target, case):
        self.run(self.path)


class TrackCopyFloor(XPBenchmark):
    """gae() as a multiple of a copy of the same bytes, B=8, T=131072, timed in turns with the copy.

    The memory roofline of the machine the run is on, measured in the same
    seconds: a commit that slows gae() down shows here even when the whole
    machine is slower (or busier) than it was for the other commit.
    """

    param_names = ["target", "case"]
    params = [TARGETS, ["constant", "dones+mask"]]
    unit = "x copy floor"
    timeout = 300

    def setup(self, target, case):
        self.setup_target(target, workload(8, 131072, case))
        self.floor = copy_floor(self.library, self.arrays)

    def track_x_copy_floor(self, target, case):
        return ratio_to_floor(lambda: self.run(self.path), self.floor, self.library.synchronize)


class TimeGAEChunkSize(XPBenchmark):
    """The generic path at each chunk size, B=8, T=131072 (a constant discount's kernel is at most 32 wide)."""

    param_names = ["target", "case", "chunk_size"]
    params = [GENERIC_TARGETS, ["constant", "dones+mask"], CHUNKS]

    def setup(self, target, case, chunk):
        self.setup_target(target, workload(8, 131072, case))
        self.run(self.path, chunk_size(chunk))

    def time_gae(self, target, case, chunk):
        self.run(self.path, chunk_size(chunk))


class TimeSmallShapes(XPBenchmark):
    """B=8, T=128: the per-call overhead, against the serial loop on the same library."""

    param_names = ["target", "case"]
    params = [TARGETS + ["numpy/serial", "torch:cpu/serial"], ["constant", "dones+mask"]]

    def setup(self, target, case):
        name, backend = target.split("/")
        if backend == "serial":
            self.setup_library(name)
            self.setup_workload(workload(8, 128, case))
            self.path = self.find_path("serial")
        else:
            self.setup_target(target, workload(8, 128, case))
        self.run(self.path)

    def time_gae(self, target, case):
        self.run(self.path)


class TimeBaselines(XPBenchmark):
    """The serial loop, slime's chunk scan (Python loop over chunks), the O(T^2) matrix, and JAX's lax scans."""

    param_names = ["library", "baseline", "T"]
    params = [["numpy", "torch:cpu", "jax:cpu", "torch:cuda", "cupy", "jax:cuda"],
              ["serial", "slime-chunked-128", "matrix", "lax.scan", "lax.associative_scan"], [4096, 131072]]
    number = 1
    repeat = (1, 3, 30.0)
    warmup_time = 0.0
    timeout = 600

    def setup(self, library, baseline, T):
        self.setup_library(library)
        self.setup_workload(workload(8, T))
        name, _, size = baseline.partition("-chunked-")
        self.chunk = int(size) if size else None
        self.path = self.find_path("slime-chunked" if size else name)
        if not self.path.python_loop:
            self.run(self.path, self.chunk)  # jax.jit compilation

    def time_baseline(self, library, baseline, T):
        self.run(self.path, self.chunk)


class TimeJAXReferencesTimeVarying(XPBenchmark):
    """lax.scan and lax.associative_scan with dones and a holed mask, B=8, T=131072: JAX users' alternatives."""

    param_names = ["library", "baseline"]
    params = [["jax:cpu", "jax:cuda"], ["lax.scan", "lax.associative_scan"]]

    def setup(self, library, baseline):
        self.setup_library(library)
        self.setup_workload(workload(8, 131072, "dones+mask"))
        self.path = self.find_path(baseline)
        self.run(self.path)

    def time_baseline(self, library, baseline):
        self.run(self.path)


class TimeAdapters(XPBenchmark):
    """Each framework adapter and the framework's own function (``gae-xp adapters``' cases), B=8, T=8192."""

    param_names = ["library", "function", "side"]
    params = [["torch:cpu", "torch:cuda"],
              ["verl compute_gae_advantage_return", "slime vanilla_gae", "slime chunked_gae (C=128)",
               "OpenRLHF get_advantages_and_returns", "torchrl generalized_advantage_estimate",
               "torchrl vtrace_advantage_estimate"],
              ["framework", "gae_xp"]]
    number = 1
    repeat = (1, 5, 20.0)
    warmup_time = 0.0
    timeout = 600

    def setup(self, library, function, side):
        self.setup_library(library)
        try:
            from gae_xp.bench.adapters import adapter_cases
        except ImportError as error:
            raise NotImplementedError(f"this version has no adapter_cases: {error}") from None
        cases = {name: (framework, ours) for name, framework, ours in adapter_cases(self.library, 8, 8192)}
        if function not in cases:
            raise NotImplementedError(f"{function} is not available here (torchrl not installed?)")
        self.call = cases[function][0 if side == "framework" else 1]
        self.call()

    def time_call(self, library, function, side):
        self.library.synchronize(self.call())


class PeakMemGAE(XPBenchmark):
    """Peak resident memory of a process that runs gae() once on the CPU (asv's peakmem_), B=8, T=131072."""

    param_names = ["library", "case"]
    params = [CPU_LIBRARIES, ["constant", "dones+mask"]]

    def setup(self, library, case):
        self.setup_target(f"{library}/xp", workload(8, 131072, case))

    def peakmem_gae(self, library, case):
        self.run(self.path)


class TrackGPUMemory(XPBenchmark):
    """Bytes allocated on the device at the peak of one gae() call, where the library tells (torch CUDA)."""

    param_names = ["library", "case"]
    params = [GPU_LIBRARIES, ["constant", "dones+mask"]]
    unit = "bytes"

    def setup(self, library, case):
        self.setup_target(f"{library}/xp", workload(8, 131072, case))
        if self.library.peak_memory(lambda: None) is None:
            raise NotImplementedError(f"{library} gives no peak-memory figure")

    def track_device_peak_bytes(self, library, case):
        return self.library.peak_memory(lambda: self.run(self.path))


class TrackAccuracy(XPBenchmark):
    """Max |error| of the advantages against the float64 loop, float32 inputs, B=8, T=131072."""

    param_names = ["target", "discounts"]
    params = [TARGETS + ["numpy/serial"], ["gamma=1 lam=1", "gamma=0.99 lam=0.95", "dones+mask"]]
    unit = "absolute error"
    timeout = 600

    def setup(self, target, discounts):
        gamma, lam = (1.0, 1.0) if discounts == "gamma=1 lam=1" else (0.99, 0.95)
        case = "dones+mask" if discounts == "dones+mask" else "constant"
        load = workload(8, 131072, case, gamma=gamma, lam=lam)
        name, backend = target.split("/")
        if backend == "serial":
            self.setup_library(name)
            self.setup_workload(load)
            self.path = self.find_path("serial")
        else:
            self.setup_target(target, load)

    def track_max_abs_error(self, target, discounts):
        return self.max_error(self.run(self.path))
