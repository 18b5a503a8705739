"""The torch operators as ``torch.library.triton_op``'s: their bodies launch the Triton kernels, checked on the CPU.

``gae_xp::gae`` and ``gae_xp::gae_backward`` launch the Triton kernels for
CUDA tensors (``torch_ops._TRITON_DEVICES``). Here, under Triton's
interpreter, the fixture ``triton_on_cpu`` adds the CPU to those devices, so
that eager calls on CPU tensors run the bodies' Triton launches (counted,
and checked against the float64 per-step loop and the numba kernels).

What the interpreter cannot do: run a kernel on a fake tensor. Under
``TRITON_INTERPRET=1`` ``torch.library.wrap_triton`` hands the interpreted
kernel back unwrapped, and the interpreter copies every argument's storage
to the host, which a fake tensor does not have; ``triton_op`` registers its
body as the operator's fake implementation, so ``opcheck`` and
``torch.compile`` would run the kernels on fake tensors. The bodies
therefore trace the opaque operators (``gae_xp::gae_kernels``, numba) under
the interpreter, and ``test_traced_on_cuda_the_graph_holds_the_triton_kernels``
traces them without the interpreter (a process of its own) on fake CUDA
tensors: the graph then holds the Triton launches themselves.
``tests/gpu/test_triton_op_cuda.py`` compiles and captures them on a GPU.
"""

from __future__ import annotations

import os
import subprocess
import sys
import types

import numpy as np
import pytest
from hypothesis import given
from test_autograd import differentiable, loop_outputs, problems
from test_autograd import tensors as autograd_tensors
from tritoninterp import require_interpreter

torch = require_interpreter()

import gae_xp  # noqa: E402
from gae_xp import reference  # noqa: E402
from gae_xp._prepare import prepare  # noqa: E402
from gae_xp.backends import _fallback, _triton_launch, _triton_scan, torch_ops  # noqa: E402
from gae_xp.testing import make_case  # noqa: E402

#: name -> (make_case options, gae() options): every option family the operators take.
FAMILIES = {
    "plain": ({}, {}),
    "bootstrap": ({"bootstrap": True}, {}),
    "terminated, truncated": ({"dones": 0.2, "bootstrap": True}, {}),
    "terminated, truncated, next_values": ({"dones": 0.2, "next_values": True}, {}),
    "masks": ({"holes": 0.3, "bootstrap": True}, {}),
    "masks, fill_masked": ({"holes": 0.3, "padding": 2, "dones": 0.1}, {"fill_masked": True}),
    "per-step gamma, per-row lam": ({"per_step_gamma": True, "per_row_lam": True, "dones": 0.1}, {}),
    "critic_lam": ({"dones": 0.1, "holes": 0.2, "bootstrap": True}, {"critic_lam": 0.5}),
    "cu_seqlens": ({"dones": 0.1, "holes": 0.2}, {"cu_seqlens": [0, 4, 4, 11, 17]}),
}
SHAPE = (2, 17)


@pytest.fixture
def triton_on_cpu(monkeypatch):
    """The operators' bodies give CPU tensors to the Triton kernels (the interpreter's); every launch of the
    forward and the adjoint kernel is counted in the returned dict."""
    return give_cpu_tensors_to_triton(monkeypatch)


def give_cpu_tensors_to_triton(monkeypatch) -> dict:
    """``triton_on_cpu``'s work, on a ``pytest.MonkeyPatch``."""
    monkeypatch.setattr(torch_ops, "_TRITON_DEVICES", ("cuda", "cpu"))
    monkeypatch.setattr(_fallback, "_BROKEN", {})
    counts = {"gae_kernel": 0, "_adjoint_rows": 0}
    for module, name in ((_triton_launch, "gae_kernel"), (_triton_scan, "_adjoint_rows")):
        kernel = getattr(module, name)

        class Counting:
            def __getitem__(self, grid, kernel=kernel, name=name):
                counts[name] += 1
                return kernel[grid]

        monkeypatch.setattr(module, name, Counting())
    return counts


