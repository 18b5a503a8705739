r"""The Triton kernels of ``gae()``: one program per row (or per packed sequence, or per chunk of a long row).

Imported only by ``gae_xp.backends.triton`` once the arrays are known to be
torch tensors it serves (it imports triton). Every program walks its steps
``[lo, hi)`` block by block from the last, keeps the carried state in
registers, and scans each block with ``tl.associative_scan`` on the affine
state of a step, the pair (coefficient ``c_t``, delta ``d_t``)::

    Vnext_t = next_values[t] | V at the next real step of the sequence | bootstrap (after its last step)
    d_t     = r_t + (0 if terminated_t else gamma_t Vnext_t) - V_t        (0 at a masked step)
    c_t     = 0 if terminated_t or truncated_t else gamma_t lam_t          (1 at a masked step)
    A_t     = d_t + (0 if c_t == 0 else c_t A_{t+1})

Nothing behind a cut (NaN and inf included) reaches the steps before it:
``_triton_parts.solve_block`` scans each block plainly and again exactly
(a zero coefficient chosen away with ``tl.where``, never a product with 0)
where the plain scan met a NaN or an inf. A sequence's end is a cut: its
last step reads the bootstrap value for V_{t+1}, and the advantage entering
it is the incoming ``carry`` (0 without one). With ``critic_lam`` a second
chain runs from the same deltas with ``gamma_t critic_lam_t``. A mask without
``next_values`` needs "V at the next real step", a chain whose carry crosses
the blocks as the advantage's does: in a block of real steps only it is the
next step's value (and the carry after the block's last step); a block with
masked steps scans the index of the next real step from the right (a
minimum) and reads its value there.

``RARE_PATHS`` False compiles the kernel without what only such blocks run
(the exact second scan, a holed block's value chain), and without what
only a chunk's last blocks run in ``SUMMARY`` (the scan of how much of "V
after the chunk" reaches them, ``_reach``): only the instruction counts do
that (``tools.cost_model``, ``tests/triton_ptx.py``), to count the path of
every other block of finite numbers and real steps. ``RARE_PATHS`` ``HOLED``
counts the path of a block of finite numbers with masked steps instead (a
random mask holes every block: the value chain's scan, without the test
that chooses it).

Few long rows: the row is cut into chunks of whole blocks, and two launches
solve it. ``SUMMARY`` writes each chunk's map (``MAP`` fields: its local
advantage at its first step with nothing entering and the product of its
coefficients, per chain; with the value chain also how much of "V after the
chunk" reaches that advantage, and the chunk's first real value: only the
blocks walked before the chunk's last real step is found scan for it);
``FINAL``
composes the maps of the chunks to its right (scans of at most
``MAX_CHUNKS`` entries) into the state entering its last step and walks its
chunk again, writing the outputs. The inputs are read twice and the outputs
written once: 1.5x the bytes of one pass. Rows of packed sequences are not
cut (a program per sequence).

Short rows may share a program (``ROWS`` > 1, ``tuned(tile=...)``): a block
of ``BLOCK`` lanes holds ``ROWS`` rows of at most ``BLOCK // ROWS`` steps
each, one after another, scanned as one; a row's last step is the constant
map of what enters it (its carry, or 0), a cut that no row's state crosses,
and the value chain scans each step's place in that order with the row's end
as its bound. One pass over whole rows: no packed sequences, no chunks.

Layout: every array is addressed as ``base + outer * s_outer + inner * s_inner
+ t * s_t`` (the batch axes folded into at most two, see
``gae_xp.backends._triton_launch``), so strided and broadcast views are read in
place; the outputs are C-contiguous (row ``outer * inner_count + inner``). ``TWO_AXES``
says whether they fold into two (else ``outer`` is 0, and the row needs no division).
Float16 and bfloat16 are read as they are and computed in float32; float64
in float64. The lengths, strides, counts and the number of blocks are run-time
values, never specialised on (``do_not_specialize``). ``ALIGN`` (1, or the
elements in 16 bytes of the floats) says that every row of every per-step
array starts at a multiple of that many elements (and T is one), so that the
compiler issues 16-byte loads and stores: the one property of a layout a
kernel is compiled for.

``STAGES`` pipelines the walk over the blocks (``tl.range(..., num_stages=STAGES)``):
the loads of the next ``STAGES - 1`` blocks are issued (``cp.async`` into
shared memory) while this block is solved, so that a program walking many
blocks (long rows, chunks) waits on memory once, not once per block; 1: not
pipelined (by default every launch but chunks of several blocks,
``_triton_launch._config``). Without it Triton pipelines no load of this loop:
none feeds a ``tl.dot``.
"""

