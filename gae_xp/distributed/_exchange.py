"""What crosses between ranks, and how every rank learns at once that a peer failed or disagrees.

A call makes **one** collective: an all-gather of the same number of float64
numbers from every rank (the group's *capacity*), a header and a payload::

    header   HEADER: the exchange's protocol, an ok/error status, the
             Context's digest (layout and offsets), the world size, the
             inputs' dtype, batch shape and shard length, the payload's size
    payload  the call's summaries (float64, however the inputs are typed),
             or, after an error, the error's message as bytes

Every rank reads every header (one small device-to-host read) before it
uses a summary: a peer's error is raised here on every rank, with the
peer's message, and ranks that disagree (batch shape, dtype, Context,
critic_lam on some ranks only) raise a ValueError naming what differs,
instead of the crash or the wrong numbers that gathering arrays of
different sizes gives. A rank whose own argument check failed still takes
part in the collective, so nobody waits for it until the group's timeout.

The capacity is agreed without a collective of its own: it starts at
``INITIAL_CAPACITY`` on every rank and changes only after an exchange, from
the headers every rank has read, so it stays the same everywhere. It covers
the largest payload of the group's last ``REMEMBERED`` exchanges with an
eighth to spare (rounded up to 64 numbers), so repeated calls of one size
send what they need and one large call does not inflate the small ones for
long. A payload that does not fit is sent by a second all-gather of its
exact size (the headers have shown that every rank sends the same size),
after which the capacity covers it: later calls of that size take one
collective.
"""

from __future__ import annotations

import collections
import weakref
import zlib
from typing import Any

import numpy as np

#: the public names (gae_xp.distributed re-exports them)
__all__ = ["all_gather_flat"]

#: The header's fields, in order.
HEADER = ("protocol", "status", "context", "world", "dtype", "batch_ndim", "rows", "batch_digest", "dim0", "dim1",
          "dim2", "dim3", "length", "pieces", "fields", "size")
PROTOCOL = 1
#: Statuses: the exception class a peer raised is raised again on every rank.
OK, VALUE_ERROR, TYPE_ERROR, OTHER_ERROR = 0, 1, 2, 3
_ERRORS = {VALUE_ERROR: ValueError, TYPE_ERROR: TypeError, OTHER_ERROR: RuntimeError}
#: Numbers per rank in a group's first exchange (512 bytes): 48 numbers of payload (9 rows of 5 numbers), or an
#: error message of 288 bytes (6 to a number).
INITIAL_CAPACITY = 64
#: Bytes of an error message per float64 number (an integer below 2^48 is exact).
_MESSAGE_BYTES = 6
#: How many of a group's last exchanges the capacity covers.
REMEMBERED = 8
#: The dtypes a header names (others are sent by their name's digest).
DTYPES = ("float16", "bfloat16", "float32", "float64")

_RECENT: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # process group -> its last payloads' sizes


def dtype_code(dtype) -> int:
    name = str(dtype).rsplit(".", 1)[-1]
    return DTYPES.index(name) + 1 if name in DTYPES else 100 + zlib.crc32(name.encode()) % 2**20


def digest(*parts) -> int:
    """A 32-bit digest of the parts' text or bytes (exact in float64)."""
    crc = 0
    for part in parts:
        crc = zlib.crc32(part if isinstance(part, bytes) else repr(part).encode(), crc)
    return crc


def header(*, status=OK, context=0, world=0, dtype=None, batch_shape=(), length=-1, pieces=0, fields=0,
           size=0) -> np.ndarray:
    """The header as float64 numbers (``HEADER``); ``length`` -1 means "any shard length"."""
    batch_shape = tuple(int(n) for n in batch_shape)
    dims = [*batch_shape[:4], *([-1] * (4 - len(batch_shape[:4])))]
    values = {"protocol": PROTOCOL, "status": status, "context": context, "world": world,
              "dtype": 0 if dtype is None else dtype_code(dtype), "batch_ndim": len(batch_shape),
              "rows": int(np.prod(batch_shape, dtype=np.int64)), "batch_digest": digest(batch_shape),
              "dim0": dims[0], "dim1": dims[1], "dim2": dims[2], "dim3": dims[3], "length": length,
              "pieces": pieces, "fields": fields, "size": size}
    return np.array([values[name] for name in HEADER], dtype=np.float64)


def error_status(error: BaseException) -> int:
    if isinstance(error, ValueError):
        return VALUE_ERROR
    if isinstance(error, TypeError):
        return TYPE_ERROR
    return OTHER_ERROR


