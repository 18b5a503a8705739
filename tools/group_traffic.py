"""Traffic model of group_advantages on a GPU: the numba-CUDA launches of ``backends/_cuda_groups.py`` (the
moments of arbitrary ids) and ``backends/_cuda_consecutive.py`` (consecutive groups of k, the advantages fused) by
hand and read from their PTX, and the launches of each layout's whole route.

Per launch of ``_cuda_groups`` (one thread per score, float64 atomics into (n_groups,) arrays), for N scores
of ``itemsize`` bytes in G groups that have a member (every score real: the path with the most traffic)::

    count_and_sum   reads x (itemsize N), index (8 N); atomics read and write count, total (8 G each)
    centred_sums    reads x, index, count, total (8 G each); atomics read and write d_sum, d_squares (8 G each)

An atomic add reads and writes its 8 bytes; the distinct bytes of a group's slot count once per launch (the L2
cache, where atomics resolve, keeps the (n_groups,) arrays). ``ptx_launches`` runs the kernels' sm_90 PTX on the
CPU for every block of the grid (``tools.ptx``) and counts the distinct bytes each argument moves;
``tests/test_traffic.py`` checks the two agree.

Per launch of ``_cuda_consecutive`` (one thread per group; a group's k scores are read three times by its
thread, from the cache after the first), for N scores in G = N / k groups and B = ceil(G / 256) blocks::

    advantages          reads x (itemsize N); writes out (itemsize N)            scale="group" or None
    statistics          reads x; writes stats (n, mean: 2 x 8 G), partials (3 x 8 B)   scale="batch", launch 1
    batch_advantages    reads x, stats, partials (every block all B); writes out       scale="batch", launch 2

``route_row`` counts a layout's whole route at N scores, as on a GPU, on torch CPU tensors (the rule of
``tools.traffic.record_torch``: every operator one launch, its tensors read and written once):

* consecutive groups of k: ``groups._cuda_consecutive``, the whole advantages: its one launch (two for
  ``scale="batch"``, layout ``"consecutive-batch"``), recorded, not run, their bytes from the hand model;
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
#: The consecutive route's launches per scale ("group" and None alike).
CONSECUTIVE_LAUNCHES = {"group": ("advantages",), "batch": ("statistics", "batch_advantages")}


def model(n: int, groups: int, itemsize: int = 4) -> dict[str, dict[str, tuple[int, int]]]:
    """Per launch and argument: (distinct bytes read, distinct bytes written), for ``n`` real scores of
    ``itemsize`` bytes in ``groups`` groups that have a member."""
    scores, index, sums = itemsize * n, 8 * n, 8 * groups
    streamed = {"x": (scores, 0), "index": (index, 0)}
    return {"count_and_sum": {**streamed, "count": (sums, sums), "total": (sums, sums)},
            "centred_sums": {**streamed, "count": (sums, 0), "total": (sums, 0), "d_sum": (sums, sums),
                             "d_squares": (sums, sums)}}


def consecutive_model(n: int, k: int, itemsize: int = 4, scale: str = "group"
                      ) -> dict[str, dict[str, tuple[int, int]]]:
    """Per launch of the consecutive route and argument: (distinct bytes read, distinct bytes written), for ``n``
    scores of ``itemsize`` bytes in groups of ``k``, ``scale`` "group" (or None: the same launch) or "batch"."""
    from gae_xp.backends._cuda_consecutive import THREADS

    groups = n // k
    scores, stats, partials = itemsize * n, 2 * 8 * groups, 3 * 8 * -(-groups // THREADS)
    if scale != "batch":
        return {"advantages": {"x": (scores, 0), "out": (0, scores)}}
    return {"statistics": {"x": (scores, 0), "stats": (0, stats), "partials": (0, partials)},
            "batch_advantages": {"x": (scores, 0), "stats": (stats, 0), "partials": (partials, 0),
                                 "out": (0, scores)}}


def consecutive_ptx_launches(n: int, k: int = K, *, io: str = "float32", scale: str = "group"
                             ) -> list[GroupLaunch]:
    """The consecutive route's launches for ``n`` scores of dtype ``io`` in groups of ``k``, read from their sm_90
    PTX, every block run (the interpreter runs a block's threads one after another: the shared-memory sums are
    not the kernel's, the global accesses are)."""
    from gae_xp.backends import _cuda_consecutive
    from tools import ptx, traffic

    threads, groups = _cuda_consecutive.THREADS, n // k
    blocks = -(-groups // threads)
    arrays = {"x": np.full(n, 0.5, dtype=io), "out": np.zeros(n, dtype=io), "stats": np.zeros((2, groups)),
              "partials": np.zeros((3, blocks))}
    fused, statistics, batch = _cuda_consecutive.specs(io)
    options = [("baseline", 1), ("unbiased", True), ("eps", 1e-6)]
    if scale != "batch":
        launches = [(fused, [("x",), ("out",), ("k", k), *options[:1], ("scaled", True), *options[1:]])]
    else:
        launches = [(statistics, [("x",), ("stats",), ("partials",), ("k", k)]),
                    (batch, [("x",), ("stats",), ("partials",), ("out",), ("k", k), *options])]
    out = []
    for spec, arguments in launches:
        bound = [(a[0], arrays[a[0]]) if len(a) == 1 else a for a in arguments]
        program = ptx.load(traffic._compile_ptx(spec), bound, fill={name: lambda i: 0.5 for name in arrays})
        accesses = []
        for block in range(blocks):
            accesses += ptx.run_block(program, (block, 0, 0), (threads, 1, 1), (blocks, 1, 1))
        moved = ptx.bytes_by_argument(accesses)
        out.append(GroupLaunch(spec.name, blocks, threads, {a: row["read"] for a, row in moved.items()},
                               {a: row["written"] for a, row in moved.items()}))
    return out


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
    from tools import ptx, traffic

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
    """A layout's whole route (the advantages for consecutive groups, the moments for ids): launches (operators and
    kernels), bytes per score, host syncs."""

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
    from tools import traffic

    xp = _compat.array_namespace(torch.zeros(1))
    scores = torch.from_numpy(np.random.default_rng(0).standard_normal(n).astype(np.float32))
    if layout.startswith("consecutive"):
        return _consecutive_row(layout, scores, k)
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


def _consecutive_row(layout: str, scores, k: int) -> RouteRow:
    from gae_xp import groups
    from gae_xp.backends import _cuda_consecutive
    from tools import traffic

    scale = "batch" if layout == "consecutive-batch" else "group"
    names = CONSECUTIVE_LAUNCHES[scale]
    call = groups._Call.prepare(scores, k)
    traffic.LaunchRecorder.launches = []
    kernels = ("advantages", "statistics", "batch_advantages")
    with mock.patch.object(_cuda_consecutive, "_Launch", traffic.LaunchRecorder), \
            mock.patch.object(_cuda_consecutive, "_kernels", lambda io: kernels):
        launches, moved, syncs = traffic.record_torch(
            lambda: groups._cuda_consecutive(call, baseline="mean", scale=scale, eps=1e-6, unbiased=True))
    made = [kernel for kernel, *_ in traffic.LaunchRecorder.launches]
    if made != list(names):
        raise RuntimeError(f"the consecutive route launched {made}, not {list(names)}")
    n = scores.shape[0]
    by_hand = sum(r + w for launch in consecutive_model(n, k, scores.element_size(), scale).values()
                  for r, w in launch.values())
    return RouteRow(layout, n, launches + len(made), len(made), (moved + by_hand) / n, syncs)


def markdown(rows: list[RouteRow]) -> str:
    """The rows as docs/gpu.md's table (float32 scores, groups of K, an H200's 4.8 TB/s)."""
    from tools.traffic import H200_BANDWIDTH

    lines = ["| layout | N | launches (of them numba-CUDA kernels) | bytes/score | predicted us at 4.8 TB/s "
             "| host syncs |", "|---|---|---|---|---|---|"]
    names = {"consecutive": f"consecutive groups of k = {K} (`group_ids={K}`), advantages, `scale=\"group\"` or None",
             "consecutive-batch": f"consecutive groups of k = {K}, advantages, `scale=\"batch\"`",
             "ids": f"arbitrary ids, groups of {K} shuffled, moments only"}
    for row in rows:
        micro = row.bytes_per_element * row.n / H200_BANDWIDTH * 1e6
        lines.append(f"| {names[row.layout]} | {row.n} | {row.launches} ({row.kernels}) | {row.bytes_per_element:.2f}"
                     f" | {micro:.3f} | {row.host_syncs} |")
    return "\n".join(lines)


def table(n: int = N) -> str:
    return markdown([route_row(layout, n) for layout in ("consecutive", "consecutive-batch", "ids")])

