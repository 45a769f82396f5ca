"""The ``tether`` command line."""

from __future__ import annotations

import argparse
import sys

from tether.errors import TetherError


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="tether", description="Durable workflow runs for Python")
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("demo", help="run the scripted store scenario and print the journal")
    args = parser.parse_args(argv)
    try:
        if args.command == "demo":
            from tether.demo import run_demo

            run_demo()
    except TetherError as error:
        print(f"tether: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
