"""The numba CPU kernels (``gae_xp.backends._numba_kernels``) against the float64 loop.

The kernels cut a row into windows of lanes advanced in lockstep and joined
by a fix-up, so these tests aim at what that could break: lengths around a
lane and a window, cuts and non-finite numbers on either side of a lane's
edge, packed sequences (empty ones included) whose ends fall anywhere in a
window, an incoming carry, per-step coefficients, ``critic_lam`` (the second
chain of the same pass), ``fill_masked``, the work units shared between threads,
and the on-disk cache. Forked children are in ``test_hardening.py`` (13).
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import numpy as np
import pytest
from conftest import load_target
from helpers import xp_assert_close
from hypothesis import given
from hypothesis import strategies as st

import gae_xp
from gae_xp import _prepare, reference
from gae_xp.testing import make_case


@pytest.fixture(scope="module")
def kernels():
    load_target("numpy/numba")
    from gae_xp.backends import _numba_kernels

    return _numba_kernels


@pytest.fixture(scope="module")
def numba_cpu(kernels):
    from gae_xp.backends import numba_cpu

    return numba_cpu


WINDOW, LANE = 1024, 128  # checked against the module by test_the_layout_the_tests_aim_at
#: Lengths that put a row's end, a window's start and a lane's edge next to each other.
EDGES = [0, 1, LANE - 1, LANE, LANE + 1, WINDOW - 1, WINDOW, WINDOW + 1, 2 * WINDOW + LANE - 1, 3 * WINDOW + 7]
#: The combinations of optional arrays the kernels are compiled for (one compilation each, cached on disk).
KINDS = {
    "constant": {},
    "dones": {"dones": 0.03},
    "mask": {"holes": 0.3},
    "dones+mask": {"dones": 0.02, "holes": 0.2, "padding": 40},
    "per-step gamma, per-row lam": {"per_step_gamma": True, "per_row_lam": True, "dones": 0.01},
    "next_values": {"next_values": True, "dones": 0.05, "holes": 0.1},
}
discount = st.sampled_from([0.0, 0.5, 0.9, 0.99, 1.0])


def test_the_layout_the_tests_aim_at(kernels):
    assert (kernels.WINDOW, kernels.LANE, kernels.LANES) == (WINDOW, LANE, WINDOW // LANE)


def test_the_kernels_unpack_the_problems_per_step_fields_in_order(numba_cpu):
    from gae_xp._problem import PER_STEP

    assert numba_cpu.STEPS == ("next_values", "terminated", "truncated", "mask", "gamma", "lam", "critic_lam")
    assert numba_cpu.STEPS == tuple(n for n in PER_STEP if n not in ("rewards", "values"))


def _critic(draw, rng, shape):
    choice = draw(st.sampled_from(["none", "float", "array"]))
    if choice == "none":
        return {}
    if choice == "float":
        return {"critic_lam": draw(discount)}
    return {"critic_lam": rng.uniform(0.0, 1.0, shape)}


@st.composite
def rows(draw):
    kind = draw(st.sampled_from(sorted(KINDS)))
    length = draw(st.one_of(st.sampled_from(EDGES), st.integers(0, 3 * WINDOW + 10)))
    shape = (draw(st.integers(1, 3)), length)
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    options = dict(KINDS[kind])
    if options.get("padding", 0) > length:
        options["padding"] = length
    bootstrap = draw(st.booleans()) and not options.get("next_values")  # next_values replace the bootstrap value
    case = make_case(rng, shape, gamma=draw(discount), lam=draw(discount), bootstrap=bootstrap, **options)
    case.update(_critic(draw, rng, shape))
    return case, draw(st.booleans()), draw(st.sampled_from([np.float64, np.float32]))


def _cast(case, dtype):
    return {k: v.astype(dtype) if isinstance(v, np.ndarray) and v.dtype.kind == "f" else v for k, v in case.items()}


@given(rows())
def test_rows_equal_the_loop(kernels, drawn):
    case, fill_masked, dtype = drawn
    arrays = _cast(case, dtype)
    before = {k: v.copy() for k, v in arrays.items() if isinstance(v, np.ndarray)}
    advantages, returns = gae_xp.gae(**arrays, fill_masked=fill_masked, backend="numba")
    want_a, want_r = reference.gae_loop(**case, fill_masked=fill_masked)
    xp_assert_close(advantages, want_a, like=arrays["rewards"])
    xp_assert_close(returns, want_r, like=arrays["rewards"])
    for name, value in before.items():
        np.testing.assert_array_equal(arrays[name], value, err_msg=f"{name} was modified")
    assert not np.shares_memory(advantages, returns)


# --- packed sequences, empty ones included, and an incoming carry ------------------------------------------------


def _segment_reference(case, offsets, bootstrap, carry, fill_masked):
    """The loop on each segment alone with its bootstrap value; with a carry (finite bootstrap values), on the
    segment extended by one real step whose value is the bootstrap value and whose advantage is the carry (reward
    carry + bootstrap, nothing after it): what the segment's end sees."""
    n_rows = case["rewards"].shape[0]
    advantages = np.zeros(case["rewards"].shape)
    returns = np.zeros(case["rewards"].shape)
    for i in range(offsets.shape[0] - 1):
        lo, hi = offsets[i], offsets[i + 1]
        if lo == hi:
            continue
        extended = {}
        for name, value in case.items():
            if not isinstance(value, np.ndarray) or value.shape[-1] != case["rewards"].shape[-1]:
                extended[name] = value  # a float, or one value per row
            elif carry is None:
                extended[name] = value[:, lo:hi]
            else:
                extra = {"rewards": carry[:, i] + bootstrap[:, i], "values": bootstrap[:, i],
                         "next_values": np.zeros(n_rows), "terminated": np.zeros(n_rows, bool),
                         "truncated": np.zeros(n_rows, bool), "mask": np.ones(n_rows, bool)}.get(name, np.ones(n_rows))
                extra = np.asarray(extra, dtype=value.dtype)[:value.shape[0], None]
                extended[name] = np.concatenate([value[:, lo:hi], extra], axis=1)
        if carry is None:
            boundary = {} if "next_values" in case else {"bootstrap_value": bootstrap[:, i]}
            a, r = reference.gae_loop(**extended, **boundary, fill_masked=fill_masked)
            advantages[:, lo:hi], returns[:, lo:hi] = a, r
        else:
            a, r = reference.gae_loop(**extended, fill_masked=fill_masked)
            advantages[:, lo:hi], returns[:, lo:hi] = a[:, :-1], r[:, :-1]
    return advantages, returns