from __future__ import annotations

import triton
import triton.language as tl

from ._triton_parts import at as _at
from ._triton_parts import compose as _compose
from ._triton_parts import lane as _lane
from ._triton_parts import solve_block as _solve_block

#: The fields of a chunk's map (``maps[row, chunk]``): local advantage at its first step with nothing entering,
#: product of its coefficients, the same two of the critic's chain, how much of the value after the chunk reaches
#: its first step's advantage (and the critic's), whether it holds a real step, V at its first real step.
MAP = tl.constexpr(8)
#: Launch modes (``MODE``): the whole of each program's steps in one launch, or a chunk's map, or its final pass.
WHOLE, SUMMARY, FINAL = 0, 1, 2
#: ``RARE_PATHS`` of the instruction counts of a block of finite numbers with masked steps (True: every path; False:
#: a block of finite numbers and real steps).
HOLED = tl.constexpr(2)
#: How a coefficient arrives (``GAMMA``, ``LAM``, ``CRITIC``): absent, one float, one value per row, one per step.
ABSENT, NUMBER, PER_ROW, PER_STEP = 0, 1, 2, 3

_RUNTIME = ["length", "rows", "inner_count", "parts", "chunk", "n_chunks",
            *(f"{name}_{axis}" for name in ("r", "v", "nv", "te", "tr", "m", "g", "l", "cl", "b", "c")
              for axis in ("o", "i", "t"))]


@triton.jit
def _entering_chain(map_row, chain, later, values_after, lanes, VALUE_CHAIN: tl.constexpr):
    """The advantage of chain ``chain`` (0: the actor's, 1: the critic's) entering a chunk from the right: the maps
    of the chunks after it (``later``), each its local value (plus, with the value chain, what "V after the chunk"
    adds to it) and its product of coefficients, composed."""
    local = tl.load(map_row + 2 * chain, mask=later, other=0.0)
    if VALUE_CHAIN:
        reaching = tl.load(map_row + 4 + chain, mask=later, other=0.0)
        local += tl.where(reaching == 0, 0.0, reaching * values_after)
    coefficients = tl.load(map_row + 2 * chain + 1, mask=later, other=1.0)
    _, composed = tl.associative_scan((coefficients, local), 0, _compose, reverse=True)
    return _lane(composed, lanes, 0)


@triton.jit
def _first_real(far_real, far_value, near_real, near_value):
    """The value at the first real step of two neighbouring runs (``far`` later in time), and whether there is one."""
    return far_real | near_real, tl.where(near_real != 0, near_value, far_value)


@triton.jit
def _offset(outer, inner, outer_stride, inner_stride, TWO_AXES: tl.constexpr):
    """Where a row starts in an array: ``outer * outer_stride + inner * inner_stride`` (``inner`` alone on one axis:
    an ``outer`` of 0 would fold the sum away, and with it the alignment hint set on it)."""
    if TWO_AXES:
        offset = outer * outer_stride + inner * inner_stride
    else:
        offset = inner * inner_stride
    return offset


@triton.jit
def _values_after(values, base, steps, stride, within, fill, CONTIGUOUS: tl.constexpr, DTYPE: tl.constexpr):
    """V at ``steps + 1`` where ``within``, else ``fill``: the load's fill value where the values are of the compute
    dtype (16-bit values would round it to theirs: a select then)."""
    exact: tl.constexpr = values.dtype.element_ty == DTYPE
    pointer = _at(values, base, steps, stride, CONTIGUOUS, 1)
    if exact:
        out = tl.load(pointer, mask=within, other=fill).to(DTYPE)
    else:
        out = tl.where(within, tl.load(pointer, mask=within, other=0.0).to(DTYPE), fill)
    return out


