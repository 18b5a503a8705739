r"""PyTorch: ``gae()`` as the custom operators ``torch.ops.gae_xp.gae`` and ``gae_xp.gae_backward``.

Imported only when torch tensors arrive that record autograd history or are
traced (``torch.compile``, meta tensors): ``gae_xp.backends.select`` sends
them here. The operators make the kernels one node that autograd and
``torch.compile`` keep:

* ``gae_xp::gae(rewards, values, next_values, ..., carry) -> (advantages, returns)``
  (the inputs ``INPUTS``: a ``GaeProblem``'s fields by name, its per-step ones
  in the order of ``gae_xp._problem.PER_STEP``): the forward;
* ``gae_xp::gae_backward(grad_advantages, grad_returns, <gae's inputs>) ->
  (rewards, values, next_values, bootstrap, carry)`` (``DIFFERENTIABLE``;
  an empty tensor for an absent input): the gradients, which
  ``register_autograd`` wires to the forward. ``gae()`` is linear in its
  float inputs once flags and coefficients are fixed, so the backward is
  the adjoint scan: the same coefficients run forward in time, cut at the
  same places (``gae_xp.backends._numba_backward``; on CUDA tensors the
  Triton kernels of ``gae_xp.backends._triton_scan``), and its own backward
  is the forward operator again (second derivatives are exact).

How they are built. Where triton is installed, both are
``torch.library.triton_op``'s: an operator whose body is ordinary PyTorch
code plus Triton launches through ``torch.library.wrap_triton``. torch runs
the body three ways: as the eager implementation (registered as the CPU and
CUDA kernels, the kernels launched directly), as the fake implementation
(``opcheck``, meta tensors), and, under ``torch.compile``, traced by
AOTAutograd (``triton_op``'s own rule), so that the graph handed to
Inductor holds the Triton launches themselves (Inductor compiles, schedules
and fuses around them, and CUDA graphs capture them) rather than one opaque
call. The bodies (``_gae_body``, ``_gae_backward_body``) therefore read no
value on the host before a launch: the plan of a launch (grid, block,
alignment class, strides) comes from shapes, strides and dtypes alone
(``gae_xp.backends._triton_launch``). Where triton is not installed they
are ``custom_op``'s over the same bodies.

A body launches the Triton kernels for CUDA tensors (``_launches_triton``);
everything else goes to an opaque ``custom_op`` of its own,
``gae_xp::gae_kernels`` / ``gae_xp::gae_backward_kernels``: the numba
kernels for CPU tensors, numba-CUDA's for CUDA tensors where Triton cannot
run, with a fake implementation (shapes and dtypes). The fallback from a
failing Triton compiler stays inside the bodies, around the launches: an
eager call whose launch fails in Triton's compiler remembers the Triton
route as failed (warned once) and calls the opaque operator, which runs
numba-CUDA; later calls, traced ones included, go to the opaque operator
from the start. A traced call cannot fail there (its launches are recorded;
Inductor compiles them later), so it needs no fallback of its own. Keeping
the fallback outside the registration, as a second CUDA kernel of the
operator, would not do: under ``torch.compile`` AOTAutograd traces the body
whatever kernel is registered for the device.

Under Triton's interpreter (``TRITON_INTERPRET=1``) a traced body calls the
opaque operators too: ``wrap_triton`` hands an interpreted kernel back
unwrapped, and the interpreter copies each argument's storage to the host,
which a fake tensor does not have ("Cannot access data pointer of Tensor
(e.g. FakeTensor ...)"); ``triton_op`` makes the body the fake
implementation, so it would run the kernel on fake tensors.

Inputs are a ``GaeProblem``'s fields: time last, compute dtype (float32 or
float64), ``bootstrap`` (and ``carry``) of the batch shape plus a trailing
axis of the segments' count. A coefficient is a float plus an optional
per-step tensor that replaces it; ``critic_lam`` None (and no tensor) means
the returns use ``lam``. No gradient flows to per-step ``gamma``, ``lam`` or
``critic_lam`` through the operators: ``BACKEND.gae`` sends calls whose
coefficients require grad to the generic path, whose autograd has them.

Offsets: the CPU implementations check the offsets they are given (a
ValueError naming cu_seqlens: callers may pass traced or hand-made ones);
``gae_xp::checked_offsets`` checks traced CPU offsets for the generic path
and the estimators when the graph runs; the numba-CUDA backend guards
device offsets that nobody read on the device (NaN outputs).

Served here (``BACKEND.unavailable_reason``): torch tensors on the CPU with
numba installed, meta tensors, and CUDA tensors where triton or numba-cuda
can run; not ``torch.func`` transforms (vmap, grad, jvp), which
take the generic path. Everything but ``gae`` (``discounted_cumsum``, the
estimators' scans, the pieces' summaries) is the generic path.
"""

