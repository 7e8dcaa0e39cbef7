"""The `rocketraft` command."""

from __future__ import annotations

import argparse
import logging
import sys

from serverkit.grpc_env import quiet_grpc_logs

quiet_grpc_logs()  # before grpc is imported

from broker import server as broker_server  # noqa: E402
from cli import admin as cli_admin  # noqa: E402
from cli import messaging  # noqa: E402
from dashboard import server as dashboard_server  # noqa: E402
from namesrv import server as namesrv_server  # noqa: E402
from rocketraft import __version__  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="rocketraft", description="rocketraft: RocketMQ-style messaging on Raft")
    parser.add_argument("--version", action="version", version=f"rocketraft {__version__}")
    parser.set_defaults(tool=False)
    sub = parser.add_subparsers(dest="command", required=True)
    _add_tool(sub, "demo", "run a local three-replica dledger group with a live view", _demo)
    _add_tool(sub, "dev", "run a local NameServer + 3-replica broker group with a live view", _dev)
    _add_command(sub, "namesrv", "run a NameServer", None, namesrv_server.add_arguments, namesrv_server.run)
    _add_command(sub, "broker", "run one broker replica", broker_server.__doc__, broker_server.add_arguments,
                 broker_server.run)
    _add_command(sub, "admin", "mqadmin verbs: clusterList, updateTopic, topicList, ...", cli_admin.__doc__,
                 cli_admin.add_arguments, cli_admin.run)
    _add_command(sub, "dashboard", "serve the web dashboard (read-only unless --allow-changes)",
                 dashboard_server.__doc__, dashboard_server.add_arguments, dashboard_server.run)
    _add_command(sub, "send", "send messages", messaging.__doc__, messaging.add_send_arguments, messaging.run_send)
    _add_command(sub, "recall", "recall a sent message no consumer group got yet", messaging.__doc__,
                 messaging.add_recall_arguments, messaging.run_recall)
    _add_command(sub, "consume", "consume (and acknowledge) messages", messaging.__doc__,
                 messaging.add_consume_arguments, messaging.run_consume)
    _add_tool(sub, "bench", "benchmarks and reproductions (python -m bench)", _bench)
    args, rest = parser.parse_known_args(argv)
    if rest and not args.tool:
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    return args.run(rest) if args.tool else args.run(args)


def _add_command(sub, name: str, help_text: str, doc: str | None, add_arguments, run) -> None:
    """A subcommand whose arguments its module adds and whose `run` gets the parsed arguments."""
    parser = sub.add_parser(name, help=help_text, description=doc,
                            formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(parser)
    parser.set_defaults(run=run)


# `demo`, `dev` and `bench` run development tooling (devkit/, bench/), which library code never imports
# (tests/test_layers.py). This entry point is the one exception: it imports them inside the function of the
# subcommand that runs them, so every other subcommand works without them. Their arguments are parsed there too.
def _add_tool(sub, name: str, help_text: str, run) -> None:
    sub.add_parser(name, help=help_text, add_help=False).set_defaults(run=run, tool=True)


def _demo(rest: list[str]) -> int:
    from devkit import demo

    return _run_tool("demo", demo, rest)


def _dev(rest: list[str]) -> int:
    from devkit import dev

    return _run_tool("dev", dev, rest)


def _run_tool(name: str, module, rest: list[str]) -> int:
    parser = argparse.ArgumentParser(prog=f"rocketraft {name}", description=module.__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    module.add_arguments(parser)
    return module.run(parser.parse_args(rest))


def _bench(rest: list[str]) -> int:
    from bench.harness import main as bench_main

    return bench_main(rest or ["--help"])


if __name__ == "__main__":
    sys.exit(main())
