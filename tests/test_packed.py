"""Packed sequences (``cu_seqlens``, the THD layout): one call equals a loop of the float64 oracle over sequences."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import converted, to_numpy, xp_assert_close

import gae_xp
from gae_xp import backends
from gae_xp.reference import discounted_returns_loop, gae_loop, lambda_returns_loop


def packed_backend(library, backend):
    """Skip a target whose backend does not take packed sequences, after checking that it says so clearly."""
    if not backends.load(backend).segments:
        x = library.asarray(np.zeros(4))
        with pytest.raises(ValueError, match="packed sequences"):
            gae_xp.gae(x, x, cu_seqlens=library.asarray(np.array([0, 2, 4])), backend=backend)
        pytest.skip(f"backend {backend!r} does not take packed sequences (checked: it says so)")


def random_offsets(rng, count, total, *, empty=False):
    """Offsets of ``count`` sequences of random lengths totalling ``total`` steps: at least 1 step each, or with
    ``empty``, three of them empty (the first, the last and one repeated offset inside)."""
    if not empty:
        inner = np.sort(rng.choice(np.arange(1, total), size=count - 1, replace=False))
        return np.concatenate([[0], inner, [total]]).astype(np.int64)
    inner = np.sort(rng.choice(np.arange(1, total), size=count - 4, replace=False))
    return np.concatenate([[0, 0], inner[:1], inner[:1], inner[1:], [total, total]]).astype(np.int64)


def make_packed(rng, batch, total, count, *, holes=0.0, dones=0.0, per_step_gamma=False, next_values=False,
                empty=False):
    offsets = random_offsets(rng, count, total, empty=empty)
    shape = (*batch, total)
    case = {"rewards": rng.standard_normal(shape), "values": rng.standard_normal(shape), "gamma": 0.99, "lam": 0.95}
    if holes:
        mask = rng.random(shape) >= holes
        lengths = np.diff(offsets)
        first, last = np.flatnonzero(lengths)[[0, -1]]
        mask[..., offsets[first + 1] - 1] = False  # a sequence that ends on a masked step
        mask[..., offsets[last]:offsets[last] + 3] = False  # one that starts with a masked run
        case["mask"] = mask
    if dones:
        case["terminated"] = rng.random(shape) < dones
        case["truncated"] = rng.random(shape) < dones
    if per_step_gamma:
        case["gamma"] = rng.uniform(0.5, 1.0, shape)
        case["lam"] = rng.uniform(0.0, 1.0, (*batch, 1))
    if next_values:
        case["next_values"] = rng.standard_normal(shape)
    else:
        case["bootstrap_value"] = rng.standard_normal((*batch, count))
        if dones:  # random truncations, no final observations
            case["truncated_bootstrap"] = "next_step"
    return offsets, case


def per_sequence(loop, offsets, case, per_sequence_keys=("bootstrap_value",)):
    """The oracle: ``loop`` on each sequence alone, its results laid back in the packed row."""
    outputs = None
    total = case["rewards"].shape[-1]
    for i in range(len(offsets) - 1):
        steps = slice(offsets[i], offsets[i + 1])
        piece = {}
        for key, value in case.items():
            if key in per_sequence_keys and isinstance(value, np.ndarray):
                piece[key] = value[..., i]
            elif isinstance(value, np.ndarray) and value.shape[-1] == total:
                piece[key] = value[..., steps]
            else:
                piece[key] = value
        result = loop(**piece)
        result = result if isinstance(result, tuple) else (result,)
        if outputs is None:
            outputs = [np.zeros(case["rewards"].shape) for _ in result]
        for out, part in zip(outputs, result):
            out[..., steps] = part
    return outputs


CASES = {
    "plain": {},
    "empty sequences": {"empty": True, "holes": 0.2, "dones": 0.03},
    "holes": {"holes": 0.3},
    "dones+holes": {"holes": 0.3, "dones": 0.05},
    "per-step gamma": {"per_step_gamma": True, "dones": 0.02},
    "next_values": {"next_values": True, "holes": 0.2},
}


@pytest.mark.parametrize("case_name", list(CASES))
@pytest.mark.parametrize("batch", [(), (1,), (3,)])
def test_gae_packed_equals_a_loop_over_sequences(library, backend, case_name, batch):
    packed_backend(library, backend)
    rng = np.random.default_rng(list(CASES).index(case_name) * 10 + len(batch))
    offsets, case = make_packed(rng, batch, 300, 12, **CASES[case_name])
    want_a, want_r = per_sequence(gae_loop, offsets, case)
    arrays = converted(library, case)
    a, r = gae_xp.gae(**arrays, cu_seqlens=library.asarray(offsets), backend=backend)
    xp_assert_close(a, want_a, like=arrays["rewards"])
    xp_assert_close(r, want_r, like=arrays["rewards"])


def test_fill_masked_stays_inside_each_sequence(library, backend):
    packed_backend(library, backend)
    rng = np.random.default_rng(5)
    offsets, case = make_packed(rng, (2,), 200, 9, holes=0.4)
    want = [gae_xp.gae(**{k: v[..., s] if isinstance(v, np.ndarray) and v.shape[-1] == 200 else
                          (v[..., i] if k == "bootstrap_value" else v) for k, v in case.items()},
                       fill_masked=True, backend="xp")
            for i, s in enumerate(slice(offsets[i], offsets[i + 1]) for i in range(len(offsets) - 1))]
    arrays = converted(library, case)
    a, r = gae_xp.gae(**arrays, cu_seqlens=library.asarray(offsets), fill_masked=True, backend=backend)
    xp_assert_close(a, np.concatenate([w[0] for w in want], -1), like=arrays["rewards"])
    xp_assert_close(r, np.concatenate([w[1] for w in want], -1), like=arrays["rewards"])


def test_nothing_crosses_a_sequence_end(library, backend):
    packed_backend(library, backend)
    rng = np.random.default_rng(3)
    offsets, case = make_packed(rng, (), 120, 4, holes=0.2)
    case["rewards"][offsets[2]] = np.nan  # first step of sequence 2
    case["values"][offsets[2]] = np.inf
    case["bootstrap_value"][1] = np.inf  # a non-finite bootstrap of a terminated sequence stays out
    case["terminated"] = np.zeros(120, bool)
    real = np.flatnonzero(case["mask"][offsets[1]:offsets[2]]) + offsets[1]
    case["terminated"][real[-1]] = True
    arrays = converted(library, case)
    a, r = gae_xp.gae(**arrays, cu_seqlens=library.asarray(offsets), backend=backend)
    assert np.isfinite(to_numpy(a)[:offsets[2]]).all() and np.isfinite(to_numpy(r)[:offsets[2]]).all()
    want_a, want_r = per_sequence(gae_loop, offsets, case)
    xp_assert_close(a, want_a, like=arrays["rewards"])
    xp_assert_close(r, want_r, like=arrays["rewards"])


def test_float32_no_worse_than_the_float32_loop(library, backend):
    packed_backend(library, backend)
    rng = np.random.default_rng(11)
    offsets, case = make_packed(rng, (1,), 4096, 16, holes=0.1, dones=0.002)
    want_a, _ = per_sequence(gae_loop, offsets, case)
    single = {k: v.astype(np.float32) if isinstance(v, np.ndarray) and v.dtype == np.float64 else v
              for k, v in case.items()}
    loop_a, _ = per_sequence(gae_loop, offsets, single)
    a, _ = gae_xp.gae(**converted(library, single), cu_seqlens=library.asarray(offsets), backend=backend)
    assert a.dtype == library.xp.float32
    assert np.abs(to_numpy(a) - want_a).max() <= np.abs(loop_a - want_a).max()


@pytest.mark.parametrize("holes", [0.0, 0.3])
def test_discounted_returns_packed(library, backend, holes):
    packed_backend(library, backend)
    rng = np.random.default_rng(7)
    offsets, case = make_packed(rng, (2,), 250, 10, holes=holes, dones=0.03)
    case.pop("values"), case.pop("lam"), case.pop("truncated_bootstrap")
    want = per_sequence(discounted_returns_loop, offsets, case)[0]
    arrays = converted(library, case)
    got = gae_xp.discounted_returns(**arrays, cu_seqlens=library.asarray(offsets), backend=backend)
    xp_assert_close(got, want, like=arrays["rewards"])


@pytest.mark.parametrize("holes", [0.0, 0.3])
def test_lambda_returns_packed(library, backend, holes):
    packed_backend(library, backend)
    rng = np.random.default_rng(8)
    offsets, case = make_packed(rng, (2,), 250, 10, holes=holes, dones=0.03, next_values=True)
    case.pop("values")
    want = per_sequence(lambda_returns_loop, offsets, case)[0]
    arrays = converted(library, case)
    got = gae_xp.lambda_returns(**arrays, cu_seqlens=library.asarray(offsets), backend=backend)
    xp_assert_close(got, want, like=arrays["rewards"])


def test_time_axis_other_than_last():
    rng = np.random.default_rng(9)
    offsets, case = make_packed(rng, (2,), 100, 5, holes=0.2)
    want_a, want_r = gae_xp.gae(**case, cu_seqlens=offsets)
    moved = {k: np.moveaxis(v, -1, 0) if isinstance(v, np.ndarray) and v.shape[-1] == 100 else v
             for k, v in case.items()}
    a, r = gae_xp.gae(**moved, cu_seqlens=offsets, axis=0)
    np.testing.assert_allclose(np.moveaxis(a, 0, -1), want_a, atol=1e-12)
    np.testing.assert_allclose(np.moveaxis(r, 0, -1), want_r, atol=1e-12)


def test_one_sequence_is_the_unpacked_call():
    rng = np.random.default_rng(10)
    r, v = rng.standard_normal((2, 50)), rng.standard_normal((2, 50))
    packed = gae_xp.gae(r, v, cu_seqlens=np.array([0, 50]), bootstrap_value=np.array([[1.0], [2.0]]))
    plain = gae_xp.gae(r, v, bootstrap_value=np.array([1.0, 2.0]))
    np.testing.assert_allclose(packed[0], plain[0], atol=1e-12)
    np.testing.assert_allclose(packed[1], plain[1], atol=1e-12)


BAD_OFFSETS = [
    (np.array([0, 5, 3, 10]), ValueError, "non-decreasing"),
    ([0, 5, 3, 10], ValueError, "non-decreasing"),
    (np.array([1, 5, 10]), ValueError, "start at 0"),
    (np.array([0, 5, 9]), ValueError, "end at the length of the time axis, 10"),
    (np.array([0, 5, 11]), ValueError, "end at the length"),
    (np.array([0.0, 5.0, 10.0]), TypeError, "integer dtype"),
    (np.array([True, False]), TypeError, "integer dtype"),
    (np.array([[0, 5, 10]]), ValueError, "1-D"),
    (np.array([0]), ValueError, "end at the length of the time axis, 10, got 0"),  # no sequence: T must be 0
    (np.array([], dtype=np.int64), ValueError, "at least 1 entry"),
    ([], ValueError, "at least 1 entry"),
    ([0.0, 5.0, 10.0], TypeError, "integer dtype"),
    ([[0, 5], [10]], TypeError, "must hold integers"),
    ("0, 5, 10", TypeError, "cu_seqlens must be an array"),
]


@pytest.mark.parametrize("offsets,error,message", BAD_OFFSETS)
def test_bad_offsets_name_the_problem(offsets, error, message):
    with pytest.raises(error, match=message):
        gae_xp.gae(np.zeros(10), np.zeros(10), cu_seqlens=offsets)


def test_offsets_of_another_library_are_refused():
    torch = pytest.importorskip("torch")
    jnp = pytest.importorskip("jax.numpy")
    with pytest.raises(TypeError, match="cu_seqlens"):
        gae_xp.gae(torch.zeros(10), torch.zeros(10), cu_seqlens=jnp.asarray([0, 4, 10]))


@pytest.mark.parametrize("host", [list, tuple, np.asarray])
def test_host_offsets_serve_arrays_of_any_library(library, backend, host):
    """flash-attention keeps cu_seqlens_cpu beside the device tensors: a list, tuple or NumPy array of offsets
    gives the same numbers as offsets of the inputs' own library, and is never read from a device."""
    packed_backend(library, backend)
    offsets, case = make_packed(np.random.default_rng(12), (2,), 90, 6, holes=0.2, empty=True)
    arrays = converted(library, case)
    want = gae_xp.gae(**arrays, cu_seqlens=library.asarray(offsets), backend=backend)
    got = gae_xp.gae(**arrays, cu_seqlens=host(offsets.tolist()), backend=backend)
    for g, w in zip(got, want):
        xp_assert_close(g, to_numpy(w), like=arrays["rewards"])


def test_empty_sequences_have_no_output_and_their_bootstrap_is_not_read():
    r, v = np.ones(6), np.zeros(6)
    offsets = np.array([0, 0, 3, 3, 6, 6])
    bootstrap = np.array([np.nan, 1.0, np.inf, 2.0, np.nan])
    a, _ = gae_xp.gae(r, v, gamma=1.0, lam=1.0, cu_seqlens=offsets, bootstrap_value=bootstrap)
    np.testing.assert_array_equal(a, [4.0, 3.0, 2.0, 5.0, 4.0, 3.0])
    all_empty = gae_xp.gae(np.ones(0), np.ones(0), cu_seqlens=np.array([0, 0, 0]))
    assert all_empty[0].shape == (0,)


def test_bootstrap_per_sequence_must_fit():
    with pytest.raises(ValueError, match="one value per sequence"):
        gae_xp.gae(np.zeros(10), np.zeros(10), cu_seqlens=np.array([0, 4, 10]), bootstrap_value=np.zeros(3))
