"""How a ``GaeProblem`` of torch tensors becomes launches of ``_triton_gae.gae_kernel``.

The batch axes of every array are folded together where all arrays allow it
(no copy: strides are passed), into at most two (``outer``, ``inner``); a layout
that keeps more is launched one slice of its leading axes at a time. A
``Plan`` holds what a launch of one layout needs besides the pointers and the
coefficients' numbers (grid, counts, strides, specialisation, block, warps,
stages, chunks), kept per layout: a repeated call builds a key of its arrays'
shapes, strides and dtypes, allocates its outputs and launches.

Traced calls (``gae_xp._compat.torch_is_recorded``: the fake tensors of ``torch.compile``, ``opcheck``
or a meta-device trace, or a Python dispatch mode recording the call) build
their plan from shapes, strides and dtypes alone, as every call does, keep no
plan and launch through ``torch.library.wrap_triton``, which puts the launch
into the graph for Inductor to compile and schedule; eager calls launch the
kernel directly (the wrapper's own dispatch would cost a call's whole budget).
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import math

import torch
import triton.language as tl
from torch.library import wrap_triton

from gae_xp import _problem
from gae_xp._compat import torch_is_recorded

from . import _triton_config as heuristic
from ._triton_gae import ABSENT, FINAL, MAP, NUMBER, PER_ROW, PER_STEP, SUMMARY, WHOLE, gae_kernel

#: The per-step arrays the kernel reads, in its order (its first parameters follow ``gae_xp._problem.PER_STEP``).
STEP_NAMES = _problem.PER_STEP
#: The fields of a problem a launch's layout depends on.
_FIELDS = (*STEP_NAMES, "bootstrap", "carry")
_FLAGS = _problem.FLAGS
_COEFFICIENTS = _problem.COEFFICIENTS
#: The launch settings (``triton.tuned()``'s knobs), in ``_config``'s order.
_SETTINGS = ("block", "num_warps", "num_stages", "chunks", "tile")
_COMPUTE = {torch.float16: tl.float32, torch.bfloat16: tl.float32, torch.float32: tl.float32,
            torch.float64: tl.float64}


def solve(p, settings: dict):
    """(advantages, returns) of problem ``p``: C-contiguous, in the dtype of its rewards."""
    rewards = p.rewards
    shape = rewards.shape
    advantages = torch.empty(shape, dtype=rewards.dtype, device=rewards.device)
    returns = torch.empty(shape, dtype=rewards.dtype, device=rewards.device)
    if rewards.numel() == 0:
        return advantages, returns
    traced = torch_is_recorded(rewards)  # its shapes may be symbols, which no dict keeps: a plan of its own, never kept
    with contextlib.nullcontext() if traced else on_device(rewards.device):
        plan = None if traced else solve_layout(p, settings)
        if plan is not None:
            plan.launch(p, advantages, returns)
            return advantages, returns
        arrays = _arrays(p, tuple(shape))
        slices = _slices(arrays, tuple(shape[:-1]))
        if slices == [(Ellipsis,)]:  # traced
            Plan(p, arrays, settings).launch(p, advantages, returns, arrays, traced)
            return advantages, returns
        for index in slices:  # batch axes that do not fold: a plan per slice, kept by none
            sliced = {name: a[index] for name, a in arrays.items()}
            Plan(p, sliced, settings).launch(p, advantages[index], returns[index], sliced, traced)
    return advantages, returns


def solve_layout(p, settings: dict):
    """The ``Plan`` of problem ``p``'s layout (kept per ``_layout``, made on its first call), or None where its batch
    axes do not fold into the kernels' two (launched a slice at a time, by no kept plan)."""
    key = _layout(p, settings)
    plan = _PLANS.get(key)
    if plan is not None:
        return plan
    arrays = _arrays(p, tuple(p.rewards.shape))
    if _slices(arrays, tuple(p.rewards.shape[:-1])) != [(Ellipsis,)]:
        return None
    if len(_PLANS) >= MAX_PLANS:
        _PLANS.clear()
    plan = _PLANS[key] = Plan(p, arrays, settings)
    return plan


#: Plans kept per layout (``_layout``); emptied when full.
MAX_PLANS = 256
_PLANS: dict = {}


