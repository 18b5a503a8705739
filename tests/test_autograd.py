"""Gradients through ``gae()`` on torch tensors: the custom operators ``gae_xp::gae`` and ``gae_xp::gae_backward``
(numba kernels forward, the adjoint scan backward), ``torch.compile`` keeping them as nodes, and the routes that
stay on the generic path (per-step coefficients that require grad, ``torch.func`` transforms).

The oracle is autograd through the float64 per-step loop (``gae_xp.reference.gae_loop``, run on torch tensors,
one call per packed sequence), besides ``torch.autograd.gradcheck``'s finite differences.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
from conftest import load_target
from helpers import make_case
from hypothesis import given
from hypothesis import strategies as st

import gae_xp
from gae_xp import reference

torch = pytest.importorskip("torch")


@pytest.fixture(autouse=True)
def _numba_target():
    load_target("torch:cpu/numba")


def tensors(case: dict, grad=("rewards", "values", "bootstrap_value", "next_values")) -> dict:
    """The case as float64 torch tensors; the float arrays named in ``grad`` require grad."""
    out = {}
    for name, value in case.items():
        if isinstance(value, np.ndarray):
            value = torch.from_numpy(np.array(value))
            if value.dtype == torch.float64 and name in grad:
                value.requires_grad_()
        out[name] = value
    return out


def through_operator(outputs) -> bool:
    """True when the outputs come out of the custom operator (its autograd node), not the generic path's."""
    return all("gae_xp_gae" in type(output.grad_fn).__name__ for output in outputs)


def differentiable(arguments: dict) -> list[str]:
    return [name for name, value in arguments.items() if isinstance(value, torch.Tensor) and value.requires_grad]


def gradcheck_gae(arguments: dict, *, second_order=False, **options):
    """gradcheck (and gradgradcheck) of gae() in the tensors of ``arguments`` that require grad."""
    names = differentiable(arguments)
    rest = {name: value for name, value in arguments.items() if name not in names}

    def function(*inputs):
        return gae_xp.gae(**dict(zip(names, inputs)), **rest, **options)

    inputs = tuple(arguments[name] for name in names)
    assert through_operator(function(*inputs))
    assert torch.autograd.gradcheck(function, inputs)
    if second_order:
        assert torch.autograd.gradgradcheck(function, inputs)


CASES = {
    "constant discount": ({}, {}),
    "dones, holes, bootstrap": (dict(dones=0.1, holes=0.2, bootstrap=True), {}),
    "next values, dones, holes": (dict(next_values=True, dones=0.1, holes=0.2), {}),
    "per-step gamma, per-row lam": (dict(per_step_gamma=True, per_row_lam=True, dones=0.05, holes=0.1), {}),
    "fill_masked": (dict(holes=0.3, padding=3, bootstrap=True, dones=0.05), dict(fill_masked=True)),
    "critic_lam": (dict(dones=0.1, holes=0.2, bootstrap=True), dict(critic_lam=1.0)),
    "critic_lam, next values, fill_masked": (dict(next_values=True, dones=0.1, holes=0.3),
                                             dict(critic_lam=0.5, fill_masked=True)),
}


@pytest.mark.parametrize("name", CASES)
def test_gradcheck(name):
    options, call = CASES[name]
    arguments = tensors(make_case(np.random.default_rng(1), (2, 23), **options))
    gradcheck_gae(arguments, second_order=name == "dones, holes, bootstrap", **call)


def test_gradcheck_per_step_critic_lam():
    case = make_case(np.random.default_rng(2), (2, 19), dones=0.1, holes=0.2, bootstrap=True)
    critic_lam = torch.from_numpy(np.random.default_rng(3).uniform(0.0, 1.0, (2, 19)))
    gradcheck_gae(tensors(case), critic_lam=critic_lam)