@st.composite
def packed(draw):
    kind = draw(st.sampled_from(sorted(KINDS)))
    lengths = draw(st.lists(st.one_of(st.just(0), st.integers(1, 40), st.integers(LANE - 2, WINDOW + 3)),
                            min_size=1, max_size=12))
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    n_rows = draw(st.integers(1, 2))
    shape = (n_rows, int(offsets[-1]))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    options = {k: v for k, v in KINDS[kind].items() if k != "padding"}
    case = make_case(rng, shape, gamma=draw(discount), lam=draw(discount), **options)
    bootstrap = rng.standard_normal((n_rows, len(lengths)))
    carry = rng.standard_normal((n_rows, len(lengths))) if draw(st.booleans()) else None
    return case, offsets, bootstrap, carry, draw(st.booleans())


@given(packed())
def test_packed_sequences_and_carries_equal_the_loop_per_sequence(numba_cpu, drawn):
    case, offsets, bootstrap, carry, fill_masked = drawn
    if "next_values" in case:  # they replace the bootstrap value
        bootstrap = np.zeros_like(bootstrap)
    boundary = {} if "next_values" in case else {"bootstrap_value": bootstrap}
    call = _prepare.prepare(**case, **boundary, cu_seqlens=offsets, fill_masked=fill_masked, backend="numba")
    problem = call.problem.replace(carry=None if carry is None else np.asarray(carry))
    advantages, returns = numba_cpu.BACKEND.gae(problem, chunk_size=None)
    want_a, want_r = _segment_reference(case, offsets, bootstrap, carry, fill_masked)
    xp_assert_close(advantages, want_a, like=case["rewards"])
    xp_assert_close(returns, want_r, like=case["rewards"])


