"""Apache RocketMQ as a peer of `python -m bench compare` (issue 33): the reference cluster of devkit/reference.py
(Apache RocketMQ 5.3.3: a NameServer, one broker group of three brokers with the DLedger CommitLog, a proxy in
cluster mode; RocketMQ's defaults but for small JVM heaps and files, docs/reference.md), driven by the official Java
SDK (rocketmq-client-java 5.2.0, gRPC, through the proxy, plaintext) in our driver's process (tests/sdk_java: its
bench_publish, bench_latency, bench_drain and bench_send_loop modes).

Figures, beside rocketraft's and the other peers' (compare.py's docstring):
- publish: Producer.sendAsync with 256 single messages outstanding, acks counted over --seconds after a 2 s warm-up;
  one JVM.
- batch: not measured, as for NATS and RabbitMQ: the Java 5 SDK has no batch send (its publish stands beside
  rocketraft's send_batch).
- latency: one Producer.send at a time, 500 to warm up, then --latency-count timed: p50, p99.
- drain: --prefill messages stored (sendAsync, 256 outstanding), then read by each consumer of DRAIN_CONSUMERS in
  turn, each in a group of its own over the same stored messages: a SimpleConsumer on 4 threads (receive(32), an
  ackAsync of each message), and, if added there, a PushConsumer (the SDK's defaults: 20 consumption threads, 1,024
  cached messages, each message acknowledged by its own AckMessage); msgs/s from the consumer's build to the last
  distinct message. The figure is the best of them (each printed in a note); none unless every stored message came
  within DRAIN_S_MAX_S.
- failover: one send at a time (bench_send_loop: the SDK's own retries, each send's start and end timed by the driver)
  through kill -9 of the master (not restarted): the end of the first acknowledged send after the kill minus the kill.
  The proxy keeps RocketMQ's default route refresh (topicRouteServiceCacheRefreshSeconds = 20), which this figure
  mostly is (docs/reference.md). Acknowledged messages are not read back: no loss count.

One fresh reference per round, every figure on it in turn (failover last: it kills the master), each figure on its
own topic. The Java client is a JVM with the C2 compiler on (not the tests' C1-only driver options): the figure is a
client's, so the client is not handicapped against the brokers, which run C2 too.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time

from devkit import reference, sdkdrivers

from .compare import BODY_BYTES, Figures, _locked, peer_figures
from .workdir import keep

PEER = "rocketmq"
# The bench client's JVM: the heap the tests' driver has (x2: a PushConsumer caches up to 1,024 messages), serial GC
# (2 cores), C2 on.
JAVA_OPTIONS = ("-Xmx256m", "-Xss512k", "-XX:+UseSerialGC", "-Drocketmq.log.level=warn")
PLAIN = {"SDK_TLS": "0"}  # plaintext, as the Python clients of the other systems
WARMUP_SENDS = 500
# drain: the consumers tried in turn, each in its own group over the same stored messages; the best is the figure (as
# NATS's best batch size is). The PushConsumer is left out: on 5,000 stored it took 401 msgs/s against the
# SimpleConsumer's 799 (load 11), and 200k at that rate would add 8 minutes to every round.
DRAIN_CONSUMERS = ("simple",)
DRAIN_S_MAX_S = 600  # rocketraft's is compare.DRAIN_S_MAX (120 s); RocketMQ's consumers are slower than 200k in 120 s
FAILOVER_S_MAX = 90.0  # docs/reference.md: sends through the proxy failed for 19 s after a kill, once over 45 s
STREAK_S = 1.0  # failover: this long of acknowledged sends before the kill


def missing() -> str | None:
    """Why the peer cannot run here, or None."""
    if not reference.available():
        return reference.MISSING
    if not sdkdrivers.installed("java"):
        return sdkdrivers.MISSING["java"]
    return None


def java_driver(args: list[str], log_dir: str, timeout_s: float) -> dict:
    """One bench_ run of the Java driver: its one result line."""
    os.makedirs(log_dir, exist_ok=True)
    command = ["java", *JAVA_OPTIONS, f"-Drocketmq.log.root={log_dir}", "-jar", sdkdrivers.JAVA_JAR, *args]
    env = {**os.environ, "rocketmq.client.logRoot": log_dir, "rocketmq.client.logLevel": "warn", **PLAIN}
    out = subprocess.run(command, cwd=log_dir, capture_output=True, text=True, timeout=timeout_s,
                         stdin=subprocess.DEVNULL, env=env)
    events = [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
    result = next((e for e in events if e["event"] == args[0]), None)
    if result is None:
        fatal = next((e["error"] for e in events if e["event"] == "fatal"), "")
        hint = " (an old jar: rebuild it, `mvn -q package` in tests/sdk_java)" if "unknown command" in fatal else ""
        raise RuntimeError(f"the Java driver's {args[0]} gave no result{hint}: {fatal or out.stderr[-2000:]}")
    return result


def _failover(ref, topic: str, log_dir: str) -> dict:
    """kill -9 of the master under bench_send_loop (one send at a time, each with the driver's own start and end
    times): {"gap_s": the end of the first acknowledged send that ended after the kill - the kill, or None; "failed":
    the sends that ended failed between the kill and that ack; "killed"}."""
    os.makedirs(log_dir, exist_ok=True)
    sender = sdkdrivers.SdkDriver("java", "bench_send_loop", ref.proxy_grpc_endpoint, topic, str(BODY_BYTES),
                                  log_dir=log_dir, env=PLAIN)

    def sends() -> list[dict]:
        return sender.events("send")

    def acked_since(t_us: int) -> bool:
        recent = [s for s in sends() if s["end_us"] >= t_us]
        return bool(recent) and all(s["ok"] for s in recent)

    try:
        deadline = time.monotonic() + 60
        began_us = time.time_ns() // 1000
        while not (time.time_ns() // 1000 - began_us >= STREAK_S * 1e6
                   and acked_since(time.time_ns() // 1000 - int(STREAK_S * 1e6))):
            if time.monotonic() > deadline or not sender.reading:
                raise RuntimeError(f"no {STREAK_S} s of acknowledged sends before the kill: {sender.tail()}")
            time.sleep(0.05)
        master = ref.master()
        kill_us = time.time_ns() // 1000
        master.kill()
        deadline = time.monotonic() + FAILOVER_S_MAX
        first = None
        while first is None and time.monotonic() < deadline and sender.reading:
            first = next((s for s in sends() if s["ok"] and s["end_us"] > kill_us), None)
            time.sleep(0.05)
    finally:
        sender.stop()
    until_us = first["end_us"] if first else float("inf")
    failed = [s for s in sends() if not s["ok"] and kill_us < s["end_us"] <= until_us]
    return {"gap_s": (first["end_us"] - kill_us) / 1e6 if first else None, "failed": len(failed),
            "first_error": failed[0]["error"][:300] if failed else "", "killed": master.name}


def measure_rocketmq(opts, figures: Figures, base: str, round_no: int) -> None:
    """One round: a fresh reference, the figures asked (failover last), the reference stopped. A figure that failed
    is a note, not a crash of the whole comparison; the reference's folder is then kept (and named), else removed."""
    from devkit.reference import ReferenceCluster

    home = os.path.join(base, f"rocketmq-{round_no}")
    where = f"RocketMQ round {round_no + 1}"
    ref = ReferenceCluster(home)
    try:
        ref.start()
    except Exception as e:  # noqa: BLE001 - said, and the other systems' figures still come
        figures.notes.append(f"{where}: the reference did not start, no figures: {str(e)[:500]}")
        keep(home)
        return
    troubled = False
    try:
        for figure in sorted(peer_figures(opts.only), key=lambda f: f == "failover"):
            topic = f"bench-compare-{figure}"
            try:
                ref.create_topic(topic)
                with _locked():
                    troubled |= _measure(opts, figures, ref, figure, topic, os.path.join(home, "client", figure),
                                         where)
            except (RuntimeError, OSError, subprocess.TimeoutExpired) as e:
                figures.notes.append(f"{where} {figure}: no figure: {str(e)[:500]}; logs: {home}")
                troubled = True
    finally:
        ref.stop()
        if troubled:
            keep(home)
        else:
            shutil.rmtree(home, ignore_errors=True)


