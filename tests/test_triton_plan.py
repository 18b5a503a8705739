"""The Triton route's plan (``gae_xp.backends._triton_plan``) under Triton's interpreter: a repeated ``gae()`` call
served by its layout's plan gives the first call's results and the float64 loop's, a changed layout, dtype or
option is never served a stale plan, bad input still raises naming the argument, and the direct launch
(the default) passes the binder's arguments, checked once per compiled kernel, or steps aside.

``tests/conftest.py`` sets ``TRITON_INTERPRET=1`` before triton is imported (this module does too, for a run of
its own); ``tests/test_triton.py`` has the kernels' own tests.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tritoninterp import record_launches, require_interpreter, small_blocks_in_force, stand_in_compiled_kernels

from gae_xp import reference
from gae_xp.testing import make_case, xp_assert_close

torch = require_interpreter()
import triton  # noqa: E402

import gae_xp  # noqa: E402
from gae_xp import _plans  # noqa: E402
from gae_xp.backends import _triton_launch, _triton_plan  # noqa: E402
from gae_xp.backends import triton as triton_backend  # noqa: E402

#: name -> make_case options (and gae() options beyond them), every family the plan serves or declines.
FAMILIES = {
    "plain": {},
    "bootstrap": {"bootstrap": True},
    "next_values": {"next_values": True},
    "dones": {"dones": 0.2},
    "dones+next_values": {"dones": 0.2, "next_values": True},
    "holes": {"holes": 0.3},
    "holes+fill": {"holes": 0.3, "fill_masked": True},
    "holes+next_values": {"holes": 0.3, "next_values": True, "fill_masked": True},
    "padding+bootstrap": {"padding": 5, "bootstrap": True},
    "critic_lam": {"critic_lam": 1.0},
    "coefficients": {"per_step_gamma": True, "per_row_lam": True},
    "everything": {"dones": 0.15, "holes": 0.25, "padding": 2, "per_step_gamma": True, "per_row_lam": True,
                   "bootstrap": True, "per_step_critic_lam": True, "fill_masked": True},
}
#: The families whose calls a Triton plan serves (Python-number coefficients); the others keep the generic plans.
SERVED = {"plain", "bootstrap", "next_values", "dones", "dones+next_values", "holes", "holes+fill",
          "holes+next_values", "padding+bootstrap", "critic_lam"}
DTYPES = {"float64": torch.float64, "float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


@pytest.fixture(autouse=True)
def fresh_plans():
    """Every test starts and ends without plans, in the binder's launch mode."""
    _plans.PLANS.clear()
    before = _triton_plan.launch_mode("binder")
    yield
    _triton_plan.launch_mode(before)
    _plans.PLANS.clear()


@pytest.fixture
def small_blocks(monkeypatch):
    yield from small_blocks_in_force(monkeypatch)


def case(seed: int, shape, family: str, dtype=torch.float32) -> dict:
    options = dict(FAMILIES[family])
    fill = options.pop("fill_masked", False)
    drawn = make_case(np.random.default_rng(seed), shape, **options)
    out = {name: torch.from_numpy(value.copy()) if isinstance(value, np.ndarray) else value
           for name, value in drawn.items()}
    out = {name: value.to(dtype) if torch.is_tensor(value) and value.is_floating_point() else value
           for name, value in out.items()}
    if fill:
        out["fill_masked"] = True
    return out


def loop(given: dict):
    """The float64 per-step loop on the tensors' own (rounded) values."""
    wide = {name: value.to(torch.float64).numpy() if torch.is_tensor(value) and value.is_floating_point()
            else value.numpy() if torch.is_tensor(value) else value for name, value in given.items()}
    return reference.gae_loop(**wide)


def plan_of(given: dict):
    """The plan that ``gae_xp._plans`` keeps for a ``backend="triton"`` call of these arguments (None if none)."""
    names = ("rewards", "values", "gamma", "lam", "bootstrap_value", "next_values", "terminated", "truncated", "mask")
    arguments = [given.get(name, {"gamma": 0.99, "lam": 0.95}.get(name)) for name in names]
    key, _ = _plans.gae_key(*arguments, -1, None, "triton", given.get("fill_masked", False), None,
                            given.get("critic_lam"), given.get("truncated_bootstrap", "next_values"))
    return _plans.PLANS.get(key)