def packed_case(rng, batch, total, *, empty: bool, holes=0.2, dones=0.1):
    """A packed row (cu_seqlens) with a bootstrap value per sequence; with ``empty``, empty sequences first, inside
    and last."""
    inner = np.sort(rng.choice(np.arange(1, total), size=4, replace=False))
    offsets = np.concatenate([[0, 0] if empty else [0], inner[:2], inner[1:2] if empty else [], inner[2:], [total],
                              [total] if empty else []]).astype(np.int64)
    case = make_case(rng, (*batch, total), holes=holes, dones=dones)
    case["bootstrap_value"] = rng.standard_normal((*batch, len(offsets) - 1))
    return case, offsets


@pytest.mark.parametrize("empty", [False, True])
@pytest.mark.parametrize("host_offsets", [False, True])
def test_gradcheck_packed(empty, host_offsets):
    case, offsets = packed_case(np.random.default_rng(4), (2,), 31, empty=empty)
    cu_seqlens = offsets.tolist() if host_offsets else torch.from_numpy(offsets)
    gradcheck_gae(tensors(case), cu_seqlens=cu_seqlens, second_order=empty)


# --- the operators themselves --------------------------------------------------------------------------------------


def operator_arguments(rng, *, rows=2, length=17, next_values=False, flags=True, per_step=False, critic=None,
                       fill_masked=False, offsets=None, carry=False, grad=True) -> dict:
    """Arguments of ``torch.ops.gae_xp.gae`` by name (``gae_xp.backends.torch_ops.INPUTS`` gives their order)."""
    shape = (rows, length)
    count = 1 if offsets is None else len(offsets) - 1

    def floats(*size):
        return torch.from_numpy(rng.standard_normal(size)).requires_grad_(grad)

    def flag(p):
        return torch.from_numpy(rng.random(shape) < p) if flags else None

    return {"rewards": floats(*shape), "values": floats(*shape), "next_values": floats(*shape) if next_values else None,
            "terminated": flag(0.1), "truncated": flag(0.1), "mask": flag(0.8),
            "gamma": None if per_step else 0.97, "gamma_steps": torch.from_numpy(rng.uniform(0.5, 1.0, shape))
            if per_step else None, "lam": 0.9, "lam_steps": None, "critic_lam": critic, "critic_lam_steps": None,
            "bootstrap": torch.zeros((rows, count), dtype=torch.float64) if next_values else floats(rows, count),
            "fill_masked": fill_masked, "offsets": None if offsets is None else torch.tensor(offsets),
            "host_offsets": None, "carry": floats(rows, count) if carry else None}


def in_order(arguments: dict) -> tuple:
    from gae_xp.backends import torch_ops

    assert set(arguments) == set(torch_ops.INPUTS)
    return tuple(arguments[name] for name in torch_ops.INPUTS)


OPERATOR_SAMPLES = {
    "plain": dict(flags=False),
    "flags": dict(),
    "next values, per-step gamma, critic_lam": dict(next_values=True, per_step=True, critic=1.0),
    "segments with an empty one, carry, fill_masked": dict(offsets=[0, 5, 5, 12, 17], carry=True, fill_masked=True),
}


@pytest.mark.parametrize("name", OPERATOR_SAMPLES)
def test_opcheck(name):
    from gae_xp.backends import torch_ops

    arguments = in_order(operator_arguments(np.random.default_rng(5), **OPERATOR_SAMPLES[name]))
    torch.library.opcheck(torch.ops.gae_xp.gae.default, arguments)
    advantages, returns = torch_ops.gae(*arguments)
    upstream = (torch.randn_like(advantages), torch.randn_like(returns))
    detached = tuple(a.detach() if isinstance(a, torch.Tensor) else a for a in arguments)
    torch.library.opcheck(torch.ops.gae_xp.gae_backward.default, (*upstream, *detached))


def test_gradcheck_carry_through_the_operator():
    from gae_xp.backends import torch_ops

    arguments = in_order(operator_arguments(np.random.default_rng(6), offsets=[0, 4, 4, 11, 17], carry=True))
    positions = [i for i, a in enumerate(arguments) if isinstance(a, torch.Tensor) and a.requires_grad]
    assert [torch_ops.INPUTS[i] for i in positions] == ["rewards", "values", "bootstrap", "carry"]

    def function(*inputs):
        merged = list(arguments)
        for position, value in zip(positions, inputs):
            merged[position] = value
        return torch_ops.gae(*merged)

    inputs = tuple(arguments[i] for i in positions)
    assert torch.autograd.gradcheck(function, inputs)
    assert torch.autograd.gradgradcheck(function, inputs)


