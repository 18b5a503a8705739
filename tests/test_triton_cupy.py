"""CuPy arrays on the Triton route (``gae_xp.backends._triton_cupy``), proven on a CPU with a NumPy stand-in.

CuPy needs a GPU. The route's own logic (which arrays it takes, torch views
of the caller's memory through DLPack, a copy only for negative strides, the
results handed back in the caller's library, packed offsets on the device)
does not: here NumPy arrays stand in for CuPy's (``CALLER`` replaced), torch
CPU views of them go through Triton's interpreter, and every result is
checked against the float64 per-step loops of ``gae_xp.reference``. What only
a GPU shows (CuPy's current stream, DLPack on the device) is checked by
``tests/gpu/test_triton_cuda.py`` in the GPU check.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import threading

import numpy as np
import pytest
from helpers import gae_cases, xp_assert_close
from hypothesis import given, settings
from hypothesis import strategies as st
from tritoninterp import Compiled, require_interpreter, small_blocks_in_force, stand_in_compiled_kernels, while_alive

from gae_xp import reference
from gae_xp.testing import make_case, option_grid

torch = require_interpreter()

import gae_xp  # noqa: E402
from gae_xp import _plans  # noqa: E402
from gae_xp._prepare import prepare  # noqa: E402
from gae_xp.backends import _triton_cupy, _triton_launch  # noqa: E402
from gae_xp.backends import triton as triton_backend  # noqa: E402

TOLERANCE = {"rtol": 1e-10, "atol": 1e-10}


class Managed(np.ndarray):
    """A NumPy array standing for a CuPy array in managed memory."""


class Stream:
    """CuPy's current stream as a plan reads it: its address and whether it is being captured."""

    def __init__(self, ptr: int, capturing: bool = False):
        self.ptr, self.capturing = ptr, capturing

    def is_capturing(self) -> bool:
        return self.capturing


class NumPyCaller(_triton_cupy.CuPy):
    """NumPy in CuPy's place: its arrays (``Managed`` ones in managed memory), its current stream per device
    (``streams``), whose torch context the exchange of arrays must happen inside (``entered``; ``exchanged``
    counts the arrays passed to torch), NumPy's DLPack import; for a plan's launches on addresses, an array's
    address (``tritoninterp.Compiled.addresses`` reads it back as a tensor, and fails where the array was freed
    before the launch), NumPy's allocation and a current device (``device``; ``switched``: the devices a call made
    current)."""

    entered = 0
    exchanged = 0
    device = 0
    switched: list = []
    streams: dict = {}
    is_array = staticmethod(lambda a: isinstance(a, np.ndarray))
    from_dlpack = staticmethod(np.from_dlpack)
    contiguous = staticmethod(np.ascontiguousarray)
    in_device_memory = staticmethod(lambda a: not isinstance(a, Managed))
    empty = staticmethod(np.empty)
    full = staticmethod(lambda value, dtype: np.full((1,), value, dtype))
    device_index = staticmethod(lambda array: 0)
    current_device = staticmethod(lambda: NumPyCaller.device)
    current_stream = staticmethod(lambda: NumPyCaller.streams[NumPyCaller.device])

    @staticmethod
    def pointer(array) -> int:
        Compiled.addresses[array.ctypes.data] = while_alive(array)
        return array.ctypes.data

    @staticmethod
    @contextlib.contextmanager
    def on_device(index: int):
        NumPyCaller.switched.append(index)
        before, NumPyCaller.device = NumPyCaller.device, index
        try:
            yield
        finally:
            NumPyCaller.device = before

    stream_of = staticmethod(lambda array: NumPyCaller.streams[0])

    @staticmethod
    @contextlib.contextmanager
    def torch_stream(stream, array):
        NumPyCaller.entered += 1
        try:
            yield
        finally:
            NumPyCaller.entered -= 1

    @classmethod
    def to_torch(cls, array):
        assert cls.entered == 1, "an array passed to torch outside the caller's stream"
        NumPyCaller.exchanged += 1
        return super().to_torch(array)

    @classmethod
    def from_torch(cls, tensor):
        assert cls.entered == 1, "a result passed back outside the caller's stream"
        return super().from_torch(tensor)