def solve(given: dict):
    return gae_xp.gae(**given, backend="triton")


def assert_loop(given: dict, outputs, dtype):
    want = loop(given)
    like = torch.zeros((), dtype=dtype)
    xp_assert_close(outputs[0], want[0], like=like)
    xp_assert_close(outputs[1], want[1], like=like)


def same(a, b) -> bool:
    return bool(((a == b) | (a.isnan() & b.isnan())).all())


# ------------------------------------------------------------------------------------------- served calls


@pytest.mark.parametrize("family", list(FAMILIES))
@pytest.mark.parametrize("dtype", ["float64", "float32", "bfloat16"])
def test_a_served_call_gives_the_first_calls_results_and_the_loops(family, dtype):
    """The first call takes the full path and makes the plan; the next calls of the layout, with new data of it,
    are served by a Triton plan where the family's coefficients are numbers, and equal the full path's."""
    first = case(1, (3, 37), family, DTYPES[dtype])
    assert_loop(first, solve(first), DTYPES[dtype])
    plan = plan_of(first)
    assert isinstance(plan, _triton_plan.TritonPlan) == (family in SERVED), type(plan).__name__
    for seed in (2, 3):
        again = case(seed, (3, 37), family, DTYPES[dtype])
        served = solve(again)
        assert plan_of(again) is plan
        assert_loop(again, served, DTYPES[dtype])
        _plans.PLANS.clear()
        full = solve(again)  # the same call on the full path: bit for bit the plan's
        assert all(same(a, b) for a, b in zip(served, full))
        plan = plan_of(again)  # the full path's call made the layout's plan again


def test_few_long_rows_cut_into_chunks_are_served_with_their_maps(monkeypatch, small_blocks):
    """Two rows of 40 steps in 16-step blocks: the chunks' two launches (maps, then the final pass), from the plan
    too."""
    calls = record_launches(monkeypatch)
    for seed in (1, 2):
        given = case(seed, (2, 40), "holes+fill", torch.float64)
        assert_loop(given, solve(given), torch.float64)
    assert isinstance(plan_of(given), _triton_plan.TritonPlan)
    assert [kwargs["MODE"] for _, kwargs in calls] == [1, 2, 1, 2]


def test_a_number_bootstrap_is_read_per_call():
    """A Python-float bootstrap value is in the key by its type only: each call's value is the one used (the kept
    one-element tensor follows the value)."""
    given = case(4, (2, 9), "plain", torch.float64)
    for value in (0.5, 0.5, -2.0, 0.0, 0.5):
        outputs = solve({**given, "bootstrap_value": value})
        assert_loop({**given, "bootstrap_value": value}, outputs, torch.float64)
    assert isinstance(plan_of({**given, "bootstrap_value": 0.5}), _triton_plan.TritonPlan)


def test_a_number_bootstrap_inside_a_cuda_graph_capture_is_the_graphs_own(monkeypatch):
    """On CUDA the kept one-element tensor serves eager calls on its stream; a call inside a capture makes its own
    (the graph's: a kept one could be freed with its plan before a replay) and keeps nothing. The CUDA calls are
    stood in for (device 0, stream 7): the plan's CPU tensors run the same logic."""
    given = {**case(3, (2, 9), "plain", torch.float64), "bootstrap_value": 0.5}
    solve(given)
    plan = plan_of(given)
    assert isinstance(plan, _triton_plan.TritonPlan)
    capturing, made = [False], []
    full = torch.full
    monkeypatch.setattr(plan, "device_index", 0)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: capturing[0])
    monkeypatch.setattr(_triton_plan, "_stream", lambda index: 7)
    monkeypatch.setattr(torch, "full", lambda *args, **kwargs: made.append(1) or full(*args, **kwargs))
    assert_loop(given, solve(given), torch.float64)
    kept = plan.constant
    assert kept[:2] == (0.5, 7) and len(made) == 1
    assert_loop(given, solve(given), torch.float64)
    assert plan.constant is kept and len(made) == 1  # eager, same value and stream: the kept tensor
    capturing[0] = True
    for _ in range(2):
        assert_loop(given, solve(given), torch.float64)
    assert plan.constant is kept and len(made) == 3  # captured: one of its own each time, none kept


