"""python -m devkit.fuzz [--requests N] [--seed S] [--only RPC,...] [--doors grpc,remoting] [--dir DIR] [--json FILE]

Fuzzes every RPC of every rocketraft service and every request code of the Remoting ports on a cluster of its own
(docs/fuzzing.md). Exit status 0 when
there was no defect, 1 otherwise; the table names each RPC's requests, successes, refusals and defects, and
examples of each defect with the request that caused it.
"""

from __future__ import annotations

import argparse
import json
import secrets
import shutil
import sys
import tempfile
import time

from devkit.devcluster import DevCluster

from .access import Credentials, make_users
from .run import Fuzzer, report_lines

# docs/security.md: ACL 2.0 on brokers and NameServers, with the cluster secret it needs
ACL_ON = {"authenticationEnabled": True, "authorizationEnabled": True}
NAMESRV_ACL_ON = ("--authenticationEnabled", "true", "--authorizationEnabled", "true")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m devkit.fuzz", description=__doc__.split("\n\n")[1])
    parser.add_argument("--requests", type=int, default=10_000, help="requests per RPC per server (default 10000)")
    parser.add_argument("--remoting-requests", type=int, default=0,
                        help="requests per Remoting request code per server (default: --requests)")
    parser.add_argument("--seed", type=int, default=1, help="seed of the request generator (default 1)")
    parser.add_argument("--only", default="", help="comma-separated RPC names or Remoting code names "
                        "(SEND_MESSAGE_V2, UNKNOWN_CODE; Remoting: every code) to fuzz (default: all)")
    parser.add_argument("--doors", default="grpc,remoting",
                        help="which ports: grpc (every gRPC service), remoting (the RocketMQ 4.x Remoting ports); "
                             "default both")
    parser.add_argument("--send-known", action="store_true",
                        help="also send the requests of known findings (devkit/fuzz/calls.py KNOWN_FINDINGS), which "
                             "are otherwise counted and not sent")
    parser.add_argument("--hardened", action="store_true",
                        help="a hardened cluster (a cluster secret, ACL 2.0 authentication and authorization, TLS "
                             "permissive) with three users; every request goes with credentials of a kind drawn at "
                             "random, and a success answered to one without the right is a defect")
    parser.add_argument("--concurrency", type=int, default=16, help="requests in flight (default 16)")
    parser.add_argument("--dir", default="", help="where the cluster's data and logs go (default: a temp dir, "
                                                  "kept when there is a defect or the run fails)")
    parser.add_argument("--json", default="", help="also write the results to this file")
    args = parser.parse_args(argv)
    if args.requests < 1 or args.concurrency < 1 or args.remoting_requests < 0:
        parser.error("--requests and --concurrency must be at least 1")
    doors = tuple(filter(None, args.doors.split(",")))
    if not doors or set(doors) - {"grpc", "remoting"}:
        parser.error("--doors takes grpc, remoting or both")
    base = args.dir or tempfile.mkdtemp(prefix="rocketraft-fuzz-")
    defects = None  # a run that raised has its logs to look into, as one with defects does
    try:
        started = time.monotonic()
        credentials = Credentials(secrets.token_hex(32), make_users()) if args.hardened else None
        with cluster_of(base, credentials) as cluster:
            cluster.start().wait_master()
            fuzzer = Fuzzer(cluster, requests=args.requests, seed=args.seed, concurrency=args.concurrency,
                            only=set(filter(None, args.only.split(","))), progress=sys.stderr, doors=doors,
                            send_known=args.send_known, remoting_requests=args.remoting_requests or args.requests,
                            credentials=credentials)
            results = fuzzer.run()
        for line in report_lines(results, time.monotonic() - started):
            print(line)
        defects = sum(r.defects for r in results)
        if args.json:
            with open(args.json, "w") as f:
                json.dump([r.as_json() for r in results], f, indent=1)
        return 1 if defects else 0
    finally:
        if defects == 0 and not args.dir:
            shutil.rmtree(base, ignore_errors=True)
        elif defects != 0:
            print(f"cluster data and logs kept in {base}", flush=True)


def cluster_of(base: str, credentials: Credentials | None) -> DevCluster:
    """A plain cluster, or (--hardened) one as docs/security.md hardens it, with TLS permissive: the fuzzer's gRPC
    calls go over TLS, its Remoting frames in plaintext, which a permissive port accepts too."""
    if credentials is None:
        return DevCluster(base)
    return DevCluster(base, cluster_secret=credentials.secret, broker_settings=ACL_ON, namesrv_args=NAMESRV_ACL_ON,
                      tls_mode="permissive")


if __name__ == "__main__":
    sys.exit(main())
