"""The plan cache of ``gae()`` (``gae_xp/_plans.py``, ``backends/_numba_plan.py``): never wrong, bounded, thread-safe.

The property draws sequences of calls of random layouts (library, dtype,
shape, time axis, strides, options, coefficients), repeating earlier
layouts with new data, and checks every call against the same call without
the cache and against the float64 reference; a spy on the cache checks
that a plan serves only calls of the layout it was made from.
"""

from __future__ import annotations

import threading
from contextlib import contextmanager
from unittest import mock

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import gae_xp
from gae_xp import _plans
from gae_xp.reference import gae_loop

torch = pytest.importorskip("torch")

OPTIONS = ("next_values", "terminated", "truncated", "mask")


@contextmanager
def uncached():
    """Within this block every gae() call takes the full path (no key, so no plan is looked up or made)."""
    with mock.patch.object(_plans, "gae_key", lambda *args: (None, None)):
        yield


@contextmanager
def spied():
    """Records, per call, the plan that served it (``served``) and the plan it made (``made``)."""
    events = {"served": [], "made": []}
    get, put = _plans.PLANS.get, _plans.PLANS.put

    def spy_get(key):
        plan = get(key)
        if plan is not None:
            events["served"].append(plan)
        return plan

    def spy_put(key, plan):
        events["made"].append(plan)
        put(key, plan)

    with mock.patch.object(_plans.PLANS, "get", spy_get), mock.patch.object(_plans.PLANS, "put", spy_put):
        yield events


@st.composite
def layouts(draw, full: bool = True):
    """A call's layout: everything but the data. ``full=False`` draws from fewer kernel types (each new one
    compiles for seconds), for the quick test; the slow one draws from all."""
    def one_of(everything, quick):
        return draw(st.sampled_from(everything if full else quick))

    ndim = draw(st.integers(1, 3))
    shape = tuple(draw(st.lists(st.integers(1, 4), min_size=ndim, max_size=ndim)))
    axis = draw(st.integers(-ndim, ndim - 1) if full else st.sampled_from([-1, 0]))
    options = st.sets(st.sampled_from(OPTIONS)) if full else st.sampled_from([(), ("mask", "terminated")])
    return {
        "library": draw(st.sampled_from(["numpy", "torch"])),
        "dtype": draw(st.sampled_from(["float32", "float64"])),
        "shape": shape,
        "axis": axis,
        "strides": one_of(["contiguous", "strided", "broadcast-values"], ["contiguous", "strided"]),
        "options": tuple(sorted(draw(options))),
        "gamma": one_of([0.99, 1.0, 0.0, 1, "array"], [0.99, 0.0, 1, "array"]),
        "lam": one_of([0.95, 0.5, "array"], [0.95, 0.5]),
        "critic_lam": one_of([None, 1.0, "array"], [None]),
        "bootstrap": one_of([None, 0.25, "array"], [None, 0.25]),
        "fill_masked": draw(st.booleans()),
        "backend": one_of(["auto", "numba", "xp"], ["auto", "xp"]),
    }


