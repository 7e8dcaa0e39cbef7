"""`rocketraft dashboard`: serve the web dashboard (docs/dashboard.md) with uvicorn.

    rocketraft dashboard --namesrv 127.0.0.1:9876                  # http://127.0.0.1:8088, read-only
    rocketraft dashboard --namesrv 127.0.0.1:9876 --allow-changes  # also create/delete topics, groups, resend, recall

It binds 127.0.0.1 only unless --listen names another host: it has no login yet, so anyone who can reach it sees
(and with --allow-changes changes) the cluster. The security issue's ACL will decide per user.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import socket

import uvicorn

from rocketraft.protocol.wire import address_argument, split_address, tcp_listener
from serverkit import parentwatch

from .app import ALLOW_FLAG, POLL_INTERVAL_S_DEFAULT, create_app

DEFAULT_LISTEN = "127.0.0.1:8088"   # clear of the NameServer (9876), brokers (8081+) and metrics (5557)
LISTEN_ENV = "ROCKETRAFT_DASHBOARD_LISTEN"

log = logging.getLogger(__name__)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("-n", "--namesrv", default="127.0.0.1:9876", help="NameServer(s), ';'-separated "
                        "(default 127.0.0.1:9876)")
    parser.add_argument("--listen", type=address_argument, default=os.environ.get(LISTEN_ENV) or DEFAULT_LISTEN,
                        metavar="HOST:PORT", help=f"where to serve the dashboard (default: ${LISTEN_ENV} or "
                        f"{DEFAULT_LISTEN}: this machine only; port 0 picks a free port)")
    parser.add_argument(ALLOW_FLAG, action="store_true", help="enable the changing actions (create/delete topic, "
                        "create group, resend, recall); without it the dashboard is read-only")
    parser.add_argument("--poll-interval", type=float, default=POLL_INTERVAL_S_DEFAULT, metavar="SECONDS",
                        help=f"how often the cluster view (and the Raft timeline) is polled and pages refresh "
                        f"(default {POLL_INTERVAL_S_DEFAULT:g})")


def run(args: argparse.Namespace) -> int:
    """Serve until SIGTERM/SIGINT. Prints "dashboard listening on http://HOST:PORT" once the port is bound."""
    if args.poll_interval <= 0:
        print(f"rocketraft dashboard: --poll-interval must be positive, not {args.poll_interval}")
        return 2
    host, port = split_address(args.listen)
    try:
        sock = tcp_listener(host, port)
    except OSError as e:
        print(f"rocketraft dashboard: cannot listen on {args.listen}: {e}; pick another with --listen HOST:PORT")
        return 1
    app = create_app(args.namesrv, allow_changes=args.allow_changes, poll_interval_s=args.poll_interval)
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on"))
    bound_host, bound_port = sock.getsockname()[:2]
    mode = "changes allowed" if args.allow_changes else f"read-only; {ALLOW_FLAG} enables changes"
    print(f"dashboard listening on http://{bound_host}:{bound_port} (NameServer {args.namesrv}; {mode})", flush=True)
    try:
        asyncio.run(_serve(server, sock))
    except KeyboardInterrupt:
        pass
    return 0


async def _serve(server: uvicorn.Server, sock: socket.socket) -> None:
    stop = asyncio.Event()
    watch = parentwatch.start(stop)   # started by `rocketraft dev`: stop if it dies, even by SIGKILL
    if watch is not None:
        async def stop_when_orphaned() -> None:
            await stop.wait()
            server.should_exit = True
        asyncio.get_running_loop().create_task(stop_when_orphaned())
    await server.serve(sockets=[sock])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="rocketraft dashboard", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(parser)
    return run(parser.parse_args(argv))
