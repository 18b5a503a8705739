"""Every command and example the README and docs/*.md quote runs: each ```python block of docs/*.md (the README's
are tests/test_readme.py's), and each shell command line (``python -m ...``, ``python docs/...``, ``gae-xp ...``,
``bash ....sh``), in inline code, indented blocks or fenced ones.

A shell command is run as written, or in a stated quick form (``--help`` for a benchmark of minutes, a picture
written to a temporary file instead of the tracked one), or not run, with the reason (a GPU, the test suite
itself): ``COMMANDS`` says which, per command. A command quoted in the docs but missing from ``COMMANDS`` fails
``test_every_quoted_command_is_listed``, and so does an entry no document quotes any more.
"""

from __future__ import annotations

import ast
import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

#: A shell command: optional VAR=value prefixes, then a program this project ships or runs.
COMMAND = re.compile(r"((?:[A-Z][A-Z0-9_]*=\S+ )*(?:python3? -m [\w.]+|python3? "
                     r"(?:docs|examples|tests|asv_bench|tools)/\S+|gae-xp|bash \S+\.sh)(?: [^`\n]*)?)")


@dataclass(frozen=True)
class Run:
    """How a quoted command is tested: ``run`` (``{tmp}``: a temporary folder) or None (not run), and why."""

    run: str | None
    why: str = ""


def as_written(command: str) -> Run:
    return Run(command)


def its_help(command: str, why: str) -> Run:
    """The command's program with ``--help``: it exists and parses its options; what it measures is not run."""
    words = [word for word in shlex.split(command) if not re.fullmatch(r"[A-Z][A-Z0-9_]*=\S+", word)]
    if words[0] == "gae-xp":
        program = words[:2]  # with its subcommand: `gae-xp bench --help`
    elif words[:3] == ["python", "-m", "gae_xp"]:
        program = words[:4]
    elif words[:2] == ["python", "-m"]:
        program = words[:3]
    else:
        program = words[:2]  # python or bash, and the script
    return Run(shlex.join([*program, "--help"]), why)


def not_run(why: str) -> Run:
    return Run(None, why)


BENCHMARK = "a benchmark of minutes: its options are parsed here (--help), the bench's tests run it small"
BENCH_QUOTES = "a benchmark of minutes; tests/test_bench.py parses every quoted bench command and runs the bench small"

