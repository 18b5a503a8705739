"""The Triton scan, backward and estimators (``gae_xp.backends._triton_scan``) under Triton's interpreter.

``TRITON_INTERPRET=1`` (set by conftest before triton is imported) runs the
kernels on CPU torch tensors. Every function is checked against the float64
per-step loops of ``gae_xp.reference`` (packed sequences: the loop per
sequence), the backward against torch autograd of the generic path and by
``torch.autograd.gradcheck``. Blocks are made small (``small_blocks``) so that
short rows cross many blocks and the carries between them are exercised.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

os.environ.setdefault("TRITON_INTERPRET", "1")
torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from gae_xp import reference  # noqa: E402
from gae_xp._prepare import prepare  # noqa: E402
from gae_xp.backends import _triton_scan as kernels  # noqa: E402

if os.environ.get("TRITON_INTERPRET") != "1":
    pytest.skip("the kernels run on CPU tensors under TRITON_INTERPRET=1 only", allow_module_level=True)

TOLERANCE = {"rtol": 1e-10, "atol": 1e-10}


@pytest.fixture(autouse=True)
def small_blocks(monkeypatch):
    """Blocks of 16 steps (rows up to 16 steps in one block), so that a row of 40 steps takes three blocks."""
    monkeypatch.setattr(kernels, "SHORT_ROWS", 16)
    monkeypatch.setattr(kernels, "LONG_BLOCK", 16)


def data(seed: int, shape=(2, 40), *, holes: float = 0.3, dones: float = 0.1):
    """Random float64 inputs and flags (NumPy) for one case."""
    rng = np.random.default_rng(seed)
    return {"rewards": rng.normal(size=shape), "values": rng.normal(size=shape),
            "next_values": rng.normal(size=shape), "log_rhos": rng.normal(scale=0.5, size=shape),
            "terminated": rng.random(shape) < dones, "truncated": rng.random(shape) < dones,
            "mask": rng.random(shape) >= holes, "gamma": rng.uniform(0.5, 1.0, size=shape),
            "lam": rng.uniform(0.5, 1.0, size=shape), "bootstrap": rng.normal(size=shape[:-1])}


def tensors(arrays: dict) -> dict:
    return {name: torch.from_numpy(np.ascontiguousarray(a)) for name, a in arrays.items()}


def snapshot(arrays: dict) -> dict:
    return {name: a.clone() for name, a in arrays.items() if torch.is_tensor(a)}


def assert_unchanged(before: dict, after: dict) -> None:
    for name, a in before.items():
        assert torch.equal(a, after[name]), f"{name} was written"


def assert_owns(outputs, inputs: dict) -> None:
    for out in outputs:
        for name, a in inputs.items():
            if torch.is_tensor(a) and a.numel() and out.numel():
                assert not np.shares_memory(out.numpy(), a.numpy()), f"an output shares memory with {name}"


# --- scan ----------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("reverse", [True, False])
@pytest.mark.parametrize("coefficient", ["float", "steps", "rows", "zeros"])
@pytest.mark.parametrize("length", [1, 16, 50])
def test_scan_matches_the_loop(reverse, coefficient, length):
    rng = np.random.default_rng(length)
    x = rng.normal(size=(2, 3, length))
    a = {"float": 0.9, "steps": rng.uniform(-1, 1, size=x.shape), "rows": rng.uniform(0, 1, size=(2, 3, 1)),
         "zeros": np.where(rng.random(x.shape) < 0.3, 0.0, 0.8)}[coefficient]
    x[..., length // 2] = np.inf  # a zero coefficient cuts it exactly
    expected = reference.discounted_cumsum_loop(x, a, reverse=reverse)
    given_x, given_a = torch.from_numpy(x), a if isinstance(a, float) else torch.from_numpy(a)
    before = snapshot({"x": given_x, "a": given_a})
    y = kernels.scan(given_x, given_a, reverse=reverse)
    np.testing.assert_allclose(y.numpy(), expected, **TOLERANCE)
    assert_unchanged(before, {"x": given_x, "a": given_a})
    assert_owns([y], before)


def test_scan_in_float32_and_bfloat16_computes_in_float32():
    x = np.random.default_rng(0).normal(size=(4, 40))
    expected = reference.discounted_cumsum_loop(x, 0.95)
    single = kernels.scan(torch.from_numpy(x).float(), 0.95, reverse=True)
    assert single.dtype == torch.float32
    np.testing.assert_allclose(single.numpy(), expected, rtol=1e-5, atol=1e-5)
    brain = kernels.scan(torch.from_numpy(x).bfloat16(), 0.95, reverse=True)
    assert brain.dtype == torch.bfloat16
    widened = reference.discounted_cumsum_loop(torch.from_numpy(x).bfloat16().double().numpy(), 0.95)
    np.testing.assert_allclose(brain.double().numpy(), widened, rtol=1e-2, atol=2e-2)


def test_scan_reads_strided_views_in_place():
    x = np.random.default_rng(1).normal(size=(40, 6))
    view = torch.from_numpy(x).T  # time stride 6, row stride 1
    np.testing.assert_allclose(kernels.scan(view, 0.7, reverse=False).numpy(),
                               reference.discounted_cumsum_loop(x.T, 0.7, reverse=False), **TOLERANCE)


def sparse_floats(path, count: int):
    """``count`` float64 zeros in a sparse file (no memory is taken until written): views far apart, not copied."""
    with open(path, "wb") as file:
        file.truncate(count * 8)
    return torch.from_file(str(path), shared=True, size=count, dtype=torch.float64)


def test_scan_addresses_a_time_stride_past_2_to_the_31_in_64_bits(tmp_path):
    # two rows of five steps 2**29 apart: the last step is 2**31 elements past the first, which a 32-bit product of
    # step and time stride would wrap (to an address before the array)
    table = sparse_floats(tmp_path / "sparse.bin", 4 * 2**29 + 2)
    view = table.as_strided((2, 5), (1, 2**29))
    x = np.random.default_rng(3).normal(size=(2, 5))
    view.copy_(torch.from_numpy(x))
    np.testing.assert_allclose(kernels.scan(view, 0.7, reverse=True).numpy(),
                               reference.discounted_cumsum_loop(x, 0.7), **TOLERANCE)


def test_packed_bootstrap_values_2_to_the_29_apart_are_addressed_in_64_bits(tmp_path):
    # the bootstrap values of five packed sequences 2**29 apart (a view): the fifth is 2**31 elements past the first
    bootstrap = sparse_floats(tmp_path / "sparse.bin", 4 * 2**29 + 1).as_strided((5,), (2**29,))
    bootstrap.copy_(torch.tensor([1.0, 2.0, 3.0, 4.0, 5.0], dtype=torch.float64))
    call = prepare(torch.zeros(10, dtype=torch.float64), lam=1.0, gamma=1.0, needs_values=False, backend="xp",
                   cu_seqlens=[0, 2, 4, 6, 8, 10], bootstrap_value=bootstrap)
    out = call.restore(kernels.solve_discounted_returns(call.problem))
    assert out.tolist() == [1.0, 1.0, 2.0, 2.0, 3.0, 3.0, 4.0, 4.0, 5.0, 5.0]


# --- the estimators ------------------------------------------------------------------------------------------------

#: Options of the estimators: which of the random inputs a case passes.
OPTIONS = [(), ("terminated",), ("truncated",), ("mask",), ("gamma",), ("lam",), ("bootstrap",),
           ("terminated", "truncated", "mask", "gamma", "lam", "bootstrap")]


def chosen(arrays: dict, options) -> dict:
    """The keyword arguments of a case: the options' arrays, the rest left at their defaults."""
    names = {"bootstrap": "bootstrap_value"}
    return {names.get(name, name): arrays[name] for name in options}


