r"""What every fused numba-CUDA kernel shares (this module imports numba): maps, block scans, loads, carries.

Every problem is a first-order linear recurrence along the rows of (rows, T)
arrays, cut into *tiles* (``_cuda_plan``): reverse in time for GAE and its
estimators (``_cuda_gae``), forward for the adjoint of GAE
(``_cuda_backward``), either way for the scan primitive (``_cuda_scan``).

**Maps.** A run of steps acts on the state entering it (from the right for a
reverse recurrence) by an affine map. The state is one or two chains X (the
advantage; a second one for a decoupled ``critic_lam``) and a value chain Y
("V at the next real step")::

    X -> edge + product X + on_bootstrap Y        (X2 likewise, with edge2, product2, on_bootstrap2)
    Y -> value + on_value Y

These are ``gae_xp._pieces.FIELDS`` (value, on_value, edge, on_bootstrap,
product): a piece's summary is the map of its steps. A map is a 9-tuple
``(edge, product, on_bootstrap, edge2, product2, on_bootstrap2, value,
on_value, ends)``; a kernel keeps only the fields its structure uses live
(``Fields``), the others stay at the identity's constants and vanish at
compile time. ``ends`` (1.0 or 0.0) marks a run that holds a segment's
boundary (its end in a reverse recurrence, its start in a forward one):
composing stops there, so the map of a run is that of its steps up to the
boundary (a segmented scan). Composition, near after far::

    edge  = edge_n + product_n edge_f + on_bootstrap_n value_f        product = product_n product_f
    on_bootstrap = product_n on_bootstrap_f + on_bootstrap_n on_value_f
    value = value_n + on_value_n value_f                               on_value = on_value_n on_value_f

with exact products (``mul0``: 0 when either factor is 0, so NaN or inf
never crosses a cut) and products of coefficients that keep an underflow of
non-zero factors at the smallest subnormal (``times``: only a true zero
cuts, so a NaN travels as far back as in the serial loop).

**Tiles.** A block loads its tile with *striped* loads (thread ``tid`` reads
steps ``k * threads + tid``: a warp's load instruction reads 32 consecutive
elements of a C-contiguous row) into shared memory, and reads its own
``ITEMS`` consecutive steps back (CUB's block-load transpose; the shared
index is padded so that the reads do not collide in banks). Outputs go the
same way back: blocked writes to shared memory, striped stores. Each thread
folds its steps into a map, a double-buffered Hillis-Steele scan in shared
memory composes the threads' maps (one barrier per step; no warp
intrinsics, so numba's simulator runs the same code), and the final pass
rescans every thread's steps from the state entering it.

**Carries.** ``carry_kernel`` (launch 2 of a long row) composes the maps of
a row's tiles in recurrence order and writes, for every tile, the map
entering it from its neighbours (the first tile's is the identity).

Global loads and stores of the streamed arrays carry cache hints
(``ld.global.cg`` where launch 3 reads the data again, ``ld.global.cs`` and
``st.global.cs`` where it is read or written once; a broadcast array, read
again by other steps or rows, keeps ``ld.global.cg`` in launch 3 too), which
also makes them the ``.global`` instructions of the PTX; the simulator
indexes plainly.
Kernels are built by factories in the family modules, returned as
``KernelSpec`` (function, explicit signature, a stable name); the backend
compiles them with ``cuda.jit(signature)``, the compile test with
``cuda.compile_ptx``. Absent arrays are ``None`` (typed ``none``, one
pointer-sized parameter): ``if x is None`` branches are pruned at compile
time, so a structure pays only for the arrays it has.
"""

from __future__ import annotations

import functools
from typing import Callable, NamedTuple

import numpy as np

from ._cuda_import import cuda, types
from ._cuda_plan import CARRY_THREADS, ITEMS, SIMULATED, THREADS, Fields

#: The element types of the per-step arrays a kernel reads: bfloat16 arrives as its bits (uint16).
IO_DTYPES = ("float16", "bfloat16", "float32", "float64")
#: Names of the nine slots of a map, in tuple order (``Fields`` says which a structure keeps live).
SLOTS = ("edge", "product", "on_bootstrap", "edge2", "product2", "on_bootstrap2", "value", "on_value", "ends")
#: Bits of a step's flag byte: its flags (exchanged through shared memory), then where it lies in its segment:
#: BOUNDARY = where the state is reset (a reverse recurrence: the segment's last step; a forward one: its first),
#: LAST = the segment's last step in a forward recurrence (where its boundary gradients leave it).
TERMINATED, TRUNCATED, REAL, BOUNDARY, LAST = 1, 2, 4, 8, 16


