"""Group-relative advantages (gae_xp.groups, gae_xp.reinforce) against the float64 per-group loops of
gae_xp.reference, on every installed library, on hostile groups, under jit, compile and autograd."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import gae_xp
from gae_xp import reference
from gae_xp.groups import BASELINES, SCALES
from gae_xp.testing import libraries, to_numpy

COMBINATIONS = list(itertools.product(BASELINES, SCALES, (True, False)))
#: ids that sort far apart and at the int64 edges
HOSTILE_IDS = np.array([np.iinfo(np.int64).min, -(2**40), -7, -1, 0, 3, 2**31, 2**53 + 1, np.iinfo(np.int64).max])


def make_groups(rng, n_groups: int, *, sizes=(1, 6), kinds=("random", "constant", "near", "binary", "nan"),
                dtype=np.float64, consecutive: int | None = None):
    """(scores, ids) with n_groups groups of the given kinds: ids shuffled and hostile unless ``consecutive`` is a
    group size k (then ids is k and the scores come in runs of k)."""
    chunks, labels = [], []
    pool = np.unique(np.concatenate([HOSTILE_IDS, rng.integers(-(2**62), 2**62, size=n_groups)]))
    chosen = rng.choice(pool, size=n_groups, replace=False)
    for g in range(n_groups):
        size = consecutive or int(rng.integers(sizes[0], sizes[1] + 1))
        kind = kinds[int(rng.integers(len(kinds)))]
        if kind == "random":
            values = rng.normal(rng.normal(0, 10), 10 ** rng.uniform(-3, 2), size)
        elif kind == "constant":
            values = np.full(size, rng.choice([0.1, 7.77, 1e6 + 0.5, -3.3, 0.0]))
        elif kind == "near":  # 1e6 + noise: E[x^2] - E[x]^2 loses every digit here
            values = 1e6 + rng.normal(0, 0.5, size)
        elif kind == "binary":
            values = rng.integers(0, 2, size).astype(np.float64)
        else:
            values = rng.normal(0, 1, size)
            values[rng.random(size) < 0.5] = np.nan
        chunks.append(values.astype(dtype))
        labels.append(np.full(size, chosen[g], dtype=np.int64))
    scores, ids = np.concatenate(chunks), np.concatenate(labels)
    if consecutive:
        return scores, consecutive
    order = rng.permutation(scores.shape[0])
    return scores[order], ids[order]


def check(actual, scores, ids, *, baseline="mean", scale="group", eps=1e-6, unbiased=True, rtol=None):
    """actual equals the float64 loop on the same (possibly float32) scores, within the scores' precision.

    In float64 a group's mean is itself rounded, to a unit of |mean| 2^-53, which moves s - mean by that much:
    relative to the group's spread, up to |mean| / std units (1e6 + 0.02 noise: 5e7 units, 1e-8)."""
    got = to_numpy(actual).astype(np.float64)
    wide = np.asarray(scores, dtype=np.float64)
    desired = reference.group_advantages_loop(wide, ids, baseline=baseline, scale=scale, eps=eps,
                                              unbiased=unbiased)
    tight = np.asarray(scores).dtype == np.float64
    tolerance = np.full(wide.shape, rtol or (1e-9 if tight else 2e-6))
    if tight and rtol is None:
        labels = np.arange(wide.shape[0]) // ids if isinstance(ids, int) else ids
        for label in np.unique(labels):
            members = wide[(labels == label) & ~np.isnan(wide)]
            if members.shape[0] > 1 and np.std(members) > 0:
                tolerance[labels == label] += 8 * 2.0**-53 * np.abs(members).max() / np.std(members)
    error = np.abs(got - desired)
    assert np.all(error <= tolerance * np.maximum(np.abs(desired), 1.0)), (
        f"baseline={baseline} scale={scale} unbiased={unbiased}: max error {error.max()} at "
        f"{np.argmax(error - tolerance)}; got {got}, desired {desired}")


def ids_on(library, ids):
    return ids if isinstance(ids, int) else library.asarray(ids)


# --- every combination, every library ----------------------------------------------------------------------------