def test_operator_refuses_gradients_to_per_step_coefficients():
    from gae_xp.backends import torch_ops

    arguments = operator_arguments(np.random.default_rng(7), per_step=True)
    arguments["gamma_steps"].requires_grad_()
    advantages, _ = torch_ops.gae(*in_order(arguments))
    with pytest.raises(RuntimeError, match="per-step gamma"):
        advantages.sum().backward()


# --- against autograd through the float64 loop -------------------------------------------------------------------


def loop_outputs(arguments: dict, offsets, **options):
    """(advantages, returns) of the float64 loop, one call per packed sequence (autograd flows through it)."""
    if offsets is None:
        return reference.gae_loop(**arguments, **options)
    per_sequence = []
    bootstrap = arguments.get("bootstrap_value")
    length = arguments["rewards"].shape[-1]
    per_step = [name for name, value in arguments.items()
                if isinstance(value, torch.Tensor) and name != "bootstrap_value" and value.shape[-1] == length]
    for i, (start, end) in enumerate(zip(offsets[:-1], offsets[1:])):
        if start == end:
            continue
        piece = {name: value[..., start:end] if name in per_step else value for name, value in arguments.items()}
        if bootstrap is not None:
            piece["bootstrap_value"] = bootstrap[..., i]
        per_sequence.append(reference.gae_loop(**piece, **options))
    if not per_sequence:
        empty = torch.zeros_like(arguments["rewards"])
        return empty, empty
    return tuple(torch.cat([outputs[j] for outputs in per_sequence], dim=-1) for j in range(2))


@st.composite
def problems(draw):
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    batch = draw(st.sampled_from([(1,), (2,), (2, 2)]))
    length = draw(st.integers(0, 30))
    packed = length >= 2 and draw(st.booleans())
    options = dict(dones=draw(st.sampled_from([0.0, 0.1, 0.4])), holes=draw(st.sampled_from([0.0, 0.2, 0.7])),
                   per_step_gamma=draw(st.booleans()), per_row_lam=draw(st.booleans()))
    boundary = draw(st.sampled_from(["none", "bootstrap", "next_values"]))
    if boundary == "next_values":
        options["next_values"] = True
    elif boundary == "bootstrap" and not packed:
        options["bootstrap"] = True
    case = make_case(rng, (*batch, length), **options)
    offsets = None
    if packed:
        cuts = np.sort(rng.integers(0, length + 1, size=draw(st.integers(0, 4))))
        offsets = np.concatenate([[0], cuts, [length]]).astype(np.int64)
        if boundary == "bootstrap":
            case["bootstrap_value"] = rng.standard_normal((*batch, len(offsets) - 1))
    call = dict(fill_masked=draw(st.booleans()), critic_lam=draw(st.sampled_from([None, 0.5, 1.0])))
    return case, offsets, call, seed


@pytest.mark.slow  # minutes of compilation; the quick run has gradcheck and opcheck
@given(problems())
def test_forward_and_backward_match_autograd_through_the_loop(problem):
    case, offsets, call, seed = problem
    ours, oracle = tensors(case), tensors(case)
    cu_seqlens = None if offsets is None else torch.from_numpy(offsets)
    got = gae_xp.gae(**ours, cu_seqlens=cu_seqlens, **call)
    want = loop_outputs(oracle, offsets, **call)
    assert through_operator(got)
    upstream = [torch.from_numpy(np.random.default_rng(seed).standard_normal(tuple(g.shape))) for g in got]
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=1e-10, atol=1e-10)
    names = differentiable(ours)
    if got[0].numel() == 0:
        return
    got_grads = torch.autograd.grad(got, [ours[n] for n in names], upstream, allow_unused=True)
    want_grads = torch.autograd.grad(want, [oracle[n] for n in names], upstream, allow_unused=True)
    for name, g, w in zip(names, got_grads, want_grads):
        w = torch.zeros_like(oracle[name]) if w is None else w
        torch.testing.assert_close(g, w, rtol=1e-10, atol=1e-10, msg=lambda m, name=name: f"{name}: {m}")