def make_call(layout, rng):
    """(gae()'s keyword arguments, the same as float64 NumPy arrays for the reference) for a layout, new data."""
    shape, axis = layout["shape"], layout["axis"]
    dtype = np.dtype(layout["dtype"])
    coefficient_shape = tuple(1 if i == axis % len(shape) else n for i, n in enumerate(shape))

    def floats(base_shape=shape):
        if layout["strides"] == "strided":  # every other element of a longer last axis (a view, not contiguous)
            return rng.standard_normal((*base_shape[:-1], 2 * base_shape[-1])).astype(dtype)[..., ::2]
        return rng.standard_normal(base_shape).astype(dtype)

    host = {"rewards": floats()}
    if layout["strides"] == "broadcast-values":  # values with a stride 0 on the time axis
        host["values"] = np.broadcast_to(np.take(floats(), [0], axis=axis), shape)
    else:
        host["values"] = floats()
    options = layout["options"]
    if "next_values" in options:
        host["next_values"] = floats()
    for name, p in (("terminated", 0.2), ("truncated", 0.2), ("mask", 0.8)):
        if name in options:
            host[name] = rng.random(shape) < p
    for name in ("gamma", "lam", "critic_lam"):
        if layout[name] == "array":
            host[name] = rng.uniform(0.0, 1.0, coefficient_shape).astype(dtype)
        elif layout[name] is not None:
            host[name] = layout[name]
    batch = tuple(n for i, n in enumerate(shape) if i != axis % len(shape))
    if layout["bootstrap"] == "array":
        host["bootstrap_value"] = rng.standard_normal(batch).astype(dtype)
    elif layout["bootstrap"] is not None and "next_values" not in options:
        host["bootstrap_value"] = layout["bootstrap"]
    if "next_values" in options:
        host.pop("bootstrap_value", None)
    if "truncated" in options and "next_values" not in options:
        host.pop("truncated")
    def to_library(a):
        if layout["library"] != "torch":
            return a
        if not a.flags.writeable:  # the broadcast values: torch's own stride-0 view
            return torch.from_numpy(np.ascontiguousarray(np.take(a, [0], axis=axis))).expand(a.shape)
        return torch.from_numpy(a)

    kwargs = {name: to_library(value) if isinstance(value, np.ndarray) else value for name, value in host.items()}
    kwargs.update(axis=axis, fill_masked=layout["fill_masked"], backend=layout["backend"])
    reference = {name: value.astype(np.float64) if isinstance(value, np.ndarray) and value.dtype != bool else value
                 for name, value in host.items()}
    reference.update(axis=axis, fill_masked=layout["fill_masked"])
    return kwargs, reference


def description(kwargs):
    """What the test itself reads as a call's layout (independent of ``gae_key``); the stride of an axis of one
    element is left out: it never addresses a second element, so arrays that differ only there share a layout."""
    def strides(shape, steps):
        return tuple(step if size != 1 else None for size, step in zip(shape, steps))

    def one(value):
        if isinstance(value, np.ndarray):
            return "numpy", str(value.dtype), value.shape, strides(value.shape, value.strides)
        if isinstance(value, torch.Tensor):
            return "torch", str(value.dtype), tuple(value.shape), strides(value.shape, value.stride())
        return type(value).__name__, value if type(value) is not float or value != value else "nan"
    return tuple(sorted((name, one(value) if name != "bootstrap_value" or not isinstance(value, float) else "float")
                        for name, value in kwargs.items()))


def as_numpy(x):
    return x.numpy() if isinstance(x, torch.Tensor) else np.asarray(x)


def check_call(kwargs, reference, events, made_by):
    served_before, made_before = len(events["served"]), len(events["made"])
    got = gae_xp.gae(**kwargs)
    with uncached():
        fresh = gae_xp.gae(**kwargs)
    for g, f in zip(got, fresh):
        assert type(g) is type(f) and g.dtype == f.dtype and tuple(g.shape) == tuple(f.shape)
        np.testing.assert_array_equal(as_numpy(g), as_numpy(f))
        for name, value in kwargs.items():
            if isinstance(value, (np.ndarray, torch.Tensor)):
                assert not np.shares_memory(as_numpy(g), as_numpy(value)), name
    expected = gae_loop(**reference)
    tolerance = 1e-4 if kwargs["rewards"].dtype in (np.float32, torch.float32) else 1e-9
    for g, e in zip(got, expected):
        np.testing.assert_allclose(as_numpy(g).astype(np.float64), e, rtol=tolerance, atol=tolerance)
    layout = description(kwargs)
    for plan in events["served"][served_before:]:
        assert made_by[id(plan)] == layout, "a plan served a call of another layout"
    for plan in events["made"][made_before:]:
        made_by[id(plan)] = layout
    return len(events["served"]) > served_before


