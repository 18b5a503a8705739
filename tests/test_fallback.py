"""A kernel compiler that cannot import, compile or launch never takes ``backend="auto"`` down.

Each failure is simulated as a machine shows it: ``import numba`` raising "Numba needs NumPy ..." (a package of
that name on PYTHONPATH), ``numpy.row_stack`` removed before the first compile (numba's array module and
numba-cuda's register an overload of it, the failure of numba-cuda 0.30.4 under NumPy 2.5), a kernel whose
typing fails (numba's ``TypingError``), a ``LoweringError``, and ``import triton`` failing. Anything that must
happen before an import runs in a fresh process. Every answer is checked against the float64 loops of
``gae_xp.reference``; the warning is checked to come once per process and cause; a named backend's error is
checked to name the packages and what to do, chained to the original.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import types
import warnings

import numpy as np
import pytest

import gae_xp
from gae_xp import backends, reference
from gae_xp.backends import _fallback

pytest.importorskip("numba")
numba_cpu = pytest.importorskip("gae_xp.backends.numba_cpu")

#: Runs every public entry point that dispatches under "auto", twice, then the named backend; prints JSON.
_ENTRY_POINTS = """
import json, warnings
import numpy as np
import gae_xp
from gae_xp import reference

rng = np.random.default_rng(0)
r, v = rng.standard_normal((3, 9)), rng.standard_normal((3, 9))
terminated, mask = rng.random((3, 9)) < 0.2, rng.random((3, 9)) < 0.8
scores, ids = rng.standard_normal(8), np.array([3, 3, 1, 1, 1, 7, 7, 3])
close = {}
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    gae_xp.warm_up()
    for attempt in range(2):
        a, ret = gae_xp.gae(r, v, terminated=terminated, mask=mask)
        ra, rret = reference.gae_loop(r, v, terminated=terminated, mask=mask)
        close["gae"] = bool(np.allclose(a, ra, atol=1e-12) and np.allclose(ret, rret, atol=1e-12))
        close["discounted_cumsum"] = bool(np.allclose(gae_xp.discounted_cumsum(r, 0.9),
                                                      reference.discounted_cumsum_loop(r, 0.9), atol=1e-12))
        close["discounted_returns"] = bool(np.allclose(gae_xp.discounted_returns(r, terminated=terminated),
                                                       reference.discounted_returns_loop(r, terminated=terminated),
                                                       atol=1e-12))
        close["lambda_returns"] = bool(np.allclose(gae_xp.lambda_returns(r, v), reference.lambda_returns_loop(r, v),
                                                   atol=1e-12))
        close["vtrace"] = bool(np.allclose(gae_xp.vtrace(r / 4, r, v)[0], reference.vtrace_loop(r / 4, r, v)[0],
                                           atol=1e-12))
        close["group_advantages"] = bool(np.allclose(gae_xp.group_advantages(scores, ids),
                                                     reference.group_advantages_loop(scores, ids), atol=1e-12))
        close["zero_variance_groups"] = bool((gae_xp.zero_variance_groups(np.array([1., 1., 2., 3.]),
                                                                         np.array([0, 0, 1, 1]))
                                              == np.array([True, True, False, False])).all())
        try:
            import torch
        except ImportError:
            pass
        else:
            t = torch.tensor(r, requires_grad=True)
            a_t, _ = gae_xp.gae(t, torch.tensor(v), terminated=torch.tensor(terminated))
            a_t.sum().backward()
            close["torch (autograd)"] = bool(np.allclose(a_t.detach().numpy(),
                                                         reference.gae_loop(r, v, terminated=terminated)[0],
                                                         atol=1e-12) and t.grad is not None)
            close["torch"] = bool(np.allclose(gae_xp.gae(torch.tensor(r), torch.tensor(v))[0].numpy(),
                                              reference.gae_loop(r, v)[0], atol=1e-12))