@pytest.mark.parametrize("options", OPTIONS)
def test_discounted_returns(options):
    arrays = data(2)
    kwargs = chosen(arrays, [o for o in options if o != "lam"])
    expected = reference.discounted_returns_loop(arrays["rewards"], **kwargs)
    given = tensors({"rewards": arrays["rewards"], **kwargs})
    before = snapshot(given)
    call = prepare(given.pop("rewards"), **given, lam=1.0, needs_values=False, backend="xp")
    out = call.restore(kernels.solve_discounted_returns(call.problem))
    np.testing.assert_allclose(out.numpy(), expected, **TOLERANCE)
    assert_unchanged(before, {**given, "rewards": call.problem.rewards})
    assert_owns([out], before)


@pytest.mark.parametrize("options", OPTIONS)
def test_lambda_returns(options):
    arrays = data(3)
    kwargs = chosen(arrays, [o for o in options if o != "bootstrap"])
    expected = reference.lambda_returns_loop(arrays["rewards"], arrays["next_values"], **kwargs)
    given = tensors(kwargs)
    call = prepare(torch.from_numpy(arrays["rewards"]), **given, needs_values=False, backend="xp",
                   extra={"next_values": torch.from_numpy(arrays["next_values"])})
    out = call.restore(kernels.solve_lambda_returns(call.problem))
    np.testing.assert_allclose(out.numpy(), expected, **TOLERANCE)