def case_tensors(name: str, *, grad: bool):
    """(keyword arguments of gae_xp.gae as float64 CPU tensors, the same as NumPy arrays, the float tensors that
    require grad) for a family of ``FAMILIES``."""
    options, call = FAMILIES[name]
    arrays = make_case(np.random.default_rng(sorted(FAMILIES).index(name)), SHAPE, **options)
    arrays.update({k: v for k, v in call.items() if k != "cu_seqlens"})
    kwargs, leaves = {}, []
    for key, value in arrays.items():
        if isinstance(value, np.ndarray):
            value = torch.from_numpy(value.copy())
            if grad and value.dtype == torch.float64 and key in ("rewards", "values", "bootstrap_value",
                                                                 "next_values"):
                value.requires_grad_()
                leaves.append(key)
        kwargs[key] = value
    if "cu_seqlens" in call:
        offsets = call["cu_seqlens"]
        kwargs["cu_seqlens"] = torch.tensor(offsets)
        kwargs["bootstrap_value"] = torch.from_numpy(
            np.random.default_rng(7).standard_normal((SHAPE[0], len(offsets) - 1))).requires_grad_(grad)
        leaves.append("bootstrap_value")
        arrays["bootstrap_value"] = kwargs["bootstrap_value"].detach().numpy()
    return kwargs, arrays, leaves


def loop(arrays: dict, offsets=None):
    """(advantages, returns) of the float64 per-step loop, one call per packed sequence."""
    if offsets is None:
        return reference.gae_loop(**arrays)
    pieces = []
    for i, (start, end) in enumerate(zip(offsets[:-1], offsets[1:])):
        piece = {k: v[..., start:end] if isinstance(v, np.ndarray) and v.shape[-1] == SHAPE[-1] else v
                 for k, v in arrays.items() if k != "bootstrap_value"}
        piece["bootstrap_value"] = arrays["bootstrap_value"][..., i]
        pieces.append(reference.gae_loop(**piece))
    return tuple(np.concatenate([p[j] for p in pieces], axis=-1) for j in range(2))


def operator_inputs(name: str):
    """The operator's inputs (``torch_ops.INPUTS``' order) for a family, laid out by ``prepare`` as gae() does."""
    kwargs, _, _ = case_tensors(name, grad=False)
    call = prepare(**kwargs, backend="xp")
    return torch_ops.operator_arguments(call.problem)


@pytest.mark.parametrize("name", FAMILIES)
def test_opcheck_with_the_triton_kernels(triton_on_cpu, name):
    """opcheck of both operators (schema, fake tensors, autograd registration, AOT dispatch with static and dynamic
    shapes): eager calls run the Triton kernels, traced ones the opaque operators; their results agree."""
    inputs = operator_inputs(name)
    torch.library.opcheck(torch.ops.gae_xp.gae.default, inputs)
    advantages, returns = torch.ops.gae_xp.gae.default(*inputs)
    upstream = (torch.randn_like(advantages), torch.randn_like(returns))
    torch.library.opcheck(torch.ops.gae_xp.gae_backward.default, (*upstream, *inputs))
    assert triton_on_cpu["gae_kernel"] > 0 and triton_on_cpu["_adjoint_rows"] > 0


@pytest.mark.parametrize("name", FAMILIES)
def test_eager_forward_and_gradients_run_the_triton_kernels(triton_on_cpu, name):
    """gae_xp.gae on CPU tensors that require grad: the operator's forward and backward are the Triton kernels,
    equal to the float64 loop; float64 gradcheck (finite differences along random directions: fast_mode)
    of the inputs that get a gradient."""
    kwargs, arrays, leaves = case_tensors(name, grad=True)
    offsets = FAMILIES[name][1].get("cu_seqlens")
    got = gae_xp.gae(**kwargs)
    assert all("gae_xp_gae" in type(output.grad_fn).__name__ for output in got)
    assert triton_on_cpu["gae_kernel"] > 0
    for g, w in zip(got, loop({k: v for k, v in arrays.items() if k != "cu_seqlens"}, offsets)):
        np.testing.assert_allclose(g.detach().numpy(), w, rtol=1e-10, atol=1e-10)
    rest = {k: v for k, v in kwargs.items() if k not in leaves}
    assert torch.autograd.gradcheck(lambda *x: gae_xp.gae(**dict(zip(leaves, x)), **rest),
                                    tuple(kwargs[k] for k in leaves), fast_mode=True)
    assert triton_on_cpu["_adjoint_rows"] > 0


