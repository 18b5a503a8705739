"""The driver launch's argument blocks (``backends/_cuda_launch``) against numba-cuda's launcher and the PTX.

For every kernel signature of the catalog (``tools.cuda_catalog``, and
group_advantages' two kernels): the packed parameters equal, in count, byte
size, bytes and order, what numba-cuda's own launcher
(``_Kernel._prepare_args``, with the backend's launch extension) flattens
the same arguments to; numba is given stand-in device arrays with the same
pointer, shape and strides, and its parameters are packed by cuda.core's
``ParamHolder`` as its ``launch`` packs them, so no GPU is involved. The layout is also
checked against the ``.param`` list of a compiled kernel's PTX ``.entry``:
here a small kernel with every argument kind the catalog uses;
tests/test_cuda_compile.py (slow) checks every catalog kernel's PTX.
"""

from __future__ import annotations

import ctypes
import importlib.util
import os
import re
import struct
from types import SimpleNamespace

import numpy as np
import pytest

SIMULATED = os.environ.get("NUMBA_ENABLE_CUDASIM") == "1"
pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("numba") is None or importlib.util.find_spec("numba.cuda") is None or SIMULATED,
    reason="numba-cuda's launcher (not the simulator's) is what the driver launch reproduces")


def _signatures():
    if pytestmark.args[0]:
        return []
    from gae_xp.backends import _cuda_consecutive, _cuda_groups
    from tools import cuda_catalog

    found = [(f"{io}-{spec.name}", spec.signature) for io, spec in cuda_catalog.all_kernels()]
    found += [(spec.name, spec.signature) for io in ("float32", "float64") for spec in _cuda_groups.specs(io)]
    found += [(spec.name, spec.signature) for io in ("float16", "float32", "float64")
              for spec in _cuda_consecutive.specs(io)]
    return found


SIGNATURES = _signatures()


def arguments(argtypes, rng):
    """(descriptors for the packing, stand-ins for numba's launcher): the same arrays, scalars and tuples."""
    from numba.cuda.cudadrv import devicearray

    from gae_xp.backends._cuda_import import types
    from gae_xp.backends._cuda_launch import Descriptor

    ours, numba_args = [], []
    for ty in argtypes:
        if isinstance(ty, types.Array):
            shape = tuple(int(n) for n in rng.integers(1, 5000, ty.ndim))
            item = ty.dtype.bitwidth // 8
            strides = tuple(int(s) * item for s in rng.integers(0, 10**6, ty.ndim))
            pointer = int(rng.integers(1, 2**47)) * 256
            ours.append(Descriptor(pointer, shape, strides, item))
            # what numba's launcher reads of a device array (DeviceNDArray._strided_memory_view_shim)
            view = devicearray._StridedMemoryViewShim(
                ptr=pointer, shape=shape, dtype=np.dtype(str(ty.dtype)), size=int(np.prod(shape)),
                _layout=devicearray._StridedLayoutShim(strides_in_bytes=strides, is_contiguous_c=False,
                                                       is_contiguous_f=False, is_contiguous_any=False))
            numba_args.append(SimpleNamespace(__cuda_memory__=True, _strided_memory_view_shim=view))
        elif isinstance(ty, types.NoneType):
            ours.append(None)
            numba_args.append(None)
        elif isinstance(ty, types.BaseTuple):
            elements = tuple(_scalar(t, rng) for t in ty)
            ours.append(elements)
            numba_args.append(elements)
        else:
            value = _scalar(ty, rng)
            ours.append(value)
            numba_args.append(value)
    return ours, numba_args


def _scalar(ty, rng):
    if str(ty) == "bool":
        return bool(rng.integers(0, 2))
    if isinstance(ty, __import__("numba").types.Integer):
        return int(rng.integers(-(2**40), 2**40)) if ty.bitwidth == 64 else int(rng.integers(0, 100))
    return float(np.dtype(str(ty)).type(rng.standard_normal()))


