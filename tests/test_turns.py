"""Turn-level GAE (``gae_xp.turn_gae``, ``gae_xp.turn_counts``) against a per-token loop of the contract, in float64.

The oracle below groups the real tokens of every row (of every sequence) into
turns one token at a time and runs the turn recurrence one turn at a time; it
shares no code with the implementation. AReaL's own tests, restated, are in
``tests/conformance/test_areal_turns.py``.
"""

from __future__ import annotations

import numpy as np
import pytest
from conftest import load_target
from helpers import converted, like, to_numpy, xp_assert_close
from hypothesis import given
from hypothesis import strategies as st

import gae_xp
from gae_xp import backends


def turn_gae_loop(rewards, values, turn_ids, *, gamma=0.99, lam=0.95, critic_lam=None, mask=None,
                  bootstrap_value=None, cu_seqlens=None):
    """The contract one token and one turn at a time, NumPy float64, time last. Returns (advantages, returns)."""
    if critic_lam is not None:  # the returns: the same recurrence with critic_lam
        advantages, _ = turn_gae_loop(rewards, values, turn_ids, gamma=gamma, lam=lam, mask=mask,
                                      bootstrap_value=bootstrap_value, cu_seqlens=cu_seqlens)
        _, returns = turn_gae_loop(rewards, values, turn_ids, gamma=gamma, lam=critic_lam, mask=mask,
                                   bootstrap_value=bootstrap_value, cu_seqlens=cu_seqlens)
        return advantages, returns
    r = np.asarray(rewards, dtype=np.float64)
    shape = r.shape
    length = shape[-1]
    rows = r.reshape(-1, length)
    v = np.asarray(values, dtype=np.float64).reshape(-1, length)
    ids = np.asarray(turn_ids).reshape(-1, length)
    real = (ids >= 0) if mask is None else np.asarray(mask).reshape(-1, length)
    g = np.broadcast_to(np.asarray(gamma, dtype=np.float64), shape).reshape(-1, length)
    lm = np.broadcast_to(np.asarray(lam, dtype=np.float64), shape).reshape(-1, length)
    offsets = [0, length] if cu_seqlens is None else [int(o) for o in cu_seqlens]
    count = len(offsets) - 1
    boot = np.zeros(()) if bootstrap_value is None else np.asarray(bootstrap_value, dtype=np.float64)
    boot = np.broadcast_to(boot if cu_seqlens is not None else boot[..., None], shape[:-1] + (count,))
    boot = boot.reshape(-1, count)
    advantages, returns = np.zeros(rows.shape), np.zeros(rows.shape)
    for b in range(rows.shape[0]):
        for j in range(count):
            turns = []
            for t in range(offsets[j], offsets[j + 1]):
                if not real[b, t]:
                    continue
                if turns and ids[b, t] == ids[b, turns[-1][-1]]:
                    turns[-1].append(t)
                else:
                    turns.append([t])
            following, next_value = 0.0, boot[b, j]
            for tokens in reversed(turns):
                first = tokens[0]
                reward = 0.0
                for t in tokens:
                    reward += rows[b, t]
                carry = g[b, first] * lm[b, first]
                advantage = reward + g[b, first] * next_value - v[b, first] + (carry * following if carry else 0.0)
                for t in tokens:
                    advantages[b, t] = advantage
                    returns[b, t] = advantage + v[b, first]
                following, next_value = advantage, v[b, first]
    return advantages.reshape(shape), returns.reshape(shape)


def random_offsets(rng, count, total):
    inner = np.sort(rng.choice(np.arange(1, total), size=count - 1, replace=False))
    return np.concatenate([[0], inner, [total]]).astype(np.int64)