COMMANDS: dict[str, Run] = {
    # the main job and its variants
    "gae-xp bench": its_help("gae-xp bench", BENCH_QUOTES),
    "python -m gae_xp bench": its_help("gae-xp bench", BENCH_QUOTES),
    "gae-xp bench --help": as_written("gae-xp bench --help"),
    "gae-xp bench --groups": its_help("gae-xp bench", BENCH_QUOTES),
    "gae-xp bench --load": its_help("gae-xp bench", BENCH_QUOTES),
    "gae-xp bench --library numpy --B 8 --T 128 --profile":
        Run("gae-xp bench --library numpy --B 8 --T 128 --profile --repeat 1 --no-first-call --no-small-call",
            "as written, without the repeats, the first call and the small-call part (seconds instead of a minute)"),
    "gae-xp bench --library numpy --B 8 --T 128 --repeat 9": its_help("gae-xp bench", BENCH_QUOTES),
    "gae-xp bench --library numpy,torch --B 8 --T 128 --cases constant,dones+mask --profile":
        its_help("gae-xp bench", BENCH_QUOTES),
    "gae-xp bench --library numpy,torch --B 8 --T 131072 --cases constant,dones+mask --paths 'gae_xp[xp],gae_xp[numba]'"
    " --chunk-size auto --repeat 9 --no-first-call [--load]": its_help("gae-xp bench", BENCH_QUOTES),
    "gae-xp bench --library torch --B 16 --T 4096 --cases constant,dones+mask": its_help("gae-xp bench", BENCH_QUOTES),
    "python -m gae_xp bench --library numpy,torch --B 8 --T 131072 --cases constant,dones+mask --paths "
    "'gae_xp[xp],gae_xp[numba]' --chunk-size auto --repeat 9 --no-first-call --json gae_xp/bench/recorded.json":
        not_run("rewrites the tracked gae_xp/bench/recorded.json on this machine; tests/test_bench.py parses it"),
    "python -m gae_xp bench --library numpy,torch --B 8 --T 131072 --cases constant,dones+mask --paths "
    "'gae_xp[xp],gae_xp[numba]' --chunk-size auto --repeat 9 --no-first-call --load": its_help("gae-xp bench",
                                                                                              BENCH_QUOTES),
    "python -m gae_xp bench --library numpy,torch,jax --B 8 --T 128 --cases constant,dones+mask --chunk-size auto "
    "--repeat 9": its_help("gae-xp bench", BENCH_QUOTES),
    "python -m gae_xp bench --library numpy,torch,jax --B 8 --T 131072 --cases constant,dones+mask --repeat 9 "
    "--serial-budget 60 --no-first-call": its_help("gae-xp bench", BENCH_QUOTES),
    "gae-xp adapters": its_help("gae-xp adapters", BENCHMARK),
    "python -m gae_xp adapters": its_help("gae-xp adapters", BENCHMARK),
    "gae-xp groups": its_help("gae-xp groups", BENCHMARK),
    "gae-xp adapters --groups": its_help("gae-xp adapters", BENCHMARK),
    "python -m gae_xp.bench.groups": its_help("python -m gae_xp.bench.groups", BENCHMARK),
    "python -m gae_xp groups --repeat 9 --shapes 1024x16x512": its_help("gae-xp groups", BENCHMARK),
    # the other benchmarks
    "NUMBA_NUM_THREADS=1 python -m gae_xp.bench.scale packed": its_help("python -m gae_xp.bench.scale", BENCHMARK),
    "python -m gae_xp.bench.scale cp": its_help("python -m gae_xp.bench.scale", BENCHMARK),
    "python -m gae_xp.bench.scale cp-packed": its_help("python -m gae_xp.bench.scale", BENCHMARK),
    "python -m gae_xp.bench.scale dask-ooc --gib 4 --block-mib 64": its_help("python -m gae_xp.bench.scale",
                                                                             BENCHMARK),
    "python -m gae_xp.bench.scale dask-throughput": its_help("python -m gae_xp.bench.scale", BENCHMARK),
    "python -m gae_xp.bench.scale dask-graph": its_help("python -m gae_xp.bench.scale", BENCHMARK),
    "python -m gae_xp.bench.autograd": its_help("python -m gae_xp.bench.autograd", BENCHMARK),
    "python -m gae_xp.bench.load": its_help("python -m gae_xp.bench.load", BENCHMARK),
    "python -m gae_xp.bench.load --repeat 5": its_help("python -m gae_xp.bench.load", BENCHMARK),
    "python -m gae_xp.bench.load --repeat 7": its_help("python -m gae_xp.bench.load", BENCHMARK),
    "python -m gae_xp.bench.roofline": its_help("python -m gae_xp.bench.roofline", BENCHMARK),
    "python -m gae_xp.bench.small_calls": its_help("python -m gae_xp.bench.small_calls", BENCHMARK),
    "python -m gae_xp.bench.host_path": its_help("python -m gae_xp.bench.host_path",
                                                 "a benchmark of a minute; tests/test_triton_plan.py runs it small"),
    "python -m gae_xp.bench.small_calls --calls N": its_help("python -m gae_xp.bench.small_calls",
                                                             "a template (N calls) of a callgrind harness"),
    "python -m gae_xp.bench.small_calls --first-call": its_help("python -m gae_xp.bench.small_calls", BENCHMARK),
    "python -m gae_xp.bench.small_calls --ratio": its_help("python -m gae_xp.bench.small_calls", BENCHMARK),
    "python -m gae_xp.bench.turns": its_help("python -m gae_xp.bench.turns", BENCHMARK),
    "python -m gae_xp.bench.scale": its_help("python -m gae_xp.bench.scale", BENCHMARK),
    "python -m tools.traffic --write": its_help("python -m tools.traffic", "rewrites the tracked pages: "
                                                "tests/test_traffic.py regenerates them and checks they match"),
    "python -m tools.traffic": its_help("python -m tools.traffic", "tests/test_traffic.py runs the model and "
                                        "checks the pages it writes (it needs the CUDA toolkit wheels)"),
    "python -m tools.cost_model --write": its_help("python -m tools.cost_model", "rewrites docs/gpu.md's tables: "
                                                   "tests/test_cost_model.py regenerates them and checks they match"),
    "python -m tools.cost_model": its_help("python -m tools.cost_model", "tests/test_cost_model.py fits the model "
                                           "and checks the page (it needs triton and the CUDA toolkit wheels)"),
    "python tests/gpu/report_check.py summary docs/gpu_runs/2026-12-06-h100":
        as_written("python tests/gpu/report_check.py summary docs/gpu_runs/2026-12-06-h100"),
    "python tests/gpu/report_check.py docs $OUT --write docs/gpu.md":
        its_help("python tests/gpu/report_check.py", "reads a GPU check's outputs ($OUT): tests/test_gpu_check.py "
                 "runs it on a dry run's"),
    "python tests/conformance/float32_accuracy.py": its_help("python tests/conformance/float32_accuracy.py",
                                                             BENCHMARK),
    "NUMBA_NUM_THREADS=1 python docs/kernel_ab.py 71b2c04 --rows R --length T --rounds N":
        its_help("python docs/kernel_ab.py", "a template (R, T, N) that builds an old commit's kernels from git"),
    "NUMBA_NUM_THREADS=1 python docs/kernel_ab.py 26511e0":
        its_help("python docs/kernel_ab.py", "builds an old commit's kernels from git and times them (minutes)"),
    # the docs' generators
    "python docs/gpu_tables.py <table>": Run("python docs/gpu_tables.py --help", "a template: the tables' names"),
    "python docs/gpu_tables.py groups": as_written("python docs/gpu_tables.py groups"),
    "python docs/gpu_tables.py launch full": its_help("python docs/gpu_tables.py", "timings of minutes"),
    "python docs/architecture_figure.py": Run("python docs/architecture_figure.py {tmp}/architecture.png",
                                              "as written it redraws the tracked docs/architecture.png"),
    "python docs/scale_figure.py": Run("python docs/scale_figure.py {tmp}/scale.png",
                                       "as written it redraws the tracked docs/scale.png"),
    "bash docs/figures.sh": not_run("reruns every benchmark and redraws every tracked figure (an hour)"),
    "python -m sphinx -W --keep-going -b html docs docs/_build/html":
        not_run("builds the docs site (the docs extra; CI builds it)"),
    # the examples
    "python examples/ppo_cartpole.py": its_help("python examples/ppo_cartpole.py",
                                                "trains for minutes; tests/test_examples.py runs its --smoke form"),
    "python examples/ppo_cartpole.py --plot docs/ppo_cartpole.png":
        its_help("python examples/ppo_cartpole.py", "trains for minutes and redraws the tracked picture"),
    # the tests and CI
    "python -m pytest": not_run("the test suite itself"),
    "python -m pytest -n 2": not_run("the test suite itself"),
    'GAE_XP_HYPOTHESIS_PROFILE=full python -m pytest -n 2 -m "slow or hypothesis"':
        not_run("the test suite itself (the full matrix)"),
    "NUMBA_ENABLE_CUDASIM=1 GAE_XP_HYPOTHESIS_PROFILE=simulator python -m pytest -n 2 -m cudasim "
    "tests/test_cuda_sim.py tests/test_cuda_lean.py tests/test_hardening.py tests/test_hardening4.py "
    "tests/test_masked_extremes.py tests/test_gpu_baselines.py tests/test_autograd.py":
        not_run("the test suite itself (its CUDA simulator part)"),
    "NUMBA_ENABLE_CUDASIM=1 python -m pytest -m cudasim tests/test_cuda_sim.py tests/test_hardening.py "
    "tests/test_masked_extremes.py tests/test_gpu_baselines.py tests/test_autograd.py":
        not_run("the test suite itself (its CUDA simulator part)"),
    "bash tests/gpu/check.sh": not_run("needs an NVIDIA GPU"),
    "python tests/triton_ptx.py": not_run("tests/test_triton_ptx.py runs it (needs triton, without TRITON_INTERPRET)"),
    "bash asv_bench/smoke.sh": not_run("asv builds its own environments (minutes, a package registry); CI runs it"),
    "bash asv_bench/compare.sh main HEAD": not_run("asv over two commits in fresh environments (tens of minutes)"),
    "bash asv_bench/history.sh COMMIT...": not_run("a template: asv over a list of commits (hours)"),
    "python asv_bench/offline_html.py docs/asv ../asv-npm/node_modules /tmp/asv-offline":
        not_run("needs asv's web assets installed with npm"),
    "python asv_bench/screenshot.py /tmp/asv-offline docs/asv.png":
        not_run("needs a headless browser and the offline asv pages, and redraws the tracked docs/asv.png"),
}


