"""``gae-xp COMMAND`` (also ``python -m gae_xp COMMAND``): the benchmarks. ``gae-xp --help`` lists the commands."""

from __future__ import annotations

import argparse
import os
import sys


def _prog() -> str:
    """How we were invoked: ``gae-xp`` (the console script) or ``python -m gae_xp``."""
    name = os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else ""
    return "python -m gae_xp" if name in ("__main__.py", "-m", "-c", "") else name


def build_parser(prog: str | None = None) -> argparse.ArgumentParser:
    from gae_xp.bench import adapters, cli, groups

    parser = argparse.ArgumentParser(
        prog=prog or _prog(),
        description="gae_xp's command line: benchmarks on the array libraries installed here.",
        epilog="'%(prog)s COMMAND --help' describes a command and its options.")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", title="commands")
    bench = cli.add_arguments(commands.add_parser(
        "bench", help="is GAE my bottleneck, and what should I set? gae_xp against the serial loop and the "
                      "alternatives, with a verdict per library", description=cli.DESCRIPTION))
    framework = adapters.add_arguments(commands.add_parser(
        "adapters", help=f"each framework adapter ({adapters.FRAMEWORKS}) against the framework's own function, on "
                         "torch", description=adapters.DESCRIPTION))
    for command in (bench, framework):
        command.add_argument("--groups", action="store_true",
                             help="then time the group-relative estimators as 'gae-xp groups' does (default: off)")
    groups.add_arguments(commands.add_parser(
        "groups", help="GRPO, RLOO, REINFORCE++ and TRL's block against verl's and TRL's code, at LLM-RL shapes",
        description=groups.DESCRIPTION))
    return parser


def main(argv: list[str] | None = None, prog: str | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser(prog)
    options = parser.parse_args(argv)
    if options.command is None:
        parser.print_usage(sys.stderr)
        print(f"{parser.prog}: a command is needed: bench, adapters or groups ({parser.prog} --help lists them)",
              file=sys.stderr)
        return 2
    from gae_xp.bench import groups

    if options.command == "groups":
        return groups.execute(options)
    if options.command == "bench":
        from gae_xp.bench import cli

        status = cli.execute(options, argv[1:], f"{parser.prog} bench")
    else:
        from gae_xp.bench import adapters

        status = adapters.execute(options)
    if status or not options.groups:
        return status
    return groups.execute(groups.add_arguments(argparse.ArgumentParser()).parse_args([]))


if __name__ == "__main__":
    sys.exit(main())