@pytest.mark.parametrize("layout", ["ids", "consecutive"])
def test_every_combination_equals_the_loop(library, layout):
    rng = np.random.default_rng(1)
    for dtype in (np.float64, np.float32):
        scores, ids = make_groups(rng, 12, dtype=dtype, consecutive=4 if layout == "consecutive" else None)
        for baseline, scale, unbiased in COMBINATIONS:
            got = gae_xp.group_advantages(library.asarray(scores), ids_on(library, ids), baseline=baseline,
                                          scale=scale, unbiased=unbiased)
            assert got.dtype == library.asarray(scores).dtype
            check(got, scores, ids, baseline=baseline, scale=scale, unbiased=unbiased)


@given(st.data())
def test_property_against_the_loop(library, data):
    if library.name.startswith("jax"):
        pytest.skip("eager JAX compiles every operation for every new shape (60 s here): "
                    "test_property_against_the_loop_on_jax, marked slow")
    _property(library, data)


@pytest.mark.slow
@given(st.data())
def test_property_against_the_loop_on_jax(data):
    if libraries.unavailable("jax:cpu"):
        pytest.skip(libraries.unavailable("jax:cpu"))
    _property(libraries.load("jax:cpu"), data)


def _property(library, data):
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
    baseline, scale, unbiased = data.draw(st.sampled_from(COMBINATIONS))
    consecutive = data.draw(st.sampled_from([None, 1, 2, 5]))
    dtype = data.draw(st.sampled_from([np.float32, np.float64]))
    eps = data.draw(st.sampled_from([0.0, 1e-6, 1e-4]))
    scores, ids = make_groups(rng, data.draw(st.integers(1, 10)), dtype=dtype, consecutive=consecutive)
    got = gae_xp.group_advantages(library.asarray(scores), ids_on(library, ids), baseline=baseline, scale=scale,
                                  eps=eps, unbiased=unbiased)
    check(got, scores, ids, baseline=baseline, scale=scale, eps=eps, unbiased=unbiased)


# --- hostile groups ------------------------------------------------------------------------------------------------


def test_equal_scores_give_exactly_zero(library):
    xp = library.xp
    values = np.array([0.1, 7.77, 1e6 + 0.5, -1e-7, 3.0, 1 / 3])
    layout = np.random.default_rng(0).permutation(48)
    for dtype in ("float32", "float64"):
        scores = xp.astype(library.asarray(np.repeat(values, 8)), getattr(xp, dtype))  # 6 groups of 8, each equal
        ids = library.asarray(np.repeat(np.array([5, -2**40, 2**62, 0, -1, 9]), 8))
        shuffled = xp.take(scores, library.asarray(layout)), xp.take(ids, library.asarray(layout))
        for arguments in ((scores, 8), (scores, ids), shuffled, (scores, 1)):
            for baseline in ("mean", "leave_one_out"):
                for scale in SCALES:
                    got = to_numpy(gae_xp.group_advantages(*arguments, baseline=baseline, scale=scale, eps=0.0))
                    assert np.array_equal(got, np.zeros(48)), (dtype, baseline, scale, got)
            assert bool(xp.all(gae_xp.zero_variance_groups(*arguments)))


def test_float32_accumulators_keep_equal_groups_exact():
    """Where a device has no float64 (JAX without x64, MPS) the moments run in float32: still exactly 0."""
    import array_api_compat.numpy as xp

    from gae_xp import _segments

    values = np.repeat(np.array([0.1, 7.77, 1e6 + 0.5, 1 / 3], dtype=np.float32), 7)
    index = np.repeat(np.arange(4), 7)
    for count, mean, m2 in (_segments.consecutive_moments(values, 7, np.float32),
                            _segments.generic_group_moments(xp, values, index, 4, np.float32)):
        assert mean.dtype == np.float32
        np.testing.assert_array_equal(mean, values[::7])
        np.testing.assert_array_equal(m2, np.zeros(4))