def test_a_carry_and_critic_lam_together_are_refused(numba_cpu):
    r = np.zeros((1, 10))
    problem = _prepare.prepare(r, r, critic_lam=1.0, backend="numba").problem.replace(carry=np.zeros((1, 1)))
    with pytest.raises(ValueError, match="carry"):
        numba_cpu.BACKEND.gae(problem, chunk_size=None)


# --- exact cuts and non-finite numbers at a lane's edge  --------------------------------------------------------


@pytest.mark.parametrize("kind", sorted(KINDS))
@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
@pytest.mark.parametrize("where", [LANE, 2 * LANE - 1, WINDOW, WINDOW + 1])
def test_a_cut_at_a_lane_edge_stops_a_non_finite_number(kernels, kind, bad, where):
    length = 3 * WINDOW
    case = make_case(np.random.default_rng(where), (2, length), **{k: v for k, v in KINDS[kind].items()
                                                                   if k != "padding"})
    case["terminated"] = np.zeros((2, length), bool) if "terminated" not in case else case["terminated"]
    case["terminated"][:, where - 1] = True
    if "mask" in case:
        case["mask"][:, where - 1] = True
    case["rewards"][:, where] = bad
    for critic in ({}, {"critic_lam": 1.0}):
        advantages, returns = gae_xp.gae(**case, **critic, backend="numba")
        want_a, want_r = reference.gae_loop(**case, **critic)
        assert np.isfinite(want_a[:, :where]).all()
        xp_assert_close(advantages, want_a, like=case["rewards"])
        xp_assert_close(returns, want_r, like=case["rewards"])


@st.composite
def poisoned(draw):
    case, fill_masked, dtype = draw(rows())
    length = case["rewards"].shape[1]
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    for _ in range(draw(st.integers(1, 3)) if length else 0):
        field = draw(st.sampled_from([n for n in ("rewards", "values", "next_values") if n in case]))
        case[field][rng.integers(0, case[field].shape[0]), rng.integers(0, length)] = draw(
            st.sampled_from([np.nan, np.inf, -np.inf]))
    if draw(st.booleans()) and "next_values" not in case:
        bad = draw(st.sampled_from([np.nan, np.inf]))
        case["bootstrap_value"] = np.where(rng.random(case["rewards"].shape[0]) < 0.5, bad, 1.0)
    return case, fill_masked, dtype


@given(poisoned())
def test_non_finite_numbers_travel_as_in_the_loop(kernels, drawn):
    case, fill_masked, dtype = drawn
    arrays = _cast(case, dtype)
    advantages, returns = gae_xp.gae(**arrays, fill_masked=fill_masked, backend="numba")
    want_a, want_r = reference.gae_loop(**case, fill_masked=fill_masked)
    xp_assert_close(advantages, want_a, like=arrays["rewards"])
    xp_assert_close(returns, want_r, like=arrays["rewards"])


@pytest.mark.parametrize("bad", [np.nan, np.inf])
@pytest.mark.parametrize("last_real", [True, False])
def test_a_non_finite_bootstrap_enters_its_sequence_only(kernels, bad, last_real):
    lengths = [WINDOW + 5, 3, 2 * WINDOW - 1, LANE]  # ends inside lanes, at a lane's edge, one shorter than a window
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    case = make_case(np.random.default_rng(7), (2, int(offsets[-1])), dones=0.005, holes=0.2)
    case["mask"][:, offsets[1:] - 1] = last_real
    case["terminated"][:, offsets[1:] - 1] = False
    bootstrap = np.ones((2, len(lengths)))
    bootstrap[0, 0] = bootstrap[1, 2] = bad
    advantages, returns = gae_xp.gae(**case, cu_seqlens=offsets, bootstrap_value=bootstrap, backend="numba")
    want_a, want_r = _segment_reference(case, offsets, bootstrap, None, False)
    assert not np.isfinite(want_a[0, :offsets[1]]).all() and np.isfinite(want_a[0, offsets[1]:]).all()
    xp_assert_close(advantages, want_a, like=case["rewards"])
    xp_assert_close(returns, want_r, like=case["rewards"])