class KernelSpec(NamedTuple):
    """A kernel before compilation: a stable name (tables, the PTX), its Python function, its signature, and its
    launch bounds (most threads per block, fewest blocks per SM: a cap on registers that ptxas keeps)."""

    name: str
    function: Callable
    signature: object
    launch_bounds: tuple[int, int] | None = None


def tile_bounds(io: str, heavy: bool = False) -> tuple[int, int]:
    """A tile kernel's launch bounds: blocks of up to THREADS threads, two per SM (at most 128 registers a
    thread), or one for float64 and for ``heavy`` structures (a second chain for critic_lam, a float or per
    step), whose eight steps per thread of every input do not fit 128 registers without spilling (a float
    critic_lam with every option spilled on sm_80 in bfloat16)."""
    return (THREADS, 1 if io == "float64" or heavy else 2)


def compute_dtype(io: str) -> str:
    """float64 for float64 data, float32 otherwise (float16 and bfloat16 are computed in float32)."""
    return "float64" if io == "float64" else "float32"


def element_type(io: str):
    """The numba type of an io array's elements (bfloat16: its 16 bits)."""
    return types.uint16 if io == "bfloat16" else getattr(types, io)


def array(dtype, ndim: int, layout: str = "A"):
    """``types.Array`` of a dtype name or numba type."""
    return types.Array(getattr(types, dtype) if isinstance(dtype, str) else dtype, ndim, layout)


def optional(present: bool, kind):
    """An argument's type: ``kind`` when the structure has the array, else ``none``."""
    return kind if present else types.none


class Constants(NamedTuple):
    dtype: type
    zero: object
    one: object
    tiny: object


def constants(io: str) -> Constants:
    t = np.dtype(compute_dtype(io)).type
    return Constants(t, t(0), t(1), np.finfo(t).smallest_subnormal)


# --- bfloat16 bits ---------------------------------------------------------------------------------------------

if SIMULATED:
    def _float_of_bits(bits):
        return np.uint32(bits).view(np.float32)

    def _bits_of_float(x):
        return np.float32(x).view(np.uint32)
else:
    libdevice = cuda.libdevice

    @cuda.jit(device=True)
    def _float_of_bits(bits):
        return libdevice.int_as_float(np.int32(bits))

    @cuda.jit(device=True)
    def _bits_of_float(x):
        return np.uint32(libdevice.float_as_int(x))


def bfloat16_to_float32(bits):
    """The float32 of a bfloat16's 16 bits: the same bits, 16 zero bits below (exact)."""
    return _float_of_bits(np.uint32(bits) << np.uint32(16))


def float32_to_bfloat16(x):
    """The bfloat16 bits nearest a float32 (ties to even; NaN stays NaN with its sign, made quiet)."""
    bits = _bits_of_float(x)
    if (bits & np.uint32(0x7FFFFFFF)) > np.uint32(0x7F800000):
        return np.uint16((bits >> np.uint32(16)) | np.uint32(0x40))
    rounding = np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1))
    return np.uint16((bits + rounding) >> np.uint32(16))


_bfloat16_to_float32 = cuda.jit(device=True)(bfloat16_to_float32)
_float32_to_bfloat16 = cuda.jit(device=True)(float32_to_bfloat16)


@cuda.jit(device=True)
def _as_stored(x):
    return x


@functools.lru_cache(maxsize=None)
def conversions(io: str):
    """(to_compute, to_io) device functions for one io dtype; a float store casts by itself, bfloat16 rounds here."""
    if io == "bfloat16":
        return _bfloat16_to_float32, _float32_to_bfloat16
    compute = constants(io).dtype

    @cuda.jit(device=True)
    def to_compute(x):
        return compute(x)

    return to_compute, _as_stored


# --- global loads and stores of streamed arrays ------------------------------------------------------------------

if SIMULATED:
    @cuda.jit(device=True)
    def load_again(a, row, t):
        return a[row, t]

    load_once = load_again

    @cuda.jit(device=True)
    def store_once(a, row, t, value):
        a[row, t] = value