def test_tensors_kept_negated_lazily_are_read_as_their_values():
    """torch's negative bit (``torch._neg_view``) leaves the memory holding the values' negatives: the kernels,
    which read memory by pointer, get the values (the full path resolves them; no plan serves such tensors)."""
    given = case(9, (2, 11), "bootstrap", torch.float64)
    negated = {name: torch._neg_view(-value) if torch.is_tensor(value) and value.is_floating_point() else value
               for name, value in given.items()}
    assert negated["rewards"].is_neg() and negated["bootstrap_value"].is_neg()
    for _ in range(2):
        assert_loop(given, solve(negated), torch.float64)
    assert not isinstance(plan_of(negated), _triton_plan.TritonPlan)


def test_a_call_recorded_by_a_dispatch_mode_is_never_served_a_kept_plan(monkeypatch):
    """Under a Python dispatch mode (``make_fx``'s records the call) a plan would launch on the tensors' pointers,
    past the recording: such a call takes the full path, whose launch goes through ``wrap_triton``, and keeps no
    plan."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Recording(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))

    given = case(4, (2, 9), "dones", torch.float64)
    solve(given)
    plan = plan_of(given)
    assert isinstance(plan, _triton_plan.TritonPlan)
    served = []
    monkeypatch.setattr(_triton_plan.TritonPlan, "launch", lambda self, arguments: served.append(arguments))
    with Recording():
        assert _plans.gae_key(given["rewards"], given["values"], 0.99, 0.95, None, None, None, None, None, -1, None,
                              "triton", False, None, None, None) == (None, None)
        outputs = solve(given)
    assert not served
    assert_loop(given, outputs, torch.float64)
    assert plan_of(given) is plan and len(_plans.PLANS) == 1


def test_outputs_are_new_tensors_and_inputs_are_only_read():
    given = case(5, (3, 21), "everything", torch.float32)
    given = {name: value for name, value in given.items() if name not in ("gamma", "lam", "critic_lam")}
    before = {name: value.clone() for name, value in given.items() if torch.is_tensor(value)}
    first, second = solve(given), solve(given)
    assert isinstance(plan_of(given), _triton_plan.TritonPlan)
    for name, value in before.items():
        assert same(given[name], value) if value.is_floating_point() else torch.equal(given[name], value), name
    tensors = [value for value in given.values() if torch.is_tensor(value)]
    for out in (*first, *second):
        assert not any(_shares(out, other) for other in tensors)
    assert not any(_shares(a, b) for a in first for b in second) and not _shares(*second)


def _shares(a, b) -> bool:
    return a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()


def test_tuned_settings_take_the_backends_own_path(monkeypatch):
    """A call of a planned layout under ``tuned()`` launches with the settings, not the plan's."""
    given = case(6, (9, 40), "dones", torch.float32)
    solve(given)
    assert isinstance(plan_of(given), _triton_plan.TritonPlan)
    calls = record_launches(monkeypatch)
    with triton_backend.tuned(block=16):
        assert_loop(given, solve(given), torch.float32)
    solve(given)
    assert [kwargs["BLOCK"] for _, kwargs in calls] == [16, 128]


# ------------------------------------------------------------------------------------------- never stale


def _layouts():
    """A call's layout: shape, dtype, family (numbers only), whether time is read through a transposed view, the
    bootstrap value's kind."""
    return st.tuples(st.sampled_from([(2, 7), (3, 7), (2, 8), (1, 2, 8)]), st.sampled_from(["float64", "float32"]),
                     st.sampled_from(sorted(SERVED)), st.booleans(),
                     st.sampled_from(["none", "number", "tensor", "strided float16"]))


