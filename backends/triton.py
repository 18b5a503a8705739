r"""torch CUDA tensors: ``gae()`` in Triton kernels, one program per row streaming its row block by block.

Every option of ``gae()`` in one pass over memory (``gae_xp.backends._triton_gae``
has the kernels and the recurrence):

    Vnext_t = next_values[t] | V at the next real step | bootstrap
    A_t     = r_t + (0 if terminated_t else gamma_t Vnext_t) - V_t + (0 if cut_t else gamma_t lam_t A_{t+1})

with bootstrap values per row or per packed sequence, ``next_values``,
``terminated``, ``truncated``, holed masks (0 at a masked step, or with
``fill_masked`` the next real step's advantage and that + its own value),
per-step or per-row gamma and lam, ``critic_lam`` (a second chain in the same
pass), packed ``cu_seqlens`` (host or device offsets, empty sequences: one
program per row and sequence, which reads its bounds on the device), an
incoming ``carry`` (pieces), any batch rank and strides (the batch axes are
folded into at most two without a copy; further unmergeable axes are
launched one slice at a time), float16 and bfloat16 (computed in float32,
stored in their dtype), float32 and float64.

Launches: one, or two for few long rows (fewer than ``2 x`` the GPU's
multiprocessors, rows of several blocks, no packed sequences): each row is
cut into chunks, a first launch writes each chunk's map, a second composes
the maps to the right of its chunk and writes the outputs (1.5x the bytes of
one pass). The block size, warps and pipeline stages come from the steps per
program (``_triton_config.HEURISTIC``), or, on this thread within ``tuned()``,
from a benchmark's settings. A call does only what a launch needs: no host
synchronisation, no copy to or from the host, outputs from ``torch.empty`` on
the arrays' device, launched on torch's current stream of that device.

Compiling: the kernels are specialised on the options present, the dtypes,
the block size (one per row of the heuristic's table) and whether every row
starts on a 16-byte boundary (for 16-byte loads and stores); never on T, B,
the strides or the number of blocks, so a new T of the same table row and
alignment compiles nothing.

Arrays served: torch CUDA tensors that record no autograd history
(``backend="auto"`` chooses this route for them where triton imports). With
``TRITON_INTERPRET=1`` set before triton is imported, torch CPU tensors are
served through Triton's interpreter, for tests on a machine without a GPU;
under the interpreter this backend serves only calls that name it
(``backend="triton"``), CUDA tensors included: ``auto`` never chooses it then.
CuPy arrays are served through torch tensors over the same memory
(DLPack, no copy), launched on CuPy's current stream
(``gae_xp.backends._triton_cupy``): with ``backend="triton"``, which imports
torch, and with ``auto`` where torch is imported already (elsewhere ``auto``
takes the numba-CUDA route for them: this package imports no framework that
the caller's arrays do not need).

The scan (``discounted_cumsum``), the adjoint that autograd's backward runs
(``gae_backward``) and the other estimators (``discounted_returns``,
``lambda_returns``, ``vtrace``) are Triton kernels of their own, one program
per row in the same streaming design (``gae_xp.backends._triton_scan``).
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import numbers
import os
import threading

from gae_xp._compat import has_tangent, is_torch_array, values_are_readable

from . import _triton_cupy

NAME = "triton"

#: name -> launch settings a GPU benchmark measures; None takes the heuristic's choice. "default" first. 16 steps
#: a thread (block2048-w4, block1024-w2) issue the fewest instructions a step by the SASS count (docs/gpu.md).
#: The stages pipeline a program's walk over its blocks: "stages1" is the walk unpipelined (every block waits on
#: its loads), "stagesN" keeps the next N - 1 blocks' loads in flight, even for a program of one block (fewer
#: where the device's shared memory cannot hold them). "tileN": short rows share a program, N steps of them (8
#: rows of 128 in 1,024): a program of one 128-step row is one warp, and bfloat16 took float32's time there on the
#: first H100, as if each program's chain of load, scan and store, not bytes, set it.
TUNING_VARIANTS: dict[str, dict] = {
    name: {"block": None, "num_warps": None, "num_stages": None, "chunks": None, "tile": None, **settings}
    for name, settings in (
        ("default", {}),
        ("block1024-w4", {"block": 1024, "num_warps": 4}),
        ("block2048-w4", {"block": 2048, "num_warps": 4}),
        ("block1024-w2", {"block": 1024, "num_warps": 2}),
        ("stages1", {"num_stages": 1}),
        ("stages2", {"num_stages": 2}),
        ("stages3", {"num_stages": 3}),
        ("stages4", {"num_stages": 4}),
        ("unchunked", {"chunks": 1}),
        ("tile512", {"tile": 512}),
        ("tile1024", {"tile": 1024}),
        ("tile2048", {"tile": 2048}),
    )
}
_SETTINGS = threading.local()
_KNOBS = ("block", "num_warps", "num_stages", "chunks", "tile")


@contextlib.contextmanager
def tuned(**settings):
    """Within this block, launches use these settings (``block``, ``num_warps``, ``num_stages``, ``chunks``,
    ``tile``; None = the heuristic's) instead of the heuristic's. ``block`` is a power of two >= 16; ``chunks``
    bounds the chunks a row is cut into where rows are few (1: never cut, one pass over the bytes; more: at most
    that many, within the kernel's ``MAX_CHUNKS`` and the row's blocks). ``tile`` (a power of two >= 16) is the
    most steps one program holds when rows are short: rows of at most ``tile // 2`` steps (each given the power of
    two at or above its length) share a program, as many as fit and the rows need, in one pass without packed
    sequences or chunks (its block is those rows' lanes; ``num_warps`` defaults to 8 steps a thread, and its walk
    of one block is not pipelined: ``num_stages`` does not apply). A launch that cannot
    run with them (too many registers or too much shared memory for the GPU) raises RuntimeError naming them: the
    route stays usable, ``auto`` does not fall back for it."""
    unknown = set(settings) - set(_KNOBS)
    if unknown:
        raise ValueError(f"tuned() takes {', '.join(_KNOBS)}, got {', '.join(sorted(unknown))}")
    for knob in ("block", "tile"):
        size = settings.get(knob)
        if size is not None and (isinstance(size, bool) or not isinstance(size, numbers.Integral) or size < 16
                                 or size & (size - 1)):
            raise ValueError(f"{knob} must be a power of two >= 16, got {size!r}")
    chunks = settings.get("chunks")
    if chunks is not None and (isinstance(chunks, bool) or not isinstance(chunks, int) or chunks < 1):
        raise ValueError(f"chunks must be an int >= 1, got {chunks!r}")
    before = getattr(_SETTINGS, "override", None)
    _SETTINGS.override = {name: settings.get(name) for name in _KNOBS}
    try:
        yield
    finally:
        _SETTINGS.override = before


def interpreted() -> bool:
    """True when Triton's interpreter is on (``TRITON_INTERPRET=1``, read as triton reads it)."""
    return os.environ.get("TRITON_INTERPRET", "0").lower() in ("1", "true", "on", "yes")


