"""`python -m bench compare`: rocketraft beside NATS JetStream R3, RabbitMQ quorum queues and Apache RocketMQ
(DLedger, 3 replicas), in one run, on this machine, with ratios (issues 16 and 33). An absolute figure drifts with
the machine's load; a ratio taken in one run, with the systems measured in turn, does much less.

    python -m bench compare                               # every figure, 3 rounds, every peer found
    python -m bench compare --rounds 1 --only publish,latency
    python -m bench compare --only publish,publish_await,publish_threads,publish_small,publish_sdk,batch
    python -m bench compare --peers nats --only drain
    python -m bench compare --peers rocketmq --rounds 1

Each round measures every system in turn (the order rotates between rounds), each on its own fresh 3-node cluster
on 127.0.0.1 that is stopped before the next system starts, so no two systems share the machine's two cores. The
peers are measured by their own scripts (the Python clients nats-py and pika) in ../shared/peers (`--peers-dir`):
install them with `apt-get install -y nats-server rabbitmq-server` and a virtualenv holding
`nats-py pika hdrhistogram` (`--peers-python`, default $VENV/bin/python). rocketraft is measured by the same
shape of client: one client process of our library, 1 KiB bodies. Apache RocketMQ (peer `rocketmq`) is the reference
cluster of devkit/reference.py driven by the official Java SDK through its proxy (bench/rocketmq_peer.py: what it
measures per figure, and what it does not); it is skipped, with the reason printed, when the reference's jars or the
Java SDK's driver are not installed (scripts/setup.sh --tests installs both). Its client is a JVM, the others' are
Python: a caveat on every ratio to it.

Figures (rocketraft / NATS JetStream with nats-py / RabbitMQ quorum queue with pika; RocketMQ's: in
bench/rocketmq_peer.py):
- publish: Producer.send_async with 256 single messages in flight / publish_async with 256 pending / confirms
  with 256 unconfirmed; one client process each.
- publish_await, publish_threads, publish_small (rocketraft's other publishing APIs, each beside the peers'
  publish): 256 asyncio tasks each awaiting Producer.send in a loop; the blocking API, 64 threads each calling
  rocketraft.Producer.send in a loop; send_batch calls of 8 messages from 32 tasks. Each also as a fraction of
  send_batch's rate in the same run (issue 34's goal: >= 0.9), and with the messages per SendMessage request the
  producer made (its stats()).
- publish_sdk: the official Java SDK's single sends against rocketraft (its driver's bench_publish, 256 sendAsync
  outstanding, plaintext; scripts/setup.sh --tests builds it, else the row is skipped with a note): one message per
  request, so the brokers' group commit is all that batches them.
- batch: Producer.send_batch, 256 messages x 8 calls in flight, one process / the peers' publish.
- latency: one Producer.send at a time / one publish at a time / one confirmed publish at a time: p50, p99.
- drain: 200k stored, read by a PullConsumer that commits its offsets / a pull consumer with explicit acks, its
  best batch of 100 and 1000 / basic_consume with prefetch 1000 and a multiple ack every 250.
- failover: kill -9 of the master (restarted in the background) -> next ack / kill -9 of the stream or queue
  leader -> longest gap between acks (the client on a follower).

Throughput: a 2 s warm-up, then acks counted over `--seconds` (10). The goals are issue 16's, checked against the
best peer of the same run. For rocketraft's publish and batch it also prints the CPU its servers and its client spent
per message acknowledged in that window (/proc and getrusage): on a machine shared with other work this moves far
less than the rate, so it is the figure to compare two versions by.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import os
import re
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field

from . import client as cb
from .workdir import keep, scratch_dir

FIGURES = ("publish", "publish_await", "publish_threads", "publish_small", "publish_sdk", "batch", "latency", "drain",
           "failover")
PEERS = ("nats", "rabbitmq", "rocketmq")
SCRIPTED_PEERS = ("nats", "rabbitmq")  # measured by ../shared/peers scripts with --peers-python
TOPIC = cb.TOPIC  # bench.client's latency scenario is this one's
BODY_BYTES = 1024
DRAIN_S_MAX = 120  # a drain that has not received every stored message by then ends, and gives no figure
LOCK = "/tmp/bench.lock"  # the peers' scripts hold it around every timed run; so do we
HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_PEERS_DIR = os.path.normpath(os.path.join(HERE, "..", "..", "shared", "peers"))
# how each figure compares: higher is better for rates, lower for times
HIGHER_IS_BETTER = {"publish": True, "publish_await": True, "publish_threads": True, "publish_small": True,
                    "publish_sdk": True, "batch": True, "drain": True, "latency_p50": False, "latency_p99": False,
                    "failover": False}
# issue 16's goals: rocketraft's figure against the best peer's (publish and batch against the peers' publish)
# (issue 34: each publishing API also >= 90 % of send_batch 256 x 8 in the same run: the "of send_batch" column)
GOALS = {"publish": ("x", 1.2), "publish_await": ("x", 1.2), "publish_threads": ("x", 1.2),
         "publish_small": ("x", 1.2), "publish_sdk": ("x", 1.2), "batch": ("x", 2.0), "drain": ("x", 1.2),
         "latency_p50": ("<=", 1.0), "failover": ("s", 0.1)}
OF_BATCH_GOAL = 0.9


@dataclass
class Figures:
    """One system's figures, every round's value kept."""
    values: dict[str, list[float]] = field(default_factory=lambda: collections.defaultdict(list))
    notes: list[str] = field(default_factory=list)

    def add(self, name: str, value: float | None) -> None:
        if value is not None:
            self.values[name].append(value)

    def median(self, name: str) -> float | None:
        got = self.values.get(name)
        return statistics.median(got) if got else None


# -- rocketraft's side: a client process of our library against a fresh cluster ------------------------------------
# How each publishing API is driven (the report's publish rows): (mode, calls in flight, messages per call).
# Every one keeps 256 messages in flight, so the rows differ only by the API a user chose.
PUBLISH_APIS = {
    "publish": ("send_async", 256, 1),      # Producer.send_async, 256 outstanding
    "publish_await": ("await", 256, 1),     # 256 asyncio tasks, each `await producer.send(m)` in a loop
    "publish_threads": ("threads", 64, 1),  # the blocking API: 64 threads, each `producer.send(m)` in a loop
    "publish_small": ("batch", 32, 8),      # send_batch of 8 messages from 32 tasks
    "batch": ("batch", 8, 256),             # send_batch of 256 messages, 8 calls in flight
}


class _Window:
    """Acks counted inside [warmup, warmup + seconds), and the CPU the servers and this client spent there."""

    def __init__(self, warmup_s: float, seconds: float, server_pids: list[int]):
        began = time.perf_counter()
        self.window_from, self.window_to = began + warmup_s, began + warmup_s + seconds
        self.seconds, self.server_pids = seconds, server_pids
        self.in_window = self.failed = 0
        self.first_error = ""
        self.cpu: dict[str, float] = {}

    def open(self) -> bool:
        return time.perf_counter() < self.window_to

    def sample(self, at: str) -> None:
        import resource

        from .metrics_cost import cpu_s

        usage = resource.getrusage(resource.RUSAGE_SELF)
        self.cpu[f"client_{at}"] = usage.ru_utime + usage.ru_stime
        self.cpu[f"servers_{at}"] = sum(cpu_s(pid) for pid in self.server_pids)

    def sample_both_ends(self) -> None:
        """Blocking: sleeps to the window's start, samples, sleeps to its end, samples."""
        time.sleep(max(0.0, self.window_from - time.perf_counter()))
        self.sample("from")
        time.sleep(max(0.0, self.window_to - time.perf_counter()))
        self.sample("to")

    def done(self, count: int, error: BaseException | None) -> None:
        if error is not None:
            self.failed += count
            self.first_error = self.first_error or f"{type(error).__name__}: {str(error)[:300]}"
            return
        if self.window_from <= time.perf_counter() < self.window_to:
            self.in_window += count

    def result(self, lanes: dict[str, dict[str, int]]) -> dict:
        """lanes: the producer's stats(), SendMessage requests and messages per broker address."""
        acked = max(1, self.in_window)
        requests = sum(lane["requests"] for lane in lanes.values())
        return {"msgs_per_s": self.in_window / self.seconds, "failed": self.failed,
                "msgs_per_request": sum(lane["messages"] for lane in lanes.values()) / max(1, requests),
                "first_error": self.first_error,
                "servers_cpu_us_per_msg": (self.cpu["servers_to"] - self.cpu["servers_from"]) / acked * 1e6,
                "client_cpu_us_per_msg": (self.cpu["client_to"] - self.cpu["client_from"]) / acked * 1e6}