def check_sequence(steps, seed):
    """Each step is a new layout, an earlier one again, or an earlier one with one field changed (new data each
    time: the integer and the field name say which); every call must equal
    the uncached call bit for bit and the float64 loop within float tolerance, and the second call of a layout is
    served by a plan made from that layout."""
    rng = np.random.default_rng(seed)
    _plans.PLANS.clear()
    seen, made_by, hits = [], {}, 0
    with spied() as events:
        for layout, repeat, field in steps:
            if seen and repeat < 2:  # an earlier layout again
                layout = seen[repeat % len(seen)]
            elif seen and repeat < 9:  # an earlier layout with one thing changed (the shape and axis go together)
                changed = ("shape", "axis") if field in ("shape", "axis") else (field,)
                layout = {**seen[repeat % len(seen)], **{name: layout[name] for name in changed}}
            seen.append(layout)
            for _ in range(2):
                kwargs, reference = make_call(layout, rng)
                hits += check_call(kwargs, reference, events, made_by)
    assert hits >= len(steps)


def sequences(full: bool, max_size: int):
    fields = st.sampled_from(["library", "dtype", "shape", "strides", "options", "gamma", "lam", "critic_lam",
                              "bootstrap", "fill_masked", "backend"])
    return st.lists(st.tuples(layouts(full), st.integers(0, 9), fields), min_size=1, max_size=max_size)


@given(sequences(full=False, max_size=5), st.integers(0, 2**32 - 1))
def test_every_call_of_a_random_sequence_equals_the_uncached_call_and_the_reference(steps, seed):
    check_sequence(steps, seed)


@pytest.mark.slow
@given(sequences(full=True, max_size=8), st.integers(0, 2**32 - 1))
def test_every_call_of_a_random_sequence_of_every_layout_equals_the_uncached_call_and_the_reference(steps, seed):
    check_sequence(steps, seed)


def test_a_plan_keeps_the_checks_that_read_the_data():
    """An array gamma/lam/critic_lam is range-checked on every call; its error is the full path's."""
    rewards = np.zeros((4, 16), np.float32)
    good = np.full((4, 1), 0.9, np.float32)
    for name in ("gamma", "lam", "critic_lam"):
        _plans.PLANS.clear()
        gae_xp.gae(rewards, rewards, **{name: good})
        gae_xp.gae(rewards, rewards, **{name: good})
        assert len(_plans.PLANS) == 1
        for bad in (good * 2, good * np.nan, -good):
            with pytest.raises(ValueError, match=f"{name} must hold values in"):
                gae_xp.gae(rewards, rewards, **{name: bad})


def test_a_refused_layout_makes_no_plan_and_raises_every_time():
    rewards = np.zeros((4, 16), np.float32)
    _plans.PLANS.clear()
    gae_xp.gae(rewards, rewards, gamma=0.99)  # a plan for gamma 0.99 is not one for 1.5
    for _ in range(2):
        with pytest.raises(ValueError, match="gamma must be in"):
            gae_xp.gae(rewards, rewards, gamma=1.5)
        with pytest.raises(ValueError, match="values must have the shape of rewards"):
            gae_xp.gae(rewards, rewards[:, :8])
        with pytest.raises(TypeError, match="terminated must have dtype bool"):
            gae_xp.gae(rewards, rewards, terminated=np.zeros((4, 16), np.float32))
    assert len(_plans.PLANS) == 1


def test_a_plan_made_with_truncated_bootstrap_next_step_never_serves_a_call_without_it():
    """truncated_bootstrap is part of the layout: a plan made by an opted-in call must not let a later call with
    truncated and no next_values skip its ValueError (the option was missing from the key at first)."""
    _plans.PLANS.clear()
    rewards = np.ones((2, 8), np.float32)
    truncated = np.zeros((2, 8), bool)
    truncated[:, 3] = True
    gae_xp.gae(rewards, rewards, truncated=truncated, truncated_bootstrap="next_step")
    gae_xp.gae(rewards, rewards, truncated=truncated, truncated_bootstrap="next_step")
    with pytest.raises(ValueError, match="next_values"):
        gae_xp.gae(rewards, rewards, truncated=truncated)