@settings(max_examples=12, deadline=None)
@given(layouts=st.lists(_layouts(), min_size=2, max_size=4), seed=st.integers(0, 2**16))
def test_a_changed_layout_dtype_or_option_is_never_served_a_stale_plan(layouts, seed):
    """Calls of drawn layouts in turn (each twice, with new data): every one equals the loop, whatever plans the
    earlier ones left."""
    _plans.PLANS.clear()
    for index, (shape, dtype, family, transposed, bootstrap) in enumerate(layouts):
        for repeat in range(2):
            given = case(seed + 7 * index + repeat, shape, family, DTYPES[dtype])
            given.pop("bootstrap_value", None)
            if "next_values" in given:  # it replaces the bootstrap value: none is given
                bootstrap = "none"
            if bootstrap == "number":
                given["bootstrap_value"] = 0.25 * (repeat + 1)
            elif bootstrap == "tensor":
                given["bootstrap_value"] = torch.linspace(-1, 1, int(np.prod(shape[:-1])),
                                                          dtype=DTYPES[dtype]).reshape(shape[:-1])
            elif bootstrap == "strided float16":  # cast per call by the plan: the cast's layout is the first call's
                given["bootstrap_value"] = torch.linspace(-1, 1, 2 * int(np.prod(shape[:-1])),
                                                          dtype=torch.float16)[::2].reshape(shape[:-1])
            if transposed:  # the same values read through (T, B) memory: strides the key must tell apart
                given = {name: value.transpose(-1, 0).contiguous().transpose(-1, 0)
                         if torch.is_tensor(value) and value.shape == shape else value
                         for name, value in given.items()}
            assert_loop(given, solve(given), DTYPES[dtype])


# ------------------------------------------------------------------------------------------- bad input


def test_bad_input_still_raises_naming_the_argument_once_a_plan_exists():
    given = case(8, (2, 10), "dones", torch.float32)
    solve(given)
    solve(given)
    assert isinstance(plan_of(given), _triton_plan.TritonPlan)
    with pytest.raises(ValueError, match="gamma must be in"):
        solve({**given, "gamma": 1.5})
    with pytest.raises(ValueError, match="lam must be in"):
        solve({**given, "lam": float("nan")})
    with pytest.raises(TypeError, match="terminated must have dtype bool"):
        solve({**given, "terminated": given["terminated"].to(torch.float32)})
    with pytest.raises(ValueError, match="values must have the shape of rewards"):
        solve({**given, "values": given["values"][:, :-1]})
    with pytest.raises(ValueError, match="bootstrap_value of shape"):
        solve({**given, "bootstrap_value": torch.zeros(3)})
    with pytest.raises(ValueError, match="pass bootstrap_value or next_values"):
        solve({**given, "bootstrap_value": 0.5, "next_values": given["values"]})
    with pytest.raises(TypeError, match="rewards is a torch.Tensor|pass arrays of one library"):
        solve({**given, "values": given["values"].numpy()})


# ------------------------------------------------------------------------------------------- direct launches


@pytest.fixture
def compiled_kernels(monkeypatch):
    """The kernel's launcher returns a compiled kernel (as Triton's does on a GPU) whose run is the interpreter's."""
    return stand_in_compiled_kernels(monkeypatch)


@pytest.mark.parametrize("family", ["plain", "bootstrap", "holes+fill", "critic_lam", "dones+next_values"])
def test_a_direct_launch_passes_the_binders_arguments(family, compiled_kernels, small_blocks):
    """Served calls launched directly (the compiled kernel's run, after one check against the binder) equal the
    loop, in the one launch and in the chunks' two."""
    _triton_plan.launch_mode("direct")
    for shape in ((9, 30), (2, 40)):
        for seed in (1, 2, 3):
            given = case(seed, shape, family, torch.float64)
            assert_loop(given, solve(given), torch.float64)
    assert _triton_plan.direct_refused() is None and compiled_kernels.on_addresses  # ints: no driver query a slot
    # per shape: the first direct call (its check: one run per launch), then one more launched directly; one launch
    # at (9, 30) (enough rows: not cut), two (the chunks) at (2, 40)
    assert compiled_kernels.runs == (1 + 1) + (2 + 2)