def make_turns(rng, shape, *, new_turn=0.2, holes=0.3, sequences=None, given_mask=True, per_row_lam=False,
               per_step_gamma=False, bootstrap=True):
    """A case for turn_gae: turn ids that rise along every row (restarting at 0 in each packed sequence, skipping
    ids now and then), masked runs and holes, a turn split by a hole now and then, garbage ids where masked."""
    length = shape[-1]
    steps = rng.random(shape) < new_turn
    ids = np.cumsum(steps * rng.integers(1, 3, shape), axis=-1)
    offsets = None
    if sequences is not None:
        offsets = random_offsets(rng, sequences, length)
        starts = np.repeat(offsets[:-1], np.diff(offsets))
        ids = ids - np.take(ids, starts, axis=-1)
    mask = rng.random(shape) >= holes
    case = {"rewards": rng.standard_normal(shape), "values": rng.standard_normal(shape), "gamma": 0.9, "lam": 0.8}
    if given_mask:
        case["turn_ids"] = np.where(mask, ids, rng.integers(-3, 50, shape))
        case["mask"] = mask
    else:
        case["turn_ids"] = np.where(mask, ids, -1)
    if per_row_lam:
        case["lam"] = rng.uniform(0.0, 1.0, shape[:-1] + (1,))
    if per_step_gamma:
        case["gamma"] = rng.uniform(0.5, 1.0, shape)
    if bootstrap:
        case["bootstrap_value"] = rng.standard_normal(shape[:-1] + ((sequences,) if sequences else ()))
    if offsets is not None:
        case["cu_seqlens"] = offsets
    return case


#: name -> (make_turns options, dtype)
LAYOUTS = {
    "padded": ({"shape": (3, 40)}, "float64"),
    "padded, ids mark the turns": ({"shape": (3, 40), "given_mask": False}, "float32"),
    "padded, per-row lam, per-step gamma": ({"shape": (2, 3, 30), "per_row_lam": True, "per_step_gamma": True},
                                            "float32"),
    "packed": ({"shape": (120,), "sequences": 6}, "float64"),
    "packed rows": ({"shape": (2, 90), "sequences": 5, "per_step_gamma": True}, "float32"),
    "one turn per row": ({"shape": (4, 25), "new_turn": 0.0, "holes": 0.1}, "float64"),
    "every token a turn": ({"shape": (2, 30), "new_turn": 1.0, "holes": 0.0}, "float32"),
}


@pytest.mark.parametrize("layout", LAYOUTS)
def test_turn_gae_equals_the_loop(library, layout):
    options, dtype = LAYOUTS[layout]
    case = make_turns(np.random.default_rng(list(LAYOUTS).index(layout)), **options)
    want = turn_gae_loop(**case)
    xp = library.xp
    got = gae_xp.turn_gae(**converted(library, case, getattr(xp, dtype)))
    for actual, desired in zip(got, want):
        xp_assert_close(actual, desired, like=like(library), dtype=getattr(xp, dtype))


def test_turn_gae_on_every_backend(target, backend):
    """Each backend that takes packed sequences runs the two scans inside; the others say they cannot."""
    library = target.library
    case = make_turns(np.random.default_rng(7), (2, 60), sequences=3, per_row_lam=True)
    arrays = converted(library, case)
    if not backends.load(backend).segments:
        with pytest.raises(ValueError, match="packed sequences"):
            gae_xp.turn_gae(**arrays, backend=backend)
        return
    for actual, desired in zip(gae_xp.turn_gae(**arrays, backend=backend), turn_gae_loop(**case)):
        xp_assert_close(actual, desired, like=like(library))


def test_auto_runs_both_scans_on_the_numba_kernel(monkeypatch):
    pytest.importorskip("numba")
    kernel = backends.load("numba")
    calls = []
    original = kernel.gae
    monkeypatch.setattr(kernel, "gae", lambda problem, **options: calls.append(problem) or original(problem, **options))
    case = make_turns(np.random.default_rng(3), (120,), sequences=4)
    gae_xp.turn_gae(**case)
    assert len(calls) == 2  # the reward sums and the scan over turns


@given(st.data())
def test_turn_gae_property(data):
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
    batch = data.draw(st.sampled_from([(), (1,), (3,), (2, 2)]))
    length = data.draw(st.integers(1, 50))
    sequences = data.draw(st.one_of(st.none(), st.integers(1, length)))
    case = make_turns(rng, batch + (length,), new_turn=data.draw(st.floats(0.0, 1.0)),
                      holes=data.draw(st.floats(0.0, 1.0)), sequences=sequences,
                      given_mask=data.draw(st.booleans()), per_row_lam=data.draw(st.booleans()) and bool(batch),
                      per_step_gamma=data.draw(st.booleans()), bootstrap=data.draw(st.booleans()))
    case["gamma"] = data.draw(st.sampled_from([0.0, 0.5, 1.0, case["gamma"]]))
    for actual, desired in zip(gae_xp.turn_gae(**case), turn_gae_loop(**case)):
        xp_assert_close(actual, desired, like=np.array(0.0))


