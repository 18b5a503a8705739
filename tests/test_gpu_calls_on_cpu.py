"""The call tables of the GPU tests (tests/gpu), run on small torch CPU tensors against float64: API drift fails here.

The files in tests/gpu run only on a machine with an NVIDIA GPU, which CI
never has: on the first GPU run three of their calls had gone stale against
the library (a forced route on tensors that require grad, ``vtrace`` without
``truncated_bootstrap``, a ``None`` gradient compared). Here the same
builders run on the CPU: the Triton route's calls under Triton's interpreter
(``backend="triton"`` on CPU tensors, ``TRITON_INTERPRET=1``), a call of the
numba-CUDA route's own interface on the CPU route that has it, and every
output is checked against ``gae_xp.reference`` or the generic path in float64.
Only ``test_sync_and_graphs.py``'s "pieces and finish" stays GPU-only: no
CPU route has numba-CUDA's ``pieces``. The GPU modules are loaded from their
files (tests/gpu is no package), their sibling imports (``triton_process``)
found beside them.
"""

from __future__ import annotations

import numpy as np
from helpers import expected, xp_assert_close
from helpers import load_gpu_module as load
from tritoninterp import record_launches, require_interpreter

import gae_xp
from gae_xp import backends, reference
from gae_xp.testing import libraries

torch = require_interpreter()

#: The shape of the calls: Triton's interpreter takes about 0.15 s a call at 3x40 (11 s at 2x9000).
SHAPE = (3, 40)
#: test_sync_and_graphs.py's calls that no CPU route can take, with why.
GPU_ONLY = {"pieces and finish": "numba-CUDA's own Pieces (launch 3 on the summary's maps): no CPU route has pieces"}
#: test_sync_and_graphs.py's calls of the route's own interface where the Triton route has none: the CPU route
#: that implements it (``summarize``: the numba kernel's one pass; the Triton route's is None).
ROUTE = {"summarize": "numba"}


def parametrized(test, argument: str) -> list:
    """The values a GPU test is parametrized with for ``argument``."""
    return [value for mark in test.pytestmark if mark.name == "parametrize" and mark.args[0] == argument
            for value in mark.args[1]]


def relative_error(got, want) -> float:
    """max |got - want| / max(1, max |want|): ``got`` a tensor (what the GPU tests compare with ``torch.equal``),
    ``want`` a tensor or a NumPy array of the same shape."""
    assert torch.is_tensor(got), f"an output that is no tensor: {got!r}"
    got, want = (np.asarray(x.detach().double().numpy() if torch.is_tensor(x) else x, dtype=np.float64)
                 for x in (got, want))
    assert got.shape == want.shape, (got.shape, want.shape)
    return float(np.max(np.abs(got - want), initial=0.0)) / max(1.0, float(np.max(np.abs(want), initial=0.0)))


def float64_gradients(call, arrays: dict, names) -> list:
    """The gradients of sum(outputs) to ``arrays[names]`` (NumPy float64): torch autograd through ``call`` on CPU
    tensors of the arrays."""
    tensors = {k: torch.from_numpy(v.copy()) if isinstance(v, np.ndarray) else v for k, v in arrays.items()}
    leaves = {k: tensors[k].requires_grad_() for k in names}
    outputs = call({**tensors, **leaves})
    return torch.autograd.grad(sum(output.sum() for output in outputs), [leaves[k] for k in names])


class Float64Kernels:
    """The generic path's answers, in float64, to the calls of a route's own interface: what the reference table
    of ``test_sync_and_graphs._calls`` holds in place of the generic backend (which has neither)."""

    @staticmethod
    def summarize(problem):
        from gae_xp import _pieces

        return _pieces.summarize(problem, backends.load("xp"))

    @staticmethod
    def gae_backward(problem, grad_advantages, grad_returns) -> dict:
        r, v, b = (t.detach().clone().requires_grad_() for t in (problem.rewards, problem.values, problem.bootstrap))
        outputs = backends.load("xp").gae(problem.replace(rewards=r, values=v, bootstrap=b), chunk_size=None)
        grads = torch.autograd.grad(outputs, (r, v, b), (grad_advantages, grad_returns))
        return dict(zip(("rewards", "values", "next_values", "bootstrap", "carry"), (*grads[:2], None, grads[2], None)))