@pytest.mark.parametrize("options", [*OPTIONS, ("next_values", "truncated", "mask", "terminated")])
@pytest.mark.parametrize("clips", [(1.0, 1.0, 1.0), (0.5, 2.0, 0.8)])
def test_vtrace(options, clips):
    arrays = data(4)
    kwargs = chosen(arrays, options)
    if "truncated" in options and "next_values" not in options:
        kwargs["truncated_bootstrap"] = "next_step"
    thresholds = dict(zip(("clip_rho_threshold", "clip_c_threshold", "clip_pg_rho_threshold"), clips))
    expected = reference.vtrace_loop(arrays["log_rhos"], arrays["rewards"], arrays["values"], **kwargs, **thresholds)
    given = {"lam": 1.0, **tensors({k: v for k, v in kwargs.items() if k != "truncated_bootstrap"})}  # its lam
    call = prepare(torch.from_numpy(arrays["rewards"]), torch.from_numpy(arrays["values"]), **given, backend="xp",
                   truncated_bootstrap=kwargs.get("truncated_bootstrap", "next_values"),
                   extra={"log_rhos": torch.from_numpy(arrays["log_rhos"])})
    vs, pg = kernels.solve_vtrace(call.problem, **thresholds)
    np.testing.assert_allclose(call.restore(vs).numpy(), expected[0], **TOLERANCE)
    np.testing.assert_allclose(call.restore(pg).numpy(), expected[1], **TOLERANCE)


def packed(arrays: dict, offsets) -> dict:
    """The sequences of ``offsets`` out of row 0 of each array, as 1-D arrays."""
    return [{name: a[0, start:stop] for name, a in arrays.items() if name != "bootstrap"}
            for start, stop in zip(offsets[:-1], offsets[1:])]


@pytest.mark.parametrize("estimator", ["returns", "lambda"])
def test_packed_sequences_match_the_loop_per_sequence(estimator):
    arrays = data(5, shape=(1, 45))
    offsets = [0, 7, 7, 30, 31, 45]  # an empty sequence and one of one step
    bootstrap = np.random.default_rng(6).normal(size=(1, len(offsets) - 1))
    names = ("terminated", "mask", "gamma")
    expected = []
    for index, piece in enumerate(packed(arrays, offsets)):
        kwargs = {name: piece[name] for name in names}
        if estimator == "returns":
            expected.append(reference.discounted_returns_loop(piece["rewards"], bootstrap_value=bootstrap[0, index],
                                                              **kwargs))
        else:
            expected.append(reference.lambda_returns_loop(piece["rewards"], piece["next_values"], **kwargs))
    given = tensors({name: arrays[name] for name in names})
    rewards = torch.from_numpy(arrays["rewards"])
    if estimator == "returns":
        call = prepare(rewards, **given, lam=1.0, needs_values=False, backend="xp", cu_seqlens=offsets,
                       bootstrap_value=torch.from_numpy(bootstrap))
        out = kernels.solve_discounted_returns(call.problem)
    else:
        call = prepare(rewards, **given, needs_values=False, backend="xp", cu_seqlens=offsets,
                       extra={"next_values": torch.from_numpy(arrays["next_values"])})
        out = kernels.solve_lambda_returns(call.problem)
    np.testing.assert_allclose(call.restore(out).numpy()[0], np.concatenate(expected), **TOLERANCE)


