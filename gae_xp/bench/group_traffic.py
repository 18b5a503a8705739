"""Traffic model of group_advantages' moments on a GPU (``gae_xp._segments``): the two numba-CUDA launches of
``backends/_cuda_groups.py`` by hand and read from their PTX, and the launches of each layout's whole route.

Per launch of ``_cuda_groups`` (one thread per score, float64 atomics into (n_groups,) arrays), for N scores
of ``itemsize`` bytes in G groups that have a member (every score real: the path with the most traffic)::

    count_and_sum   reads x (itemsize N), index (8 N); atomics read and write count, total (8 G each)
    centred_sums    reads x, index, count, total (8 G each); atomics read and write d_sum, d_squares (8 G each)

An atomic add reads and writes its 8 bytes; the distinct bytes of a group's slot count once per launch (the L2
cache, where atomics resolve, keeps the (n_groups,) arrays). ``ptx_launches`` runs the kernels' sm_90 PTX on the
CPU for every block of the grid (``gae_xp.bench.ptx``) and counts the distinct bytes each argument moves;
``tests/test_traffic.py`` checks the two agree.

``route_row`` counts a layout's whole route at N scores, as on a GPU, on torch CPU tensors (the rule of
``gae_xp.bench.traffic.record_torch``: every operator one launch, its tensors read and written once):

* consecutive groups of k: ``_segments.consecutive_moments``, a reshape and reductions (library operators);
* arbitrary ids: ``_segments.dense_index`` (a sort: one operator here, several kernels in a GPU's sort), the four
  zeroed (N,) float64 sums, the two kernel launches (recorded, not run: their bytes from the hand model) and
  the finishing arithmetic.
"""

from __future__ import annotations

from dataclasses import dataclass
from unittest import mock

import numpy as np

#: The scores the docs/gpu.md row is predicted for, and the group size (consecutive layout; ids: shuffled).
N = 16384
K = 16
LAUNCHES = ("count_and_sum", "centred_sums")


def model(n: int, groups: int, itemsize: int = 4) -> dict[str, dict[str, tuple[int, int]]]:
    """Per launch and argument: (distinct bytes read, distinct bytes written), for ``n`` real scores of
    ``itemsize`` bytes in ``groups`` groups that have a member."""
    scores, index, sums = itemsize * n, 8 * n, 8 * groups
    streamed = {"x": (scores, 0), "index": (index, 0)}
    return {"count_and_sum": {**streamed, "count": (sums, sums), "total": (sums, sums)},
            "centred_sums": {**streamed, "count": (sums, 0), "total": (sums, 0), "d_sum": (sums, sums),
                             "d_squares": (sums, sums)}}


def layout_index(layout: str, n: int, k: int = K, seed: int = 0) -> np.ndarray:
    """The dense index (int64, (n,)) of ``layout``: ``"consecutive"`` (i // k) or ``"ids"`` (groups of k, the
    members shuffled over the batch)."""
    index = np.arange(n, dtype=np.int64) // k
    if layout == "consecutive":
        return index
    if layout == "ids":
        return np.random.default_rng(seed).permutation(index)
    raise ValueError(f"layout must be 'consecutive' or 'ids', got {layout!r}")


@dataclass(frozen=True)
class GroupLaunch:
    """One group launch as its PTX runs it: per argument, the distinct bytes read and written over the grid."""

    kernel: str
    blocks: int
    threads: int
    read: dict[str, int]
    written: dict[str, int]