def test_float32_gradients_are_as_accurate_as_the_float32_loop():
    case = make_case(np.random.default_rng(8), (3, 2000), dones=0.01, holes=0.1, bootstrap=True)
    narrow = {k: v.astype(np.float32) if isinstance(v, np.ndarray) and v.dtype == np.float64 else v
              for k, v in case.items()}
    upstream = np.random.default_rng(9).standard_normal((2, 3, 2000))

    def gradients(function, arrays, dtype):
        leaves = {k: torch.from_numpy(v.copy()) if isinstance(v, np.ndarray) else v for k, v in arrays.items()}
        for name in ("rewards", "values", "bootstrap_value"):
            leaves[name].requires_grad_()
        outputs = function(**leaves)
        return outputs, torch.autograd.grad(outputs, [leaves[n] for n in ("rewards", "values", "bootstrap_value")],
                                            [torch.from_numpy(u).to(dtype) for u in upstream])

    _, exact = gradients(reference.gae_loop, case, torch.float64)
    _, loop = gradients(reference.gae_loop, narrow, torch.float32)
    outputs, ours = gradients(gae_xp.gae, narrow, torch.float32)
    assert through_operator(outputs) and all(g.dtype == torch.float32 for g in ours)
    for got, serial, want in zip(ours, loop, exact):
        assert (got.double() - want).abs().max() <= max(2 * (serial.double() - want).abs().max(), 1e-6)


# --- routes ----------------------------------------------------------------------------------------------------


def test_gradients_to_per_step_gamma_and_lam_take_the_generic_path():
    case = make_case(np.random.default_rng(10), (2, 21), dones=0.1, holes=0.2, per_step_gamma=True,
                     per_row_lam=True)
    arguments = tensors(case, grad=("rewards", "gamma", "lam"))
    names = differentiable(arguments)
    assert names == ["rewards", "gamma", "lam"]
    assert not through_operator(gae_xp.gae(**arguments))
    rest = {name: value for name, value in arguments.items() if name not in names}
    assert torch.autograd.gradcheck(lambda *x: gae_xp.gae(**dict(zip(names, x)), **rest),
                                    tuple(arguments[n] for n in names))


def test_no_grad_mode_and_tensors_without_grad():
    case = make_case(np.random.default_rng(11), (2, 50), dones=0.1, holes=0.2)
    arguments = tensors(case)
    want = reference.gae_loop(**tensors(case, grad=()))
    with torch.no_grad():
        got = gae_xp.gae(**arguments)
    assert all(g.grad_fn is None for g in got)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=1e-12, atol=1e-12)


def test_inputs_are_not_modified_and_nothing_shares_their_memory():
    case = make_case(np.random.default_rng(12), (2, 40), dones=0.1, holes=0.2, bootstrap=True)
    arguments = tensors(case)
    before = {k: v.detach().clone() for k, v in arguments.items() if isinstance(v, torch.Tensor)}
    outputs = gae_xp.gae(**arguments)
    leaves = [arguments[n] for n in differentiable(arguments)]
    grads = torch.autograd.grad(outputs, leaves, [torch.ones_like(o) for o in outputs])
    for name, value in before.items():
        assert torch.equal(arguments[name].detach(), value), name
    pointers = {v.untyped_storage().data_ptr() for v in arguments.values() if isinstance(v, torch.Tensor)}
    assert not pointers & {t.untyped_storage().data_ptr() for t in (*outputs, *grads)}


def test_meta_tensors_give_shapes_and_dtypes():
    rewards = torch.empty((3, 7), device="meta", dtype=torch.float32)
    advantages, returns = gae_xp.gae(rewards, rewards, mask=torch.empty((3, 7), dtype=torch.bool, device="meta"))
    assert advantages.device.type == returns.device.type == "meta"
    assert advantages.shape == returns.shape == (3, 7) and advantages.dtype == torch.float32


