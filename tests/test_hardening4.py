"""Hardening, round four (issue 43): items 1-4, 6-9, 11 and 12, numbered as in the issue.

1. an infinite score makes its group's advantages NaN (and, with ``scale="batch"``, every one's), on every route;
2. a group's statistics do not depend on the other groups on a route without a native segmented sum;
3. non-native byte order (``'>f8'``) is computed in float64 and returned as native float64;
4. a NaN score's gradient stays in its group (torch, JAX), every baseline and scale;
6. NumPy offsets are host offsets in ``to_tokens``;
7. zero sequences (``cu_seqlens=[0]``);
8. REINFORCE++ on NumPy bfloat16;
9. Dask arrays of unknown chunk sizes in the group functions;
11. the verl adapter's ``config`` as any mapping;
12. ``gae()`` leaves a caller's torch CPU tensors resizable.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest

import gae_xp
from gae_xp import _segments, reference
from gae_xp.groups import BASELINES, SCALES
from gae_xp.testing import libraries, to_numpy

COMBINATIONS = list(itertools.product(BASELINES, SCALES))


def ids_on(library, ids):
    return ids if isinstance(ids, int) else library.asarray(np.asarray(ids, dtype=np.int64))


# --- 1. an infinite score gives NaN, not 0 ---------------------------------------------------------------------

#: (scores, ids): groups with +inf beside a finite score, -inf beside +inf, +inf twice, and a lone +inf; finite
#: groups and a NaN score beside them
INFINITE = [
    ([np.inf, 1.0, 0.0, 2.0, np.nan, 3.0], 2),
    ([-np.inf, np.inf, 0.0, 2.0, 5.0, 3.0], 2),
    ([np.inf, np.inf, 0.0, 2.0, np.nan, 3.0], [4, 4, -1, -1, 9, 9]),
    ([3.0, np.inf, 2.0, np.nan, 0.0, 1.0], [0, 5, 2, 2, 0, 2]),
]


def check_infinite(got, scores, ids, baseline, scale):
    """got equals the float64 loop (NaN where it has NaN), and the loop keeps the docstring's promise."""
    want = reference.group_advantages_loop(scores, ids, baseline=baseline, scale=scale)
    labels = np.arange(len(scores)) // ids if isinstance(ids, int) else np.asarray(ids)
    scores = np.asarray(scores)
    infinite_groups = np.isin(labels, labels[np.isinf(scores)])
    if (baseline, scale) != (None, None):
        nan_expected = ~np.isnan(scores) & (infinite_groups | (scale == "batch"))
        assert np.all(np.isnan(want[nan_expected])) and not np.any(np.isnan(want[~nan_expected]))
    np.testing.assert_allclose(to_numpy(got), want, rtol=1e-12, atol=1e-12)


@pytest.mark.filterwarnings("ignore:invalid value:RuntimeWarning")  # NumPy's own, for inf - inf
@pytest.mark.parametrize("baseline,scale", COMBINATIONS)
@pytest.mark.parametrize("case", range(len(INFINITE)))
def test_1_an_infinite_score_gives_nan_on_every_library(library, case, baseline, scale):
    scores, ids = INFINITE[case]
    scores = np.asarray(scores)
    got = gae_xp.group_advantages(library.asarray(scores), ids_on(library, ids), baseline=baseline, scale=scale)
    check_infinite(got, scores, ids, baseline, scale)


@pytest.mark.filterwarnings("ignore:invalid value:RuntimeWarning")
@pytest.mark.parametrize("baseline,scale", COMBINATIONS)
def test_1_an_infinite_score_gives_nan_on_numpy_without_numba(monkeypatch, baseline, scale):
    """The generic segmented sums (NumPy's route where numba is not installed)."""
    monkeypatch.setattr(_segments, "numba_installed", lambda: False)
    for scores, ids in INFINITE:
        scores = np.asarray(scores)
        got = gae_xp.group_advantages(scores, ids if isinstance(ids, int) else np.asarray(ids), baseline=baseline,
                                      scale=scale)
        check_infinite(got, scores, ids, baseline, scale)