# --- decoupled lambda in one pass -------------------------------------------------------------------------------


def test_critic_lam_runs_in_the_same_pass(numba_cpu, monkeypatch):
    calls = []
    gae = numba_cpu.BACKEND.gae
    monkeypatch.setattr(numba_cpu.BACKEND, "gae", lambda problem, **kw: calls.append(problem) or gae(problem, **kw))
    case = make_case(np.random.default_rng(0), (2, 3000), dones=0.01, holes=0.1)
    advantages, returns = gae_xp.gae(**case, critic_lam=1.0, backend="numba")
    assert len(calls) == 1 and numba_cpu.BACKEND.critic_lam
    want_a, want_r = reference.gae_loop(**case, critic_lam=1.0)
    xp_assert_close(advantages, want_a, like=case["rewards"])
    xp_assert_close(returns, want_r, like=case["rewards"])


# --- work shared between threads -----------------------------------------------------------------------------


def test_small_calls_single_rows_and_one_thread_stay_on_the_calling_thread(numba_cpu, monkeypatch):
    from gae_xp.backends import single_threaded

    monkeypatch.setattr(numba_cpu, "_threads", lambda: 2)
    assert numba_cpu._threads_for(numba_cpu.PARALLEL_FROM, 8) == 2
    assert numba_cpu._threads_for(numba_cpu.PARALLEL_FROM - 1, 8) == 1
    assert numba_cpu._threads_for(10 * numba_cpu.PARALLEL_FROM, 1) == 1
    with single_threaded():
        assert numba_cpu._threads_for(10 * numba_cpu.PARALLEL_FROM, 8) == 1
    monkeypatch.setattr(numba_cpu, "_threads", lambda: 1)
    assert numba_cpu._threads_for(10 * numba_cpu.PARALLEL_FROM, 8) == 1


@given(lengths=st.lists(st.integers(0, 3000), min_size=1, max_size=60), n_rows=st.integers(1, 9),
       threads=st.integers(1, 5))
def test_work_units_are_runs_of_whole_sequences(numba_cpu, lengths, n_rows, threads):
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    spans = numba_cpu._spans(n_rows, offsets, threads)
    assert spans[0] == 0 and spans[-1] == len(lengths) and (np.diff(spans) > 0).all()
    if threads == 1:
        assert spans.shape[0] == 2


@pytest.fixture(params=[2, 3])
def parallel(numba_cpu, monkeypatch, request):
    """Every call shares its units between 2 or 3 threads (whatever the size of the call)."""
    monkeypatch.setattr(numba_cpu, "_threads_for", lambda size, units: request.param)


@pytest.mark.parametrize("kind", ["constant", "dones+mask"])
def test_calls_shared_between_threads_equal_the_loop(parallel, kind):
    case = make_case(np.random.default_rng(1), (4, 3 * WINDOW + 77), **KINDS[kind])
    for critic in ({}, {"critic_lam": 0.5}):
        advantages, returns = gae_xp.gae(**case, **critic, backend="numba")
        want_a, want_r = reference.gae_loop(**case, **critic)
        xp_assert_close(advantages, want_a, like=case["rewards"])
        xp_assert_close(returns, want_r, like=case["rewards"])


def test_one_packed_row_is_shared_between_threads(numba_cpu, parallel):
    rng = np.random.default_rng(2)
    lengths = rng.integers(0, 900, 80)
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    case = make_case(rng, (1, int(offsets[-1])), dones=0.01, holes=0.1)
    assert numba_cpu._spans(1, offsets, 2).shape[0] > 2
    bootstrap = rng.standard_normal((1, len(lengths)))
    advantages, returns = gae_xp.gae(**case, cu_seqlens=offsets, bootstrap_value=bootstrap, backend="numba")
    want_a, want_r = _segment_reference(case, offsets, bootstrap, None, False)
    xp_assert_close(advantages, want_a, like=case["rewards"])
    xp_assert_close(returns, want_r, like=case["rewards"])


