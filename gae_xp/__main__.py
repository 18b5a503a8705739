"""``python -m gae_xp bench [options]`` (also the ``gae-xp`` console script)."""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help") or argv[0] != "bench":
        print("usage: python -m gae_xp bench [options]   (python -m gae_xp bench --help for the options)",
              file=sys.stderr if argv and argv[0] not in ("-h", "--help") else sys.stdout)
        return 0 if argv and argv[0] in ("-h", "--help") else 2
    from gae_xp.bench.cli import run

    return run(argv[1:])


if __name__ == "__main__":
    sys.exit(main())