def test_the_sync_and_graphs_calls_match_float64(monkeypatch):
    """Every call of ``test_sync_and_graphs._calls`` but the GPU-only one, on float64 CPU tensors: the Triton
    route's under the interpreter (``summarize`` on the numba route), each output equal to the generic path's
    (``Float64Kernels`` for the route-level calls), and the GPU tests' parametrizations name only its calls."""
    sync = load("test_sync_and_graphs")
    sizes = {"shape": SHAPE, "offsets": (0, 3, 3, 21, SHAPE[1])}  # an empty sequence, as the GPU run's
    routes = {route: sync._calls(torch, device="cpu", backend=route, **sizes) for route in ("triton", *ROUTE.values())}
    load_backend = backends.load
    with monkeypatch.context() as patched:  # the table resolves its kernels when it is built, never after
        patched.setattr(backends, "load", lambda name: Float64Kernels() if name == "xp" else load_backend(name))
        references = sync._calls(torch, device="cpu", backend="xp", **sizes)
    assert list(references) == sync.CALLS
    assert set(parametrized(sync.test_captured_in_a_cuda_graph_and_replayed, "name")) <= set(sync.CALLS)
    assert set(GPU_ONLY) <= set(sync.CALLS)
    for name in [name for name in sync.CALLS if name not in GPU_ONLY]:
        got, want = routes[ROUTE.get(name, "triton")][name](), references[name]()
        assert len(got) == len(want), name
        for x, y in zip(got, want):
            assert relative_error(x, y) <= 1e-10, name


def test_the_route_tests_calls_match_float64():
    """The calls ``test_routes.py`` repeats and captures, on its own ``_arrays()`` (float32, CPU, small), on the
    Triton route under the interpreter: a repeated call equals the first, and both the generic path in float64
    (``sanitize_calls.calls(gae_xp, "xp")`` on the widened inputs); likewise the call on the busy stream."""
    routes = load("test_routes")
    calls, references = routes.CALLS.calls(gae_xp, "triton"), routes.CALLS.calls(gae_xp, "xp")
    arrays = routes._arrays(device="cpu", shape=SHAPE)
    widened = routes.CALLS.Library(dry_run=False, device="cpu").widen(arrays)
    names = {*parametrized(routes.test_a_repeated_call_does_not_synchronise, "name"),
             *parametrized(routes.test_captured_in_a_cuda_graph_and_replayed, "name")}
    assert names and names <= set(calls), names - set(calls)
    for name in sorted(names):
        first, again, want = calls[name](arrays), calls[name](arrays), references[name](widened)
        assert len(first) == len(want), name
        for x, y, z in zip(first, again, want):
            assert torch.equal(x, y) and relative_error(x, z) <= routes.CALLS.TOLERANCE["float32"], name
    flags = {"terminated": arrays["terminated"]}
    for got, want in zip(gae_xp.gae(arrays["rewards"], arrays["values"], **flags, backend="triton"),
                         gae_xp.gae(widened["rewards"], widened["values"], **flags, backend="xp")):
        assert relative_error(got, want) <= routes.CALLS.TOLERANCE["float32"]


def test_the_sanitizers_structures_on_the_triton_route_at_the_short_shape():
    """``sanitize_calls.run_route`` as ``test_routes.test_every_structure_against_float64`` runs it, on the Triton
    route under the interpreter with CPU tensors, at its short shape only (its long one takes minutes here):
    every structure in float32, the common ones in float64, float16 and bfloat16, the route's own backward."""
    calls = load("test_routes").CALLS
    lines = list(calls.run_route(gae_xp, calls.Library(dry_run=False, device="cpu"), "triton", "triton",
                                 shapes=(calls.SHORT,)))
    assert not [line for line in lines if not line.startswith(("ok ", "backward "))], lines
    assert sum(line.startswith("ok ") for line in lines) == sum(
        len(calls.calls(gae_xp, "xp")) if dtype == "float32" else len(calls.OTHER_DTYPE_CALLS)
        for dtype in calls.DTYPES[calls.SHORT])
    assert sum(line.startswith("backward (terminated, mask): max rel. error") for line in lines) == 1