# --- compiled once, loaded from disk afterwards ------------------------------------------------------------------


def test_a_fresh_process_loads_the_kernels_from_the_disk_cache(kernels):
    code = textwrap.dedent("""
        import numpy as np, gae_xp
        from gae_xp.backends import _numba_kernels as k
        r = np.random.default_rng(0).standard_normal((2, 3000))
        mask = r > -2
        gae_xp.gae(r, r, backend="numba")
        gae_xp.gae(r, r, mask=mask, backend="numba")
        print(sum(k.constant_units.stats.cache_hits.values()), sum(k.general_units.stats.cache_hits.values()))
    """)
    for _ in range(2):  # the first run may compile and write the cache; the second must read it
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stderr[-2000:]
    assert [int(h) >= 1 for h in done.stdout.split()] == [True, True], done.stdout


# --- summaries of long segments --------------------------------------------------------------------------------


def test_a_long_segments_summary_decays_to_zero_not_to_a_stuck_subnormal(numba_cpu):
    """The product of 20,000 coefficients 0.99 * 0.95 is about e^-1227: 0 in float64. Multiplied step by step it
    reaches the smallest subnormal and stays there (0.9405 times it rounds back to it), and every later step costs a
    subnormal multiply: the summary flushes what falls below the smallest normal to 0."""
    from gae_xp._pieces import FIELDS

    rng = np.random.default_rng(5)
    rewards, values = rng.standard_normal((2, 20_000)), rng.standard_normal((2, 20_000))
    summary = numba_cpu.BACKEND.summarize(_prepare.prepare(rewards, values).problem)
    fields = dict(zip(FIELDS, np.moveaxis(summary[:, 0, :], -1, 0)))
    np.testing.assert_array_equal(fields["product"], 0.0)
    np.testing.assert_array_equal(fields["on_bootstrap"], 0.0)
    np.testing.assert_array_equal(fields["on_value"], 0.0)
    np.testing.assert_array_equal(fields["value"], values[:, 0])
    want = reference.gae_loop(rewards, values)[0][:, 0]  # nothing after the segment: the edge is A_0
    np.testing.assert_allclose(fields["edge"], want, rtol=1e-12, atol=1e-12)


# --- which kernels a call compiles ------------------------------------------------------------------------------


def test_the_dones_a_call_gives_and_its_coefficients_layout_compile_no_kernel_of_their_own(numba_cpu):
    """``terminated`` and ``truncated`` reach the kernels as bool arrays whether given or not (an absent one is an
    all-False row for every row), and an array coefficient and the bootstrap values as read-only arrays whether
    the caller's are writable or read-only: the kernels see one type for all of these calls, so numba compiles one
    kernel where it compiled a kernel for each. (A broadcast coefficient, stride 0, is another layout: its own.)"""
    import numba

    rng = np.random.default_rng(11)
    shape = (3, 300)
    r, v = rng.standard_normal(shape), rng.standard_normal(shape)
    dones = rng.random(shape) < 0.05
    whole = rng.uniform(0.5, 1.0, shape)
    read_only = whole.copy()
    read_only.flags.writeable = False
    bootstrap = rng.standard_normal(3)
    read_only_bootstrap = bootstrap.copy()
    read_only_bootstrap.flags.writeable = False
    calls = [dict(gamma=whole), dict(gamma=read_only, terminated=dones), dict(gamma=whole, terminated=dones,
                                                                              truncated=~dones,
                                                                              truncated_bootstrap="next_step"),
             dict(gamma=whole, truncated=dones, truncated_bootstrap="next_step", bootstrap_value=bootstrap),
             dict(gamma=read_only, bootstrap_value=read_only_bootstrap)]

    def kernel_types(options):
        p = _prepare.prepare(r, v, **options).problem
        rows = numba_cpu._rows(r)
        steps = numba_cpu._steps(p, rows.shape, numba_cpu._driver(p))
        return tuple(numba.typeof(a) for a in (steps, numba_cpu._bounds(p, rows.shape)))

    seen = [kernel_types(options) for options in calls]
    assert seen[1:] == seen[:1] * (len(calls) - 1), seen
    for options in calls:  # and each is still the loop
        for got, want in zip(gae_xp.gae(r, v, backend="numba", **options), reference.gae_loop(r, v, **options)):
            xp_assert_close(got, want, like=r)


