"""Kernel launches through the driver, with the argument block laid out once per kernel (imports numba on use).

numba-cuda's launcher, per call, builds a ctypes object for every flattened
parameter of every argument, and a device-array object for every array. The
kernels here take the same parameters, in the same order and with the same
bytes, packed by one ``struct.pack_into`` into a buffer whose parameter
addresses were computed when the kernel was first launched; only the values
change per call. The flattening (numba-cuda 0.30's ``_Kernel._prepare_args``, which hands
cuda.core's ``launch`` Python integers, packed as ``intptr_t``, and ctypes
scalars) is, per argument of the kernel's signature:

* an array of ``ndim`` dimensions: ``meminfo`` (0), ``parent`` (0), ``nitems``
  (the product of the shape), ``itemsize``, ``data`` (the device pointer), then
  ``shape[ndim]`` and ``strides[ndim]`` (bytes): 5 + 2 ndim parameters, each 8 bytes;
* ``none`` (an absent array; the backend's launch extension): one 8-byte 0;
* an integer or float scalar: its own width (float16 as its 16 bits);
* a tuple: its elements, flattened in order.

``layout(argtypes)`` is that list of parameters, a pure function of the numba
types; ``values(argtypes, args)`` the parameters' values for arrays described
by ``Descriptor`` (pointer, shape, strides, itemsize), no GPU involved; the
tests compare both with the ``.param`` list of each kernel's PTX ``.entry`` and
with numba's own flattening as cuda.core packs it. ``Launcher`` launches one
compiled kernel with ``cuLaunchKernel`` (cuda.bindings, which numba-cuda is
built on) on a given stream. The simulator has no driver and keeps numba's
launch.
"""

from __future__ import annotations

import ctypes
import math
import struct
import threading
from typing import Any, NamedTuple

#: Every parameter lies at a multiple of this many bytes in the argument block (the widest parameter's size).
SLOT = 8
#: The struct codes of the scalar types, by numba type name (float16: its bits).
_CODES = {"float16": "H", "float32": "f", "float64": "d", "int8": "b", "uint8": "B", "int16": "h", "uint16": "H",
          "int32": "i", "uint32": "I", "int64": "q", "uint64": "Q", "bool": "?"}
#: The members of a flattened array, before its shape and strides.
ARRAY_HEAD = ("meminfo", "parent", "nitems", "itemsize", "data")


class Descriptor(NamedTuple):
    """An array as the kernel sees it: device pointer, shape, strides in bytes, item size; ``owner`` keeps the
    memory alive until the launch is enqueued."""

    pointer: int
    shape: tuple
    strides: tuple
    itemsize: int
    owner: Any = None


class Parameter(NamedTuple):
    """One flattened kernel parameter: the argument it comes from, what it is, its struct code."""

    argument: int
    name: str
    code: str

    @property
    def size(self) -> int:
        return struct.calcsize("<" + self.code)


def _kind(ty) -> tuple:
    """("array", ndim), ("none",), ("scalar", code) or ("tuple", kinds) of one numba type."""
    from ._cuda_import import types

    if isinstance(ty, types.Array):
        return ("array", ty.ndim)
    if isinstance(ty, types.NoneType):
        return ("none",)
    if isinstance(ty, types.BaseTuple):
        return ("tuple", tuple(_kind(t) for t in ty))
    name = str(ty)
    if name not in _CODES:
        raise TypeError(f"argtypes: no packing for the numba type {name!r}")
    return ("scalar", _CODES[name], name)


def _flat(argument: int, kind: tuple, name: str):
    if kind[0] == "array":
        yield from (Parameter(argument, f"{name}.{member}", "q") for member in ARRAY_HEAD)
        yield from (Parameter(argument, f"{name}.shape[{axis}]", "q") for axis in range(kind[1]))
        yield from (Parameter(argument, f"{name}.strides[{axis}]", "q") for axis in range(kind[1]))
    elif kind[0] == "none":
        yield Parameter(argument, f"{name} (none)", "Q")
    elif kind[0] == "tuple":
        for index, element in enumerate(kind[1]):
            yield from _flat(argument, element, f"{name}[{index}]")
    else:
        yield Parameter(argument, name, kind[1])


def layout(argtypes) -> tuple[Parameter, ...]:
    """The flattened parameters of a kernel with these argument types, in launch order."""
    return tuple(p for index, ty in enumerate(argtypes) for p in _flat(index, _kind(ty), f"arg{index}"))


def block_format(argtypes) -> str:
    """The ``struct`` format of the argument block: every parameter little-endian at a multiple of ``SLOT``."""
    return "<" + "".join(p.code + "x" * (SLOT - p.size) for p in layout(argtypes))