def ptx_launches(layout: str, n: int, *, k: int = K, io: str = "float32") -> list[GroupLaunch]:
    """Both launches for ``n`` scores of dtype ``io`` in ``layout``, read from their sm_90 PTX, every block run."""
    from gae_xp.backends import _cuda_groups
    from gae_xp.bench import ptx, traffic

    index = layout_index(layout, n, k)
    groups = int(index.max()) + 1
    x = np.full(n, 0.5, dtype=io)
    sums = {name: np.zeros(groups) for name in ("count", "total", "d_sum", "d_squares")}
    blocks = -(-n // _cuda_groups.THREADS)
    arguments = {"count_and_sum": ["count", "total"], "centred_sums": ["count", "total", "d_sum", "d_squares"]}
    fill = {"x": lambda i: 0.5, "index": lambda i: int(index[i]), **{name: lambda i: 0.0 for name in sums}}
    out = []
    for spec, launch in zip(_cuda_groups.specs(io), LAUNCHES):
        source = traffic._compile_ptx(spec)
        program = ptx.load(source, [("x", x), ("index", index), *((name, sums[name]) for name in arguments[launch])],
                           fill=fill)
        accesses = []
        for block in range(blocks):
            accesses += ptx.run_block(program, (block, 0, 0), (_cuda_groups.THREADS, 1, 1), (blocks, 1, 1))
        moved = ptx.bytes_by_argument(accesses)
        out.append(GroupLaunch(spec.name, blocks, _cuda_groups.THREADS, {a: row["read"] for a, row in moved.items()},
                               {a: row["written"] for a, row in moved.items()}))
    return out


@dataclass(frozen=True)
class RouteRow:
    """A layout's whole route to the moments: launches (operators and kernels), bytes per score, host syncs."""

    layout: str
    n: int
    launches: int
    kernels: int
    bytes_per_element: float
    host_syncs: int


def route_row(layout: str, n: int = N, k: int = K) -> RouteRow:
    """The route of ``layout`` at ``n`` float32 scores, recorded on torch CPU tensors (see the module docstring)."""
    import torch

    from gae_xp import _compat, _segments
    from gae_xp.backends import _cuda_groups
    from gae_xp.bench import traffic

    xp = _compat.array_namespace(torch.zeros(1))
    scores = torch.from_numpy(np.random.default_rng(0).standard_normal(n).astype(np.float32))
    if layout == "consecutive":
        launches, moved, syncs = traffic.record_torch(lambda: _segments.consecutive_moments(scores, k))
        return RouteRow(layout, n, launches, 0, moved / n, syncs)
    ids = torch.from_numpy(layout_index("ids", n, k) * 7919 - 10**12)  # any values: the dense index ranks them
    traffic.LaunchRecorder.launches = []
    with mock.patch.object(_cuda_groups, "_Launch", traffic.LaunchRecorder), \
            mock.patch.object(_cuda_groups, "_kernels", lambda io: LAUNCHES):
        launches, moved, syncs = traffic.record_torch(
            lambda: _segments.cuda_group_moments(xp, scores, _segments.dense_index(xp, ids), n))
    kernels = [kernel for kernel, *_ in traffic.LaunchRecorder.launches]
    if kernels != list(LAUNCHES):
        raise RuntimeError(f"the arbitrary-ids route launched {kernels}, not the two kernels {list(LAUNCHES)}")
    by_hand = sum(r + w for launch in model(n, n // k).values() for r, w in launch.values())
    return RouteRow(layout, n, launches + len(kernels), len(kernels), (moved + by_hand) / n, syncs)


def markdown(rows: list[RouteRow]) -> str:
    """The rows as docs/gpu.md's table (float32 scores, groups of K, an H200's 4.8 TB/s)."""
    from gae_xp.bench.traffic import H200_BANDWIDTH

    lines = ["| layout | N | launches (of them numba-CUDA kernels) | bytes/score | predicted us at 4.8 TB/s "
             "| host syncs |", "|---|---|---|---|---|---|"]
    names = {"consecutive": f"consecutive groups of k = {K} (`group_ids={K}`)",
             "ids": f"arbitrary ids, groups of {K} shuffled"}
    for row in rows:
        micro = row.bytes_per_element * row.n / H200_BANDWIDTH * 1e6
        lines.append(f"| {names[row.layout]} | {row.n} | {row.launches} ({row.kernels}) | {row.bytes_per_element:.2f}"
                     f" | {micro:.3f} | {row.host_syncs} |")
    return "\n".join(lines)


def table(n: int = N) -> str:
    return markdown([route_row(layout, n) for layout in ("consecutive", "ids")])