@pytest.fixture(autouse=True)
def numpy_for_cupy(monkeypatch):
    monkeypatch.setattr(_triton_cupy, "CALLER", NumPyCaller)
    for name, value in (("exchanged", 0), ("device", 0), ("switched", []),
                        ("streams", {0: Stream(0x5000), 1: Stream(0x5100)})):
        monkeypatch.setattr(NumPyCaller, name, value)
    monkeypatch.setattr(Compiled, "addresses", {})
    _plans.PLANS.clear()
    yield
    _plans.PLANS.clear()


@pytest.fixture
def launched(monkeypatch):
    """The problems that reach the GAE kernels' launch."""
    seen = []
    solve = _triton_launch.solve

    def recording(problem, settings):
        seen.append(problem)
        return solve(problem, settings)

    monkeypatch.setattr(_triton_launch, "solve", recording)
    return seen


def assert_own_memory(outputs, inputs):
    for out in outputs:
        assert type(out) is np.ndarray
        for array in inputs:
            assert not np.shares_memory(out, array)


@pytest.mark.parametrize("name", ["plain", "dones+next_values", "holes+fill", "coefficients", "critic_lam",
                                  "everything"])
def test_gae_equals_the_loop_and_reads_the_callers_memory(name, launched):
    case = make_case(np.random.default_rng(4), (3, 50), **option_grid(dones=0.2)[name])
    before = {key: value.copy() for key, value in case.items() if isinstance(value, np.ndarray)}
    advantages, returns = gae_xp.gae(**case, backend="triton")
    want = reference.gae_loop(**case)
    np.testing.assert_allclose(advantages, want[0], **TOLERANCE)
    np.testing.assert_allclose(returns, want[1], **TOLERANCE)
    assert_own_memory([advantages, returns], [v for v in case.values() if isinstance(v, np.ndarray)])
    for key, value in before.items():
        np.testing.assert_array_equal(case[key], value)
    (problem,) = launched
    assert torch.is_tensor(problem.rewards)
    assert problem.rewards.data_ptr() == case["rewards"].ctypes.data  # a view of the caller's array, not a copy


def test_packed_sequences_with_offsets_on_the_device():
    rng = np.random.default_rng(5)
    rewards, values = rng.normal(size=(2, 30)), rng.normal(size=(2, 30))
    offsets = np.array([0, 7, 7, 19, 30])
    bootstrap = rng.normal(size=(2, 4))
    advantages, returns = gae_xp.gae(rewards, values, bootstrap_value=bootstrap, cu_seqlens=offsets,
                                     gamma=0.9, lam=0.8, backend="triton")
    for k, (start, end) in enumerate(zip(offsets[:-1], offsets[1:])):
        want = reference.gae_loop(rewards[:, start:end], values[:, start:end], bootstrap_value=bootstrap[:, k],
                                  gamma=0.9, lam=0.8)
        np.testing.assert_allclose(advantages[:, start:end], want[0], **TOLERANCE)
        np.testing.assert_allclose(returns[:, start:end], want[1], **TOLERANCE)


def test_an_array_with_negative_strides_is_copied_for_torch(launched):
    case = make_case(np.random.default_rng(6), (2, 40), **option_grid()["dones"])
    reversed_rewards = case["rewards"][:, ::-1]
    advantages, _ = gae_xp.gae(reversed_rewards, case["values"], terminated=case["terminated"], backend="triton")
    np.testing.assert_allclose(advantages, reference.gae_loop(np.ascontiguousarray(reversed_rewards), case["values"],
                                                              terminated=case["terminated"])[0], **TOLERANCE)
    (problem,) = launched
    assert problem.rewards.stride()[-1] == 1 and problem.values.data_ptr() == case["values"].ctypes.data


@pytest.mark.parametrize("reverse", [True, False])
def test_discounted_cumsum(reverse):
    x = np.random.default_rng(7).normal(size=(3, 45))
    gamma = np.random.default_rng(8).uniform(0.5, 1.0, size=(3, 45))
    got = gae_xp.discounted_cumsum(x, gamma, reverse=reverse, backend="triton")
    assert type(got) is np.ndarray and not np.shares_memory(got, x)
    np.testing.assert_allclose(got, reference.discounted_cumsum_loop(x, gamma, reverse=reverse), **TOLERANCE)


