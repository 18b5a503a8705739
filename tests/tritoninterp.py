"""What the test modules of the Triton kernels under Triton's interpreter share.

``TRITON_INTERPRET=1`` must be set before triton is imported (Triton reads it
when its kernels are decorated): ``tests/conftest.py`` sets it for every test,
and ``require_interpreter()`` sets it too, for a module run on its own. Such a
module calls it before it imports the backend; it is skipped where torch or
triton is not installed, or where triton was imported before the variable was
set (its kernels then need a GPU).
"""

from __future__ import annotations

import importlib.util
import os
import weakref

import pytest


def require_interpreter():
    """torch, once Triton's interpreter is known to run the kernels on CPU tensors; else the calling module is
    skipped."""
    os.environ.setdefault("TRITON_INTERPRET", "1")
    torch = pytest.importorskip("torch")
    if importlib.util.find_spec("triton") is None:
        pytest.skip("triton is not installed (pip install triton): its interpreter runs the kernels on the CPU",
                    allow_module_level=True)
    import triton

    if not triton.knobs.runtime.interpret:
        pytest.skip("triton was imported before TRITON_INTERPRET=1 was set: its kernels need a GPU here",
                    allow_module_level=True)
    return torch


def record_launches(monkeypatch) -> list:
    """Record every launch of the Triton route's ``gae_kernel`` (its arguments and keywords) and run it."""
    from gae_xp.backends import _triton_launch

    calls = []
    kernel = _triton_launch.gae_kernel

    class Recording:
        def __getitem__(self, grid):
            def launch(*args, **kwargs):
                calls.append((args, kwargs))
                return kernel[grid](*args, **kwargs)

            return launch

    monkeypatch.setattr(_triton_launch, "gae_kernel", Recording())
    return calls


class Compiled:
    """A compiled kernel that ``stand_in_compiled_kernels``' launcher returns: its ``run`` takes what a direct launch
    passes and runs the interpreted kernel on exactly those arguments, an address (an int in an array's slot) read
    as the tensor that ``addresses[address]()`` returns (``wrong``: it writes a wrong advantage; ``wrong_on_stream``:
    only when launched on that stream; ``fail``: it raises). ``streams``: the stream of every run."""

    runs = 0
    wrong = False
    wrong_on_stream = None
    on_addresses = None  # whether the last run got every array slot as an address
    last = None  # the kernel that ran last
    fail = False
    addresses: dict = {}
    streams: list = []

    def __init__(self, kernel, options):
        self.kernel, self.options = kernel, options
        self.function, self.packed_metadata = "function", ("metadata",)

    def run(self, grid_x, grid_y, grid_z, stream, function, metadata, launch_metadata, enter, leave, *arguments):
        from gae_xp.backends import _triton_plan

        assert (grid_y, grid_z, function, metadata, launch_metadata, enter, leave) == \
            (1, 1, "function", ("metadata",), None, None, None)
        Compiled.runs += 1
        Compiled.last = self
        Compiled.streams.append(stream)
        if Compiled.fail:
            raise RuntimeError("the driver refused the launch")
        slots = _triton_plan._MAPS + 1
        Compiled.on_addresses = all(type(a) is int for a in arguments[:slots])
        arguments = (*(Compiled.addresses[a]() if type(a) is int else a for a in arguments[:slots]),
                     *arguments[slots:])
        names = _triton_plan._CONSTEXPRS
        constexprs = dict(zip(names, arguments[-len(names):]))
        self.kernel[(grid_x,)](*arguments[:-len(names)], **constexprs, **self.options)
        if Compiled.wrong or stream == Compiled.wrong_on_stream:
            arguments[_triton_plan._ADVANTAGES].add_(1.0)


def stand_in_compiled_kernels(monkeypatch) -> type[Compiled]:
    """The route's kernel launcher replaced by one that returns a compiled kernel per specialisation (``Compiled``,
    as Triton's launcher does on a GPU, kept for the process), whose run is the interpreter's; the direct launch's
    record of checked kernels emptied."""
    from gae_xp.backends import _triton_cupy_plan, _triton_launch, _triton_plan

    kernel = _triton_launch.gae_kernel
    kept = {}

    class Binder:
        def __getitem__(self, grid):
            def launch(*args, num_warps, num_stages, **constexprs):
                kernel[grid](*args, num_warps=num_warps, num_stages=num_stages, **constexprs)
                options = {"num_warps": num_warps, "num_stages": num_stages}
                # Triton's own key of pointers: 16-byte alignment of every array slot, computed here apart from
                # the plan's (a slot the plan's key left out would launch another specialisation's kernel)
                alignment = tuple(a.data_ptr() % 16 == 0 for a in args[:_triton_plan._MAPS + 1])
                key = (tuple(sorted(constexprs.items())), num_warps, num_stages, alignment)
                return kept.setdefault(key, Compiled(kernel, options))
            return launch

    addresses_of = _triton_plan._as_addresses

    def recorded(arguments):
        """The addresses of a direct launch, each kept for ``Compiled.run`` to read back as its tensor."""
        for tensor in arguments[:_triton_plan._MAPS + 1]:
            Compiled.addresses[tensor.data_ptr()] = while_alive(tensor)
        return addresses_of(arguments)

    monkeypatch.setattr(_triton_launch, "gae_kernel", Binder())
    monkeypatch.setattr(_triton_plan, "_as_addresses", recorded)
    for name, value in (("runs", 0), ("wrong", False), ("wrong_on_stream", None), ("on_addresses", None),
                        ("last", None), ("fail", False), ("addresses", {}), ("streams", [])):
        monkeypatch.setattr(Compiled, name, value)
    monkeypatch.setattr(_triton_plan, "_WARNED", set())
    monkeypatch.setattr(_triton_plan, "_CHECKED", {})
    monkeypatch.setattr(_triton_cupy_plan, "_CHECKED", {})
    return Compiled


def small_blocks_in_force(monkeypatch):
    """A fixture's body: 16-step blocks for every row length (the heuristic's table replaced), so that two rows of 40
    steps are few long rows cut into chunks (the chunks' two launches, the maps' included) at a size the
    interpreter runs in milliseconds; the launch plans and ``gae()``'s plans made under it forgotten after."""
    from gae_xp import _plans
    from gae_xp.backends import _triton_config, _triton_launch

    monkeypatch.setattr(_triton_config, "HEURISTIC", ((float("inf"), 16, 1, 1),))
    _triton_launch._config.cache_clear()
    _triton_launch._PLANS.clear()
    yield
    _triton_launch._config.cache_clear()
    _triton_launch._PLANS.clear()
    _plans.PLANS.clear()


def while_alive(array):
    """A function that returns ``array`` (a tensor, or a NumPy array as a tensor over its memory, a bool one's as
    uint8), and fails once it was freed: a kernel must never be launched on the address of freed memory."""
    import numpy as np
    import torch

    kept = weakref.ref(array)

    def alive():
        held = kept()
        assert held is not None, "a kernel was launched on the address of an array already freed"
        if isinstance(held, np.ndarray):
            return torch.from_numpy(held.view(np.uint8) if held.dtype == np.bool_ else held)
        return held

    return alive
