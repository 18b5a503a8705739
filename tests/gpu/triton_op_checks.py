"""The torch operators (``torch.library.triton_op``) under ``torch.compile`` and in CUDA graphs, on a GPU.

Run by ``test_triton_op_cuda.py`` in a process without ``TRITON_INTERPRET``:
``python triton_op_checks.py compile|graphs``. Each part prints one line per
case and "checked N cases"; the first mismatch raises.

* compile: ``torch.compile(fullgraph=True)`` (Inductor) of ``gae_xp.gae`` on
  float32 CUDA tensors that require grad: the forward against the float64
  loop, the gradients against eager autograd (the operators' Triton kernels),
  and the graphs AOTAutograd hands Inductor hold the Triton launches
  (``triton_kernel_wrapper_functional``), not the opaque operators;
* graphs: the compiled function captured in a CUDA graph (``torch.cuda.graph``)
  and replayed on new inputs copied into the captured ones: equal to eager
  (the first case).
"""

from __future__ import annotations

import os
import sys

import numpy as np
import torch

import gae_xp
from gae_xp import reference
from gae_xp.testing import make_case

DEVICE = torch.device("cuda")
SHAPE = (64, 300)
CASES = {
    "terminated, truncated, bootstrap": ({"dones": 0.05, "bootstrap": True}, {}),
    "masks, fill_masked, per-step gamma": ({"holes": 0.2, "dones": 0.05, "per_step_gamma": True},
                                           {"fill_masked": True}),
    "critic_lam": ({"dones": 0.05, "bootstrap": True}, {"critic_lam": 0.5}),
}


def case(name: str, seed: int = 0, *, device=DEVICE, shape=SHAPE):
    """(keyword arguments as float32 tensors on ``device`` whose rewards, values and bootstrap values require grad,
    the float64 NumPy arrays, the names of those that require grad). tests/test_gpu_calls_on_cpu.py builds small
    cases on the CPU."""
    options, call = CASES[name]
    arrays = make_case(np.random.default_rng(seed), shape, **options)
    kwargs, leaves = dict(call), []
    for key, value in arrays.items():
        if isinstance(value, np.ndarray):
            tensor = torch.from_numpy(value).to(device)
            if tensor.dtype == torch.float64:
                tensor = tensor.float()
                if key in ("rewards", "values", "bootstrap_value"):
                    tensor.requires_grad_()
                    leaves.append(key)
            value = tensor
        kwargs[key] = value
    return kwargs, {**arrays, **call}, leaves


def graph_launches(graphs) -> tuple[int, list[str]]:
    """(Triton launches, gae_xp operators) in the graphs AOTAutograd produced."""
    launches, operators = 0, []
    for graph in graphs:
        for node in graph.nodes:
            launches += "triton_kernel_wrapper" in str(node.target)
            if "gae_xp" in str(node.target):
                operators.append(str(node.target))
    return launches, operators


def traced_graphs(name: str) -> list:
    """The forward and backward graphs AOTAutograd makes of gae_xp.gae on the case (recorded, run uncompiled)."""
    from torch._dynamo.backends.common import aot_autograd
    from torch._functorch.aot_autograd import make_boxed_func

    graphs = []

    def keep(graph_module, example_inputs):
        graphs.append(graph_module.graph)
        return make_boxed_func(graph_module.forward)

    torch._dynamo.reset()
    recording = aot_autograd(fw_compiler=keep, bw_compiler=keep)
    kwargs, _, leaves = case(name)
    outputs = torch.compile(lambda kw: gae_xp.gae(**kw), fullgraph=True, backend=recording)(kwargs)
    torch.autograd.grad(outputs, [kwargs[k] for k in leaves], [torch.ones_like(o) for o in outputs])
    return graphs


def check_compile() -> int:
    checked = 0
    for name in CASES:
        launches, operators = graph_launches(traced_graphs(name))
        assert launches >= 2 and not operators, (name, launches, operators)
        torch._dynamo.reset()
        compiled = torch.compile(lambda kw: gae_xp.gae(**kw), fullgraph=True)  # Inductor
        kwargs, arrays, leaves = case(name)
        got = compiled(kwargs)
        want = reference.gae_loop(**arrays)
        for g, w in zip(got, want):
            np.testing.assert_allclose(g.detach().cpu().double().numpy(), w, rtol=1e-4, atol=1e-4, err_msg=name)
        upstream = [torch.randn_like(g) for g in got]
        compiled_grads = torch.autograd.grad(got, [kwargs[k] for k in leaves], upstream)
        eager_grads = torch.autograd.grad(gae_xp.gae(**kwargs), [kwargs[k] for k in leaves], upstream)
        for key, a, b in zip(leaves, compiled_grads, eager_grads):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5, msg=lambda m, key=key: f"{name}, {key}: {m}")
        print(f"compile {name}: {launches} Triton launches in the forward and backward graphs; Inductor's result "
              "equals the loop, its gradients eager autograd's")
        checked += 1
    return checked


def check_graphs() -> int:
    checked = 0
    for name in list(CASES)[:1]:  # one case: each costs an Inductor compilation, and the GPU check is short
        torch._dynamo.reset()
        compiled = torch.compile(lambda kw: gae_xp.gae(**kw), fullgraph=True)
        kwargs, _, _ = case(name)
        static = {k: v.detach() if isinstance(v, torch.Tensor) else v for k, v in kwargs.items()}
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # warm-up on a side stream: compiles, and leaves nothing pending
            for _ in range(2):
                compiled(static)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            captured = compiled(static)
        fresh, _, _ = case(name, seed=1)
        for key, value in fresh.items():
            if isinstance(value, torch.Tensor):
                static[key].copy_(value.detach())
        graph.replay()
        torch.cuda.synchronize()
        want = gae_xp.gae(**static)
        for g, w in zip(captured, want):
            torch.testing.assert_close(g, w, rtol=1e-6, atol=1e-6, msg=lambda m: f"{name}: {m}")
        print(f"graphs {name}: replay on new inputs equals eager")
        checked += 1
    return checked


if __name__ == "__main__":
    assert os.environ.get("TRITON_INTERPRET", "0") in ("0", ""), "run without TRITON_INTERPRET"
    part = sys.argv[1]
    count = {"compile": check_compile, "graphs": check_graphs}[part]()
    print(f"checked {count} cases")
