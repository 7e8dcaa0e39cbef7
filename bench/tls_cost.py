"""What TLS costs the publish path, and what permissive mode's splice adds (docs/security.md, "TLS").

    python -m bench tls --messages 50000 --latency 1000 --receives 500 --rounds 2   (also: python -m bench.tls_cost)

Each round starts four clusters in turn (a NameServer + a 3-replica group, DevCluster, ASYNC_FLUSH unless --flush)
and runs, against each, bench.client's publish (one producer process, send_batch of --batch 1 KiB messages,
--window calls in flight), latency (--latency sync sends one at a time) and receive latency (--receives
SimpleConsumer.receive calls of one ready message each, the ReceiveMessage round trip):
    raft-no-password  tlsMode disabled and no Raft password: what a TLS cluster may not be (its Raft port must
                      authenticate: Fernet with dLegerPassword or one derived from the cluster secret)
    disabled          tlsMode disabled, plaintext client, Raft password set (the baseline of the TLS sides)
    permissive-plain  tlsMode permissive, plaintext client: the splice alone
    permissive-tls    the same cluster, TLS client: the splice and TLS
    enforcing-tls     tlsMode enforcing, TLS client: TLS alone (grpc's own, no splice)
The order of the clusters alternates between rounds so a machine that slows down during the run favours no side.

Every side but raft-no-password has the same dLegerPassword. Printed: each run's msgs/s and p50/p99 send latency,
and the medians of each side against disabled. A publish in which sends failed is printed with its failures and
left out of its side's msgs/s median (a rate of refusals is no figure); its cluster's directory is kept for the logs.

    python -m bench tls --splice-ab 40   (the splice alone: one permissive cluster, the same moment)

sends one 1-message SendMessage at a time (raw gRPC, plaintext) to the master through its public port (the splice)
and straight to the gRPC server's plaintext loopback port behind it, alternating blocks of 50 sends (40 blocks
each), and prints both p50s and their difference: what the splice adds, free of the drift between clusters.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import statistics
import sys
import time
import uuid
from datetime import date

import grpc

from devkit.devcluster import DevCluster
from rocketraft.client.config import ClientConfig
from rocketraft.protocol import tls
from rocketraft.protocol.wire import Code, pb, svc, svc_grpc

from . import client as cb
from .workdir import keep, scratch_dir

RESULTS_DIR = os.path.join(os.path.dirname(__file__), "results")
CLUSTERS = {"raft-no-password": ("", ("plain",)), "disabled": ("", ("plain",)),
            "permissive": ("permissive", ("plain", "tls")), "enforcing": ("enforcing", ("tls",))}
RAFT_PASSWORD = "bench-tls-raft-password"  # every cluster but raft-no-password: TLS requires an authenticated Raft port


def one_side(cluster: DevCluster, client: str, args) -> dict:
    env, config = cluster.env, ClientConfig(namesrv=cluster.namesrv_address, cluster_secret="")
    if client == "tls":
        env = {**env, tls.CA_FILE_ENV: cluster.certs.ca_file}
        config = ClientConfig(namesrv=cluster.namesrv_address, cluster_secret="", tls=True,
                              tls_ca_file=cluster.certs.ca_file)
    published = cb.publish(cluster, args.size, 1, args.messages, args.batch, args.window, env=env)
    latency = asyncio.run(cb.latency(cluster.namesrv_address, args.latency, config))
    received = asyncio.run(cb.receive_latency(cluster.namesrv_address, args.receives, config))
    return {"msgs_per_s": published["msgs_per_s"], "failed": published["failed"], "p50_ms": latency["p50_ms"],
            "p99_ms": latency["p99_ms"], "receive_p50_ms": received["p50_ms"], "receive_p99_ms": received["p99_ms"]}


def one_cluster(base: str, name: str, args) -> list[dict]:
    mode, clients = CLUSTERS[name]
    settings = {} if name == "raft-no-password" else {"dLegerPassword": RAFT_PASSWORD}
    cluster = DevCluster(base, flush=args.flush, log_level="WARNING", metrics=False, tls_mode=mode,
                         broker_settings=settings)
    cluster.start()
    try:
        cluster.wait_master()
        cluster.create_topic(cb.TOPIC)
        cluster.create_topic(cb.RECEIVE_TOPIC)
        results = [{"side": f"{name}-{client}" if mode else name, **one_side(cluster, client, args)}
                   for client in clients]
        if any(r["failed"] for r in results):
            keep(base)
        return results
    finally:
        cluster.stop()


def splice_ab(base: str, blocks: int, per_block: int = 50) -> dict:
    """The splice's own cost (see the module's docstring): p50 of each path and the difference, in ms."""
    cluster = DevCluster(base, log_level="INFO", metrics=False, tls_mode="permissive",
                         broker_settings={"dLegerPassword": RAFT_PASSWORD})
    cluster.start()
    try:
        master = cluster.wait_master()
        cluster.create_topic(cb.TOPIC)
        with open(cluster.brokers[master].log_path) as f:
            found = re.search(r"permissive TLS on \S+ TLS -> \S+, plaintext -> (127\.0\.0\.1:\d+)", f.read())
        if found is None:
            raise RuntimeError(f"the master's log {cluster.brokers[master].log_path} names no plaintext loopback port")
        channels = {"spliced": grpc.insecure_channel(cluster.address_of[master]),
                    "direct": grpc.insecure_channel(found.group(1))}
        stubs = {side: svc_grpc.MessagingServiceStub(channel) for side, channel in channels.items()}
        body = os.urandom(1024)

        def send(stub) -> float:
            message = pb.Message(topic=pb.Resource(name=cb.TOPIC), body=body, system_properties=pb.SystemProperties(
                message_id=uuid.uuid4().hex, body_encoding=pb.Encoding.IDENTITY))
            began = time.perf_counter()
            response = stub.SendMessage(svc.SendMessageRequest(messages=[message]), timeout=10)
            if response.status.code != Code.OK:
                raise RuntimeError(f"a send failed: {response.status}")
            return (time.perf_counter() - began) * 1000

        for stub in stubs.values():  # warm up both connections
            for _ in range(per_block * 4):
                send(stub)
        samples: dict[str, list[float]] = {side: [] for side in stubs}
        for block in range(blocks):
            for side in (list(stubs) if block % 2 == 0 else list(reversed(stubs))):
                samples[side] += [send(stubs[side]) for _ in range(per_block)]
        for channel in channels.values():
            channel.close()
        p50 = {side: round(statistics.median(values), 3) for side, values in samples.items()}
        return {"sends_each": blocks * per_block, "spliced_p50_ms": p50["spliced"], "direct_p50_ms": p50["direct"],
                "splice_adds_ms": round(p50["spliced"] - p50["direct"], 3)}
    finally:
        cluster.stop()


def run(args) -> dict:
    base = scratch_dir(args.dir, "bench-tls-")
    runs = []
    for round_no in range(args.rounds):
        order = list(CLUSTERS) if round_no % 2 == 0 else list(reversed(CLUSTERS))
        for name in order:
            for result in one_cluster(os.path.join(base, f"round{round_no}-{name}"), name, args):
                result["round"] = round_no
                runs.append(result)
                print(json.dumps(result), flush=True)
    sides = sorted({r["side"] for r in runs}, key=[r["side"] for r in runs].index)
    medians = {side: side_medians([r for r in runs if r["side"] == side]) for side in sides}
    base_side = medians["disabled"]
    for side in medians.values():
        side["msgs_over_disabled"] = _ratio(side["msgs_per_s"], base_side["msgs_per_s"])
        side["p50_over_disabled"] = _ratio(side["p50_ms"], base_side["p50_ms"])
        side["receive_p50_over_disabled"] = _ratio(side["receive_p50_ms"], base_side["receive_p50_ms"])
    return {"messages": args.messages, "latency_sends": args.latency, "receives": args.receives, "size": args.size,
            "batch": args.batch,
            "window": args.window, "rounds": args.rounds, "flush": args.flush, "medians": medians, "runs": runs}


def side_medians(runs: list[dict]) -> dict:
    """One side's medians; its msgs/s only over the publishes without failed sends (None if there is none)."""
    clean = [r["msgs_per_s"] for r in runs if not r["failed"]]
    return {"msgs_per_s": round(statistics.median(clean), 3) if clean else None,
            "p50_ms": round(statistics.median(r["p50_ms"] for r in runs), 3),
            "p99_ms": round(statistics.median(r["p99_ms"] for r in runs), 3),
            "receive_p50_ms": round(statistics.median(r["receive_p50_ms"] for r in runs), 3),
            "receive_p99_ms": round(statistics.median(r["receive_p99_ms"] for r in runs), 3),
            "runs_with_failed_sends": sum(1 for r in runs if r["failed"]),
            "failed_sends": sum(r["failed"] for r in runs)}


