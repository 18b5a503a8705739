"""The numba-CUDA backend's whole launch path down to the driver, without a GPU (``tools.driver``).

torch CPU tensors stand in for CUDA ones and the driver's ``cuLaunchKernel``
is a stand-in that takes its arguments as the real one would (integers for
the grid and the block, within the hardware's limits; where cuda.bindings
is installed without a driver library, the real binding converts them too)
and records each launch's parameter bytes. Every public entry point that
launches the fused kernels is driven through it, both launch plans (one
launch for short rows, three for long ones) included: a launch the driver
would refuse fails here.

The plan of a repeated ``gae()`` call (``backends/_numba_cuda_plan``, blocks
packed once per layout) is checked against the backend's own launches: for
random layouts, a call served by the plan hands the driver the same kernels,
grids and parameter bytes as the full path does for the same arrays, but for
the pointers of the outputs and scratch maps each call allocates anew, which
must be the plan's own outputs.
"""

from __future__ import annotations

import importlib.util
import os

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("numba") is None or importlib.util.find_spec("numba.cuda") is None
    or importlib.util.find_spec("torch") is None or os.environ.get("NUMBA_ENABLE_CUDASIM") == "1",
    reason="drives numba-cuda's launch path with torch CPU tensors (not under the simulator)")

#: Rows of these lengths fit a tile (one launch) or span several (three launches).
SHORT, LONG = 32, 5000


@pytest.fixture
def driven():
    """The backend as on a GPU down to a checking stand-in driver (a fresh plan cache inside: ``driven()``'s)."""
    from tools.driver import driven as standins

    with standins() as launches:
        yield launches


def tensors(shape, seed=0, dtype="float32"):
    import torch

    rng = np.random.default_rng(seed)
    return {"rewards": torch.tensor(rng.standard_normal(shape), dtype=getattr(torch, dtype)),
            "values": torch.tensor(rng.standard_normal(shape), dtype=getattr(torch, dtype)),
            "flags": torch.tensor(rng.random(shape) < 0.1), "mask": torch.tensor(rng.random(shape) > 0.2)}


ENTRY_POINTS = {
    "gae": lambda g, a: g.gae(a["rewards"], a["values"], backend="numba-cuda"),
    "gae, dones, mask, critic_lam": lambda g, a: g.gae(a["rewards"], a["values"], terminated=a["flags"],
                                                      mask=a["mask"], critic_lam=1.0, backend="numba-cuda"),
    "gae, truncated, next_values, fill_masked": lambda g, a: g.gae(
        a["rewards"], a["values"], next_values=a["values"], truncated=a["flags"], mask=a["mask"],
        fill_masked=True, backend="numba-cuda"),
    "gae, packed sequences": lambda g, a: g.gae(a["rewards"][0], a["values"][0],
                                                cu_seqlens=[0, 3, 3, a["rewards"].shape[-1]], backend="numba-cuda"),
    "vtrace": lambda g, a: g.vtrace(a["values"] * 0.1, a["rewards"], a["values"], backend="numba-cuda"),
    "lambda_returns": lambda g, a: g.lambda_returns(a["rewards"], a["values"], mask=a["mask"],
                                                    backend="numba-cuda"),
    "discounted_returns": lambda g, a: g.discounted_returns(a["rewards"], terminated=a["flags"],
                                                            backend="numba-cuda"),
    "discounted_cumsum, forward": lambda g, a: g.discounted_cumsum(a["rewards"], 0.9, reverse=False,
                                                                  backend="numba-cuda"),
}


@pytest.mark.parametrize("length", [SHORT, LONG])
@pytest.mark.parametrize("entry", sorted(ENTRY_POINTS))
def test_every_launch_reaches_the_driver_as_it_takes_its_arguments(driven, entry, length):
    """Each entry point's launches pass the stand-in driver's checks (the real binding's argument types, the
    hardware's limits, every array argument's elements readable where it points); a long row takes three
    launches on the general kernels, two on the lean ones (the chunks' maps, then the final pass), and a short one
    one; the rewards reach a launch with every element as given, as the caller's own
    memory (the scan reads its own copy: ``prepare_scan`` owns x)."""
    import gae_xp

    arrays = tensors((3, length))
    ENTRY_POINTS[entry](gae_xp, arrays)
    assert driven, f"{entry}: no launch reached the driver"
    assert len(driven) in ((1, 2) if length == SHORT else (2, 3, 4, 5, 6)), len(driven)
    rewards = arrays["rewards"][0] if "packed" in entry else arrays["rewards"]
    seen = [argument for launch in driven for argument in launch.arrays.values()
            if argument.contents == rewards.numpy().tobytes()]
    assert seen, "no launch reads the rewards as given"
    if "cumsum" not in entry:
        assert rewards.data_ptr() in {argument.pointer for argument in seen}, "the rewards were copied"
    for launch in driven:
        assert launch.block[0] % 32 == 0 or launch.block[0] < 32, launch.block