@pytest.mark.skipif(not libraries.simulated(), reason="the CUDA kernels run on NumPy arrays in numba's simulator "
                                                      "(NUMBA_ENABLE_CUDASIM=1)")
@pytest.mark.parametrize("baseline,scale", COMBINATIONS)
def test_1_an_infinite_score_gives_nan_in_the_cuda_consecutive_kernels(baseline, scale):
    from gae_xp.backends import _cuda_consecutive

    for scores, ids in INFINITE:
        if isinstance(ids, int):
            scores = np.asarray(scores)
            got = _cuda_consecutive.advantages(np, scores, ids, baseline=baseline, scale=scale, eps=1e-6,
                                               unbiased=True, device=None)
            check_infinite(got, scores, ids, baseline, scale)


@pytest.mark.filterwarnings("ignore:invalid value:RuntimeWarning")
def test_1_zero_variance_groups_does_not_flag_an_infinite_score(library):
    scores = np.array([np.inf, 1.0, -np.inf, np.inf, np.inf, np.inf, 2.0, 2.0, np.inf, np.nan])
    want = [False] * 6 + [True, True, False, False]
    for ids in (2, np.repeat(np.array([3, -8, 5, 0, 7]), 2)):
        got = gae_xp.zero_variance_groups(library.asarray(scores), ids_on(library, ids))
        assert to_numpy(got).tolist() == want


@pytest.mark.filterwarnings("ignore:invalid value:RuntimeWarning")
def test_1_the_trl_adapter_gives_nan_for_an_infinite_reward():
    torch = pytest.importorskip("torch")
    from gae_xp.adapters import trl

    rewards = torch.tensor([np.inf, 1.0, 0.0, 2.0], dtype=torch.float64)
    for scale in ("group", "batch"):
        advantages = to_numpy(trl.grpo_advantages(rewards, 2, scale_rewards=scale))
        assert np.all(np.isnan(advantages[:2])), scale
        assert np.all(np.isnan(advantages[2:])) == (scale == "batch"), scale


def test_1_the_reference_loop_agrees_with_the_docstring():
    """gae_xp.reference's group loop: the infinite group NaN under every scale, a NaN score 0, and under
    baseline=None, scale=None the scores themselves."""
    scores = np.array([np.inf, 1.0, np.nan, 0.0, 2.0, 5.0])
    for baseline, scale in COMBINATIONS:
        got = reference.group_advantages_loop(scores, 3, baseline=baseline, scale=scale)
        assert got[2] == 0.0
        if (baseline, scale) == (None, None):
            np.testing.assert_array_equal(got, np.nan_to_num(scores, nan=0.0, posinf=np.inf))
            continue
        assert np.all(np.isnan(got[:2]))
        assert np.all(np.isnan(got[3:])) == (scale == "batch")


# --- 2. statistics independent of the other groups --------------------------------------------------------------


def test_2_near_constant_groups_keep_their_digits_beside_large_ones(library):
    """The issue's example: 7 % off on array_api_strict (differences of a cumulative sum), exact elsewhere."""
    scores = np.array([1.0, 1.0 + 1e-6, 0.0, 100.0, 1.0, 1.0 + 2e-6])
    ids = np.array([7, 7, 2, 2, 7, 7])
    for baseline, scale in COMBINATIONS:
        got = gae_xp.group_advantages(library.asarray(scores), ids_on(library, ids), baseline=baseline, scale=scale)
        want = reference.group_advantages_loop(scores, ids, baseline=baseline, scale=scale)
        np.testing.assert_allclose(to_numpy(got), want, rtol=1e-9, atol=1e-12)


