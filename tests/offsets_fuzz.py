"""Random and hostile cu_seqlens on every torch CPU kernel path, run as a script by ``test_hardening3`` in a process
of its own, so that a crash (a kernel reading or writing outside its arrays) fails that test instead of the run.

``python tests/offsets_fuzz.py CASES SEED [--compile]``: each case draws T and offsets (valid ones, and ones that
are not monotone, do not start at 0, do not end at T, reach beyond T, are negative or huge) and runs every path:
the operator's forward and backward called directly, and, with ``--compile``, ``gae``, its gradient, the generic
path (``backend="xp"``), a ``lam`` that requires grad, ``critic_lam`` and the estimators under
``torch.compile(fullgraph=True)``. Valid offsets must give the float64 per-sequence loop of
``gae_xp.reference``; others the ValueError that names cu_seqlens. Prints ``ok N`` at the end.
"""

from __future__ import annotations

import sys

import numpy as np
import torch

import gae_xp
from gae_xp import reference
from gae_xp.backends import torch_ops

GAMMA, LAM, CRITIC_LAM = 0.9, 0.8, 0.6


def hostile_offsets(rng, length: int) -> list[int]:
    """Offsets of 3 entries (one compiled graph for them all): valid about one time in three."""
    kind = rng.integers(8)
    middle = int(rng.integers(0, length + 1))
    return [
        [0, middle, length],                                   # valid
        [0, length, middle - 1 if middle else -1],             # not monotone, not ending at T
        [int(rng.integers(1, 5)), middle, length],             # not starting at 0
        [0, middle, max(length - int(rng.integers(1, 4)), 0) if length else 1],  # ends before T (or after)
        [0, middle, length + int(rng.integers(1, 1000))],      # beyond T
        [0, -int(rng.integers(1, 1 << 20)), length],           # negative
        [0, 1 << 40, length],                                  # huge
        [0, min(middle, length), length],                      # valid again
    ][kind]


def is_valid(offsets, length: int) -> bool:
    return offsets[0] == 0 and offsets[-1] == length and all(a <= b for a, b in zip(offsets, offsets[1:]))


def per_sequence(loop, offsets, *arrays, **options):
    """The float64 loop on each sequence of a 1-D row, concatenated (bootstrap 0 after each)."""
    pieces = [loop(*(np.asarray(a, dtype=np.float64)[lo:hi] for a in arrays), **options)
              for lo, hi in zip(offsets, offsets[1:])]
    if isinstance(pieces[0], tuple):
        return tuple(np.concatenate([p[i] for p in pieces]) for i in range(len(pieces[0])))
    return np.concatenate(pieces)