def _layout(p, settings: dict) -> tuple:
    """What a launch's configuration depends on: every array's shape, strides and dtype (a coefficient's kind),
    the sequences' count, ``fill_masked``, the device and the tuning settings; not the data or the numbers."""
    parts = [p.rewards.device, p.fill_masked, *(settings[name] for name in _SETTINGS),
             None if p.offsets is None else p.offsets.shape[0]]
    for name in _FIELDS:
        value = getattr(p, name)
        parts.append(None if value is None else 0 if isinstance(value, float)
                     else (value.shape, value.stride(), value.dtype))
    return tuple(parts)


class Plan:
    """A launch of one layout (``_layout``) without its arrays: the grid, the counts and strides, the kernel's
    specialisation and launch settings, made once; ``launch`` adds a call's pointers and coefficients."""

    def __init__(self, p, arrays: dict, settings: dict):
        rewards = arrays["rewards"]
        shape = tuple(rewards.shape)
        batch, length = shape[:-1], shape[-1]
        groups = _fold(arrays, batch)
        inner_count = math.prod(batch[axis] for axis in groups[-1]) if groups else 1
        rows = math.prod(batch)
        sequences = 1 if p.offsets is None else int(p.offsets.shape[0]) - 1
        block, warps, stages, chunk, chunks, per_program = _config_of(
            length, rows, sequences, _multiprocessors(rewards.device),
            tuple(settings[name] for name in _SETTINGS), p.offsets is not None)
        stages = heuristic.fitting_stages(stages, block, _step_bytes(p, arrays, length),
                                          _shared_memory(rewards.device))
        strides = []
        for name in (*STEP_NAMES, "bootstrap", "carry"):
            a = arrays.get(name)
            strides.extend((0, 0, 0) if a is None else _folded_strides(a, groups))
        dtype = _COMPUTE[rewards.dtype]
        contiguous = all(arrays[name].stride(-1) == 1 for name in STEP_NAMES
                         if name in arrays and not (name in _COEFFICIENTS and arrays[name].shape[-1] != length))
        self.kinds = tuple(_kind(getattr(p, name), arrays.get(name), length) for name in _COEFFICIENTS)
        parts = chunks if chunks > 1 else sequences
        self.counts = (length, rows, inner_count, parts, chunk, chunks, *strides)
        self.maps = (rows, chunks, MAP.value) if chunks > 1 else None
        self.maps_dtype = torch.float64 if dtype == tl.float64 else torch.float32
        self.grid = (rows * parts,) if per_program == 1 else (-(-rows // per_program),)
        self.modes = (SUMMARY, FINAL) if chunks > 1 else (WHOLE,)
        gamma, lam, critic = self.kinds
        self.constants = dict(
            HAS_NEXT=p.next_values is not None, HAS_TERMINATED=p.terminated is not None,
            HAS_TRUNCATED=p.truncated is not None, HAS_MASK=p.mask is not None, GAMMA=gamma, LAM=lam, CRITIC=critic,
            HAS_CARRY=p.carry is not None, HAS_OFFSETS=p.offsets is not None, FILL=bool(p.fill_masked),
            CONTIGUOUS=contiguous, DTYPE=dtype, BLOCK=block, CHUNKS=heuristic.MAX_CHUNKS if chunks > 1 else 1,
            ALIGN=_alignment(arrays, batch, length, rewards.element_size(), contiguous), TWO_AXES=len(groups) == 2,
            RARE_PATHS=True, STAGES=stages, ROWS=per_program,
            num_warps=warps, num_stages=stages)

    def launch(self, p, advantages, returns, arrays: dict | None = None, traced: bool = False):
        """Launch on problem ``p``'s arrays (or on ``arrays``, a slice of them) into ``advantages`` and ``returns``;
        ``traced``: through ``torch.library.wrap_triton`` (``torch_is_recorded``)."""
        rewards = p.rewards
        if arrays is None:
            pointers = [_pointer(name, getattr(p, name), rewards) for name in STEP_NAMES]
            bootstrap, carry = p.bootstrap, rewards if p.carry is None else p.carry
        else:
            pointers = [arrays.get(name, rewards) for name in STEP_NAMES]
            bootstrap, carry = arrays["bootstrap"], arrays.get("carry", rewards)
        maps = rewards if self.maps is None else torch.empty(self.maps, dtype=self.maps_dtype, device=rewards.device)
        numbers = [value if kind == NUMBER else 0.0
                   for kind, value in zip(self.kinds, (p.gamma, p.lam, p.critic_lam))]
        arguments = (*pointers, bootstrap, carry, rewards if p.offsets is None else p.offsets, advantages, returns,
                     maps, *self.counts, *numbers)
        launcher = (wrap_triton(gae_kernel) if traced else gae_kernel)[self.grid]
        for mode in self.modes:
            launcher(*arguments, MODE=mode, **self.constants)


def _pointer(name: str, value, rewards):
    """The tensor the kernel gets for a per-step field: its own (a flag viewed as uint8), or ``rewards`` in place
    of an absent field or a number."""
    if value is None or isinstance(value, float):
        return rewards
    return value.view(torch.uint8) if name in _FLAGS else value


def _arrays(p, shape) -> dict:
    """The tensors the kernel reads, by name: per-step arrays broadcast to ``shape`` (views), flags as uint8 views,
    per-row coefficients as (..., 1) views, bootstrap and carry (..., n)."""
    arrays = {}
    for name in STEP_NAMES:
        value = getattr(p, name)
        if value is None or isinstance(value, float):
            continue
        value = torch.broadcast_to(value, shape)
        if name in _FLAGS:
            value = value.view(torch.uint8)
        elif name in _COEFFICIENTS and value.stride(-1) == 0:
            value = value[..., :1]  # one value per row: read once per program
        arrays[name] = value
    batch = shape[:-1]
    arrays["bootstrap"] = torch.broadcast_to(p.bootstrap, (*batch, p.bootstrap.shape[-1]))
    if p.carry is not None:
        arrays["carry"] = torch.broadcast_to(p.carry, (*batch, p.carry.shape[-1]))
    return arrays


def _slices(arrays: dict, batch) -> list:
    """Index tuples that cut the arrays into pieces whose batch axes fold into two: ``[...]`` when they all do."""
    groups = _fold(arrays, batch)
    if len(groups) <= 2:
        return [(Ellipsis,)]
    # iterate over the axes before the last two groups; each slice keeps those two, which fold
    return [(*index, Ellipsis) for index in itertools.product(*map(range, batch[:groups[-2][0]]))]


def _fold(arrays: dict, batch) -> list[list[int]]:
    """The batch axes longer than 1 in groups that fold into one axis for every array (C order: each axis's
    stride is the next one's times its length), so that a row of a group is ``index * stride of its last axis``."""
    groups: list[list[int]] = []
    for axis, size in enumerate(batch):
        if size == 1:
            continue
        if groups and all(a.stride(groups[-1][-1]) == a.stride(axis) * size for a in arrays.values()):
            groups[-1].append(axis)
        else:
            groups.append([axis])
    return groups


def _folded_strides(a, groups) -> tuple[int, int, int]:
    """(outer, inner, last-axis) strides of ``a`` for batch axes folded into ``groups`` (at most two)."""
    strides = [0, 0, *(a.stride(group[-1]) for group in groups)]
    return strides[-2], strides[-1], a.stride(-1)


def _kind(value, array, length: int) -> int:
    """How a coefficient reaches the kernel (``_triton_gae.ABSENT`` ... ``PER_STEP``)."""
    if value is None:
        return ABSENT
    if isinstance(value, float):
        return NUMBER
    return PER_ROW if array.shape[-1] != length else PER_STEP


def _alignment(arrays: dict, batch, length: int, itemsize: int, contiguous: bool) -> int:
    """The elements every row of every per-step array (and of the outputs; not one value per row) starts at a
    multiple of, as far as the strides tell: 16 bytes' worth of the floats where the time axis is contiguous and
    every row stride and T are multiples of it, else 1."""
    vector = 16 // itemsize
    if not contiguous or length % vector:
        return 1
    rows = [a for name, a in arrays.items() if name not in ("bootstrap", "carry") and a.shape[-1] == length]
    aligned = all(a.stride(axis) % vector == 0 for a in rows for axis in range(len(batch)) if batch[axis] > 1)
    return vector if aligned else 1


def _config_of(length, rows, sequences, multiprocessors: int, override: tuple,
               packed: bool = False) -> tuple[int, int, int, int, int, int]:
    """``_config``, kept per argument where they are numbers; computed anew where a traced shape makes one a
    symbol (each comparison then guards the graph on the row of the heuristic's table it falls in)."""
    if all(isinstance(n, int) for n in (length, rows, sequences)):
        return _config(length, rows, sequences, multiprocessors, override, packed)
    return _config.__wrapped__(length, rows, sequences, multiprocessors, override, packed)


@functools.lru_cache(maxsize=256)
def _config(length: int, rows: int, sequences: int, multiprocessors: int,
            override: tuple, packed: bool = False) -> tuple[int, int, int, int, int, int]:
    """(block, num_warps, num_stages, chunk, chunks, rows a program) for a launch: the heuristic row for the steps
    a program walks (``_triton_config.HEURISTIC``), overridden by ``tuned()`` (``override``: block, warps, stages,
    the most chunks a row is cut into and the tile, None for the heuristic's); chunks of whole blocks for few
    long rows without packed sequences (``packed``: the problem has offsets, even ``[0, T]``, one sequence: its
    programs are sequences, whose bounds the kernel reads from the offsets, so a row of them is never cut); short
    rows several a program under ``tuned(tile=...)`` (one pass, no offsets). The stages
    pipeline the walk over the blocks: the heuristic's for chunks of several blocks, else 1 (not pipelined; a
    ``Plan`` lowers either until its buffers fit the device's shared memory). In float32's constant case only
    the chunks were measured far from the copy (3.2x on the first H100, unpipelined); rows of several blocks on a
    GPU full of them ran at 1.13-1.28x (bfloat16 and masks at 1.4-3.5x at every shape, one-block rows too), and
    a pipeline costs instructions: the GPU check's stages variants measure it there before it becomes the
    default."""
    steps = max(1, length // sequences)
    block, warps, stages = next(row[1:] for row in heuristic.HEURISTIC if steps <= row[0])
    block, warps, stages = (mine if mine is not None else default
                            for mine, default in zip(override, (block, warps, stages)))
    most = heuristic.MAX_CHUNKS if override[3] is None else min(heuristic.MAX_CHUNKS, override[3])
    chunk, chunks = length, 1
    if not packed and most > 1 and rows < heuristic.FEW_ROWS * multiprocessors:
        wanted = -(-heuristic.PROGRAMS_PER_MULTIPROCESSOR * multiprocessors // rows)
        chunks = min(most, wanted, -(-length // block))
        if chunks > 1:
            chunk = -(-(-(-length // chunks)) // block) * block
            chunks = -(-length // chunk)
        if chunks < 2:
            chunk, chunks = length, 1
    if override[2] is None and not (chunks > 1 and chunk > block):
        stages = 1
    per_program, span = heuristic.rows_per_program(length, rows, override[4]) if not packed and chunks == 1 \
        else (1, None)
    if per_program > 1:  # a tile of short rows: their lanes, 8 steps a thread, one block walked (no pipeline)
        block = per_program * span
        warps = override[1] if override[1] is not None else max(1, block // (8 * 32))
        stages = 1
    return block, warps, stages, chunk, chunks, per_program


#: The multiprocessors of a device and the shared memory a program may take there, asked once per device.
_multiprocessors = functools.cache(heuristic.multiprocessors)
_shared_memory = functools.cache(heuristic.shared_memory)


def _step_bytes(p, arrays: dict, length: int) -> int:
    """The bytes a step of the kernel's walk loads: every per-step array's element (a per-row coefficient is read
    once a program), the values twice where V_{t+1} is read from them (no ``next_values``)."""
    loaded = sum(a.element_size() for name, a in arrays.items() if name in STEP_NAMES and a.shape[-1] == length)
    return loaded + (arrays["values"].element_size() if p.next_values is None else 0)


def on_device(device):
    """torch's device context for a CUDA device (Triton launches on the current one), else nothing."""
    return torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext()
