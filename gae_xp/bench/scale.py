"""``python -m gae_xp.bench.scale {packed,cp,cp-packed,dask-ooc,dask-throughput,dask-graph}``: GAE beyond one padded
batch on one device.

* ``packed``: packed sequences (``cu_seqlens``) against one row of the same
  length and against the loops over sequences that packing users write;
* ``cp``: context parallelism over ``torch.distributed`` (gloo, spawned
  processes): time per call and bytes sent per rank, ``gae_xp.distributed``
  against gathering the sequence and running ``gae_xp.gae`` on every rank,
  and whitening across ranks against gathering the entries;
* ``cp-packed``: context parallelism over many packed sequences: the
  Context's build and a call, both layouts;
* ``dask-ooc``: rewards and values on disk, larger than memory, through the
  Dask backend block by block; wall time and peak resident memory;
* ``dask-throughput``: a case that fits: NumPy in memory against the same
  arrays as Dask arrays;
* ``dask-graph``: the time to build (and to compute) the graph of ``gae()``
  and ``discounted_cumsum`` against the number of blocks.

Timings are medians over ``--repeat`` rounds, every case once per round,
side by side in one process (in each process for ``cp``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import threading
import time

import numpy as np

import gae_xp


def _median_rounds(cases: dict, repeat: int, warmup: int = 1, synchronize=lambda: None) -> dict:
    """{name: median seconds}: every case once per round, ``repeat`` rounds after ``warmup``."""
    for _ in range(warmup):
        for call in cases.values():
            call()
    times = {name: [] for name in cases}
    for _ in range(repeat):
        for name, call in cases.items():
            start = time.perf_counter()
            call()
            synchronize()
            times[name].append(time.perf_counter() - start)
    return {name: statistics.median(values) for name, values in times.items()}


def random_offsets(rng, count: int, total: int) -> np.ndarray:
    inner = np.sort(rng.choice(np.arange(1, total), size=count - 1, replace=False))
    return np.concatenate([[0], inner, [total]]).astype(np.int64)


# --- packed ------------------------------------------------------------------------------------------------------


def packed(options) -> dict:
    from gae_xp.bench.baselines import slime_serial_gae

    rng = np.random.default_rng(0)
    total, count = options.total, options.sequences
    offsets = random_offsets(rng, count, total)
    rewards = rng.standard_normal(total, dtype=np.float32)
    values = rng.standard_normal(total, dtype=np.float32)
    spans = list(zip(offsets[:-1].tolist(), offsets[1:].tolist()))
    longest = max(stop - start for start, stop in spans)
    libraries = {"numpy": (lambda x: x, np)}
    try:
        import torch

        libraries["torch"] = (torch.from_numpy, torch)
    except ImportError:
        pass
    results = {}
    for name, (convert, module) in libraries.items():
        r, v, cu = convert(rewards), convert(values), convert(offsets)

        def padded(r=r, v=v, module=module):
            # unpack to (sequences, longest) with a mask, one batched call, pack again
            shape = (count, longest)
            pr, pv = module.zeros(shape, dtype=r.dtype), module.zeros(shape, dtype=r.dtype)
            mask = module.zeros(shape, dtype=bool)
            for i, (start, stop) in enumerate(spans):
                pr[i, :stop - start], pv[i, :stop - start], mask[i, :stop - start] = r[start:stop], v[start:stop], True
            a, _ = gae_xp.gae(pr, pv, mask=mask)
            return module.concatenate([a[i, :stop - start] for i, (start, stop) in enumerate(spans)]) \
                if module is np else module.cat([a[i, :stop - start] for i, (start, stop) in enumerate(spans)])

        cases = {
            "one row of the total length": lambda r=r, v=v: gae_xp.gae(r[None], v[None]),
            "packed (cu_seqlens)": lambda r=r, v=v, cu=cu: gae_xp.gae(r, v, cu_seqlens=cu),
            "loop over sequences, gae_xp.gae each": lambda r=r, v=v: [gae_xp.gae(r[a:b], v[a:b]) for a, b in spans],
            "padded to (sequences, longest) + mask": padded,
        }
        medians = _median_rounds(cases, options.repeat)
        # slime's serial loop per sequence (a Python loop over tokens): timed on the first sequences, scaled by tokens
        few = spans[:options.serial_sequences]
        start = time.perf_counter()
        for a, b in few:
            slime_serial_gae(r[None, a:b], v[None, a:b], 0.99, 0.95)
        tokens = sum(b - a for a, b in few)
        elapsed = time.perf_counter() - start
        medians["loop over sequences, slime's serial loop (extrapolated)"] = elapsed * total / tokens
        results[name] = medians
    _print_table(f"packed: {count} sequences of random lengths, {total} tokens, float32 (median of {options.repeat})",
                 results, reference="one row of the total length")
    return results


def _print_table(title, results, reference):
    print(title)
    for library, medians in results.items():
        base = medians[reference]
        for case, seconds in medians.items():
            print(f"  {library:6s} {case:58s} {seconds * 1e3:12.2f} ms  {seconds / base:9.2f}x")


# --- context parallelism -----------------------------------------------------------------------------------------


def cp(options) -> dict:
    """Spawn ``options.world`` gloo processes; each times the methods of its command side by side."""
    import multiprocessing
    import tempfile

    context = multiprocessing.get_context("spawn")
    results = context.Queue()
    os.environ.setdefault("NUMBA_NUM_THREADS", "1")
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    with tempfile.TemporaryDirectory() as scratch:
        store = os.path.join(scratch, "store")
        processes = [context.Process(target=_cp_rank, args=(rank, options.world, store, vars(options), results))
                     for rank in range(options.world)]
        for process in processes:
            process.start()
        report = None
        for _ in range(options.world):
            rank, payload = results.get(timeout=options.timeout)
            if isinstance(payload, str):
                raise RuntimeError(f"rank {rank} failed:\n{payload}")
            if rank == 0:
                report = payload
        for process in processes:
            process.join(timeout=30)
    shape = (f"B={options.batch}, T={options.length}" if options.command == "cp" else
             f"B={options.batch}, {options.sequences} packed sequences, {options.length} tokens")
    print(f"{options.command}: {options.world} processes (gloo, CPU), {shape}, float32; time per call: median over "
          f"{options.repeat} rounds of the slowest rank; payload: the bytes a rank puts into the collectives; lo: "
          f"bytes sent on the loopback interface per rank and call (all traffic of the machine's loopback, less that "
          f"of the barriers around the window)")
    for method, row in report["methods"].items():
        print(f"  {method:58s} {row['seconds'] * 1e3:10.2f} ms   payload per rank {row['payload_bytes']:>12,d} B"
              f"   measured on lo per rank {row['lo_bytes_per_rank']:>14,.0f} B")
    for name, value in report["checks"].items():
        print(f"  {name}: {value:.3g}")
    return report


def _cp_methods(options, rank, world):
    """{name: (call, payload bytes per rank)} and {check: value} for this rank (imports torch)."""
    import torch
    import torch.distributed as dist

    import gae_xp.distributed as context_parallel

    batch, length = options["batch"], options["length"]
    size = length // world
    generator = torch.Generator().manual_seed(rank)
    r = torch.randn(batch, size, generator=generator)
    v = torch.randn(batch, size, generator=generator)

    def context(**arguments):
        """A Context on a group of its own: the exchange's capacity follows that method's payload alone."""
        return context_parallel.Context(dist.new_group(list(range(world))), **arguments)

    def sent(context):  # after a call: what its one all-gather carries per rank (header and summaries, float64)
        return lambda: 8 * context.exchange().capacity

    if options["command"] == "cp-packed":
        rng = np.random.default_rng(0)
        offsets = random_offsets(rng, options["sequences"], length)
        halves = np.diff(random_offsets(rng, options["sequences"], length // (2 * world)))  # zigzag: 2W | lengths
        zigzag_offsets = np.concatenate([[0], np.cumsum(2 * world * halves)])
        contiguous = context(layout="contiguous", cu_seqlens=offsets)
        zigzag = context(layout="zigzag", cu_seqlens=zigzag_offsets)
        per_call = context_parallel.Context(dist.new_group(list(range(world))), cu_seqlens=offsets)
        methods = {
            "contiguous, Context built once": (lambda: context_parallel.gae(r, v, context=contiguous)[0],
                                               sent(contiguous)),
            "contiguous, Context built in the call": (
                lambda: context_parallel.gae(r, v, context=context_parallel.Context(per_call.group,
                                                                                    cu_seqlens=offsets))[0],
                sent(per_call)),
            "zigzag, Context built once": (lambda: context_parallel.gae(r, v, context=zigzag)[0], sent(zigzag)),
            "Context built (contiguous, no call)": (lambda: context_parallel.Context(cu_seqlens=offsets), 0),
        }
        return methods, {}

    def gather_then_gae():
        # the sequence gathered onto every rank (one all-gather per array), gae() on all of it, own shard kept
        full = []
        for x in (r, v):
            out = torch.empty(world * x.numel())
            context_parallel.all_gather_flat(out, x.reshape(-1))
            full.append(out.reshape(world, batch, size).permute(1, 0, 2).reshape(batch, length))
        a, _ = gae_xp.gae(full[0], full[1])
        return a[:, rank * size:(rank + 1) * size]

    def allreduce_then_gae():
        # slime: per sample, a zero-padded full-length buffer all-reduced (sum), then GAE on the whole sequence
        full = [torch.zeros(batch, length), torch.zeros(batch, length)]
        for out, x in zip(full, (r, v)):
            for row in range(batch):
                buffer = torch.zeros(length)
                buffer[rank * size:(rank + 1) * size] = x[row]
                dist.all_reduce(buffer)
                out[row] = buffer
        a, _ = gae_xp.gae(full[0], full[1])
        return a[:, rank * size:(rank + 1) * size]

    def gather_then_whiten():
        out = torch.empty(world * r.numel())
        context_parallel.all_gather_flat(out, r.reshape(-1))
        return gae_xp.whiten(out)[rank * r.numel():(rank + 1) * r.numel()].reshape(r.shape)

    contiguous, zigzag = context(layout="contiguous"), context(layout="zigzag")
    methods = {
        "gae_xp.distributed.gae (contiguous)": (lambda: context_parallel.gae(r, v, context=contiguous)[0],
                                                sent(contiguous)),
        "gae_xp.distributed.gae (zigzag)": (lambda: context_parallel.gae(r, v, context=zigzag)[0], sent(zigzag)),
        "all-gather the sequence + gae() on every rank": (gather_then_gae, 2 * batch * size * 4),
        "slime: all-reduce per sample + gae() on every rank": (allreduce_then_gae, 2 * batch * length * 4),
        "gae_xp.distributed.whiten": (lambda: context_parallel.whiten(r), 8 * 8),
        "all-gather the entries + gae_xp.whiten": (gather_then_whiten, batch * size * 4),
    }
    checks = {
        "max |difference| between the CP methods' advantages": float(
            (methods["gae_xp.distributed.gae (contiguous)"][0]() - gather_then_gae()).abs().max()),
        "max |difference| between the whitening methods": float(
            (context_parallel.whiten(r) - gather_then_whiten()).abs().max()),
    }
    return methods, checks


def _cp_rank(rank, world, store, options, results):
    import traceback
    from datetime import timedelta

    try:
        import psutil
        import torch
        import torch.distributed as dist

        import gae_xp.distributed as context_parallel

        torch.set_num_threads(1)
        dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world,
                                timeout=timedelta(seconds=options["timeout"]))
        methods, checks = _cp_methods(options, rank, world)
        for call, _ in methods.values():  # warm-up: compile, connect, grow the exchange's capacity
            call()
        times = {name: [] for name in methods}
        for _ in range(options["repeat"]):
            for name, (call, _) in methods.items():
                dist.barrier()
                start = time.perf_counter()
                call()
                times[name].append(time.perf_counter() - start)

        def loopback_bytes(call, calls):
            """Bytes sent on the loopback interface by all ranks together while every rank calls ``call``."""
            dist.barrier()
            before = psutil.net_io_counters(pernic=True)["lo"].bytes_sent
            dist.barrier()
            for _ in range(calls):
                call()
            dist.barrier()
            return psutil.net_io_counters(pernic=True)["lo"].bytes_sent - before

        calls = 5
        barriers = statistics.median(loopback_bytes(lambda: None, calls) for _ in range(3))  # the window's own cost
        lo = {name: (loopback_bytes(call, calls) - barriers) / calls / world for name, (call, _) in methods.items()}
        slowest = torch.tensor([[t for t in times[name]] for name in methods])
        everyone = torch.empty(world * slowest.numel(), dtype=slowest.dtype)
        context_parallel.all_gather_flat(everyone, slowest.reshape(-1))
        slowest = everyone.reshape(world, *slowest.shape).amax(dim=0)
        report = {"world": world, "batch": options["batch"], "length": options["length"], "checks": checks,
                  "methods": {name: {"seconds": float(slowest[i].median()),
                                     "payload_bytes": payload() if callable(payload) else payload,
                                     "lo_bytes_per_rank": lo[name]} for i, (name, (_, payload)) in
                              enumerate(methods.items())}}
        dist.destroy_process_group()
        results.put((rank, report))
    except BaseException:
        results.put((rank, traceback.format_exc()))


# --- Dask --------------------------------------------------------------------------------------------------------


class RawFile:
    """A (rows, T) array in a raw file, read and written by blocks with pread/pwrite (no memory map: the pages
    a block touched do not stay in the process's resident memory)."""

    def __init__(self, path, shape, dtype, *, create=False):
        self.path, self.shape, self.dtype = path, tuple(shape), np.dtype(dtype)
        self.ndim = len(self.shape)
        if create:
            with open(path, "wb") as f:
                f.truncate(self.nbytes)

    @property
    def nbytes(self):
        return int(np.prod(self.shape)) * self.dtype.itemsize

    def _region(self, index):
        rows, cols = index
        rows = range(*rows.indices(self.shape[0]))
        start, stop, _ = cols.indices(self.shape[1])
        return rows, start, stop

    def __getitem__(self, index):
        rows, start, stop = self._region(index)
        out = np.empty((len(rows), stop - start), self.dtype)
        fd = os.open(self.path, os.O_RDONLY)
        try:
            for i, row in enumerate(rows):
                offset = (row * self.shape[1] + start) * self.dtype.itemsize
                out[i] = np.frombuffer(os.pread(fd, (stop - start) * self.dtype.itemsize, offset), self.dtype)
        finally:
            os.close(fd)
        return out

    def __setitem__(self, index, block):
        rows, start, _ = self._region(index)
        fd = os.open(self.path, os.O_WRONLY)
        try:
            for i, row in enumerate(rows):
                os.pwrite(fd, np.ascontiguousarray(block[i]).tobytes(), (row * self.shape[1] + start) *
                          self.dtype.itemsize)
        finally:
            os.close(fd)


def _inputs_on_disk(directory, batch, length):
    """rewards.bin and values.bin of (batch, length) float32 standard normals, written once (in 64 MiB pieces)."""
    os.makedirs(directory, exist_ok=True)
    files = {}
    for seed, name in enumerate(("rewards", "values")):
        path = os.path.join(directory, f"{name}-{batch}x{length}.f32")
        files[name] = RawFile(path, (batch, length), np.float32, create=not os.path.exists(path))
        if os.path.getsize(path) == files[name].nbytes and os.path.exists(path + ".done"):
            continue
        rng = np.random.default_rng(seed)
        step = max(1, 2**24 // batch)
        for start in range(0, length, step):
            stop = min(length, start + step)
            files[name][slice(0, batch), slice(start, stop)] = rng.standard_normal((batch, stop - start),
                                                                                   dtype=np.float32)
        open(path + ".done", "w").close()
    return files


class PeakMemory:
    """The process's largest resident set size while the block runs (sampled every 10 ms)."""

    def __enter__(self):
        import psutil

        self._process, self._stop, self.peak = psutil.Process(), threading.Event(), 0
        self.start = self._process.memory_info().rss
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def _sample(self):
        while not self._stop.is_set():
            self.peak = max(self.peak, self._process.memory_info().rss)
            time.sleep(0.01)

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, self._process.memory_info().rss)


def dask_ooc(options) -> dict:
    import dask.array as da

    batch = options.batch
    length = int(options.gib * 2**30) // 4 // batch
    block = int(options.block_mib * 2**20) // 4 // batch
    files = _inputs_on_disk(options.dir, batch, length)
    rewards = da.from_array(files["rewards"], chunks=(batch, block), asarray=False)
    values = da.from_array(files["values"], chunks=(batch, block), asarray=False)
    advantages, returns = gae_xp.gae(rewards, values)
    tasks = len(dict(advantages.__dask_graph__()))
    outputs = [RawFile(os.path.join(options.dir, f"{name}.f32"), (batch, length), np.float32, create=True)
               for name in ("advantages", "returns")]
    with PeakMemory() as memory:
        start = time.perf_counter()
        da.store([advantages, returns], outputs, lock=False, scheduler=options.scheduler)
        seconds = time.perf_counter() - start
    report = {"gib_per_array": options.gib, "block_mib": options.block_mib, "batch": batch, "length": length,
              "blocks": rewards.numblocks[-1], "tasks": tasks, "seconds": seconds,
              "steps_per_second": batch * length / seconds, "peak_rss_mib": memory.peak / 2**20,
              "rss_before_mib": memory.start / 2**20}
    if options.check:
        r, v = files["rewards"][slice(None), slice(None)], files["values"][slice(None), slice(None)]
        want, _ = gae_xp.gae(r, v)
        got = outputs[0][slice(None), slice(None)]
        report["max_difference_to_numpy"] = float(np.abs(got - want).max())
    print(f"dask out-of-core: rewards and values {options.gib} GiB each (B={batch}, T={length}) in "
          f"{options.block_mib} MiB blocks ({report['blocks']} blocks, {tasks} tasks), read and written with "
          f"pread/pwrite, scheduler={options.scheduler}")
    print(f"  {seconds:.1f} s, {report['steps_per_second'] / 1e6:.1f} M steps/s, peak RSS "
          f"{report['peak_rss_mib']:.0f} MiB (before: {report['rss_before_mib']:.0f} MiB)"
          + (f", max |A - NumPy| {report['max_difference_to_numpy']:.3g}" if options.check else ""))
    return report


def dask_throughput(options) -> dict:
    import dask
    import dask.array as da

    rng = np.random.default_rng(0)
    batch, length = options.batch, options.length
    block = int(options.block_mib * 2**20) // 4 // batch
    rewards = rng.standard_normal((batch, length), dtype=np.float32)
    values = rng.standard_normal((batch, length), dtype=np.float32)
    lazy_r, lazy_v = da.from_array(rewards, chunks=(batch, block)), da.from_array(values, chunks=(batch, block))

    def lazy():
        a, r = gae_xp.gae(lazy_r, lazy_v)
        return dask.compute(a, r, scheduler=options.scheduler)

    targets = [np.empty_like(rewards), np.empty_like(rewards)]

    def stored():
        da.store(list(gae_xp.gae(lazy_r, lazy_v)), targets, lock=False, scheduler=options.scheduler)

    cases = {"NumPy in memory (gae_xp.gae, numba)": lambda: gae_xp.gae(rewards, values),
             f"Dask, {options.block_mib:g} MiB blocks, compute()": lazy,
             f"Dask, {options.block_mib:g} MiB blocks, store() into NumPy": stored}
    medians = _median_rounds(cases, options.repeat)
    print(f"dask throughput: B={batch}, T={length}, float32 ({rewards.nbytes / 2**20:.0f} MiB per array), "
          f"{lazy_r.numblocks[-1]} blocks, scheduler={options.scheduler}, median of {options.repeat}")
    for name, seconds in medians.items():
        print(f"  {name:48s} {seconds * 1e3:10.1f} ms  {batch * length / seconds / 1e6:8.1f} M steps/s")
    return medians


def dask_graph(options) -> dict:
    """Seconds to build the graphs of gae() (dones and a mask) and discounted_cumsum, and to compute gae()'s, against
    the number of time blocks."""
    import dask
    import dask.array as da

    report = {}
    for blocks in options.blocks:
        rewards = da.ones((options.batch, blocks * options.block_steps), chunks=(options.batch, options.block_steps))
        start = time.perf_counter()
        advantages, returns = gae_xp.gae(rewards, rewards, mask=rewards > 0, terminated=rewards < 0)
        built_gae = time.perf_counter() - start
        start = time.perf_counter()
        gae_xp.discounted_cumsum(rewards, 0.9)
        built_scan = time.perf_counter() - start
        start = time.perf_counter()
        dask.compute(advantages, returns, scheduler="threads")
        computed = time.perf_counter() - start
        tasks = len(dict(advantages.__dask_graph__()))
        report[blocks] = {"build_gae_seconds": built_gae, "build_cumsum_seconds": built_scan,
                          "compute_gae_seconds": computed, "tasks": tasks}
    print(f"dask graph: B={options.batch}, {options.block_steps} steps per block, float64; build = gae_xp.gae (dones, "
          f"mask) or discounted_cumsum returning its lazy arrays; compute = gae()'s advantages and returns "
          f"(threads scheduler)")
    for blocks, row in report.items():
        print(f"  {blocks:6d} blocks ({row['tasks']:6d} tasks): build gae {row['build_gae_seconds'] * 1e3:8.1f} ms, "
              f"build discounted_cumsum {row['build_cumsum_seconds'] * 1e3:8.1f} ms, compute gae "
              f"{row['compute_gae_seconds']:7.2f} s")
    return report


def main(argv=None) -> int:
    from gae_xp.bench.cli import positive_float, positive_int, unwritable

    parser = argparse.ArgumentParser(prog="python -m gae_xp.bench.scale", description=__doc__.splitlines()[0])
    parser.add_argument("--json", help="also write the figures to this JSON file")
    commands = parser.add_subparsers(dest="command", required=True)
    p = commands.add_parser("packed", help="packed sequences against one row and the loops over sequences")
    p.add_argument("--total", type=positive_int, default=2**20)
    p.add_argument("--sequences", type=positive_int, default=1024)
    p.add_argument("--repeat", type=positive_int, default=15)
    p.add_argument("--serial-sequences", type=positive_int, default=8, help="sequences timed for the serial loop")
    c = commands.add_parser("cp", help="context parallelism over gloo processes against gathering the sequence")
    c.add_argument("--world", type=positive_int, default=4)
    c.add_argument("--batch", type=positive_int, default=8)
    c.add_argument("--length", type=positive_int, default=2**20)
    c.add_argument("--repeat", type=positive_int, default=7)
    c.add_argument("--timeout", type=positive_int, default=600)
    k = commands.add_parser("cp-packed", help="context parallelism over many packed sequences, both layouts")
    k.add_argument("--world", type=positive_int, default=4)
    k.add_argument("--batch", type=positive_int, default=1)
    k.add_argument("--length", type=positive_int, default=2**17, help="tokens in all (every rank holds length / world)")
    k.add_argument("--sequences", type=positive_int, default=16384)
    k.add_argument("--repeat", type=positive_int, default=7)
    k.add_argument("--timeout", type=positive_int, default=600)
    o = commands.add_parser("dask-ooc", help="rewards and values on disk, larger than memory, through Dask")
    o.add_argument("--gib", type=positive_float, default=4.0, help="size of each of rewards and values")
    o.add_argument("--block-mib", type=positive_float, default=64.0)
    o.add_argument("--batch", type=positive_int, default=8)
    o.add_argument("--dir", default=os.path.join(os.environ.get("TMPDIR", "/tmp"), "gae_xp_ooc"))
    o.add_argument("--scheduler", default="threads")
    o.add_argument("--check", action="store_true", help="compare with NumPy in memory (needs 4x the data in RAM)")
    t = commands.add_parser("dask-throughput", help="a case that fits: NumPy in memory against Dask")
    t.add_argument("--batch", type=positive_int, default=8)
    t.add_argument("--length", type=positive_int, default=2**24)
    t.add_argument("--block-mib", type=positive_float, default=64.0)
    t.add_argument("--repeat", type=positive_int, default=5)
    t.add_argument("--scheduler", default="threads")
    g = commands.add_parser("dask-graph", help="building and computing the Dask graph against the number of blocks")
    g.add_argument("--blocks", type=lambda text: [positive_int(n) for n in text.split(",")], default=[400, 2400, 4000])
    g.add_argument("--batch", type=positive_int, default=2)
    g.add_argument("--block-steps", type=positive_int, default=16)
    options = parser.parse_args(argv)
    if options.command == "packed" and options.sequences > options.total:
        parser.error(f"--sequences {options.sequences} is more than --total {options.total} steps")
    if options.command == "cp-packed" and options.sequences > options.length:
        parser.error(f"--sequences {options.sequences} is more than --length {options.length} tokens")
    if options.command in ("cp", "cp-packed") and options.length < options.world:
        parser.error(f"--length {options.length} is shorter than --world {options.world}: a rank needs a step")
    problem = options.json and unwritable(options.json)
    if problem:
        parser.error(f"--json {options.json}: {problem}")
    run = {"packed": packed, "cp": cp, "cp-packed": cp, "dask-ooc": dask_ooc, "dask-throughput": dask_throughput,
           "dask-graph": dask_graph}[options.command]
    result = run(options)
    if options.json:
        with open(options.json, "w") as f:
            json.dump(result, f, indent=1, default=float)
    return 0


if __name__ == "__main__":
    sys.exit(main())