#: What a command's script imports beyond the base install (skipped without it).
NEEDS = {"ppo_cartpole.py": ("torch", "gymnasium"), "_figure.py": ("matplotlib",), "gpu_tables.py": ("torch",)}


def _normalised(command: str) -> str:
    """A quoted command without its trailing comment and with single spaces."""
    return " ".join(re.split(r"\s+#\s", command)[0].split())


def _code_texts(text: str) -> list[str]:
    """The text of every inline code span, indented block line and fenced line (continuation lines joined)."""
    joined = re.sub(r"\\\n\s*", "", text)
    # an inline span may wrap onto the next line; fenced blocks are left out of the spans' search
    spans = [" ".join(span.split()) for span in re.findall(r"`([^`]+)`", re.sub(r"```.*?```", "", joined, flags=re.S))]
    indented = [line.strip() for line in joined.splitlines() if line.startswith(("    ", "\t"))]
    fenced = [line for block in re.findall(r"```[a-z]*\n(.*?)```", joined, re.S) for line in block.splitlines()]
    return spans + indented + fenced


def quoted_commands() -> dict[str, list[str]]:
    """Every shell command the documents quote: {command: the documents that quote it}."""
    found: dict[str, list[str]] = {}
    for path in DOCUMENTS:
        for code in _code_texts(path.read_text()):
            for match in COMMAND.finditer(code):
                where = found.setdefault(_normalised(match.group(1)), [])
                if path.relative_to(ROOT).as_posix() not in where:
                    where.append(path.relative_to(ROOT).as_posix())
    return found