def test_float32_near_constant_scores_keep_the_float64_digits(library):
    xp = library.xp
    rng = np.random.default_rng(3)
    scores32 = (1e6 + rng.normal(0, 1e-3, 64) + rng.integers(0, 3, 64) * 0.0625).astype(np.float32)
    got = to_numpy(gae_xp.group_advantages(xp.astype(library.asarray(scores32), xp.float32), 16))
    desired = reference.group_advantages_loop(scores32, 16)
    assert np.abs(desired).max() > 0.5
    np.testing.assert_allclose(got, desired, rtol=1e-6, atol=1e-6)


def test_singletons_and_nan_scores(library):
    scores = np.array([2.0, np.nan, 1.0, 3.0, np.nan, np.nan, 5.0, 4.0])
    ids = np.array([0, 1, 1, 1, 2, 2, 3, 1])
    for baseline, scale, unbiased in COMBINATIONS:
        got = gae_xp.group_advantages(library.asarray(scores), library.asarray(ids), baseline=baseline,
                                      scale=scale, unbiased=unbiased)
        out = to_numpy(got)
        assert not np.isnan(out).any()
        assert out[1] == out[4] == out[5] == 0.0  # NaN scores get 0
        if baseline is not None or scale == "group":
            assert out[0] == out[6] == 0.0  # groups of one
        check(got, scores, ids, baseline=baseline, scale=scale, unbiased=unbiased)
    # a NaN stays within its group: the other groups' advantages do not change
    clean = to_numpy(gae_xp.group_advantages(library.asarray(np.array([1.0, 3.0, 0.0, 1.0])), 2))
    dirty = to_numpy(gae_xp.group_advantages(library.asarray(np.array([1.0, 3.0, np.nan, 1.0])), 2))
    assert np.array_equal(clean[:2], dirty[:2])


def test_zero_variance_groups_is_per_sample(library):
    scores = np.array([1.0, 1.0, 0.0, 1.0, 0.3, np.nan, 2.0, 2.0, np.nan])
    ids = np.array([4, 4, 5, 5, 6, 7, 8, 8, 8])
    got = to_numpy(gae_xp.zero_variance_groups(library.asarray(scores), library.asarray(ids)))
    assert got.dtype == np.bool_
    assert got.tolist() == [True, True, False, False, True, True, True, True, True]
    assert to_numpy(gae_xp.zero_variance_groups(library.asarray(scores[:8]), 2)).tolist() == [
        True, True, False, False, True, True, True, True]


def test_ids_are_any_integers_in_any_order(library):
    rng = np.random.default_rng(5)
    scores, ids = make_groups(rng, 9, kinds=("random",))
    dense = np.unique(ids, return_inverse=True)[1]
    for dtype in (np.int64, np.int32, np.int16):
        small = ids if dtype == np.int64 else dense.astype(dtype) * 3 - 5
        a = to_numpy(gae_xp.group_advantages(library.asarray(scores), library.asarray(small)))
        b = to_numpy(gae_xp.group_advantages(library.asarray(scores), library.asarray(dense)))
        np.testing.assert_array_equal(a, b)


def test_low_precision_is_computed_in_float32(library):
    xp = library.xp
    for name in ("float16", "bfloat16"):
        if not hasattr(xp, name):
            continue
        scores = xp.astype(library.asarray(np.array([0.1, 0.3, 0.1, 0.1, 7.0, 9.0])), getattr(xp, name))
        got = gae_xp.group_advantages(scores, 2)
        assert got.dtype == scores.dtype
        check(got, to_numpy(scores).astype(np.float64), 2, rtol=8e-3)  # the loop on the same inputs, to 8 bits
        assert to_numpy(got)[2:4].tolist() == [0.0, 0.0]


def test_inputs_are_kept_and_outputs_are_new():
    scores, ids = np.array([1.0, 2.0, 4.0, 4.0]), np.array([1, 1, 2, 2])
    before = scores.copy(), ids.copy()
    for baseline, scale, _ in COMBINATIONS:
        out = gae_xp.group_advantages(scores, ids, baseline=baseline, scale=scale)
        assert not np.shares_memory(out, scores)
    tokens = gae_xp.to_tokens(scores, like=np.zeros((4, 3)))
    assert not np.shares_memory(tokens, scores)
    np.testing.assert_array_equal(scores, before[0])
    np.testing.assert_array_equal(ids, before[1])