def test_time_axis_first(library):
    case = make_turns(np.random.default_rng(11), (3, 30), per_row_lam=True, per_step_gamma=True)
    want = turn_gae_loop(**case)
    moved = {key: (np.moveaxis(value, -1, 0) if isinstance(value, np.ndarray) and value.ndim == 2 else value)
             for key, value in case.items()}
    got = gae_xp.turn_gae(**converted(library, moved), axis=0)
    for actual, desired in zip(got, want):
        xp_assert_close(actual, np.moveaxis(desired, -1, 0), like=like(library))


def test_decoupled_critic_lam(library):
    """VAPO's decoupled GAE on turns: advantages at lam, returns at critic_lam (per row here)."""
    case = make_turns(np.random.default_rng(12), (3, 40), per_row_lam=True)
    case["critic_lam"] = np.array([[1.0], [0.5], [0.0]])
    for actual, desired in zip(gae_xp.turn_gae(**converted(library, case)), turn_gae_loop(**case)):
        xp_assert_close(actual, desired, like=like(library))
    without = turn_gae_loop(**{key: value for key, value in case.items() if key != "critic_lam"})
    np.testing.assert_array_equal(turn_gae_loop(**case)[0], without[0])


def test_empty_sequences_and_host_offsets(library):
    """Repeated offsets (empty sequences, as AReaL packs them) and offsets in host memory (a list)."""
    rng = np.random.default_rng(13)
    case = make_turns(rng, (2, 30), sequences=3)
    offsets = [0, 0, int(case["cu_seqlens"][1]), int(case["cu_seqlens"][1]), int(case["cu_seqlens"][2]), 30, 30]
    case["cu_seqlens"] = np.array(offsets)
    case["bootstrap_value"] = rng.standard_normal((2, len(offsets) - 1))
    want = turn_gae_loop(**case)
    arrays = converted(library, case)
    for cu_seqlens in (arrays["cu_seqlens"], offsets):
        got = gae_xp.turn_gae(**{**arrays, "cu_seqlens": cu_seqlens})
        for actual, desired in zip(got, want):
            xp_assert_close(actual, desired, like=like(library))
    counts = to_numpy(gae_xp.turn_counts(arrays["turn_ids"], mask=arrays["mask"], cu_seqlens=offsets))
    assert counts.shape == (2, 6) and (counts[:, [0, 2, 5]] == 0).all()


def test_masked_nan_does_not_leak_and_a_real_one_stays_in_its_row(library):
    rewards = np.array([[np.nan, 1.0, 2.0, np.inf, 3.0, 4.0], [0.0, 1.0, np.nan, 2.0, 3.0, 1.0]])
    values = np.array([[np.nan, 0.5, 0.5, np.nan, 0.5, 0.5], [0.1, 0.2, 0.3, 0.4, 0.5, 0.6]])
    mask = np.array([[False, True, True, False, True, True], [True, True, True, True, True, True]])
    turn_ids = np.array([[-1, 0, 0, -1, 1, 1], [0, 0, 1, 1, 2, 2]])
    case = {"rewards": rewards, "values": values, "turn_ids": turn_ids, "mask": mask, "gamma": 0.9, "lam": 0.8}
    want = turn_gae_loop(**case)
    assert np.isfinite(want[0][0]).all() and np.isnan(want[0][1, :4]).all() and np.isfinite(want[0][1, 4:]).all()
    for actual, desired in zip(gae_xp.turn_gae(**converted(library, case)), want):
        xp_assert_close(actual, desired, like=like(library))


