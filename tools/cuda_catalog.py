"""The kernels the numba-CUDA backend launches, by family, phase and structure: what the compile test compiles.

A structure prunes its absent arrays at compile time, so the structure with
every option present (that can be asked for together: a carry, which pieces
bring, comes without critic_lam) bounds the registers, the shared memory and the code
of its family and phase; the plainest one shows the floor. For each io
dtype the catalog lists both (and, for float32 and float64, the structures
in between that change which map slots are live), plus the carry kernels of
every live-slot set; ``lean_structures`` lists the lean kernels (``_cuda_lean``). Imports numba.
"""

from __future__ import annotations

from gae_xp.backends import _cuda_backward, _cuda_gae, _cuda_lean
from gae_xp.backends._cuda_kernels import IO_DTYPES, Fields, KernelSpec, carry_kernel

_FLAGS = ("terminated", "truncated", "mask")


def _gae(family, phase, inputs, **options):
    inputs = frozenset(inputs)
    return _cuda_gae.forward_kernel, _cuda_gae.Structure(
        family, phase, inputs, value_chain=_cuda_gae.value_chain(family, inputs, options.get("summaries", False)),
        **options)


def _backward(family, phase, inputs, **options):
    return _cuda_backward.forward_kernel, _cuda_backward.Structure(family, phase, frozenset(inputs), **options)


def structures(io: str):
    """(factory, structure) pairs of one io dtype."""
    full = ("values", "gamma", "lam", *_FLAGS)
    every = [
        _gae("gae", "final", ["values"]),
        _gae("gae", "final", [*full, "critic_lam"], offsets=True, entering=True, fill=True, critic=True),
        _gae("gae", "final", full, offsets=True, carry=True, entering=True, fill=True),  # a carry has no critic_lam
        _gae("gae", "tiles", [*full, "critic_lam"], offsets=True, critic=True),
        _gae("gae", "tiles", full, offsets=True, summaries=True),
        # a float critic_lam (critic without its array) with every option: 128 registers, where the array needs more
        _gae("gae", "final", full, offsets=True, entering=True, fill=True, critic=True),
        _gae("gae", "tiles", full, offsets=True, critic=True),
        _gae("vtrace", "final", [*full, "log_rhos"], offsets=True, entering=True),
        _gae("vtrace", "tiles", [*full, "log_rhos"], offsets=True),
        _gae("lambda", "final", ["next_values", "gamma", "lam", *_FLAGS], offsets=True, entering=True),
        _gae("lambda", "tiles", ["next_values", "gamma", "lam", *_FLAGS], offsets=True),
        _gae("returns", "final", ["gamma", *_FLAGS], offsets=True, carry=True, entering=True),
        _backward("adjoint", "final", ["grad_advantages", "grad_returns", "gamma", "lam", *_FLAGS], offsets=True,
                  entering=True, fill=True, carry=True),
        _backward("scan", "final", ["coefficient"], entering=True),
    ]
    if io in ("float32", "float64"):
        every += [
            _gae("gae", "tiles", ["values"]),
            _gae("gae", "final", ["values", "next_values", *_FLAGS], entering=True),
            _gae("gae", "final", ["values", "next_values"], entering=True, critic=True),
            _gae("vtrace", "final", ["values", "next_values", "log_rhos"]),
            _gae("lambda", "tiles", ["next_values", *_FLAGS], offsets=True),
            _gae("lambda", "final", ["next_values"]),
            _gae("returns", "tiles", ["gamma", *_FLAGS], offsets=True),
            _gae("returns", "final", ["gamma"]),
            _backward("adjoint", "tiles", ["grad_advantages", "grad_returns", "gamma", "lam", *_FLAGS], offsets=True),
            _backward("adjoint", "final", ["grad_advantages", "grad_returns", *_FLAGS], offsets=True, entering=True,
                      next_values=True),
            _backward("scan", "tiles", ["coefficient"]),
        ]
    return every


def _lean(phase, inputs, chunked=False, fill=False):
    return _cuda_lean.lean_kernel, _cuda_lean.LeanStructure(frozenset(inputs), phase, chunked, fill)


def lean_structures(io: str):
    """(factory, structure) pairs of the lean kernels of one io dtype: the plainest, the flags, every array (a
    mask with next_values, and without: the value chain), one launch and both phases of chunked rows (with
    fill_masked), and for float32 and float64 the steps between."""
    chain = ["gamma", "lam", "terminated", "truncated", "mask"]  # the value chain: a mask without next_values
    every = [
        _lean("final", []),
        _lean("final", ["terminated", "truncated"]),
        _lean("final", _cuda_lean.OPTIONAL_STEPS),
        _lean("final", _cuda_lean.OPTIONAL_STEPS, chunked=True, fill=True),
        _lean("maps", _cuda_lean.OPTIONAL_STEPS),
        _lean("final", chain),
        _lean("final", chain, chunked=True, fill=True),
        _lean("maps", chain),
    ]
    if io in ("float32", "float64"):
        every += [
            _lean("final", ["next_values", "terminated", "truncated"]),
            _lean("final", ["gamma", "lam"]),
            _lean("final", [], chunked=True),
            _lean("maps", []),
            # the GPU benchmark's dones+mask case in chunked rows: a mask and terminated, the value chain
            _lean("final", ["terminated", "mask"], chunked=True),
            _lean("maps", ["terminated", "mask"]),
        ]
    return every


def carries(io: str):
    """Every carry kernel: each live-slot set in its direction, and the completion of piece summaries."""
    yield carry_kernel(io, Fields(False, False, True), reverse=True, complete=False)
    yield carry_kernel(io, Fields(True, False, True), reverse=True, complete=False)
    yield carry_kernel(io, Fields(False, True, True), reverse=True, complete=False)
    yield carry_kernel(io, Fields(True, True, True), reverse=True, complete=False)
    yield carry_kernel(io, Fields(True, False, True), reverse=True, complete=True)
    yield carry_kernel(io, Fields(True, False, True), reverse=False, complete=False)
    yield carry_kernel(io, Fields(False, False, True), reverse=False, complete=False)


def all_kernels():
    """Every (io dtype, KernelSpec) of the catalog."""
    for io in IO_DTYPES:
        for factory, structure in (*structures(io), *lean_structures(io)):
            spec: KernelSpec = factory(io, structure)
            yield io, spec
        for spec in carries(io):
            yield io, spec