def test_2_a_group_is_the_same_whatever_the_other_groups_hold(library):
    """A near-constant group, alone and beside huge, infinite and NaN groups (its members in the same order): the
    same bits on every library."""
    rng = np.random.default_rng(2)
    mine = 1e3 + rng.normal(0, 1e-5, 5)
    alone = to_numpy(gae_xp.group_advantages(library.asarray(mine), ids_on(library, np.zeros(5))))
    np.testing.assert_allclose(alone, reference.group_advantages_loop(mine, np.zeros(5, dtype=np.int64)), rtol=1e-7)
    others = np.concatenate([rng.normal(0, 1e12, 7), [np.inf, 3.0, np.nan]])
    mixed = np.sort(rng.choice(15, 5, replace=False))  # the group's places, its members in their order
    scores, ids = np.empty(15), np.empty(15, dtype=np.int64)
    scores[mixed], ids[mixed] = mine, -3
    rest = np.setdiff1d(np.arange(15), mixed)
    scores[rest], ids[rest] = others, np.concatenate([np.repeat([5, 6], [4, 3]), [1, 1, 1]])
    with np.errstate(invalid="ignore"):
        got = to_numpy(gae_xp.group_advantages(library.asarray(scores), ids_on(library, ids)))
    np.testing.assert_array_equal(got[mixed], alone)


def test_2_the_segmented_scan_sums_each_segment_alone():
    """_segments' array-API segmented sum against np.bincount, with NaN, inf and huge values in other segments."""
    xp = pytest.importorskip("array_api_strict")
    rng = np.random.default_rng(0)
    for n in (1, 2, 3, 7, 16, 33):
        index = rng.integers(0, n, n)
        values = rng.standard_normal(n)
        got = _segments._sorted_segment_sum(xp, xp.asarray(values), xp.asarray(index), n)
        np.testing.assert_allclose(np.asarray(got), np.bincount(index, values, minlength=n), rtol=1e-13, atol=1e-15)
    values = np.array([1e300, np.nan, 1e-300, 2e-300, np.inf, -1e300])
    index = np.array([0, 1, 2, 2, 3, 0])
    got = np.asarray(_segments._sorted_segment_sum(xp, xp.asarray(values), xp.asarray(index), 6))
    np.testing.assert_array_equal(got, [0.0, np.nan, 3e-300, np.inf, 0.0, 0.0])


# --- 4. NaN gradients stay in their group -------------------------------------------------------------------------

#: a NaN score in the first group (ids 0); the gradient of a weighted sum over the other groups
GRADIENT_SCORES = np.array([0.3, np.nan, 1.7, 0.2, -1.0, 0.5, 2.0, 4.0])
GRADIENT_IDS = np.array([0, 0, 0, 1, 1, 2, 2, 2])


def finite_gradient_check(gradient, scale):
    """Finite everywhere but at the NaN score; the NaN score's own gradient is 0 (its advantage is a constant)."""
    gradient = np.asarray(gradient)
    assert np.all(np.isfinite(gradient)), gradient
    assert gradient[1] == 0.0


@pytest.mark.parametrize("baseline,scale", COMBINATIONS)
@pytest.mark.parametrize("ids", ["ids", "consecutive"])
def test_4_nan_gradients_stay_in_their_group_in_torch(baseline, scale, ids):
    torch = pytest.importorskip("torch")
    scores = torch.tensor(GRADIENT_SCORES[:6] if ids == "consecutive" else GRADIENT_SCORES, requires_grad=True)
    groups = 2 if ids == "consecutive" else torch.tensor(GRADIENT_IDS)
    out = gae_xp.group_advantages(scores, groups, baseline=baseline, scale=scale)
    weights = torch.linspace(0.5, 1.5, out.shape[0], dtype=out.dtype)
    (out * weights).sum().backward()
    finite_gradient_check(scores.grad, scale)


