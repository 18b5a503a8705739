"""``python -m gae_xp.bench.host_path``: the host's part of a repeated ``gae(..., backend="triton")`` call, stage
by stage, on a machine without a GPU.

    python -m gae_xp.bench.host_path [--B 38400] [--T 128] [--cases constant,bootstrap,dones+mask]
                                     [--number 2000] [--repeat 9]

A trainer calls ``gae()`` on the same layout every step, and at its shapes
(38400x128 float32) the host's time per eager call is as long as the
kernel's. This measures that time where no GPU is: torch CPU tensors stand
in for CUDA ones, the Triton route serves them (``TRITON_INTERPRET=1`` is
set for this process, before triton is imported), and they are keyed as
CUDA tensors are (by their layout, without the NumPy view that a CPU
tensor's key takes). The kernel is never run. In its place:

* ``no-op``: a launcher that does nothing: the project's own part of the call;
* ``binder``: Triton's own launcher, ``JITFunction.run``, built for the
  kernel against a stand-in driver (an sm_90 target, device 0, stream 0),
  whose compile returns a stand-in compiled kernel whose ``run`` does
  nothing: Triton's argument binder, specialisation and cache lookup are
  measured, the driver's launch is not;
* ``direct``: the direct launch (the default; ``GAE_XP_TRITON_LAUNCH=binder``
  turns it off), the stand-in compiled kernel's ``run`` called with the
  plan's arguments.

Stages, each timed alone on the plan of the case's layout: the key of the
call (``gae_xp._plans.gae_key``), the plan's lookup (``PLANS.get``), the
two outputs' allocation (``torch.empty``), the argument packing (the
caller's tensors in the kernel's slots, the bootstrap value), and each
launch; then whole calls of ``gae_xp.gae`` with each launch. For scale, the
checks and layout of a first call (``gae_xp._prepare.prepare``), which a
plan-served call skips. Each figure is the median of ``--repeat`` batches of
``--number`` calls, in microseconds per call, timed by the calling thread's
CPU clock (``time.thread_time``: the time the thread ran, not the time it
waited for a core, so a busy machine changes it less than wall time; the
load average is printed with the CPU before and after). A stage timed alone
has its code and data in cache, so the stages add up to a little less than
the whole call. docs/gpu.md ("Host path") has the figures.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import platform
import statistics
import sys
import time

#: case -> the options of its calls, beyond rewards and values (gamma 0.99, lam 0.95).
CASES = ("constant", "bootstrap", "dones+mask")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m gae_xp.bench.host_path",
                                     description="The host's part of a repeated gae(..., backend='triton') call, "
                                                 "stage by stage, on a machine without a GPU (torch CPU tensors "
                                                 "stand in for CUDA ones; the kernel is never run).",
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--B", type=int, default=38400, help="rows (the batch)")
    parser.add_argument("--T", type=int, default=128, help="steps per row")
    parser.add_argument("--cases", default=",".join(CASES), help=f"from {', '.join(CASES)}")
    parser.add_argument("--number", type=int, default=2000, help="calls per batch")
    parser.add_argument("--repeat", type=int, default=9, help="batches; the median is kept")
    return parser


def cpu() -> str:
    """The CPU's model name and the load average, as the figures were taken."""
    name = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as info:
            name = next(line.split(":", 1)[1].strip() for line in info if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    load = ", ".join(f"{value:.2f}" for value in os.getloadavg()) if hasattr(os, "getloadavg") else "unknown"
    return f"{name}, {os.cpu_count()} CPUs, load average {load}"


class StandIns:
    """The kernel's launchers without a GPU: ``noop``, ``binder`` (Triton's ``JITFunction.run`` on a stand-in
    driver) and the stand-in compiled kernel that the binder returns (``Compiled``)."""

    def __init__(self):
        import triton
        from triton.backends.compiler import GPUTarget
        from triton.runtime.jit import JITFunction

        from gae_xp.backends import _triton_gae

        class Driver:
            def get_current_device(self):
                return 0

            def get_current_stream(self, device):
                return 0

            def get_current_target(self):
                return GPUTarget("cuda", 90, 32)

        class Compiled:
            """A compiled kernel whose launch does nothing (``fill``: it writes ``nbytes`` zeros to each output, a
            tensor or an address, so that the direct launch's one check against the binder sees the same
            results)."""

            function, packed_metadata, fill, nbytes = 0, (), False, 0

            def launch_metadata(self, grid, stream, *args):
                return None

            def run(self, grid_x, grid_y, grid_z, stream, function, metadata, launch_metadata, enter, leave, *args):
                if Compiled.fill:
                    for output in args[12:14]:
                        ctypes.memset(output if type(output) is int else output.data_ptr(), 0, Compiled.nbytes)

        self.previous_driver = triton.runtime.driver._active
        triton.runtime.driver.set_active(Driver())
        binder = JITFunction(_triton_gae.gae_kernel.fn, do_not_specialize=_triton_gae._RUNTIME)

        def compile_(key, signature, device, constexprs, options, attrs, warmup):
            binder.device_caches[device][0][key] = kernel = Compiled()
            return kernel

        binder._do_compile = compile_
        self.binder, self.compiled = binder, Compiled

    def close(self) -> None:
        """Triton's driver back as it was."""
        import triton

        triton.runtime.driver._active = self.previous_driver

    class _Noop:
        def __getitem__(self, grid):
            return self._launch

        @staticmethod
        def _launch(*args, **kwargs):
            return None

    noop = _Noop()


def case_arguments(case: str, shape) -> dict:
    import torch

    generator = torch.Generator().manual_seed(0)
    arguments = {"rewards": torch.randn(shape, generator=generator), "values": torch.randn(shape, generator=generator),
                 "gamma": 0.99, "lam": 0.95}
    if case in ("bootstrap", "dones+mask"):
        arguments["bootstrap_value"] = torch.randn(shape[:-1], generator=generator)
    if case == "dones+mask":
        arguments["terminated"] = torch.rand(shape, generator=generator) < 0.01
        arguments["mask"] = torch.rand(shape, generator=generator) >= 0.2
    return arguments


def timed(function, number: int, repeat: int) -> float:
    """Median microseconds per call of ``function()`` over ``repeat`` batches of ``number`` calls, by the calling
    thread's CPU clock."""
    for _ in range(min(number, 100)):
        function()
    batches = []
    for _ in range(repeat):
        start = time.thread_time()
        for _ in range(number):
            function()
        batches.append((time.thread_time() - start) / number * 1e6)
    return statistics.median(batches)


def measure(case: str, shape, stand_ins: StandIns, number: int, repeat: int) -> list[tuple[str, float]]:
    """(stage, us per call) of one case."""
    import gae_xp
    from gae_xp import _plans, _prepare
    from gae_xp.backends import _triton_launch, _triton_plan

    arguments = case_arguments(case, shape)
    given = {name: arguments.get(name) for name in ("rewards", "values", "gamma", "lam", "bootstrap_value")}
    flags = {name: arguments.get(name) for name in ("terminated", "mask")}
    key_arguments = (*given.values(), None, flags["terminated"], None, flags["mask"], -1, None, "triton", False, None,
                     None, "next_values")

    def call():
        return gae_xp.gae(**arguments, backend="triton")

    _triton_launch.gae_kernel = stand_ins.binder
    before = _triton_plan.launch_mode("binder")  # the binder's rows time the binder, whatever the default
    call()
    key, _ = _plans.gae_key(*key_arguments)
    plan = _plans.PLANS.get(key)
    if not isinstance(plan, _triton_plan.TritonPlan):
        raise RuntimeError(f"the {case} case is not served by a Triton plan here ({type(plan).__name__})")
    r, v, b = given["rewards"], given["values"], given["bootstrap_value"]
    outputs = plan.outputs(r)
    packed = plan.pack(r, v, b, None, flags["terminated"], None, flags["mask"], *outputs)
    rows = [("the first call's checks and layout (_prepare.prepare; a plan skips them)",
             timed(lambda: _prepare.prepare(**arguments, backend="triton"), max(1, number // 4), repeat)),
            ("key (_plans.gae_key)", timed(lambda: _plans.gae_key(*key_arguments), number, repeat)),
            ("plan lookup (PLANS.get)", timed(lambda: _plans.PLANS.get(key), number, repeat)),
            ("output allocation (two torch.empty)", timed(lambda: plan.outputs(r), number, repeat)),
            ("argument packing (slots, bootstrap)",
             timed(lambda: plan.pack(r, v, b, None, flags["terminated"], None, flags["mask"], *outputs), number,
                   repeat)),
            ("launch: Triton's binder (stand-in driver)", timed(lambda: plan.binder(packed), number, repeat))]
    _triton_plan.launch_mode("direct")
    try:
        stand_ins.compiled.fill, stand_ins.compiled.nbytes = True, r.numel() * r.element_size()
        call()  # the plan's first direct launch: the compiled kernel taken, checked against the binder
        stand_ins.compiled.fill = False
        if _triton_plan.direct_refused() is not None:
            raise RuntimeError(f"the direct launch was refused: {_triton_plan.direct_refused()}")
        launches = next(iter(plan.kernels.values()))[1]
        addresses = _triton_plan._as_addresses(packed)
        rows.append(("the arrays' addresses (_as_addresses)",
                     timed(lambda: _triton_plan._as_addresses(packed), number, repeat)))
        rows.append(("launch: direct (the compiled kernel's run, on addresses)",
                     timed(lambda: plan.run_compiled(addresses, launches), number, repeat)))
        rows.append(("whole call, direct launch", timed(call, number, repeat)))
        _triton_plan.launch_mode("binder")
        rows.append(("whole call, Triton's binder", timed(call, number, repeat)))
    finally:
        _triton_plan.launch_mode(before)
    _triton_launch.gae_kernel = stand_ins.noop
    rows.append(("whole call, launch a no-op (the project's own part)", timed(call, number, repeat)))
    return rows


def main(argv=None) -> int:
    options = build_parser().parse_args(argv)
    cases = [case.strip() for case in options.cases.split(",") if case.strip()]
    unknown = [case for case in cases if case not in CASES]
    if unknown:
        raise SystemExit(f"unknown case {', '.join(unknown)}: choose from {', '.join(CASES)}")
    if "triton" in sys.modules and not sys.modules["triton"].knobs.runtime.interpret:
        raise SystemExit("triton was imported without TRITON_INTERPRET=1: the Triton route would not take CPU tensors")
    os.environ["TRITON_INTERPRET"] = "1"
    import torch

    from gae_xp import _plans
    from gae_xp.backends import _triton_launch

    shape = (options.B, options.T)
    stand_ins = StandIns()
    kernel = _triton_launch.gae_kernel
    _plans._torch_tensor()
    without_numpy = _plans._TORCH.without_numpy
    _plans._TORCH.without_numpy = without_numpy | {torch.float32}  # keyed as a CUDA tensor: no NumPy view
    print(f"host path of a repeated gae(..., backend='triton') at {shape[0]}x{shape[1]} float32, torch CPU tensors "
          f"standing in for CUDA ones, the kernel never run; us per call, the median of {options.repeat} batches of "
          f"{options.number} calls, by the thread's CPU clock\nCPU: {cpu()}")
    for _ in range(10):  # the CPU allocator warmed: glibc's malloc takes such blocks from its heap once one is freed
        torch.empty(shape), torch.empty(shape)
    try:
        for case in cases:
            print(f"\n{case}:")
            for stage, microseconds in measure(case, shape, stand_ins, options.number, options.repeat):
                print(f"  {microseconds:8.1f}  {stage}")
    finally:
        _triton_launch.gae_kernel = kernel
        stand_ins.close()
        _plans._TORCH.without_numpy = without_numpy
        _plans.PLANS.clear()
    print(f"\nCPU after: {cpu()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