def test_empty_batch(library):
    empty = library.asarray(np.zeros(0))
    assert to_numpy(gae_xp.group_advantages(empty, library.asarray(np.zeros(0, dtype=np.int64)))).shape == (0,)
    assert to_numpy(gae_xp.group_advantages(empty, 4)).shape == (0,)


def test_the_numba_kernel_equals_the_segmented_sums():
    pytest.importorskip("numba")
    import array_api_compat.numpy as xp

    from gae_xp import _segments
    from gae_xp.backends._numba_groups import group_moments as kernel

    rng = np.random.default_rng(15)
    for dtype in (np.float64, np.float32):
        scores, ids = make_groups(rng, 30, dtype=dtype)
        index = _segments.dense_index(xp, ids)
        for got, want in zip(kernel(scores, index, scores.shape[0]),
                             _segments.generic_group_moments(xp, scores, index, scores.shape[0], xp.float64)):
            np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-9)
    bad = np.array([0, -1, 5, 1])  # outside [0, 2): skipped, never read or written
    count, _, _ = kernel(np.ones(4), bad, 2)
    assert count.tolist() == [1.0, 1.0]


# --- bad input -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("call", "error", "message"), [
    (lambda s, i: gae_xp.group_advantages(s, i[:-1]), ValueError, "group_ids must have the shape"),
    (lambda s, i: gae_xp.group_advantages(s, i.astype(np.float64)), TypeError, "group_ids must be an integer"),
    (lambda s, i: gae_xp.group_advantages(s, 2.0), TypeError, "group_ids must be an integer"),
    (lambda s, i: gae_xp.group_advantages(s, True), TypeError, "group_ids must be an integer"),
    (lambda s, i: gae_xp.group_advantages(s, 4), ValueError, "must divide the number of scores, 6"),
    (lambda s, i: gae_xp.group_advantages(s, 0), ValueError, "group size k and must be at least 1"),
    (lambda s, i: gae_xp.group_advantages(s, i, eps=-1e-6), ValueError, "eps must be at least 0"),
    (lambda s, i: gae_xp.group_advantages(s, i, baseline="median"), ValueError, "baseline must be one of"),
    (lambda s, i: gae_xp.group_advantages(s, i, scale="std"), ValueError, "scale must be one of"),
    (lambda s, i: gae_xp.group_advantages(s, i, unbiased=1), TypeError, "unbiased must be a bool"),
    (lambda s, i: gae_xp.group_advantages(s[None], 2), ValueError, "scores must be 1-D"),
    (lambda s, i: gae_xp.group_advantages(list(s), 2), TypeError, "scores must be an array"),
    (lambda s, i: gae_xp.zero_variance_groups(s, i[:2]), ValueError, "group_ids must have the shape"),
    (lambda s, i: gae_xp.to_tokens(s), ValueError, "response_mask"),
    (lambda s, i: gae_xp.to_tokens(s, response_mask=np.ones((5, 2))), ValueError, "response_mask must have shape"),
    (lambda s, i: gae_xp.to_tokens(s, cu_seqlens=[0, 1, 2]), ValueError, "cu_seqlens must hold"),
    (lambda s, i: gae_xp.to_tokens(s, cu_seqlens=[0, 1, 2, 3, 4, 3, 5]), ValueError, "non-decreasing"),
    (lambda s, i: gae_xp.to_tokens(s[None], like=np.ones((6, 2))), ValueError, "advantages must be 1-D"),
])
def test_bad_input_is_named(call, error, message):
    with pytest.raises(error, match=message):
        call(np.arange(6.0), np.array([0, 0, 1, 1, 2, 2]))


def test_mixed_libraries_are_refused():
    torch = pytest.importorskip("torch")
    with pytest.raises(TypeError, match="group_ids"):
        gae_xp.group_advantages(np.ones(4), torch.zeros(4, dtype=torch.int64))


# --- to tokens ------------------------------------------------------------------------------------------------