from __future__ import annotations

import importlib.util
import inspect

import numpy as np
import torch
from torch import Tensor
from torch._subclasses.fake_tensor import is_fake

from gae_xp._compat import array_namespace, is_torch_array, torch_cpu_view, torch_is_recorded
from gae_xp._prepare import check_offset_values
from gae_xp._problem import COEFFICIENTS, FLAGS, PER_STEP, GaeProblem

from . import _fallback, fail, numba_cpu, solve_gae
from . import xp as _generic

NAME = "torch-op"
#: Read once here, not per call: under ``torch.compile`` a cached lookup would be traced on every compilation.
_NUMBA_INSTALLED = importlib.util.find_spec("numba") is not None
#: Triton comes with torch's Linux CUDA builds: where it imports, the operators run its kernels on CUDA tensors.
_TRITON_INSTALLED = importlib.util.find_spec("triton") is not None
#: The devices whose tensors the operators' bodies give to the Triton kernels (``_launches_triton``).
_TRITON_DEVICES = ("cuda",)


class TorchOpBackend:
    name = NAME
    segments = True
    uses_chunk_size = False
    critic_lam = True
    summarize = None

    def unavailable_reason(self, xp, arrays, *, forced=False):
        if not all(is_torch_array(a) for a in arrays):
            return "the custom operators take torch tensors"
        if not torch.compiler.is_compiling() and any(torch._C._functorch.is_functorch_wrapped_tensor(a)
                                                       for a in arrays):
            return "torch.func transforms (vmap, grad) take the generic path"
        device = arrays[0].device.type
        if device == "meta":
            return None
        if device == "cpu":
            return _fallback.broken("numba") or (None if _NUMBA_INSTALLED
                                                 else "numba is not installed (pip install 'gae_xp[numba]')")
        if device == "cuda":
            return _cuda_reason()
        return f"the custom operators have no kernel for {device} tensors"

    def scan(self, xp, x, a, *, reverse, chunk_size):
        return _generic.BACKEND.scan(xp, x, a, reverse=reverse, chunk_size=chunk_size)

    def gae(self, problem, *, chunk_size):
        """The operator's (advantages, returns), or the generic path's where the operator gives no gradient."""
        if _generic_reason(problem) is not None:
            return _generic.BACKEND.gae(problem, chunk_size=chunk_size)
        return gae(*operator_arguments(problem))


BACKEND = TorchOpBackend()


def _generic_reason(p: GaeProblem) -> str | None:
    """Why the generic path, not the operator, solves ``p`` (None when the operator does)."""
    if any(is_torch_array(c) and c.requires_grad for c in (p.gamma, p.lam, p.critic_lam)):
        return "per-step gamma, lam or critic_lam that require grad: the generic path's autograd differentiates them"
    if p.rewards.device.type == "cuda":
        if p.carry is not None and p.carry.requires_grad and _cuda_backend().name == "numba-cuda":
            return "the numba-CUDA backward gives no gradient to a carry"
    return None


# --- the operators' inputs: a problem's fields, in the order of gae_xp._problem.PER_STEP ---------------------------

def _schema() -> tuple[tuple[str, str], ...]:
    """(schema type, name) of every input of ``gae_xp::gae``: each per-step field (a coefficient as a float and
    an optional per-step tensor that replaces it), then the per-segment boundary, the option and the segments."""
    inputs = []
    for field in PER_STEP:
        if field in COEFFICIENTS:
            inputs += [("float?", field), ("Tensor?", f"{field}_steps")]
        else:
            inputs.append(("Tensor" if field in ("rewards", "values") else "Tensor?", field))
    return (*inputs, ("Tensor", "bootstrap"), ("bool", "fill_masked"), ("Tensor?", "offsets"),
            ("Tensor?", "host_offsets"), ("Tensor?", "carry"))