def test_every_quoted_command_is_listed():
    quoted = quoted_commands()
    unlisted = sorted(set(quoted) - set(COMMANDS))
    assert not unlisted, f"list each in COMMANDS (as written, a quick form, or not run and why): {unlisted}"
    stale = sorted(set(COMMANDS) - set(quoted))
    assert not stale, f"no document quotes these any more: {stale}"
    assert all(rule.run is not None or rule.why for rule in COMMANDS.values())


def _shell(command: str, tmp_path: Path) -> str:
    """``command`` for bash, with this interpreter for ``python`` and ``gae-xp``."""
    command = command.replace("{tmp}", str(tmp_path))
    python = shlex.quote(sys.executable)
    command = re.sub(r"(^|\s)python3?(?=\s)", rf"\g<1>{python}", command)
    return re.sub(r"(^|\s)gae-xp(?=\s)", rf"\g<1>{python} -m gae_xp", command)


@pytest.mark.parametrize("quoted", sorted(quoted for quoted, rule in COMMANDS.items() if rule.run is None))
def test_a_command_not_run_says_why(quoted):
    assert len(COMMANDS[quoted].why) > 10
    pytest.skip(COMMANDS[quoted].why)


#: What the quoted commands run, each once (several quotes share a quick form: `gae-xp bench --help`).
RUNS = sorted({rule.run for rule in COMMANDS.values() if rule.run is not None})


