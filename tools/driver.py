"""The CUDA backend's own launch path on a machine without a GPU: stand-ins below its driver call.

``driven()`` runs ``numba_cuda`` as on a GPU down to ``cuLaunchKernel``
(views, plans, descriptors, the argument blocks of ``_cuda_launch``), with
kernels that carry their real signatures but no code, a context and a stream
that do nothing, and a driver whose ``cuLaunchKernel`` checks what it is
given as the real one would take it and records it (``Launches``). torch CPU
tensors stand in for CUDA ones (the same pointers, shapes and strides): the
backend takes them (``backend="numba-cuda"``, and ``"auto"`` for torch
tensors), and a plan's key holds their own layout, as a CUDA tensor's. The
plan cache is emptied on entry and on exit: no plan made on stand-ins serves
a call outside.

The check is strict where a stand-in that accepts anything would hide a
launch that fails on a GPU: the grid and block dimensions must be integers
within the hardware's limits (x < 2^31, y and z < 2^16, at most 1024 threads
a block), the function a kernel's handle, the parameters an address; and
where cuda.bindings is installed without a driver library (a machine
without a GPU), the real binding converts the same arguments too (its
argument conversion runs before it looks for the library, so a wrong type
raises TypeError there, as it would on a GPU). Each launch is recorded with
the bytes of every parameter as the driver would have copied them, and every
array argument with what it describes (pointer, shape, strides, item size) and
the bytes of its elements as the kernel would read them (the stand-in tensors
are host memory).

Used by ``docs/gpu_tables.py`` (the host path's microseconds) and the tests of
the launch path (``tests/test_cuda_driver_path.py``).
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import operator
from types import SimpleNamespace
from typing import NamedTuple

import numpy as np

#: The hardware's limits on a launch's dimensions (every CUDA GPU since compute capability 3.0).
MAX_GRID = (2**31 - 1, 65_535, 65_535)
MAX_THREADS = 1024


class Launch(SimpleNamespace):
    """One recorded driver launch: ``function`` (the stand-in kernel's handle), ``argtypes`` (its numba types),
    ``grid`` and ``block`` (x, y, z), ``stream``, ``parameters`` (the bytes of each flattened parameter, as
    ``_cuda_launch.layout`` lists them) and ``arrays`` (each array argument's ``ArrayArgument``, by the
    argument's index)."""


class ArrayArgument(NamedTuple):
    """An array argument as a launch describes it, and ``contents``: its elements' bytes in C order."""

    pointer: int
    shape: tuple
    strides: tuple
    itemsize: int
    contents: bytes


def _array_arguments(parameters, raw) -> dict:
    """Each array argument of a launch (``_cuda_launch.layout``'s parameters and their bytes), read."""
    members: dict = {}
    for parameter, value in zip(parameters, raw):
        if parameter.code == "q" and "." in parameter.name:  # an array's members are int64s named arg.member
            members.setdefault(parameter.argument, {})[parameter.name.split(".", 1)[1]] = \
                int.from_bytes(value[:8], "little", signed=True)
    arrays = {}
    for argument, member in members.items():
        ndim = sum(name.startswith("shape[") for name in member)
        shape = tuple(member[f"shape[{axis}]"] for axis in range(ndim))
        strides = tuple(member[f"strides[{axis}]"] for axis in range(ndim))
        arrays[argument] = ArrayArgument(member["data"], shape, strides, member["itemsize"],
                                         _contents(member["data"], shape, strides, member["itemsize"]))
    return arrays


def _contents(pointer: int, shape: tuple, strides: tuple, itemsize: int) -> bytes:
    """The bytes of the elements an array description covers, in C order (host memory: the stand-in tensors')."""
    if 0 in shape:
        return b""
    if pointer <= 0 or any(s < 0 for s in strides):
        raise ValueError(f"cuLaunchKernel: an array at {pointer:#x} with strides {strides}")
    span = itemsize + sum((n - 1) * s for n, s in zip(shape, strides))
    memory = np.frombuffer((ctypes.c_char * span).from_address(pointer), dtype=np.uint8)
    return np.lib.stride_tricks.as_strided(memory, (*shape, itemsize), (*strides, 1)).tobytes()


class Launches(list):
    """The launches made under ``driven()``, in order, and the argument types of each stand-in kernel by handle."""

    def __init__(self):
        super().__init__()
        self.signatures: dict = {}


def checked_launch(launches: Launches):
    """A stand-in ``cuLaunchKernel`` that checks its arguments as the driver takes them (and hands them to
    cuda.bindings' own ``cuLaunchKernel`` too where its driver library is absent: see the module docstring),
    records each launch in ``launches`` and returns success."""
    from gae_xp.backends import _cuda_launch

    success = _cuda_launch._driver().CUresult.CUDA_SUCCESS
    binding = _conversion_only()

    def cuLaunchKernel(f, gx, gy, gz, bx, by, bz, shared, stream, params, extra):  # noqa: N802 (the driver's name)
        grid, block = tuple(map(_dimension, (gx, gy, gz))), tuple(map(_dimension, (bx, by, bz)))
        if any(n > most for n, most in zip(grid, MAX_GRID)) or block[0] * block[1] * block[2] > MAX_THREADS:
            raise ValueError(f"cuLaunchKernel: grid {grid} or block {block} beyond the hardware's limits")
        argtypes = launches.signatures.get(f)
        if argtypes is None:
            raise ValueError(f"cuLaunchKernel: {f!r} is no kernel's handle")
        if operator.index(shared) != 0 or extra not in (0, None) or not isinstance(params, int) or not params:
            raise TypeError("cuLaunchKernel: shared memory, parameters or extra of an unexpected kind")
        if binding is not None:
            binding(f, gx, gy, gz, bx, by, bz, shared, stream, params, extra)
        parameters = _cuda_launch.layout(argtypes)
        addresses = (ctypes.c_void_p * len(parameters)).from_address(params)
        raw = [ctypes.string_at(a, p.size) for a, p in zip(addresses, parameters)]
        launches.append(Launch(function=f, argtypes=argtypes, grid=grid, block=block, stream=stream, parameters=raw,
                               arrays=_array_arguments(parameters, raw)))
        return (success,)

    return cuLaunchKernel


def _dimension(n) -> int:
    """A launch dimension as the driver's ``unsigned int`` takes it: an integer (``operator.index``), at least 1."""
    n = operator.index(n)
    if n < 1:
        raise ValueError(f"cuLaunchKernel: a dimension of {n}")
    return n


@functools.cache
def _conversion_only():
    """cuda.bindings' ``cuLaunchKernel`` when its driver library is absent (then a call converts its arguments and
    raises the library's absence, touching no device), else None (a GPU's driver would run the launch)."""
    from cuda.bindings import driver

    try:
        driver.cuLaunchKernel(0, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0)
    except RuntimeError as error:
        if type(error).__name__ != "DynamicLibNotFoundError":  # cuda.pathfinder's: no driver library here
            return None
    else:
        return None

    def convert(*args):
        try:
            driver.cuLaunchKernel(*args)
        except TypeError as wrong:
            raise TypeError(f"cuLaunchKernel's binding refuses {args!r}: {wrong}") from None
        except RuntimeError:  # the library's absence, after the arguments were converted
            pass

    return convert


def _keyed_as_on_a_device(tensor, views, index):
    """``gae_xp._plans._torch_step`` under ``driven()``: a stand-in tensor is keyed as a CUDA tensor is, by its own
    layout (``_torch_layout``), not by a NumPy view."""
    from gae_xp import _plans

    return _plans._torch_layout(tensor)


def _stand_ins_accepted(self, xp, arrays, *, forced=False):
    """``NumbaCUDABackend.unavailable_reason`` under ``driven()``: CPU tensors stand in for CUDA ones."""
    return None


@contextlib.contextmanager
def driven(*, checked: bool = True):
    """``numba_cuda`` launching through ``_cuda_launch`` onto ``checked_launch``; yields the ``Launches``.
    ``checked`` False, for timing the host path: a driver that only counts the launches (``Launches`` then
    holds the function handle of each) and returns success."""
    from unittest import mock

    from gae_xp import _plans
    from gae_xp.backends import _cuda_launch, numba_cuda
    from gae_xp.backends._cuda_kernels import Fields, carry_kernel

    launches = Launches()

    class Kernel:  # a dispatcher compiled for one signature, without code; its handle numbers it
        def __init__(self, spec):
            handle = len(launches.signatures) + 1
            launches.signatures[handle] = spec.signature.args
            self.overloads = {spec.signature.args: SimpleNamespace(
                argument_types=spec.signature.args,
                _codelibrary=SimpleNamespace(get_cufunc=lambda: SimpleNamespace(handle=handle)))}

    @functools.cache
    def compiled(module, io, structure):
        from gae_xp.backends import _cuda_backward, _cuda_gae, _cuda_lean

        if module == "lean":
            return Kernel(_cuda_lean.lean_kernel(io, structure))
        return Kernel((_cuda_gae if module == "gae" else _cuda_backward).forward_kernel(io, structure))

    @functools.cache
    def carry(io, value_chain, critic, reverse, complete):
        return Kernel(carry_kernel(io, Fields(value_chain, critic, True), reverse=reverse, complete=complete))

    if checked:
        driver = SimpleNamespace(cuLaunchKernel=checked_launch(launches))
    else:
        success = _cuda_launch._driver().CUresult.CUDA_SUCCESS
        driver = SimpleNamespace(cuLaunchKernel=lambda f, *args: launches.append(f) or (success,))
    numba_cuda._launcher.cache_clear()
    numba_cuda._forward_kernels.cache_clear()
    numba_cuda._lean_kernels.cache_clear()
    _plans.PLANS.clear()
    try:
        with mock.patch.object(numba_cuda, "_compiled", compiled), mock.patch.object(numba_cuda, "_carry", carry), \
                mock.patch.object(numba_cuda, "_device_index", lambda array: 0), \
                mock.patch.object(numba_cuda, "_current_stream", lambda array: SimpleNamespace(handle=0)), \
                mock.patch.object(numba_cuda, "simulated", lambda: False), \
                mock.patch.object(numba_cuda._Launch, "driver", True), \
                mock.patch.object(numba_cuda.NumbaCUDABackend, "unavailable_reason", _stand_ins_accepted), \
                mock.patch.object(_plans, "_torch_step", _keyed_as_on_a_device), \
                mock.patch("gae_xp.backends._cuda_import.cuda.gpus", {0: contextlib.nullcontext()}), \
                mock.patch.object(_cuda_launch, "_driver", lambda: driver):
            yield launches
    finally:
        numba_cuda._launcher.cache_clear()
        numba_cuda._forward_kernels.cache_clear()
        numba_cuda._lean_kernels.cache_clear()
        _plans.PLANS.clear()