# --- the kernels' row views ---------------------------------------------------------------------------------------


def _laid_out(a, layout):
    """``a`` (a C array) as the caller may hand it: C, Fortran order, strided (every other row and column of a
    larger array), read-only, or an odd byte offset away from its buffer's start (unaligned)."""
    if layout == "fortran":
        return np.asfortranarray(a)
    if layout == "strided":
        larger = np.zeros((2 * a.shape[0], 2 * a.shape[1]), dtype=a.dtype)
        larger[::2, ::2] = a
        return larger[::2, ::2]
    if layout == "read-only":
        frozen = a.copy()
        frozen.flags.writeable = False
        return frozen
    if layout == "unaligned":
        buffer = np.zeros(a.nbytes + 1, dtype=np.uint8)
        moved = buffer[1:].view(a.dtype).reshape(a.shape)
        moved[...] = a
        return moved
    return a.copy()


LAYOUTS = ["C", "fortran", "strided", "read-only", "unaligned"]


@pytest.mark.parametrize("layout", LAYOUTS)
def test_a_borrowed_row_is_the_arrays_row_in_every_layout(kernels, layout):
    """``_row`` makes a row view without a reference of its own; it reads the same numbers as NumPy's row, of every
    layout (its strides and start are the array's), and keeps the array's read-only and alignment types."""
    import numba

    a = _laid_out(np.arange(5 * 7, dtype=np.float32).reshape(5, 7) * 1.5, layout)

    @numba.njit
    def rows_read(x):
        out = np.empty(x.shape)
        for row in range(x.shape[0]):
            view = kernels._row(x, row)
            for t in range(view.shape[0]):
                out[row, t] = view[t]
        return out

    @numba.njit
    def write_through(x, row):
        kernels._row(x, row)[1] = -1.0

    np.testing.assert_array_equal(rows_read(a), a)
    if layout == "read-only":  # the view keeps the array's read-only type
        with pytest.raises(numba.core.errors.TypingError):
            write_through(a, 3)
    else:  # and is the array's memory, not a copy
        write_through(a, 3)
        assert a[3, 1] == -1.0 and np.count_nonzero(a == -1.0) == 1


@pytest.mark.parametrize("layout", LAYOUTS)
def test_rows_of_every_layout_equal_the_loop(kernels, layout):
    """Every float input in each layout a caller may give, on the general kernel (dones and a mask), rows that
    are walked and rows that are windowed: the loop's numbers, and the inputs left as they were. One kernel per
    layout (each is a compilation of its own; the constant kernel's rows come from the same ``_span``)."""
    rng = np.random.default_rng(5)
    for options in ({"dones": 0.02, "holes": 0.2},):
        for length in (LANE + 1, 2 * WINDOW + LANE - 1):
            case = _cast(make_case(rng, (3, length), **options), np.float32)
            arrays = {k: _laid_out(v, layout) if isinstance(v, np.ndarray) and v.dtype.kind == "f" else v
                      for k, v in case.items()}
            before = {k: v.copy() for k, v in arrays.items() if isinstance(v, np.ndarray)}
            advantages, returns = gae_xp.gae(**arrays, backend="numba")
            want_a, want_r = reference.gae_loop(**case)
            xp_assert_close(advantages, want_a, like=arrays["rewards"])
            xp_assert_close(returns, want_r, like=arrays["rewards"])
            for name, value in before.items():
                np.testing.assert_array_equal(arrays[name], value, err_msg=f"{name} was modified")