@pytest.mark.parametrize("backend", ["xp", "auto"])
def test_a_plan_serves_an_opted_in_truncated_call_again_with_the_next_steps_value(backend):
    """The plan that runs the checks again (the xp backend's) keeps truncated_bootstrap="next_step": the second
    opted-in call equals the first and the reference instead of raising the ValueError of a call without it."""
    _plans.PLANS.clear()
    rng = np.random.default_rng(3)
    rewards, values = rng.standard_normal((2, 2, 16))
    truncated = rng.random((2, 16)) < 0.2
    want = gae_loop(rewards, values, truncated=truncated, gamma=0.9, lam=0.8, truncated_bootstrap="next_step")
    with spied() as events:
        for _ in range(2):
            got = gae_xp.gae(rewards, values, gamma=0.9, lam=0.8, truncated=truncated, backend=backend,
                             truncated_bootstrap="next_step")
            for array, reference in zip(got, want):
                np.testing.assert_allclose(array, reference, rtol=1e-12, atol=1e-12)
    assert len(events["made"]) == 1 and len(events["served"]) == 1


@pytest.mark.parametrize("kind", ["requires grad", "xp backend"])
def test_a_plan_on_the_backend_chosen_keeps_truncated_bootstrap(kind):
    """A plan that runs the checks again (``ChosenBackendPlan``) runs them with the call's truncated_bootstrap:
    the second opted-in call is served like the first, not refused (it ran them with the default at first)."""
    _plans.PLANS.clear()
    rng = np.random.default_rng(5)
    truncated = rng.random((2, 9)) < 0.3
    for _ in range(2):
        rewards, values = rng.standard_normal((2, 9)), rng.standard_normal((2, 9))
        expected = gae_loop(rewards, values, truncated=truncated, truncated_bootstrap="next_step")
        if kind == "requires grad":
            arguments = dict(rewards=torch.from_numpy(rewards), values=torch.from_numpy(values).requires_grad_(),
                             truncated=torch.from_numpy(truncated))
        else:
            arguments = dict(rewards=rewards, values=values, truncated=truncated, backend="xp")
        out = gae_xp.gae(**arguments, truncated_bootstrap="next_step")
        for got, want in zip(out, expected):
            np.testing.assert_allclose(np.asarray(got.detach() if kind == "requires grad" else got), want,
                                       rtol=1e-12, atol=1e-12)
    assert len(_plans.PLANS) == 1


def test_calls_without_a_key_take_the_full_path():
    """Another library or kind of argument, packed sequences, traced or wrapped tensors: no key."""
    rewards = np.zeros((2, 8), np.float32)
    args = dict(gamma=0.99, lam=0.95, bootstrap_value=None, next_values=None, terminated=None, truncated=None,
                mask=None, axis=-1, chunk_size=None, backend="auto", fill_masked=False, cu_seqlens=None,
                critic_lam=None, truncated_bootstrap="next_values")
    assert _plans.gae_key(rewards, rewards, **args)[0] is not None
    for change in ({"cu_seqlens": [0, 8]}, {"gamma": np.float32(0.9)}, {"bootstrap_value": np.float64(1.0)},
                   {"axis": np.int64(-1)}, {"mask": rewards.tolist()}, {"fill_masked": np.bool_(False)}):
        assert _plans.gae_key(rewards, rewards, **{**args, **change})[0] is None, change
    assert _plans.gae_key(rewards.view(np.ma.MaskedArray), rewards, **args)[0] is None
    tensor = torch.zeros(2, 8)
    assert _plans.gae_key(tensor, rewards, **args)[0] is None  # two libraries
    assert _plans.gae_key(torch.nn.Parameter(tensor), tensor, **args)[0] is None  # a subclass
    assert torch.func.vmap(lambda t: torch.tensor(_plans.gae_key(t, t, **args)[0] is None))(tensor).all()
    seen = []

    def loss(t):  # under torch.func.grad the tensor is wrapped: it has no NumPy view and gets no key
        seen.append(_plans.gae_key(t, t.detach(), **args))
        return t.sum()

    torch.func.grad(loss)(tensor)
    assert seen == [(None, None)]


def test_requires_grad_and_the_generic_backend_are_served_on_the_backend_chosen():
    """A tensor that requires grad keeps its gradient through a plan (the custom operator's backend)."""
    rewards = torch.randn(3, 10, dtype=torch.float64)
    _plans.PLANS.clear()
    grads = []
    for _ in range(2):
        values = torch.randn(3, 10, dtype=torch.float64, requires_grad=True)
        advantages, _ = gae_xp.gae(rewards, values)
        advantages.sum().backward()
        with uncached():
            again = values.detach().requires_grad_()
            gae_xp.gae(rewards, again)[0].sum().backward()
        torch.testing.assert_close(values.grad, again.grad)
        grads.append(values.grad)
    assert len(_plans.PLANS) == 1


