"""PTX, read and run on the CPU: which kernel argument every global load and store touches, and how wide it is.

``parse`` reads the entry kernel of a PTX module as numba-cuda writes it (every
device function inlined) into instructions; ``run_block`` executes them for
every thread of one thread block, one thread after another, and records every
access to global memory: the argument it falls in, its byte offset, its width
and the instruction that made it. No GPU, no driver: each array argument gets
an address range of its own, and the values read from it come from ``fill``.

What this can and cannot see:

* addresses depend on shapes, strides and thread and block indices, which are
  exact here; where they depend on data (a masked step skips its reads), the
  fill chooses the path: by default every step is real and nothing is cut, the
  path with the most reads;
* barriers are no-ops and shared memory is one store for the block, written
  in thread order: a thread can read a slot that a later thread writes, and
  gets 0. Such values steer arithmetic (the block scans), not addresses;
* warp intrinsics return the thread's own value; ``call`` (device functions
  that were not inlined) is refused with an error.
"""

from __future__ import annotations

import bisect
import math
import re
import struct
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

#: Most instructions one thread may run before the run is declared a hang (a spin on a flag no block sets).
STEP_LIMIT = 2_000_000
SECTOR = 32

_GLOBAL_BASE, _GLOBAL_STRIDE = 1 << 40, 1 << 36
_SHARED_BASE, _LOCAL_BASE = 1 << 32, 1 << 34


@dataclass(frozen=True)
class Instruction:
    """One PTX instruction: guard predicate (and whether it is negated), opcode parts, operands, source text."""

    guard: str | None
    negated: bool
    parts: tuple[str, ...]
    operands: tuple[str, ...]
    text: str


@dataclass
class Kernel:
    """The entry of a PTX module: parameter (type, name) in order, instructions, label positions, shared and
    local arrays (name -> bytes)."""

    name: str
    params: list[tuple[str, str]]
    body: list[Instruction]
    labels: dict[str, int]
    shared: dict[str, int] = field(default_factory=dict)
    local: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class Access:
    """One thread's access to global memory."""

    pc: int
    thread: int
    argument: str
    offset: int
    width: int
    store: bool


def parse(ptx: str) -> Kernel:
    """The first ``.entry`` of a PTX module."""
    text = re.sub(r"//[^\n]*", "", ptx)
    shared = {m.group(1): int(m.group(2)) for m in re.finditer(r"\.shared\s+(?:\.align\s+\d+\s+)?\.\w+\s+"
                                                                 r"([\w$]+)\[(\d+)\]", text)}
    local = {m.group(1): int(m.group(2)) for m in re.finditer(r"\.local\s+(?:\.align\s+\d+\s+)?\.\w+\s+"
                                                                r"([\w$]+)\[(\d+)\]", text)}
    entry = re.search(r"\.entry\s+([\w$]+)\s*\((.*?)\)\s*(?:\.\w+[^{]*)?\{", text, re.S)
    if entry is None:
        raise ValueError("no .entry in this PTX")
    params = [(m.group(1), m.group(2)) for m in re.finditer(r"\.param\s+(?:\.align\s+\d+\s+)?\.(\w+)\s+([\w$]+)",
                                                            entry.group(2))]
    depth, start = 1, entry.end()
    for position in range(start, len(text)):
        depth += {"{": 1, "}": -1}.get(text[position], 0)
        if depth == 0:
            break
    body, labels = [], {}
    for statement in re.split(r";|\n", text[start:position]):
        statement = statement.strip().strip("{}").strip()
        while (label := re.match(r"([\w$]+):\s*", statement)) is not None:
            labels[label.group(1)] = len(body)
            statement = statement[label.end():]
        if not statement or statement.startswith("."):
            continue
        body.append(_instruction(statement))
    if re.search(r"\.func\b", text) and any(ins.parts[0] == "call" for ins in body):
        raise NotImplementedError("this PTX calls device functions; only inlined kernels are read")
    return Kernel(entry.group(1), params, body, labels, shared, local)