def test_unread_device_offsets_that_break_the_contract_give_nan():
    arrays = data(7, shape=(1, 20))
    call = prepare(torch.from_numpy(arrays["rewards"]), lam=1.0, needs_values=False, backend="xp",
                   cu_seqlens=[0, 5, 20])
    bad = call.problem.replace(offsets=torch.tensor([0, 25, 20]), host_offsets=None)
    assert torch.isnan(kernels.solve_discounted_returns(bad)).all()
    good = call.problem.replace(host_offsets=None)
    assert torch.isfinite(kernels.solve_discounted_returns(good)).all()


# --- the backward --------------------------------------------------------------------------------------------------

#: Options of gae(): which random inputs a case passes, and gae()'s own options.
GAE_OPTIONS = [(), ("terminated",), ("truncated", "next_values"), ("mask",), ("gamma", "lam"), ("bootstrap",),
               ("mask", "fill_masked"), ("critic_lam",), ("terminated", "truncated", "mask", "gamma", "lam",
                                                          "bootstrap", "critic_lam")]


def gae_kwargs(arrays: dict, options) -> dict:
    kwargs = chosen(arrays, [o for o in options if o not in ("fill_masked", "critic_lam")])
    if "fill_masked" in options:
        kwargs["fill_masked"] = True
    if "critic_lam" in options:
        kwargs["critic_lam"] = 0.7
    if "truncated" in options and "next_values" not in options:
        kwargs["truncated_bootstrap"] = "next_step"
    return kwargs


def generic_gradients(arrays: dict, kwargs: dict, upstream) -> dict:
    """Autograd's gradients of the generic path's gae() to rewards, values, next_values and the bootstrap value."""
    import gae_xp

    leaves = {name: torch.from_numpy(arrays[name]).requires_grad_() for name in ("rewards", "values")}
    given = dict(tensors({k: v for k, v in kwargs.items() if isinstance(v, np.ndarray)}),
                 **{k: v for k, v in kwargs.items() if not isinstance(v, np.ndarray)})
    for name in ("next_values", "bootstrap_value"):
        if name in given:
            leaves[name] = given[name] = given[name].clone().requires_grad_()
    advantages, returns = gae_xp.gae(leaves["rewards"], leaves["values"], **given, backend="xp")
    total = (advantages * upstream[0]).sum() + (returns * upstream[1]).sum()
    return dict(zip(leaves, torch.autograd.grad(total, list(leaves.values()))))


@pytest.mark.parametrize("options", GAE_OPTIONS)
def test_backward_matches_autograd_of_the_generic_path(options):
    arrays = data(8)
    kwargs = gae_kwargs(arrays, options)
    rng = np.random.default_rng(9)
    upstream = [torch.from_numpy(rng.normal(size=arrays["rewards"].shape)) for _ in range(2)]
    expected = generic_gradients(arrays, kwargs, upstream)
    given = tensors({k: v for k, v in kwargs.items() if isinstance(v, np.ndarray)})
    call = prepare(torch.from_numpy(arrays["rewards"]), torch.from_numpy(arrays["values"]), **given,
                   **{k: v for k, v in kwargs.items() if not isinstance(v, np.ndarray)}, backend="xp")
    before = snapshot({**given, "a": upstream[0], "r": upstream[1]})
    grads = kernels.gae_backward(call.problem, *upstream)
    for name, gradient in expected.items():
        key = "bootstrap" if name == "bootstrap_value" else name
        np.testing.assert_allclose(grads[key].reshape(gradient.shape).numpy(), gradient.numpy(), **TOLERANCE,
                                   err_msg=name)
    assert (grads["next_values"] is None) == ("next_values" not in kwargs)
    assert_unchanged(before, {**given, "a": upstream[0], "r": upstream[1]})
    assert_owns([g for g in grads.values() if g is not None], before)