def test_a_two_dimensional_grid_goes_to_the_driver_as_x_and_y():
    """A grid of (x, y) blocks (``_cuda_plan.grid``, beyond 2^31 - 1 blocks) reaches the driver as gridDimX and
    gridDimY, and a number of blocks as (blocks, 1)."""
    from gae_xp.backends import _cuda_launch, _cuda_plan

    assert _cuda_launch.dimensions(7) == (7, 1)
    assert _cuda_launch.dimensions(_cuda_plan.grid(2**31 + 5)) == _cuda_plan.grid(2**31 + 5)
    x, y = _cuda_launch.dimensions(_cuda_plan.grid(2**31 + 5))
    assert x * y >= 2**31 + 5 and x <= _cuda_plan.MAX_GRID_X and y == 2


def test_the_stand_in_driver_refuses_what_the_binding_refuses():
    """The check itself: a tuple where the driver takes an integer (the grid of a plan passed whole), a grid
    beyond the hardware, an unknown function handle."""
    from tools.driver import Launches, checked_launch

    launches = Launches()
    launches.signatures[1] = ()
    launch = checked_launch(launches)
    launch(1, 4, 1, 1, 128, 1, 1, 0, 0, 8, 0)
    assert [(x.grid, x.block) for x in launches] == [((4, 1, 1), (128, 1, 1))]
    with pytest.raises(TypeError):
        launch(1, (4, 1), 1, 1, 128, 1, 1, 0, 0, 8, 0)
    with pytest.raises(ValueError, match="limits"):
        launch(1, 4, 70_000, 1, 128, 1, 1, 0, 0, 8, 0)
    with pytest.raises(ValueError, match="handle"):
        launch(2, 4, 1, 1, 128, 1, 1, 0, 0, 8, 0)


#: How a drawn per-step tensor lies in memory (``laid_out``): each is a view a caller may hand over.
LAYOUTS = ("contiguous", "time-strided", "transposed", "offset", "expanded", "negated", "unmergeable")


def laid_out(torch, values: np.ndarray, layout: str, dtype):
    """``values`` (a (..., B, T) array) as a tensor of ``dtype`` lying in memory as ``layout`` says: C order; every
    other step of a longer row; a transposed (T, B) tensor's view; after one row of another tensor; a broadcast of
    one row (the values' first row, B times); negated lazily (torch's negative bit, ``z.conj().imag``: float32
and float64); a 3-D
    tensor whose two batch axes cannot merge into one stride (the kernels then read a copy: no plan)."""
    if layout == "expanded":
        values = np.broadcast_to(values[..., :1, :], values.shape)
    made = torch.tensor(np.ascontiguousarray(values)).to(dtype)
    if layout == "time-strided":
        wide = torch.zeros((*made.shape[:-1], 2 * made.shape[-1]), dtype=dtype)
        wide[..., ::2] = made
        return wide[..., ::2]
    if layout == "transposed":
        return made.transpose(-1, -2).contiguous().transpose(-1, -2)
    if layout == "offset":
        return torch.cat([torch.zeros_like(made[..., :1, :]), made], dim=-2)[..., 1:, :]
    if layout == "expanded":
        return made[..., :1, :].expand(made.shape)
    if layout == "negated" and dtype in (torch.float32, torch.float64):  # other dtypes have no complex to come from
        return torch.complex(torch.zeros_like(made), -made).conj().imag
    if layout == "unmergeable":
        return made.transpose(0, 1).contiguous().transpose(0, 1) if made.ndim == 3 else made
    return made


