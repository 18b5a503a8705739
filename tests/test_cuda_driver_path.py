"""The numba-CUDA backend's whole launch path down to the driver, without a GPU (``tools.driver``).

torch CPU tensors stand in for CUDA ones and the driver's ``cuLaunchKernel``
is a stand-in that takes its arguments as the real one would (integers for
the grid and the block, within the hardware's limits; where cuda.bindings
is installed without a driver library, the real binding converts them too)
and records each launch's parameter bytes. Every public entry point that
launches the fused kernels is driven through it, both launch plans (one
launch for short rows, three for long ones) included: a launch the driver
would refuse fails here. A repeated ``gae()`` call, served by its plan, hands the
driver what the full path hands it for the same tensors.
"""

from __future__ import annotations

import importlib.util
import os

import numpy as np
import pytest

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


@pytest.mark.parametrize("length", [SHORT, LONG])
@pytest.mark.parametrize("entry", ["gae", "gae, dones, mask, critic_lam", "gae, truncated, next_values, fill_masked"])
def test_a_repeated_call_served_by_its_plan_launches_what_the_full_path_launches(driven, entry, length):
    """A repeated ``gae()`` call of one layout on other tensors is served by its plan (``BoundLayoutPlan``: the
    first call's checked problem with the new arrays bound in) and hands the driver the same kernels, grids, blocks
    and argument types as the full path does for the same tensors, every argument the same elements but those the
    call writes (its outputs and scratch maps: fresh memory each call)."""
    import torch

    import gae_xp
    from gae_xp import _plans

    ENTRY_POINTS[entry](gae_xp, tensors((3, length), seed=1))  # the full path, which makes the plan
    arrays = tensors((3, length), seed=2)
    start = len(driven)
    served = ENTRY_POINTS[entry](gae_xp, arrays)
    by_plan = driven[start:]
    (plan,) = _plans.PLANS._plans.values()
    assert isinstance(plan, _plans.BoundLayoutPlan), type(plan).__name__
    _plans.PLANS.clear()
    start = len(driven)
    full = ENTRY_POINTS[entry](gae_xp, arrays)
    by_backend = driven[start:]
    assert by_plan and len(by_plan) == len(by_backend)
    written = {t.data_ptr() for t in (*served, *full)}
    given = {t.data_ptr(): t.numpy().tobytes() for t in arrays.values()}
    for planned, unplanned in zip(by_plan, by_backend):
        assert (planned.argtypes, planned.grid, planned.block) == (unplanned.argtypes, unplanned.grid, unplanned.block)
        assert planned.arrays.keys() == unplanned.arrays.keys()
        for argument, array in planned.arrays.items():
            other = unplanned.arrays[argument]
            assert (array.shape, array.strides, array.itemsize) == (other.shape, other.strides, other.itemsize)
            if array.pointer in written or other.pointer in written:
                assert array.pointer != other.pointer, argument  # each call writes outputs of its own
            elif array.pointer in given:  # a caller's tensor, read where it lies
                assert array.pointer == other.pointer and array.contents == other.contents == given[array.pointer]
    assert all(isinstance(out, torch.Tensor) and out.shape == (3, length) for out in served)
    assert arrays["rewards"].data_ptr() in {a.pointer for launch in by_plan for a in launch.arrays.values()}


def test_a_tensor_kept_negated_lazily_reaches_the_kernels_as_its_values(driven):
    """``z.conj().imag`` holds its values' negatives in memory (torch's negative bit): the kernels read a negated
    copy, on the full path and after a plain tensor of the same layout made a plan (the key tells them apart:
    ``gae_xp._plans``)."""
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
