"""Command line: ``python -m ddp_devcluster {build,up,down,demo}``."""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__)
        return 0
    cmd, rest = argv[0], argv[1:]
    if cmd == "build":
        from .build import main as build_main

        return build_main(rest)
    print(f"unknown command {cmd!r}; one of: build, up, down, demo", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