async def _pub_window(namesrv: str, mode: str, window: int, batch: int, warmup_s: float, seconds: float,
                      server_pids: list[int]) -> dict:
    """Acks inside [warmup, warmup + seconds) of one asyncio publishing API (PUBLISH_APIS), with `window` calls
    in flight of `batch` messages each. Also the CPU the servers (server_pids) and this client spent in that
    window per message acknowledged in it: a figure that other load on the machine moves much less than the
    rate."""
    from rocketraft.client.message import Message
    from rocketraft.client.producer import Producer

    body = b"x" * BODY_BYTES
    w = _Window(warmup_s, seconds, server_pids)
    async with Producer(namesrv, topics=[TOPIC], requests_in_flight_max=max(4, window if batch > 1 else 4)) as p:
        sampler = asyncio.ensure_future(asyncio.to_thread(w.sample_both_ends))
        if mode == "send_async":
            slots = asyncio.Semaphore(window)

            def released(_receipt, error) -> None:
                slots.release()
                w.done(1, error)

            while w.open():
                await slots.acquire()
                p.send_async(Message(TOPIC, body), released)
            await p.flush(timeout_s=30)
        else:
            async def one_caller() -> None:
                while w.open():
                    try:
                        if mode == "await":
                            await p.send(Message(TOPIC, body))
                        else:
                            await p.send_batch([Message(TOPIC, body) for _ in range(batch)])
                    except Exception as exc:  # noqa: BLE001 - counted and reported as the figure's failures
                        w.done(batch, exc)
                    else:
                        w.done(batch, None)

            await asyncio.gather(*(one_caller() for _ in range(window)))
        await sampler
        lanes = p.stats()
    return w.result(lanes)