_SCHEMA = _schema()
INPUTS = tuple(name for _, name in _SCHEMA)
#: The inputs that get a gradient, in the order of the backward operator's outputs.
DIFFERENTIABLE = (*(field for field in PER_STEP if field not in FLAGS and field not in COEFFICIENTS),
                  "bootstrap", "carry")
_COEFFICIENT_STEPS = tuple(f"{field}_steps" for field in COEFFICIENTS)
_NOT_TENSORS = (*COEFFICIENTS, "fill_masked")


def operator_arguments(p: GaeProblem) -> tuple:
    """The arguments of ``gae`` (the operator) for a problem, in its schema's order."""
    arguments = {"bootstrap": p.bootstrap, "fill_masked": p.fill_masked, "offsets": p.offsets, "carry": p.carry,
                 "host_offsets": None}  # given to the CUDA kernels, which then need not read the offsets back
    if p.host_offsets is not None and p.rewards.device.type == "cuda" and not torch.compiler.is_compiling():
        arguments["host_offsets"] = torch.from_numpy(np.asarray(p.host_offsets, dtype=np.int64))
    for field in PER_STEP:
        value = getattr(p, field)
        if field in COEFFICIENTS:  # a float, or per-step values in its tensor
            steps = is_torch_array(value)
            arguments[field], arguments[f"{field}_steps"] = (None, value) if steps else (value, None)
        else:
            arguments[field] = value
    return tuple(arguments[name] for name in INPUTS)


def _problem(arguments: dict) -> GaeProblem:
    """The GaeProblem of an operator's inputs by name (host offsets read from CPU offsets when none are given)."""
    fields = {field: arguments[field] for field in PER_STEP if field not in COEFFICIENTS}
    for field in COEFFICIENTS:
        steps = arguments[f"{field}_steps"]
        fields[field] = arguments[field] if steps is None else steps
    offsets, host_offsets = arguments["offsets"], arguments["host_offsets"]
    if host_offsets is None and offsets is not None and offsets.device.type == "cpu":
        host_offsets = offsets
    if host_offsets is not None and is_fake(host_offsets):  # traced: the offsets' values are not known yet
        host_offsets = None
    if host_offsets is not None:  # the operator's own check: its callers' offsets may have been traced
        check_offset_values(host_offsets.numpy(), arguments["rewards"].shape[-1])
    return GaeProblem(xp=array_namespace(arguments["rewards"]), **fields, bootstrap=arguments["bootstrap"],
                      fill_masked=arguments["fill_masked"], offsets=offsets, carry=arguments["carry"],
                      host_offsets=None if host_offsets is None else host_offsets.numpy())


# --- the operators (see the module docstring, "How they are built") ---------------------------------------------


def _gae_body(*inputs):
    """(advantages, returns): the Triton kernels where ``_launches_triton``, else ``gae_kernels``."""
    arguments = dict(zip(INPUTS, inputs))
    if _launches_triton(arguments["rewards"]):
        from . import triton

        launched = _on_triton(arguments["rewards"], lambda: _solve(_problem(arguments), triton.BACKEND))
        if launched is not None:
            return launched
    return _opaque(gae_kernels, {"cpu": _gae_kernels_cpu, "cuda": _gae_kernels_cuda}, inputs, arguments["rewards"])


def _gae_backward_body(grad_advantages, grad_returns, *inputs):
    """The gradients (``DIFFERENTIABLE``): the Triton adjoint where ``_launches_triton``, else
    ``gae_backward_kernels``."""
    arguments = dict(zip(INPUTS, inputs))
    if _launches_triton(arguments["rewards"]):
        from . import triton

        def adjoint():
            problem = _problem(arguments)
            return _gradients(triton.BACKEND.gae_backward(problem, grad_advantages, grad_returns), problem)

        launched = _on_triton(arguments["rewards"], adjoint)
        if launched is not None:
            return launched
    return _opaque(gae_backward_kernels, {"cpu": _gae_backward_kernels_cpu, "cuda": _gae_backward_kernels_cuda},
                   (grad_advantages, grad_returns, *inputs), arguments["rewards"])


def _opaque(operator, implementations: dict, arguments: tuple, rewards: Tensor):
    """An opaque operator's answer from a body: the operator itself where the call is recorded (one node of the
    graph), else its implementation for the tensors' (``rewards``') device called directly (a dispatch less)."""
    if torch_is_recorded(rewards) or rewards.device.type not in implementations:
        return operator(*arguments)
    return implementations[rewards.device.type](*arguments)