else:
    @cuda.jit(device=True)
    def load_again(a, row, t):
        """A load that launch 3 repeats: cached in L2 only (ld.global.cg)."""
        return cuda.ldcg(a, (np.int64(row), np.int64(t)))

    @cuda.jit(device=True)
    def load_once(a, row, t):
        """A last read: streaming, evict first (ld.global.cs), unless ``a`` is broadcast (a stride 0: other steps
        or rows read the same element), which is cached in L2 (ld.global.cg) for them to find. The test is the
        same for every thread of the block: no divergence."""
        if a.strides[0] == 0 or a.strides[1] == 0:
            return cuda.ldcg(a, (np.int64(row), np.int64(t)))
        return cuda.ldcs(a, (np.int64(row), np.int64(t)))

    @cuda.jit(device=True)
    def store_once(a, row, t, value):
        """An output: streaming store (st.global.cs)."""
        cuda.stcs(a, (np.int64(row), np.int64(t)), value)


# --- tiles and the shared-memory exchange ------------------------------------------------------------------------

@cuda.jit(device=True)
def tile_id():
    """This block's tile over a 2-D grid (``_cuda_plan.grid``)."""
    return np.int64(cuda.blockIdx.x) + np.int64(cuda.blockIdx.y) * np.int64(cuda.gridDim.x)


@cuda.jit(device=True)
def tile_place(geometry, tile):
    """(first row, first step, steps) of a tile (``_cuda_plan.tile_of``)."""
    rows, length, tiles_per_row, rows_per_tile, tile_steps, _ = geometry
    if tiles_per_row > 1:
        row = tile // tiles_per_row
        start = (tile - row * tiles_per_row) * tile_steps
        return row, start, min(tile_steps, length - start)
    row = tile * rows_per_tile
    return row, np.int64(0), min(rows_per_tile, rows - row) * length