@pytest.mark.parametrize("upstream", ["advantages", "returns"])
def test_backward_takes_one_upstream_gradient(upstream):
    arrays = data(10)
    call = prepare(torch.from_numpy(arrays["rewards"]), torch.from_numpy(arrays["values"]),
                   mask=torch.from_numpy(arrays["mask"]), backend="xp")
    gradient = torch.from_numpy(np.random.default_rng(11).normal(size=arrays["rewards"].shape))
    one = kernels.gae_backward(call.problem, *((gradient, None) if upstream == "advantages" else (None, gradient)))
    zero = torch.zeros_like(gradient)
    both = kernels.gae_backward(call.problem, *((gradient, zero) if upstream == "advantages" else (zero, gradient)))
    for name in ("rewards", "values", "bootstrap"):
        np.testing.assert_allclose(one[name].numpy(), both[name].numpy(), **TOLERANCE)


def numba_gradients(problem, upstream) -> dict:
    backward = pytest.importorskip("gae_xp.backends._numba_backward")
    return backward.gae_backward(problem, *upstream)


@pytest.mark.parametrize("fill", [False, True])
def test_backward_with_packed_sequences_and_a_carry_matches_the_cpu_adjoint(fill):
    """Segments, an incoming carry and fill_masked, against the numba CPU adjoint (itself checked against
    autograd in tests/test_autograd.py)."""
    arrays = data(12, shape=(2, 45))
    offsets = [0, 7, 7, 30, 31, 45]
    rng = np.random.default_rng(13)
    call = prepare(torch.from_numpy(arrays["rewards"]), torch.from_numpy(arrays["values"]),
                   **tensors({name: arrays[name] for name in ("terminated", "mask", "gamma")}), cu_seqlens=offsets,
                   bootstrap_value=torch.from_numpy(rng.normal(size=(2, 5))), fill_masked=fill, backend="xp")
    problem = call.problem.replace(carry=torch.from_numpy(rng.normal(size=(2, 5))))
    upstream = [torch.from_numpy(rng.normal(size=(2, 45))) for _ in range(2)]
    expected = numba_gradients(problem, upstream)
    grads = kernels.gae_backward(problem, *upstream)
    for name in ("rewards", "values", "bootstrap", "carry"):
        np.testing.assert_allclose(grads[name].numpy(), np.asarray(expected[name]), **TOLERANCE, err_msg=name)


class _Adjoint(torch.autograd.Function):
    """The generic path's gae() forward, this module's backward: what gradcheck compares with finite differences."""

    @staticmethod
    def forward(ctx, rewards, values, bootstrap, problem):
        from gae_xp.backends import xp as generic

        ctx.problem = problem.replace(rewards=rewards, values=values, bootstrap=bootstrap)
        return generic.BACKEND.gae(ctx.problem, chunk_size=None)

    @staticmethod
    def backward(ctx, grad_advantages, grad_returns):
        grads = kernels.gae_backward(ctx.problem, grad_advantages, grad_returns)
        return grads["rewards"], grads["values"], grads["bootstrap"], None


@pytest.mark.parametrize("options", [(), ("terminated", "mask", "gamma"), ("truncated", "mask", "critic_lam")])
def test_gradcheck(options):
    arrays = data(14, shape=(1, 7))
    kwargs = gae_kwargs(arrays, [o for o in options if o != "truncated"])
    if "truncated" in options:
        kwargs["truncated"] = arrays["truncated"]
        kwargs["truncated_bootstrap"] = "next_step"
    call = prepare(torch.from_numpy(arrays["rewards"]), torch.from_numpy(arrays["values"]),
                   **{k: torch.from_numpy(v) if isinstance(v, np.ndarray) else v for k, v in kwargs.items()},
                   backend="xp")
    p = call.problem
    inputs = [a.clone().requires_grad_() for a in (p.rewards, p.values, p.bootstrap)]
    assert torch.autograd.gradcheck(lambda r, v, b: _Adjoint.apply(r, v, b, p), inputs)