def test_the_estimators():
    rng = np.random.default_rng(9)
    rewards, values, following = (rng.normal(size=(2, 33)) for _ in range(3))
    log_rhos = rng.normal(scale=0.5, size=(2, 33))
    terminated = rng.random((2, 33)) < 0.1
    np.testing.assert_allclose(gae_xp.discounted_returns(rewards, terminated=terminated, backend="triton"),
                               reference.discounted_returns_loop(rewards, terminated=terminated), **TOLERANCE)
    np.testing.assert_allclose(gae_xp.lambda_returns(rewards, following, terminated=terminated, backend="triton"),
                               reference.lambda_returns_loop(rewards, following, terminated=terminated), **TOLERANCE)
    got = gae_xp.vtrace(log_rhos, rewards, values, terminated=terminated, backend="triton")
    want = reference.vtrace_loop(log_rhos, rewards, values, terminated=terminated)
    for g, w in zip(got, want):
        assert type(g) is np.ndarray
        np.testing.assert_allclose(g, w, **TOLERANCE)


def test_auto_imports_no_torch_for_cupy_arrays():
    # a process without torch imported: auto leaves CuPy arrays to the numba-CUDA route rather than import torch;
    # backend="triton" (forced) takes them, importing torch
    script = """
import sys
import numpy as np
from gae_xp.backends import _triton_cupy, triton
_triton_cupy.CALLER = type("NumPyCaller", (_triton_cupy.CuPy,), {
    "is_array": staticmethod(lambda a: isinstance(a, np.ndarray)), "in_device_memory": staticmethod(lambda a: True)})
print(triton.BACKEND.unavailable_reason(None, [np.zeros(3)], forced=False))
print("torch" in sys.modules)
triton.BACKEND.unavailable_reason(None, [np.zeros(3)], forced=True)
print("torch" in sys.modules)
"""
    env = {key: value for key, value in os.environ.items() if key != "TRITON_INTERPRET"}
    lines = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True,
                           env=env).stdout.splitlines()
    assert "'auto' takes that route where torch is imported already" in lines[0]
    assert lines[1:] == ["False", "True"]


def test_cupy_itself_is_refused_under_the_interpreter(monkeypatch):
    monkeypatch.setattr(_triton_cupy, "CALLER", _triton_cupy.CuPy)
    monkeypatch.setattr(_triton_cupy.CuPy, "is_array", staticmethod(lambda a: isinstance(a, np.ndarray)))
    with pytest.raises(ValueError, match="TRITON_INTERPRET=1 the kernels take torch CPU tensors, not CuPy"):
        gae_xp.gae(np.zeros((1, 4)), np.zeros((1, 4)), backend="triton")


def test_managed_memory_is_refused_and_named():
    rewards, values = np.zeros((1, 4)), np.zeros((1, 4))
    with pytest.raises(ValueError, match="CuPy arrays in device memory"):
        gae_xp.gae(rewards, values.view(Managed), backend="triton")
    with NumPyCaller.on_stream(rewards), pytest.raises(TypeError, match="backend='numba-cuda' takes these arrays"):
        NumPyCaller.to_torch(values.view(Managed))


def test_a_piece_with_an_incoming_carry():
    # a problem with a carry per row (a rank's shard, a Dask block): the carry too is read through torch
    rng = np.random.default_rng(10)
    rewards, values, carry, bootstrap = (rng.normal(size=shape) for shape in ((2, 30), (2, 30), (2, 1), (2, 1)))
    call = prepare(rewards, values, gamma=0.9, lam=0.8, bootstrap_value=bootstrap[:, 0], backend="triton")
    problem = call.problem.replace(carry=carry)
    advantages, returns = triton_backend.BACKEND.gae(problem)
    want, following = np.zeros((2, 30)), carry[:, 0]
    for t in reversed(range(30)):  # the per-step loop, entered by the carry after the last step
        after = values[:, t + 1] if t + 1 < 30 else bootstrap[:, 0]
        following = rewards[:, t] + 0.9 * after - values[:, t] + 0.9 * 0.8 * following
        want[:, t] = following
    assert type(advantages) is np.ndarray and type(returns) is np.ndarray
    np.testing.assert_allclose(advantages, want, **TOLERANCE)
    np.testing.assert_allclose(returns, want + values, **TOLERANCE)