def paths(compiled: bool):
    """name -> (function of (r, v, cu), its float64 reference of (r, v, offsets))."""
    def operator_forward(r, v, cu):
        problem = gae_xp._prepare.prepare(r, v, gamma=GAMMA, lam=LAM).problem
        arguments = dict(zip(torch_ops.INPUTS, torch_ops.operator_arguments(problem)))
        arguments["offsets"], arguments["bootstrap"] = cu, torch.zeros(cu.shape[0] - 1, dtype=r.dtype)
        return torch_ops.gae(*(arguments[name] for name in torch_ops.INPUTS))

    def operator_backward(r, v, cu):
        problem = gae_xp._prepare.prepare(r, v, gamma=GAMMA, lam=LAM).problem
        arguments = dict(zip(torch_ops.INPUTS, torch_ops.operator_arguments(problem)))
        arguments["offsets"], arguments["bootstrap"] = cu, torch.zeros(cu.shape[0] - 1, dtype=r.dtype)
        ones = torch.ones_like(r)
        return torch_ops.gae_backward(ones, ones * 0, *(arguments[name] for name in torch_ops.INPUTS))[0]

    def gae_reference(r, v, offsets, **options):
        return per_sequence(reference.gae_loop, offsets, r, v, gamma=GAMMA, lam=LAM, **options)

    def gradient_reference(r, v, offsets):  # d(sum A)/dr_t = sum over s <= t in t's sequence of (gamma lam)^(t-s)
        grad = np.zeros(len(r))
        for lo, hi in zip(offsets, offsets[1:]):
            for t in range(lo, hi):
                grad[t] = sum((GAMMA * LAM) ** (t - s) for s in range(lo, t + 1))
        return grad

    found = {"operator forward": (operator_forward, gae_reference),
             "operator backward": (operator_backward, gradient_reference)}
    if not compiled:
        return found

    def compile_(function):
        return torch.compile(function, fullgraph=True, dynamic=True)

    compiled_gae = compile_(lambda r, v, cu: gae_xp.gae(r, v, gamma=GAMMA, lam=LAM, cu_seqlens=cu))

    def gradient(r, v, cu):  # the compiled forward; autograd runs its compiled backward graph
        r = r.detach().requires_grad_(True)
        compiled_gae(r, v, cu)[0].sum().backward()
        return r.grad

    compiled_lam = compile_(lambda r, v, cu, lam: gae_xp.gae(r, v, gamma=GAMMA, lam=lam, cu_seqlens=cu))

    def lam_gradient(r, v, cu):
        return compiled_lam(r, v, cu, torch.full_like(r, LAM).requires_grad_(True))

    found.update({
        "gae": (compile_(lambda r, v, cu: gae_xp.gae(r, v, gamma=GAMMA, lam=LAM, cu_seqlens=cu)), gae_reference),
        "gae, gradient": (gradient, gradient_reference),
        "generic path": (compile_(lambda r, v, cu: gae_xp.gae(r, v, gamma=GAMMA, lam=LAM, cu_seqlens=cu,
                                                              backend="xp")), gae_reference),
        "lam requires grad": (lam_gradient, gae_reference),
        "critic_lam": (compile_(lambda r, v, cu: gae_xp.gae(r, v, gamma=GAMMA, lam=LAM, critic_lam=CRITIC_LAM,
                                                            cu_seqlens=cu)),
                       lambda r, v, o: gae_reference(r, v, o, critic_lam=CRITIC_LAM)),
        "discounted_returns": (compile_(lambda r, v, cu: gae_xp.discounted_returns(r, gamma=GAMMA, cu_seqlens=cu)),
                               lambda r, v, o: per_sequence(reference.discounted_returns_loop, o, r, gamma=GAMMA)),
        "lambda_returns": (compile_(lambda r, v, cu: gae_xp.lambda_returns(r, v, gamma=GAMMA, lam=LAM,
                                                                           cu_seqlens=cu)),
                           lambda r, v, o: per_sequence(reference.lambda_returns_loop, o, r, v, gamma=GAMMA,
                                                        lam=LAM)),
    })
    return found


def main(cases: int, seed: int, compiled: bool) -> None:
    rng = np.random.default_rng(seed)
    runs = paths(compiled)
    checked = 0
    for _ in range(cases):
        # two lengths: the generic scan unrolls its chunk (min(16, T) steps) and the carries between chunks
        # (ceil(T / 16) of them, up to 16), so under torch.compile each T of a different chunk count is a graph of
        # its own, and dynamo stops at 8 per function; the offsets are the hostile part, their values no new graph
        length = int(rng.choice([23, 37]))
        offsets = hostile_offsets(rng, length)
        r = torch.from_numpy(rng.standard_normal(length))
        v = torch.from_numpy(rng.standard_normal(length))
        cu = torch.tensor(offsets, dtype=torch.int64)
        for name, (run, want) in runs.items():
            if is_valid(offsets, length):
                got = run(r, v, cu)
                got = got if isinstance(got, tuple) else (got,)
                expected = want(r.numpy(), v.numpy(), offsets)
                expected = expected if isinstance(expected, tuple) else (expected,)
                for out, ref in zip(got, expected):
                    np.testing.assert_allclose(out.detach().numpy(), ref, rtol=1e-9, atol=1e-9, err_msg=name)
            else:
                try:
                    run(r, v, cu)
                except ValueError as error:
                    assert "cu_seqlens" in str(error), (name, offsets, error)
                else:
                    raise AssertionError(f"{name}: offsets {offsets} for T={length} gave no ValueError")
            checked += 1
        print("case", offsets, "T =", length, flush=True)
    print("ok", checked)


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]), "--compile" in sys.argv[3:])