def test_the_triton_gradients_equal_the_numba_gradients(triton_on_cpu):
    """The backward operator's Triton body and its opaque operator's numba kernels give the same gradients."""
    inputs = operator_inputs("masks, fill_masked")
    upstream = tuple(torch.from_numpy(np.random.default_rng(3).standard_normal(SHAPE)) for _ in range(2))
    on_triton = torch.ops.gae_xp.gae_backward.default(*upstream, *inputs)
    assert triton_on_cpu["_adjoint_rows"] == 1
    on_numba = torch.ops.gae_xp.gae_backward_kernels.default(*upstream, *inputs)
    for name, a, b in zip(torch_ops.DIFFERENTIABLE, on_triton, on_numba):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12, msg=lambda m, name=name: f"{name}: {m}")


@pytest.mark.parametrize("name", ["terminated, truncated", "masks, fill_masked", "cu_seqlens"])
def test_compile_fullgraph_matches_the_loop(triton_on_cpu, name):
    """torch.compile(fullgraph=True) of gae_xp.gae and its gradients (AOTAutograd traces the operators' bodies;
    under the interpreter they trace the opaque operators) against the float64 loop and eager autograd."""
    kwargs, arrays, leaves = case_tensors(name, grad=True)
    offsets = FAMILIES[name][1].get("cu_seqlens")
    torch._dynamo.reset()
    compiled = torch.compile(lambda kw: gae_xp.gae(**kw), fullgraph=True, backend="aot_eager")
    got = compiled(kwargs)
    for g, w in zip(got, loop({k: v for k, v in arrays.items() if k != "cu_seqlens"}, offsets)):
        np.testing.assert_allclose(g.detach().numpy(), w, rtol=1e-10, atol=1e-10)
    upstream = [torch.randn_like(g) for g in got]
    compiled_grads = torch.autograd.grad(got, [kwargs[k] for k in leaves], upstream)
    eager = gae_xp.gae(**kwargs)
    eager_grads = torch.autograd.grad(eager, [kwargs[k] for k in leaves], upstream)
    assert triton_on_cpu["_adjoint_rows"] > 0  # the eager gradients came from the Triton adjoint
    for name_, a, b in zip(leaves, compiled_grads, eager_grads):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10, msg=lambda m, n=name_: f"{n}: {m}")