def test_torch_func_transforms_take_the_generic_path(monkeypatch):
    from gae_xp.backends import torch_ops

    case = make_case(np.random.default_rng(13), (3, 30), dones=0.1, holes=0.2)
    plain = tensors(case, grad=())
    flags = {k: v for k, v in plain.items() if k in ("terminated", "truncated", "mask")}
    routes = []
    original = torch_ops.TorchOpBackend.unavailable_reason

    def recorded(self, xp, arrays, *, forced=False):
        routes.append(original(self, xp, arrays, forced=forced))
        return routes[-1]

    monkeypatch.setattr(torch_ops.TorchOpBackend, "unavailable_reason", recorded)
    per_row = torch.func.vmap(lambda r, v, *f: gae_xp.gae(r, v, **dict(zip(flags, f)),
                                                          truncated_bootstrap="next_step")[0])(
        plain["rewards"], plain["values"], *flags.values())
    want = reference.gae_loop(**plain)
    torch.testing.assert_close(per_row, want[0], rtol=1e-12, atol=1e-12)

    def loss(r, v):
        return (gae_xp.gae(r, v, **flags, truncated_bootstrap="next_step")[0] ** 2).sum()

    grads = torch.func.grad(loss, argnums=(0, 1))(plain["rewards"], plain["values"])
    leaves = tensors(case)
    want = torch.autograd.grad((reference.gae_loop(**leaves)[0] ** 2).sum(), [leaves["rewards"], leaves["values"]])
    for g, w in zip(grads, want):
        torch.testing.assert_close(g, w, rtol=1e-10, atol=1e-10)
    assert len(routes) == 2 and all("torch.func" in reason for reason in routes)


# --- torch.compile --------------------------------------------------------------------------------------------

#: The tensor operations a compiled gae() may hold besides the operator: the layout of the arguments (casts,
#: broadcasts, a trailing axis, the bootstrap's zeros) and, with dynamic shapes, Dynamo's reading of a float
#: argument as a symbol (``item``). No scan, no matmul, no where, no flip. Arithmetic on symbols (shape checks,
#: a segment count) makes no tensor and is not counted.
LAYOUT = {"broadcast_to", "expand", "unsqueeze", "getitem", "item", "to", "full"}


def graph_targets(graph) -> set[str]:
    """The names of the graph's operations that make tensors (the operators by their qualified names)."""
    names = set()
    for node in graph.nodes:
        if node.op not in ("call_function", "call_method"):
            continue
        made = node.meta.get("example_value", node.meta.get("val"))
        if not isinstance(made, (torch.Tensor, tuple, list)):
            continue
        target = node.target
        names.add(str(target) if "gae_xp" in str(target) else getattr(target, "__name__", str(target)))
    return names


COMPILED_CASES = {
    "constant discount": (dict(), {}),
    "dones, holes, bootstrap": (dict(dones=0.05, holes=0.2, bootstrap=True), {}),
    "per-step gamma, next values, critic_lam": (dict(per_step_gamma=True, next_values=True, dones=0.05),
                                                dict(critic_lam=1.0)),
    "packed": (dict(holes=0.1), dict(cu_seqlens=[0, 60, 60, 130, 200])),
}


@pytest.mark.parametrize("dynamic", [False, True])
@pytest.mark.parametrize("name", COMPILED_CASES)
def test_compile_fullgraph_calls_the_operator(name, dynamic):
    options, call = COMPILED_CASES[name]
    case = make_case(np.random.default_rng(14), (3, 200), **options)
    arguments = tensors(case, grad=())
    if "cu_seqlens" in call:
        call = {**call, "cu_seqlens": torch.tensor(call["cu_seqlens"])}
    graphs = []

    def recording(graph_module, example_inputs):
        graphs.append(graph_module.graph)
        return graph_module

    torch._dynamo.reset()
    compiled = torch.compile(lambda kw: gae_xp.gae(**kw, **call), fullgraph=True, dynamic=dynamic, backend=recording)
    got = compiled(arguments)
    want = gae_xp.gae(**arguments, **call)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=0, atol=0)
    assert len(graphs) == 1
    targets = graph_targets(graphs[0])
    assert "gae_xp.gae.default" in targets
    # traced CPU offsets are checked when the graph runs (issue 30, case 1): one more operator, on the offsets
    operators = {"gae_xp.gae.default"} | ({"gae_xp.checked_offsets.default"} if "cu_seqlens" in call else set())
    assert targets - operators <= LAYOUT, targets