def _instruction(statement: str) -> Instruction:
    guard, negated = None, False
    found = re.match(r"@(!?)(%[\w]+)\s+", statement)
    if found:
        negated, guard = found.group(1) == "!", found.group(2)
        statement = statement[found.end():]
    opcode, _, rest = re.sub(r"\s+", " ", statement, count=1).partition(" ")
    operands, depth, current = [], 0, ""
    for char in rest.strip():
        if char in "{[":
            depth += 1
        elif char in "}]":
            depth -= 1
        if char == "," and depth == 0:
            operands.append(current.strip())
            current = ""
        else:
            current += char
    if current.strip():
        operands.append(current.strip())
    return Instruction(guard, negated, tuple(opcode.split(".")), tuple(operands), statement)


# ----------------------------------------------------------------------------------------------- values and types

def _width(kind: str) -> int:
    return 1 if kind == "pred" else int(kind[1:])


def _is_float(kind: str) -> bool:
    return kind[0] == "f"


def _mask(bits: int) -> int:
    return (1 << bits) - 1


def _signed(value: int, bits: int) -> int:
    value &= _mask(bits)
    return value - (1 << bits) if value >> (bits - 1) else value


def _from_bits(value: int, kind: str) -> float:
    if kind == "f32":
        return struct.unpack("<f", struct.pack("<I", value & _mask(32)))[0]
    if kind == "f64":
        return struct.unpack("<d", struct.pack("<Q", value & _mask(64)))[0]
    return float(np.array([value & 0xFFFF], np.uint16).view(np.float16)[0])


def _to_bits(value: float, kind: str) -> int:
    if kind == "f32":
        return struct.unpack("<I", struct.pack("<f", np.float32(value)))[0]
    if kind == "f64":
        return struct.unpack("<Q", struct.pack("<d", value))[0]
    return int(np.array([value], np.float16).view(np.uint16)[0])


def _register_kind(name: str) -> str | None:
    """The class of a virtual register by NVVM's naming: %f f32, %fd f64, %p pred, %rs 16, %r 32, %rd 64 bits."""
    found = re.match(r"%([a-z]+)\d+$", name)
    if found is None:
        return None
    return {"f": "f32", "fd": "f64", "p": "pred", "rs": "b16", "r": "b32", "rd": "b64", "h": "b16",
            "hh": "b32"}.get(found.group(1))


def _as(value, kind: str):
    """A register's value read as ``kind``: float registers hold floats, integer registers ints (bits are cast)."""
    if kind == "pred":
        return bool(value)
    if _is_float(kind):
        if isinstance(value, float):
            return value
        return float(value) if isinstance(value, bool) else _from_bits(int(value), kind)
    if isinstance(value, float):
        value = _to_bits(value, {64: "f64", 32: "f32"}.get(_width(kind), "f16"))
    value = int(value)
    return _signed(value, _width(kind)) if kind[0] == "s" else value & _mask(_width(kind))


# ------------------------------------------------------------------------------------------------------ the memory

@dataclass
class _Region:
    name: str
    base: int
    size: int
    itemsize: int
    kind: str  # "f", "i", "u" or "b" (NumPy's dtype kind)
    fill: Callable[[int], object]
    written: dict = field(default_factory=dict)


class Memory:
    """Each array argument's address range, the block's shared memory and a thread's local memory."""

    def __init__(self):
        self.regions: list[_Region] = []
        self._bases: list[int] = []
        self.shared: dict[int, object] = {}
        self.local: dict[int, object] = {}

    def add(self, name: str, size: int, itemsize: int, kind: str, fill) -> int:
        base = _GLOBAL_BASE + len(self.regions) * _GLOBAL_STRIDE
        if size >= _GLOBAL_STRIDE:
            raise ValueError(f"argument {name!r} spans {size} bytes, more than a region holds")
        self.regions.append(_Region(name, base, size, itemsize, kind, fill))
        self._bases.append(base)
        return base

    def region(self, address: int) -> _Region | None:
        index = bisect.bisect_right(self._bases, address) - 1
        if index >= 0:
            region = self.regions[index]
            if address < region.base + max(region.size, 1):
                return region
        return None


# ----------------------------------------------------------------------------------------------------- the runner

class _Thread:
    __slots__ = ("regs", "special", "memory", "record", "thread")

    def __init__(self, special, memory, record, thread):
        self.regs = {}
        self.special = special
        self.memory = memory
        self.record = record
        self.thread = thread