def encode_message(error: BaseException, room: int) -> np.ndarray:
    """The error's class and message as bytes, 6 to a float64 number, in at most ``room`` numbers."""
    text = f"{type(error).__name__}: {error}".encode("utf-8", "replace")[:room * _MESSAGE_BYTES]
    text += b"\0" * (-len(text) % _MESSAGE_BYTES)
    groups = np.frombuffer(text, dtype=np.uint8).reshape(-1, _MESSAGE_BYTES).astype(np.int64)
    return (groups << (8 * np.arange(_MESSAGE_BYTES))).sum(axis=1).astype(np.float64)


def decode_message(numbers: np.ndarray) -> str:
    groups = numbers.astype(np.int64)[:, None] >> (8 * np.arange(_MESSAGE_BYTES))
    return bytes((groups & 0xFF).astype(np.uint8).ravel().tolist()).rstrip(b"\0").decode("utf-8", "replace")


# --- reading the headers -------------------------------------------------------------------------------------------


def check_headers(headers: np.ndarray, rank: int, messages: np.ndarray | None = None, *, names=HEADER,
                  operation: str = "gae_xp.distributed.gae") -> None:
    """Raise on every rank what the headers (W, len(names)) show: a peer's error (with its message from
    ``messages``, the gathered payloads), else the first field the ranks disagree on."""
    field = {name: headers[:, i] for i, name in enumerate(names)}
    world = headers.shape[0]
    failed = np.flatnonzero(field["status"] != OK).tolist()
    if failed:
        first = failed[0]
        what = ""
        if messages is not None:
            what = ": " + decode_message(messages[first, :int(field["size"][first])])
        others = f" ({len(failed)} ranks failed: {failed})" if len(failed) > 1 else ""
        raise _ERRORS.get(int(field["status"][first]), RuntimeError)(
            f"{operation}: rank {first} of {world} failed before the exchange{others}, so every rank stops{what}")
    _agree(field, "protocol", "gae_xp's exchange protocol (ranks run different gae_xp versions)")
    _agree(field, "world", "world size of the group")
    if "context" in field:
        _agree(field, "context", "Context (its layout and cu_seqlens): build it from the same arguments on every "
                                 "rank")
    _agree(field, "dtype", "dtype of the inputs", describe=lambda k: _dtype_name(int(field["dtype"][k])))
    if "batch_digest" in field:
        _agree(field, ("batch_ndim", "rows", "batch_digest"), "batch shape (the inputs' shape without time)",
               describe=lambda k: _batch_shape(field, k))
        _agree(field, "length", "shard length (this layout gives every rank the same number of steps)")
        _agree(field, "fields", "summary's width (critic_lam given on some ranks only)")
        _agree(field, ("pieces", "size"), "number of pieces per row")


def _agree(field, names, what, describe=None):
    names = (names,) if isinstance(names, str) else names
    keys = [tuple(float(field[name][k]) for name in names) for k in range(field[names[0]].shape[0])]
    if len(set(keys)) == 1:
        return
    groups: dict = {}
    for k, key in enumerate(keys):
        groups.setdefault(key, []).append(k)
    describe = describe or (lambda k: f"{int(field[names[0]][k])}")
    parts = [f"{describe(ranks[0])} on rank{'s' if len(ranks) > 1 else ''} {_ranks(ranks)}"
             for ranks in groups.values()]
    raise ValueError(f"gae_xp.distributed: the ranks disagree on the {what}: {'; '.join(parts)}")


def _ranks(ranks) -> str:
    return ", ".join(map(str, ranks[:8])) + (f" and {len(ranks) - 8} more" if len(ranks) > 8 else "")


def _dtype_name(code: int) -> str:
    return DTYPES[code - 1] if 1 <= code <= len(DTYPES) else f"another dtype (#{code})"


def _batch_shape(field, k) -> str:
    ndim = int(field["batch_ndim"][k])
    if ndim <= 4:
        return str(tuple(int(field[f"dim{i}"][k]) for i in range(ndim)))
    return f"({ndim} axes, {int(field['rows'][k])} rows)"


# --- torch.distributed -----------------------------------------------------------------------------------------------


