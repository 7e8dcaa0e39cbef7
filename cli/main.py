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
    namesrv_parser = sub.add_parser("namesrv", help="run a NameServer")
    namesrv_server.add_arguments(namesrv_parser)
    namesrv_parser.set_defaults(run=namesrv_server.run)
    broker_parser = sub.add_parser("broker", help="run one broker replica",
                                   description=broker_server.__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
    broker_server.add_arguments(broker_parser)
    broker_parser.set_defaults(run=broker_server.run)
    admin_parser = sub.add_parser("admin", help="mqadmin verbs: clusterList, updateTopic, topicList, ...",
                                  description=cli_admin.__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    cli_admin.add_arguments(admin_parser)
    admin_parser.set_defaults(run=cli_admin.run)
    dashboard_parser = sub.add_parser("dashboard", help="serve the web dashboard (read-only unless --allow-changes)",
                                      description=dashboard_server.__doc__,
                                      formatter_class=argparse.RawDescriptionHelpFormatter)
    dashboard_server.add_arguments(dashboard_parser)
    dashboard_parser.set_defaults(run=dashboard_server.run)
    send_parser = sub.add_parser("send", help="send messages", description=messaging.__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    messaging.add_send_arguments(send_parser)
    send_parser.set_defaults(run=messaging.run_send)
    recall_parser = sub.add_parser("recall", help="recall a sent message no consumer group got yet",
                                   description=messaging.__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    messaging.add_recall_arguments(recall_parser)
    recall_parser.set_defaults(run=messaging.run_recall)
    consume_parser = sub.add_parser("consume", help="consume (and acknowledge) messages",
                                    description=messaging.__doc__,
                                    formatter_class=argparse.RawDescriptionHelpFormatter)
    messaging.add_consume_arguments(consume_parser)
    consume_parser.set_defaults(run=messaging.run_consume)
    _add_tool(sub, "bench", "benchmarks and reproductions (python -m bench)", _bench)
    args, rest = parser.parse_known_args(argv)
    if rest and not args.tool:
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    return args.run(rest) if args.tool else args.run(args)


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