@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")  # the interpreter's NumPy on NaN
@settings(max_examples=12, deadline=None)
@given(drawn=gae_cases(), layout=st.sampled_from(["as given", "reversed", "strided"]))
def test_any_case_and_layout_through_torch_views(drawn, layout):
    # the property tests' cases (any batch rank, time axis, options, poison, float64 or float32), the arrays shaped
    # like the rewards held reversed in time (negative strides: copied) or strided (read in place)
    case, options, dtype = drawn
    axis = options["axis"]
    want_a, want_r = reference.gae_loop(**case, axis=axis)
    arrays = {}
    for name, value in case.items():
        if isinstance(value, np.ndarray) and value.dtype == np.float64:
            value = value.astype(dtype)
        if isinstance(value, np.ndarray) and value.shape == case["rewards"].shape:
            if layout == "reversed":  # the same values, held back to front: a view with a negative stride
                value = np.flip(np.flip(value, axis).copy(), axis)
            elif layout == "strided":  # every other element of an array twice as long in time: a view
                every_other = [slice(None)] * value.ndim
                every_other[axis] = slice(None, None, 2)
                value = np.repeat(value, 2, axis=axis)[tuple(every_other)]
        arrays[name] = value
    advantages, returns = gae_xp.gae(**arrays, **options, backend="triton")
    assert type(advantages) is np.ndarray and type(returns) is np.ndarray
    xp_assert_close(advantages, want_a, like=arrays["rewards"])
    xp_assert_close(returns, want_r, like=arrays["rewards"])


# ------------------------------------------------------------------------------------------------- plans

#: name -> make_case options (and gae() options beyond them) of the calls that a CuPy plan serves.
PLANNED = {
    "plain": {},
    "bootstrap": {"bootstrap": True},
    "dones+next_values": {"dones": 0.2, "next_values": True},
    "holes+fill": {"holes": 0.3, "fill_masked": True},
    "padding+bootstrap": {"padding": 5, "bootstrap": True},
    "critic_lam": {"critic_lam": 1.0},
}


@pytest.fixture
def compiled_kernels(monkeypatch):
    """Compiled kernels as Triton's launcher returns them on a GPU (``tritoninterp``), launched directly."""
    from gae_xp.backends import _triton_plan

    before = _triton_plan.launch_mode("direct")
    yield stand_in_compiled_kernels(monkeypatch)
    _triton_plan.launch_mode(before)


@pytest.fixture
def small_blocks(monkeypatch):
    yield from small_blocks_in_force(monkeypatch)


def planned_case(seed: int, shape, family: str, dtype=np.float64) -> dict:
    options = dict(PLANNED[family])
    fill = options.pop("fill_masked", False)
    case = make_case(np.random.default_rng(seed), shape, **options)
    case = {name: value.astype(dtype) if isinstance(value, np.ndarray) and value.dtype == np.float64 else value
            for name, value in case.items()}
    if "bootstrap_value" not in case and "next_values" not in case:
        case["bootstrap_value"] = 0.25  # a Python number: the plan's one-element array
    return dict(case, fill_masked=True) if fill else case


def kept_plan(case: dict):
    names = ("rewards", "values", "gamma", "lam", "bootstrap_value", "next_values", "terminated", "truncated", "mask")
    arguments = [case.get(name, {"gamma": 0.99, "lam": 0.95}.get(name)) for name in names]
    key, _ = _plans.gae_key(*arguments, -1, None, "triton", case.get("fill_masked", False), None,
                            case.get("critic_lam"), "next_values")
    return _plans.PLANS.get(key)


def assert_the_loop(case: dict, outputs) -> None:
    wide = {name: value.astype(np.float64) if isinstance(value, np.ndarray) and value.dtype.kind == "f" else value
            for name, value in case.items()}
    want = reference.gae_loop(**wide)
    for got, expected in zip(outputs, want):
        assert type(got) is np.ndarray and got.dtype == case["rewards"].dtype
        xp_assert_close(got, expected, like=case["rewards"])
    assert_own_memory(outputs, [v for v in case.values() if isinstance(v, np.ndarray)])