@cuda.jit(device=True)
def locate(i, row0, start, geometry):
    """(row, step) of the tile's i-th step (whole rows per tile: a 32-bit division by T)."""
    length, tiles_per_row = geometry[1], geometry[2]
    if tiles_per_row > 1:
        return row0, start + i
    q = np.int64(np.uint32(i) // np.uint32(length))
    return row0 + q, i - q * length


def shared_size(compute: str, fields: int) -> int:
    """Elements of a tile kernel's shared float buffer: the padded tile, or the block scan's two buffers."""
    tile = THREADS * ITEMS
    return max(tile + (tile >> pad_shift(compute)) + 1, 2 * fields * THREADS)


def pad_shift(compute: str) -> int:
    """log2 of the words between two pads: blocked reads of ITEMS consecutive words hit distinct banks."""
    return 4 if compute == "float64" else 5


@functools.lru_cache(maxsize=None)
def exchange(io: str, again: bool):
    """Device functions moving one array between global memory (striped) and a thread's steps (blocked).

    ``again``: launch 3 reads the same data later (loads cached in L2), else these are its last reads.
    """
    to_compute, to_io = conversions(io)
    shift = pad_shift(compute_dtype(io))
    load = load_again if again else load_once
    zero = constants(io).zero

    @cuda.jit(device=True)
    def pad(i):
        return i + (i >> shift)

    @cuda.jit(device=True)
    def to_shared(shared, a, row0, start, steps, geometry):
        """Striped loads of a tile of ``a`` into ``shared`` (converted to the compute dtype)."""
        tid, threads = cuda.threadIdx.x, cuda.blockDim.x
        for k in range(ITEMS):
            i = k * threads + tid
            if i < steps:
                row, t = locate(i, row0, start, geometry)
                shared[pad(i)] = to_compute(load(a, row, t))

    @cuda.jit(device=True)
    def to_registers(out, shared, a, row0, start, steps, geometry, first, count):
        """A tile of ``a`` into this thread's ``ITEMS`` steps (``out``; 0 past the tile's end, and everywhere when
        ``a`` is None): striped loads into ``shared``, blocked reads back, a barrier after each."""
        if a is None:
            for j in range(ITEMS):
                out[j] = zero
        else:
            to_shared(shared, a, row0, start, steps, geometry)
            cuda.syncthreads()
            for j in range(ITEMS):
                out[j] = shared[pad(first + j)] if j < count else zero
            cuda.syncthreads()

    @cuda.jit(device=True)
    def flags_to_shared(shared, terminated, truncated, mask, row0, start, steps, geometry):
        """Striped loads of the bool flags (as uint8) into one byte per step: TERMINATED | TRUNCATED | REAL."""
        tid, threads = cuda.threadIdx.x, cuda.blockDim.x
        for k in range(ITEMS):
            i = k * threads + tid
            if i < steps:
                row, t = locate(i, row0, start, geometry)
                bits = REAL
                if terminated is not None:
                    if load(terminated, row, t) != 0:
                        bits |= TERMINATED
                if truncated is not None:
                    if load(truncated, row, t) != 0:
                        bits |= TRUNCATED
                if mask is not None:
                    if load(mask, row, t) == 0:
                        bits -= REAL
                shared[i] = np.uint8(bits)

    @cuda.jit(device=True)
    def from_shared(a, shared, row0, start, steps, geometry):
        """Striped stores of a tile held in ``shared`` (compute dtype) to ``a`` (its io dtype)."""
        tid, threads = cuda.threadIdx.x, cuda.blockDim.x
        for k in range(ITEMS):
            i = k * threads + tid
            if i < steps:
                row, t = locate(i, row0, start, geometry)
                store_once(a, row, t, to_io(shared[pad(i)]))

    return _Exchange(pad, to_registers, flags_to_shared, from_shared)


class _Exchange(NamedTuple):
    pad: object
    to_registers: object
    flags_to_shared: object
    from_shared: object


# --- segments ----------------------------------------------------------------------------------------------------

@cuda.jit(device=True)
def segment_of(offsets, t):
    """The segment holding step t: the largest i with offsets[i] <= t (empty segments are never chosen)."""
    lo, hi = np.int64(0), np.int64(offsets.shape[0] - 1)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if offsets[mid] <= t:
            lo = mid
        else:
            hi = mid
    return lo


# --- exact products ----------------------------------------------------------------------------------------------

class Products(NamedTuple):
    """The products of one compute dtype (``products``)."""

    mul0: object
    scale0: object
    times: object


@functools.lru_cache(maxsize=None)
def products(io: str) -> Products:
    """Device functions of the exact products, in the compute dtype of ``io``.

    * ``mul0(x, y)`` = x y, exactly 0 when x or y is 0: the maps' products, where either factor may be a state
      (NaN or inf) and a cut is a zero on either side;
    * ``scale0(c, x)`` = c x, exactly 0 when the coefficient c is 0 (a cut drops NaN and inf in x); c is finite
      (products of gamma and lam in [0, 1]), so x = 0 gives c 0 = +-0 without a test: one comparison fewer than
      ``mul0``, for the lean kernels' two-number state;
    * ``times(x, y)`` = x y for coefficients: 0 only when x or y is, an underflow of non-zero factors kept at
      +-tiny (only a true zero cuts).
    """
    c = constants(io)
    zero, tiny = c.zero, c.tiny

    @cuda.jit(device=True)
    def mul0(x, y):
        if x == zero or y == zero:
            return zero
        return x * y

    @cuda.jit(device=True)
    def scale0(c, x):
        if c == zero:
            return zero
        return c * x

    @cuda.jit(device=True)
    def times(x, y):
        z = x * y
        if z == zero and x != zero and y != zero:
            z = -tiny if (x < zero) != (y < zero) else tiny
        return z

    return Products(mul0, scale0, times)


# --- maps --------------------------------------------------------------------------------------------------------

@functools.lru_cache(maxsize=None)
def algebra(io: str, fields: Fields):
    """Device functions of the maps of one structure (see the module docstring), as a namespace."""
    c = constants(io)
    zero, one = c.zero, c.one
    mul0, times = products(io).mul0, products(io).times
    value_chain, critic, segmented = fields
    live = fields.live()
    count = len(live)
    index = {name: live.index(name) if name in live else -1 for name in SLOTS}
    i_b, i_p, i_q, i_b2, i_p2, i_q2, i_v, i_o, i_e = (index[name] for name in SLOTS)

    @cuda.jit(device=True)
    def identity():
        return (zero, one, zero, zero, one, zero, zero, one, zero)

    @cuda.jit(device=True)
    def compose(n, f):
        """``n o f``: the map of a run ``n`` after the run ``f`` that its state comes from."""
        nb, np_, nq, nb2, np2, nq2, nv, no, ne = n
        fb, fp, fq, fb2, fp2, fq2, fv, fo, fe = f
        if segmented and ne != zero:
            return n
        b = nb + mul0(np_, fb)
        q = zero
        b2, p2, q2 = zero, one, zero
        v, o = zero, one
        if value_chain:
            b += mul0(nq, fv)
            q = mul0(np_, fq) + mul0(nq, fo)
            v = nv + mul0(no, fv)
            o = times(no, fo)
        if critic:
            b2 = nb2 + mul0(np2, fb2)
            p2 = times(np2, fp2)
            if value_chain:
                b2 += mul0(nq2, fv)
                q2 = mul0(np2, fq2) + mul0(nq2, fo)
        e = zero
        if segmented:
            e = fe
        return (b, times(np_, fp), q, b2, p2, q2, v, o, e)

    @cuda.jit(device=True)
    def apply(m, x, x2, y):
        """The state (X, X2, Y) after a run of map ``m``, given the state entering it."""
        b, p, q, b2, p2, q2, v, o, _ = m
        out = b + mul0(p, x)
        out2 = zero
        out_y = zero
        if value_chain:
            out += mul0(q, y)
            out_y = v + mul0(o, y)
        if critic:
            out2 = b2 + mul0(p2, x2)
            if value_chain:
                out2 += mul0(q2, y)
        return out, out2, out_y

    @cuda.jit(device=True)
    def constant(x, x2, y):
        """The map that sets the state to (x, x2, y) whatever enters: a boundary value."""
        return (x, zero, zero, x2, zero, zero, y, zero, zero)

    @cuda.jit(device=True)
    def put(buffer, base, stride, m):
        """The live slots of m at buffer[base + k * stride]."""
        b, p, q, b2, p2, q2, v, o, e = m
        buffer[base + i_b * stride] = b
        buffer[base + i_p * stride] = p
        if value_chain:
            buffer[base + i_q * stride] = q
            buffer[base + i_v * stride] = v
            buffer[base + i_o * stride] = o
        if critic:
            buffer[base + i_b2 * stride] = b2
            buffer[base + i_p2 * stride] = p2
            if value_chain:
                buffer[base + i_q2 * stride] = q2
        if segmented:
            buffer[base + i_e * stride] = e

    @cuda.jit(device=True)
    def get(buffer, base, stride):
        """The map whose live slots are at buffer[base + k * stride] (the others: the identity's)."""
        b = buffer[base + i_b * stride]
        p = buffer[base + i_p * stride]
        q, b2, p2, q2, v, o, e = zero, zero, one, zero, zero, one, zero
        if value_chain:
            q = buffer[base + i_q * stride]
            v = buffer[base + i_v * stride]
            o = buffer[base + i_o * stride]
        if critic:
            b2 = buffer[base + i_b2 * stride]
            p2 = buffer[base + i_p2 * stride]
            if value_chain:
                q2 = buffer[base + i_q2 * stride]
        if segmented:
            e = buffer[base + i_e * stride]
        return (b, p, q, b2, p2, q2, v, o, e)

    @cuda.jit(device=True)
    def block_scan(shared, m, reverse):
        """Inclusive scan of the threads' maps in recurrence order (from higher ids when ``reverse``); returns
        this thread's composite and the buffer holding every thread's composite (for ``exclusive``)."""
        tid, threads = cuda.threadIdx.x, cuda.blockDim.x
        put(shared, tid, threads, m)
        cuda.syncthreads()
        buf = 0
        step = 1
        while step < threads:
            partner = tid + step if reverse else tid - step
            if 0 <= partner < threads:
                m = compose(m, get(shared, buf * count * threads + partner, threads))
            buf = 1 - buf
            put(shared, buf * count * threads + tid, threads, m)
            cuda.syncthreads()
            step *= 2
        return m, buf

    @cuda.jit(device=True)
    def exclusive(shared, buf, reverse):
        """The composite of the threads before this one in recurrence order (the identity for the first)."""
        tid, threads = cuda.threadIdx.x, cuda.blockDim.x
        partner = tid + 1 if reverse else tid - 1
        if partner < 0 or partner >= threads:
            return identity()
        return get(shared, buf * count * threads + partner, threads)

    @cuda.jit(device=True)
    def write(maps, column, m):
        """The live slots of m into column ``column`` of a (live slots, n) array."""
        b, p, q, b2, p2, q2, v, o, e = m
        maps[i_b, column] = b
        maps[i_p, column] = p
        if value_chain:
            maps[i_q, column] = q
            maps[i_v, column] = v
            maps[i_o, column] = o
        if critic:
            maps[i_b2, column] = b2
            maps[i_p2, column] = p2
            if value_chain:
                maps[i_q2, column] = q2
        if segmented:
            maps[i_e, column] = e

    @cuda.jit(device=True)
    def read(maps, column):
        """The map in column ``column`` of a (live slots, n) array."""
        b = maps[i_b, column]
        p = maps[i_p, column]
        q, b2, p2, q2, v, o, e = zero, zero, one, zero, zero, one, zero
        if value_chain:
            q = maps[i_q, column]
            v = maps[i_v, column]
            o = maps[i_o, column]
        if critic:
            b2 = maps[i_b2, column]
            p2 = maps[i_p2, column]
            if value_chain:
                q2 = maps[i_q2, column]
        if segmented:
            e = maps[i_e, column]
        return (b, p, q, b2, p2, q2, v, o, e)

    @cuda.jit(device=True)
    def write_summary(out, row, segment, m):
        """A piece's summary in ``_pieces.FIELDS`` order: (value, on_value, edge, on_bootstrap, product)."""
        b, p, q, _, _, _, v, o, _ = m
        out[row, segment, 0] = v
        out[row, segment, 1] = o
        out[row, segment, 2] = b
        out[row, segment, 3] = q
        out[row, segment, 4] = p

    return _Algebra(mul0, identity, compose, apply, constant, block_scan, exclusive, write, read,
                    write_summary, count)


class _Algebra(NamedTuple):
    mul0: object
    identity: object
    compose: object
    apply: object
    constant: object
    block_scan: object
    exclusive: object
    write: object
    read: object
    write_summary: object
    count: int


# --- launch 2: the carries between the tiles of a row ------------------------------------------------------------

def carry_kernel(io: str, fields: Fields, *, reverse: bool, complete: bool) -> KernelSpec:
    """Launch 2: one block per row turns its tiles' maps into the map entering every tile.

    Thread k composes a run of consecutive tiles serially, the block scans the
    runs' maps, and every thread walks its run again from the map entering it,
    writing each tile's entering map (the identity for the row's first tile in
    recurrence order). With ``complete`` (piece summaries) a tile's open
    segment (``open_segment[tile]`` >= 0: a segment that starts in the tile and
    ends beyond it) has its partial summary, written by launch 1, composed with
    the map entering the tile.
    """
    a = algebra(io, fields)
    identity, compose, block_scan, exclusive, read, write, write_summary = (
        a.identity, a.compose, a.block_scan, a.exclusive, a.read, a.write, a.write_summary)
    c = constants(io)
    zero, one, dtype = c.zero, c.one, c.dtype
    compute = compute_dtype(io)
    size_shared = 2 * a.count * CARRY_THREADS

    def carry(maps, geometry, entering, open_segment, summary):
        rows, tiles_per_row = geometry[0], geometry[2]
        row = tile_id()
        if row >= rows:
            return
        tid, threads = cuda.threadIdx.x, cuda.blockDim.x
        first = row * tiles_per_row
        span = (tiles_per_row + threads - 1) // threads
        lo = min(tid * span, tiles_per_row)
        size = min(span, tiles_per_row - lo)
        m = identity()
        for i in range(size):
            k = lo + size - 1 - i if reverse else lo + i
            m = compose(read(maps, first + k), m)
        shared = cuda.shared.array(size_shared, dtype)
        m, buf = block_scan(shared, m, reverse)
        m = exclusive(shared, buf, reverse)
        for i in range(size):
            k = lo + size - 1 - i if reverse else lo + i
            write(entering, first + k, m)
            if complete:
                segment = open_segment[first + k]
                if segment >= 0:
                    partial = (summary[row, segment, 2], summary[row, segment, 4], summary[row, segment, 3],
                               zero, one, zero, summary[row, segment, 0], summary[row, segment, 1], zero)
                    write_summary(summary, row, segment, compose(partial, m))
            m = compose(read(maps, first + k), m)

    maps = array(compute, 2, "C")
    signature = types.void(maps, types.UniTuple(types.int64, 6), maps,
                           optional(complete, array("int64", 1, "C")), optional(complete, array(compute, 3, "C")))
    name = "carry[" + ",".join((*fields.live(), "reverse" if reverse else "forward",
                                *(["summaries"] if complete else []))) + "]"
    return KernelSpec(name, carry, signature)