class Program:
    """A parsed kernel compiled to one Python closure per instruction, with its parameters' values."""

    def __init__(self, kernel: Kernel, params: dict[str, object], memory: Memory):
        self.kernel = kernel
        self.params = params
        self.memory = memory
        self.symbols = {}
        for offset, (name, size) in enumerate(kernel.shared.items()):
            self.symbols[name] = _SHARED_BASE + offset * (1 << 24)
        for offset, (name, size) in enumerate(kernel.local.items()):
            self.symbols[name] = _LOCAL_BASE + offset * (1 << 24)
        self.steps = [self._compile(pc, ins) for pc, ins in enumerate(kernel.body)]

    # operands
    def _reader(self, operand: str, kind: str):
        if operand.startswith("%"):
            if operand in ("%tid.x", "%tid.y", "%tid.z", "%ntid.x", "%ntid.y", "%ntid.z", "%ctaid.x", "%ctaid.y",
                           "%ctaid.z", "%nctaid.x", "%nctaid.y", "%nctaid.z", "%laneid", "%warpid", "%nwarpid",
                           "%smid", "%nsmid", "%clock", "%clock64", "%globaltimer", "%lanemask_lt"):
                return lambda t: t.special.get(operand, 0)
            return lambda t: _as(t.regs.get(operand, 0), kind)
        if operand in self.symbols:
            address = self.symbols[operand]
            return lambda t: address
        if operand in self.params:
            value = self.params[operand]
            return lambda t: value
        constant = _immediate(operand, kind)
        return lambda t: constant

    def _address(self, operand: str):
        inner = operand.strip("[]").replace(" ", "")
        found = re.match(r"([%\w$.]+?)(?:\+(-?\w+))?$", inner)
        if found is None:
            raise ValueError(f"address {operand!r} not understood")
        base, offset = found.group(1), int(found.group(2) or "0", 0)
        if base in self.params:
            return ("param", base, offset)
        if base in self.symbols:
            address = self.symbols[base] + offset
            return ("fixed", lambda t: address)
        if base.startswith("%"):
            return ("fixed", lambda t: int(t.regs.get(base, 0)) + offset)
        return ("fixed", lambda t: int(base, 0) + offset)

    def _writer(self, operand: str):
        if operand.startswith("{"):
            names = [name.strip() for name in operand.strip("{}").split(",")]

            def write_many(t, values):
                for name, value in zip(names, values):
                    if name != "_":
                        t.regs[name] = value
            return write_many, len(names)
        return (lambda t, value: t.regs.__setitem__(operand, value)), 1

    # instructions
    def _compile(self, pc: int, ins: Instruction):
        step = self._compile_unguarded(pc, ins)
        if ins.guard is None:
            return step
        guard, negated = ins.guard, ins.negated

        def guarded(t):
            if bool(t.regs.get(guard, False)) != negated:
                return step(t)
            return None
        return guarded

    def _compile_unguarded(self, pc: int, ins: Instruction):  # noqa: C901 (one dispatch over the opcodes)
        op, parts, args = ins.parts[0], ins.parts, ins.operands
        kind = parts[-1] if len(parts) > 1 else "b32"
        end = len(self.kernel.body)
        if op in ("bar", "barrier", "membar", "fence", "prefetch", "prefetchu", "nanosleep", "pmevent", "trap",
                  "griddepcontrol"):
            return lambda t: None
        if op == "bra":
            target = self.kernel.labels[args[0]]
            return lambda t: target
        if op in ("ret", "exit"):
            return lambda t: end
        if op == "call":
            raise NotImplementedError(f"call: {ins.text}")
        if op == "ld" or op == "ldu":
            return self._load(pc, ins)
        if op == "st":
            return self._store(pc, ins)
        if op in ("atom", "red"):
            return self._atomic(pc, ins)
        if op == "cvta":
            read = self._reader(args[1], "b64")
            write, _ = self._writer(args[0])
            return lambda t: write(t, read(t))
        if op == "mov":
            return self._move(ins)
        if op == "cvt":
            return self._convert(ins)
        if op in ("setp", "set"):
            return self._compare(ins)
        if op == "selp":
            a, b, p = self._reader(args[1], kind), self._reader(args[2], kind), self._reader(args[3], "pred")
            write, _ = self._writer(args[0])
            return lambda t: write(t, a(t) if p(t) else b(t))
        if op in ("shfl", "vote", "activemask", "match", "redux"):
            return self._warp(ins)
        if op == "testp":
            test = parts[1]
            a = self._reader(args[1], kind)
            write, _ = self._writer(args[0])
            checks = {"nan": math.isnan, "infinite": math.isinf, "finite": math.isfinite,
                      "number": lambda x: not math.isnan(x), "notanumber": math.isnan,
                      "normal": lambda x: math.isfinite(x) and x != 0, "subnormal": lambda x: False}
            return lambda t: write(t, checks[test](a(t)))
        return self._arithmetic(ins)

    def _load(self, pc: int, ins: Instruction):
        parts, args = ins.parts, ins.operands
        kind = parts[-1]
        space = next((s for s in ("param", "global", "shared", "local", "const") if s in parts), "generic")
        lanes = next((int(p[1:]) for p in parts if re.fullmatch(r"v\d", p)), 1)
        write, count = self._writer(args[0])
        address = self._address(args[1])
        size = _width(kind) // 8 if kind != "pred" else 1
        if address[0] == "param":
            value = self.params[address[1]]
            return lambda t: write(t, value)
        where = address[1]
        memory = self.memory

        def load(t):
            base = where(t)
            values = [_read(memory, base + lane * size, kind, space, pc, t, size) for lane in range(lanes)]
            write(t, values if count > 1 else values[0])
        return load

    def _store(self, pc: int, ins: Instruction):
        parts, args = ins.parts, ins.operands
        kind = parts[-1]
        space = next((s for s in ("param", "global", "shared", "local") if s in parts), "generic")
        address = self._address(args[0])
        if address[0] == "param":
            raise NotImplementedError(f"stores to parameters (calls) are not read: {ins.text}")
        size = _width(kind) // 8
        if args[1].startswith("{"):
            readers = [self._reader(name.strip(), kind) for name in args[1].strip("{}").split(",")]
        else:
            readers = [self._reader(args[1], kind)]
        where = address[1]
        memory = self.memory

        def store(t):
            base = where(t)
            for lane, read in enumerate(readers):
                _write(memory, base + lane * size, read(t), space, pc, t, size)
        return store

    def _atomic(self, pc: int, ins: Instruction):
        parts, args = ins.parts, ins.operands
        kind = parts[-1]
        operation = next(p for p in parts[1:] if p in ("add", "inc", "dec", "exch", "cas", "min", "max", "and",
                                                        "or", "xor"))
        size = _width(kind) // 8
        returns = ins.parts[0] == "atom"
        write = self._writer(args[0])[0] if returns else None
        address = self._address(args[1 if returns else 0])[1]
        operands = [self._reader(a, kind) for a in args[2 if returns else 1:]]
        space = "shared" if "shared" in parts else "generic"
        memory = self.memory

        def atomic(t):
            base = address(t)
            old = _read(memory, base, kind, space, pc, t, size)
            values = [read(t) for read in operands]
            new = {"add": lambda: old + values[0], "exch": lambda: values[0],
                   "cas": lambda: values[1] if old == values[0] else old, "min": lambda: min(old, values[0]),
                   "max": lambda: max(old, values[0]), "and": lambda: old & values[0],
                   "or": lambda: old | values[0], "xor": lambda: old ^ values[0],
                   "inc": lambda: 0 if old >= values[0] else old + 1,
                   "dec": lambda: values[0] if old == 0 or old > values[0] else old - 1}[operation]()
            _write(memory, base, new, space, pc, t, size)
            if write is not None:
                write(t, old)
        return atomic

    def _move(self, ins: Instruction):
        kind = ins.parts[-1]
        target, source = ins.operands
        if source.startswith("{"):  # pack lanes into a wider register
            readers = [self._reader(name.strip(), "b32") for name in source.strip("{}").split(",")]
            lane_bits = _width(kind) // len(readers)
            write, _ = self._writer(target)

            def pack(t):
                value = 0
                for lane, read in enumerate(readers):
                    value |= (_as(read(t), f"b{lane_bits}") & _mask(lane_bits)) << (lane * lane_bits)
                write(t, value)
            return pack
        if target.startswith("{"):  # unpack
            names = [name.strip() for name in target.strip("{}").split(",")]
            lane_bits = _width(kind) // len(names)
            read = self._reader(source, f"b{_width(kind)}")

            def unpack(t):
                value = _as(read(t), f"b{_width(kind)}")
                for lane, name in enumerate(names):
                    if name != "_":
                        t.regs[name] = (value >> (lane * lane_bits)) & _mask(lane_bits)
            return unpack
        destination = _register_kind(target)
        read = self._reader(source, kind)
        write, _ = self._writer(target)
        if destination is not None and _is_float(destination) and not _is_float(kind):
            return lambda t: write(t, _from_bits(_as(read(t), kind), destination))
        if destination is not None and not _is_float(destination) and _is_float(kind):
            return lambda t: write(t, _to_bits(read(t), kind))
        return lambda t: write(t, read(t))

    def _convert(self, ins: Instruction):
        types_ = [p for p in ins.parts[1:] if re.fullmatch(r"[subf]\d+", p)]
        to, source = types_[-2], types_[-1]
        rounding = next((p for p in ins.parts if p in ("rzi", "rni", "rmi", "rpi", "rn", "rz", "rm", "rp")), "")
        saturate = "sat" in ins.parts
        read = self._reader(ins.operands[1], source if source != "f16" else "b16")
        write, _ = self._writer(ins.operands[0])

        def convert(t):
            value = read(t)
            if source == "f16":
                value = _from_bits(int(value), "f16")
            if to[0] == "f":
                result = float(value)
                if saturate:
                    result = min(max(result, 0.0), 1.0)
                write(t, _to_bits(result, "f16") if to == "f16" else result)
                return
            if isinstance(value, float):
                if math.isnan(value):
                    value = 0
                elif math.isinf(value):
                    value = (1 << (_width(to) - 1)) - 1 if value > 0 else -(1 << (_width(to) - 1))
                else:
                    value = {"rni": round, "rmi": math.floor, "rpi": math.ceil}.get(rounding, math.trunc)(value)
            write(t, _as(value, to))
        return convert

    def _compare(self, ins: Instruction):
        parts, args = ins.parts, ins.operands
        compare, kind = parts[1], parts[-1]
        combine = next((p for p in parts[2:] if p in ("and", "or", "xor")), None)
        a, b = self._reader(args[1], kind), self._reader(args[2], kind)
        other = self._reader(args[3], "pred") if combine else None
        targets = args[0].split("|")
        unordered = compare in ("equ", "neu", "ltu", "leu", "gtu", "geu", "nan")
        base = compare.rstrip("u") if unordered and compare != "nan" else compare
        if base == "n":  # "neu" stripped of its u
            base = "ne"
        tests = {"eq": lambda x, y: x == y, "ne": lambda x, y: x != y, "lt": lambda x, y: x < y,
                 "le": lambda x, y: x <= y, "gt": lambda x, y: x > y, "ge": lambda x, y: x >= y,
                 "lo": lambda x, y: x < y, "ls": lambda x, y: x <= y, "hi": lambda x, y: x > y,
                 "hs": lambda x, y: x >= y, "num": lambda x, y: not (math.isnan(x) or math.isnan(y)),
                 "nan": lambda x, y: math.isnan(x) or math.isnan(y)}
        test = tests[base]
        floating = _is_float(kind)
        unsigned = base in ("lo", "ls", "hi", "hs")

        def comparison(t):
            x, y = a(t), b(t)
            if unsigned:
                x, y = int(x) & _mask(_width(kind)), int(y) & _mask(_width(kind))
            if floating and (math.isnan(x) or math.isnan(y)) and base not in ("num", "nan"):
                result = unordered
            else:
                result = test(x, y)
            if combine:
                result = {"and": result and other(t), "or": result or other(t), "xor": result != other(t)}[combine]
            t.regs[targets[0]] = result
            if len(targets) > 1:
                t.regs[targets[1]] = not result
        return comparison

    def _warp(self, ins: Instruction):
        op, args = ins.parts[0], ins.operands
        if op == "activemask":
            write, _ = self._writer(args[0])
            return lambda t: write(t, 0xFFFFFFFF)
        if op == "vote":
            read = self._reader(args[1], "pred")
            write, _ = self._writer(args[0])
            if "ballot" in ins.parts:
                return lambda t: write(t, 0xFFFFFFFF if read(t) else 0)
            return lambda t: write(t, read(t))
        targets = args[0].split("|")
        read = self._reader(args[1], ins.parts[-1])

        def shuffle(t):  # the thread's own value: only the warp's other lanes could say more
            t.regs[targets[0]] = read(t)
            if len(targets) > 1:
                t.regs[targets[1]] = True
        return shuffle

    def _arithmetic(self, ins: Instruction):  # noqa: C901
        op, parts, args = ins.parts[0], ins.parts, ins.operands
        kind = parts[-1]
        bits = _width(kind) if kind != "pred" else 1
        wide = "wide" in parts
        high = "hi" in parts
        source_kind = kind
        out_kind = f"{kind[0]}{bits * 2}" if wide else kind
        readers = [self._reader(a, source_kind) for a in args[1:]]
        if wide and op == "mad":
            readers[2] = self._reader(args[3], out_kind)
        write, _ = self._writer(args[0])
        floating = _is_float(kind)

        def integer(value):
            return _as(value, out_kind) if not floating else value

        def product(x, y):
            value = x * y
            if high:
                return value >> bits
            return value

        if floating:
            table = {"add": lambda x, y: x + y, "sub": lambda x, y: x - y, "mul": lambda x, y: x * y,
                     "fma": lambda x, y, z: x * y + z, "mad": lambda x, y, z: x * y + z, "div": _divide,
                     "neg": lambda x: -x, "abs": abs, "min": _fmin, "max": _fmax, "rcp": lambda x: _divide(1.0, x),
                     "sqrt": lambda x: math.sqrt(x) if x >= 0 else math.nan,
                     "rsqrt": lambda x: 1 / math.sqrt(x) if x > 0 else (math.inf if x == 0 else math.nan),
                     "ex2": lambda x: 2.0 ** x if x < 1024 else math.inf,
                     "lg2": lambda x: math.log2(x) if x > 0 else (-math.inf if x == 0 else math.nan),
                     "sin": math.sin, "cos": math.cos, "tanh": math.tanh,
                     "copysign": lambda x, y: math.copysign(y, x)}
        else:
            table = {"add": lambda x, y: x + y, "sub": lambda x, y: x - y, "mul": product,
                     "mad": lambda x, y, z: product(x, y) + z, "div": _truncating_divide,
                     "rem": lambda x, y: x - y * _truncating_divide(x, y), "neg": lambda x: -x, "abs": abs,
                     "min": min, "max": max, "and": lambda x, y: x & y, "or": lambda x, y: x | y,
                     "xor": lambda x, y: x ^ y, "not": lambda x: ~x, "cnot": lambda x: int(x == 0),
                     "shl": lambda x, y: x << min(int(y) & 0xFFFFFFFF, bits) if y < bits else 0,
                     "shr": lambda x, y: x >> min(int(y) & 0xFFFFFFFF, bits),
                     "popc": lambda x: bin(int(x) & _mask(bits)).count("1"),
                     "clz": lambda x: bits - (int(x) & _mask(bits)).bit_length(),
                     "brev": lambda x: int(f"{int(x) & _mask(bits):0{bits}b}"[::-1], 2),
                     "bfe": lambda x, pos, length: (x >> pos) & _mask(length) if length else 0}
        if kind == "pred":
            table = {"and": lambda x, y: x and y, "or": lambda x, y: x or y, "xor": lambda x, y: x != y,
                     "not": lambda x: not x}
        if op not in table:
            raise NotImplementedError(f"PTX instruction not read: {ins.text}")
        function = table[op]
        if kind == "pred":
            return lambda t: write(t, function(*(bool(r(t)) for r in readers)))
        if floating:
            if len(readers) == 1:
                r0 = readers[0]
                return lambda t: write(t, function(r0(t)))
            if len(readers) == 2:
                r0, r1 = readers
                return lambda t: write(t, function(r0(t), r1(t)))
            return lambda t: write(t, function(*(r(t) for r in readers)))
        if len(readers) == 2:
            r0, r1 = readers
            return lambda t: write(t, integer(function(r0(t), r1(t))))
        return lambda t: write(t, integer(function(*(r(t) for r in readers))))