@pytest.mark.parametrize("family", list(PLANNED))
@pytest.mark.parametrize("dtype", [np.float64, np.float32, np.float16])
def test_a_served_call_launches_on_the_arrays_addresses(family, dtype, compiled_kernels):
    """The first call makes the plan; the second runs through torch views (the kernels taken and checked against
    the binder) and checks them once more on addresses; the third launches on addresses alone, on the caller's
    stream, with no array passed to torch. Every result is the loop's."""
    from gae_xp.backends._triton_cupy_plan import CuPyPlan

    case = planned_case(1, (9, 30), family, dtype)
    before = {name: value.copy() for name, value in case.items() if isinstance(value, np.ndarray)}
    assert_the_loop(case, gae_xp.gae(**case, backend="triton"))
    assert type(kept_plan(case)) is CuPyPlan and compiled_kernels.runs == 0
    assert_the_loop(case, gae_xp.gae(**case, backend="triton"))
    assert compiled_kernels.runs == 2  # the torch plan's check, then the one on addresses
    exchanged = NumPyCaller.exchanged
    for _ in range(2):
        assert_the_loop(case, gae_xp.gae(**case, backend="triton"))
    assert compiled_kernels.runs == 4 and NumPyCaller.exchanged == exchanged
    assert compiled_kernels.streams[-3:] == [NumPyCaller.streams[0].ptr] * 3
    for name, value in before.items():
        np.testing.assert_array_equal(case[name], value)
    from gae_xp.backends import _triton_plan

    assert _triton_plan.direct_refused() is None


def test_chunks_of_few_long_rows_launch_their_maps_on_addresses(compiled_kernels, small_blocks):
    case = planned_case(2, (2, 40), "holes+fill")
    for _ in range(4):
        assert_the_loop(case, gae_xp.gae(**case, backend="triton"))
    assert kept_plan(case).maps is not None
    # two launches a call (the chunks' maps, then the rows): the torch plan's check, the check on addresses, then
    # two calls on addresses
    assert compiled_kernels.runs == 2 * 4


def test_a_launch_on_addresses_that_differs_is_refused_for_the_process(compiled_kernels):
    from gae_xp.backends import _triton_plan

    compiled_kernels.wrong_on_stream = NumPyCaller.streams[0].ptr  # the CuPy plan's launches, not the torch plan's
    case = planned_case(3, (4, 20), "dones+next_values")
    gae_xp.gae(**case, backend="triton")
    with pytest.warns(_triton_plan.DirectLaunchWarning, match="other results than the same call through torch"):
        assert_the_loop(case, gae_xp.gae(**case, backend="triton"))
    runs, exchanged = compiled_kernels.runs, NumPyCaller.exchanged
    assert_the_loop(case, gae_xp.gae(**case, backend="triton"))
    assert compiled_kernels.runs == runs and NumPyCaller.exchanged > exchanged  # through torch, the binder's launch
    assert "CuPy arrays' addresses" in _triton_plan.direct_refused()


def test_a_launch_on_addresses_that_raises_runs_the_call_through_torch(compiled_kernels):
    from gae_xp.backends import _triton_plan

    case = planned_case(4, (4, 20), "plain")
    for _ in range(3):
        gae_xp.gae(**case, backend="triton")
    compiled_kernels.fail = True
    with pytest.warns(_triton_plan.DirectLaunchWarning, match="addresses raised RuntimeError: the driver refused"):
        assert_the_loop(case, gae_xp.gae(**case, backend="triton"))
    compiled_kernels.fail = False
    runs = compiled_kernels.runs
    assert_the_loop(case, gae_xp.gae(**case, backend="triton"))
    assert compiled_kernels.runs == runs


def test_the_binders_launch_mode_passes_every_call_through_torch(compiled_kernels):
    from gae_xp.backends import _triton_plan

    _triton_plan.launch_mode("binder")
    case = planned_case(5, (4, 20), "bootstrap")
    assert_the_loop(case, gae_xp.gae(**case, backend="triton"))
    exchanged = NumPyCaller.exchanged
    for _ in range(2):
        assert_the_loop(case, gae_xp.gae(**case, backend="triton"))
    assert compiled_kernels.runs == 0 and NumPyCaller.exchanged == exchanged + 2 * 3  # rewards, values, bootstrap


def test_a_number_bootstrap_is_kept_per_value_stream_and_thread(compiled_kernels):
    case = planned_case(6, (4, 20), "plain")
    for _ in range(3):
        gae_xp.gae(**case, backend="triton")
    plan = kept_plan(case)
    kept = plan.constant[3]
    assert_the_loop(case, gae_xp.gae(**case, backend="triton"))
    assert plan.constant[3] is kept
    case["bootstrap_value"] = -1.5
    assert_the_loop(case, gae_xp.gae(**case, backend="triton"))
    assert plan.constant[0] == -1.5 and plan.constant[3] is not kept
    kept, outputs = plan.constant[3], []
    other = threading.Thread(target=lambda: outputs.append(gae_xp.gae(**case, backend="triton")))
    other.start()
    other.join()
    (served,) = outputs
    assert_the_loop(case, served)
    assert plan.constant[3] is not kept and plan.constant[2] != threading.get_ident()