@pytest.mark.parametrize("baseline,scale", COMBINATIONS)
@pytest.mark.parametrize("ids", ["ids", "consecutive"])
def test_4_nan_gradients_stay_in_their_group_in_jax(baseline, scale, ids):
    jax = pytest.importorskip("jax")
    jnp = jax.numpy
    scores = jnp.asarray(GRADIENT_SCORES[:6] if ids == "consecutive" else GRADIENT_SCORES)
    groups = 2 if ids == "consecutive" else jnp.asarray(GRADIENT_IDS)

    def loss(s):
        out = gae_xp.group_advantages(s, groups, baseline=baseline, scale=scale)
        return (out * jnp.linspace(0.5, 1.5, out.shape[0], dtype=out.dtype)).sum()

    finite_gradient_check(jax.grad(loss)(scores), scale)


# --- 6. NumPy offsets are host offsets in to_tokens -----------------------------------------------------------


def test_6_numpy_offsets_are_host_offsets_in_to_tokens(library):
    """A NumPy cu_seqlens gives the length itself, beside NumPy advantages as beside any library's (no like=)."""
    advantages = library.asarray(np.array([1.0, -2.0]))
    for offsets in (np.array([0, 2, 5]), np.array([0, 2, 5], dtype=np.int32)):
        got = gae_xp.to_tokens(advantages, cu_seqlens=offsets)
        np.testing.assert_array_equal(to_numpy(got), [1.0, 1.0, -2.0, -2.0, -2.0])
    with pytest.raises(ValueError, match="cu_seqlens must be non-decreasing"):
        gae_xp.to_tokens(advantages, cu_seqlens=np.array([0, 6, 5]))
    with pytest.raises(ValueError, match="like must be the packed token array"):
        gae_xp.to_tokens(advantages, cu_seqlens=np.array([0, 2, 5]), like=library.asarray(np.zeros(4)))


# --- 7. zero sequences -------------------------------------------------------------------------------------------


def test_7_no_sequence_in_to_tokens(library):
    """n = 0: cu_seqlens = [0] (a list, NumPy, the library's own beside like=) gives an empty token array;
    [0, 0] is one empty sequence, so it needs one advantage."""
    none = library.asarray(np.zeros(0))
    for offsets, like in (([0], None), (np.array([0]), None), (library.asarray(np.array([0])), none)):
        got = gae_xp.to_tokens(none, cu_seqlens=offsets, like=like)
        assert tuple(got.shape) == (0,)
    with pytest.raises(ValueError, match=r"len\(advantages\) \+ 1 = 1"):
        gae_xp.to_tokens(none, cu_seqlens=[0, 0])
    np.testing.assert_array_equal(to_numpy(gae_xp.to_tokens(library.asarray(np.array([3.0])), cu_seqlens=[0, 0])),
                                  np.zeros(0))


def test_7_no_sequence_in_gae(target, library, backend):
    """gae()'s packed path with no sequence: T = 0 and cu_seqlens = [0], with and without bootstrap values; the
    offsets of any accepted kind; [0] beside T > 0 names cu_seqlens' end."""
    empty = library.asarray(np.zeros((2, 0)))
    kinds = ([0], np.array([0]), library.asarray(np.array([0], dtype=np.int64)))
    for offsets, bootstrap in itertools.product(kinds, (None, empty)):
        advantages, returns = gae_xp.gae(empty, empty, cu_seqlens=offsets, bootstrap_value=bootstrap,
                                         backend=backend)
        assert tuple(advantages.shape) == tuple(returns.shape) == (2, 0)
    again = gae_xp.gae(empty, empty, cu_seqlens=[0], backend=backend)  # a plan-served repeat
    assert tuple(again[0].shape) == (2, 0)
    steps = library.asarray(np.zeros((2, 3)))
    with pytest.raises(ValueError, match="cu_seqlens must end at the length of the time axis, 3, got 0"):
        gae_xp.gae(steps, steps, cu_seqlens=[0], backend=backend)


# --- 3. non-native byte order -------------------------------------------------------------------------------------

