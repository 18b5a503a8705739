"""``gae_xp.warm_up(device=...)`` for the Triton route, under Triton's interpreter on CPU tensors: the calls it
makes launch every kernel that a later call of the same dtype, case and layout launches at any B and T, so that
such a call compiles nothing; and its ``device`` is checked.

A compiled Triton kernel is keyed on the kernel's constexprs (the options, dtype, block, alignment, structure),
its warps and stages, the 16-byte alignment of each pointer and the integer arguments it specialises on (none:
every count and stride is ``do_not_specialize``): a launch whose key a warm-up launched compiles nothing. The
launch heuristic is replaced by a small one of three row classes, and the launches are recorded, not run (the
kernels' results are ``tests/test_triton.py``'s).
"""

from __future__ import annotations

import contextlib
import math

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from tritoninterp import require_interpreter

torch = require_interpreter()

import gae_xp  # noqa: E402
from gae_xp import _plans, estimators  # noqa: E402
from gae_xp.backends import _triton_config, _triton_gae, _triton_launch  # noqa: E402

#: Three classes of rows: up to 8 steps in one 8-step block, up to 32 in 16-step blocks, longer in 32-step blocks;
#: two stages, which chunks of several blocks take (pipelined) and every other launch leaves at 1.
SMALL_HEURISTIC = ((8, 8, 1, 2), (32, 16, 1, 2), (math.inf, 32, 1, 2))


@contextlib.contextmanager
def recorded():
    """The launches of the Triton route's kernel within the block, recorded and not run (the keys are what this
    module checks; the kernels' results are tests/test_triton.py's), with the small heuristic and no plan kept."""
    calls = []

    class Recording:
        def __getitem__(self, grid):
            return lambda *args, **kwargs: calls.append((args, kwargs))

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(_triton_config, "HEURISTIC", SMALL_HEURISTIC)
        patch.setattr(_triton_launch, "gae_kernel", Recording())
        _forget()
        try:
            yield calls
        finally:
            _forget()


def _forget():
    _triton_launch._config.cache_clear()
    _triton_launch._PLANS.clear()
    _plans.PLANS.clear()


#: (dtype, layout) -> the keys of the kernels that warm_up's calls launched (cases constant and dones+mask).
WARMED = {}
CASES = ("constant", "dones+mask")


def warmed(dtype: str, layout: str) -> set:
    if (dtype, layout) not in WARMED:
        with recorded() as calls:
            estimators._warm_up_device(torch.device("cpu"), (dtype,), CASES, (layout,), "triton")
        WARMED[dtype, layout] = keys(calls)
    return WARMED[dtype, layout]


def random(shape, kind):
    """Arrays for a layout's later calls: standard normal floats of dtype ``kind``, or flags (``bool``) 10 % set."""
    return torch.rand(shape) < 0.1 if kind is bool else torch.randn(shape).to(getattr(torch, kind))


def keys(calls) -> set:
    """What Triton keys each recorded launch's compiled kernel on."""
    specialised = [name for name in _triton_gae.gae_kernel.arg_names if name not in _triton_gae._RUNTIME]
    found = set()
    for args, kwargs in calls:
        named = dict(zip(_triton_gae.gae_kernel.arg_names, args))
        pointers = tuple(value.data_ptr() % 16 == 0 for value in args if isinstance(value, torch.Tensor))
        integers = tuple((name, named[name] == 1, named[name] % 16 == 0) for name in specialised
                         if isinstance(named.get(name), int) and not isinstance(named.get(name), bool))
        found.add((tuple(sorted((name, repr(value)) for name, value in kwargs.items())), pointers, integers))
    return found


def test_the_warm_shapes_cover_each_row_class_both_alignments_and_both_structures():
    """Per row of the heuristic, a T inside it that is a multiple of 16 bytes of every float and one that is not, at
    one row, two rows (row strides count) and one program a row; and chunks pipelined (several blocks each)."""
    shapes = _triton_config.warm_shapes(132)
    configs = {_triton_launch._config(length, rows, 1, 132, (None,) * 5) for rows, length in shapes}
    assert all(per_program == 1 for *_, per_program in configs)  # tiles of rows are tuned(tile=...)'s alone
    assert any(chunks > 1 and chunk > block and stages > 1 for block, _, stages, chunk, chunks, _ in configs)
    assert any(chunks > 1 and chunk == block and stages == 1 for block, _, stages, chunk, chunks, _ in configs)
    lengths = sorted({length for _, length in shapes})
    bounds = [row[0] for row in _triton_config.HEURISTIC]
    for low, high in zip([0, *bounds], bounds):
        inside = [length for length in lengths if low < length <= high]
        assert any(length % 16 == 0 for length in inside) and any(length % 2 for length in inside), (low, high)
    assert {rows for rows, _ in shapes} == {1, 2, _triton_config.FEW_ROWS * 132}


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("layout", list(estimators.WARM_LAYOUTS))
@settings(max_examples=25, deadline=None)
@given(rows=st.integers(1, 9), length=st.integers(1, 700), case=st.sampled_from(CASES))
@example(rows=1, length=600, case="constant").via("chunks of several blocks: pipelined")
@example(rows=2, length=301, case="dones+mask").via("the same, T of no float's 16 bytes")
def test_after_warm_up_a_call_at_any_b_and_t_launches_a_warmed_kernel(dtype, layout, rows, length, case):
    expected = warmed(dtype, layout)
    assert len(expected) >= 10  # three classes, both alignments, chunked or not, two cases
    with recorded() as calls:
        estimators._warm_call(estimators.WARM_LAYOUTS[layout](random, dtype, rows, length), case, "triton")
    assert calls and keys(calls) <= expected, keys(calls) - expected


def test_warm_up_checks_its_device():
    with pytest.raises(ValueError, match="device must be a CUDA device that torch sees, got 'cpu'"):
        gae_xp.warm_up(device="cpu")
    with pytest.raises(ValueError, match="device must be a CUDA device that torch sees"):
        gae_xp.warm_up(device="cuda:7")
    with pytest.raises(ValueError, match="device must name a CUDA device, got 'gpu'"):
        gae_xp.warm_up(device="gpu")
    with pytest.raises(ValueError, match="dtypes must name some of 'float32', 'float64', got 'bfloat16'"):
        gae_xp.warm_up(dtypes="bfloat16")
