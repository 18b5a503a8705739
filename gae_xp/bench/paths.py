"""What the benchmarks time: gae_xp's dispatch paths and the baselines, on one workload.

Paths:

* ``gae_xp[<backend>]``: ``gae_xp.gae`` forced onto one backend of the
  registry (``xp`` always; ``numba``, ``numba-cuda``, ``jax`` where registered
  and able to serve the library), for every chunk size asked for where the
  backend takes one (the numba CPU kernel and the JAX lax.scan backend have
  no chunks); on JAX under ``jax.jit``, as JAX users run it;
* ``serial``: the per-step loop over time, vectorised over the batch
  (slime's loop; ``reference.gae_loop`` when dones or a mask are in play), on
  every library but JAX, where an eager Python loop compiles each step and
  nobody writes it: there ``lax.scan`` is the loop;
* ``lax.scan``, ``lax.associative_scan``: what JAX users write instead, with
  the same contract (dones, mask, V at the next real step), under ``jax.jit``;
* ``slime-chunked``: slime's published chunk scan with a Python loop over
  chunks (constant discount only; PyTorch code, run on NumPy and torch);
* ``matrix``: the O(T^2) matrix method (constant discount, T <= 8192), opt-in
  (``--all-paths`` or ``--paths matrix``): it costs seconds and hundreds of MiB
  to tell what the other baselines tell already;
* ``lfilter``: ``scipy.signal.lfilter`` on the reversed deltas (NumPy, constant
  discount only), the classic fastest CPU trick;
* ``numba-bare``: a bare numba one-pass loop, parallel over rows, for the
  constant-discount case only: the floor a compiled CPU path can reach, and
  independent of gae_xp's kernel (it is the yardstick).

Beside them, not a path but the yardstick of every row: :func:`copy_floor`,
a copy of the same bytes (the memory roofline). Every path carries the
one-line ``description`` that the bench's legend prints.
"""

from __future__ import annotations

import functools
import importlib.util
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

import gae_xp
from gae_xp import backends, reference
from gae_xp._compat import array_namespace
from gae_xp.bench import baselines
from gae_xp.testing.cases import make_case
from gae_xp.testing.libraries import CPU_NAMES, Library

MATRIX_MAX_T = 8192
#: Arrays of the inputs' float dtype that any GAE moves at the least: it reads rewards and values, writes
#: advantages and returns. The copy floor moves exactly these bytes.
FLOOR_ARRAYS = 4


@dataclass(frozen=True)
class Workload:
    """Random rewards and values of shape (B, T), with optional dones and a holed mask."""

    B: int
    T: int
    dtype: str = "float32"
    dones: float = 0.0
    holes: float = 0.0
    gamma: float = 0.99
    lam: float = 0.95
    seed: int = 0

    @property
    def time_varying(self) -> bool:
        return self.dones > 0 or self.holes > 0

    @property
    def case(self) -> str:
        """constant, dones, mask or dones+mask."""
        return "+".join(name for name, p in (("dones", self.dones), ("mask", self.holes)) if p > 0) or "constant"

    def arrays(self, dtype: str | None = None) -> dict[str, np.ndarray]:
        """rewards, values (and terminated, truncated, mask) as NumPy arrays in ``dtype`` (default: the workload's)."""
        return {k: (v.astype(dtype or self.dtype) if v.dtype.kind == "f" else v) for k, v in _draw(self).items()}


@functools.lru_cache(maxsize=8)
def _draw(workload: Workload) -> dict[str, np.ndarray]:
    case = make_case(np.random.default_rng(workload.seed), (workload.B, workload.T), dones=workload.dones,
                     holes=workload.holes)
    return {name: value for name, value in case.items() if isinstance(value, np.ndarray)}


@functools.lru_cache(maxsize=4)
def exact_advantages(workload: Workload) -> np.ndarray:
    """The float64 per-step loop's advantages: what every path's error is measured against."""
    arrays = workload.arrays("float64")
    if not workload.time_varying:  # the same numbers, from the leaner loop
        return baselines.slime_serial_gae(arrays["rewards"], arrays["values"], workload.gamma, workload.lam)[0]
    return reference.gae_loop(**arrays, gamma=workload.gamma, lam=workload.lam, truncated_bootstrap="next_step")[0]


#: The cases a workload can be, and the probabilities they use (``--dones``, ``--mask-holes``).
CASES = ("constant", "dones", "mask", "dones+mask")


def case_probabilities(case: str, dones: float, holes: float) -> tuple[float, float]:
    """(dones, holes) of a named case."""
    if case not in CASES:
        raise ValueError(f"unknown case {case!r}; choose from {', '.join(CASES)}")
    return (dones if "dones" in case else 0.0), (holes if "mask" in case else 0.0)