class TorchExchange:
    """The collectives of one ``torch.distributed`` group; ``rank`` and ``world`` are Python ints."""

    traced = False

    def __init__(self, group=None):
        import torch.distributed as dist

        self.group = group
        self.world, self.rank = dist.get_world_size(group), dist.get_rank(group)
        self._key = group if group is not None else dist.group.WORLD
        backend = str(dist.get_backend(group))
        self._host_collectives = "gloo" in backend or "mpi" in backend

    def device(self, like):
        """Where this group's collectives run: host memory on gloo/MPI, else the inputs' device."""
        import torch

        if self._host_collectives:
            return torch.device("cpu")
        if isinstance(like, torch.Tensor):
            return like.device
        return torch.device("cuda", torch.cuda.current_device())

    @property
    def capacity(self) -> int:
        """Numbers per rank in the next exchange's one all-gather (the same on every rank)."""
        recent = _RECENT.get(self._key)
        if not recent:
            return INITIAL_CAPACITY
        needed = len(HEADER) + max(recent)
        return max(INITIAL_CAPACITY, -(-(needed + needed // 8) // 64) * 64)

    def gather(self, head: np.ndarray, payload):
        """(W, size) float64 on ``payload``'s collective device: every rank's flat payload, after every rank's
        header was read and found in agreement (raises on every rank otherwise)."""
        import torch

        device = self.device(payload)
        flat = payload.detach().reshape(-1).to(device=device, dtype=torch.float64)
        size, capacity = flat.shape[0], self.capacity
        buffer = torch.zeros(capacity, dtype=torch.float64, device=device)
        buffer[:len(HEADER)] = torch.from_numpy(head).to(device)
        fits = len(HEADER) + size <= capacity
        if fits:
            buffer[len(HEADER):len(HEADER) + size] = flat
        gathered = self._all_gather(buffer)
        headers = gathered[:, :len(HEADER)].cpu().numpy()
        failed = bool((headers[:, HEADER.index("status")] != OK).any())
        check_headers(headers, self.rank, gathered[:, len(HEADER):].cpu().numpy() if failed else None)
        recent = _RECENT.setdefault(self._key, collections.deque(maxlen=REMEMBERED))
        recent.append(size)  # the same on every rank now
        if fits:
            return gathered[:, len(HEADER):len(HEADER) + size]
        return self._all_gather(flat)

    def fail(self, error: BaseException, like) -> None:
        """This rank's part of the exchange after its own error: the error and its message go to every rank
        (the caller raises its own error next)."""
        import torch

        device = self.device(like)
        capacity = self.capacity
        message = encode_message(error, capacity - len(HEADER))
        row = np.zeros(capacity, dtype=np.float64)
        row[:len(HEADER)] = header(status=error_status(error), world=self.world, size=message.shape[0])
        row[len(HEADER):len(HEADER) + message.shape[0]] = message
        self._all_gather(torch.from_numpy(row).to(device))

    def gather_fixed(self, row):
        """(W, n) host float64: every rank's n numbers (a fixed size, the same on every rank by construction)."""
        import torch

        return self._all_gather(row.to(dtype=torch.float64)).cpu().numpy()

    def _all_gather(self, flat):
        out = flat.new_empty((self.world * flat.shape[0],))
        all_gather_flat(out, flat, group=self.group)
        return out.reshape(self.world, flat.shape[0])


def all_gather_flat(out: Any, flat: Any, group: Any = None) -> None:
    """Every rank's 1-d tensor ``flat``, concatenated in rank order into ``out`` (one collective).

    ``torch.distributed.all_gather_single`` where this torch has it (2.13 on,
    where ``all_gather_into_tensor`` is deprecated), else ``all_gather_into_tensor``.

    Parameters
    ----------
    out : torch tensor, shape (world * n,)
        Written in place: rank r's ``flat`` lands in ``out[r * n:(r + 1) * n]``.
    flat : torch tensor, shape (n,)
        This rank's numbers, of ``out``'s dtype and device; the same n on every rank.
    group : torch.distributed process group, optional
        The ranks that take part (default: the world group).

    Examples
    --------
    >>> import os, tempfile, torch, torch.distributed as dist
    >>> from gae_xp.distributed import all_gather_flat
    >>> store = os.path.join(tempfile.mkdtemp(), "store")
    >>> dist.init_process_group("gloo", init_method=f"file://{store}", rank=0, world_size=1)
    >>> out = torch.empty(3)
    >>> all_gather_flat(out, torch.tensor([1.0, 2.0, 3.0]))
    >>> out.tolist()
    [1.0, 2.0, 3.0]
    >>> dist.destroy_process_group()
    """
    import torch.distributed as dist

    gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    gather(out, flat, group=group)


# --- JAX ------------------------------------------------------------------------------------------------------------


class AxisExchange:
    """The collectives of a ``jax.shard_map`` axis: ``world`` is a Python int, ``rank`` a traced index.

    One SPMD program runs on every device, so shapes and dtypes agree by
    construction and an argument error is raised once, while tracing: the
    summaries cross as they are, with no header.
    """

    traced = True

    def __init__(self, axis_name):
        import jax

        try:
            self.world = int(jax.lax.axis_size(axis_name))
        except NameError:
            raise ValueError(f"Context(axis_name={axis_name!r}) is used inside jax.shard_map (or jax.pmap) over that "
                             f"axis: no axis of that name is bound here") from None
        self.rank = jax.lax.axis_index(axis_name)
        self.axis_name = axis_name

    def gather(self, head, payload):
        import jax

        return jax.lax.all_gather(payload, self.axis_name)

    def fail(self, error, like) -> None:
        return None
