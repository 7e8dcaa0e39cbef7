"""The rocketraft client library measured against a real local cluster (issue 4's goals).

    .venv/bin/python -m bench.client                        # every scenario
    .venv/bin/python -m bench.client publish                # acked msgs/s and MB/s: 1 KiB and 128 B, 1 and 4 producers
    .venv/bin/python -m bench.client latency                # one sync send at a time: p50 / p99
    .venv/bin/python -m bench.client consume --prefill 200000
    .venv/bin/python -m bench.client failover --trials 5    # kill -9 of the master -> next ack
    .venv/bin/python -m bench.client --quick                # a smoke run (about a minute)

Every process is real: a NameServer and a 3-replica broker group (ASYNC_FLUSH, the broker's default; --flush
to change) on 127.0.0.1, a fresh cluster per scenario, under --dir (default a temporary directory).

publish   each producer is its own process (python -m bench.client _produce) using Producer.send_batch with
          --batch messages per call and --window calls in flight; all start together; the figure is every
          acknowledged message over the time from the first start to the last end.
latency   one Producer.send at a time, 1 KiB: 200 warm-up sends, then --messages timed sends.
rpc       the floor under latency: a bare Heartbeat round trip (no Raft, no disk) to the NameServer and to
          the master, 1,000 calls each.
consume   --prefill 1 KiB messages are stored first (send_batch), then one PullConsumer drains them;
          msgs/s = prefill / drain time.
failover  one Producer.send at a time, continuously; after 1 s of acks the master is killed with SIGKILL and
          restarted (from another thread); gap = the first ack after the kill minus the kill (an ack of a send
          already in flight at the kill counts: the client got it after the kill). After the last trial every
          acknowledged message is checked to be stored exactly once.

Results go to bench/results/client-<timestamp>.json.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from datetime import date

from devkit.devcluster import DevCluster
from rocketraft.client.config import ClientConfig
from rocketraft.client.message import Message
from rocketraft.client.producer import Producer

from .workdir import scratch_dir

RESULTS_DIR = os.path.join(os.path.dirname(__file__), "results")
TOPIC = "bench-client"
RECEIVE_TOPIC = "bench-receive"  # receive_latency's (its group starts where the topic ends)
PRODUCER_WAIT_S = 600  # for each producer process's result


SERIES_KEYS = ("per_second", "samples_ms", "acks_s", "kills_s")


def without_series(result):
    """A result without its time series (for printing; the JSON file keeps them for the plots)."""
    if isinstance(result, list):
        return [without_series(r) for r in result]
    if isinstance(result, dict):
        return {k: without_series(v) for k, v in result.items() if k not in SERIES_KEYS}
    return result


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * fraction))]


def fresh_cluster(base: str, name: str, flush: str) -> DevCluster:
    cluster = DevCluster(os.path.join(base, name), flush=flush, log_level="WARNING")
    cluster.start()
    cluster.wait_master()
    cluster.create_topic(TOPIC)
    return cluster


# -- publish -------------------------------------------------------------------------------------------------
async def produce(namesrv: str, size: int, messages: int, batch: int, window: int, start_at: float) -> dict:
    body = os.urandom(size)
    async with Producer(namesrv, topics=[TOPIC], requests_in_flight_max=window) as producer:
        await asyncio.sleep(max(0.0, start_at - time.time()))
        started = time.time()
        acked = failed = 0
        calls = messages // batch
        per_second: collections.Counter = collections.Counter()  # whole seconds since start_at -> acks

        async def worker(share: int) -> None:
            nonlocal acked, failed
            for _ in range(share):
                try:
                    await producer.send_batch([Message(TOPIC, body) for _ in range(batch)])
                    ok = batch
                except Exception as exc:  # noqa: BLE001 - counted; a benchmark reports, it does not stop
                    results = getattr(exc, "results", [exc] * batch)
                    failed += sum(1 for r in results if isinstance(r, BaseException))
                    ok = sum(1 for r in results if not isinstance(r, BaseException))
                acked += ok
                per_second[int(time.time() - start_at)] += ok

        await asyncio.gather(*(worker(calls // window + (i < calls % window)) for i in range(window)))
        return {"acked": acked, "failed": failed, "started": started, "ended": time.time(),
                "per_second": [per_second.get(i, 0) for i in range(max(per_second, default=-1) + 1)]}


def publish(cluster: DevCluster, size: int, producers: int, messages: int, batch: int, window: int,
            env: dict | None = None) -> dict:
    """env: the producer processes' environment (default cluster.env; bench/tls_cost.py adds the client's TLS)."""
    start_at = time.time() + 3.0  # every producer process connected and warmed up by then
    procs: list[subprocess.Popen] = []
    try:
        for _ in range(producers):
            procs.append(subprocess.Popen([sys.executable, "-m", "bench.client", "_produce", cluster.namesrv_address,
                                           str(size), str(messages // producers), str(batch), str(window),
                                           str(start_at)], stdout=subprocess.PIPE, text=True, env=env or cluster.env))
        outcomes = [json.loads(p.communicate(timeout=PRODUCER_WAIT_S)[0]) for p in procs]
    finally:  # one producer timed out or printed no result: the others must not go on sending into the next run
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
            proc.wait()
            if proc.stdout and not proc.stdout.closed:
                proc.stdout.close()
    acked = sum(o["acked"] for o in outcomes)
    elapsed = max(o["ended"] for o in outcomes) - min(o["started"] for o in outcomes)
    seconds = max(len(o["per_second"]) for o in outcomes)
    per_second = [sum(o["per_second"][i] for o in outcomes if i < len(o["per_second"])) for i in range(seconds)]
    return {"size": size, "producers": producers, "batch": batch, "window": window, "acked": acked,
            "failed": sum(o["failed"] for o in outcomes), "seconds": round(elapsed, 2),
            "msgs_per_s": round(acked / elapsed), "mb_per_s": round(acked * size / elapsed / 1e6, 1),
            "per_second": per_second}


# -- latency -------------------------------------------------------------------------------------------------
async def latency(namesrv: str, messages: int, config: ClientConfig | None = None) -> dict:
    body = b"x" * 1024
    async with Producer(namesrv, topics=[TOPIC], config=config) as producer:
        for _ in range(200):
            await producer.send(Message(TOPIC, body))
        samples = []
        for _ in range(messages):
            began = time.perf_counter()
            await producer.send(Message(TOPIC, body))
            samples.append((time.perf_counter() - began) * 1000)
    return {"messages": messages, "p50_ms": round(percentile(samples, 0.5), 3),
            "p99_ms": round(percentile(samples, 0.99), 3), "max_ms": round(max(samples), 3),
            "samples_ms": [round(x, 3) for x in samples]}


async def receive_latency(namesrv: str, messages: int, config: ClientConfig | None = None) -> dict:
    """One SimpleConsumer.receive of one ready message at a time (the ReceiveMessage round trip; issue 30, item 7:
    43-46 ms through a permissive port's splice before its sockets had TCP_NODELAY): `messages` sent first, each
    receive timed until it returned its message (the ack is not timed)."""
    from rocketraft.client.simple_consumer import SimpleConsumer

    body = b"x" * 1024
    async with SimpleConsumer(namesrv, group="bench-receive", subscriptions={RECEIVE_TOPIC: "*"}, await_duration_s=2,
                              config=config) as consumer:
        async with Producer(namesrv, topics=[RECEIVE_TOPIC], config=config) as producer:
            for _ in range(messages + 50):
                await producer.send(Message(RECEIVE_TOPIC, body))
        samples = []
        for i in range(messages + 50):
            began = time.perf_counter()
            got = await consumer.receive(1)
            took = (time.perf_counter() - began) * 1000
            if not got:
                raise RuntimeError(f"receive {i} of {messages + 50} got nothing within 2 s")
            if i >= 50:  # the first 50 warm the connections up
                samples.append(took)
            for m in got:
                await consumer.ack(m)
    return {"messages": messages, "p50_ms": round(percentile(samples, 0.5), 3),
            "p99_ms": round(percentile(samples, 0.99), 3), "max_ms": round(max(samples), 3)}


async def rpc(cluster: DevCluster, calls: int) -> dict:
    """The floor under any send: a bare Heartbeat round trip (no Raft, no disk) to the NameServer and the master."""
    from rocketraft.protocol.wire import svc

    out = {}
    async with Producer(cluster.namesrv_address, topics=[TOPIC]) as producer:
        targets = {"namesrv": cluster.namesrv_address, "master": cluster.address_of[cluster.wait_master()]}
        for name, address in targets.items():
            stub, samples = producer.transport.messaging(address), []
            for _ in range(calls):
                began = time.perf_counter()
                await stub.Heartbeat(svc.HeartbeatRequest(), metadata=producer.transport.metadata, timeout=3)
                samples.append((time.perf_counter() - began) * 1000)
            out[name] = {"p50_ms": round(percentile(samples, 0.5), 3), "p99_ms": round(percentile(samples, 0.99), 3)}
    return out


# -- consume -------------------------------------------------------------------------------------------------
async def consume(namesrv: str, prefill: int) -> dict:
    from rocketraft.client.pull_consumer import PullConsumer

    body = b"x" * 1024
    async with Producer(namesrv, topics=[TOPIC], requests_in_flight_max=8) as producer:
        began = time.perf_counter()

        async def fill(share: int) -> None:
            for _ in range(share // 256):
                await producer.send_batch([Message(TOPIC, body) for _ in range(256)])

        await asyncio.gather(*(fill(prefill // 8) for _ in range(8)))
        prefill_s = time.perf_counter() - began
    stored = (prefill // 8 // 256) * 256 * 8
    consumer = PullConsumer(namesrv, group="bench-consume", topics={TOPIC: "*"}, auto_commit=False)
    await consumer.start()
    try:
        began = time.perf_counter()
        received = 0
        per_second: collections.Counter = collections.Counter()
        while received < stored:
            got = len(await consumer.poll(max_messages=64, timeout_s=2.0))
            received += got
            per_second[int(time.perf_counter() - began)] += got
        drain_s = time.perf_counter() - began
    finally:
        await consumer.close()
    return {"stored": stored, "prefill_s": round(prefill_s, 1), "drain_s": round(drain_s, 2),
            "msgs_per_s": round(received / drain_s),
            "per_second": [per_second.get(i, 0) for i in range(max(per_second, default=-1) + 1)]}


# -- failover ------------------------------------------------------------------------------------------------
async def failover(cluster: DevCluster, trials: int) -> dict:
    acks: list[tuple[float, str]] = []
    gaps: list[float] = []
    failures: list[str] = []
    kills: list[float] = []
    origin = time.monotonic()
    async with Producer(cluster.namesrv_address, topics=[TOPIC], send_timeout_s=10) as producer:
        stop = asyncio.Event()

        async def sender() -> None:
            i = 0
            while not stop.is_set():
                try:
                    receipt = await producer.send(Message(TOPIC, b"f%d" % i))
                    acks.append((time.monotonic(), receipt.message_id))
                except Exception as exc:  # noqa: BLE001 - recorded
                    failures.append(f"{type(exc).__name__}: {exc}")
                i += 1

        task = asyncio.ensure_future(sender())
        for _ in range(trials):
            await asyncio.sleep(1.0)
            master = await asyncio.to_thread(cluster.wait_master)
            killed_at = time.monotonic()
            kills.append(killed_at - origin)
            cluster.kill(master)
            restart = asyncio.ensure_future(asyncio.to_thread(cluster.start_replica, master))  # not on this loop
            while not acks or acks[-1][0] <= killed_at:
                await asyncio.sleep(0.002)
            gaps.append(next(t for t, _ in acks if t > killed_at) - killed_at)
            await restart
        stop.set()
        await task
    stored = [m.system_properties.message_id for m in await asyncio.to_thread(cluster.read_messages, TOPIC)]
    acked_ids = {i for _, i in acks}
    return {"trials": trials, "gap_p50_s": round(statistics.median(gaps), 3), "gap_max_s": round(max(gaps), 3),
            "gaps_s": [round(g, 3) for g in gaps], "acked": len(acks), "failed_sends": len(failures),
            "lost": len(acked_ids - set(stored)), "duplicated": len(stored) - len(set(stored)),
            "kills_s": [round(k, 3) for k in kills], "acks_s": [round(t - origin, 4) for t, _ in acks]}


# -- driver ----------------------------------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "_produce":
        namesrv, size, messages, batch, window, start_at = argv[1:]
        print(json.dumps(asyncio.run(produce(namesrv, int(size), int(messages), int(batch), int(window),
                                             float(start_at)))))
        return 0
    parser = argparse.ArgumentParser(prog="python -m bench.client", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("scenarios", nargs="*", default=["publish", "latency", "rpc", "consume", "failover"])
    parser.add_argument("--flush", default="ASYNC_FLUSH", choices=["ASYNC_FLUSH", "SYNC_FLUSH"])
    parser.add_argument("--messages", type=int, default=0, help="per publish run (default 200,000) / latency run")
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--window", type=int, default=8)
    parser.add_argument("--prefill", type=int, default=200_000)
    parser.add_argument("--trials", type=int, default=5)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--dir", default=None)
    parser.add_argument("--results", default=RESULTS_DIR, help="where the JSON results go")
    args = parser.parse_args(argv)
    base = scratch_dir(args.dir, "bench-client-")
    results: dict = {"date": str(date.today()), "machine": f"{os.cpu_count()} cores, {platform.python_version()}",
                     "flush": args.flush}
    for scenario in args.scenarios:
        cluster = fresh_cluster(base, scenario, args.flush)
        try:
            results[scenario] = run_scenario(scenario, cluster, args)
        finally:
            cluster.stop()
        print(json.dumps({scenario: without_series(results[scenario])}, indent=1), flush=True)
    os.makedirs(args.results, exist_ok=True)
    path = os.path.join(args.results, f"client-{time.strftime('%Y%m%d-%H%M%S')}.json")
    with open(path, "w") as f:
        json.dump(results, f, indent=1)
    print(f"results: {path}")
    return 0


def run_scenario(scenario: str, cluster: DevCluster, args) -> object:
    quick = args.quick
    if scenario == "publish":
        messages = args.messages or (20_000 if quick else 200_000)
        if quick:  # the smoke run: both sizes, one producer process
            return [publish(cluster, size, 1, messages, args.batch, args.window) for size in (1024, 128)]
        return [publish(cluster, size, producers, messages, args.batch, args.window)
                for size in (1024, 128) for producers in (1, 4)]
    if scenario == "latency":
        return asyncio.run(latency(cluster.namesrv_address, args.messages or (500 if quick else 3000)))
    if scenario == "rpc":
        return asyncio.run(rpc(cluster, 200 if quick else 1000))
    if scenario == "consume":
        return asyncio.run(consume(cluster.namesrv_address, min(args.prefill, 20_000) if quick else args.prefill))
    if scenario == "failover":
        return asyncio.run(failover(cluster, 2 if quick else args.trials))
    raise SystemExit(f"unknown scenario {scenario!r}: use publish, latency, rpc, consume or failover")


if __name__ == "__main__":
    sys.exit(main())