@pytest.mark.parametrize("family", ["plain", "bootstrap"])
def test_a_captured_call_keeps_what_a_replay_reads_with_its_outputs(family, compiled_kernels, small_blocks):
    """Inside a CUDA-graph capture (the stand-in stream says it captures) the outputs, the chunks' maps and the
    bootstrap value are views of one allocation, which the outputs keep alive; a kept number is not touched."""
    case = planned_case(9, (2, 40), family, np.float16 if family == "bootstrap" else np.float64)
    for _ in range(3):
        gae_xp.gae(**case, backend="triton")
    plan = kept_plan(case)
    kept, runs = plan.constant, compiled_kernels.runs
    NumPyCaller.streams[0] = Stream(0x6000, capturing=True)
    advantages, returns = gae_xp.gae(**case, backend="triton")
    assert_the_loop(case, (advantages, returns))
    assert compiled_kernels.runs == runs + 2  # on addresses: the chunks' two launches
    assert advantages.base is not None and advantages.base is returns.base and plan.constant is kept


def test_a_capture_before_the_kernels_are_checked_is_refused_and_says_what_to_do(compiled_kernels):
    """Before two eager calls of a layout (or in the binder's launch mode) a captured call would run through torch
    views, whose temporaries a capture that CuPy began does not keep: refused, naming the remedy."""
    from gae_xp.backends import _triton_plan

    case = planned_case(13, (4, 20), "plain")
    gae_xp.gae(**case, backend="triton")
    NumPyCaller.streams[0] = Stream(0x6000, capturing=True)
    with pytest.raises(RuntimeError, match="call gae\\(\\) on arrays of this layout .* twice before\\s+the capture"):
        gae_xp.gae(**case, backend="triton")
    NumPyCaller.streams[0] = Stream(0x5000)
    for _ in range(2):
        gae_xp.gae(**case, backend="triton")
    _triton_plan.launch_mode("binder")
    NumPyCaller.streams[0] = Stream(0x6000, capturing=True)
    with pytest.raises(RuntimeError, match="in the direct launch mode"):
        gae_xp.gae(**case, backend="triton")
    NumPyCaller.streams[0] = Stream(0x5000)
    _triton_plan.launch_mode("direct")
    runs = compiled_kernels.runs
    assert_the_loop(case, gae_xp.gae(**case, backend="triton"))  # a new generation: checked again, eagerly
    assert compiled_kernels.runs == runs + 2 and _triton_plan.direct_refused() is None


def test_a_call_through_torch_views_inside_a_capture_is_refused_and_says_what_to_do():
    """The route's bridge (every estimator, a layout's first call) inside a CUDA-graph capture that CuPy began:
    torch's allocator would free the call's temporaries under the graph, so the call is refused, naming the
    remedy; nothing is launched."""
    case = planned_case(16, (4, 20), "dones+next_values")
    NumPyCaller.streams[0] = Stream(0x6000, capturing=True)
    with pytest.raises(RuntimeError, match="captured on torch tensors"):
        gae_xp.gae(**case, backend="triton")
    with pytest.raises(RuntimeError, match="a CUDA-graph capture begun by CuPy"):
        gae_xp.discounted_cumsum(case["rewards"], 0.9, backend="triton")
    assert NumPyCaller.exchanged == 0


@pytest.mark.parametrize("layout", ["F-ordered", "broadcast"])
def test_a_float16_bootstrap_cast_to_other_strides_keeps_the_generic_plan(layout, compiled_kernels):
    """A float16 array bootstrap value is cast per call in C order: one whose first call's cast is not C-ordered (an
    F-ordered or broadcast array) gets no plan of addresses, and no direct launch is refused."""
    from gae_xp.backends import _triton_plan
    from gae_xp.backends._triton_cupy_plan import CuPyPlan

    case = planned_case(14, (3, 4, 40), "plain", np.float16)
    case["bootstrap_value"] = (np.asfortranarray(np.random.default_rng(15).normal(size=(3, 4))).astype(np.float16)
                               if layout == "F-ordered" else
                               np.broadcast_to(np.random.default_rng(15).normal(size=4).astype(np.float16), (3, 4)))
    for _ in range(3):
        assert_the_loop(case, gae_xp.gae(**case, backend="triton"))
    assert type(kept_plan(case)) is not CuPyPlan and _triton_plan.direct_refused() is None