def test_compiled_backward_is_the_backward_operator():
    from torch._dynamo.backends.common import aot_autograd
    from torch._functorch.aot_autograd import make_boxed_func

    from gae_xp.backends import torch_ops

    case = make_case(np.random.default_rng(15), (3, 150), dones=0.05, holes=0.2, bootstrap=True)
    compiled_arguments, eager_arguments = tensors(case), tensors(case)
    graphs = {}

    def keep(part):
        def compiler(graph_module, example_inputs):
            graphs[part] = graph_module.graph
            return make_boxed_func(graph_module.forward)
        return compiler

    torch._dynamo.reset()
    compiled = torch.compile(lambda kw: gae_xp.gae(**kw), fullgraph=True,
                             backend=aot_autograd(fw_compiler=keep("forward"), bw_compiler=keep("backward")))
    got, want = compiled(compiled_arguments), gae_xp.gae(**eager_arguments)
    upstream = [torch.randn_like(g) for g in got]
    names = differentiable(eager_arguments)
    got_grads = torch.autograd.grad(got, [compiled_arguments[n] for n in names], upstream)
    want_grads = torch.autograd.grad(want, [eager_arguments[n] for n in names], upstream)
    for g, w in zip((*got, *got_grads), (*want, *want_grads)):
        torch.testing.assert_close(g, w, rtol=0, atol=0)
    # Where triton is installed the operators are torch.library.triton_op's, whose bodies AOTAutograd traces: on the
    # CPU each body is its opaque operator; without triton the operators are opaque custom ops themselves
    forward, backward = (("gae_xp.gae_kernels.default", "gae_xp.gae_backward_kernels.default")
                         if torch_ops._TRITON_INSTALLED else ("gae_xp.gae.default", "gae_xp.gae_backward.default"))
    assert forward in graph_targets(graphs["forward"])
    # besides the operator, only the gradients of the layout: the bootstrap's trailing axis squeezed away
    assert graph_targets(graphs["backward"]) - {backward, "getitem"} <= {"squeeze.dim"}
    assert backward in graph_targets(graphs["backward"])


# --- the CUDA backward in the simulator (once the numba-CUDA backend has one) -----------------------------------


@pytest.mark.cudasim
@pytest.mark.skipif(os.environ.get("NUMBA_ENABLE_CUDASIM") != "1", reason="needs NUMBA_ENABLE_CUDASIM=1 (.ci/run)")
@pytest.mark.parametrize("name", ["plain", "dones, holes, bootstrap", "next values, fill_masked"])
def test_cuda_backward_matches_the_numba_backward(name):
    from gae_xp import _prepare
    from gae_xp.backends import _numba_backward, numba_cuda

    options = {"plain": {}, "dones, holes, bootstrap": dict(dones=0.1, holes=0.2, bootstrap=True),
               "next values, fill_masked": dict(next_values=True, holes=0.3)}[name]
    rng = np.random.default_rng(16)
    case = make_case(rng, (2, 37), **options)
    problem = _prepare.prepare(**case, fill_masked=name.endswith("fill_masked")).problem
    upstream = rng.standard_normal((2, 2, 37))
    got = numba_cuda.BACKEND.gae_backward(problem, upstream[0], upstream[1])
    want = _numba_backward.gae_backward(problem, upstream[0], upstream[1])
    for key in ("rewards", "values", "next_values", "bootstrap"):
        if want[key] is None:
            assert got.get(key) is None
        else:
            np.testing.assert_allclose(np.asarray(got[key]), want[key], rtol=1e-12, atol=1e-12)