@dataclass(frozen=True)
class Path:
    name: str
    #: whether the chunk size changes what the path runs (so that sweeping it means something);
    #: None (auto) is offered only to gae_xp paths.
    chunked: bool
    #: True for paths with a Python loop over time (steps or chunks): their time grows like T with a large
    #: constant, so past the time budget they run on a prefix and are extrapolated.
    python_loop: bool
    skip_reason: Callable[[Library, Workload], str | None]
    run: Callable[..., tuple]
    #: what the path is, in one line (the table's legend)
    description: str = ""
    #: why the path is left out of a default run (it costs more than it tells), or None: a default path
    opt_in: str | None = None

    @property
    def ours(self) -> bool:
        return self.name.startswith("gae_xp[")

    @property
    def backend(self) -> str | None:
        """The gae_xp backend a ``gae_xp[...]`` path forces, else None."""
        return self.name[len("gae_xp["):-1] if self.ours else None

    def effective_chunk(self, workload: Workload, requested: int | None) -> int | None:
        """The piece length that runs for a requested chunk size (None: auto), or None where no chunks are used.

        gae_xp's rule (``choose_chunk_size``) resolves auto, caps a constant
        discount's kernel width and never goes past T; slime's scan takes the
        size as given.
        """
        if not self.chunked:
            return None
        if not self.ours:
            return requested
        from gae_xp._scan import choose_chunk_size

        return choose_chunk_size(workload.T, not workload.time_varying, requested)


def _gae_xp_path(backend: str) -> Path:
    def skip(library, workload):

        sample = library.asarray(np.zeros((1, 1), dtype=workload.dtype))
        return backends.load(backend).unavailable_reason(array_namespace(sample), [sample],
                                                         forced=True)

    @functools.lru_cache(maxsize=64)
    def compiled(library, workload, chunk):
        def call(rewards, values, terminated, truncated, mask):
            # the workload's truncations have no final observations: the next step's value bootstraps them
            return gae_xp.gae(rewards, values, gamma=workload.gamma, lam=workload.lam, terminated=terminated,
                              truncated=truncated, mask=mask, chunk_size=chunk, backend=backend,
                              truncated_bootstrap="next_step")

        return library.compile(call)

    def run(arrays, workload, chunk, library):
        return compiled(library, workload, chunk)(arrays["rewards"], arrays["values"], arrays.get("terminated"),
                                                  arrays.get("truncated"), arrays.get("mask"))

    return Path(f"gae_xp[{backend}]", backends.load(backend).uses_chunk_size, False, skip, run,
                f"gae_xp.gae(..., backend='{backend}'): gae_xp forced onto its {backend} backend")


def _jax_only(library, workload):
    return None if library.name.startswith("jax") else "a JAX reference (lax.scan, lax.associative_scan)"


def _not_jax(what):
    def skip(library, workload):
        if library.name.startswith("jax"):
            return f"{what} on eager JAX arrays compiles every step; JAX's loop is lax.scan"
        return None

    return skip


def _lax_path(name: str, solve, description: str) -> Path:
    @functools.lru_cache(maxsize=16)
    def compiled(library, workload):
        def call(rewards, values, terminated, truncated, mask):
            return solve(rewards, values, workload.gamma, workload.lam, terminated, truncated, mask)

        return library.compile(call)

    def run(arrays, workload, chunk, library):
        return compiled(library, workload)(arrays["rewards"], arrays["values"], arrays.get("terminated"),
                                           arrays.get("truncated"), arrays.get("mask"))

    return Path(name, False, False, _jax_only, run, description)


def loop_baseline(library_name: str) -> str:
    """The path the 'vs loop' column divides by: the serial loop, or lax.scan on JAX."""
    return "lax.scan" if library_name.startswith("jax") else "serial"


def _serial_run(arrays, workload, chunk, library):
    if workload.time_varying:
        return reference.gae_loop(**arrays, gamma=workload.gamma, lam=workload.lam, truncated_bootstrap="next_step")
    return baselines.slime_serial_gae(arrays["rewards"], arrays["values"], workload.gamma, workload.lam)


def _constant_only(library, workload):
    return "dones and masks need the general contract" if workload.time_varying else None


def _slime_skip(library, workload):
    return _not_jax("slime's chunk scan")(library, workload) or _constant_only(library, workload)


def _matrix_skip(library, workload):
    if workload.T > MATRIX_MAX_T:
        return f"O(T^2) memory: T > {MATRIX_MAX_T}"
    return _constant_only(library, workload)


def _numpy_baseline(module: str, what: str):
    """The skip rule of a NumPy-only baseline built on ``module``, for the constant-discount case."""
    def skip(library, workload):
        if library.name != "numpy":
            return f"{what} takes NumPy arrays"
        if importlib.util.find_spec(module) is None:
            return f"{module} is not installed"
        return _constant_only(library, workload)

    return skip


def _lfilter_run(arrays, workload, chunk, library):
    from scipy.signal import lfilter

    rewards, values = arrays["rewards"], arrays["values"]
    following = np.concatenate([values[:, 1:], np.zeros_like(values[:, :1])], axis=1)
    delta = rewards + workload.gamma * following - values
    w = workload.gamma * workload.lam
    advantages = lfilter([1.0], [1.0, -w], delta[:, ::-1], axis=-1)[:, ::-1].astype(rewards.dtype)
    return advantages, advantages + values