def _launches_triton(rewards: Tensor) -> bool:
    """True when the operators' bodies launch the Triton kernels themselves: tensors on a device of
    ``_TRITON_DEVICES`` where triton is installed and its compiler has not failed in this process, except traced
    tensors under Triton's interpreter (the comment below says why)."""
    if rewards.device.type not in _TRITON_DEVICES or not _TRITON_INSTALLED or _fallback.broken("triton") is not None:
        return False
    from . import triton

    if not triton.interpreted():
        return True
    # Under TRITON_INTERPRET=1, wrap_triton hands the interpreted kernel back unwrapped (torch/_library/triton.py,
    # "TRITON_INTERPRET=1 makes @triton.jit return InterpretedFunction"), and the interpreter copies every tensor's
    # storage to the host (triton/runtime/interpreter.py, _init_args_hst): a fake tensor has none.
    return not torch_is_recorded(rewards)


def _on_triton(rewards: Tensor, work):
    """``work()``, or None where Triton's compiler fails on an eager call: the Triton route is then remembered as
    failed (``_fall_from_triton``) and the caller runs the opaque operator, on numba-CUDA's kernels. A traced call
    never fails here (its launches are recorded, compiled by Inductor later); any other error propagates."""
    try:
        return work()
    except Exception as error:
        if torch_is_recorded(rewards) or not _fallback.is_compiler_failure(error):
            raise
        _fall_from_triton(error)
        return None


def _gae_kernels_cpu(*inputs):
    return _solve(_problem(dict(zip(INPUTS, inputs))), numba_cpu.BACKEND)


def _gae_kernels_cuda(*inputs):
    problem = _problem(dict(zip(INPUTS, inputs)))
    return _on_cuda_kernels(lambda backend: _solve(problem, backend))


def _gae_fake(*inputs):
    rewards = inputs[0]
    return _empty(rewards.shape, rewards), _empty(rewards.shape, rewards)


def _gae_backward_kernels_cpu(grad_advantages, grad_returns, *inputs):
    from ._numba_backward import gae_backward as kernel

    problem = _problem(dict(zip(INPUTS, inputs)))
    return _gradients(kernel(problem, grad_advantages, grad_returns), problem)


def _gae_backward_kernels_cuda(grad_advantages, grad_returns, *inputs):
    """The adjoint on the GPU: the Triton kernels (``_triton_scan.gae_backward``) where triton imports, else the
    numba-CUDA ones."""
    problem = _problem(dict(zip(INPUTS, inputs)))
    return _on_cuda_kernels(lambda backend: _gradients(backend.gae_backward(problem, grad_advantages, grad_returns),
                                                       problem))


def _gae_backward_fake(grad_advantages, grad_returns, *inputs):
    arguments = dict(zip(INPUTS, inputs))
    rewards = arguments["rewards"]
    return tuple(_empty((0,) if arguments[name] is None else arguments[name].shape, rewards) for name in DIFFERENTIABLE)


def _signature(parameters: tuple[tuple[str, str], ...], returns: int) -> inspect.Signature:
    """The Python signature of a schema's inputs ((schema type, name) pairs) and ``returns`` tensors: what
    ``torch.library.triton_op`` infers the operator's schema from (it takes no schema string)."""
    annotations = {"Tensor": Tensor, "Tensor?": Tensor | None, "float?": float | None, "bool": bool}
    return inspect.Signature(
        [inspect.Parameter(name, inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=annotations[kind])
         for kind, name in parameters], return_annotation=tuple[(Tensor,) * returns])


def _operator(name: str, body, parameters: tuple[tuple[str, str], ...], returns: int):
    """The public operator ``name`` running ``body``: a ``torch.library.triton_op`` where triton is installed (its
    body is also its fake implementation, and under ``torch.compile`` it is traced into the graph: the Triton
    launches become graph nodes, the opaque operators stay nodes of their own), else a ``custom_op`` over the
    same body."""
    body.__signature__ = _signature(parameters, returns)
    if _TRITON_INSTALLED:
        operator = torch.library.triton_op(name, body, mutates_args=())
    else:
        operator = torch.library.custom_op(name, body, mutates_args=())
        operator.register_fake(body)
    for device in ("cpu", "cuda"):  # eager calls: the body without triton_op's wrapper (it launches no wrap_triton)
        operator.register_kernel(device, body)
    return operator