@functools.cache
def _not_installed() -> str | None:
    if importlib.util.find_spec("triton") is None:
        return "triton is not installed (it comes with torch's Linux CUDA wheels; pip install triton)"
    return None


def _through_torch(method):
    """A solver of a problem, which serves a problem of CuPy arrays through torch views of them on CuPy's stream
    (``_triton_cupy.solve``) and a problem of torch tensors as it is."""

    @functools.wraps(method)
    def solve(self, problem, *args, **kwargs):
        if _triton_cupy.serves([problem.rewards]):
            return _triton_cupy.solve(functools.partial(method, self), problem, *args, **kwargs)
        return method(self, problem, *args, **kwargs)

    return solve


class TritonBackend:
    name = NAME
    segments = True
    uses_chunk_size = False
    critic_lam = True
    summarize = None
    #: ``prepare`` may hand this backend float16/bfloat16 arrays as they are: the kernels widen them in registers.
    narrow_floats = True

    def unavailable_reason(self, xp, arrays, *, forced=False):
        # The arrays are asked first, triton last: NumPy, JAX or Dask arrays never make triton load.
        if _triton_cupy.serves(arrays):
            return (_triton_cupy.unavailable_reason(arrays, forced=forced, interpreted=interpreted())
                    or _not_installed())
        for a in arrays:
            if not is_torch_array(a):
                return "the Triton kernels take torch tensors and CuPy arrays"
            if a.device.type != "cuda" and not (a.device.type == "cpu" and interpreted()):
                return "the Triton kernels take torch CUDA tensors (CPU tensors only under TRITON_INTERPRET=1)"
            if a.requires_grad:
                return "tensors that require grad take backend='auto' (the custom operator) or backend='xp'"
            if not values_are_readable(a) or has_tangent(a):
                return "traced, meta or forward-mode dual tensors need backend='xp' or 'auto'"
        if interpreted() and not forced:  # tests: the interpreter copies to the host, synchronises, cannot be captured
            return "under TRITON_INTERPRET=1 the kernels serve only backend='triton', never 'auto'"
        return _not_installed()

    @_through_torch
    def gae(self, problem, *, chunk_size=None):
        """(advantages, returns) of a problem (``gae_xp._problem.GaeProblem``), in its per-step dtype."""
        if problem.carry is not None and problem.critic_lam is not None:
            raise ValueError("a carry enters one advantage chain: solve critic_lam's returns as a problem of their "
                             "own")
        from . import _triton_launch

        problem = _resolved(problem)
        override = getattr(_SETTINGS, "override", None)
        if override is None:
            return _triton_launch.solve(problem, _settings())
        try:  # a benchmark's settings that cannot run are the settings' failure, not the route's (no fallback)
            return _triton_launch.solve(problem, override)
        except Exception as error:
            raise RuntimeError(f"the Triton kernels cannot run with tuned({override}): {type(error).__name__}: "
                               f"{error}") from error

    def scan(self, xp, x, a, *, reverse, chunk_size):
        """``y_t = x_t + a_t y_{t+1}`` (reverse) or ``y_{t-1}`` (forward) along the last axis; x is never written."""
        from ._triton_scan import scan

        if _triton_cupy.serves([x]):
            return _triton_cupy.scan(lambda x, a: scan(_resolved_tensor(x), a, reverse=reverse), x, a)
        return scan(_resolved_tensor(x), _resolved_tensor(a), reverse=reverse)

    def gae_backward(self, problem, grad_advantages, grad_returns) -> dict:
        """The gradients of ``gae(problem)``'s outputs to its inputs (``_triton_scan.gae_backward``)."""
        from ._triton_scan import gae_backward

        return gae_backward(_resolved(problem), _resolved_tensor(grad_advantages), _resolved_tensor(grad_returns))

    @_through_torch
    def solve_discounted_returns(self, problem):
        """``gae_xp.discounted_returns`` of a prepared problem (``_triton_scan.solve_discounted_returns``)."""
        from ._triton_scan import solve_discounted_returns

        return solve_discounted_returns(_resolved(problem))

    @_through_torch
    def solve_lambda_returns(self, problem):
        """``gae_xp.lambda_returns`` of a prepared problem (``_triton_scan.solve_lambda_returns``)."""
        from ._triton_scan import solve_lambda_returns

        return solve_lambda_returns(_resolved(problem))

    @_through_torch
    def solve_vtrace(self, problem, *, clip_rho_threshold, clip_c_threshold, clip_pg_rho_threshold):
        """``gae_xp.vtrace`` of a prepared problem: (vs, pg) (``_triton_scan.solve_vtrace``)."""
        from ._triton_scan import solve_vtrace

        return solve_vtrace(_resolved(problem), clip_rho_threshold=clip_rho_threshold,
                            clip_c_threshold=clip_c_threshold, clip_pg_rho_threshold=clip_pg_rho_threshold)


def _resolved(problem):
    """The problem with every tensor that torch keeps negated lazily (its negative bit: the memory holds the values'
    negatives) made a tensor of its values: the kernels read memory by pointer."""
    tensors = [*problem.steps().values(), *problem.extra.values(), problem.bootstrap,
               *([] if problem.carry is None else [problem.carry])]
    if not any(t is not None and t.is_neg() for t in tensors):
        return problem
    problem = problem.map_steps(lambda name, t: t.resolve_neg())
    return problem.replace(bootstrap=_resolved_tensor(problem.bootstrap), carry=_resolved_tensor(problem.carry))


def _resolved_tensor(tensor):
    """``tensor`` with its negative bit resolved (a copy where it is set); a number or None as it is."""
    return tensor.resolve_neg() if hasattr(tensor, "resolve_neg") else tensor


def _settings() -> dict:
    """The launch settings in force: ``tuned()``'s, or all None (the heuristic's)."""
    override = getattr(_SETTINGS, "override", None)
    return override if override is not None else dict.fromkeys(_KNOBS)


BACKEND = TritonBackend()