def test_to_tokens_padded_and_packed_equal_a_loop(library):
    rng = np.random.default_rng(7)
    adv = rng.normal(size=5)
    mask = rng.random((5, 7)) < 0.6
    desired = np.array([[adv[b] if mask[b, t] else 0.0 for t in range(7)] for b in range(5)])
    for form in (mask, mask.astype(np.float32), mask.astype(np.int64)):
        got = gae_xp.to_tokens(library.asarray(adv), response_mask=library.asarray(form))
        np.testing.assert_array_equal(to_numpy(got), desired)
    every = gae_xp.to_tokens(library.asarray(adv), like=library.asarray(np.zeros((5, 7))))
    np.testing.assert_array_equal(to_numpy(every), np.repeat(adv[:, None], 7, axis=1))
    offsets = np.array([0, 3, 3, 4, 9, 12])  # an empty response included
    packed_loop = np.concatenate([np.full(offsets[i + 1] - offsets[i], adv[i]) for i in range(5)])
    host = gae_xp.to_tokens(library.asarray(adv), cu_seqlens=offsets.tolist())
    np.testing.assert_array_equal(to_numpy(host), packed_loop)
    device = gae_xp.to_tokens(library.asarray(adv), cu_seqlens=library.asarray(offsets),
                              like=library.asarray(np.zeros(12)))
    np.testing.assert_array_equal(to_numpy(device), packed_loop)


def test_to_tokens_on_device_offsets_needs_like():
    torch = pytest.importorskip("torch")
    with pytest.raises(ValueError, match="needs like="):
        gae_xp.to_tokens(torch.ones(2), cu_seqlens=torch.tensor([0, 1, 2]))


# --- REINFORCE++ -------------------------------------------------------------------------------------------------


def test_reinforce_plus_plus_equals_the_loop(library):
    rng = np.random.default_rng(9)
    rewards = rng.normal(size=(4, 9))
    mask = rng.random((4, 9)) < 0.7
    mask[:, 0] = True
    for gamma in (1.0, 0.9, 0.0):
        got = gae_xp.reinforce_plus_plus(library.asarray(rewards), library.asarray(mask), gamma=gamma)
        np.testing.assert_allclose(to_numpy(got), reference.reinforce_plus_plus_loop(rewards, mask, gamma=gamma),
                                   rtol=1e-10, atol=1e-12)


def test_reinforce_plus_plus_baseline_equals_the_loops(library):
    rng = np.random.default_rng(10)
    rewards = np.zeros((6, 5))
    rewards[:, -1] = rng.integers(0, 2, 6)
    mask = np.ones((6, 5))
    mask[::2, -2:] = 0.0
    rewards[0, 1] = 5.0  # under the mask: not read
    ids = np.array([3, 1, 3, 1, 8, 8])
    got = gae_xp.reinforce_plus_plus_baseline(library.asarray(rewards), library.asarray(mask), library.asarray(ids))
    real = mask != 0
    scores = np.where(real, rewards, 0.0).sum(axis=1)
    centred = reference.group_advantages_loop(scores, ids, scale=None)
    tokens = np.where(real, centred[:, None], 0.0)
    picked = tokens[real]
    desired = np.where(real, (tokens - picked.mean()) / np.sqrt(picked.var(ddof=1) + 1e-8), 0.0)
    np.testing.assert_allclose(to_numpy(got), desired, rtol=1e-10, atol=1e-12)


# --- transforms and lazy arrays --------------------------------------------------------------------------------


def test_jax_under_jit():
    jax = pytest.importorskip("jax")
    jax.config.update("jax_enable_x64", True)
    import jax.numpy as jnp

    rng = np.random.default_rng(11)
    scores, ids = make_groups(rng, 8)
    for baseline, scale, unbiased in COMBINATIONS[::5]:
        options = {"baseline": baseline, "scale": scale, "unbiased": unbiased}
        by_ids = jax.jit(lambda s, i, o=options: gae_xp.group_advantages(s, i, **o))
        check(by_ids(jnp.asarray(scores), jnp.asarray(ids)), scores, ids, **options)
    consecutive, _ = make_groups(rng, 5, consecutive=3)
    by_k = jax.jit(lambda s: gae_xp.group_advantages(s, 3))
    check(by_k(jnp.asarray(consecutive)), consecutive, 3)
    zero = jax.jit(gae_xp.zero_variance_groups)(jnp.asarray(scores), jnp.asarray(ids))
    assert zero.dtype == jnp.bool_
    bad = jax.jit(lambda a, o: gae_xp.to_tokens(a, cu_seqlens=o, like=jnp.zeros(6)))
    out = bad(jnp.arange(1.0, 3.0), jnp.asarray([0, 9, -4]))  # offsets that cannot be checked under jit
    assert np.isfinite(np.asarray(out)).all()