_INPUTS_SCHEMA = ", ".join(f"{kind} {name}" for kind, name in _SCHEMA)
_UPSTREAM = (("Tensor", "grad_advantages"), ("Tensor", "grad_returns"))
_GRADIENTS_SCHEMA = ", ".join("Tensor" for _ in DIFFERENTIABLE)
gae_kernels = torch.library.custom_op("gae_xp::gae_kernels", _gae_kernels_cpu, mutates_args=(), device_types="cpu",
                                      schema=f"({_INPUTS_SCHEMA}) -> (Tensor, Tensor)")
gae_kernels.__doc__ = "``gae`` on the numba (CPU) or numba-CUDA kernels, opaque to ``torch.compile``."
gae_backward_kernels = torch.library.custom_op(
    "gae_xp::gae_backward_kernels", _gae_backward_kernels_cpu, mutates_args=(), device_types="cpu",
    schema=f"(Tensor grad_advantages, Tensor grad_returns, {_INPUTS_SCHEMA}) -> ({_GRADIENTS_SCHEMA})")
gae_backward_kernels.__doc__ = "``gae_backward`` on the numba (CPU) or numba-CUDA kernels, opaque to ``torch.compile``."
gae_kernels.register_kernel("cuda", _gae_kernels_cuda)
gae_backward_kernels.register_kernel("cuda", _gae_backward_kernels_cuda)
gae_kernels.register_fake(_gae_fake)
gae_backward_kernels.register_fake(_gae_backward_fake)
gae = _operator("gae_xp::gae", _gae_body, _SCHEMA, 2)
gae.__doc__ = "(advantages, returns) of the problem made of ``INPUTS`` (see the module docstring)."
gae_backward = _operator("gae_xp::gae_backward", _gae_backward_body, (*_UPSTREAM, *_SCHEMA), len(DIFFERENTIABLE))
gae_backward.__doc__ = ("The gradients to ``DIFFERENTIABLE`` given those to (advantages, returns); an empty tensor "
                        "for an absent input.")


def _register_kernels() -> None:
    """Tell torch which Triton kernels the operators launch (``torch._library.triton.triton_ops_to_kernels``).

    torch's compile cache hashes the kernels' source from this registry
    (AOTAutograd's cache key: torch/_functorch/_aot_autograd/autograd_cache.py,
    ``get_triton_kernels_for_op``), so that a changed kernel is never served
    from an older compilation. ``triton_op`` fills it by reading its body's
    source for ``wrap_triton(name)``; these bodies reach the kernels through
    the backends, where it finds none."""
    from torch._library import triton as library

    from ._triton_gae import gae_kernel
    from ._triton_scan import _adjoint_rows

    library.triton_ops_to_kernels[gae._qualname] = [gae_kernel]
    library.triton_ops_to_kernels[gae_backward._qualname] = [_adjoint_rows]


if _TRITON_INSTALLED:
    _register_kernels()


def _checked_offsets(offsets: Tensor, length: int) -> Tensor:
    check_offset_values(torch_cpu_view(offsets), length)
    return offsets.clone()


checked_offsets = torch.library.custom_op("gae_xp::checked_offsets", _checked_offsets, mutates_args=(),
                                          device_types="cpu", schema="(Tensor offsets, SymInt length) -> Tensor")
checked_offsets.__doc__ = ("CPU offsets (int64) checked when the graph runs: ``gae_xp._prepare.check_offset_values``'s "
                           "ValueError naming cu_seqlens unless ``0 = o_0 <= ... <= o_n = length``; a copy.")
checked_offsets.register_fake(lambda offsets, length: torch.empty_like(offsets))


def _setup_context(ctx, inputs, output):
    _save(ctx, inputs, ctx.needs_input_grad)


def _save(ctx, inputs, needs_input_grad):
    """Keep the forward's inputs for the backward (the tensors saved, the numbers as they are)."""
    arguments = dict(zip(INPUTS, inputs))
    tensors = [name for name in INPUTS if name not in _NOT_TENSORS]
    ctx.save_for_backward(*(arguments[name] for name in tensors))
    ctx.tensor_names = tensors
    ctx.numbers = {name: arguments[name] for name in _NOT_TENSORS}
    ctx.needs = dict(zip(INPUTS, needs_input_grad))
    ctx.coefficients_need_grad = any(ctx.needs[name] for name in _COEFFICIENT_STEPS)