@pytest.mark.parametrize("run", RUNS)
def test_a_quoted_command_runs(run, tmp_path):
    for script, modules in NEEDS.items():
        if script in run:
            for module in modules:
                pytest.importorskip(module)
    done = subprocess.run(["bash", "-c", _shell(run, tmp_path)], cwd=ROOT, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, (run, done.stdout[-2000:], done.stderr[-4000:])
    assert done.stdout.strip() or list(tmp_path.iterdir()), f"{run} printed and wrote nothing"


# ---------------------------------------------------------------------------------------------------- examples

#: Blocks that are parts of a program (a framework's trainer, names defined above them): their imports run, and
#: the functions they call are run by their modules' doctests (tests/test_docs.py). Keyed by document and first line.
FRAGMENTS = {
    ("docs/frameworks.md", "# from realhf.impl.model.utils.ppo_functional import pygae1d_nolp_misalign, "
                           "cugae1d_nolp_misalign_func"): "AReaL's import lines, replaced",
    ("docs/frameworks.md", "# the loop after the rollout in cleanrl/ppo.py and ppo_continuous_action.py"):
        "CleanRL's trainer: rewards, dones, args are its",
    ("docs/frameworks.md", "# step 6 of PPOTrainer.train (trl/experimental/ppo/ppo_trainer.py)"):
        "TRL's trainer: rewards, args are its",
    ("docs/frameworks.md", "# the end of compute_advantages_and_returns "
                           "(openrlhf/trainer/ppo_utils/experience_maker.py)"):
        "OpenRLHF's trainer: experiences, args are its",
    ("docs/frameworks.md", "# verl/trainer/ppo/core_algos.py: the registered estimators, called as verl's trainer "
                           "calls them"): "verl's, TRL's and OpenRLHF's trainers: data, config, args are theirs",
}


#: Blocks of 15-30 s on a 2-core CPU (4 processes or devices, half a GiB): run with the full matrix (-m slow).
SLOW_BLOCKS = {("docs/scale.md", "import dask.array as da, gae_xp"), ("docs/scale.md", "import os"),
               ("docs/scale.md", "# torchrun --nproc-per-node 4 cp.py      (gloo on CPU; the same code runs on NCCL "
                                 "with CUDA tensors)")}


def python_blocks() -> list[tuple[str, str]]:
    """(document, block) for every ```python block of docs/*.md."""
    return [(path.relative_to(ROOT).as_posix(), block) for path in DOCUMENTS if path.name != "README.md"
            for block in re.findall(r"```python\n(.*?)```", path.read_text(), re.S)]


def _block_id(document: str, block: str) -> str:
    return f"{document}: {block.splitlines()[0][:60]}"


def _promised(block: str) -> str:
    """The output a block promises: its trailing lines that start with '# '."""
    lines = block.rstrip("\n").split("\n")
    promised = []
    while lines and lines[-1].startswith("# "):
        promised.insert(0, lines.pop()[2:])
    return "\n".join(promised)


def test_every_fragment_and_slow_block_is_still_quoted():
    keys = {(document, block.splitlines()[0]) for document, block in python_blocks()}
    assert not (set(FRAGMENTS) | SLOW_BLOCKS) - keys, sorted((set(FRAGMENTS) | SLOW_BLOCKS) - keys)


def _needs(block: str) -> None:
    """Skip, with the reason, a block whose libraries or hardware are not here."""
    imported = {alias.name.split(".")[0] for node in ast.walk(ast.parse(block))
                if isinstance(node, (ast.Import, ast.ImportFrom)) for alias in getattr(node, "names", [])}
    imported |= {node.module.split(".")[0] for node in ast.walk(ast.parse(block))
                 if isinstance(node, ast.ImportFrom) and node.module}
    if "cupy" in imported:
        cupy = pytest.importorskip("cupy", reason="needs an NVIDIA GPU and CuPy")
        try:
            cupy.cuda.runtime.getDeviceCount()
        except Exception as error:  # noqa: BLE001 (CuPy raises its own runtime error class without a GPU)
            pytest.skip(f"needs an NVIDIA GPU: {error}")
    for module in sorted(imported & {"torch", "jax", "dask"}):
        pytest.importorskip(module)


@pytest.mark.parametrize(("document", "block"), [
    pytest.param(d, b, id=_block_id(d, b), marks=[pytest.mark.slow] if (d, b.splitlines()[0]) in SLOW_BLOCKS else [])
    for d, b in python_blocks()])
def test_a_docs_example_runs_as_written(document, block, tmp_path):
    _needs(block)
    first = block.splitlines()[0]
    if (document, first) in FRAGMENTS:
        imports = [node for node in ast.parse(block).body if isinstance(node, (ast.Import, ast.ImportFrom))]
        assert imports, "a fragment without imports tests nothing: run it, or leave it out of FRAGMENTS"
        code = ast.unparse(ast.Module(body=imports, type_ignores=[]))
    else:
        code = block
    script = tmp_path / "example.py"
    script.write_text(code)
    command = [sys.executable, str(script)]
    launcher = re.match(r"# torchrun --nproc-per-node (\d+) ", first)
    if launcher:
        command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
                   launcher.group(1), str(script)]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    done = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=600, env=env)
    assert done.returncode == 0, done.stderr[-4000:]
    if (document, first) not in FRAGMENTS and _promised(block):
        assert done.stdout.strip() == _promised(block).strip()