def test_the_cache_is_bounded_and_least_recently_used():
    cache = _plans.PlanCache(maxsize=2)
    cache.put("a", 1)
    cache.put("b", 2)
    assert cache.get("a") == 1  # now "b" is the least recently used
    cache.put("c", 3)
    assert (cache.get("a"), cache.get("b"), cache.get("c")) == (1, None, 3)
    assert len(cache) == 2


def test_use_reorders_the_cache_once_it_is_half_full():
    """Below half full no plan is near eviction and a lookup leaves the order alone; above it, use counts."""
    cache = _plans.PlanCache(maxsize=4)
    cache.put("a", 1)
    cache.put("b", 2)
    assert cache.get("a") == 1  # two of four: not reordered, "a" is still the oldest
    cache.put("c", 3)
    assert cache.get("b") == 2  # three of four: "b" becomes the most recently used
    cache.put("d", 4)
    cache.put("e", 5)  # evicts "a", the oldest
    cache.put("f", 6)  # evicts "c": "b" was used after it
    assert [cache.get(k) for k in "abcdef"] == [None, 2, None, 4, 5, 6]


def test_threads_calling_with_many_layouts_at_once_get_their_own_results():
    _plans.PLANS.clear()
    rng = np.random.default_rng(0)
    calls = []
    for shape in [(2, 8), (3, 8), (2, 9), (8,), (2, 2, 5)]:
        for options in ({}, {"mask": rng.random(shape) < 0.8}):
            r, v = rng.standard_normal(shape).astype(np.float32), rng.standard_normal(shape).astype(np.float32)
            with uncached():
                calls.append(((r, v, options), gae_xp.gae(r, v, **options)))
    errors = []

    def work(offset):
        try:
            for i in range(200):
                (r, v, options), expected = calls[(i + offset) % len(calls)]
                got = gae_xp.gae(r, v, **options)
                for g, e in zip(got, expected):
                    np.testing.assert_array_equal(g, e)
        except BaseException as error:
            errors.append(error)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    with mock.patch.object(_plans.PLANS, "maxsize", 3):  # plans are evicted while others are served
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    assert not errors, errors[0]


def test_dual_tensors_keep_their_tangents_after_a_plan_was_made():
    """Inside ``forward_ad.dual_level()`` no call gets a key: a dual tensor of a layout that has a plan still takes
    the path that carries its tangent."""
    from torch.autograd import forward_ad

    rewards, values = torch.randn(3, 10, dtype=torch.float64), torch.randn(3, 10, dtype=torch.float64)
    _plans.PLANS.clear()
    gae_xp.gae(rewards, values)
    gae_xp.gae(rewards, values)
    tangent = torch.randn(3, 10, dtype=torch.float64)
    with forward_ad.dual_level():
        advantages, _ = gae_xp.gae(rewards, forward_ad.make_dual(values, tangent))
        got = forward_ad.unpack_dual(advantages).tangent
    with uncached(), forward_ad.dual_level():
        advantages, _ = gae_xp.gae(rewards, forward_ad.make_dual(values, tangent))
        want = forward_ad.unpack_dual(advantages).tangent
    assert got is not None
    torch.testing.assert_close(got, want)