@pytest.mark.parametrize("dtype, big", [("float32", 3e38), ("float16", 65504.0)])
def test_masked_extremes_are_absent(library, dtype, big):
    """Masked tokens holding the dtype's extremes (r = big beside V = -big) change nothing (issue 20, item 1)."""
    if not hasattr(library.xp, dtype):
        pytest.skip(f"{library.name} has no {dtype}")
    rng = np.random.default_rng(14)
    case = make_turns(rng, (2, 40), holes=0.5)
    signs = rng.choice([-1.0, 1.0], size=(2, 40))
    extreme = dict(case, rewards=np.where(case["mask"], case["rewards"], big * signs),
                   values=np.where(case["mask"], case["values"], -big * signs))
    arrays = converted(library, extreme, getattr(library.xp, dtype))
    rounded = {key: to_numpy(arrays[key]).astype(np.float64) if key in ("rewards", "values", "bootstrap_value")
               else value for key, value in case.items()}
    rounded = dict(rounded, rewards=np.where(case["mask"], rounded["rewards"], 0.0),
                   values=np.where(case["mask"], rounded["values"], 0.0))
    for actual, desired in zip(gae_xp.turn_gae(**arrays), turn_gae_loop(**rounded)):
        xp_assert_close(actual, desired, like=arrays["rewards"])


def test_edge_shapes(library):
    xp = library.xp
    for shape in [(0,), (3, 0), (0, 5), (1,), (2, 1)]:
        zeros = library.asarray(np.zeros(shape))
        ids = library.asarray(np.zeros(shape, dtype=np.int64))
        for out in gae_xp.turn_gae(zeros, zeros, ids):
            assert tuple(out.shape) == shape and out.dtype == xp.float64
    everything_masked = gae_xp.turn_gae(library.asarray(np.ones((2, 4))), library.asarray(np.ones((2, 4))),
                                        library.asarray(np.full((2, 4), -1)))
    for out in everything_masked:
        xp_assert_close(out, np.zeros((2, 4)), like=like(library))


@pytest.mark.parametrize("name, dtype", [("numpy", "float16"), ("torch:cpu", "bfloat16"), ("jax:cpu", "float16")])
def test_low_precision_is_computed_in_float32(name, dtype):
    library = load_target(f"{name}/auto").library
    case = make_turns(np.random.default_rng(5), (2, 30), sequences=None)
    arrays = converted(library, case, getattr(library.xp, dtype))
    rounded = {key: to_numpy(arrays[key]).astype(np.float64) if key in ("rewards", "values", "bootstrap_value")
               else value for key, value in case.items()}
    for actual, desired in zip(gae_xp.turn_gae(**arrays), turn_gae_loop(**rounded)):
        xp_assert_close(actual, desired, like=arrays["rewards"])


def test_integer_rewards_give_the_default_float(library):
    xp = library.xp
    case = make_turns(np.random.default_rng(6), (2, 20))
    counts = np.arange(40).reshape(2, 20)
    default = xp.__array_namespace_info__().default_dtypes(device=library.device)["real floating"]
    got = gae_xp.turn_gae(library.asarray(counts), library.asarray(counts * 0), library.asarray(case["turn_ids"]),
                          mask=library.asarray(case["mask"]))
    want = turn_gae_loop(counts, counts * 0.0, case["turn_ids"], mask=case["mask"])
    for actual, desired in zip(got, want):
        xp_assert_close(actual, desired, like=like(library), dtype=default)


def test_inputs_are_kept_and_outputs_are_new():
    case = make_turns(np.random.default_rng(8), (2, 30), sequences=None)
    copies = {key: value.copy() for key, value in case.items() if isinstance(value, np.ndarray)}
    outputs = gae_xp.turn_gae(**case)
    for key, value in copies.items():
        np.testing.assert_array_equal(case[key], value, err_msg=f"{key} was modified")
    for out in outputs:
        assert not any(np.shares_memory(out, value) for value in copies.values())
    assert not np.shares_memory(*outputs)
    unmasked = gae_xp.turn_gae(case["rewards"], case["values"], np.zeros((2, 30), dtype=np.int64))
    assert not any(np.shares_memory(out, case[key]) for out in unmasked for key in ("rewards", "values"))