def _truncating_divide(x: int, y: int) -> int:
    if y == 0:
        return 0
    quotient = abs(x) // abs(y)
    return quotient if (x >= 0) == (y >= 0) else -quotient


def _divide(x: float, y: float) -> float:
    if y == 0:
        return math.nan if x == 0 or math.isnan(x) else math.copysign(math.inf, x) * math.copysign(1.0, y)
    return x / y


def _fmin(x: float, y: float) -> float:
    return y if math.isnan(x) else x if math.isnan(y) else min(x, y)


def _fmax(x: float, y: float) -> float:
    return y if math.isnan(x) else x if math.isnan(y) else max(x, y)


def _immediate(operand: str, kind: str):
    if re.fullmatch(r"0[fF][0-9a-fA-F]{8}", operand):
        value = _from_bits(int(operand[2:], 16), "f32")
        return value if _is_float(kind) else int(operand[2:], 16)
    if re.fullmatch(r"0[dD][0-9a-fA-F]{16}", operand):
        value = _from_bits(int(operand[2:], 16), "f64")
        return value if _is_float(kind) else int(operand[2:], 16)
    try:
        number = int(operand, 0)
    except ValueError:
        try:
            return float(operand)
        except ValueError:
            raise NotImplementedError(f"operand {operand!r} not understood") from None
    return float(number) if _is_float(kind) else _as(number, kind if kind != "pred" else "b32")


