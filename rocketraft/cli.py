"""The `rocketraft` command."""

from __future__ import annotations

import argparse
import logging
import sys

from broker import server as broker_server
from namesrv import server as namesrv_server

from . import __version__, cli_admin, cli_client, demo, dev


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="rocketraft", description="rocketraft: RocketMQ-style messaging on Raft")
    parser.add_argument("--version", action="version", version=f"rocketraft {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    demo_parser = sub.add_parser("demo", help="run a local three-replica dledger group with a live view",
                                 description=demo.__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    demo.add_arguments(demo_parser)
    demo_parser.set_defaults(run=demo.run)
    dev_parser = sub.add_parser("dev", help="run a local NameServer + 3-replica broker group with a live view",
                                description=dev.__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    dev.add_arguments(dev_parser)
    dev_parser.set_defaults(run=dev.run)
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
    send_parser = sub.add_parser("send", help="send messages", description=cli_client.__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    cli_client.add_send_arguments(send_parser)
    send_parser.set_defaults(run=cli_client.run_send)
    consume_parser = sub.add_parser("consume", help="consume (and acknowledge) messages",
                                    description=cli_client.__doc__,
                                    formatter_class=argparse.RawDescriptionHelpFormatter)
    cli_client.add_consume_arguments(consume_parser)
    consume_parser.set_defaults(run=cli_client.run_consume)
    bench_parser = sub.add_parser("bench", help="benchmarks and reproductions (python -m bench)", add_help=False)
    bench_parser.add_argument("rest", nargs=argparse.REMAINDER)
    bench_parser.set_defaults(run=lambda a: _bench(a.rest))
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    return args.run(args)


def _bench(rest: list[str]) -> int:
    from bench.harness import main as bench_main

    return bench_main(rest or ["--help"])


if __name__ == "__main__":
    sys.exit(main())