def test_ids_may_restart_in_every_row_and_sequence_and_skip():
    """A decrease is a new trajectory's first turn where a row or sequence starts; unused ids take no step."""
    rewards = np.array([1.0, 2.0, 3.0, 4.0, 5.0, 6.0])
    values = np.array([0.5, 0.25, 1.0, 2.0, 0.0, 3.0])
    ids = np.array([3, 9, 9, 0, 0, 5])
    packed = gae_xp.turn_gae(rewards, values, ids, cu_seqlens=np.array([0, 3, 6]), gamma=0.5, lam=0.5)
    rows = gae_xp.turn_gae(rewards.reshape(2, 3), values.reshape(2, 3), ids.reshape(2, 3), gamma=0.5, lam=0.5)
    want = turn_gae_loop(rewards.reshape(2, 3), values.reshape(2, 3), ids.reshape(2, 3), gamma=0.5, lam=0.5)
    for got_packed, got_rows, desired in zip(packed, rows, want):
        np.testing.assert_allclose(got_packed, desired.reshape(-1), rtol=0, atol=1e-12)
        np.testing.assert_allclose(got_rows, desired, rtol=0, atol=1e-12)
    # row 0: turns {0} (R = 1, V = 0.5) and {1, 2} (R = 5, V = 0.25): A_1 = 5 - 0.25, A_0 = 1 + 0.5 V_1 - V_0 + 0.25 A_1
    np.testing.assert_allclose(rows[0][0], [1.0 + 0.125 - 0.5 + 0.25 * 4.75, 4.75, 4.75], rtol=0, atol=1e-12)


def test_a_hole_does_not_split_a_turn():
    rewards = np.array([[1.0, 5.0, 2.0, 3.0]])
    values = np.array([[0.5, 9.0, 7.0, 0.25]])
    advantages, returns = gae_xp.turn_gae(rewards, values, np.array([[0, -1, 0, 1]]), gamma=1.0, lam=1.0)
    # turn 0: tokens 0 and 2 (R = 3, V = 0.5); turn 1: token 3 (R = 3, V = 0.25); the hole gets 0
    np.testing.assert_array_equal(advantages, [[5.5, 0.0, 5.5, 2.75]])
    np.testing.assert_array_equal(returns, [[6.0, 0.0, 6.0, 3.0]])


# --- turn_counts ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("layout", ["padded", "packed rows"])
def test_turn_counts_count_the_turns_of_the_loop(library, layout):
    options = {"padded": {"shape": (3, 40)}, "packed rows": {"shape": (2, 90), "sequences": 5}}[layout]
    case = make_turns(np.random.default_rng(2), **options)
    offsets = case.get("cu_seqlens", np.array([0, options["shape"][-1]]))
    ids, real = case["turn_ids"], case["mask"]
    want = np.zeros(ids.shape[:-1] + (len(offsets) - 1,), dtype=np.int64)
    for row in np.ndindex(ids.shape[:-1]):
        for j in range(len(offsets) - 1):
            seen = [ids[row][t] for t in range(offsets[j], offsets[j + 1]) if real[row][t]]
            want[row + (j,)] = sum(1 for i, turn in enumerate(seen) if i == 0 or turn != seen[i - 1])
    arrays = converted(library, {key: case[key] for key in ("turn_ids", "mask", "cu_seqlens") if key in case})
    got = to_numpy(gae_xp.turn_counts(**arrays))
    assert got.shape == want.shape  # a trailing axis of one per sequence, or the time axis kept as 1
    np.testing.assert_array_equal(got, want)


def test_turn_counts_on_an_empty_time_axis(library):
    """No tokens: every row (every sequence) has 0 turns, in the shape turn_gae's inputs would give."""
    for shape, axis, options, want in [((3, 0), -1, {}, (3, 1)), ((2, 0, 4), 1, {}, (2, 1, 4)),
                                       ((0,), -1, {}, (1,)), ((0, 5), 0, {}, (1, 5)), ((0, 4), -1, {}, (0, 1)),
                                       ((3, 0), -1, {"cu_seqlens": [0, 0]}, (3, 1)),
                                       ((3, 0), -1, {"cu_seqlens": [0, 0, 0]}, (3, 2))]:
        ids = library.asarray(np.zeros(shape, dtype=np.int64))
        got = gae_xp.turn_counts(ids, axis=axis, **options)
        assert tuple(got.shape) == want, (shape, options)
        np.testing.assert_array_equal(to_numpy(got), np.zeros(want, dtype=np.int64))
        zeros = library.asarray(np.zeros(shape))
        assert tuple(gae_xp.turn_gae(zeros, zeros, ids, axis=axis, **options)[0].shape) == shape


def test_turn_counts_keep_the_time_axis():
    ids = np.array([[0, 0, 1], [-1, -1, -1]]).T  # time first
    np.testing.assert_array_equal(gae_xp.turn_counts(ids, axis=0), [[2, 0]])


# --- bad input --------------------------------------------------------------------------------------------------