def test_the_devices_and_streams_calls_match_float64():
    """``test_devices_and_streams.py``'s calls on CPU tensors: gae() with rewards that require grad and its backward
    (``_gae_and_gradient``) against the loop and autograd through the generic path in float64, and the pieces
    test's problem solved by the Triton route with its zero bootstrap and carry against the loop."""
    devices = load("test_devices_and_streams")
    library = libraries.load("torch:cpu")
    case = devices._two_gpus_case(shape=SHAPE)
    arrays = {k: torch.from_numpy(v.copy()) if isinstance(v, np.ndarray) else v for k, v in case.items()}
    advantages, returns = devices._gae_and_gradient(arrays)
    for got, want in zip((advantages, returns), expected(case)):
        assert relative_error(got, want) <= 1e-10
    (want,) = float64_gradients(lambda a: gae_xp.gae(**a, backend="xp"), case, ["rewards"])
    assert relative_error(arrays["rewards"].grad, want) <= 1e-10
    case, arrays, problem, b, c = devices._pieces_problem(library, backend="triton", shape=(4, SHAPE[1]))
    got = backends.load("triton").gae(problem.replace(bootstrap=b, carry=c))
    for out, want in zip(got, expected(case)):
        xp_assert_close(out, want, like=arrays["rewards"])


def test_the_triton_cuda_options_part_on_cpu(monkeypatch):
    """``triton_cuda_checks.options_part`` at small shapes on CPU tensors: every option of its grid, the other
    dtypes, T = 1 and 31, packed with host and device offsets, and chunks of several blocks pipelined (3x40:
    16-step blocks, 2 chunks of 2 blocks, 3 stages), each against ``gae_xp.reference`` in float64."""
    checks = load("triton_cuda_checks")
    calls = record_launches(monkeypatch)
    count = checks.options_part(shapes=(SHAPE,), offsets=(0, 7, 7, 21, 22, 22, SHAPE[1]), device="cpu",
                                pipelined={"block": 16, "num_stages": 3, "chunks": 2})
    assert count == len(checks.OPTIONS) + 2 * (3 + 2 + 2) + len(checks.PIPELINED)
    pipelined = [kwargs for _, kwargs in calls if kwargs["STAGES"] == 3]
    assert [kwargs["MODE"] for kwargs in pipelined] == [1, 2] * len(checks.PIPELINED)


def test_the_triton_op_cases_on_cpu():
    """``triton_op_checks.case`` on CPU tensors (small): ``gae_xp.gae`` (``auto``: the custom operator, as the
    compiled function calls it) on every case equals the float64 loop, and its gradients to the leaves equal
    autograd through the generic path in float64."""
    ops = load("triton_op_checks")
    for name in ops.CASES:
        kwargs, arrays, leaves = ops.case(name, device="cpu", shape=SHAPE)
        assert {"rewards", "values"} <= set(leaves), name
        got = gae_xp.gae(**kwargs)
        for g, w in zip(got, reference.gae_loop(**arrays)):
            np.testing.assert_allclose(g.detach().double().numpy(), w, rtol=1e-4, atol=1e-4, err_msg=name)
        grads = torch.autograd.grad(sum(g.sum() for g in got), [kwargs[k] for k in leaves])
        wants = float64_gradients(lambda a: gae_xp.gae(**a, backend="xp"), arrays, leaves)
        for key, g, w in zip(leaves, grads, wants):
            assert relative_error(g, w) <= 1e-5, (name, key)


def test_the_gpu_only_call_is_the_numba_cuda_routes_own():
    """``GPU_ONLY``'s call takes a method that the numba-CUDA route has and no CPU route has: not a stale exclusion."""
    assert callable(backends.load("numba-cuda").pieces)
    assert not any(hasattr(backends.load(route), "pieces") for route in ("triton", "numba", "xp"))