ours = [str(w.message) for w in caught if issubclass(w.category, gae_xp.RouteUnavailableWarning)]
others = [f"{w.category.__name__}: {w.message}" for w in caught
          if not issubclass(w.category, gae_xp.RouteUnavailableWarning)]
try:
    gae_xp.gae(r, v, backend=NAMED)
    error = None
except gae_xp.RouteUnavailableError as e:
    error = {"message": str(e), "cause": type(e.__cause__).__name__}
print(json.dumps({"close": close, "warnings": ours, "other_warnings": others, "error": error}))
"""

_FAKE_NUMBA = 'raise ImportError("Numba needs NumPy 2.4 or less. Got NumPy 2.5.")\n'

_WITHOUT_ROW_STACK = """
import numpy
del numpy.row_stack
numpy.__all__.remove("row_stack")
"""


def _run(script: str, env: dict | None = None) -> dict:
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=600,
                          env={**os.environ, **(env or {})})
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def _check_fell_back(result: dict, cause: str) -> None:
    assert result["close"] and all(result["close"].values()), result["close"]
    assert len(result["warnings"]) == 1, result["warnings"]  # once per process and cause, not per call or function
    assert cause in result["warnings"][0] and "falling back to 'xp'" in result["warnings"][0]
    assert result["other_warnings"] == []
    assert result["error"] is not None and cause in result["error"]["message"]


def test_a_numba_that_does_not_import_falls_back_to_the_generic_path(tmp_path):
    (tmp_path / "numba").mkdir()
    (tmp_path / "numba" / "__init__.py").write_text(_FAKE_NUMBA)
    path = os.pathsep.join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")]))
    result = _run("NAMED = 'numba'\n" + _ENTRY_POINTS, {"PYTHONPATH": path})
    _check_fell_back(result, "does not import with NumPy")
    assert "Numba needs NumPy 2.4 or less" in result["warnings"][0]
    assert "numba " in result["error"]["message"] and result["error"]["cause"] == "ImportError"


def test_numpy_without_row_stack_falls_back_from_the_numba_kernels():
    result = _run(_WITHOUT_ROW_STACK + "NAMED = 'numba'\n" + _ENTRY_POINTS)
    _check_fell_back(result, "cannot compile with NumPy")
    message = result["warnings"][0]
    assert f"numba {_fallback._version('numba')}" in message and "numpy.row_stack was removed" in message
    assert "pip install 'numpy<2.5'" in message
    assert result["error"]["cause"] == "AttributeError"


_SIMULATED_COMPILE = """
import importlib
from numba.cuda.simulator import kernel as simulated
from gae_xp.backends import numba_cuda

launch = simulated.FakeCUDAKernel.__call__


def compile_then_launch(self, *args):  # what a real first compile does first: numba-cuda's array typing loads
    importlib.import_module("numba.cuda.np.arrayobj")
    return launch(self, *args)


