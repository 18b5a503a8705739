"""backends/_cuda_import: which compiler the CUDA kernels take (numba-cuda-mlir where installed, else numba-cuda;
numba-cuda under the simulator), and PTX from the chosen one without a GPU."""

from __future__ import annotations

import importlib.util

import pytest

from gae_xp.backends import _cuda_import as ci

BOTH = (ci.NUMBA_CUDA_MLIR, ci.NUMBA_CUDA)


def test_numba_cuda_mlir_first_where_installed():
    assert ci.choose({}, available=BOTH) == ci.NUMBA_CUDA_MLIR
    assert ci.choose({}, available=(ci.NUMBA_CUDA,)) == ci.NUMBA_CUDA


def test_the_simulator_takes_numba_cuda():
    assert ci.choose({"NUMBA_ENABLE_CUDASIM": "1"}, available=BOTH) == ci.NUMBA_CUDA
    with pytest.raises(ValueError, match="numba-cuda-mlir has no simulator"):
        ci.choose({"NUMBA_ENABLE_CUDASIM": "1", ci.ENVIRONMENT_VARIABLE: ci.NUMBA_CUDA_MLIR}, available=BOTH)


def test_forcing_a_compiler():
    assert ci.choose({ci.ENVIRONMENT_VARIABLE: ci.NUMBA_CUDA}, available=BOTH) == ci.NUMBA_CUDA
    with pytest.raises(ValueError, match="GAE_XP_CUDA_COMPILER must be one of"):
        ci.choose({ci.ENVIRONMENT_VARIABLE: "nvcc"}, available=BOTH)
    with pytest.raises(ImportError, match=r"pip install 'numba-cuda-mlir\[cu12\]'"):
        ci.choose({ci.ENVIRONMENT_VARIABLE: ci.NUMBA_CUDA_MLIR}, available=(ci.NUMBA_CUDA,))
    with pytest.raises(ImportError, match="need numba-cuda, which is not installed"):
        ci.choose({}, available=())


def test_installed_matches_the_environment():
    expected = tuple(name for name, module in ((ci.NUMBA_CUDA_MLIR, "numba_cuda_mlir"), (ci.NUMBA_CUDA, "numba"))
                     if importlib.util.find_spec(module) is not None)
    assert ci.installed()[:1] == expected[:1]
    assert ci.NAME in ci.installed()


def test_compile_ptx_without_a_gpu():
    def scale(x, y):
        i = ci.cuda.grid(1)
        if i < x.shape[0]:
            y[i] = x[i] * 2.0

    try:
        ptx = ci.compile_ptx(scale, "void(float32[:], float32[:])", (9, 0))
    except Exception as error:  # NVVM missing: the toolkit wheels bring it (numba-cuda[cu12])
        pytest.skip(f"NVVM cannot compile here: {str(error).splitlines()[0] if str(error) else error!r}")
    assert ".target sm_90" in ptx and ("mul.f32" in ptx or "add.f32" in ptx)  # x * 2 may become x + x