def test_dask_groups_span_blocks():
    da = pytest.importorskip("dask.array")
    rng = np.random.default_rng(12)
    scores, ids = make_groups(rng, 10)
    for baseline, scale, unbiased in COMBINATIONS[::4]:
        got = gae_xp.group_advantages(da.from_array(scores, chunks=3), da.from_array(ids, chunks=4),
                                      baseline=baseline, scale=scale, unbiased=unbiased)
        assert isinstance(got, da.Array)
        check(got.compute(), scores, ids, baseline=baseline, scale=scale, unbiased=unbiased)
    consecutive, _ = make_groups(rng, 6, consecutive=4)
    got = gae_xp.group_advantages(da.from_array(consecutive, chunks=5), 4)  # blocks cut through groups
    check(got.compute(), consecutive, 4)
    zero = gae_xp.zero_variance_groups(da.from_array(scores, chunks=3), da.from_array(ids, chunks=4))
    np.testing.assert_array_equal(zero.compute(), gae_xp.zero_variance_groups(scores, ids))


def test_torch_gradcheck():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(13)
    scores = torch.tensor(rng.normal(size=10), dtype=torch.float64, requires_grad=True)
    ids = torch.tensor([0, 1, 0, 2, 1, 0, 2, 1, 3, 3])
    for baseline, scale, unbiased in COMBINATIONS:
        def f(s, b=baseline, c=scale, u=unbiased):
            return gae_xp.group_advantages(s, ids, baseline=b, scale=c, unbiased=u)

        assert torch.autograd.gradcheck(f, (scores,))
        assert torch.autograd.gradcheck(lambda s, b=baseline, c=scale: gae_xp.group_advantages(s, 2, baseline=b,
                                                                                                scale=c), (scores,))
    # a constant group's zero advantages have finite (zero) gradients
    constant = torch.tensor([0.1, 0.1, 1.0, 2.0], dtype=torch.float64, requires_grad=True)
    gae_xp.group_advantages(constant, 2).sum().backward()
    assert torch.isfinite(constant.grad).all()


@pytest.mark.slow
def test_torch_compile_fullgraph():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(14)
    scores, ids = make_groups(rng, 8, dtype=np.float32)

    @torch.compile(fullgraph=True, dynamic=False)
    def step(s, i, a, offsets, like):
        return (gae_xp.group_advantages(s, i), gae_xp.group_advantages(s, 1), gae_xp.zero_variance_groups(s, i),
                gae_xp.to_tokens(a, cu_seqlens=offsets, like=like))

    advantages, singles, zero, tokens = step(torch.tensor(scores), torch.tensor(ids), torch.arange(1.0, 4.0),
                                             torch.tensor([0, 2, 99, -5]), torch.zeros(6))
    check(advantages, scores, ids)
    assert singles.abs().max() == 0
    np.testing.assert_array_equal(zero.numpy(), gae_xp.zero_variance_groups(scores, ids))
    assert torch.isfinite(tokens).all()  # unchecked offsets: clamped, never read outside the advantages


def test_the_docs_example_prints_what_it_says():
    import contextlib
    import io
    import re
    from pathlib import Path

    page = (Path(__file__).resolve().parents[1] / "docs" / "groups.md").read_text()
    block = re.search(r"```python\n(.*?)```", page, re.S).group(1)
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(block, {})  # noqa: S102 (the page's own example)
    promised = "\n".join(line[2:] for line in block.splitlines() if line.startswith("# "))
    assert printed.getvalue().strip() == promised.strip()