def _measure(opts, figures: Figures, ref, figure: str, topic: str, log_dir: str, where: str) -> bool:
    """One figure on the running reference; True when something failed (the logs are worth keeping)."""
    endpoint = ref.proxy_grpc_endpoint
    if figure == "publish":
        r = java_driver(["bench_publish", endpoint, topic, "256", str(BODY_BYTES), "2", str(opts.seconds)], log_dir,
                    opts.seconds + 120)
        if r["failed"]:
            figures.notes.append(f"{where} publish: {r['failed']} sends failed (first: {r['first_error']}); "
                                 f"logs: {ref.base_dir}")
        figures.add("publish", r["msgs_per_s"] or None)
        return bool(r["failed"])
    elif figure == "latency":
        r = java_driver(["bench_latency", endpoint, topic, str(BODY_BYTES), str(WARMUP_SENDS), str(opts.latency_count)],
                    log_dir, 600)
        if r["failed"]:
            figures.notes.append(f"{where} latency: {r['failed']} sends failed (first: {r['first_error']})")
        figures.add("latency_p50", r["p50_ms"])
        figures.add("latency_p99", r["p99_ms"])
        return bool(r["failed"])
    elif figure == "drain":
        r = java_driver(["bench_drain", endpoint, "bench-compare-drain", topic, str(BODY_BYTES), str(opts.prefill),
                     str(DRAIN_S_MAX_S), ",".join(DRAIN_CONSUMERS)], log_dir, 3600)
        if r["fill_failed"]:
            figures.notes.append(f"{where} drain: {r['fill_failed']} of the stores failed ({r['fill_error']})")
        complete = {kind: d for kind, d in r["consumers"].items() if d["received"] >= r["stored"]}
        figures.notes.append(f"{where} drain: {r['stored']:,} stored at {r['fill_msgs_per_s']:,.0f} msgs/s; "
                             + ", ".join(f"{kind} {d['received']:,} in {d['elapsed_s']:.1f} s "
                                         f"({d['msgs_per_s']:,.0f} msgs/s)" for kind, d in r["consumers"].items()))
        if not complete:  # a rate over part of the messages is no drain figure
            figures.notes.append(f"{where} drain: no consumer received every stored message within {DRAIN_S_MAX_S} "
                                 f"s, no figure; logs: {ref.base_dir}")
            return True
        figures.add("drain", max(d["msgs_per_s"] for d in complete.values()))
        return bool(r["fill_failed"])
    elif figure == "failover":
        r = _failover(ref, topic, log_dir)
        if r["gap_s"] is None:
            figures.notes.append(f"{where} failover: no acknowledged send within {FAILOVER_S_MAX:.0f} s of the "
                                 f"kill -9 of {r['killed']} ({r['failed']} failed, the first: {r['first_error']}); "
                                 f"logs: {ref.base_dir}")
            return True
        figures.add("failover", r["gap_s"])
        figures.notes.append(f"{where} failover: kill -9 of {r['killed']} -> next ack {r['gap_s']:.2f} s, "
                             f"{r['failed']} sends failed meanwhile (each after the SDK's retries)")
    return False