def test_traced_under_the_interpreter_the_bodies_call_the_opaque_operators(triton_on_cpu):
    """Under the interpreter a traced call (fake tensors) never reaches the kernels: the body's fake run calls the
    opaque operator, whose fake implementation gives the shapes."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    inputs = operator_inputs("masks")
    with FakeTensorMode(allow_non_fake_inputs=True):
        advantages, returns = torch.ops.gae_xp.gae.default(*inputs)
    assert advantages.shape == returns.shape == SHAPE
    assert triton_on_cpu["gae_kernel"] == 0


def test_a_failing_triton_compiler_falls_to_the_opaque_operator(triton_on_cpu, monkeypatch):
    """An eager call whose Triton launch fails in the compiler: the Triton route is remembered as failed, warned
    once, and the opaque operator answers (here the numba kernels, the CPU's); the next call does not retry."""
    compiler = types.ModuleType("triton.compiler")
    exec("def fail(*args):\n    raise RuntimeError('no backend for this GPU')\n", compiler.__dict__)
    monkeypatch.setattr(_triton_launch, "solve", compiler.fail)
    monkeypatch.setattr(torch_ops, "_cuda_reason", lambda: None)
    inputs = operator_inputs("bootstrap")
    with pytest.warns(gae_xp.RouteUnavailableWarning, match="the 'triton' route is unavailable"):
        advantages, _ = torch.ops.gae_xp.gae.default(*inputs)
    assert _fallback.broken("triton") is not None
    torch.testing.assert_close(advantages, torch.ops.gae_xp.gae_kernels.default(*inputs)[0], rtol=0, atol=0)
    assert not torch_ops._launches_triton(inputs[0])


@given(problems())
def test_forward_and_gradients_through_the_triton_kernels_match_autograd_through_the_loop(problem):
    """Random shapes (T from 0 to 30, packed rows with empty sequences) and options: the operators' Triton bodies
    against autograd through the float64 loop, forward and gradients (``tests/test_autograd.py``'s property, run
    there on the numba kernels)."""
    case, offsets, call, seed = problem
    with pytest.MonkeyPatch.context() as monkeypatch:
        counts = give_cpu_tensors_to_triton(monkeypatch)
        ours, oracle = autograd_tensors(case), autograd_tensors(case)
        cu_seqlens = None if offsets is None else torch.from_numpy(offsets)
        got = gae_xp.gae(**ours, cu_seqlens=cu_seqlens, **call)
        want = loop_outputs(oracle, offsets, **call)
        for g, w in zip(got, want):
            torch.testing.assert_close(g, w, rtol=1e-10, atol=1e-10)
        if got[0].numel() == 0:
            return
        assert counts["gae_kernel"] > 0
        upstream = [torch.from_numpy(np.random.default_rng(seed).standard_normal(tuple(g.shape))) for g in got]
        names = differentiable(ours)
        got_grads = torch.autograd.grad(got, [ours[n] for n in names], upstream, allow_unused=True)
        want_grads = torch.autograd.grad(want, [oracle[n] for n in names], upstream, allow_unused=True)
        assert counts["_adjoint_rows"] > 0
        for name, g, w in zip(names, got_grads, want_grads):
            w = torch.zeros_like(oracle[name]) if w is None else w
            torch.testing.assert_close(g, w, rtol=1e-10, atol=1e-10, msg=lambda m, name=name: f"{name}: {m}")


def test_torch_knows_the_kernels_each_operator_launches():
    """torch's registry of a triton_op's kernels, whose source its compile cache hashes (a changed kernel is then
    never served from an older compilation): the forward kernel for gae, the adjoint for gae_backward."""
    from torch._library.triton import get_triton_kernels_for_op

    assert get_triton_kernels_for_op("gae_xp::gae") == [_triton_launch.gae_kernel]
    assert get_triton_kernels_for_op("gae_xp::gae_backward") == [_triton_scan._adjoint_rows]


#: Traces both operators on fake CUDA tensors, without the interpreter (no GPU needed: the launches are recorded,
#: never run), and prints the kernels each graph launches and the operators it calls.
TRACE_SCRIPT = """
import sys
import torch
import triton
from triton.backends.compiler import GPUTarget
from torch._higher_order_ops.triton_kernel_wrap import kernel_side_table
from torch._subclasses.fake_tensor import FakeTensorMode
from torch._subclasses.functional_tensor import dispatch_functionalize
from torch.fx.experimental.proxy_tensor import make_fx
from torch.fx.experimental.symbolic_shapes import ShapeEnv

from gae_xp.backends import _triton_launch, torch_ops



class StandIn:  # the target torch's mutation analysis compiles the kernels' TTIR for (it asks the driver): an H200
    def get_current_target(self):
        return GPUTarget("cuda", 90, 32)


triton.runtime.driver.set_active(StandIn())
_triton_launch._multiprocessors = lambda device: 132
_triton_launch._shared_memory = lambda device: 232_448  # an H200's per program
mode = sys.argv[1]
rows, length = {"chunks": (3, 3000), "pipelined": (1, 1_100_000)}.get(mode, (3, 40))
offsets = [0, 10, 10, 25, 40]
with FakeTensorMode(shape_env=ShapeEnv() if mode == "dynamic" else None):
    def floats(*shape):
        return torch.empty(shape, dtype=torch.float32, device="cuda")
    def flags():
        return torch.empty((rows, length), dtype=torch.bool, device="cuda")
    arguments = {name: None for name in torch_ops.INPUTS}
    arguments.update(rewards=floats(rows, length), values=floats(rows, length), terminated=flags(), mask=flags(),
                     gamma=0.99, lam=0.95, bootstrap=floats(rows, 1), fill_masked=False)
    if mode == "packed":
        arguments.update(offsets=torch.empty(len(offsets), dtype=torch.int64, device="cuda"),
                         bootstrap=floats(rows, len(offsets) - 1), critic_lam=0.5)
    inputs = [arguments[name] for name in torch_ops.INPUTS]
    upstream = [floats(rows, length), floats(rows, length)]

operators = {"forward": (torch.ops.gae_xp.gae.default, inputs),
             "backward": (torch.ops.gae_xp.gae_backward.default, upstream + inputs)}
for name in sys.argv[2].split(","):
    operator, given = operators[name]
    graph = make_fx(dispatch_functionalize(operator), tracing_mode="symbolic" if mode == "dynamic" else "fake")(
        *given).graph
    launches = [node for node in graph.nodes if "triton_kernel_wrapper" in str(node.target)]
    kernels = [kernel_side_table.get_kernel(node.kwargs["kernel_idx"]).fn.__name__ for node in launches]
    written = sorted({name for node in launches for name in node.kwargs["tensors_to_clone"]})
    called = sorted({str(node.target) for node in graph.nodes if "gae_xp" in str(node.target)})
    print(name, "kernels", ",".join(kernels), "writes", ",".join(written), "operators", ",".join(called) or "none")
"""


#: What each traced operator's graph launches and writes (torch's mutation analysis of the kernels: what it counts
#: as written, a compiled graph copies first), per mode: its outputs alone. With chunks (3 rows of 3000 steps:
#: chunks of one block; 1 row of 1.1M steps: 256 chunks of 3 blocks, the walk pipelined) the forward is two
#: launches, the chunks' maps written by the first.
TRACED = {
    "forward": "kernels gae_kernel writes advantages,returns operators none",
    "backward": "kernels _adjoint_rows writes on_bootstrap,on_rewards,on_values operators none",
    "chunks forward": "kernels gae_kernel,gae_kernel writes advantages,maps,returns operators none",
    "pipelined forward": "kernels gae_kernel,gae_kernel writes advantages,maps,returns operators none",
}


@pytest.mark.parametrize(("mode", "operators"), [("static", "forward,backward"), ("dynamic", "forward,backward"),
                                                 ("packed", "forward"), ("chunks", "forward"),
                                                 ("pipelined", "forward")])
def test_traced_on_cuda_the_graph_holds_the_triton_kernels(mode, operators):
    """What torch.compile's AOTAutograd sees of the operators on CUDA tensors (their bodies traced on fake tensors
    under FunctionalTensorMode, in a process without the interpreter): the Triton launches themselves, as
    ``triton_kernel_wrapper_functional`` nodes, and no opaque operator; with symbolic shapes too. (The packed
    backward guards its device offsets with tensor indexing, which a CPU-only torch cannot trace on a fake CUDA
    tensor: "PyTorch is not linked with support for cuda devices"; tests/gpu/test_triton_op_cuda.py compiles it.)"""
    env = {name: value for name, value in os.environ.items() if name != "TRITON_INTERPRET"}
    done = subprocess.run([sys.executable, "-c", TRACE_SCRIPT, mode, operators], capture_output=True, text=True,
                          env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = dict(line.split(" ", 1) for line in done.stdout.splitlines())
    assert sorted(lines) == sorted(operators.split(","))
    for name, line in lines.items():
        assert line == TRACED.get(f"{mode} {name}", TRACED[name]), done.stdout