@triton.jit
def _nearer(far, near):
    return tl.minimum(far, near)


@triton.jit
def _value_chain(values, mask, v_base, m_base, v_t, m_t, steps, shift, start, inside, hi, real, v, next_value,
                 CONTIGUOUS: tl.constexpr, DTYPE: tl.constexpr, TILED: tl.constexpr):
    """V at the next real step of the sequence for each step of a block with masked steps: the place of the next
    real step in the block's order of steps (``steps + shift``: a tile of rows puts its rows one after another), a
    minimum scanned from the right, each row's end its bound; its value read there, else ``next_value`` (the
    chain after the block); (it, whether a real step follows inside the block, the chain entering the block
    before: V at the first real step from its first; a tile of rows, one block, keeps ``next_value``)."""
    ahead = inside & (steps + 1 < hi)
    real_ahead = tl.load(_at(mask, m_base, steps, m_t, CONTIGUOUS, 1), mask=ahead, other=0) != 0
    end = hi + shift
    nearest = tl.associative_scan(tl.where(real_ahead, steps + shift + 1, end), 0, _nearer, reverse=True)
    found = nearest < end
    v_next = tl.load(_at(values, v_base, nearest - shift, v_t, CONTIGUOUS), mask=found, other=0.0).to(DTYPE)
    v_next = tl.where(found, v_next, next_value)
    if not TILED:
        next_value = _lane(tl.where(real, v, v_next), steps, start).to(DTYPE)
    return v_next, found.to(tl.int32), next_value


@triton.jit
def _reach(coefficient, reached, products, block_product, reach, steps, start, unknown_before,
           RARE_PATHS: tl.constexpr, DTYPE: tl.constexpr):
    """How much of "V after the chunk" reaches the first step of this block (the chunks' first pass, with the value
    chain): ``reached`` (gamma at the real steps that see it) scanned with the block's coefficients, plus what
    reached the block after this one (``reach``) times the block's product. Only blocks walked while no real step
    after them in the chunk is known (``unknown_before``: the chunk's last blocks, up to its last real step) have
    such steps; the others pass ``reach`` on through their product, with no scan (``RARE_PATHS`` False: the
    instruction counts take that path, the one of every other block)."""
    if RARE_PATHS and unknown_before:
        _, reach_local = tl.associative_scan((coefficient, reached), 0, _compose, reverse=True)
        out = _lane(reach_local + tl.where(products == 0, 0.0, products * reach), steps, start).to(DTYPE)
    else:
        out = tl.where(block_product == 0, 0.0, block_product * reach)
    return out


@triton.jit
def _coefficient(pointer, base, steps, stride, inside, value, KIND: tl.constexpr, DTYPE: tl.constexpr,
                 CONTIGUOUS: tl.constexpr, TILED: tl.constexpr):
    """A coefficient at ``steps``: a number, one value per row (a lane's own row's in a tile of rows), or one per
    step."""
    if KIND == 1:
        return value
    elif KIND == 2 and TILED:
        return tl.load(pointer + base, mask=inside, other=0.0).to(DTYPE)
    elif KIND == 2:
        return tl.load(pointer + base).to(DTYPE)
    else:
        return tl.load(_at(pointer, base, steps, stride, CONTIGUOUS), mask=inside, other=0.0).to(DTYPE)