def numba_flattening(argtypes, args, sizes) -> list[bytes]:
    """The parameters numba-cuda's launcher would hand the driver for these arguments: its ``_prepare_args``
    (with the backend's launch extension) packed by cuda.core's ``ParamHolder``, as its ``launch`` packs them;
    ``sizes``: how many bytes of each parameter to read."""
    from cuda.core._kernel_arg_handler import ParamHolder
    from numba.cuda.dispatcher import _Kernel

    from gae_xp.backends import numba_cuda

    class Kernel:
        extensions = numba_cuda._EXTENSIONS
        _prepare_args = _Kernel._prepare_args

    kernelargs: list = []
    for ty, value in zip(argtypes, args):
        Kernel()._prepare_args(ty, value, stream=0, retr=[], kernelargs=kernelargs)
    assert len(kernelargs) == len(sizes), (len(kernelargs), len(sizes))
    holder = ParamHolder(kernelargs)
    addresses = (ctypes.c_void_p * len(kernelargs)).from_address(holder.ptr)
    return [ctypes.string_at(address, size) for address, size in zip(addresses, sizes)]


def packed(argtypes, args) -> list[bytes]:
    """Our argument block, cut into its parameters (each at a multiple of SLOT, its own size long)."""
    from gae_xp.backends import _cuda_launch

    block = struct.pack(_cuda_launch.block_format(argtypes), *_cuda_launch.values(argtypes, args))
    params = _cuda_launch.layout(argtypes)
    assert len(block) == _cuda_launch.SLOT * len(params)
    return [block[_cuda_launch.SLOT * i:_cuda_launch.SLOT * i + p.size] for i, p in enumerate(params)]


@pytest.mark.parametrize("signature", [s for _, s in SIGNATURES], ids=[name for name, _ in SIGNATURES])
def test_packed_arguments_equal_numbas_flattening(signature):
    rng = np.random.default_rng(len(signature.args))
    from gae_xp.backends import _cuda_launch

    ours, theirs = arguments(signature.args, rng)
    sizes = [p.size for p in _cuda_launch.layout(signature.args)]
    assert packed(signature.args, ours) == numba_flattening(signature.args, theirs, sizes)


#: PTX parameter types by struct code of ours (an 8-byte member, a float of its width, an integer of its width).
_PTX_TYPES = {"q": {"u64", "b64", "s64"}, "Q": {"u64", "b64", "s64"}, "f": {"f32"}, "d": {"f64"},
              "H": {"b16", "u16", "f16"}, "B": {"u8", "b8", "s8"}, "?": {"u8", "b8", "s8"}, "i": {"u32", "s32", "b32"}}


def ptx_parameters(ptx: str) -> list[str]:
    """The types of the ``.param`` list of the PTX's (only) ``.entry``, in order."""
    start = ptx.index(".entry")
    header = ptx[start:ptx.index(")", start)]
    return re.findall(r"\.param\s+\.(\w+)\s", header)


def check_parameters(argtypes, kinds: list[str]) -> None:
    """Our layout has the PTX entry's parameters (``kinds``, from ``ptx_parameters``): as many, in order, each of
    its type and size."""
    from gae_xp.backends import _cuda_launch

    params = _cuda_launch.layout(argtypes)
    assert len(params) == len(kinds), (len(params), len(kinds))
    for index, (ours, theirs) in enumerate(zip(params, kinds)):
        assert theirs in _PTX_TYPES[ours.code], (index, ours, theirs)
        assert int(re.sub(r"\D", "", theirs)) == 8 * ours.size, (index, ours, theirs)


def _compile_ptx(function, signature):
    import numba.cuda.dispatcher
    from numba import cuda

    current = numba.cuda.dispatcher.get_current_device
    numba.cuda.dispatcher.get_current_device = lambda: SimpleNamespace(compute_capability=(9, 0))
    try:
        return cuda.compile_ptx(function, signature, cc=(9, 0))[0]
    except Exception as error:  # no NVVM: the toolkit wheels are absent
        pytest.skip(f"compile_ptx unavailable: {str(error).splitlines()[0] if str(error) else error!r}")
    finally:
        numba.cuda.dispatcher.get_current_device = current