def test_a_call_from_another_current_device_launches_on_the_arrays_device(compiled_kernels):
    case = planned_case(7, (4, 20), "plain")
    for _ in range(3):
        gae_xp.gae(**case, backend="triton")
    NumPyCaller.device = 1
    assert_the_loop(case, gae_xp.gae(**case, backend="triton"))
    assert NumPyCaller.switched == [0] and NumPyCaller.device == 1
    assert compiled_kernels.streams[-1] == NumPyCaller.streams[0].ptr  # the arrays' device's stream, not 1's


def test_misaligned_addresses_take_a_kernel_of_their_own(compiled_kernels):
    """Triton specialises on 16-byte alignment: rewards that start 8 bytes in are launched on their own kernel,
    checked on their addresses, never the aligned one's."""
    storage = np.random.default_rng(10).standard_normal(41)
    values = np.random.default_rng(11).standard_normal((2, 20))
    aligned = {"rewards": storage[:40].reshape(2, 20), "values": values, "bootstrap_value": 0.25}
    shifted = {"rewards": storage[1:].reshape(2, 20), "values": values, "bootstrap_value": 0.25}
    for _ in range(3):
        gae_xp.gae(**aligned, backend="triton")
    plan, of_aligned = kept_plan(aligned), compiled_kernels.last
    for _ in range(3):
        assert_the_loop(shifted, gae_xp.gae(**shifted, backend="triton"))
        assert compiled_kernels.last is not of_aligned
    assert len(plan.launches) == 2 and set(plan.launches) == set(plan.plan.kernels)
    for alignment, (_, launches) in plan.launches.items():
        assert launches is plan.plan.kernels[alignment][1]


def test_a_new_generation_of_direct_launches_checks_the_addresses_again(compiled_kernels):
    """A launch mode chosen again (after a refusal, say) starts a new generation: the plan's launches on addresses
    are checked again before they serve, never taken from the generation before."""
    from gae_xp.backends import _triton_plan

    case = planned_case(12, (4, 20), "plain")
    for _ in range(3):
        gae_xp.gae(**case, backend="triton")
    runs = compiled_kernels.runs
    _triton_plan.launch_mode("direct")
    assert_the_loop(case, gae_xp.gae(**case, backend="triton"))
    # through torch views (the torch plan's kernels, checked for tensors, launched directly), then the check again
    assert compiled_kernels.runs == runs + 2
    assert_the_loop(case, gae_xp.gae(**case, backend="triton"))
    assert compiled_kernels.runs == runs + 3


def test_negative_strides_get_no_plan_of_addresses(compiled_kernels):
    from gae_xp.backends._triton_cupy_plan import CuPyPlan

    case = planned_case(8, (4, 20), "plain")
    case["rewards"] = np.flip(np.flip(case["rewards"], -1).copy(), -1)
    for _ in range(3):
        assert_the_loop(case, gae_xp.gae(**case, backend="triton"))
    assert kept_plan(case) is not None and type(kept_plan(case)) is not CuPyPlan
    assert compiled_kernels.runs == 0


def test_a_key_holds_a_cupy_arrays_layout_device_and_memory_kind(monkeypatch):
    """``gae_xp._plans`` keys CuPy arrays (CuPy itself needs a GPU: a module of that name stands in for it)."""
    import types

    class ndarray:  # noqa: N801 - CuPy's name
        def __init__(self, shape=(2, 8), strides=(64, 8), device=0, memory=2):
            self.dtype, self.shape, self.strides, self.size = np.dtype(np.float32), shape, strides, 16
            self.device, self.memory = types.SimpleNamespace(id=device), memory

        def __dlpack_device__(self):
            return self.memory, self.device.id

    monkeypatch.setitem(sys.modules, "cupy", types.SimpleNamespace(ndarray=ndarray))
    monkeypatch.setitem(_plans._CUPY, "ndarray", None)

    def key(rewards, values=None):
        return _plans.gae_key(rewards, ndarray() if values is None else values, 0.99, 0.95, None, None, None, None,
                              None, -1, None, "auto", False, None, None, "next_values")[0]

    first = key(ndarray())
    assert first is not None and first == key(ndarray())
    assert len({first, key(ndarray(device=1)), key(ndarray(memory=13)), key(ndarray(strides=(128, 16)))}) == 4
    assert key(ndarray(), values=np.zeros((2, 8), np.float32)) is None  # two libraries: the full path's error
