"""backend="triton" under Triton's interpreter: every option of gae() against the float64 per-step loop.

``TRITON_INTERPRET=1`` must be set before triton is imported (Triton reads it
when its kernels are decorated); ``tests/conftest.py`` sets it for every test
and this module sets it too, for a run of its own. The interpreter
runs the kernels on torch CPU tensors, which the backend serves only when it
is named: under the interpreter ``auto`` never chooses it. The kernels'
compiled form (sm_90 PTX) is checked without a GPU by
``test_the_kernels_compile_for_sm90_with_16_byte_accesses``;
``tests/gpu/test_triton_cuda.py`` runs the same grid on a GPU.
"""

from __future__ import annotations

import os
import types

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tritoninterp import record_launches, require_interpreter

from gae_xp import reference
from gae_xp.testing import make_case, option_grid, xp_assert_close

torch = require_interpreter()

import gae_xp  # noqa: E402
from gae_xp import backends  # noqa: E402
from gae_xp.backends import _triton_launch  # noqa: E402
from gae_xp.backends import triton as triton_backend  # noqa: E402

DTYPES = {"float64": torch.float64, "float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}

OPTIONS = option_grid(dones=0.2)


def build(seed: int, shape, options: dict, *, axis: int = -1) -> dict:
    return make_case(np.random.default_rng(seed), shape, axis=axis, **options)


def tensors(case: dict, dtype) -> dict:
    """The case as torch CPU tensors, the float ones in ``dtype`` (the loop gets those values in float64)."""
    out = {}
    for name, value in case.items():
        if isinstance(value, np.ndarray):
            value = torch.from_numpy(value.copy())
            if value.is_floating_point():
                value = value.to(dtype)
        out[name] = value
    return out


def widened(given: dict) -> dict:
    """The tensors' own values (rounded to their dtype) as float64 NumPy arrays, for the loop."""
    return {name: value.to(torch.float64).numpy() if torch.is_tensor(value) and value.is_floating_point()
            else value.numpy() if torch.is_tensor(value) else value for name, value in given.items()}


def check(given: dict, *, axis: int = -1, dtype=None, **options):
    """gae(backend="triton") on ``given`` against gae_loop (or the packed reference with ``cu_seqlens``)."""
    dtype = dtype or given["rewards"].dtype
    advantages, returns = gae_xp.gae(**given, axis=axis, backend="triton", **options)
    want = expected(widened(given), axis=axis, **options)
    like = torch.zeros((), dtype=dtype)
    xp_assert_close(advantages, want[0], like=like)
    xp_assert_close(returns, want[1], like=like)
    return advantages, returns


def expected(case: dict, *, axis: int = -1, cu_seqlens=None, **options):
    if cu_seqlens is None:
        return reference.gae_loop(**case, axis=axis, **options)
    return packed_loop({**case, **options}, np.asarray(cu_seqlens))


def packed_loop(case: dict, offsets: np.ndarray):
    """The per-step loop on each packed sequence alone (time last), its bootstrap value the sequence's own."""
    advantages = np.zeros(case["rewards"].shape)
    returns = np.zeros(case["rewards"].shape)
    bootstrap = case.get("bootstrap_value")
    for i, (lo, hi) in enumerate(zip(offsets[:-1], offsets[1:])):
        piece = {name: value[..., lo:hi] if isinstance(value, np.ndarray) and value.shape[-1:] ==
                 case["rewards"].shape[-1:] and name != "bootstrap_value" else value
                 for name, value in case.items() if name != "bootstrap_value"}
        if bootstrap is not None:
            piece["bootstrap_value"] = bootstrap[..., i]
        advantages[..., lo:hi], returns[..., lo:hi] = reference.gae_loop(**piece)
    return advantages, returns


# ------------------------------------------------------------------------------------------------- every option


@pytest.mark.parametrize("name", list(OPTIONS))
@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("block", [None, 16])
def test_every_option_matches_the_loop(name, dtype, block):
    """With the heuristic's block (one block a row) and with 16 steps a block (state carried across blocks)."""
    with triton_backend.tuned(block=block):
        check(tensors(build(7, (3, 45), OPTIONS[name]), DTYPES[dtype]))


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("name", ["plain", "everything"])
def test_narrow_floats_are_computed_in_float32_and_kept(dtype, name):
    advantages, _ = check(tensors(build(3, (2, 33), OPTIONS[name]), DTYPES[dtype]))
    assert advantages.dtype == DTYPES[dtype]


@pytest.mark.parametrize("name", ["plain", "dones", "holes", "holes+fill", "everything", "holes+next_values",
                                  "per_step_critic_lam"])
def test_few_long_rows_are_cut_into_chunks(name, monkeypatch):
    """One row of 300 steps with 16-step blocks (the interpreter stands for 4 multiprocessors): chunks whose maps
    one launch writes and the next composes; a terminated step or a mask in any chunk is exact, and a holed mask
    without next_values carries "V at the next real step" across chunks."""
    calls = record_launches(monkeypatch)
    with triton_backend.tuned(block=16):
        check(tensors(build(11, (1, 300), OPTIONS[name]), torch.float64))
    assert [kwargs["MODE"] for _, kwargs in calls] == [1, 2]


@pytest.mark.parametrize("most", [1, 3])
def test_tuned_chunks_bound_the_chunks_a_row_is_cut_into(most, monkeypatch):
    """``tuned(chunks=1)`` walks each of few long rows in one program (one launch over the bytes once);
    ``chunks=3`` cuts it into three, where the heuristic cuts it into 10 (of 32 steps; 4 stand-in multiprocessors)."""
    assert _triton_launch._config(300, 1, 1, 4, (16, None, None, None, None))[4] == 10
    assert _triton_launch._config(300, 1, 1, 4, (16, None, None, most, None))[4] == most
    calls = record_launches(monkeypatch)
    with triton_backend.tuned(block=16, chunks=most):
        check(tensors(build(12, (1, 300), OPTIONS["everything"]), torch.float64))
    assert [kwargs["MODE"] for _, kwargs in calls] == ([0] if most == 1 else [1, 2])


def test_the_pipeline_is_shortened_to_fit_the_devices_shared_memory(monkeypatch):
    """Pipelined chunks (``tuned(num_stages=3)``, 16-step blocks) keep two blocks of every per-step load in flight;
    where the device's shared memory cannot hold them a Plan launches fewer stages, down to none, with the same
    results. A step of "everything" in float64 loads 43 bytes: rewards, values twice (V_{t+1} read from them),
    per-step gamma and critic_lam (8 each), terminated, truncated and mask (1 each); lam is per row, read once."""
    from gae_xp.backends import _triton_config

    case = tensors(build(13, (1, 300), OPTIONS["everything"]), torch.float64)
    counted = []
    step_bytes = _triton_launch._step_bytes
    monkeypatch.setattr(_triton_launch, "_step_bytes", lambda *args: counted.append(step_bytes(*args)) or counted[-1])
    two = _triton_config.pipeline_bytes(2, 16, 43)
    for limit, stages in ((10**9, 3), (two, 2), (two - 1, 1)):
        monkeypatch.setattr(_triton_launch, "_shared_memory", lambda device, limit=limit: limit)
        monkeypatch.setattr(_triton_launch, "_PLANS", {})
        calls = record_launches(monkeypatch)
        with triton_backend.tuned(block=16, num_stages=3):
            check(case)
        assert [kwargs["MODE"] for _, kwargs in calls] == [1, 2]
        assert {(kwargs["STAGES"], kwargs["num_stages"]) for _, kwargs in calls} == {(stages, stages)}, (limit, counted)
    assert set(counted) == {43}, counted


@pytest.mark.parametrize("knob", ["block", "tile"])
@pytest.mark.parametrize("size", [8, 48, 1024.0, True])
def test_tuned_refuses_blocks_and_tiles_that_are_not_powers_of_two(knob, size):
    with pytest.raises(ValueError, match=f"{knob} must be a power of two >= 16"):
        with triton_backend.tuned(**{knob: size}):
            pass
    with triton_backend.tuned(**{knob: np.int64(64)}):  # any integer type
        pass


@pytest.mark.parametrize("chunks", [0, -2, 1.5, True, "2"])
def test_tuned_refuses_chunks_that_are_not_a_count(chunks):
    with pytest.raises(ValueError, match="chunks must be an int >= 1"):
        with triton_backend.tuned(chunks=chunks):
            pass


@pytest.mark.parametrize("fill", [False, True])
def test_the_value_after_a_gap_of_whole_masked_chunks(fill, monkeypatch):
    """Masked stretches longer than a chunk (32 steps here): "V at the next real step" crosses chunks that hold
    no real step, into the advantage of the last real step before them; the row's end is masked too."""
    case = build(21, (2, 300), {"dones": 0.02, "per_step_critic_lam": True})
    case["mask"] = np.ones((2, 300), dtype=bool)
    case["mask"][0, 40:171] = False
    case["mask"][1, 5:250] = False
    case["mask"][:, 290:] = False
    calls = record_launches(monkeypatch)
    with triton_backend.tuned(block=16):
        check(tensors(case, torch.float64), fill_masked=fill)
    assert [kwargs["MODE"] for _, kwargs in calls] == [1, 2]


def test_chunks_carry_the_critic_chain_and_narrow_floats(monkeypatch):
    calls = record_launches(monkeypatch)
    with triton_backend.tuned(block=16):
        check(tensors(build(5, (2, 130), {"dones": 0.05, "per_step_critic_lam": True, "next_values": True,
                                          "holes": 0.2}), torch.bfloat16))
    assert [kwargs["MODE"] for _, kwargs in calls] == [1, 2]


@pytest.mark.parametrize("device_offsets", [False, True])
@pytest.mark.parametrize("name", ["plain", "bootstrap", "dones", "holes+fill", "everything"])
def test_packed_sequences_with_empty_ones(name, device_offsets):
    offsets = [0, 7, 7, 20, 21, 21, 40]
    case = build(13, (2, 40), OPTIONS[name])
    if "bootstrap_value" in case:
        case["bootstrap_value"] = np.random.default_rng(1).standard_normal((2, len(offsets) - 1))
    given = tensors(case, torch.float64)
    check(given, cu_seqlens=torch.tensor(offsets) if device_offsets else offsets)


def test_packed_sequences_in_one_row_with_the_chunk_block():
    """Packed sequences longer than a block: each sequence's program walks several blocks."""
    case = build(2, (1, 90), OPTIONS["everything"])
    case["bootstrap_value"] = np.array([[0.5, -1.0, 2.0]])
    with triton_backend.tuned(block=16):
        check(tensors(case, torch.float32), cu_seqlens=[0, 37, 37, 90])


@pytest.mark.parametrize("device_offsets", [False, True])
def test_one_packed_sequence_in_few_long_rows_is_not_cut_into_chunks(device_offsets, monkeypatch):
    """``cu_seqlens=[0, T]`` is one sequence per row, but still offsets the kernel reads by its program's index:
    a row of few long ones is walked by one program (chunks would read offsets past their end)."""
    calls = record_launches(monkeypatch)
    case = build(4, (1, 300), OPTIONS["everything"])
    case["bootstrap_value"] = np.array([[0.75]])
    with triton_backend.tuned(block=16):
        check(tensors(case, torch.float64), cu_seqlens=torch.tensor([0, 300]) if device_offsets else [0, 300])
    assert [kwargs["MODE"] for _, kwargs in calls] == [0]


@pytest.mark.parametrize("name", ["plain", "dones+next_values", "holes+fill", "everything"])
def test_an_incoming_carry_enters_each_sequence_as_in_the_numba_kernels(name):
    """Pieces (shards, blocks): each segment's end takes its bootstrap value and an incoming advantage."""
    from gae_xp._prepare import prepare

    case = {key: value for key, value in tensors(build(5, (2, 30), OPTIONS[name]), torch.float64).items()
            if key != "bootstrap_value"}
    case.pop("per_step_critic_lam", None)
    call = prepare(**{key: value for key, value in case.items()}, backend="triton")
    p = call.problem.replace(critic_lam=None)
    rng = np.random.default_rng(0)
    cut = p.with_segments([0, 11, 11, 30], torch.from_numpy(rng.standard_normal((2, 3))),
                          torch.from_numpy(rng.standard_normal((2, 3))))
    got = backends.load("triton").gae(cut, chunk_size=None)
    want = backends.load("numba").gae(cut, chunk_size=None)
    for ours, theirs in zip(got, want):
        xp_assert_close(ours, theirs.numpy(), like=torch.zeros((), dtype=torch.float64))


def test_an_incoming_carry_reaches_a_row_cut_into_chunks(monkeypatch):
    from gae_xp._prepare import prepare

    case = tensors(build(6, (1, 300), OPTIONS["holes+fill"]), torch.float64)
    p = prepare(**case, backend="triton").problem
    piece = p.replace(carry=torch.tensor([[0.75]], dtype=torch.float64))
    calls = record_launches(monkeypatch)
    with triton_backend.tuned(block=16):
        got = backends.load("triton").gae(piece, chunk_size=None)
    assert [kwargs["MODE"] for _, kwargs in calls] == [1, 2]
    want = backends.load("numba").gae(piece, chunk_size=None)
    for ours, theirs in zip(got, want):
        xp_assert_close(ours, theirs.numpy(), like=torch.zeros((), dtype=torch.float64))


# ------------------------------------------------------------------------------------------------ tiles of rows


@pytest.mark.parametrize("name", list(OPTIONS))
@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_short_rows_share_a_program_with_every_option(name, dtype, monkeypatch):
    """``tuned(tile=256)``: rows of 45 steps (64 lanes each) four to a program, the last program holding one row
    and three lanes' worth of rows past the last (they read and write nothing)."""
    calls = record_launches(monkeypatch)
    with triton_backend.tuned(tile=256):
        check(tensors(build(11, (5, 45), OPTIONS[name]), DTYPES[dtype]))
    (args, kwargs), = calls
    assert (kwargs["ROWS"], kwargs["BLOCK"], kwargs["MODE"], kwargs["num_warps"]) == (4, 256, 0, 1)


@pytest.mark.parametrize("length, rows, tile, held", [(1, 99, 16, (16, 1)), (16, 99, 16, (1, 16)),
                                                      (17, 99, 64, (2, 32)), (128, 38400, 1024, (8, 128)),
                                                      (129, 99, 1024, (4, 256)), (600, 99, 1024, (1, 1024)),
                                                      (5, 99, None, (1, 8)), (32, 3, 1024, (4, 32)),
                                                      (32, 1, 1024, (1, 32))])
def test_a_tile_holds_the_rows_that_fit_it_and_no_more_than_there_are(length, rows, tile, held):
    from gae_xp.backends import _triton_config

    assert _triton_config.rows_per_program(length, rows, tile) == held


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_tile_of_rows_with_packed_sequences_or_chunks_is_a_program_a_row(dtype, monkeypatch):
    """Packed sequences (a program per sequence) and rows cut into chunks (two launches) keep one row a program."""
    monkeypatch.setattr(_triton_launch, "_multiprocessors", lambda device: 64)
    case = tensors(build(2, (2, 40), OPTIONS["everything"]), dtype)
    calls = record_launches(monkeypatch)
    with triton_backend.tuned(tile=1024):
        check({k: v for k, v in case.items() if k != "bootstrap_value"}, cu_seqlens=[0, 15, 40])
        check(case)
    with triton_backend.tuned(tile=1024, block=16):
        check(tensors(build(2, (1, 40), OPTIONS["holes"]), dtype))
    assert [kwargs["ROWS"] for _, kwargs in calls] == [1, 2, 1, 1]  # two rows: a program of two spans
    assert [kwargs["MODE"] for _, kwargs in calls] == [0, 0, 1, 2]


def test_an_incoming_carry_enters_each_row_of_a_tile(monkeypatch):
    from gae_xp._prepare import prepare

    case = tensors(build(12, (6, 30), OPTIONS["holes+fill"]), torch.float64)
    p = prepare(**case, backend="triton").problem
    piece = p.replace(carry=torch.from_numpy(np.random.default_rng(1).standard_normal((6, 1))))
    calls = record_launches(monkeypatch)
    with triton_backend.tuned(tile=128):
        got = backends.load("triton").gae(piece, chunk_size=None)
    assert [kwargs["ROWS"] for _, kwargs in calls] == [4]
    want = backends.load("numba").gae(piece, chunk_size=None)
    for ours, theirs in zip(got, want):
        xp_assert_close(ours, theirs.numpy(), like=torch.zeros((), dtype=torch.float64))


@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")  # the interpreter's NumPy on NaN
def test_no_row_of_a_tile_reaches_another():
    """A row of infinities, a NaN row and a row whose carry-free end meets them: each row is the loop's own."""
    rng = np.random.default_rng(4)
    rewards, values = rng.standard_normal((6, 12)), rng.standard_normal((6, 12))
    rewards[1] = np.inf
    values[3, 0] = np.nan
    mask = rng.random((6, 12)) > 0.3
    given = {"rewards": torch.from_numpy(rewards), "values": torch.from_numpy(values),
             "mask": torch.from_numpy(mask)}
    with triton_backend.tuned(tile=64):
        advantages, returns = gae_xp.gae(**given, backend="triton")
    want = reference.gae_loop(rewards=rewards, values=values, mask=mask)
    for row in (0, 2, 4, 5):
        assert np.isfinite(advantages[row].numpy()).all()
        xp_assert_close(advantages[row], want[0][row], like=torch.zeros((), dtype=torch.float64))
        xp_assert_close(returns[row], want[1][row], like=torch.zeros((), dtype=torch.float64))


# ------------------------------------------------------------------------------------------------ layouts


def test_time_on_the_first_axis_and_a_batch_of_rank_three():
    given = tensors(build(4, (20, 2, 3, 2), OPTIONS["everything"], axis=0), torch.float64)
    check(given, axis=0)


def test_strided_transposed_and_broadcast_inputs_are_read_in_place(monkeypatch):
    """Every-other-row slices, a time-major tensor transposed, a per-step gamma broadcast from (T,): no copies."""
    case = tensors(build(6, (4, 30), OPTIONS["everything"]), torch.float64)
    wide = {name: torch.cat([value, value], dim=0)[::2] if torch.is_tensor(value) and value.dim() == 2
            and value.shape == (4, 30) else value for name, value in case.items()}
    wide["values"] = case["values"].t().contiguous().t()
    calls = record_launches(monkeypatch)
    check(wide)
    (args, _), = calls
    pointers = {a.data_ptr() for a in args if torch.is_tensor(a)}
    assert wide["rewards"].data_ptr() in pointers and wide["values"].data_ptr() in pointers
    assert _launch_flag(calls, "CONTIGUOUS") is False  # the transposed values step along time by 4


def test_unmergeable_batch_axes_are_launched_a_slice_at_a_time(monkeypatch):
    base = tensors(build(8, (3, 4, 5, 12), OPTIONS["dones+next_values"]), torch.float64)
    given = {name: value.permute(1, 0, 2, 3) if torch.is_tensor(value) else value for name, value in base.items()}
    calls = record_launches(monkeypatch)
    check(given)
    assert len(calls) == 4  # the first axis (4) iterated; the other two fold


def test_time_strided_inputs():
    case = tensors(build(9, (2, 60), OPTIONS["everything"]), torch.float64)
    given = {name: value[:, ::2] if torch.is_tensor(value) and value.shape[-1] == 60 else value
             for name, value in case.items()}
    check(given)


def test_one_step_and_no_rows():
    check(tensors(build(1, (3, 1), OPTIONS["everything"]), torch.float64))
    advantages, returns = gae_xp.gae(torch.zeros((0, 5)), torch.zeros((0, 5)), backend="triton")
    assert advantages.shape == (0, 5) and returns.shape == (0, 5)


# ------------------------------------------------------------------------------------------------ the property


@settings(max_examples=12, deadline=None)
@given(data=st.data())
def test_any_options_shapes_strides_and_dtypes(data):
    draw = data.draw
    rows = draw(st.lists(st.integers(1, 3), min_size=0, max_size=2), label="batch")
    length = draw(st.integers(1, 70), label="T")
    options = {"dones": draw(st.sampled_from([0.0, 0.2])), "holes": draw(st.sampled_from([0.0, 0.3])),
               "padding": draw(st.sampled_from([0, 3])), "per_step_gamma": draw(st.booleans()),
               "per_row_lam": draw(st.booleans()), "bootstrap": draw(st.booleans()),
               "next_values": draw(st.booleans())}
    options["bootstrap"] = options["bootstrap"] and not options["next_values"]  # next_values holds every V'
    critic = draw(st.sampled_from(["none", "float", "per_step"]))
    if critic == "float":
        options["critic_lam"] = 0.8
    elif critic == "per_step":
        options["per_step_critic_lam"] = True
    options["padding"] = min(options["padding"], length)
    if draw(st.booleans()):
        options["fill_masked"] = True
    dtype = DTYPES[draw(st.sampled_from(["float64", "float32", "bfloat16"]))]
    case = tensors(build(draw(st.integers(0, 2**16)), (*rows, length), options), dtype)
    if draw(st.booleans(), label="time-strided"):
        case = {name: torch.repeat_interleave(value, 2, dim=-1)[..., ::2]
                if torch.is_tensor(value) and value.shape[-1:] == (length,) and value.dim() == len(rows) + 1
                else value for name, value in case.items()}
    block = draw(st.sampled_from([None, 16]), label="block")
    tile = draw(st.sampled_from([None, 64, 256]), label="tile")
    with triton_backend.tuned(block=block, tile=tile):
        packed = draw(st.booleans(), label="packed") and length > 2 and not options.get("bootstrap")
        if packed:
            cut = draw(st.integers(0, length))
            check(case, cu_seqlens=[0, cut, cut, length])
        else:
            check(case)


# ------------------------------------------------------------------------------------------------ exact cuts


@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")  # the interpreter's NumPy on NaN
def test_nan_and_inf_in_masked_slots_and_behind_cuts_do_not_leak():
    rng = np.random.default_rng(3)
    shape = (2, 40)
    case = build(3, shape, {"holes": 0.3, "dones": 0.1, "next_values": True, "per_step_critic_lam": True})
    for name in ("rewards", "values", "next_values"):
        case[name][~case["mask"]] = rng.choice([np.nan, np.inf, -np.inf], size=int((~case["mask"]).sum()))
    ended = case["terminated"] & case["mask"]
    case["next_values"][ended] = np.nan  # a terminated step does not bootstrap
    steps = np.arange(shape[1])
    behind = np.roll(ended, 1, axis=1) & (steps > 0)  # the step after a terminated one, when real
    case["values"][behind & case["mask"]] = np.inf  # crosses nothing: the terminated step before cuts it
    for fill in (False, True):
        advantages, returns = check(tensors(case, torch.float64), fill_masked=fill)
        if not fill:
            assert torch.isfinite(advantages[torch.from_numpy(~case["mask"])]).all()
    # and the same under chunks
    with triton_backend.tuned(block=16):
        check(tensors(case, torch.float32))


def test_a_block_whose_plain_scan_meets_an_inf_behind_a_cut_is_scanned_again_exactly():
    # blocks of 16 over 64 steps, walked from the last. The bootstrap value (inf) makes the last step's advantage inf,
    # and step 62 is truncated: 0 * inf in the plain scan of the first block walked. An inf reward after a terminated
    # step (38) is 0 * inf in its block [32, 48); a later inf reward (50) makes the advantage carried into that block
    # inf, 0 * inf again at the steps before the cut.
    rewards = torch.linspace(-1.0, 1.0, 64, dtype=torch.float32).reshape(1, 64)
    values = torch.linspace(0.5, -0.5, 64, dtype=torch.float32).reshape(1, 64)
    rewards[0, 38] = rewards[0, 50] = float("inf")
    terminated = torch.zeros((1, 64), dtype=torch.bool)
    terminated[0, 37] = True
    truncated = torch.zeros((1, 64), dtype=torch.bool)
    truncated[0, 62] = True
    with triton_backend.tuned(block=16, chunks=1):
        advantages, _ = check({"rewards": rewards, "values": values, "terminated": terminated, "truncated": truncated,
                               "bootstrap_value": torch.tensor([float("inf")])}, truncated_bootstrap="next_step")
    finite = torch.isfinite(advantages[0])
    assert finite[:38].all() and not finite[38:51].any() and finite[51:63].all() and not finite[63]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
@pytest.mark.parametrize("chunks", [1, None], ids=["one program a row", "chunks"])
def test_blocks_without_masked_steps_and_blocks_with_them_share_the_value_chain(dtype, chunks):
    # blocks of 16 over 100 steps: a trailing padding (steps 90 on), a hole at 37-40 and one at step 15 (the last of
    # its block), so that blocks of real steps only (read without the chain's scan) and holed ones alternate, and V at
    # the next real step crosses from each kind into the other; with and without terminated steps
    case = build(5, (3, 100), {"dones": 0.05})
    mask = np.ones((3, 100), dtype=bool)
    mask[:, 90:] = False
    mask[:, 37:41] = False
    mask[:, 15] = False
    mask[1, 47] = False
    case["mask"] = mask
    for name in ("rewards", "values"):
        case[name][~mask] = np.nan  # a masked slot's numbers are never read into a real step's
    with triton_backend.tuned(block=16, chunks=chunks):
        check(tensors(case, dtype))
        check(tensors({name: value for name, value in case.items() if name != "terminated"}, dtype))


def test_a_strided_bootstrap_of_packed_sequences_is_addressed_in_64_bits(tmp_path):
    # the bootstrap values of five packed sequences, 2**29 floats apart in a sparse file (a view, not copied): the
    # fifth is 2**31 elements past the first, which a 32-bit product of sequence and stride would wrap
    path = tmp_path / "sparse.bin"
    count = 4 * 2**29 + 1
    with open(path, "wb") as file:
        file.truncate(count * 4)
    table = torch.from_file(str(path), shared=True, size=count, dtype=torch.float32)
    bootstrap = table.as_strided((5,), (2**29,))
    bootstrap[:] = torch.tensor([1.0, 2.0, 3.0, 4.0, 5.0])
    advantages, _ = gae_xp.gae(torch.zeros(10), torch.zeros(10), bootstrap_value=bootstrap,
                               cu_seqlens=[0, 2, 4, 6, 8, 10], gamma=1.0, lam=1.0, backend="triton")
    assert advantages.tolist() == [1.0, 1.0, 2.0, 2.0, 3.0, 3.0, 4.0, 4.0, 5.0, 5.0]


def test_a_16_bit_row_takes_the_bootstrap_value_unrounded():
    # bfloat16 rows are computed in float32: the bootstrap value enters as a float32, not rounded to bfloat16
    # (1.003 would be 1.0 there, and the last advantage 0 instead of 0.003)
    rewards = torch.tensor([[0.0, 0.0, -1.0]], dtype=torch.bfloat16)
    advantages, _ = gae_xp.gae(rewards, torch.zeros_like(rewards), bootstrap_value=1.003, gamma=1.0, lam=1.0,
                               backend="triton")
    assert advantages.dtype == torch.bfloat16
    assert abs(float(advantages[0, -1]) - 0.003) < 1e-4


def test_a_zero_coefficient_cuts_exactly():
    rewards = torch.tensor([[1.0, 2.0, 3.0, 4.0]], dtype=torch.float64)
    values = torch.tensor([[0.0, 0.0, np.nan, 0.0]], dtype=torch.float64)
    lam = torch.tensor([[1.0, 0.0, 1.0, 1.0]], dtype=torch.float64)
    advantages, _ = gae_xp.gae(rewards, values, gamma=1.0, lam=lam, backend="triton", next_values=rewards * 0)
    assert torch.isfinite(advantages[0, :2]).all() and torch.isnan(advantages[0, 2])


# ------------------------------------------------------------------------------------------------ the contract


def test_inputs_are_not_mutated_and_outputs_share_no_memory():
    given = tensors(build(2, (3, 25), OPTIONS["everything"]), torch.float32)
    before = {name: value.clone() for name, value in given.items() if torch.is_tensor(value)}
    advantages, returns = check(given)
    for name, value in before.items():
        assert torch.equal(given[name], value) or torch.allclose(given[name], value, equal_nan=True), name
    outputs = (advantages, returns)
    for out in outputs:
        for value in list(given.values()) + [o for o in outputs if o is not out]:
            if torch.is_tensor(value):
                assert not _overlaps(out, value)


def test_a_repeated_layout_reuses_its_plan_with_the_new_arrays_and_numbers():
    """The second call of a layout takes the kept plan (no new entry), and its own data, gamma and lam."""
    first = tensors(build(1, (3, 20), OPTIONS["dones+next_values"]), torch.float32)
    check(first)
    plans = dict(_triton_launch._PLANS)
    second = tensors(build(2, (3, 20), {**OPTIONS["dones+next_values"], "gamma": 0.5, "lam": 0.25}),
                     torch.float32)
    check(second)
    assert _triton_launch._PLANS.keys() == plans.keys()
    assert all(_triton_launch._PLANS[key] is plan for key, plan in plans.items())
    for plan in plans.values():  # a plan keeps no array of a call
        assert not any(torch.is_tensor(value) for value in vars(plan).values())


def test_auto_never_chooses_the_interpreter():
    sample = torch.zeros((2, 3))
    assert backends.select("auto", None, [sample]).name == "numba"
    assert backends.select("triton", None, [sample]).name == "triton"


def test_it_refuses_what_it_does_not_serve():
    reason = backends.load("triton").unavailable_reason(None, [np.zeros((2, 3))], forced=True)
    assert "torch" in reason
    with pytest.raises(ValueError, match="backend='triton' cannot run"):
        gae_xp.gae(np.zeros((2, 3)), np.zeros((2, 3)), backend="triton")
    with pytest.raises(ValueError, match="backend='triton' cannot run.*require grad"):
        gae_xp.gae(torch.zeros((2, 3), requires_grad=True), torch.zeros((2, 3)), backend="triton")
    with pytest.raises(ValueError, match="tuned"):
        with triton_backend.tuned(blocks=16):
            pass


def test_discounted_cumsum_runs_on_the_triton_scan():
    """``backend="triton"`` serves the scan too (``_triton_scan.scan``), not only ``gae()``."""
    x = torch.arange(6.0, dtype=torch.float64).reshape(2, 3)
    got = gae_xp.discounted_cumsum(x, 0.5, backend="triton")
    xp_assert_close(got, reference.discounted_returns_loop(x.numpy(), gamma=0.5), like=x)


def test_tuning_variants_name_the_knobs():
    assert next(iter(triton_backend.TUNING_VARIANTS)) == "default"
    for settings_ in triton_backend.TUNING_VARIANTS.values():
        assert set(settings_) == {"block", "num_warps", "num_stages", "chunks", "tile"}
        with triton_backend.tuned(**settings_):
            pass


# ------------------------------------------------------------------------------------------------ compiling


def specialisation(args, kwargs) -> tuple:
    """The key under which Triton's launcher (for a CUDA sm_90 target) would look this launch's kernel up."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import make_backend
    from triton.runtime.jit import JITFunction, create_function_from_signature

    from gae_xp.backends import _triton_gae

    kernel = JITFunction(_triton_gae.gae_kernel.fn, do_not_specialize=_triton_gae._RUNTIME)
    binder = create_function_from_signature(kernel.signature, kernel.params, make_backend(GPUTarget("cuda", 90, 32)))
    _, specialization, options = binder(*args, **kwargs)
    return tuple(map(str, specialization)), tuple(sorted(options.items()))


@pytest.mark.parametrize("name", ["plain", "everything"])
def test_a_new_length_or_batch_compiles_no_new_kernel(name, monkeypatch):
    """Within a row of the heuristic's table (T <= 128 here), the kernel is compiled once for rows that start on
    16-byte boundaries (T a multiple of 4 floats) and once for the others, whatever T and B."""
    calls = record_launches(monkeypatch)
    aligned, unaligned = ((3, 40), (5, 64), (2, 120), (7, 100)), ((3, 37), (1, 45), (4, 127))
    for rows, length in aligned + unaligned:
        check(tensors(build(rows, (rows, length), OPTIONS[name]), torch.float32))
    keys = [specialisation(*call) for call in calls]
    assert len(set(keys[:len(aligned)])) == 1 and len(set(keys[len(aligned):])) == 1
    assert keys[0] != keys[-1] and all(kwargs["ALIGN"] == (4 if index < len(aligned) else 1)
                                       for index, (_, kwargs) in enumerate(calls))
    # the key does see what a kernel is specialised on
    check(tensors(build(1, (2, 40), OPTIONS[name]), torch.float64))
    assert specialisation(*calls[-1]) not in set(keys)


#: Compiles the kernel for sm_90 in a process of its own (without the interpreter) and prints its PTX.
PTX_SCRIPT = """
import sys
import triton
import triton.language as tl
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from gae_xp.backends._triton_gae import gae_kernel as kernel
options = dict(HAS_NEXT=False, HAS_TERMINATED=True, HAS_TRUNCATED=False, HAS_MASK=True, GAMMA=1, LAM=1, CRITIC=0,
               HAS_CARRY=False, HAS_OFFSETS=False, FILL=False, MODE=int(sys.argv[1]), CONTIGUOUS=True,
               DTYPE=tl.float32, BLOCK=1024, CHUNKS=256, ALIGN=4, TWO_AXES=False, RARE_PATHS=True,
               STAGES=int(sys.argv[2]), ROWS=1)
flags, floats = ("terminated", "truncated", "mask"), ("offsets",)
signature = {}
for p in kernel.params:
    if p.is_constexpr:
        signature[p.name] = "constexpr"
    elif p.name in flags:
        signature[p.name] = "*u8"
    elif p.name == "offsets":
        signature[p.name] = "*i64"
    elif p.name in kernel.arg_names[:kernel.arg_names.index("length")]:
        signature[p.name] = "*fp32"
    else:
        signature[p.name] = "fp64" if p.name.endswith("_value") else "i64"
constants = {(kernel.arg_names.index(name),): value for name, value in options.items()}
aligned = {(i,): [["tt.divisibility", 16]] for i, name in enumerate(kernel.arg_names)
           if signature[name].startswith("*")}
compiled = triton.compile(ASTSource(kernel, signature, constants, aligned), target=GPUTarget("cuda", 90, 32),
                          options={"num_warps": 4, "num_stages": int(sys.argv[2])})
print(compiled.asm["ptx"])
"""


@pytest.mark.parametrize("stages", [1, 3])
@pytest.mark.parametrize("mode", [0, 2])
def test_the_kernels_compile_for_sm90_with_16_byte_accesses(mode, stages):
    """The kernel as Triton compiles it for an H200 (sm_90), without a GPU (terminated and a holed mask, float32,
    aligned rows, one launch and the chunks' final pass): 16-byte loads (into registers, or with the walk over
    the blocks pipelined, ``STAGES`` 3, 16-byte copies into shared memory and no load of the rows into registers)
    and stores, no local memory."""
    import re
    import subprocess
    import sys

    env = {name: value for name, value in os.environ.items() if name != "TRITON_INTERPRET"}
    done = subprocess.run([sys.executable, "-c", PTX_SCRIPT, str(mode), str(stages)], capture_output=True, text=True,
                          env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    ptx = done.stdout
    copies = re.findall(r"cp\.async\.cg\.shared\.global\s*\[[^]]*\],\s*\[[^]]*\],\s*0x10", ptx)
    if stages == 1:
        assert "ld.global.v4" in ptx and not copies
    else:
        assert copies and "ld.global.v4" not in ptx
    assert "st.global.v4" in ptx
    assert "ld.local" not in ptx and "st.local" not in ptx


# ------------------------------------------------------------------------------------------------ recording


def _launch_flag(calls, name):
    values = {kwargs[name] for _, kwargs in calls}
    assert len(values) == 1
    return values.pop()


def _overlaps(a, b) -> bool:
    if a.numel() == 0 or b.numel() == 0:
        return False
    a_start, b_start = a.data_ptr(), b.data_ptr()
    a_end = a_start + a.untyped_storage().nbytes()
    b_end = b_start + b.untyped_storage().nbytes()
    return a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr() or (a_start < b_end and b_start < a_end)


def test_settings_that_cannot_run_fail_as_the_settings_not_the_route(monkeypatch):
    """Within ``tuned()``, a launch that fails (e.g. Triton's OutOfResources for a block too large) raises
    RuntimeError naming the settings, and the route is not remembered as failed: the next variant still runs."""
    from gae_xp.backends import _fallback

    compiler = types.ModuleType("triton.runtime.errors")
    exec("def fail(*args):\n    raise RuntimeError('out of resources: shared memory')\n", compiler.__dict__)
    monkeypatch.setattr(_triton_launch, "solve", compiler.fail)
    r, v = torch.ones(2, 8), torch.zeros(2, 8)
    with triton_backend.tuned(block=4096, num_warps=16):
        with pytest.raises(RuntimeError, match=r"tuned\(.*'block': 4096.*out of resources"):
            gae_xp.gae(r, v, backend="triton")
    assert _fallback.broken("triton") is None