def test_a_direct_launch_whose_results_differ_falls_back_to_the_binder(compiled_kernels):
    _triton_plan.launch_mode("direct")
    compiled_kernels.wrong = True
    given = case(1, (2, 20), "dones", torch.float32)
    solve(given)
    with pytest.warns(_triton_plan.DirectLaunchWarning, match="gave other results"):
        assert_loop(given, solve(given), torch.float32)
    assert "other results" in _triton_plan.direct_refused()
    runs = compiled_kernels.runs
    assert_loop(given, solve(given), torch.float32)
    assert compiled_kernels.runs == runs  # refused for the process: the binder serves


def test_kernels_that_failed_their_check_are_not_kept_for_a_later_direct_mode(compiled_kernels):
    """A benchmark switches the launch mode back and forth in one process: the direct mode chosen again after a
    refusal checks the plan's kernels again rather than launching the ones whose results differed."""
    _triton_plan.launch_mode("direct")
    compiled_kernels.wrong = True
    given = case(3, (2, 20), "dones", torch.float32)
    solve(given)
    with pytest.warns(_triton_plan.DirectLaunchWarning, match="gave other results"):
        solve(given)
    _triton_plan.launch_mode("binder")
    _triton_plan.launch_mode("direct")
    for _ in range(2):
        assert_loop(given, solve(given), torch.float32)
    assert "other results" in _triton_plan.direct_refused()


def test_a_compiled_kernel_is_checked_once_per_process(compiled_kernels, small_blocks):
    """A second plan of the same kernel (another B, the same specialisation) launches it directly without a check
    of its own: its first call runs the binder and the kernel once, not the kernel twice."""
    _triton_plan.launch_mode("direct")
    first, second = case(1, (9, 30), "dones", torch.float32), case(2, (11, 30), "dones", torch.float32)
    for call in (first, second):
        solve(call)  # the full path, which makes the shape's plan
    assert compiled_kernels.runs == 0
    assert_loop(first, solve(first), torch.float32)
    assert compiled_kernels.runs == 1  # the plan's first call: the binder's launch, and the kernel's check
    assert_loop(second, solve(second), torch.float32)
    assert compiled_kernels.runs == 1  # the binder's launch, the kernel taken without a check
    assert_loop(second, solve(second), torch.float32)
    assert compiled_kernels.runs == 2 and _triton_plan.direct_refused() is None


def test_a_kernel_whose_direct_launch_raised_is_checked_again_before_a_later_direct_mode(compiled_kernels):
    """A checked kernel whose later direct launch raises: the binder launches that call and every later one (said
    once), and a direct mode chosen again takes and checks the kernel anew rather than launching it unchecked."""
    _triton_plan.launch_mode("direct")
    given = case(4, (2, 20), "dones", torch.float32)
    solve(given)
    solve(given)  # taken and checked
    compiled_kernels.fail = True
    with pytest.warns(_triton_plan.DirectLaunchWarning, match="raised RuntimeError: the driver refused"):
        assert_loop(given, solve(given), torch.float32)
    runs = compiled_kernels.runs
    assert_loop(given, solve(given), torch.float32)
    assert compiled_kernels.runs == runs  # refused: the binder serves
    compiled_kernels.fail = False
    _triton_plan.launch_mode("direct")
    assert_loop(given, solve(given), torch.float32)
    assert compiled_kernels.runs == runs + 1  # the check again (the binder's launch, then one run)
    assert_loop(given, solve(given), torch.float32)
    assert compiled_kernels.runs == runs + 2 and _triton_plan.direct_refused() is None


def test_tritons_debug_mode_and_pre_run_hooks_take_the_binder(compiled_kernels, monkeypatch):
    """Settings under which Triton's launcher would pick or run another kernel than the one taken: the binder."""
    _triton_plan.launch_mode("direct")
    given = case(5, (2, 20), "plain", torch.float32)
    solve(given)
    solve(given)
    runs = compiled_kernels.runs
    monkeypatch.setattr(triton.knobs.runtime, "debug", True)
    assert_loop(given, solve(given), torch.float32)
    assert compiled_kernels.runs == runs
    monkeypatch.setattr(triton.knobs.runtime, "debug", False)
    assert_loop(given, solve(given), torch.float32)
    assert compiled_kernels.runs == runs + 1