def _layouts():
    options = st.fixed_dictionaries({
        "terminated": st.booleans(), "truncated": st.booleans(), "mask": st.booleans(),
        "critic_lam": st.sampled_from([None, 1.0, 0.5]), "fill_masked": st.booleans(),
        "bootstrap": st.sampled_from([None, 0.5, "per row", "one", "per row, strided"]),
        "gamma": st.sampled_from([0.99, 1.0, 0.0]),
        "layouts": st.fixed_dictionaries({name: st.sampled_from(LAYOUTS) for name in
                                          ("rewards", "values", "next_values", "flags", "mask")}),
    })
    shape = st.tuples(st.integers(1, 4), st.sampled_from([1, 7, SHORT, 300, LONG]))
    return st.tuples(shape, st.sampled_from(["float32", "float64", "bfloat16", "float16"]), st.booleans(), options)


#: The parameters whose arrays each call allocates anew (the plan's ``_SOURCES``): their pointers differ per call.
ALLOCATED = ("bootstrap", "advantages", "returns", "maps", "entering")


def _arguments(shape, dtype, batch_3d, options, seed):
    """``gae()``'s arguments for a drawn layout (``next_values`` with ``truncated``, then no ``bootstrap_value``)."""
    import torch

    full = (2, *shape) if batch_3d else shape
    rng = np.random.default_rng(seed)
    kind, layouts = getattr(torch, dtype), options["layouts"]

    def floats(name):
        return laid_out(torch, rng.standard_normal(full), layouts[name], kind)

    def flags(name, probability):
        return laid_out(torch, rng.random(full) < probability, layouts[name], torch.bool)

    arguments = dict(gamma=options["gamma"], lam=0.95, critic_lam=options["critic_lam"],
                     terminated=flags("flags", 0.1) if options["terminated"] else None,
                     mask=flags("mask", 0.8) if options["mask"] else None, fill_masked=options["fill_masked"],
                     backend="numba-cuda")
    if options["truncated"]:
        arguments.update(next_values=floats("next_values"), truncated=flags("flags", 0.1))
    elif isinstance(options["bootstrap"], str):
        values = torch.tensor(rng.standard_normal(2 * full[-2]), dtype=kind)
        arguments["bootstrap_value"] = {"per row": values[:full[-2]], "one": values[:1],
                                        "per row, strided": values[::2]}[options["bootstrap"]]
    else:
        arguments["bootstrap_value"] = options["bootstrap"]
    return floats("rewards"), floats("values"), arguments


def _expects_a_plan(arguments) -> bool:
    """Whether the kernels read every per-step tensor where it lies (no copy): then a CUDA plan serves the key."""
    return not any(getattr(a, "is_neg", lambda: False)() or a.ndim == 3 and not _merges(a)
                   for a in arguments if hasattr(a, "ndim"))


def _merges(a) -> bool:
    """Whether a 3-D tensor's two batch axes merge into one stride (its (rows, T) reshape is a view)."""
    return a.shape[0] == 1 or a.shape[1] == 1 or a.stride(0) == a.stride(1) * a.shape[1]


