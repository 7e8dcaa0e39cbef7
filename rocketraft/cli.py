"""The `rocketraft` command."""

from __future__ import annotations

import argparse
import logging
import sys

from . import __version__, demo


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="rocketraft", description="rocketraft: RocketMQ-style messaging on Raft")
    parser.add_argument("--version", action="version", version=f"rocketraft {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    demo_parser = sub.add_parser("demo", help="run a local three-replica dledger group with a live view",
                                 description=demo.__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    demo.add_arguments(demo_parser)
    demo_parser.set_defaults(run=demo.run)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())