def _simple():
    return {"rewards": np.zeros((2, 4)), "values": np.zeros((2, 4)), "turn_ids": np.array([[0, 0, 1, 1]] * 2)}


@pytest.mark.parametrize(("change", "error", "message"), [
    ({"turn_ids": np.zeros((2, 4))}, TypeError, "turn_ids must have an integer dtype"),
    ({"turn_ids": np.zeros((2, 3), dtype=np.int64)}, ValueError, "turn_ids must have the shape of rewards"),
    ({"turn_ids": None}, TypeError, "turn_ids must be an array"),
    ({"values": np.zeros((2, 3))}, ValueError, "values must have the shape of rewards"),
    ({"turn_ids": np.array([[0, 1, 0, 2], [0, 0, 1, 1]])}, ValueError, "must not decrease"),
    ({"turn_ids": np.array([[-1, 0, 0, 2], [0, 0, 1, 1]]), "mask": np.ones((2, 4), bool)}, ValueError,
     "at least 0 on every real token"),
    ({"mask": np.ones((2, 4))}, TypeError, "mask must have dtype bool"),
    ({"critic_lam": -0.5}, ValueError, r"critic_lam must be in \[0, 1\]"),
    ({"lam": 1.5}, ValueError, r"lam must be in \[0, 1\]"),
    ({"gamma": np.array([[0.5], [np.nan]])}, ValueError, r"gamma must hold values in \[0, 1\]"),
    ({"lam": np.ones((3, 1))}, ValueError, "lam of shape"),
    ({"lam": "0.9"}, TypeError, "lam must be a float or an array"),
    ({"bootstrap_value": np.zeros(3)}, ValueError, "bootstrap_value of shape"),
    ({"cu_seqlens": np.array([0, 2, 3])}, ValueError, "cu_seqlens must end at"),
    ({"axis": 2}, ValueError, "axis 2 is out of range"),
])
def test_bad_input_is_named(change, error, message):
    with pytest.raises(error, match=message):
        gae_xp.turn_gae(**{**_simple(), **change})


def test_a_decrease_inside_a_packed_sequence_is_refused_but_not_at_its_start():
    ids = np.array([0, 1, 0, 1])
    x = np.zeros(4)
    gae_xp.turn_gae(x, x, ids, cu_seqlens=np.array([0, 2, 4]))
    with pytest.raises(ValueError, match="must not decrease"):
        gae_xp.turn_gae(x, x, ids, cu_seqlens=np.array([0, 3, 4]))


def test_mixed_libraries_and_traced_arrays_are_refused():
    torch = pytest.importorskip("torch")
    case = _simple()
    with pytest.raises(TypeError, match="pass arrays of one library"):
        gae_xp.turn_gae(case["rewards"], torch.zeros(2, 4), case["turn_ids"])
    jax = pytest.importorskip("jax")
    with pytest.raises(ValueError, match="traced or lazy"):
        jax.jit(lambda r: gae_xp.turn_gae(r, r, jax.numpy.zeros((2, 4), dtype=int))[0])(jax.numpy.zeros((2, 4)))



def test_torch_gradients_flow_through_the_turns():
    torch = pytest.importorskip("torch")
    ids = torch.tensor([[0, 0, 0, 1, 1, -1, 2, 2, 2, 3]] * 2)

    def total(rewards, values):
        advantages, returns = gae_xp.turn_gae(rewards, values, ids, gamma=0.9, lam=0.8)
        return advantages.sum() + returns.sum()

    generator = torch.Generator().manual_seed(0)
    inputs = [torch.randn(2, 10, dtype=torch.float64, generator=generator, requires_grad=True) for _ in range(2)]
    assert torch.autograd.gradcheck(total, inputs)


def test_the_benchmark_runs(capsys):
    from gae_xp.bench import turns as bench

    assert bench.main(["--tokens", "4096", "--sequences", "8", "--turns", "4", "--samples", "1", "--threads", "0"]) == 0
    out = capsys.readouterr().out
    assert "4096 tokens, 8 sequences" in out and "turn / token" in out
    case = bench.packed_turns(np.random.default_rng(0), 4096, 8, 4)
    for actual, desired in zip(gae_xp.turn_gae(**case), turn_gae_loop(**case)):
        xp_assert_close(actual, desired, like=np.array(0.0, dtype=np.float32))