def _pub_threads(namesrv: str, threads: int, warmup_s: float, seconds: float, server_pids: list[int]) -> dict:
    """The blocking API (rocketraft.Producer): `threads` threads, each sending one message at a time."""
    import threading

    import rocketraft

    body = b"x" * BODY_BYTES
    w = _Window(warmup_s, seconds, server_pids)
    lock = threading.Lock()

    def one_caller(producer) -> None:
        while w.open():
            try:
                producer.send(rocketraft.Message(TOPIC, body))
            except Exception as exc:  # noqa: BLE001 - counted and reported as the figure's failures
                with lock:
                    w.done(1, exc)
            else:
                with lock:
                    w.done(1, None)

    with rocketraft.Producer(namesrv, topics=[TOPIC]) as producer:
        callers = [threading.Thread(target=one_caller, args=(producer,), daemon=True) for _ in range(threads)]
        for t in callers:
            t.start()
        w.sample_both_ends()
        for t in callers:
            t.join(30)
        lanes = producer.stats()
    return w.result(lanes)


async def _drain(namesrv: str, prefill: int) -> dict:
    from rocketraft.client.message import Message
    from rocketraft.client.producer import Producer
    from rocketraft.client.pull_consumer import PullConsumer

    body = b"x" * BODY_BYTES
    async with Producer(namesrv, topics=[TOPIC], requests_in_flight_max=8) as producer:
        async def fill(calls: int) -> None:
            for _ in range(calls):
                await producer.send_batch([Message(TOPIC, body) for _ in range(256)])

        await asyncio.gather(*(fill(prefill // 256 // 8) for _ in range(8)))
    stored = prefill // 256 // 8 * 256 * 8
    async with PullConsumer(namesrv, group="bench-compare-drain", topics={TOPIC: "*"}) as consumer:
        began, received = time.perf_counter(), 0
        while received < stored and time.perf_counter() - began < DRAIN_S_MAX:
            received += len(await consumer.poll(max_messages=1024, timeout_s=2.0))
        await consumer.commit()
        elapsed = time.perf_counter() - began
    return {"msgs_per_s": received / elapsed, "received": received, "stored": stored}


def _worker(argv: list[str]) -> int:
    """`python -m bench compare _worker <figure> <namesrv> ...`: one rocketraft client process, one JSON line."""
    figure, namesrv, *rest = argv
    if figure in PUBLISH_APIS:
        mode, window, batch = PUBLISH_APIS[figure]
        warmup_s, seconds = float(rest[0]), float(rest[1])
        pids = [int(pid) for pid in rest[2].split(",") if pid]
        result = (_pub_threads(namesrv, window, warmup_s, seconds, pids) if mode == "threads"
                  else asyncio.run(_pub_window(namesrv, mode, window, batch, warmup_s, seconds, pids)))
    elif figure == "latency":  # bench.client's: 200 sends to warm up, then `count` timed ones
        result = asyncio.run(cb.latency(namesrv, int(rest[0])))
    elif figure == "drain":
        result = asyncio.run(_drain(namesrv, int(rest[0])))
    else:
        raise SystemExit(f"unknown worker figure {figure}")
    print(json.dumps(result), flush=True)
    return 0


def _client_process(cluster, args: list[str], timeout_s: float) -> dict:
    out = subprocess.run([sys.executable, "-m", "bench", "compare", "_worker", *args], env=cluster.env,
                         capture_output=True, text=True, timeout=timeout_s)
    if out.returncode != 0:
        raise RuntimeError(f"rocketraft client {args[0]} failed: {out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def measure_rocketraft(opts, figures: Figures, base: str, round_no: int) -> None:
    from devkit.devcluster import DevCluster

    for figure in opts.only:
        cluster = DevCluster(os.path.join(base, f"rocketraft-{round_no}-{figure}"), flush=opts.flush,
                             log_level="WARNING")
        cluster.start()
        try:
            cluster.wait_master()
            cluster.create_topic(TOPIC)
            ns = cluster.namesrv_address
            pids = ",".join(str(proc.process.pid) for proc in [*cluster.brokers.values(), *cluster.namesrv_procs])
            with _locked():
                if figure in PUBLISH_APIS:
                    r = _client_process(cluster, [figure, ns, "2", str(opts.seconds), pids], 120)
                    if r["failed"]:  # a rate of refusals is no figure: said, with the first error and the logs
                        figures.notes.append(
                            f"rocketraft {figure} round {round_no + 1}: {r['failed']} sends failed (first: "
                            f"{r['first_error']}); the cluster's logs: {cluster.base_dir}/logs")
                        keep(cluster.base_dir)
                    if not r["msgs_per_s"]:
                        continue
                    figures.add(figure, r["msgs_per_s"])
                    figures.add(f"{figure}_cpu_servers_us", r["servers_cpu_us_per_msg"])
                    figures.add(f"{figure}_cpu_client_us", r["client_cpu_us_per_msg"])
                    figures.add(f"{figure}_msgs_per_request", r["msgs_per_request"])
                elif figure == "publish_sdk":
                    _publish_sdk(opts, figures, cluster, round_no)
                elif figure == "latency":
                    r = _client_process(cluster, [figure, ns, str(opts.latency_count)], 300)
                    figures.add("latency_p50", r["p50_ms"])
                    figures.add("latency_p99", r["p99_ms"])
                elif figure == "drain":
                    r = _client_process(cluster, [figure, ns, str(opts.prefill)], 600)
                    if r["received"] < r["stored"]:  # a rate over part of the messages is no drain figure
                        figures.notes.append(
                            f"rocketraft drain round {round_no + 1}: received {r['received']} of {r['stored']} stored "
                            f"within {DRAIN_S_MAX} s, no figure; the cluster's logs: {cluster.base_dir}/logs")
                        keep(cluster.base_dir)
                        continue
                    figures.add("drain", r["msgs_per_s"])
                elif figure == "failover":
                    r = asyncio.run(cb.failover(cluster, 1))
                    figures.add("failover", r["gap_max_s"])
                    if r["lost"]:
                        figures.notes.append(f"rocketraft failover lost {r['lost']} acknowledged messages")
        finally:
            cluster.stop()


def _publish_sdk(opts, figures: Figures, cluster, round_no: int) -> None:
    """The official Java SDK's single sends (its driver's bench_publish, as for the rocketmq peer: sendAsync with 256
    outstanding, plaintext) through the NameServer's endpoint: one message per SendMessage request, so what batches
    them is the broker's group commit at the door."""
    from devkit import sdkdrivers

    from .rocketmq_peer import java_driver

    if not sdkdrivers.installed("java"):
        figures.notes.append(f"rocketraft publish_sdk: skipped, {sdkdrivers.MISSING['java']}")
        return
    log_dir = os.path.join(cluster.base_dir, "java-sdk")
    r = java_driver(["bench_publish", cluster.namesrv_address, TOPIC, "256", str(BODY_BYTES), "2", str(opts.seconds)],
                    log_dir, opts.seconds + 120)
    if r["failed"]:
        figures.notes.append(f"rocketraft publish_sdk round {round_no + 1}: {r['failed']} sends failed (first: "
                             f"{r['first_error']}); the cluster's logs: {cluster.base_dir}/logs")
        keep(cluster.base_dir)
    figures.add("publish_sdk", r["msgs_per_s"] or None)


# -- the peers: their own scripts ----------------------------------------------------------------------------------
def _run_peer(cmd: list[str], cwd: str, timeout_s: float, env: dict | None = None) -> str:
    out = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=timeout_s, env=env)
    if out.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({out.returncode}): {(out.stderr or out.stdout)[-2000:]}")
    return out.stdout + out.stderr


def _json_line(text: str) -> dict:
    return json.loads([line for line in text.splitlines() if line.startswith("{")][-1])


def measure_nats(opts, figures: Figures) -> None:
    here, py = os.path.join(opts.peers_dir, "nats"), opts.peers_python
    _run_peer(["./stop_cluster.sh", "--wipe"], here, 60)
    _run_peer(["./start_cluster.sh", "--fresh"], here, 90)
    try:
        seconds = str(opts.seconds)
        for figure in peer_figures(opts.only):
            with _locked():
                if figure == "publish":
                    text = _run_peer([py, "bench.py", "pub", "--size", str(BODY_BYTES), "--windows", "256", "--procs",
                                      "1", "--repeats", "1", "--duration", seconds, "--warmup", "2"], here, 175)
                    figures.add("publish", _number(r"MEDIAN .*?: ([\d,]+) msgs/s", text))
                elif figure == "latency":
                    text = _run_peer([py, "bench.py", "lat", "--size", str(BODY_BYTES), "--count",
                                      str(opts.latency_count), "--warmup", "500"], here, 175)
                    figures.add("latency_p50", _number(r"p50=(\d+)us", text) / 1000)
                    figures.add("latency_p99", _number(r"p99=(\d+)us", text) / 1000)
                elif figure == "drain":
                    text = _run_peer([py, "bench.py", "consume", "--size", str(BODY_BYTES), "--prefill",
                                      str(opts.prefill), "--batches", "100,1000", "--acks", "explicit"], here, 400)
                    rates = [float(x.replace(",", "")) for x in re.findall(r"ack=explicit batch=\s*\d+: .*? = ([\d,]+) "
                                                                             r"msgs/s", text)]
                    figures.add("drain", max(rates) if rates else None)
                elif figure == "failover":
                    text = _run_peer([py, "bench.py", "failover", "--size", str(BODY_BYTES), "--connect", "follower"],
                                     here, 175)
                    figures.add("failover", _number(r"LONGEST GAP between successful acks: ([\d.]+)s", text))
                    missing = _number(r"ACKED BUT MISSING: (\d+)", text)
                    if missing:
                        figures.notes.append(f"NATS failover lost {missing:.0f} acknowledged messages")
    finally:
        _run_peer(["./stop_cluster.sh", "--wipe"], here, 60)


def measure_rabbitmq(opts, figures: Figures) -> None:
    here, py = os.path.join(opts.peers_dir, "rabbitmq"), opts.peers_python
    _run_peer(["./stop-cluster.sh", "--wipe"], here, 120)
    _run_peer(["./start-cluster.sh", "--wipe"], here, 300)
    try:
        for figure in peer_figures(opts.only):
            with _locked():
                if figure == "publish":
                    r = _json_line(_run_peer([py, "bench.py", "publish", "--size", str(BODY_BYTES), "--window", "256",
                                              "--procs", "1", "--warmup", "2", "--duration", str(opts.seconds)],
                                             here, 170))
                    figures.add("publish", r["msgs_per_s"])
                elif figure == "latency":
                    r = _json_line(_run_peer([py, "bench.py", "latency", "--size", str(BODY_BYTES), "--count",
                                              str(opts.latency_count)], here, 170))
                    figures.add("latency_p50", r["p50_us"] / 1000)
                    figures.add("latency_p99", r["p99_us"] / 1000)
                elif figure == "drain":
                    _run_peer([py, "bench.py", "fill", "--size", str(BODY_BYTES), "--count", str(opts.prefill)],
                              here, 300)
                    r = _json_line(_run_peer([py, "bench.py", "consume", "--prefetch", "1000", "--ack-every", "250"],
                                             here, 300))
                    figures.add("drain", r["msgs_per_s"])
                elif figure == "failover":
                    r = _json_line(_run_peer([py, "bench.py", "failover", "--size", str(BODY_BYTES),
                                              "--client-node", "follower"], here, 170))
                    figures.add("failover", r["max_gap_ms"] / 1000)
                    if r.get("missing_confirmed"):
                        figures.notes.append(f"RabbitMQ failover lost {r['missing_confirmed']} confirmed messages")
                    _run_peer(["./start-cluster.sh"], here, 300)  # the killed node back, for the next figure
    finally:
        _run_peer(["./stop-cluster.sh", "--wipe"], here, 120)


def peer_figures(only: list[str]) -> list[str]:
    """What a peer measures for the figures asked: its publish stands beside both of ours (publish and batch)."""
    out = []
    for figure in only:
        figure = peer_figure(figure)
        if figure not in out:
            out.append(figure)
    return out


def _number(pattern: str, text: str) -> float | None:
    found = re.search(pattern, text)
    return float(found.group(1).replace(",", "")) if found else None


class _locked:
    """flock(LOCK) around one timed run, as the peers' scripts take it: two benchmarks never overlap."""

    def __enter__(self):
        import fcntl

        self._file = open(LOCK, "a")  # noqa: SIM115 - held until __exit__
        fcntl.flock(self._file, fcntl.LOCK_EX)
        return self

    def __exit__(self, *exc) -> None:
        self._file.close()


# -- the report --------------------------------------------------------------------------------------------------
ROWS = (("publish", "acked publish, send_async, 256 single messages in flight, 1 client (msgs/s)"),
        ("publish_await", "acked publish, await send from 256 tasks, 1 client (msgs/s; peers: their publish)"),
        ("publish_threads", "acked publish, blocking send from 64 threads, 1 client (msgs/s; peers: their publish)"),
        ("publish_small", "acked publish, send_batch of 8 from 32 tasks (msgs/s; peers: their publish)"),
        ("publish_sdk", "acked publish, official Java SDK, sendAsync 256 outstanding (msgs/s; peers: their publish)"),
        ("batch", "acked publish, send_batch of 256, 8 calls in flight (msgs/s; peers: their publish)"),
        ("latency_p50", "one sync send at a time, p50 (ms)"),
        ("latency_p99", "one sync send at a time, p99 (ms)"),
        ("drain", "drain 200k stored, acked (msgs/s)"),
        ("failover", "kill -9 of the leader/master -> next ack (s)"))


def peer_figure(name: str) -> str:
    """The peer's figure that stands beside one of ours: every publishing API of ours beside the peer's publish."""
    return "publish" if name in PUBLISH_APIS or name == "publish_sdk" else name


def best_peer(name: str, peers: dict[str, Figures]) -> tuple[str, float] | None:
    peer_name = peer_figure(name)
    got = [(p, f.median(peer_name)) for p, f in peers.items() if f.median(peer_name) is not None]
    if not got:
        return None
    pick = max if HIGHER_IS_BETTER[name] else min
    return pick(got, key=lambda pv: pv[1])


def report(ours: Figures, peers: dict[str, Figures]) -> list[dict]:
    rows = []
    for name, label in ROWS:
        mine = ours.median(name)
        if mine is None:
            continue
        best = best_peer(name, peers)
        row = {"name": name, "figure": label, "rocketraft": mine, "rocketraft_runs": ours.values[name]}
        for peer, f in peers.items():
            row[peer] = f.median(peer_figure(name))
        if (name in PUBLISH_APIS or name == "publish_sdk") and name != "batch" and ours.median("batch"):
            row["of_batch"] = mine / ours.median("batch")
            row["of_batch_met"] = row["of_batch"] >= OF_BATCH_GOAL
        if best is not None:
            row["best_peer"] = best[0]
            row["ratio"] = mine / best[1] if best[1] else None
        goal = GOALS.get(name)
        if goal is not None:
            kind, target = goal
            if kind == "s":
                row["goal"], row["met"] = f"<= {target} s", mine <= target
            elif best is not None and kind == "x":
                row["goal"], row["met"] = f">= {target}x best peer", mine >= target * best[1]
            elif best is not None:
                row["goal"], row["met"] = "<= best peer", mine <= best[1]
        rows.append(row)
    return rows


def print_report(rows: list[dict], peers: list[str], notes: list[str]) -> None:
    def cell(v) -> str:
        if v is None:
            return "-"
        if isinstance(v, bool):
            return "yes" if v else "no"
        return f"{v:,.0f}" if v >= 100 else f"{v:.3g}"

    header = ["figure", *peers, "rocketraft", "ratio to best", "goal", "met", "of send_batch (goal >= 0.9)"]
    print(" | ".join(header))
    print(" | ".join("---" for _ in header))
    for r in rows:
        ratio = f"{r['ratio']:.2f} ({r['best_peer']})" if r.get("ratio") else "-"
        print(" | ".join([r["figure"], *(cell(r.get(p)) for p in peers), cell(r["rocketraft"]), ratio,
                          r.get("goal", "-"), cell(r.get("met")),
                          f"{r['of_batch']:.2f} ({cell(r['of_batch_met'])})" if "of_batch" in r else "-"]))
    for note in notes:
        print(f"note: {note}")


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m bench compare", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=3, help="rounds; medians are reported")
    p.add_argument("--only", default=",".join(FIGURES), help=f"comma-separated figures of {', '.join(FIGURES)}")
    p.add_argument("--peers", default=",".join(PEERS), help="comma-separated peers (nats, rabbitmq, rocketmq), or "
                                                            "none")
    p.add_argument("--peers-dir", default=DEFAULT_PEERS_DIR, help="the peers' scripts (default ../shared/peers)")
    p.add_argument("--peers-python", default=os.path.join(os.environ.get("VENV", "/work/peers-venv"), "bin", "python"),
                   help="a Python with nats-py, pika and hdrhistogram (default $VENV/bin/python)")
    p.add_argument("--seconds", type=float, default=10.0, help="throughput: the counted window after a 2 s warm-up")
    p.add_argument("--latency-count", type=int, default=5000, help="latency: timed sends")
    p.add_argument("--prefill", type=int, default=200_000, help="drain: messages stored first")
    p.add_argument("--flush", default="ASYNC_FLUSH", choices=["ASYNC_FLUSH", "SYNC_FLUSH"], help="rocketraft's")
    p.add_argument("--dir", help="where rocketraft's clusters keep data and logs (default: a temp dir)")
    p.add_argument("--out", default=os.path.join(HERE, "results"), help="results directory")
    return p


def main(argv: list[str]) -> int:
    if argv[:1] == ["_worker"]:
        return _worker(argv[1:])
    opts = parser().parse_args(argv)
    opts.only = [f for f in opts.only.split(",") if f]
    unknown = set(opts.only) - set(FIGURES)
    if unknown:
        print(f"unknown figures {sorted(unknown)}: use {', '.join(FIGURES)}", file=sys.stderr)
        return 2
    from .rocketmq_peer import measure_rocketmq, missing

    peer_names = [p for p in opts.peers.split(",") if p and p != "none"]
    for peer in peer_names:
        if peer not in PEERS:
            print(f"unknown peer {peer!r}: use {', '.join(PEERS)}", file=sys.stderr)
            return 2
        if peer in SCRIPTED_PEERS and not os.path.isdir(os.path.join(opts.peers_dir, peer)):
            print(f"no {peer} scripts in {opts.peers_dir} (--peers-dir); use --peers to leave it out", file=sys.stderr)
            return 2
    if "rocketmq" in peer_names and missing():
        print(f"rocketmq skipped: {missing()}", file=sys.stderr)
        peer_names.remove("rocketmq")
    if set(peer_names) & set(SCRIPTED_PEERS) and not os.access(opts.peers_python, os.X_OK):
        print(f"{opts.peers_python} is not a Python with nats-py, pika and hdrhistogram (--peers-python or $VENV)",
              file=sys.stderr)
        return 2
    base = scratch_dir(opts.dir, "bench-compare-")
    ours, peers = Figures(), {p: Figures() for p in peer_names}
    systems = ["rocketraft", *peer_names]
    measure = {"rocketraft": lambda r: measure_rocketraft(opts, ours, base, r),
               "nats": lambda r: measure_nats(opts, peers["nats"]),
               "rabbitmq": lambda r: measure_rabbitmq(opts, peers["rabbitmq"]),
               "rocketmq": lambda r: measure_rocketmq(opts, peers["rocketmq"], base, r)}
    for round_no in range(opts.rounds):
        order = systems[round_no % len(systems):] + systems[:round_no % len(systems)]
        for system in order:
            print(f"round {round_no + 1}/{opts.rounds}: {system} ...", file=sys.stderr, flush=True)
            began = time.monotonic()
            measure[system](round_no)
            print(f"  done in {time.monotonic() - began:.0f} s", file=sys.stderr, flush=True)
    rows = report(ours, peers)
    notes = ours.notes + [n for f in peers.values() for n in f.notes]
    print_report(rows, peer_names, notes)
    for figure in PUBLISH_APIS:
        servers, client = ours.median(f"{figure}_cpu_servers_us"), ours.median(f"{figure}_cpu_client_us")
        if servers is not None:
            print(f"rocketraft {figure}: CPU per acknowledged message {servers:.0f} us in the servers (3 brokers and "
                  f"the NameServer), {client:.0f} us in the client; "
                  f"{ours.median(f'{figure}_msgs_per_request'):.1f} messages per SendMessage request (medians)")
    os.makedirs(opts.out, exist_ok=True)
    path = os.path.join(opts.out, f"compare-{time.strftime('%Y%m%d-%H%M%S')}.json")
    with open(path, "w") as f:
        json.dump({"date": time.strftime("%Y-%m-%d %H:%M"), "rounds": opts.rounds, "flush": opts.flush,
                   "rows": rows, "peers": {p: dict(f.values) for p, f in peers.items()},
                   "rocketraft": dict(ours.values), "notes": notes}, f, indent=1)
    print(f"results: {path}")
    return 0
