"""``python -m gae_xp bench [options]`` (also the ``gae-xp`` console script)."""

from __future__ import annotations

import sys

USAGE = "usage: python -m gae_xp bench [options]   (python -m gae_xp bench --help lists the options)"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["bench"]:
        from gae_xp.bench.cli import run

        return run(argv[1:])
    asked = argv[:1] in (["-h"], ["--help"])
    print(USAGE, file=sys.stdout if asked else sys.stderr)
    return 0 if asked else 2


if __name__ == "__main__":
    sys.exit(main())