def test_numpy_and_torch_of_one_layout_have_plans_of_their_own():
    """A torch CPU tensor is keyed by its NumPy view's layout, with the library in the key: a NumPy call and a
    torch call of the same dtype, shape and strides never share a plan, and each gets its own kind back."""
    rewards = np.random.default_rng(0).standard_normal((3, 12)).astype(np.float32)
    values = np.random.default_rng(1).standard_normal((3, 12)).astype(np.float32)
    _plans.PLANS.clear()
    for _ in range(2):
        from_numpy = gae_xp.gae(rewards, values)
        from_torch = gae_xp.gae(torch.from_numpy(rewards), torch.from_numpy(values))
        assert all(type(a) is np.ndarray for a in from_numpy) and all(type(a) is torch.Tensor for a in from_torch)
        for a, b in zip(from_numpy, from_torch):
            np.testing.assert_array_equal(a, b.numpy())
    assert len(_plans.PLANS) == 2
    key, views = _plans.gae_key(torch.from_numpy(rewards), torch.from_numpy(values), 0.99, 0.95, None, None, None,
                                None, None, -1, None, "auto", False, None, None, "next_values")
    assert key is not None and all(type(v) is np.ndarray for v in views[:2]) and views[2:] == [None] * 4
    for other in (torch.from_numpy(rewards).to(torch.bfloat16), torch.from_numpy(rewards).requires_grad_()):
        other_key, other_views = _plans.gae_key(other, other, 0.99, 0.95, None, None, None, None, None, -1, None,
                                                "auto", False, None, None, "next_values")
        assert other_key not in (None, key) and other_views[:2] == [None, None]  # keyed as tensors


@pytest.mark.parametrize("backend", ["auto", "numba", "xp"])
def test_tensors_kept_negated_lazily_are_read_as_their_values(backend):
    """torch keeps ``z.conj().imag`` negated lazily (a negative bit: its memory holds the values' negatives). Such
    rewards, values and bootstrap values give what their materialised copies give, on the full path and served
    by a plan; the key tells them from a plain tensor of the same layout, either coming first; the loop agrees."""
    rng = np.random.default_rng(7)

    def negated(values):
        return torch.complex(torch.zeros_like(values), -values).conj().imag

    plain = [torch.tensor(rng.standard_normal((3, 9))) for _ in range(2)]
    bootstrap = torch.tensor(rng.standard_normal(3))
    lazy = [negated(x) for x in plain]
    assert all(x.is_neg() for x in lazy) and torch.equal(lazy[0], plain[0])
    want = gae_loop(plain[0].numpy(), plain[1].numpy(), gamma=0.9, lam=0.8,
                              bootstrap_value=bootstrap.numpy())
    _plans.PLANS.clear()
    for order in ((plain, lazy), (lazy, plain)):
        for arrays in (*order, *order):
            boot = negated(bootstrap) if arrays is lazy else bootstrap
            got = gae_xp.gae(*arrays, gamma=0.9, lam=0.8, bootstrap_value=boot, backend=backend)
            for a, w in zip(got, want):
                np.testing.assert_allclose(a.numpy(), w, rtol=1e-12, atol=1e-12)
        _plans.PLANS.clear()
    key = _plans.gae_key(*plain, 0.9, 0.8, None, None, None, None, None, -1, None, backend, False, None, None,
                         "next_values")[0]
    assert key != _plans.gae_key(*lazy, 0.9, 0.8, None, None, None, None, None, -1, None, backend, False, None, None,
                                 "next_values")[0]


@pytest.mark.parametrize("library", ["numpy", "torch"])
def test_a_call_whose_layout_is_its_own_arrays_binds_them_and_skips_prepare(library):
    """On a backend without a plan of its own (the generic scan here), a call whose arrays reach the problem as
    they are gets a ``BoundLayoutPlan``: the next call of its layout runs no ``prepare`` and equals the uncached
    call bit for bit; a call whose arrays ``prepare`` moves, casts or checks by value gets the plan that runs the
    checks again."""
    from gae_xp import _prepare

    rng = np.random.default_rng(7)

    def arrays(**options):
        r, v = rng.standard_normal((2, 3, 12)).astype(np.float32)
        call = dict(rewards=r, values=v, terminated=rng.random((3, 12)) < 0.2, mask=rng.random((3, 12)) < 0.8,
                    bootstrap_value=rng.standard_normal(3).astype(np.float32), backend="xp", **options)
        if library == "torch":
            call = {k: torch.from_numpy(a) if isinstance(a, np.ndarray) else a for k, a in call.items()}
        return call

    _plans.PLANS.clear()
    with spied() as events:
        gae_xp.gae(**arrays(gamma=0.9, lam=0.7))
        call = arrays(gamma=0.9, lam=0.7)
        with mock.patch.object(_prepare, "prepare", side_effect=AssertionError("prepare ran on a bound plan")):
            got = gae_xp.gae(**call)
        with uncached():
            fresh = gae_xp.gae(**call)
    assert [type(plan) for plan in events["made"]] == [_plans.BoundLayoutPlan]
    assert len(events["served"]) == 1
    for g, f in zip(got, fresh):
        np.testing.assert_array_equal(as_numpy(g), as_numpy(f))
    for options in ({"gamma": np.full((3, 1), 0.9, np.float32)}, {"axis": 0}):
        _plans.PLANS.clear()
        call = arrays(**options)
        if "axis" in options:  # time first: prepare moves the axis
            call = {k: (a.T if k != "bootstrap_value" else a) if hasattr(a, "shape") else a for k, a in call.items()}
        with spied() as events:
            gae_xp.gae(**call)
        assert [type(plan) for plan in events["made"]] == [_plans.ChosenBackendPlan], options