def test_layout_matches_the_ptx_of_every_argument_kind():
    """A kernel taking each kind of argument the catalog's kernels take: 1-, 2- and 3-d arrays of every element
    type (float16/bfloat16 bits as uint16/int16, uint8 flags, int64 offsets), an absent array, the float32,
    float64 and int64 tuples, an integer, a boolean and a float (group_advantages' kernels); every argument
    read, so that none is optimised away."""
    from gae_xp.backends._cuda_import import types

    def kernel(a, b, none, c, d, e, f, g, s32, s64, geometry, k, flag, eps, out):
        if none is None and flag:
            out[0] = a[0, 0] + b[0] + c[0, 0, 0] + d[0, 0] + e[0] + f[0, 0] + g[0, 0] + s32[5] + s64[5] + geometry[5] \
                + k + eps

    signature = types.void(types.float32[:, :], types.float64[:], types.none, types.float32[:, :, ::1],
                           types.uint16[:, :], types.int64[:], types.uint8[:, :], types.int16[:, :],
                           types.UniTuple(types.float32, 6), types.UniTuple(types.float64, 6),
                           types.UniTuple(types.int64, 6), types.int64, types.boolean, types.float64,
                           types.float64[::1])
    check_parameters(signature.args, ptx_parameters(_compile_ptx(kernel, signature)))


def test_values_name_the_wrong_argument():
    from gae_xp.backends import _cuda_launch
    from gae_xp.backends._cuda_import import types

    argtypes = (types.float32[:, :], types.none)
    with pytest.raises(TypeError, match="args: the kernel takes 2 arguments"):
        _cuda_launch.values(argtypes, [None])
    with pytest.raises(TypeError, match="Descriptor of 2 dimensions"):
        _cuda_launch.values(argtypes, [_cuda_launch.Descriptor(0, (1,), (4,), 4), None])
    with pytest.raises(TypeError, match="None for an absent array"):
        _cuda_launch.values(argtypes, [_cuda_launch.Descriptor(0, (1, 1), (4, 4), 4), 3])


def test_launcher_packs_what_values_gives_and_calls_the_driver_once(monkeypatch):
    """``Launcher`` (its fast flattening) packs the block ``values`` describes, hands the driver the addresses of
    its parameters, and names a wrong argument; no GPU: a stand-in kernel and driver."""
    from gae_xp.backends import _cuda_launch
    from tools import cuda_catalog

    calls = []
    success = _cuda_launch._driver().CUresult.CUDA_SUCCESS
    monkeypatch.setattr(_cuda_launch, "_driver", lambda: SimpleNamespace(
        cuLaunchKernel=lambda *args: calls.append(args) or (success,)))
    for io, spec in list(cuda_catalog.all_kernels())[::7]:
        argtypes = spec.signature.args
        overload = SimpleNamespace(argument_types=argtypes,
                                   _codelibrary=SimpleNamespace(get_cufunc=lambda: SimpleNamespace(handle=0xF00)))
        launcher = _cuda_launch.Launcher(SimpleNamespace(overloads={argtypes: overload}))
        ours, _ = arguments(argtypes, np.random.default_rng(3))
        launcher(0, SimpleNamespace(handle="s"), 7, 128, ours)
        function, grid, _, _, threads, _, _, shared, stream, params, extra = calls.pop()
        assert (function, grid, threads, shared, stream, extra) == (0xF00, 7, 128, 0, "s", 0)
        count = len(_cuda_launch.layout(argtypes))
        addresses = list((ctypes.c_void_p * count).from_address(params))
        got = [ctypes.string_at(address, p.size) for address, p in zip(addresses, _cuda_launch.layout(argtypes))]
        assert got == packed(argtypes, ours), spec.name
        wrong = list(ours)
        wrong[1] = None if wrong[1] is not None else _cuda_launch.Descriptor(0, (1, 1), (4, 4), 4)
        with pytest.raises(TypeError, match="expected"):
            launcher(0, SimpleNamespace(handle="s"), 7, 128, wrong)
        with pytest.raises(TypeError, match="args: the kernel takes"):
            launcher(0, SimpleNamespace(handle="s"), 7, 128, ours[:-1])
    assert not calls


def test_the_launch_is_chosen_by_its_environment_variable():
    """GAE_XP_CUDA_LAUNCH: 'driver' (the default) or 'numba'; anything else is refused, naming the variable."""
    numba_cuda = pytest.importorskip("gae_xp.backends.numba_cuda")
    assert numba_cuda._launch_through_the_driver("driver") is True
    assert numba_cuda._launch_through_the_driver("numba") is False
    with pytest.raises(ValueError, match="GAE_XP_CUDA_LAUNCH"):
        numba_cuda._launch_through_the_driver("cuda")