# --- properties ----------------------------------------------------------------------------------------------------


@settings(max_examples=8, deadline=None)
@given(length=st.integers(1, 40), rows=st.integers(1, 3), holes=st.sampled_from([0.0, 0.5, 0.9]),
       dones=st.sampled_from([0.0, 0.2]), seed=st.integers(0, 2**16))
def test_property_backward_and_returns_match_their_references(length, rows, holes, dones, seed):
    kernels.SHORT_ROWS, kernels.LONG_BLOCK = 16, 16  # hypothesis runs outside the function-scoped fixture
    arrays = data(seed, shape=(rows, length), holes=holes, dones=dones)
    names = ("terminated", "truncated", "mask", "gamma")
    given = tensors({name: arrays[name] for name in names})
    call = prepare(torch.from_numpy(arrays["rewards"]), torch.from_numpy(arrays["values"]), **given,
                   bootstrap_value=torch.from_numpy(arrays["bootstrap"]), backend="xp", truncated_bootstrap="next_step")
    upstream = [torch.from_numpy(np.random.default_rng(seed + 1).normal(size=(rows, length))) for _ in range(2)]
    expected = numba_gradients(call.problem, upstream)
    grads = kernels.gae_backward(call.problem, *upstream)
    for name in ("rewards", "values", "bootstrap"):
        np.testing.assert_allclose(grads[name].numpy(), np.asarray(expected[name]), **TOLERANCE, err_msg=name)
    returns = reference.discounted_returns_loop(arrays["rewards"], **{n: arrays[n] for n in names},
                                                bootstrap_value=arrays["bootstrap"])
    solved = prepare(torch.from_numpy(arrays["rewards"]), **given, lam=1.0, needs_values=False, backend="xp",
                     bootstrap_value=torch.from_numpy(arrays["bootstrap"]))
    np.testing.assert_allclose(kernels.solve_discounted_returns(solved.problem).numpy(), returns, **TOLERANCE)


# --- the custom operator's backward ------------------------------------------------------------------------------


@pytest.mark.parametrize("options", [("mask", "terminated", "critic_lam"), ("next_values", "truncated", "gamma")])
def test_the_operators_cuda_backward_runs_the_triton_adjoint(options):
    """The opaque ``gae_xp::gae_backward_kernels``'s CUDA implementation takes the Triton kernels where triton
    imports: run here on CPU tensors under the interpreter, against the operator's CPU implementation (numba)."""
    torch_ops = pytest.importorskip("gae_xp.backends.torch_ops")
    assert torch_ops._TRITON_INSTALLED
    arrays = data(15)
    kwargs = gae_kwargs(arrays, options)
    call = prepare(torch.from_numpy(arrays["rewards"]), torch.from_numpy(arrays["values"]),
                   **{k: torch.from_numpy(v) if isinstance(v, np.ndarray) else v for k, v in kwargs.items()},
                   backend="xp")
    arguments = torch_ops.operator_arguments(call.problem)
    upstream = [torch.from_numpy(np.random.default_rng(16).normal(size=arrays["rewards"].shape)) for _ in range(2)]
    triton_grads = torch_ops._gae_backward_kernels_cuda(*upstream, *arguments)
    numba_grads = torch_ops._gae_backward_kernels_cpu(*upstream, *arguments)
    for name, on_triton, on_numba in zip(torch_ops.DIFFERENTIABLE, triton_grads, numba_grads):
        np.testing.assert_allclose(on_triton.numpy(), on_numba.numpy(), **TOLERANCE, err_msg=name)


# --- compilation ---------------------------------------------------------------------------------------------------