def _space_of(memory: Memory, address: int, space: str) -> str:
    if space != "generic":
        return space
    if _SHARED_BASE <= address < _LOCAL_BASE:
        return "shared"
    if _LOCAL_BASE <= address < _GLOBAL_BASE:
        return "local"
    return "global"


def _read(memory: Memory, address: int, kind: str, space: str, pc: int, t: _Thread, size: int):
    space = _space_of(memory, address, space)
    if space in ("shared", "local"):
        return _as((memory.shared if space == "shared" else memory.local).get(address, 0), kind)
    region = memory.region(address)
    if region is None:
        raise ValueError(f"thread {t.thread} reads {address:#x}, outside every argument (instruction {pc})")
    offset = address - region.base
    if offset + size > region.size:
        raise ValueError(f"thread {t.thread} reads {region.name}[byte {offset}], past its {region.size} bytes")
    t.record(Access(pc, t.thread, region.name, offset, size, False))
    value = region.written.get(offset)
    if value is None:
        value = region.fill(offset // region.itemsize)
        value = float(value) if region.kind == "f" else int(value)
        if region.kind == "f" and region.itemsize == 2 and not _is_float(kind):
            return _to_bits(value, "f16")
    return _as(value, kind)


def _write(memory: Memory, address: int, value, space: str, pc: int, t: _Thread, size: int):
    space = _space_of(memory, address, space)
    if space in ("shared", "local"):
        (memory.shared if space == "shared" else memory.local)[address] = value
        return
    region = memory.region(address)
    if region is None:
        raise ValueError(f"thread {t.thread} writes {address:#x}, outside every argument (instruction {pc})")
    offset = address - region.base
    if offset + size > region.size:
        raise ValueError(f"thread {t.thread} writes {region.name}[byte {offset}], past its {region.size} bytes")
    t.record(Access(pc, t.thread, region.name, offset, size, True))
    region.written[offset] = value


def run_block(program: Program, block: tuple[int, int, int], threads: tuple[int, int, int],
              grid: tuple[int, int, int]) -> list[Access]:
    """Every global access of every thread of ``block`` (x, y, z) in a launch of ``grid`` blocks of ``threads``."""
    accesses: list[Access] = []
    program.memory.shared.clear()
    count = threads[0] * threads[1] * threads[2]
    end = len(program.steps)
    for linear in range(count):
        x, y, z = linear % threads[0], linear // threads[0] % threads[1], linear // (threads[0] * threads[1])
        special = {"%tid.x": x, "%tid.y": y, "%tid.z": z, "%ntid.x": threads[0], "%ntid.y": threads[1],
                   "%ntid.z": threads[2], "%ctaid.x": block[0], "%ctaid.y": block[1], "%ctaid.z": block[2],
                   "%nctaid.x": grid[0], "%nctaid.y": grid[1], "%nctaid.z": grid[2], "%laneid": linear % 32,
                   "%warpid": linear // 32, "%nwarpid": -(-count // 32)}
        program.memory.local.clear()
        thread = _Thread(special, program.memory, accesses.append, linear)
        pc, steps, limit = 0, program.steps, STEP_LIMIT
        while pc < end:
            jump = steps[pc](thread)
            pc = pc + 1 if jump is None else jump
            limit -= 1
            if limit == 0:
                raise RuntimeError(f"thread {linear} of block {block} ran {STEP_LIMIT} instructions: a hang?")
    return accesses


def sectors_per_request(accesses: list[Access]) -> dict[str, tuple[float, float]]:
    """Per argument: (32-byte sectors a warp's request touches, the fewest its distinct bytes could touch),
    averaged over requests. A request is the k-th execution of one instruction by the lanes of one warp."""
    requests: dict[tuple, list[Access]] = {}
    seen: dict[tuple, int] = {}
    for access in accesses:
        key = (access.thread // 32, access.pc)
        occurrence = seen.get((access.thread, access.pc), 0)
        seen[(access.thread, access.pc)] = occurrence + 1
        requests.setdefault((*key, occurrence), []).append(access)
    totals: dict[str, list[float]] = {}
    for group in requests.values():
        touched = {byte for a in group for byte in range(a.offset, a.offset + a.width)}
        sectors = {byte // SECTOR for byte in touched}
        fewest = math.ceil(len(touched) / SECTOR)
        row = totals.setdefault(group[0].argument, [0.0, 0.0, 0])
        row[0] += len(sectors)
        row[1] += fewest
        row[2] += 1
    return {name: (s / n, f / n) for name, (s, f, n) in totals.items()}


def bytes_by_argument(accesses: list[Access]) -> dict[str, dict[str, int]]:
    """Per argument: bytes requested by loads and stores, and distinct bytes read and written (what reaches
    device memory when the caches keep what the block reuses)."""
    out: dict[str, dict[str, object]] = {}
    for access in accesses:
        row = out.setdefault(access.argument, {"requested": 0, "read": set(), "written": set(), "widths": set()})
        row["requested"] += access.width
        row["written" if access.store else "read"].update(range(access.offset, access.offset + access.width))
        row["widths"].add(access.width)
    return {name: {"requested": row["requested"], "read": len(row["read"]), "written": len(row["written"]),
                   "widths": tuple(sorted(row["widths"]))} for name, row in out.items()}


def load(ptx: str, arguments: list[tuple[str, object]], fill: dict[str, Callable[[int], object]] | None = None
         ) -> Program:
    """A program for ``ptx``'s entry with its parameters bound to ``arguments`` (name, value) in order.

    An argument with ``shape`` and ``dtype`` (a NumPy array, or a stand-in with ``strides``) is an array in
    numba-cuda's layout (meminfo, parent, nitems, itemsize, data, shape, strides: 5 + 2 ndim parameters) with
    an address range of its own; a tuple is its elements; anything else a scalar. ``fill[name](index)`` is the
    value of an array's element that nothing wrote (default: True for bool arrays, 0.5 for floats, 0 else).
    """
    kernel = parse(ptx)
    memory = Memory()
    values: list[object] = []
    for name, value in arguments:
        values.extend(_flatten(name, value, memory, (fill or {}).get(name)))
    if len(values) != len(kernel.params):
        raise ValueError(f"{len(values)} parameter values for the {len(kernel.params)} parameters of {kernel.name}")
    return Program(kernel, {param: value for (_, param), value in zip(kernel.params, values)}, memory)


def _flatten(name: str, value, memory: Memory, fill) -> list[object]:
    if value is None:  # an absent array: one pointer-sized 0 (the backend's launch extension)
        return [0]
    if isinstance(value, tuple):
        return [item for part in value for item in _flatten(name, part, memory, fill)]
    if hasattr(value, "shape") and hasattr(value, "dtype") and getattr(value, "ndim", len(value.shape)) > 0:
        dtype = np.dtype(value.dtype)
        shape = tuple(int(n) for n in value.shape)
        strides = tuple(getattr(value, "strides", None) or _c_strides(shape, dtype.itemsize))
        if any(s < 0 for s in strides):
            raise ValueError(f"argument {name!r} has a negative stride")
        span = 0 if 0 in shape else dtype.itemsize + sum((n - 1) * s for n, s in zip(shape, strides))
        if fill is None:
            fill = (lambda index: True) if dtype.kind == "b" else (lambda index: 0.5) if dtype.kind == "f" else \
                (lambda index: 0)
        base = memory.add(name, span, dtype.itemsize, dtype.kind, fill)
        return [0, 0, math.prod(shape), dtype.itemsize, base, *shape, *strides]
    if isinstance(value, (bool, np.bool_)):
        return [int(value)]
    if isinstance(value, (int, np.integer)):
        return [int(value)]
    return [float(value)]


def _c_strides(shape: tuple[int, ...], itemsize: int) -> tuple[int, ...]:
    strides, step = [], itemsize
    for n in reversed(shape):
        strides.append(step)
        step *= max(n, 1)
    return tuple(reversed(strides))