simulated.FakeCUDAKernel.__call__ = compile_then_launch
# "auto" takes the simulator's NumPy arrays as it takes device arrays (it never does otherwise).
reason = numba_cuda.BACKEND.unavailable_reason
numba_cuda.BACKEND.unavailable_reason = lambda xp, arrays, forced=False: reason(xp, arrays, forced=True)
"""


def test_numba_cuda_without_row_stack_falls_back_under_the_simulator():
    """numba-cuda 0.30.4's failure under NumPy 2.5, at the first kernel launch: "auto" goes on to the next route,
    the numba CPU kernels (numba 0.67+ supports NumPy 2.5: numba's own array module is loaded before the attribute
    goes, so only numba-cuda's fails)."""
    script = "import numba.np.arrayobj\n" + _WITHOUT_ROW_STACK + _SIMULATED_COMPILE + """
import json, warnings
import numpy as np
import gae_xp
from gae_xp import reference

rng = np.random.default_rng(1)
r, v = rng.standard_normal((2, 7)), rng.standard_normal((2, 7))
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    answers = [gae_xp.gae(r, v)[0] for _ in range(2)]
try:
    gae_xp.gae(r, v, backend="numba-cuda")
    error = None
except gae_xp.RouteUnavailableError as e:
    error = {"message": str(e), "cause": type(e.__cause__).__name__}
print(json.dumps({"close": [bool(np.allclose(a, reference.gae_loop(r, v)[0], atol=1e-12)) for a in answers],
                  "warnings": [str(w.message) for w in caught], "error": error}))
"""
    result = _run(script, {"NUMBA_ENABLE_CUDASIM": "1"})
    assert result["close"] == [True, True]
    assert len(result["warnings"]) == 1, result["warnings"]
    message = result["warnings"][0]
    version = _fallback._version("numba-cuda")
    assert f"numba-cuda {version} cannot compile with NumPy" in message and "numpy.row_stack was removed" in message
    assert "pip install 'numpy<2.5', or install numba-cuda-mlir" in message
    assert "falling back to 'numba'" in message
    assert result["error"]["cause"] == "AttributeError"
    assert f"backend='numba-cuda' is unavailable: numba-cuda {version} cannot compile" in result["error"]["message"]


@pytest.fixture
def fresh_routes(monkeypatch):
    """No route failed yet and nothing chosen or planned, in this process; all put back afterwards."""
    from gae_xp import _plans

    monkeypatch.setattr(_fallback, "_BROKEN", {})
    monkeypatch.setattr(_fallback, "_ERRORS", {})
    monkeypatch.setattr(_fallback, "_WARNED", set())
    monkeypatch.setattr(backends, "_CHOSEN", {})
    _plans.PLANS.clear()
    yield
    _plans.PLANS.clear()


def _data(seed=2, shape=(3, 11)):
    rng = np.random.default_rng(seed)
    return rng.standard_normal(shape), rng.standard_normal(shape), rng.random(shape) < 0.2


def _untypable_kernel(problem):
    from numba import njit

    return njit(lambda *arguments: arguments[0].no_such_attribute)


def _lowering_kernel(problem):
    from numba.core.errors import LoweringError

    def kernel(*arguments):
        raise LoweringError("cannot lower this kernel")

    return kernel


@pytest.mark.parametrize("driver, error", [(_untypable_kernel, "TypingError"), (_lowering_kernel, "LoweringError")])
def test_a_kernel_that_does_not_compile_falls_back_once(fresh_routes, monkeypatch, driver, error):
    monkeypatch.setattr(numba_cpu, "_driver", driver)
    r, v, terminated = _data()
    expected = reference.gae_loop(r, v, terminated=terminated)
    with pytest.warns(gae_xp.RouteUnavailableWarning, match=f"the 'numba' route is unavailable: .*{error}") as caught:
        first = gae_xp.gae(r, v, terminated=terminated)
    assert len(caught) == 1 and "falling back to 'xp'" in str(caught[0].message)
    assert caught[0].filename == __file__  # the warning points at the caller's line
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a second call warns no more, and takes the generic path straight away
        monkeypatch.setattr(numba_cpu, "_driver", lambda p: pytest.fail("a failed route was tried again"))
        second = gae_xp.gae(r, v, terminated=terminated)
        r2, v2, t2 = _data(3, (2, 5))
        third = gae_xp.gae(r2, v2, terminated=t2)
    for got in (first, second):
        np.testing.assert_allclose(got[0], expected[0], atol=1e-12)
        np.testing.assert_allclose(got[1], expected[1], atol=1e-12)
    np.testing.assert_allclose(third[0], reference.gae_loop(r2, v2, terminated=t2)[0], atol=1e-12)
    named = f"backend='numba' is unavailable: numba .*{error}"
    with pytest.raises(gae_xp.RouteUnavailableError, match=named) as raised:
        gae_xp.gae(r, v, backend="numba")
    assert type(raised.value.__cause__).__name__ == error


def test_a_named_backend_whose_compile_fails_raises_from_the_failure(fresh_routes, monkeypatch):
    monkeypatch.setattr(numba_cpu, "_driver", _untypable_kernel)
    r, v, _ = _data()
    with pytest.raises(gae_xp.RouteUnavailableError, match="numba .* failed to compile or launch") as raised:
        gae_xp.gae(r, v, backend="numba")
    assert type(raised.value.__cause__).__name__ == "TypingError"
    assert "Traceback" not in str(raised.value)
    with pytest.warns(gae_xp.RouteUnavailableWarning):  # remembered: "auto" goes to the generic path, and says so
        np.testing.assert_allclose(gae_xp.gae(r, v)[0], reference.gae_loop(r, v)[0], atol=1e-12)


def test_a_kernel_raising_a_callers_error_is_not_a_compiler_failure(fresh_routes, monkeypatch):
    """A ValueError from inside a compiled kernel (its own check of the data) propagates; numba stays usable."""
    from numba import njit

    @njit
    def refusing(*arguments):
        raise ValueError("rewards must be finite")

    monkeypatch.setattr(numba_cpu, "_driver", lambda problem: refusing)
    r, v, _ = _data()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(ValueError, match="rewards must be finite"):
            gae_xp.gae(r, v)
    assert _fallback.broken("numba") is None


def test_an_argument_error_under_auto_still_names_the_argument(fresh_routes):
    r, v, _ = _data()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(ValueError, match="gamma"):
            gae_xp.gae(r, v, gamma=1.5)
    assert _fallback._BROKEN == {}


class _TritonRoute:
    """A kernel route registered first whose compiler is Triton (as ``backend="triton"`` is)."""

    name = "triton"
    segments = True
    uses_chunk_size = False
    critic_lam = True
    summarize = None

    def unavailable_reason(self, xp, arrays, *, forced=False):
        import triton  # noqa: F401  (the route's first question: can its compiler import?)

        return None

    def gae(self, problem, *, chunk_size):
        raise AssertionError("never reached: its compiler does not import")


def test_a_triton_that_does_not_import_falls_back_to_the_next_route(fresh_routes, monkeypatch):
    monkeypatch.setitem(sys.modules, "triton", None)  # import triton raises ImportError
    monkeypatch.setattr(backends, "REGISTRY", {"triton": "gae_xp.backends.triton", **backends.REGISTRY})
    monkeypatch.setitem(backends._LOADED, "triton", _TritonRoute())
    r, v, terminated = _data()
    with pytest.warns(gae_xp.RouteUnavailableWarning, match="the 'triton' route is unavailable: triton .*does not "
                                                            "import.*falling back to 'numba'") as caught:
        advantages, returns = gae_xp.gae(r, v, terminated=terminated)
    assert len(caught) == 1
    expected = reference.gae_loop(r, v, terminated=terminated)
    np.testing.assert_allclose(advantages, expected[0], atol=1e-12)
    np.testing.assert_allclose(returns, expected[1], atol=1e-12)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        gae_xp.gae(r[:2], v[:2])
    with pytest.raises(gae_xp.RouteUnavailableError, match="backend='triton' is unavailable: triton") as raised:
        gae_xp.gae(r, v, backend="triton")
    assert isinstance(raised.value.__cause__, ImportError)


def test_a_route_failing_inside_its_compiler_at_launch_falls_back(fresh_routes, monkeypatch):
    """An error raised by the compiler's own code (here a function of a module named ``triton.runtime``) at launch."""
    launcher = types.ModuleType("triton.runtime.fake")
    exec("def launch():\n    raise RuntimeError('no CUDA backend is available')\n", launcher.__dict__)

    class Launching(_TritonRoute):
        def unavailable_reason(self, xp, arrays, *, forced=False):
            return None

        def gae(self, problem, *, chunk_size):
            launcher.launch()

    monkeypatch.setattr(backends, "REGISTRY", {"triton": "gae_xp.backends.triton", **backends.REGISTRY})
    monkeypatch.setitem(backends._LOADED, "triton", Launching())
    r, v, _ = _data()
    with pytest.warns(gae_xp.RouteUnavailableWarning, match="RuntimeError: no CUDA backend is available"):
        np.testing.assert_allclose(gae_xp.gae(r, v)[0], reference.gae_loop(r, v)[0], atol=1e-12)


def test_the_group_kernel_falls_back_when_numba_does_not_compile(fresh_routes, monkeypatch):
    from gae_xp import _segments

    def untypable(scores, index, n_groups):
        return _untypable_kernel(None)(scores)

    monkeypatch.setattr(_segments, "_numba_group_moments", untypable)
    scores, ids = np.array([1.0, 2.0, 4.0, 4.0, 0.5]), np.array([5, 5, 9, 9, 5])
    with pytest.warns(gae_xp.RouteUnavailableWarning, match="the 'numba' route"):
        got = gae_xp.group_advantages(scores, ids)
    np.testing.assert_allclose(got, reference.group_advantages_loop(scores, ids), atol=1e-12)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert gae_xp.zero_variance_groups(scores, ids).tolist() == [False, False, True, True, False]


def test_warm_up_warns_and_returns_when_numba_does_not_compile(fresh_routes, monkeypatch):
    monkeypatch.setattr(numba_cpu, "_driver", _untypable_kernel)
    with pytest.warns(gae_xp.RouteUnavailableWarning, match="the 'numba' route is unavailable") as caught:
        assert gae_xp.warm_up() is None
    assert len(caught) == 1


@pytest.mark.parametrize("argument", ["dtypes", "cases", "layouts"])
@pytest.mark.parametrize("given", [None, 3, {"float32"}])
def test_warm_up_refuses_what_is_not_names(argument, given):
    with pytest.raises(TypeError, match=f"{argument} must be a name or a sequence of names"):
        gae_xp.warm_up(**{argument: given})


def test_warm_up_takes_one_name(monkeypatch):
    seen = []
    monkeypatch.setattr(gae_xp.estimators, "gae", lambda rewards, values, **options: seen.append(
        (rewards.dtype.name, rewards.shape[-1], tuple(sorted(k for k, v in options.items() if v is not None)))))
    gae_xp.warm_up(dtypes="float64", cases="mask", layouts="time-last")
    assert seen == [("float64", 8, ("axis", "backend", "mask")), ("float64", 2048, ("axis", "backend", "mask"))]
    with pytest.raises(ValueError, match="dtypes must name some of 'float32', 'float64', got 'int8'"):
        gae_xp.warm_up(dtypes="int8")


def test_the_torch_operator_falls_back_when_numba_does_not_compile(fresh_routes, monkeypatch):
    """A tensor that requires grad takes the custom operator (numba inside): its failure gives the generic path,
    whose autograd gives the gradients."""
    torch = pytest.importorskip("torch")
    monkeypatch.setattr(numba_cpu, "_driver", _untypable_kernel)
    r, v, terminated = _data()
    rewards = torch.tensor(r, requires_grad=True)
    with pytest.warns(gae_xp.RouteUnavailableWarning, match="the 'torch-op' route is unavailable: numba") as caught:
        advantages, _ = gae_xp.gae(rewards, torch.tensor(v), terminated=torch.tensor(terminated))
    assert len(caught) == 1
    np.testing.assert_allclose(advantages.detach().numpy(), reference.gae_loop(r, v, terminated=terminated)[0],
                               atol=1e-12)
    advantages.sum().backward()
    assert rewards.grad is not None and torch.isfinite(rewards.grad).all()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the same cause through the no-grad route: no second warning
        np.testing.assert_allclose(gae_xp.gae(torch.tensor(r), torch.tensor(v))[0].numpy(),
                                   reference.gae_loop(r, v)[0], atol=1e-12)


def test_dask_blocks_fall_back_when_numba_does_not_compile(fresh_routes, monkeypatch):
    """Dask's block tasks pick a backend of their own: a compiler failing inside a task gives the generic path."""
    da = pytest.importorskip("dask.array")
    import dask

    monkeypatch.setattr(numba_cpu, "_driver", _untypable_kernel)
    r, v, terminated = _data(4, (3, 40))
    arrays = [da.from_array(a, chunks=(3, 16)) for a in (r, v, terminated)]
    with dask.config.set(scheduler="synchronous"), pytest.warns(gae_xp.RouteUnavailableWarning,
                                                                match="the 'numba' route") as caught:
        advantages, returns = dask.compute(*gae_xp.gae(arrays[0], arrays[1], terminated=arrays[2]))
    assert len(caught) == 1
    expected = reference.gae_loop(r, v, terminated=terminated)
    np.testing.assert_allclose(advantages, expected[0], atol=1e-12)
    np.testing.assert_allclose(returns, expected[1], atol=1e-12)


def test_memory_running_out_inside_a_compiler_is_not_a_broken_route(fresh_routes, monkeypatch):
    def exhausted(problem):
        from numba.core import config  # noqa: F401  (raised below from a frame of numba's package)

        failing = types.ModuleType("numba.core.fake")
        exec("def kernel(*arguments):\n    raise MemoryError()\n", failing.__dict__)
        return failing.kernel

    monkeypatch.setattr(numba_cpu, "_driver", exhausted)
    r, v, _ = _data()
    with pytest.raises(MemoryError):
        gae_xp.gae(r, v)
    assert _fallback.broken("numba") is None


def test_what_counts_as_a_compiler_failure():
    from numba.core.errors import TypingError

    def raised_in(module: str, error: BaseException) -> BaseException:
        frame = types.ModuleType(module)
        exec("def fail(error):\n    raise error\n", frame.__dict__)
        try:
            frame.fail(error)
        except BaseException as caught:
            return caught

    assert _fallback.is_compiler_failure(ImportError("Numba needs NumPy 2.4 or less"))
    assert _fallback.is_compiler_failure(TypingError("cannot type"))
    assert _fallback.is_compiler_failure(raised_in("numba.cuda.np.arrayobj", AttributeError("row_stack")))
    assert _fallback.is_compiler_failure(raised_in("triton.compiler", RuntimeError("no backend")))
    assert not _fallback.is_compiler_failure(raised_in("gae_xp._prepare", ValueError("gamma must be in [0, 1]")))
    assert not _fallback.is_compiler_failure(raised_in("torch.functional", RuntimeError("a torch error")))
    assert not _fallback.is_compiler_failure(raised_in("numba.core.dispatcher", MemoryError()))


@pytest.mark.parametrize("forced", [False, True])
def test_a_guarded_backend_falls_back_or_names_its_failure(fresh_routes, monkeypatch, forced):
    """``backends.Guarded``: what the distributed shards and Dask's blocks call a backend's methods through."""
    from gae_xp import _prepare

    monkeypatch.setattr(numba_cpu, "_driver", _untypable_kernel)
    r, v, terminated = _data()
    call = _prepare.prepare(r, v, terminated=terminated, backend="numba" if forced else "auto")
    guarded = backends.Guarded(backends.solver(call), forced=forced)
    assert guarded.name == "numba"
    if forced:
        with pytest.raises(gae_xp.RouteUnavailableError, match="backend='numba' is unavailable") as raised:
            guarded.gae(call.problem, chunk_size=None)
        assert type(raised.value.__cause__).__name__ == "TypingError"
        return
    with pytest.warns(gae_xp.RouteUnavailableWarning, match="the 'numba' route"):
        advantages, returns = guarded.gae(call.problem, chunk_size=None)
    expected = reference.gae_loop(r, v, terminated=terminated)
    np.testing.assert_allclose(call.restore(advantages), expected[0], atol=1e-12)
    np.testing.assert_allclose(call.restore(returns), expected[1], atol=1e-12)
    # numba is remembered failed: the summary is the generic path's, read off its gae, and equals the kernel's own
    # (the summary kernel is not the driver that fails here)
    np.testing.assert_allclose(guarded.summarize(call.problem), numba_cpu.BACKEND.summarize(call.problem),
                               atol=1e-12)


def test_a_failing_route_that_is_the_only_one_raises_rather_than_loops(fresh_routes, monkeypatch):
    """Dask arrays have one route under "auto" (Dask's graph): a compiler failure there has nothing to fall to, so
    it propagates once, never retried in a loop."""
    da = pytest.importorskip("dask.array")
    calls = []

    def failing(self, problem, *, chunk_size=None):
        calls.append(1)
        if len(calls) > 3:
            raise AssertionError("run() retried the failed route in a loop")
        raise ImportError("a part of the compiler does not import")

    monkeypatch.setattr(type(backends.load("dask")), "gae", failing)
    r = da.from_array(np.zeros((2, 8)), chunks=(2, 4))
    with pytest.raises(ImportError, match="a part of the compiler"):
        gae_xp.gae(r, r)
    assert len(calls) == 1


def test_traced_jax_arrays_fall_back_when_the_lax_scan_fails(fresh_routes, monkeypatch):
    """Traced JAX arrays take lax.scan; its compiler failing gives the generic path (once warned), not a loop."""
    jax = pytest.importorskip("jax")
    jnp = pytest.importorskip("jax.numpy")

    def failing(self, problem, *, chunk_size=None):
        raise ImportError("a part of the compiler does not import")

    monkeypatch.setattr(type(backends.load("jax")), "gae", failing)
    r, v, _ = _data()
    with pytest.warns(gae_xp.RouteUnavailableWarning, match="the 'jax' route is unavailable.*falling back to 'xp'"):
        advantages = jax.jit(lambda r, v: gae_xp.gae(r, v)[0])(jnp.asarray(r), jnp.asarray(v))
    np.testing.assert_allclose(np.asarray(advantages), reference.gae_loop(r, v)[0], rtol=1e-5, atol=1e-5)


def test_the_cuda_operators_fall_from_a_failing_triton_to_numba_cuda(fresh_routes, monkeypatch):
    """The torch operators' CUDA implementations (``torch_ops._on_cuda_kernels``): a Triton compile failure marks
    the Triton route failed (not the operator), warns once and runs the same work on numba-CUDA's kernels; a
    caller's error, or a failure with no numba-CUDA to run, propagates."""
    pytest.importorskip("torch")
    from gae_xp.backends import torch_ops

    triton_module = types.ModuleType("triton.compiler")
    exec("def fail():\n    raise RuntimeError('no backend for this GPU')\n", triton_module.__dict__)
    triton_route, numba_route = types.SimpleNamespace(name="triton"), types.SimpleNamespace(name="numba-cuda")
    monkeypatch.setattr(torch_ops, "_TRITON_INSTALLED", True)
    monkeypatch.setattr(torch_ops, "_cuda_backend",
                        lambda: numba_route if _fallback.broken("triton") else triton_route)
    monkeypatch.setattr(torch_ops, "_cuda_reason", lambda: None)

    def work(backend):
        if backend is triton_route:
            triton_module.fail()
        return backend.name

    with pytest.warns(gae_xp.RouteUnavailableWarning, match="the 'triton' route is unavailable.*'numba-cuda'"):
        assert torch_ops._on_cuda_kernels(work) == "numba-cuda"
    assert _fallback.broken("triton") is not None and _fallback.broken("torch-op") is None
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert torch_ops._on_cuda_kernels(work) == "numba-cuda"  # remembered: no second warning, no retry

    def refuse(backend):
        raise ValueError("cu_seqlens must be increasing")

    monkeypatch.setattr(_fallback, "_BROKEN", {})
    with pytest.raises(ValueError, match="cu_seqlens"):
        torch_ops._on_cuda_kernels(refuse)
    monkeypatch.setattr(torch_ops, "_cuda_reason", lambda: "numba-cuda is not installed")
    with pytest.raises(RuntimeError, match="no backend"):
        torch_ops._on_cuda_kernels(work)
