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
    from gae_xp.bench import adapters, cli

    parser = argparse.ArgumentParser(
        prog=prog or _prog(),
        description="gae_xp's command line: benchmarks on the array libraries installed here.",
        epilog="'%(prog)s COMMAND --help' describes a command and its options.")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", title="commands")
    cli.add_arguments(commands.add_parser(
        "bench", help="is GAE my bottleneck, and what should I set? gae_xp against the serial loop and the "
                      "alternatives, with a verdict per library", description=cli.DESCRIPTION))
    adapters.add_arguments(commands.add_parser(
        "adapters", help=f"each framework adapter ({adapters.FRAMEWORKS}) against the framework's own function, on "
                         "torch", description=adapters.DESCRIPTION))
    return parser


def main(argv: list[str] | None = None, prog: str | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser(prog)
    options = parser.parse_args(argv)
    if options.command is None:
        parser.print_usage(sys.stderr)
        print(f"{parser.prog}: a command is needed: bench or adapters ({parser.prog} --help lists them)",
              file=sys.stderr)
        return 2
    if options.command == "bench":
        from gae_xp.bench import cli

        return cli.execute(options, argv[1:], f"{parser.prog} bench")
    from gae_xp.bench import adapters

    return adapters.execute(options)


if __name__ == "__main__":
    sys.exit(main())
