"""The numba CPU general kernel of this checkout against the same kernel module at another git revision, side by side.

    python docs/kernel_ab.py 26511e0                 # B=64, T=65536 float32, one thread, 15 rounds
    python docs/kernel_ab.py 26511e0 --rows 8 --length 4096 --rounds 30

Both modules are loaded in one process (the revision's ``backends/_numba_kernels.py`` and its cache locator,
read with ``git show``, as a package of their own in a temporary directory) and called on the same arrays in
alternation, each round timing one call of each; the table gives each side's fastest round, their ratio, and a
copy of the same bytes (rewards and values into the two outputs) beside them. The cases are general-kernel calls
(no packed sequences give the constant kernel's path): a per-step gamma, packed sequences, ``terminated``, a
mask, dones and mask. Run it with ``NUMBA_NUM_THREADS=1`` (the kernels run on the calling thread here anyway).

A revision from before the flags ``terminated`` and ``truncated`` were always arrays (its module has no
``_flag_row``) takes an absent one as None; this checkout's takes ``numba_cpu.no_flags``.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
MODULES = ("_numba_kernels.py", "_numba_cache.py")


def load_revision(revision: str, where: Path):
    """The kernel module at ``revision``, imported as ``revision_backends._numba_kernels``."""
    package = where / "revision_backends"
    package.mkdir()
    (package / "__init__.py").write_text("")
    for name in MODULES:
        source = subprocess.run(["git", "show", f"{revision}:backends/{name}"], cwd=ROOT, check=True,
                                capture_output=True, text=True).stdout
        (package / name).write_text(source)
    sys.path.insert(0, str(where))
    import importlib

    return importlib.import_module("revision_backends._numba_kernels")


def cases(rows: int, length: int, numba_cpu) -> tuple[dict, dict]:
    """The arrays, and per case (terminated, mask, gamma, bounds, spans) with None for an absent flag."""
    rng = np.random.default_rng(0)
    shape = (rows, length)
    arrays = {"rewards": rng.standard_normal(shape).astype(np.float32),
              "values": rng.standard_normal(shape).astype(np.float32)}
    arrays["advantages"], arrays["returns"] = np.empty_like(arrays["rewards"]), np.empty_like(arrays["rewards"])
    terminated, mask = rng.random(shape) < 1e-3, rng.random(shape) < 0.95
    gamma = numba_cpu.frozen(np.full(shape, 0.99, np.float32))
    whole = (numba_cpu.frozen(np.zeros((rows, 1))), None, numba_cpu._whole_row(length))
    offsets = numba_cpu._read_only(np.arange(0, length + 1, max(length // 16, 1)))
    packed = (numba_cpu.frozen(np.zeros((rows, offsets.shape[0] - 1))), None, offsets)
    one, runs = np.array([0, 1]), np.array([0, offsets.shape[0] - 1])
    return arrays, {"per-step gamma": (None, None, gamma, whole, one), "packed": (None, None, 0.99, packed, runs),
                    "terminated": (terminated, None, 0.99, whole, one), "mask": (None, mask, 0.99, whole, one),
                    "dones+mask": (terminated, mask, 0.99, whole, one)}


def arguments(kernels, arrays: dict, case: tuple, no_flags: np.ndarray) -> tuple:
    """``general_units``'s arguments for one case, absent flags as the module takes them."""
    terminated, mask, gamma, bounds, spans = case
    absent = no_flags if hasattr(kernels, "_flag_row") else None
    terminated = absent if terminated is None else terminated
    steps = (None, terminated, absent, mask, gamma, 0.95, None)
    return (arrays["rewards"], arrays["values"], steps, bounds, False, arrays["advantages"], arrays["returns"],
            spans, 0, arrays["rewards"].shape[0])


def fastest(call, rounds: int) -> float:
    best = float("inf")
    for _ in range(rounds):
        start = time.perf_counter()
        call()
        best = min(best, time.perf_counter() - start)
    return best


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("revision", help="the git revision whose kernels to compare against")
    parser.add_argument("--rows", type=int, default=64)
    parser.add_argument("--length", type=int, default=65536)
    parser.add_argument("--rounds", type=int, default=15)
    options = parser.parse_args(argv)
    from gae_xp.backends import _numba_kernels as ours
    from gae_xp.backends import numba_cpu

    with tempfile.TemporaryDirectory() as where:
        theirs = load_revision(options.revision, Path(where))
        arrays, table = cases(options.rows, options.length, numba_cpu)
        no_flags = numba_cpu.no_flags(options.length)

        def copy():
            np.copyto(arrays["advantages"], arrays["rewards"])
            np.copyto(arrays["returns"], arrays["values"])

        print(f"B={options.rows}, T={options.length} float32; fastest of {options.rounds} alternating rounds; "
              f"a copy of the same bytes: {fastest(copy, 2 * options.rounds) * 1e6:.1f} us")
        print(f"{'case':16} {options.revision:>12} {'this checkout':>14} {'ratio':>7}")
        for name, case in table.items():
            before, after = (arguments(k, arrays, case, no_flags) for k in (theirs, ours))
            theirs.general_units(*before)
            ours.general_units(*after)
            times = [(fastest(lambda: theirs.general_units(*before), 1), fastest(lambda: ours.general_units(*after), 1))
                     for _ in range(options.rounds)]
            t_before, t_after = min(t for t, _ in times), min(t for _, t in times)
            print(f"{name:16} {t_before * 1e6:9.1f} us {t_after * 1e6:11.1f} us {t_after / t_before:6.3f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