SWAPPED = {"float64": ">f8" if np.little_endian else "<f8", "float32": ">f4" if np.little_endian else "<f4"}


@pytest.mark.parametrize("width", ["float64", "float32"])
def test_3_gae_on_non_native_byte_order(target, library, backend, width):
    """'>f8' is computed in float64 and returned as native float64 (NumPy's own rule for its arithmetic), on every
    NumPy backend, on the first call and the plan-served repeats; '>f4' as native float32."""
    if library.name != "numpy":
        pytest.skip("byte order is NumPy's")
    rng = np.random.default_rng(3)
    r, v = rng.standard_normal((2, 9)), rng.standard_normal((2, 9))
    want = [np.stack(rows) for rows in zip(*(reference.gae_loop(r[i], v[i], gamma=0.9, lam=0.8) for i in range(2)))]
    swapped_r, swapped_v = r.astype(SWAPPED[width]), v.astype(SWAPPED[width])
    kept = swapped_r.copy(), swapped_v.copy()
    for _ in range(3):  # the first call, then plans
        for got, desired in zip(gae_xp.gae(swapped_r, swapped_v, gamma=0.9, lam=0.8, backend=backend), want):
            assert got.dtype == np.dtype(width) and got.dtype.isnative
            np.testing.assert_allclose(got, desired, rtol=1e-12 if width == "float64" else 2e-6, atol=1e-12)
    np.testing.assert_array_equal(swapped_r, kept[0])
    np.testing.assert_array_equal(swapped_v, kept[1])
    assert swapped_r.dtype == np.dtype(SWAPPED[width])


@pytest.mark.parametrize("name", ["discounted_cumsum", "discounted_returns", "whiten", "group_advantages"])
def test_3_other_functions_on_non_native_byte_order(name):
    rng = np.random.default_rng(4)
    x = rng.standard_normal(12) * 1e3 + 7.0
    call = {"discounted_cumsum": lambda a: gae_xp.discounted_cumsum(a, 0.9),
            "discounted_returns": lambda a: gae_xp.discounted_returns(a, gamma=0.9),
            "whiten": gae_xp.whiten,
            "group_advantages": lambda a: gae_xp.group_advantages(a, 3)}[name]
    got, native = call(x.astype(SWAPPED["float64"])), call(x)
    assert got.dtype == np.float64 and got.dtype.isnative
    np.testing.assert_array_equal(got, native)


# --- 8. REINFORCE++ on NumPy bfloat16 ---------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["reinforce_plus_plus", "reinforce_plus_plus_baseline"])
def test_8_reinforce_plus_plus_on_numpy_bfloat16(name):
    """ml_dtypes' bfloat16: computed in float32 (the float32 answer, rounded once) and returned in bfloat16."""
    ml_dtypes = pytest.importorskip("ml_dtypes")
    rng = np.random.default_rng(8)
    rewards = rng.standard_normal((4, 6)).astype(ml_dtypes.bfloat16)
    mask = rng.random((4, 6)) < 0.8
    wide = rewards.astype(np.float32)
    if name == "reinforce_plus_plus":
        got = gae_xp.reinforce_plus_plus(rewards, mask, gamma=0.99)
        in_float32 = gae_xp.reinforce_plus_plus(wide, mask, gamma=0.99)
        want = reference.reinforce_plus_plus_loop(wide.astype(np.float64), mask, gamma=0.99)
    else:
        ids = np.array([3, 3, -1, -1])
        got = gae_xp.reinforce_plus_plus_baseline(rewards, mask, ids)
        in_float32 = gae_xp.reinforce_plus_plus_baseline(wide, mask, ids)
        scores = np.where(mask, wide.astype(np.float64), 0.0).sum(axis=1)
        tokens = np.where(mask, reference.group_advantages_loop(scores, ids, scale=None)[:, None], 0.0)
        picked = tokens[mask]
        want = np.where(mask, (tokens - picked.mean()) / np.sqrt(picked.var(ddof=1) + 1e-8), 0.0)
    assert got.dtype == rewards.dtype
    np.testing.assert_array_equal(got, in_float32.astype(ml_dtypes.bfloat16))
    np.testing.assert_allclose(got.astype(np.float64), want, rtol=2**-8, atol=2**-8)
    with pytest.raises(TypeError, match="token_rewards must have a real floating dtype"):
        getattr(gae_xp, name)(rewards.astype(np.int32), mask, *([] if name == "reinforce_plus_plus" else [ids]))