class _Recorder:
    """Stands in for a kernel: records the specialisation key Triton's launcher would compute for each launch."""

    def __init__(self, kernel):
        self.kernel, self.keys = kernel, []

    def __getitem__(self, grid):
        return self.launch

    def launch(self, *args, num_warps, **constexprs):
        from triton.backends.compiler import BaseBackend
        from triton.runtime.jit import native_specialize_impl

        skip = set(getattr(self.kernel, "do_not_specialize", ()))
        names = [name for name in self.kernel.arg_names if name not in constexprs]
        key = [native_specialize_impl(BaseBackend, arg, False, name not in skip and self.kernel.arg_names.index(name)
                                      not in skip, True) for name, arg in zip(names, args)]
        self.keys.append((tuple(key), tuple(sorted(constexprs.items())), num_warps))


@pytest.mark.parametrize("kernel, run", [
    ("_scan_rows", lambda p: kernels.scan(p.rewards, 0.9, reverse=True)),
    ("_reverse_rows", kernels.solve_discounted_returns),
    ("_adjoint_rows", lambda p: kernels.gae_backward(p, p.rewards, None))])
def test_a_new_length_compiles_nothing_new(monkeypatch, kernel, run):
    """Launches at T = 37, 45, 1000, 1500 (rows of more than one block), and at T = 1024, 2048 (T a multiple of
    16: Triton's aligned variant), have one specialisation key per class: the block count is a run-time value."""
    recorder = _Recorder(getattr(kernels, kernel))
    monkeypatch.setattr(kernels, kernel, recorder)
    monkeypatch.setattr(kernels, "SHORT_ROWS", 16)
    keys = {}
    for length in (37, 45, 1000, 1500, 1024, 2048):
        call = prepare(torch.zeros((2, length), dtype=torch.float32), torch.zeros((2, length), dtype=torch.float32),
                       terminated=torch.zeros((2, length), dtype=torch.bool), backend="xp")
        run(call.problem)
        keys[length] = recorder.keys[-1]
    assert keys[37] == keys[45] == keys[1000] == keys[1500]
    assert keys[1024] == keys[2048]


# ------------------------------------------------------------------------------------------- negated lazily


@pytest.mark.parametrize("estimator", ["discounted_cumsum", "discounted_returns", "lambda_returns", "vtrace",
                                       "backward"])
def test_tensors_kept_negated_lazily_are_read_as_their_values(estimator):
    """torch's negative bit (``torch._neg_view``) leaves the memory holding the values' negatives: every route of
    the backend resolves it before its kernels read memory by pointer (as its gae() does)."""
    import gae_xp
    from gae_xp.backends import load

    arrays = tensors(data(21, (2, 37)))
    negated = {name: torch._neg_view(-a) if a.is_floating_point() else a for name, a in arrays.items()}
    assert all(negated[name].is_neg() for name in ("rewards", "values", "log_rhos", "gamma"))

    def run(given, backend):
        if estimator == "discounted_cumsum":
            return gae_xp.discounted_cumsum(given["rewards"], given["gamma"] * 0.9, backend=backend)
        if estimator == "discounted_returns":
            return gae_xp.discounted_returns(given["rewards"], gamma=given["gamma"], terminated=given["terminated"],
                                             backend=backend)
        if estimator == "lambda_returns":
            return gae_xp.lambda_returns(given["rewards"], given["values"], gamma=given["gamma"], lam=given["lam"],
                                         terminated=given["terminated"], backend=backend)
        if estimator == "vtrace":
            return gae_xp.vtrace(given["log_rhos"], given["rewards"], given["values"], gamma=given["gamma"],
                                 backend=backend)
        problem = prepare(rewards=arrays["rewards"], values=arrays["values"], gamma=0.9, lam=0.8,
                          backend="triton").problem
        if given is negated:
            problem = problem.map_steps(lambda name, a: torch._neg_view(-a))
        gradients = load("triton").gae_backward(problem, given["next_values"], given["values"])
        return gradients["rewards"], gradients["values"]

    expected, got = run(arrays, "xp"), run(negated, "triton")
    for e, g in zip(*(out if isinstance(out, tuple) else (out,) for out in (expected, got)), strict=True):
        torch.testing.assert_close(g, e, **TOLERANCE)