@functools.lru_cache(maxsize=1)
def _bare_numba_kernel():
    import numba

    @numba.njit(parallel=True)
    def kernel(rewards, values, gamma, lam, advantages, returns):
        for row in numba.prange(rewards.shape[0]):
            following = 0.0
            next_value = 0.0
            for t in range(rewards.shape[1] - 1, -1, -1):
                following = rewards[row, t] + gamma * next_value - values[row, t] + gamma * lam * following
                next_value = values[row, t]
                advantages[row, t] = following
                returns[row, t] = following + next_value

    return kernel


def _bare_numba_run(arrays, workload, chunk, library):
    rewards, values = arrays["rewards"], arrays["values"]
    advantages, returns = np.empty_like(rewards), np.empty_like(rewards)
    _bare_numba_kernel()(rewards, values, workload.gamma, workload.lam, advantages, returns)
    return advantages, returns


BASELINES = (
    Path("serial", False, True, _not_jax("a Python loop over time"), _serial_run,
         "the per-step Python loop over time, vectorised over the batch, that slime, verl and CleanRL write "
         "(the full-contract loop with dones or a mask): what you have now"),
    _lax_path("lax.scan", baselines.jax_scan_gae, "JAX users' own loop: jax.lax.scan over time under jax.jit"),
    _lax_path("lax.associative_scan", baselines.jax_associative_scan_gae,
              "JAX users' parallel alternative: jax.lax.associative_scan under jax.jit"),
    Path("slime-chunked", True, True, _slime_skip,
         lambda arrays, workload, chunk, library: baselines.slime_chunked_gae(arrays["rewards"], arrays["values"],
                                                                     workload.gamma, workload.lam, chunk),
         "slime's published chunk scan: one matmul per chunk, then a Python loop over the chunks for the carry "
         "(constant discount only)"),
    Path("matrix", False, False, _matrix_skip,
         lambda arrays, workload, chunk, library: baselines.gae_matrix(arrays["rewards"], arrays["values"],
                                                              gamma=workload.gamma, lam=workload.lam),
         "the fully parallel O(T^2) form A = delta @ W with a T x T decay matrix (constant discount, T <= "
         f"{MATRIX_MAX_T})",
         opt_in="O(T^2) time and memory: at B=8, T=4096 about 0.8 s and 272 MiB per call on NumPy"),
    Path("lfilter", False, False, _numpy_baseline("scipy", "scipy.signal.lfilter"), _lfilter_run,
         "scipy.signal.lfilter([1], [1, -gamma*lam]) on the reversed deltas: the classic fastest CPU trick "
         "(NumPy, constant discount only)"),
    Path("numba-bare", False, False, _numpy_baseline("numba", "the bare numba loop"), _bare_numba_run,
         "a bare numba loop over time, parallel over rows, no code shared with gae_xp's kernel: what a compiled "
         "CPU loop reaches (NumPy, constant discount only)"),
)


@functools.lru_cache(maxsize=1)
def all_paths() -> tuple[Path, ...]:
    """gae_xp on every registered backend, then the baselines (built once: JAX's compiled calls are kept)."""
    return tuple(_gae_xp_path(name) for name in backends.REGISTRY) + BASELINES


def default_paths(paths: tuple[Path, ...] | None = None) -> tuple[Path, ...]:
    """The paths a run without ``--paths`` or ``--all-paths`` times: all but the opt-in ones."""
    return tuple(p for p in (all_paths() if paths is None else paths) if p.opt_in is None)


def prefix(arrays: dict, steps: int) -> dict:
    """The first ``steps`` time steps of every array (for extrapolating a slow serial loop)."""
    return {k: v[:, :steps] for k, v in arrays.items()}


def copy_floor(library: Library, arrays: dict) -> Callable[[], Any]:
    """A copy of the same bytes as a GAE call: rewards and values into two preallocated arrays, on the same device.

    The memory roofline: every GAE reads rewards and values once and writes
    advantages and returns once (``FLOOR_ARRAYS`` arrays of the float dtype;
    the bool flags of dones and a mask come on top). On a CPU, NumPy's
    ``copyto`` on one thread serves every library (a library's own copy may
    enter a thread pool, which on a shared machine measures the pool, not the
    memory); on a GPU, the library's device-to-device copy (JAX cannot write
    into an array: a copy under ``jax.jit``, which allocates its outputs).
    """
    rewards, values = arrays["rewards"], arrays["values"]
    if library.name in CPU_NAMES:
        sources = (library.to_numpy(rewards), library.to_numpy(values))
        targets = tuple(np.empty_like(source) for source in sources)

        def call():
            np.copyto(targets[0], sources[0])
            np.copyto(targets[1], sources[1])
            return targets

        return call
    if library.name.startswith("jax"):
        import jax

        copy = jax.jit(lambda r, v: (library.xp.copy(r), library.xp.copy(v)))
        return lambda: copy(rewards, values)
    targets = (library.xp.empty_like(rewards), library.xp.empty_like(values))
    if library.name == "cupy":
        import cupy

        def call():
            cupy.copyto(targets[0], rewards)
            cupy.copyto(targets[1], values)
            return targets
    else:
        def call():
            targets[0].copy_(rewards)
            targets[1].copy_(values)
            return targets

    return call