# --- 9. Dask arrays of unknown chunk sizes in the group functions ----------------------------------------------


@pytest.mark.parametrize("function", ["group_advantages", "zero_variance_groups"])
def test_9_unknown_chunk_sizes_are_named_in_the_group_functions(function):
    da = pytest.importorskip("dask.array")
    rng = np.random.default_rng(9)
    scores = da.from_array(rng.random(12), chunks=4)
    ids = da.from_array(np.repeat(np.arange(4), 3), chunks=4)
    keep = scores > 0.3
    call = getattr(gae_xp, function)
    message = r"unknown \(NaN\) chunk sizes.*compute_chunk_sizes\(\) on {} first"
    with pytest.raises(ValueError, match=r"scores and group_ids have " + message.format("both")):
        call(scores[keep], ids[keep])
    with pytest.raises(ValueError, match=r"scores has " + message.format("it")):
        call(scores[keep], 3)
    with pytest.raises(ValueError, match=r"group_ids has " + message.format("it")):
        call(scores[:6], ids[ids < 2])
    kept_scores, kept_ids = scores[keep].compute_chunk_sizes(), ids[keep].compute_chunk_sizes()
    got = call(kept_scores, kept_ids).compute()
    np.testing.assert_array_equal(got, call(kept_scores.compute(), kept_ids.compute()))


# --- 11. the verl adapter's config as any mapping -----------------------------------------------------------------


def test_11_the_verl_config_takes_any_mapping_or_object():
    torch = pytest.importorskip("torch")
    import collections
    import types

    from gae_xp.adapters import verl

    rewards = torch.tensor([[0.0, 1.0, 0.5], [1.0, 0.0, 0.0]], dtype=torch.float64)
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]], dtype=torch.float64)
    want = verl.compute_reinforce_plus_plus_outcome_advantage(rewards, mask, gamma=0.9)
    configs = [{"gamma": 0.9}, collections.UserDict(gamma=0.9), types.MappingProxyType({"gamma": 0.9}),
               types.SimpleNamespace(gamma=0.9)]
    for config in configs:
        got = verl.compute_reinforce_plus_plus_outcome_advantage(rewards, mask, config=config)
        for g, w in zip(got, want):
            torch.testing.assert_close(g, w, rtol=0, atol=0)
    for config in ({}, collections.UserDict(), types.MappingProxyType({}), types.SimpleNamespace()):
        with pytest.raises(ValueError, match="gamma is needed"):
            verl.compute_reinforce_plus_plus_outcome_advantage(rewards, mask, config=config)


# --- 12. gae() leaves a caller's torch CPU tensors resizable ---------------------------------------------------


def resizable(t) -> bool:
    """Whether ``t.resize_()`` still works (Tensor.numpy() marks the storage non-resizable for good), on a view of
    the tensor, so the caller's own tensor keeps its shape."""
    try:
        t.view(t.shape).resize_(t.numel() + 1)
    except RuntimeError:
        return False
    return True