def test_each_backend_gets_its_own_plan_from_the_registry():
    """The numba backend's calls are served by its own plan (``backends.PLAN_MODULES`` names the module: the
    backend's module does not import it), the generic path's by a plan that binds the next call's arrays; a
    look-alike of a registered backend gets none of the registered plans."""
    from types import SimpleNamespace

    from gae_xp import backends

    pytest.importorskip("numba")
    rewards = np.zeros((4, 16), np.float32)
    for backend, kind in {"numba": "NumbaPlan", "xp": "BoundLayoutPlan"}.items():
        _plans.PLANS.clear()
        gae_xp.gae(rewards, rewards, backend=backend)
        (plan,) = _plans.PLANS._plans.values()
        assert type(plan).__name__ == kind
    assert backends.plan_maker(backends.load("xp")) is None
    assert backends.plan_maker(SimpleNamespace(name="numba")) is None


def test_a_kept_plan_holds_none_of_the_callers_arrays():
    """A ``BoundLayoutPlan`` binds each call's arrays: the first call's memory is not kept with the plan."""
    import gc
    import weakref

    rewards, values = np.random.default_rng(3).normal(size=(2, 2, 50)), np.random.default_rng(4).normal(size=(2, 2, 50))
    gae_xp.gae(rewards, values, backend="xp")
    kept = [weakref.ref(rewards), weakref.ref(values)]
    (plan,) = [p for p in _plans.PLANS._plans.values() if type(p) is _plans.BoundLayoutPlan][-1:]
    del rewards, values
    gc.collect()
    assert [ref() for ref in kept] == [None, None]
    fresh = np.random.default_rng(5).normal(size=(2, 2, 50)), np.random.default_rng(6).normal(size=(2, 2, 50))
    np.testing.assert_allclose(plan(*fresh, 0.99, 0.95, None, None, None, None, None, None)[0], gae_loop(*fresh)[0],
                               rtol=1e-10, atol=1e-10)


def test_a_plan_whose_kernel_fails_to_compile_is_dropped_and_the_full_path_answers(monkeypatch):
    """A served call that meets a compiler's failure (a kernel of a new specialisation) is answered by the full path,
    which falls back where ``auto`` chose; the plan is forgotten. A caller's error still propagates."""
    rewards, values = np.random.default_rng(7).normal(size=(3, 40)), np.random.default_rng(8).normal(size=(3, 40))
    gae_xp.gae(rewards, values)
    key, _ = _plans.gae_key(rewards, values, 0.99, 0.95, None, None, None, None, None, -1, None, "auto", False, None,
                            None, "next_values")
    assert _plans.PLANS.get(key) is not None

    def failing(*args):
        raise ImportError("a compiler's library failed to load")

    monkeypatch.setitem(_plans.PLANS._plans, key, failing)
    np.testing.assert_allclose(gae_xp.gae(rewards, values)[0], gae_loop(rewards, values)[0], rtol=1e-10, atol=1e-10)
    assert _plans.PLANS.get(key) is not failing

    def refusing(*args):
        raise ValueError("gamma must lie in [0, 1]")

    monkeypatch.setitem(_plans.PLANS._plans, key, refusing)
    with pytest.raises(ValueError, match="gamma must lie"):
        gae_xp.gae(rewards, values)
