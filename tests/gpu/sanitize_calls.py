"""Small calls of every kernel structure of both GPU routes, for compute-sanitizer (memcheck, racecheck).

``tests/gpu/check.sh`` runs this under ``compute-sanitizer --tool memcheck``
and ``--tool racecheck``. Each call runs on torch CUDA tensors with
``backend="triton"`` and ``backend="numba-cuda"`` (every option of ``gae()``,
packed sequences with host and device offsets, rows long enough for the
multi-block structures, the other estimators and the backward pass in
float32; the common structures in float16, bfloat16 and float64 too) and is
compared with the generic path in float64 on the host, on the same inputs (the
reference launches nothing on the GPU). Each line is printed as its call ends,
so a run stopped at its budget shows how far it got. A route that cannot load is reported and skipped; a call that
raises or differs is a failure (exit status 1). ``--dry-run``: the generic path
on NumPy arrays stands in for both routes (it checks this script on a CPU).
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np

ROUTES = ("triton", "numba-cuda")
#: Relative error allowed against float64, per dtype of the inputs.
TOLERANCE = {"float16": 2e-2, "bfloat16": 2e-2, "float32": 2e-5, "float64": 1e-10}
SHORT, LONG = (3, 40), (2, 9000)
#: The dtypes each shape runs in: every structure in float32, the calls below in the others.
DTYPES = {SHORT: ("float32", "float64", "float16", "bfloat16"), LONG: ("float32", "bfloat16")}
OTHER_DTYPE_CALLS = ("gae", "gae, terminated, truncated, next_values", "gae, mask", "vtrace")


def inputs(rng, shape) -> dict:
    """Per-step float64 arrays and flags for one call (NumPy)."""
    return {"rewards": rng.standard_normal(shape), "values": rng.standard_normal(shape),
            "next_values": rng.standard_normal(shape), "terminated": rng.random(shape) < 0.05,
            "truncated": rng.random(shape) < 0.05, "mask": rng.random(shape) >= 0.2,
            "gamma": rng.uniform(0.9, 1.0, shape), "lam": rng.uniform(0.8, 1.0, shape[:-1] + (1,)),
            "bootstrap_value": rng.standard_normal(shape[:-1]), "log_rhos": rng.normal(0, 0.5, shape)}


def calls(gae_xp, backend: str) -> dict:
    """name -> call(a) for every structure, ``a`` the arrays (``inputs``, converted) in the run's library and
    dtype."""
    def gae(**keywords):
        return lambda a: gae_xp.gae(a["rewards"], a["values"], backend=backend, **{
            k: (a[v] if isinstance(v, str) else v) for k, v in keywords.items()})

    def tiled(call):
        """``call`` with short rows sharing a program on the Triton route (``tuned(tile=1024)``: the last program's
        lanes past the last row read and write nothing); the other routes call it as it is."""
        if backend != "triton":
            return call

        def in_tiles(a):
            from gae_xp.backends import triton

            with triton.tuned(tile=1024):
                return call(a)

        return in_tiles

    return {
        "gae": gae(),
        "gae, bootstrap": gae(bootstrap_value="bootstrap_value"),
        "gae, terminated": gae(terminated="terminated"),
        "gae, terminated, truncated, next_values": gae(terminated="terminated", truncated="truncated",
                                                       next_values="next_values"),
        "gae, mask": gae(terminated="terminated", mask="mask"),
        "gae, mask, fill_masked": gae(mask="mask", fill_masked=True, bootstrap_value="bootstrap_value"),
        "gae, per-step gamma, per-row lam": gae(gamma="gamma", lam="lam", terminated="terminated"),
        "gae, critic_lam float": gae(critic_lam=1.0, terminated="terminated"),
        "gae, critic_lam per step": gae(critic_lam="gamma", mask="mask"),
        "gae, host cu_seqlens": gae(cu_seqlens="host_offsets", terminated="terminated"),
        "gae, device cu_seqlens": gae(cu_seqlens="device_offsets", mask="mask"),
        "gae, mask, bootstrap, short rows in tiles": tiled(gae(terminated="terminated", mask="mask",
                                                               bootstrap_value="bootstrap_value")),
        "vtrace": lambda a: gae_xp.vtrace(a["log_rhos"], a["rewards"], a["values"], terminated=a["terminated"],
                                          mask=a["mask"], backend=backend),
        "lambda_returns": lambda a: (gae_xp.lambda_returns(a["rewards"], a["next_values"],
                                                           terminated=a["terminated"], backend=backend),),
        "discounted_returns": lambda a: (gae_xp.discounted_returns(a["rewards"], terminated=a["terminated"],
                                                                   mask=a["mask"], backend=backend),),
        "discounted_cumsum, reverse": lambda a: (gae_xp.discounted_cumsum(a["rewards"], 0.9, backend=backend),),
        "discounted_cumsum, forward": lambda a: (gae_xp.discounted_cumsum(a["rewards"], 0.9, reverse=False,
                                                                          backend=backend),),
    }


def relative_error(got, want) -> float:
    got, want = np.asarray(got, dtype=np.float64), np.asarray(want, dtype=np.float64)
    return float(np.max(np.abs(got - want), initial=0.0)) / max(1.0, float(np.max(np.abs(want), initial=0.0)))


class Library:
    """torch tensors on ``device`` (CUDA on the GPU machine), or NumPy arrays for a dry run."""

    def __init__(self, dry_run: bool, device: str = "cuda"):
        self.dry_run, self.device = dry_run, device
        if not dry_run:
            import torch

            self.torch = torch

    def convert(self, arrays: dict, dtype: str) -> dict:
        out = {}
        for name, array in arrays.items():
            floating = array.dtype.kind == "f"
            if self.dry_run:
                out[name] = array.astype(dtype) if floating and dtype != "bfloat16" else array
            else:
                tensor = self.torch.as_tensor(array, device=self.device)
                out[name] = tensor.to(getattr(self.torch, dtype)) if floating else tensor
        length = arrays["rewards"].shape[-1]
        host = np.array([0, length // 3, length // 3, length])  # an empty sequence in the middle
        out["host_offsets"] = host
        out["device_offsets"] = host if self.dry_run else self.torch.as_tensor(host, device=self.device)
        return out

    def widen(self, given: dict) -> dict:
        """The same values in float64 on the host (the reference's inputs, the run's rounding included: the
        reference launches nothing on the GPU, so the sanitizer's time goes to the routes' kernels)."""
        if self.dry_run:
            return {k: v.astype(np.float64) if isinstance(v, np.ndarray) and v.dtype.kind == "f" else v
                    for k, v in given.items()}
        return {k: (v.double() if v.is_floating_point() else v).cpu() if isinstance(v, self.torch.Tensor) else v
                for k, v in given.items()}

    def to_numpy(self, array):
        if isinstance(array, np.ndarray):
            return array.astype(np.float64)
        return array.detach().double().cpu().numpy()

    def synchronize(self):
        if not self.dry_run and self.device == "cuda":
            self.torch.cuda.synchronize()


def backward(gae_xp, library: Library, a: dict, backend: str) -> list[str]:
    """The adjoint: gradients of sum(A) + sum(R) to rewards and values, the route's own backward kernels
    (``gae_backward``, what the custom operator launches) against torch autograd through the generic path on
    float64 host copies (torch only). A route without backward kernels (``"xp"``, the stand-in of a CPU run)
    takes autograd itself: tensors that require grad reach a route only through ``backend="auto"``."""
    if library.dry_run:
        return ["backward: skipped in a dry run (NumPy has no autograd)"]
    from gae_xp import _prepare, backends

    got = []
    for route, given in ((backend, a), ("xp", library.widen(a))):
        flags = {"terminated": given["terminated"], "mask": given["mask"]}
        kernels = backends.load(route)
        if hasattr(kernels, "gae_backward"):
            problem = _prepare.prepare(given["rewards"], given["values"], **flags, backend=route).problem
            ones = library.torch.ones_like(given["rewards"])
            gradients = kernels.gae_backward(problem, ones, ones)
            got.append(tuple(library.to_numpy(gradients[k]).reshape(given["rewards"].shape)
                             for k in ("rewards", "values")))
            continue
        r, v = (given[k].detach().clone().requires_grad_() for k in ("rewards", "values"))
        advantages, returns = gae_xp.gae(r, v, **flags, backend=route)
        (advantages.sum() + returns.sum()).backward()
        got.append((library.to_numpy(r.grad), library.to_numpy(v.grad)))
    error = max(relative_error(x, y) for x, y in zip(*got))
    return [f"backward (terminated, mask): max rel. error {error:.1e}"] if error <= 1e-4 else \
        [f"FAILED backward (terminated, mask): max rel. error {error:.1e}"]


def run_route(gae_xp, library: Library, backend: str, stand_in: str, shapes=(SHORT, LONG)):
    """Every call of ``backend`` (``stand_in`` the backend actually called: "xp" in a dry run), a line each as it
    ends: every structure in float32 at each of ``shapes`` (both by default; the CPU tests under Triton's
    interpreter take SHORT alone), the ``OTHER_DTYPE_CALLS`` in the other dtypes."""
    rng = np.random.default_rng(42)
    for shape in shapes:
        arrays = inputs(rng, shape)
        for dtype in DTYPES[shape]:
            if library.dry_run and dtype == "bfloat16":
                continue
            given = library.convert(arrays, dtype)
            widened = library.widen(given)
            for name, call in calls(gae_xp, stand_in).items():
                if dtype != "float32" and name not in OTHER_DTYPE_CALLS:
                    continue
                label = f"{backend} {shape[0]}x{shape[1]} {dtype} {name}"
                try:
                    got = call(given)
                    want = calls(gae_xp, "xp")[name](widened)
                    library.synchronize()
                    error = max(relative_error(library.to_numpy(x), library.to_numpy(y)) for x, y in zip(got, want))
                except Exception as failure:  # the route raised: a failure of this structure, the rest runs
                    yield f"FAILED {label}: {type(failure).__name__}: {str(failure).splitlines()[0][:160]}"
                    continue
                yield f"{'ok' if error <= TOLERANCE[dtype] else 'FAILED'} {label}: max rel. error {error:.1e}"
        for line in backward(gae_xp, library, library.convert(arrays, "float32"), stand_in):
            yield f"{line} ({backend} {shape[0]}x{shape[1]})"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--routes", default=",".join(ROUTES))
    parser.add_argument("--dry-run", action="store_true", help="NumPy and the generic path: checks this script")
    options = parser.parse_args(argv)
    import gae_xp

    library, failures, started = Library(options.dry_run), 0, time.perf_counter()
    for backend in options.routes.split(","):
        stand_in = "xp" if options.dry_run else backend
        if not options.dry_run:
            try:  # does the route load and run at all? (a route that cannot is reported, the other still runs)
                gae_xp.gae(library.torch.zeros((1, 4), device="cuda"), library.torch.zeros((1, 4), device="cuda"),
                           backend=backend)
            except Exception as error:  # absent route, a compiler that fails: said, not fatal
                print(f"route {backend}: not available ({type(error).__name__}: {str(error).splitlines()[0][:160]})")
                continue
        for line in run_route(gae_xp, library, backend, stand_in):
            failures += line.startswith("FAILED")
            print(line, flush=True)
    print(f"{failures} failed call(s) in {time.perf_counter() - started:.1f} s")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