@pytest.mark.parametrize("layout", ["plain", "time-first", "dones and mask", "packed", "coefficient arrays"])
def test_12_gae_leaves_torch_cpu_tensors_resizable(target, library, backend, layout):
    """Every per-step tensor, coefficient array and offsets tensor handed to gae() can be resized afterwards, on the
    first call and on plan-served repeats, on every torch CPU backend; the answers are the reference's."""
    if library.name != "torch:cpu":
        pytest.skip("torch CPU tensors")
    import torch

    rng = np.random.default_rng(12)
    own = torch.tensor  # a tensor of torch's own memory (torch.from_numpy's never resizes)

    def fresh():
        r, v = rng.standard_normal((3, 8)), rng.standard_normal((3, 8))
        arrays = {"rewards": own(r), "values": own(v)}
        options = {}
        if layout == "time-first":
            arrays = {name: a.T.contiguous() for name, a in arrays.items()}
            options["axis"] = 0
        if layout == "dones and mask":
            options.update(terminated=own(rng.random((3, 8)) < 0.2), mask=own(rng.random((3, 8)) < 0.8))
        if layout == "packed":
            options["cu_seqlens"] = torch.tensor([0, 3, 8])
            options["bootstrap_value"] = torch.zeros(3, 2, dtype=torch.float64)
        if layout == "coefficient arrays":
            options.update(gamma=torch.full((3, 8), 0.9, dtype=torch.float64),
                           lam=torch.full((3, 1), 0.8, dtype=torch.float64),
                           bootstrap_value=own(rng.standard_normal(3)))
        return arrays, options

    for _ in range(3):  # the first call, then plans
        arrays, options = fresh()
        advantages, returns = gae_xp.gae(arrays["rewards"], arrays["values"], backend=backend, **options)
        given = {**arrays, **{name: o for name, o in options.items() if isinstance(o, torch.Tensor)}}
        for name, tensor in given.items():
            assert resizable(tensor), name
        numpy_options = {name: o.numpy() if isinstance(o, torch.Tensor) else o for name, o in options.items()}
        want = gae_xp.gae(arrays["rewards"].numpy(), arrays["values"].numpy(), backend="xp", **numpy_options)
        np.testing.assert_allclose(advantages.numpy(), want[0], rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(returns.numpy(), want[1], rtol=1e-12, atol=1e-12)


def test_12_the_view_of_a_tensor_refuses_what_tensor_numpy_refuses():
    """_compat.torch_cpu_view: the tensor's memory and values, writeable, the tensor kept alive and resizable; the
    refusals of Tensor.numpy() (grad, a negative bit, bfloat16, no storage), and complex tensors."""
    torch = pytest.importorskip("torch")
    from gae_xp._compat import torch_cpu_view

    base = torch.arange(24, dtype=torch.float64).reshape(4, 6)
    for t in (base, base.T, base[1:, ::2], base[:, :1].expand(4, 5), torch.ones(3, dtype=torch.bool),
              torch.zeros(0, 3), torch.tensor(2.5), torch.arange(5, dtype=torch.int32)):
        view = torch_cpu_view(t)
        np.testing.assert_array_equal(view, t.clone().numpy())
        assert view.dtype == t.clone().numpy().dtype and view.flags.writeable
        if t.numel():
            assert view.__array_interface__["data"][0] == t.data_ptr()
    with torch.no_grad():  # as Tensor.numpy(): a tensor that requires grad is read where grad mode is off
        np.testing.assert_array_equal(torch_cpu_view(torch.ones(2, requires_grad=True)), [1.0, 1.0])
    kept = torch_cpu_view(torch.arange(3.0))
    np.testing.assert_array_equal(kept, [0.0, 1.0, 2.0])  # the tensor lives as long as its view
    assert resizable(base)
    refused = [torch.ones(2, requires_grad=True), torch.ones(2, dtype=torch.complex64).conj(),
               torch.ones(2, dtype=torch.complex64),
               torch.ones(2, dtype=torch.complex64).conj().imag, torch.ones(2, dtype=torch.bfloat16),
               torch.ones(2, device="meta")]
    for t in refused:
        with pytest.raises((RuntimeError, TypeError)):
            torch_cpu_view(t)
    with pytest.raises(RuntimeError):
        torch.vmap(lambda x: torch.as_tensor(torch_cpu_view(x)))(torch.ones(2, 3))