def test_a_misaligned_pointer_takes_a_kernel_of_its_own(compiled_kernels):
    """Triton specialises pointers on 16-byte alignment: a call whose rewards start 8 bytes in launches the kernel
    compiled for that alignment (taken and checked on its first call, silently), never the one taken for aligned
    pointers; both stay with the plan."""
    _triton_plan.launch_mode("direct")
    storage = torch.randn(2 * 20 + 1, dtype=torch.float64)
    aligned = {"rewards": storage[:40].view(2, 20), "values": torch.randn(2, 20, dtype=torch.float64)}
    shifted = {"rewards": storage[1:].view(2, 20), "values": aligned["values"]}
    solve(aligned)
    solve(aligned)
    kernel_of_aligned = compiled_kernels.last
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for _ in range(2):  # taken and checked, then launched directly
            assert_loop(shifted, solve(shifted), torch.float64)
            assert compiled_kernels.last is not kernel_of_aligned
    solve(aligned)
    assert compiled_kernels.last is kernel_of_aligned
    assert compiled_kernels.runs == 4 and _triton_plan.direct_refused() is None


def test_without_a_compiled_kernel_the_binder_launches_silently(monkeypatch):
    """Triton's interpreter returns no compiled kernel: the direct mode (the default) steps aside without a word."""
    monkeypatch.setattr(_triton_plan, "_WARNED", set())
    _triton_plan.launch_mode("direct")
    given = case(2, (2, 12), "plain", torch.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        solve(given)
        assert_loop(given, solve(given), torch.float32)
    assert _triton_plan.direct_refused() is None


def test_the_launch_mode_is_checked(monkeypatch):
    monkeypatch.setenv(_triton_plan.LAUNCH_VARIABLE, "Direct ")
    assert _triton_plan._mode_from_environment() == "direct"
    monkeypatch.setenv(_triton_plan.LAUNCH_VARIABLE, "")
    assert _triton_plan._mode_from_environment() == "direct"
    monkeypatch.setenv(_triton_plan.LAUNCH_VARIABLE, "binder")
    assert _triton_plan._mode_from_environment() == "binder"
    monkeypatch.setenv(_triton_plan.LAUNCH_VARIABLE, "fast")
    with pytest.raises(ValueError, match="GAE_XP_TRITON_LAUNCH must be one of binder, direct, got 'fast'"):
        _triton_plan._mode_from_environment()
    with pytest.raises(ValueError, match="launch mode must be one of"):
        _triton_plan.launch_mode("fast")


# ------------------------------------------------------------------------------------------- the benchmark


def test_the_host_path_benchmark_times_every_stage(capsys):
    """``python -m gae_xp.bench.host_path`` at a tiny size: every stage of every case is printed, and Triton's
    driver, the kernel and the key's rule are left as they were."""
    from gae_xp.bench import host_path

    kernel, driver = _triton_launch.gae_kernel, triton.runtime.driver._active
    without_numpy = _plans._TORCH.without_numpy if _plans._torch_tensor() is not None else None
    assert host_path.main(["--B", "4", "--T", "16", "--number", "3", "--repeat", "1"]) == 0
    printed = capsys.readouterr().out
    assert "CPU: " in printed and printed.count("whole call, direct launch") == len(host_path.CASES)
    for stage in ("key (_plans.gae_key)", "plan lookup", "output allocation", "argument packing",
                  "launch: Triton's binder", "launch: direct", "whole call, launch a no-op"):
        assert printed.count(stage) == len(host_path.CASES), stage
    assert _triton_launch.gae_kernel is kernel and triton.runtime.driver._active is driver
    assert _plans._TORCH.without_numpy == without_numpy and _triton_plan.launch_mode() == "binder"