@triton.jit(do_not_specialize=_RUNTIME)
def gae_kernel(
    rewards, values, next_values, terminated, truncated, mask, gamma, lam, critic_lam, bootstrap, carry,
    offsets, advantages, returns, maps,
    length, rows, inner_count, parts, chunk, n_chunks,
    r_o, r_i, r_t, v_o, v_i, v_t, nv_o, nv_i, nv_t, te_o, te_i, te_t, tr_o, tr_i, tr_t, m_o, m_i, m_t,
    g_o, g_i, g_t, l_o, l_i, l_t, cl_o, cl_i, cl_t, b_o, b_i, b_t, c_o, c_i, c_t,
    gamma_value: tl.float64, lam_value: tl.float64, critic_value: tl.float64,
    HAS_NEXT: tl.constexpr, HAS_TERMINATED: tl.constexpr, HAS_TRUNCATED: tl.constexpr, HAS_MASK: tl.constexpr,
    GAMMA: tl.constexpr, LAM: tl.constexpr, CRITIC: tl.constexpr, HAS_CARRY: tl.constexpr,
    HAS_OFFSETS: tl.constexpr, FILL: tl.constexpr, MODE: tl.constexpr, CONTIGUOUS: tl.constexpr,
    DTYPE: tl.constexpr, BLOCK: tl.constexpr, CHUNKS: tl.constexpr, ALIGN: tl.constexpr, TWO_AXES: tl.constexpr,
    RARE_PATHS: tl.constexpr, STAGES: tl.constexpr, ROWS: tl.constexpr,
):
    """Program ``row * parts + part``: part is the packed sequence (``HAS_OFFSETS``) or the chunk of the row; with
    ``ROWS`` > 1, program ``tile``: rows ``tile * ROWS`` to ``tile * ROWS + ROWS - 1`` of ``rows``, each of at most
    ``BLOCK // ROWS`` steps (``MODE`` 0, no offsets)."""
    tl.static_assert(ROWS == 1 or (MODE == 0 and not HAS_OFFSETS), "a tile of rows is one pass over whole rows")
    VALUE_CHAIN: tl.constexpr = HAS_MASK and not HAS_NEXT
    TILED: tl.constexpr = ROWS > 1
    SPAN: tl.constexpr = BLOCK // ROWS  # a tile's lanes of one row
    EXACT: tl.constexpr = RARE_PATHS == 1  # HOLED counts a block of finite numbers: no exact scan, no reach
    # one axis: rows x parts may pass the 65,535 of a second one. The row's index is 64-bit (it multiplies
    # strides); the steps inside it are of the type of its length (32-bit below 2**31: the masks are 32-bit
    # compares then)
    program = tl.program_id(0)
    positions = tl.arange(0, BLOCK)
    if HAS_OFFSETS or MODE != 0:
        part = program % parts
        row32 = program // parts
    elif TILED:  # a tile of rows: each lane's row (a shift: SPAN is a power of two)
        part = program * 0
        row32 = program * ROWS + positions // SPAN
    else:  # a program a row: no division (one costs some 40 instructions, a tenth of a 128-step row's)
        part = program * 0
        row32 = program
    live = row32 < rows  # the last tile's lanes past the last row read and write nothing
    if TWO_AXES:  # the batch axes fold into two: (outer, inner)
        outer32 = row32 // inner_count
        inner = (row32 - outer32 * inner_count).to(tl.int64)
        outer = outer32.to(tl.int64)
    else:
        inner = row32.to(tl.int64)
        outer = inner  # not read (``_offset``)
    row = row32.to(tl.int64)
    out_base = tl.multiple_of(row * length, ALIGN)
    if HAS_OFFSETS:
        lo = tl.load(offsets + part).to(length.dtype)
        hi = tl.load(offsets + part + 1).to(length.dtype)
        ends = hi  # the sequence ends at hi
        boundary = part.to(tl.int64)  # it multiplies the bootstrap's (and the carry's) stride
    else:
        # chunks are whole blocks (or the whole row, part 0): with aligned rows, both bounds are aligned too
        lo = tl.multiple_of(part * chunk, ALIGN)
        hi = tl.multiple_of(tl.minimum(lo, length - chunk) + chunk, ALIGN)  # min(lo + chunk, length), no overflow
        ends = tl.where(hi == length, hi, -1)  # only the row's last chunk holds its end
        boundary = part * 0
    if TILED:
        bootstrap_value = tl.load(bootstrap + _offset(outer, inner, b_o, b_i, TWO_AXES), mask=live,
                                  other=0.0).to(DTYPE)
    else:
        bootstrap_value = tl.load(bootstrap + _offset(outer, inner, b_o, b_i, TWO_AXES) + boundary * b_t).to(DTYPE)
    if HAS_CARRY and TILED:
        entering = tl.load(carry + _offset(outer, inner, c_o, c_i, TWO_AXES), mask=live, other=0.0).to(DTYPE)
    elif HAS_CARRY:
        entering = tl.load(carry + _offset(outer, inner, c_o, c_i, TWO_AXES) + boundary * c_t).to(DTYPE)
    else:
        entering = tl.zeros((), DTYPE)
    gamma_scalar = (tl.zeros((), DTYPE) + gamma_value).to(DTYPE)
    lam_scalar = (tl.zeros((), DTYPE) + lam_value).to(DTYPE)
    critic_scalar = (tl.zeros((), DTYPE) + critic_value).to(DTYPE)
    r_base = tl.multiple_of(_offset(outer, inner, r_o, r_i, TWO_AXES), ALIGN)
    v_base = tl.multiple_of(_offset(outer, inner, v_o, v_i, TWO_AXES), ALIGN)
    nv_base = tl.multiple_of(_offset(outer, inner, nv_o, nv_i, TWO_AXES), ALIGN)
    te_base = tl.multiple_of(_offset(outer, inner, te_o, te_i, TWO_AXES), ALIGN)
    tr_base = tl.multiple_of(_offset(outer, inner, tr_o, tr_i, TWO_AXES), ALIGN)
    m_base = tl.multiple_of(_offset(outer, inner, m_o, m_i, TWO_AXES), ALIGN)
    g_base = _offset(outer, inner, g_o, g_i, TWO_AXES)
    if GAMMA == 3:
        g_base = tl.multiple_of(g_base, ALIGN)
    l_base = _offset(outer, inner, l_o, l_i, TWO_AXES)
    if LAM == 3:
        l_base = tl.multiple_of(l_base, ALIGN)
    cl_base = _offset(outer, inner, cl_o, cl_i, TWO_AXES)
    if CRITIC == 3:
        cl_base = tl.multiple_of(cl_base, ALIGN)

    # The state entering the first block walked: the advantage (and the critic's) after it, and the value chain.
    following = tl.zeros((), DTYPE)
    critic_following = tl.zeros((), DTYPE)
    product = tl.full((), 1.0, DTYPE)
    critic_product = tl.full((), 1.0, DTYPE)
    next_value = bootstrap_value
    # SUMMARY with the value chain: V after a chunk that does not hold the row's end is not known yet; the
    # chunk's map then takes it as a third input (reach: how much of it reaches the chunk's first step)
    known = tl.where(ends >= 0, 1, 0)
    reach = tl.zeros((), DTYPE)
    critic_reach = tl.zeros((), DTYPE)
    if MODE == 1:
        next_value = tl.where(known != 0, bootstrap_value, 0.0)
    if MODE == 2:  # FINAL: the state entering this chunk is the composition of the chunks to its right
        lanes = tl.arange(0, CHUNKS)
        later = (lanes > part) & (lanes < n_chunks)
        map_row = maps + row * n_chunks * MAP + lanes * MAP
        if VALUE_CHAIN:  # V at the first real step after each chunk (the bootstrap value after the row's last)
            beyond = lanes + 1 < n_chunks
            real_after = tl.load(map_row + MAP + 6, mask=beyond, other=0.0) != 0
            value_after = tl.load(map_row + MAP + 7, mask=beyond, other=0.0)
            found_after, first_after = tl.associative_scan((real_after.to(tl.int32), value_after), 0, _first_real,
                                                           reverse=True)
            values_after = tl.where(found_after != 0, first_after, bootstrap_value)
            next_value = _lane(values_after, lanes, part).to(DTYPE)
        else:
            values_after = bootstrap_value  # not read without the value chain (_entering_chain)
        following = _entering_chain(map_row, 0, later, values_after, lanes, VALUE_CHAIN).to(DTYPE)
        if CRITIC != 0:
            critic_following = _entering_chain(map_row, 1, later, values_after, lanes, VALUE_CHAIN).to(DTYPE)
        else:
            critic_following = following

    # The sequence's end is a cut: what enters its last step is the incoming advantage (0 without one; a critic_lam
    # never has one), and the map of the chunk holding it passes nothing from beyond (its product is 0). In a tile
    # of rows each row's last step takes it instead (below)
    if HAS_CARRY and not TILED:
        following = tl.where(ends >= 0, entering, following)
    stop = tl.where(ends >= 0, ends, length)  # V_{t+1} is read below this step; the bootstrap value from it
    last_block = (hi - 1) // BLOCK
    blocks = tl.where(hi > lo, last_block - lo // BLOCK + 1, 0)
    if MODE == 1:  # SUMMARY: the first chunk's map is never used
        blocks = tl.where(part == 0, 0, blocks)
    if TILED:  # each lane's step in its row, and how far the tile's order of steps puts it past that step
        in_row = positions % SPAN
        shift = positions - in_row
    else:
        in_row = positions
        shift = 0
    for i in tl.range(0, blocks, num_stages=STAGES):
        start = (last_block - i) * BLOCK
        steps = tl.multiple_of(start, BLOCK) + in_row
        inside = (steps >= lo) & (steps < hi)
        if TILED:
            inside = inside & live
        r = tl.load(_at(rewards, r_base, steps, r_t, CONTIGUOUS), mask=inside, other=0.0).to(DTYPE)
        v = tl.load(_at(values, v_base, steps, v_t, CONTIGUOUS), mask=inside, other=0.0).to(DTYPE)
        g = _coefficient(gamma, g_base, steps, g_t, inside, gamma_scalar, GAMMA, DTYPE, CONTIGUOUS, TILED)
        lam_t = _coefficient(lam, l_base, steps, l_t, inside, lam_scalar, LAM, DTYPE, CONTIGUOUS, TILED)
        if HAS_MASK:
            real = tl.load(_at(mask, m_base, steps, m_t, CONTIGUOUS), mask=inside, other=0) != 0
        if HAS_NEXT:
            v_next = tl.load(_at(next_values, nv_base, steps, nv_t, CONTIGUOUS), mask=inside, other=0.0).to(DTYPE)
        elif VALUE_CHAIN:  # V at the next real step of the sequence
            # a block whose steps are all real (a trailing padding's are, but for one block) needs no scan: V_{t+1}
            # is the next step's value, and after the block's last step the chain's; the chain entering the block
            # before is V at its first step (every block walked holds a step of the program's, chunks being whole
            # blocks: without chunks, the first step's value is read only for blocks before it, which none is)
            if RARE_PATHS == HOLED:  # the instruction counts: the path of a block with masked steps
                holes = 1
            elif RARE_PATHS:
                holes = tl.sum(tl.where(inside & (real == 0), 1, 0), axis=0)
            else:  # the instruction counts: the path of a block without masked steps
                holes = 0
            if holes == 0:
                within = inside & (positions < BLOCK - 1) & (steps + 1 < hi)
                v_next = _values_after(values, v_base, steps, v_t, within, next_value, CONTIGUOUS, DTYPE)
                if not TILED:  # a tile of rows walks one block
                    next_value = tl.load(values + v_base + start.to(tl.int64) * v_t).to(DTYPE)
                found = within.to(tl.int32)
                seen = tl.full((), 1, tl.int32)
            else:
                v_next, found, next_value = _value_chain(values, mask, v_base, m_base, v_t, m_t, steps, shift, start,
                                                         inside, hi, real, v, next_value, CONTIGUOUS, DTYPE, TILED)
                if MODE == 1:
                    seen = tl.where(tl.sum(tl.where(real & inside, 1, 0), axis=0) != 0, 1, 0)
            if MODE == 1:  # the real steps whose Vnext is the value after the chunk, not known yet
                unknown = (found == 0) & (known == 0) & real & inside
                unknown_before = known == 0
                known = tl.where(seen != 0, 1, known)
        else:  # V_{t+1}, or the bootstrap value after the sequence's last step
            v_next = _values_after(values, v_base, steps, v_t, inside & (steps + 1 < stop), bootstrap_value,
                                   CONTIGUOUS, DTYPE)
        if HAS_TERMINATED:
            ended = tl.load(_at(terminated, te_base, steps, te_t, CONTIGUOUS), mask=inside, other=0) != 0
            delta = r + tl.where(ended, 0.0, g * v_next) - v
            cut = ended
            if MODE == 1 and VALUE_CHAIN:
                unknown = unknown & (ended == 0)
        else:
            delta = r + g * v_next - v
            cut = steps < 0
        if HAS_TRUNCATED:
            cut = cut | (tl.load(_at(truncated, tr_base, steps, tr_t, CONTIGUOUS), mask=inside, other=0) != 0)
        coefficient = tl.where(cut, 0.0, g * lam_t)
        if HAS_MASK:
            delta = tl.where(real, delta, 0.0)
            coefficient = tl.where(real, coefficient, 1.0)
        # lanes outside the program's steps are the identity map
        delta = tl.where(inside, delta, 0.0)
        coefficient = tl.where(inside, coefficient, 1.0)
        actor_delta = delta
        if TILED:  # a row's last step is the constant map of what enters it (its carry, or 0): no row reaches another
            last = steps == hi - 1
            if HAS_CARRY:
                actor_delta = tl.where(last & (coefficient != 0), delta + coefficient * entering, delta)
            coefficient = tl.where(last, 0.0, coefficient)
        advantage, products, following = _solve_block(coefficient, actor_delta, following, steps, start, True, EXACT)
        following = following.to(DTYPE)
        if MODE == 1:
            block_product = _lane(products, steps, start).to(DTYPE)
        if MODE == 1 and VALUE_CHAIN:  # d(delta_t)/d(V after the chunk) = gamma_t at those steps, 0 elsewhere
            reached = tl.where(unknown, g, 0.0)
            reach = _reach(coefficient, reached, products, block_product, reach, steps, start, unknown_before,
                           EXACT, DTYPE)
        if CRITIC != 0:
            critic_lam_t = _coefficient(critic_lam, cl_base, steps, cl_t, inside, critic_scalar, CRITIC, DTYPE,
                                        CONTIGUOUS, TILED)
            critic_coefficient = tl.where(cut, 0.0, g * critic_lam_t)
            if HAS_MASK:
                critic_coefficient = tl.where(real, critic_coefficient, 1.0)
            critic_coefficient = tl.where(inside, critic_coefficient, 1.0)
            if TILED:
                critic_coefficient = tl.where(last, 0.0, critic_coefficient)
            critic, critic_products, critic_following = _solve_block(critic_coefficient, delta, critic_following,
                                                                     steps, start, True, EXACT)
            critic_following = critic_following.to(DTYPE)
            if MODE == 1:
                critic_block_product = _lane(critic_products, steps, start).to(DTYPE)
            if MODE == 1 and VALUE_CHAIN:
                critic_reach = _reach(critic_coefficient, reached, critic_products, critic_block_product, critic_reach,
                                      steps, start, unknown_before, EXACT, DTYPE)
        else:
            critic = advantage
        if MODE == 1:
            product = product * block_product
            if CRITIC != 0:
                critic_product = critic_product * critic_block_product
        else:
            returned = critic + v
            if HAS_MASK:
                if not FILL:
                    advantage = tl.where(real, advantage, 0.0)
                    returned = tl.where(real, returned, 0.0)
            out = advantages.dtype.element_ty
            tl.store(advantages + out_base + steps, advantage.to(out), mask=inside)
            tl.store(returns + out_base + steps, returned.to(out), mask=inside)
    if MODE == 1:
        product = tl.where(ends >= 0, 0.0, product)
        critic_product = tl.where(ends >= 0, 0.0, critic_product)
        map_base = maps + (row * n_chunks + part) * MAP
        tl.store(map_base, following)
        tl.store(map_base + 1, product)
        tl.store(map_base + 2, critic_following)
        tl.store(map_base + 3, critic_product)
        tl.store(map_base + 4, reach)
        tl.store(map_base + 5, critic_reach)
        tl.store(map_base + 6, known.to(DTYPE))
        tl.store(map_base + 7, next_value)