@settings(deadline=None)
@given(layout=_layouts())
def test_a_call_served_by_its_plan_launches_what_the_full_path_launches(layout):
    """A repeated ``gae()`` call (its plan: blocks packed once, only pointers written per call) hands the driver
    the same kernels, grids, blocks and parameter bytes as the full path for the same arrays, and every array
    argument the same elements; the parameters that differ are the pointers of what each call allocates
    (outputs, bootstrap values, scratch maps): written by the call (the plan's blocks are poisoned with a null
    pointer after it is made), distinct from each other, the outputs the plan returns. Where a per-step tensor
    would be read from a copy (negated lazily, batch axes that cannot merge) no CUDA plan is made, and the
    repeated call takes the full path."""
    from unittest import mock

    import gae_xp
    from gae_xp import _plans
    from gae_xp.backends import _numba_cuda_plan
    from tools.driver import driven as standins

    made = []
    original = _numba_cuda_plan.CudaPlan.of

    def remembered(*args):
        plan = original(*args)
        for launch, _, _, _ in () if plan is None else plan.launches:
            for slot in launch.slots:
                launch._words[slot] = 0  # a pointer no call writes stays null: the checked driver refuses it
        made.append(plan)
        return plan

    first = _arguments(*layout, seed=1)
    second = _arguments(*layout, seed=2)
    with standins() as launches, mock.patch.object(_numba_cuda_plan.CudaPlan, "of", remembered):
        kept = gae_xp.gae(first[0], first[1], **first[2])  # the full path, which makes the plan
        start = len(launches)
        served = gae_xp.gae(second[0], second[1], **second[2])  # served by the plan
        by_plan = launches[start:]
        _plans.PLANS.clear()
        start = len(launches)
        gae_xp.gae(second[0], second[1], **second[2])  # the full path, the same arrays
        by_backend = launches[start:]
    del kept
    expected = _expects_a_plan([first[0], first[1], *first[2].values()])
    assert bool(made and made[0] is not None) == expected, (made, layout)
    assert len(by_plan) == len(by_backend)
    if not expected:  # both calls took the full path
        assert [x.argtypes for x in by_plan] == [x.argtypes for x in by_backend]
        return
    plan = made[0]
    assert len(by_plan) == len(plan.launches)
    allocated = {}
    for planned, full, (bound, _, _, sources) in zip(by_plan, by_backend, plan.launches):
        assert (planned.argtypes, planned.grid, planned.block) == (full.argtypes, full.grid, full.block)
        by_slot = dict(zip(bound.slots, (_numba_cuda_plan._SOURCES[source] for source in sources)))
        for index, (mine, theirs) in enumerate(zip(planned.parameters, full.parameters)):
            if by_slot.get(index) not in ALLOCATED:
                assert mine == theirs, (index, _cuda_parameter(planned, index))
        names = _argument_names(planned, by_slot)
        for argument, array in planned.arrays.items():
            name = names.get(argument)
            if name in ALLOCATED:  # one buffer a call, whichever launch reads or writes it
                assert allocated.setdefault(name, array.pointer) == array.pointer, name
            if name not in ("advantages", "returns", "maps", "entering"):  # what the kernels read: the same elements
                assert array.contents == full.arrays[argument].contents, (name, argument)
    assert len(set(allocated.values())) == len(allocated), allocated
    assert (allocated["advantages"], allocated["returns"]) == (served[0].data_ptr(), served[1].data_ptr())


def _argument_names(launch, by_slot) -> dict:
    """The source names (``_numba_cuda_plan._SOURCES``) of a plan launch's varying array arguments, by argument."""
    from gae_xp.backends import _cuda_launch

    parameters = _cuda_launch.layout(launch.argtypes)
    return {parameters[slot].argument: name for slot, name in by_slot.items()}


def _cuda_parameter(launch, index):
    from gae_xp.backends import _cuda_launch

    return _cuda_launch.layout(launch.argtypes)[index].name


def test_a_tensor_kept_negated_lazily_reaches_the_kernels_as_its_values(driven):
    """``z.conj().imag`` holds its values' negatives in memory (torch's negative bit): the kernels read a negated
    copy, on the full path and after a plain tensor of the same layout made a plan (the key tells them apart)."""
    import torch

    import gae_xp

    rng = np.random.default_rng(3)
    plain = torch.tensor(rng.standard_normal((4, 2 * SHORT)), dtype=torch.float32)[:, ::2]  # the layout of .imag
    values = torch.tensor(rng.standard_normal((4, SHORT)), dtype=torch.float32)
    wanted = torch.tensor(rng.standard_normal((4, SHORT)), dtype=torch.float32)
    negated = -wanted  # a local: alive to the end, as the tensors kept below
    lazy = torch.complex(torch.zeros_like(wanted), negated).conj().imag
    assert lazy.is_neg() and lazy.stride() == plain.stride() and torch.equal(lazy, wanted)
    # every tensor made here that holds a rewards' values or their negatives stays alive to the end: a freed one's
    # memory could become a new output's, whose uninitialised contents a launch records as an argument's
    kept = {id(t): (t.resolve_neg().contiguous(), (-t.resolve_neg()).contiguous()) for t in (plain, lazy)}
    for rewards in (plain, plain, lazy, lazy):
        start = len(driven)
        gae_xp.gae(rewards, values, backend="numba-cuda")
        read = [a.contents for launch in driven[start:] for a in launch.arrays.values()]
        values_of, negatives_of = kept[id(rewards)]
        assert values_of.numpy().tobytes() in read
        assert negatives_of.numpy().tobytes() not in read