def _values_of(kind: tuple, value, out: list) -> None:
    tag = kind[0]
    if tag == "array":
        if not isinstance(value, Descriptor) or len(value.shape) != kind[1]:
            raise TypeError(f"expected a Descriptor of {kind[1]} dimensions, got {value!r}")
        out += (0, 0, math.prod(value.shape), value.itemsize, value.pointer, *value.shape, *value.strides)
    elif tag == "none":
        if value is not None:
            raise TypeError(f"expected None for an absent array, got {type(value).__name__}")
        out.append(0)
    elif tag == "tuple":
        if not isinstance(value, tuple) or len(value) != len(kind[1]):
            raise TypeError(f"expected a tuple of {len(kind[1])} elements, got {value!r}")
        for element_kind, element in zip(kind[1], value):
            _values_of(element_kind, element, out)
    elif kind[2] == "float16":
        import numpy as np

        out.append(int(np.float16(value).view(np.uint16)))
    else:
        out.append(value)


def values(argtypes, args) -> list:
    """The flattened parameters' values (what ``struct.pack`` with ``block_format`` takes) of ``args``: arrays as
    ``Descriptor``, absent arrays as None, scalars and tuples as they are."""
    if len(args) != len(argtypes):
        raise TypeError(f"args: the kernel takes {len(argtypes)} arguments, got {len(args)}")
    out: list = []
    for ty, value in zip(argtypes, args):
        _values_of(_kind(ty), value, out)
    return out


class Launcher:
    """Launches one compiled kernel (a numba dispatcher compiled for one signature) through ``cuLaunchKernel``.

    The argument block (a buffer of ``block_format``'s size) and the array of its parameters' addresses are made
    once; a launch packs the values into the block and calls the driver, which copies them before it returns
    (a lock keeps concurrent launches of the same kernel from sharing the block meanwhile).
    """

    def __init__(self, dispatcher):
        (self._kernel,) = dispatcher.overloads.values()
        self.argtypes = tuple(self._kernel.argument_types)
        self._kinds = tuple(_kind(ty) for ty in self.argtypes)
        #: tuples of scalars that pack as they are (no float16 among them)
        self._plain_tuples = {k for k in self._kinds if k[0] == "tuple" and all(e[0] == "scalar" and e[2] != "float16"
                                                                                for e in k[1])}
        self._format = struct.Struct(block_format(self.argtypes))
        self._block = ctypes.create_string_buffer(max(self._format.size, 1))
        base = ctypes.addressof(self._block)
        count = len(layout(self.argtypes))
        self._params = (ctypes.c_void_p * count)(*(base + SLOT * i for i in range(count)))
        self._params_address = ctypes.addressof(self._params)
        self._functions: dict = {}
        self._lock = threading.Lock()

    def function(self, device: int):
        """The kernel's handle on device ``device`` (loaded into the current context on its first launch there)."""
        handle = self._functions.get(device)
        if handle is None:
            # cuda.core loads a library: its CUkernel, passed as the CUfunction that cuLaunchKernel takes
            handle = self._functions[device] = int(self._kernel._codelibrary.get_cufunc().handle)
        return handle

    def __call__(self, device: int, stream, grid, threads: int, args) -> None:
        """Launch ``grid`` blocks (a number, or (x, y): ``_cuda_plan.grid``) of ``threads`` threads on ``stream`` (a
        numba stream) of the current context (device index ``device``)."""
        try:
            if len(args) != len(self._kinds):
                raise TypeError
            flat = self._flat(args)
            function = self.function(device)
            x, y = dimensions(grid)
            with self._lock:
                self._format.pack_into(self._block, 0, *flat)
                (error,) = _driver().cuLaunchKernel(function, x, y, 1, threads, 1, 1, 0, stream.handle,
                                                    self._params_address, 0)
        except (AttributeError, TypeError, struct.error):
            values(self.argtypes, args)  # raises naming what does not fit the signature
            raise
        if error != _SUCCESS[0]:
            raise RuntimeError(f"cuLaunchKernel failed: {error!r}")

    def _flat(self, args) -> list:
        """``values(self.argtypes, args)`` without its checks (the launch checks when packing fails)."""
        flat: list = []
        for kind, value in zip(self._kinds, args):
            tag = kind[0]
            if tag == "array":
                shape = value.shape
                flat += (0, 0, math.prod(shape), value.itemsize, value.pointer, *shape, *value.strides)
            elif tag == "none":
                flat.append(0 if value is None else value)  # anything else fails to pack: the check names it
            elif kind in self._plain_tuples:
                flat += value
            else:
                _values_of(kind, value, flat)
        return flat


def dimensions(grid) -> tuple[int, int]:
    """A launch's grid as the driver takes it, (blocks in x, blocks in y): from a number of blocks, or from the
    (x, y) of ``_cuda_plan.grid`` (the tile kernels number their blocks ``blockIdx.x + blockIdx.y * gridDim.x``)."""
    if type(grid) is int:
        return grid, 1
    x, y = grid
    return x, y


_SUCCESS: list = []


def _driver():
    """cuda.bindings' driver module (what numba-cuda itself is built on), imported on the first launch."""
    from cuda.bindings import driver

    if not _SUCCESS:
        _SUCCESS.append(driver.CUresult.CUDA_SUCCESS)
    return driver
