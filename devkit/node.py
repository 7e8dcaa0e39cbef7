"""One stand-alone dledger replica process: `python -m devkit.node --config replica.json --control host:port`.

The JSON file holds ReplicaConfig fields. Used by the demo, the tests and the benchmarks; the broker
embeds dledger instead. Stops cleanly on SIGTERM/SIGINT, the control op `shutdown`, or when the process named by
ROCKETRAFT_PARENT_PID (LocalCluster's) is gone (serverkit/parentwatch.py).
"""

from __future__ import annotations

import argparse
import json
import logging
import signal
import sys
import threading

from dledger import FlushPolicy, Replica, ReplicaConfig
from serverkit import parentwatch

from .control import ControlServer, control_key
from .counting import CountingStateMachine


def load_config(path: str) -> ReplicaConfig:
    with open(path) as f:
        raw = json.load(f)
    raw["flush_policy"] = FlushPolicy(raw.get("flush_policy", "SYNC_FLUSH"))
    return ReplicaConfig(**raw)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m devkit.node", description=__doc__)
    parser.add_argument("--config", required=True, help="JSON file with ReplicaConfig fields")
    parser.add_argument("--control", required=True, help="host:port of the control channel")
    parser.add_argument("--log-level", default="INFO")
    args = parser.parse_args(argv)
    try:
        key = control_key()
    except ValueError as exc:
        print(f"devkit.node: cannot start: {exc}", file=sys.stderr)
        return 2
    config = load_config(args.config)
    logging.basicConfig(level=args.log_level,
                        format=f"%(asctime)s %(levelname)s [{config.group_id}/{config.self_id}] %(name)s: %(message)s")
    host, _, port = args.control.rpartition(":")
    replica = Replica.open(config, CountingStateMachine())
    server = ControlServer(replica, (host, int(port)), key)
    server.start()
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    threading.Thread(target=lambda: (server.wait_stopped(), stop.set()), daemon=True).start()
    parentwatch.watch_in_thread(parentwatch.named_parent(), stop.set)
    replica.subscribe(lambda st: logging.getLogger("dledger.role").info(
        "role=%s term=%d leader=%s", st.role.value, st.term, st.leader_id))
    print(f"READY {config.self_id}", flush=True)
    stop.wait()
    replica.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