def _ratio(value: float | None, base: float | None) -> float | None:
    return round(value / base, 3) if value is not None and base else None


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m bench tls", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--messages", type=int, default=50_000, help="messages per publish run")
    p.add_argument("--latency", type=int, default=1000, help="sync sends per latency run")
    p.add_argument("--receives", type=int, default=500, help="receives of one ready message per receive run")
    p.add_argument("--rounds", type=int, default=2, help="rounds of the three clusters")
    p.add_argument("--size", type=int, default=1024, help="body bytes")
    p.add_argument("--batch", type=int, default=256, help="messages per send_batch call")
    p.add_argument("--window", type=int, default=8, help="send_batch calls in flight")
    p.add_argument("--flush", default="ASYNC_FLUSH", choices=["ASYNC_FLUSH", "SYNC_FLUSH"])
    p.add_argument("--dir", help="where the clusters keep their data and logs (default: a temp dir)")
    p.add_argument("--out", default=RESULTS_DIR, help="results directory (default bench/results)")
    p.add_argument("--quick", action="store_true", help="a smoke run: 1 round of 3,000 messages, 100 sends")
    p.add_argument("--splice-ab", type=int, metavar="BLOCKS", default=0,
                   help="only the splice's own cost: BLOCKS blocks of 50 sends each way on one permissive cluster")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.splice_ab:
        base = scratch_dir(args.dir, "bench-tls-")
        for round_no in range(args.rounds):
            result = splice_ab(os.path.join(base, f"splice-ab{round_no}"), args.splice_ab)
            print(json.dumps({"round": round_no, **result}), flush=True)
        return 0
    if args.quick:
        args.rounds, args.messages, args.latency, args.receives = 1, 3_000, 100, 50
    result = run(args)
    out = os.path.join(args.out, f"tls-{time.strftime('%Y%m%d-%H%M%S')}")
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "result.json"), "w") as f:
        json.dump({"scenario": "tls", "date": str(date.today()), "result": result}, f, indent=1)
    for side, m in result["medians"].items():
        rate = (f"median {m['msgs_per_s']:>8,} msgs/s ({m['msgs_over_disabled'] or float('nan'):.3f} of disabled)"
                if m["msgs_per_s"] is not None else "no msgs/s: sends failed in every publish")
        failed = (f"  FAILED: {m['failed_sends']} sends in {m['runs_with_failed_sends']} publishes (left out)"
                  if m["runs_with_failed_sends"] else "")
        print(f"{side:18} {rate}, send p50 {m['p50_ms']} ms ({m['p50_over_disabled']:.3f}), p99 {m['p99_ms']} ms, "
              f"receive p50 {m['receive_p50_ms']} ms ({m['receive_p50_over_disabled']:.3f}), p99 "
              f"{m['receive_p99_ms']} ms{failed}")
    print(f"results: {out}/result.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