def _saved_arguments(ctx) -> dict:
    return {**dict(zip(ctx.tensor_names, ctx.saved_tensors)), **ctx.numbers}


def _backward(ctx, grad_advantages, grad_returns):
    if ctx.coefficients_need_grad:
        raise RuntimeError("gae_xp::gae computes no gradient to per-step gamma, lam or critic_lam: gae_xp.gae() "
                           "sends such calls to the generic path (or pass backend='xp')")
    arguments = _saved_arguments(ctx)
    gradients = dict(zip(DIFFERENTIABLE, gae_backward(grad_advantages, grad_returns,
                                                      *(arguments[name] for name in INPUTS))))
    return tuple(gradients[name] if name in gradients and ctx.needs[name] else None for name in INPUTS)


def _setup_backward_context(ctx, inputs, output):
    _save(ctx, inputs[2:], ctx.needs_input_grad[2:])


def _backward_of_backward(ctx, *upstream):
    # The backward is the transpose of a linear map; its own backward is the map, the forward operator.
    arguments = _saved_arguments(ctx)
    for name, gradient in zip(DIFFERENTIABLE, upstream):
        if arguments[name] is not None:
            arguments[name] = gradient
    grad_advantages, grad_returns = gae(*(arguments[name] for name in INPUTS))
    return (grad_advantages, grad_returns, *(None for _ in INPUTS))


gae.register_autograd(_backward, setup_context=_setup_context)
gae_backward.register_autograd(_backward_of_backward, setup_context=_setup_backward_context)


# --- shared by the implementations ------------------------------------------------------------------------------


def _solve(problem: GaeProblem, kernels) -> tuple[Tensor, Tensor]:
    return solve_gae(problem, kernels, None)


def _gradients(gradients: dict, problem: GaeProblem) -> tuple:
    """The backward operator's outputs from a kernel's dict: an empty tensor where an input is absent."""
    return tuple(_empty((0,), problem.rewards) if gradients.get(name) is None else gradients[name]
                 for name in DIFFERENTIABLE)


def _empty(shape, like: Tensor) -> Tensor:
    return torch.empty(tuple(shape), dtype=like.dtype, device=like.device)


def _cuda_backend():
    """The kernels of both operators on CUDA tensors: Triton's where triton imports and has not failed in this
    process, else numba-CUDA's."""
    if _TRITON_INSTALLED and _fallback.broken("triton") is None:
        from . import triton

        return triton.BACKEND
    from . import numba_cuda

    return numba_cuda.BACKEND


def _on_cuda_kernels(work):
    """``work(backend)`` on the CUDA kernels (``_cuda_backend``); where Triton's compiler fails, the work runs again
    on numba-CUDA's kernels (``_fall_from_triton``). Any other error, or a failure with no kernels left, propagates
    (``backends.run`` then falls back to the generic path)."""
    backend = _cuda_backend()
    try:
        return work(backend)
    except Exception as error:
        if backend.name != "triton" or not _fallback.is_compiler_failure(error):
            raise
        _fall_from_triton(error)
        return work(_cuda_backend())


def _fall_from_triton(error: BaseException) -> None:
    """After Triton's compiler failed with ``error``: the Triton route is remembered as failed (``backends.fail``:
    warned once per cause, numba-CUDA named as what serves instead); ``error`` is raised again where numba-CUDA
    cannot run either."""
    cause = fail("triton", error)
    if _cuda_reason() is not None:
        raise error
    _fallback.warn_once("triton", cause, "numba-cuda")


def _cuda_reason() -> str | None:
    """None when the Triton or the numba-CUDA backend can run both operators on this machine."""
    if _TRITON_INSTALLED and _fallback.broken("triton") is None:
        return None
    if _fallback.broken("numba-cuda") is not None:
        return _fallback.broken("numba-cuda")
    if importlib.util.find_spec("numba") is None or importlib.util.find_spec("numba.cuda") is None:
        return "numba-cuda is not installed (pip install 'gae_xp[cuda12]' or 'gae_xp[cuda13]')"
    from numba import cuda

    return None if cuda.is_available() else "numba-cuda finds no usable CUDA driver or GPU"
