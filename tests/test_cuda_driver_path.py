"""The numba-CUDA backend's whole launch path down to the driver, without a GPU (``gae_xp.bench.driver``).

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
import struct

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
    """The backend as on a GPU down to a checking stand-in driver; a fresh plan cache around it."""
    from gae_xp import _plans
    from gae_xp.bench.driver import driven as standins

    _plans.PLANS.clear()
    with standins() as launches:
        yield launches
    _plans.PLANS.clear()


def tensors(shape, seed=0, dtype="float32"):
    import torch

    rng = np.random.default_rng(seed)
    return {"rewards": torch.tensor(rng.standard_normal(shape), dtype=getattr(torch, dtype)),
            "values": torch.tensor(rng.standard_normal(shape), dtype=getattr(torch, dtype)),
            "flags": torch.tensor(rng.random(shape) < 0.1), "mask": torch.tensor(rng.random(shape) > 0.2)}


def arrays_of(launch) -> list[tuple[int, tuple, tuple]]:
    """The (data pointer, shape, strides) of every array parameter of a recorded launch."""
    from gae_xp.backends import _cuda_launch

    found, current = [], {}
    for parameter, raw in zip(_cuda_launch.layout(launch.argtypes), launch.parameters):
        name = parameter.name
        if ".data" in name or ".shape[" in name or ".strides[" in name:
            current.setdefault(parameter.argument, []).append((name, struct.unpack("<q", raw[:8])[0]))
    for members in current.values():
        pointer = next(v for n, v in members if n.endswith(".data"))
        found.append((pointer, tuple(v for n, v in members if ".shape[" in n),
                      tuple(v for n, v in members if ".strides[" in n)))
    return found


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
    hardware's limits); a long row takes three launches and a short one one; every array parameter points into
    memory of the right size (a positive pointer, extents within its shape)."""
    import gae_xp

    ENTRY_POINTS[entry](gae_xp, tensors((3, length)))
    assert driven, f"{entry}: no launch reached the driver"
    for launch in driven:
        assert launch.block[0] % 32 == 0 or launch.block[0] < 32, launch.block
        for pointer, shape, strides in arrays_of(launch):
            assert pointer > 0 and all(n >= 0 for n in shape) and all(s >= 0 for s in strides), (pointer, shape)


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
    from gae_xp.bench.driver import Launches, checked_launch

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


def _layouts():
    options = st.fixed_dictionaries({
        "terminated": st.booleans(), "truncated": st.booleans(), "mask": st.booleans(),
        "critic_lam": st.sampled_from([None, 1.0, 0.5]), "fill_masked": st.booleans(),
        "bootstrap": st.sampled_from([None, 0.5, "array"]), "gamma": st.sampled_from([0.99, 1.0, 0.0]),
    })
    shape = st.tuples(st.integers(1, 4), st.sampled_from([1, 7, SHORT, 300, LONG]))
    return st.tuples(shape, st.sampled_from(["float32", "float64", "bfloat16"]), st.booleans(), options)


#: The parameters whose arrays each call allocates anew (the plan's ``_SOURCES``): their pointers differ per call.
ALLOCATED = ("bootstrap", "advantages", "returns", "maps", "entering")


def _arguments(shape, dtype, batch_3d, options, seed):
    """``gae()``'s arguments for a drawn layout (``next_values`` with ``truncated``, then no ``bootstrap_value``)."""
    import torch

    full = (2, *shape) if batch_3d else shape
    a = tensors(full, seed, dtype)
    arguments = dict(gamma=options["gamma"], lam=0.95, terminated=a["flags"] if options["terminated"] else None,
                     mask=a["mask"] if options["mask"] else None, critic_lam=options["critic_lam"],
                     fill_masked=options["fill_masked"], backend="numba-cuda")
    if options["truncated"]:
        arguments.update(next_values=a["values"] * 0.5, truncated=~a["flags"])
    elif options["bootstrap"] == "array":
        arguments["bootstrap_value"] = torch.linspace(0, 1, full[-2]).to(a["rewards"].dtype)
    else:
        arguments["bootstrap_value"] = options["bootstrap"]
    return a["rewards"], a["values"], arguments


@settings(deadline=None)
@given(layout=_layouts())
def test_a_call_served_by_its_plan_launches_what_the_full_path_launches(layout):
    """A repeated ``gae()`` call (its plan: blocks packed once, only pointers written per call) hands the driver
    the same kernels, grids, blocks and parameter bytes as the full path for the same arrays; the parameters
    that differ are the data pointers of what each call allocates (outputs, bootstrap values, scratch maps), and
    the plan's output pointers are the outputs it returns."""
    from unittest import mock

    import gae_xp
    from gae_xp import _plans
    from gae_xp.backends import _numba_cuda_plan
    from gae_xp.bench.driver import driven as standins

    made = []
    original = _numba_cuda_plan.CudaPlan.of

    def remembered(*args):
        made.append(original(*args))
        return made[-1]

    first = _arguments(*layout, seed=1)
    second = _arguments(*layout, seed=2)
    _plans.PLANS.clear()
    with standins() as launches, mock.patch.object(_numba_cuda_plan.CudaPlan, "of", remembered):
        gae_xp.gae(first[0], first[1], **first[2])  # the full path, which makes the plan
        start = len(launches)
        served = gae_xp.gae(second[0], second[1], **second[2])  # served by the plan
        by_plan = launches[start:]
        _plans.PLANS.clear()
        start = len(launches)
        gae_xp.gae(second[0], second[1], **second[2])  # the full path, the same arrays
        by_backend = launches[start:]
    _plans.PLANS.clear()
    assert made and made[0] is not None, "no CUDA plan was made for this layout"
    plan = made[0]
    assert len(by_plan) == len(by_backend) == len(plan.launches)
    outputs = {"advantages": served[0].data_ptr(), "returns": served[1].data_ptr()}
    for planned, full, (bound, _, _, sources) in zip(by_plan, by_backend, plan.launches):
        assert (planned.argtypes, planned.grid, planned.block) == (full.argtypes, full.grid, full.block)
        allocated = {slot: _numba_cuda_plan._SOURCES[source] for slot, source in zip(bound.slots, sources)
                     if _numba_cuda_plan._SOURCES[source] in ALLOCATED}
        for index, (mine, theirs) in enumerate(zip(planned.parameters, full.parameters)):
            if index in allocated:
                pointer = struct.unpack("<q", mine)[0]
                assert pointer == outputs.get(allocated[index], pointer) and pointer > 0
            else:
                assert mine == theirs, (index, _cuda_parameter(planned, index))
        assert set(outputs) & set(allocated.values()) or len(plan.launches) > 1


def _cuda_parameter(launch, index):
    from gae_xp.backends import _cuda_launch

    return _cuda_launch.layout(launch.argtypes)[index].name
