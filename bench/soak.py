"""Soak: a steady publish and consume for minutes, with retention of seconds, leadership transfers and rolling
restarts, watching that disk, memory, ack gaps and loss stay flat (issue 13's proof).

    python -m bench soak --minutes 30 --retention-s 60
    python -m bench soak --minutes 2 --retention-s 10 --transfer-every-s 20 --restart-every-s 60   # short

One cluster (a NameServer and a 3-replica group, real processes) with fileReservedTime = --retention-s and a
cleanup every second. One producer thread sends 1 KiB messages one at a time at --rate per second; one
SimpleConsumer thread receives and acknowledges (rocketraft's client). Every --transfer-every-s the master is
asked to hand leadership to a random follower (BrokerAdmin.TransferLeader); every --restart-every-s the group
gets a rolling restart (followers first, master last: SIGTERM, start, catch up). Every --sample-s it records
each replica's store size on disk (data.mdb and the snapshot files), each broker process's resident memory,
the acknowledged and consumed counts and the longest gap between acknowledgements.

At the end the producer stops, the consumer drains, and it prints the samples, the flatness figures (store
size and memory in the last third of the run against the end of the first retention period plus one minute)
and the loss (acknowledged, never consumed). A PNG plot and the JSON go to --out.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import threading
import time
from dataclasses import dataclass, field
from datetime import date

from devkit.devcluster import DevCluster, metric_value, scrape_metrics
from rocketraft.protocol.wire import ipb, ipb_grpc

from . import plots
from .rolling import RESULTS_DIR, Recorder, RocketraftClient, _consume, restart, restart_order
from .workdir import describe, scratch_dir

BODY_BYTES = 1024
TOPIC, GROUP = "soak", "soak-readers"


@dataclass
class Sample:
    t_s: float
    store_mib: dict[str, float]
    rss_mib: dict[str, float]
    acked: int
    consumed: int
    gap_max_s: float  # the longest time without an acknowledgement in this sample's interval
    first_index: dict[str, float] = field(default_factory=dict)  # lowest Raft log index still stored, per replica
    retention_deleted: float = 0.0  # messages retention deleted so far (summed over the masters that ran it)


@dataclass
class Soak:
    cluster: DevCluster
    rate: float
    record: Recorder = field(default_factory=Recorder)
    events: list[tuple[float, str]] = field(default_factory=list)
    samples: list[Sample] = field(default_factory=list)
    started: float = field(default_factory=time.monotonic)

    def log(self, text: str) -> None:
        at = time.monotonic() - self.started
        self.events.append((round(at, 1), text))
        print(f"{at:8.1f}s  {text}", flush=True)

    def produce(self, client: RocketraftClient, stop: threading.Event) -> None:
        """Paced sync sends: one every 1/rate s (later when a send takes longer)."""
        pad, period, i = b"x" * BODY_BYTES, 1.0 / self.rate, 0
        next_at = time.monotonic()
        while not stop.is_set():
            body = b"soak-%d-" % i
            body += pad[:max(0, BODY_BYTES - len(body))]
            i += 1
            try:
                client.send(body)
                self.record.acks.append((time.monotonic(), body))
            except Exception as exc:  # noqa: BLE001 - recorded: a failed send after the client's own retries
                self.record.failures.append(f"{type(exc).__name__}: {exc}"[:300])
            next_at += period
            time.sleep(max(0.0, next_at - time.monotonic()))

    def sample(self, since: float) -> Sample:
        now = time.monotonic()
        acks = [t for t, _ in self.record.acks[-int(self.rate * 120) - 10:] if t > since]
        times = [since] + acks + [now]
        gap = max((b - a for a, b in zip(times, times[1:], strict=False)), default=0.0)
        scraped = {r: scrape(self.cluster, r) for r in self.cluster.ids}
        s = Sample(round(now - self.started, 1), {r: store_mib(self.cluster, r) for r in self.cluster.ids},
                   {r: rss_mib(self.cluster, r) for r in self.cluster.ids}, len(self.record.acks),
                   len(self.record.consumed), round(gap, 3),
                   {r: metric_value(found, "rocketraft_raft_first_index") or 0.0 for r, found in scraped.items()},
                   sum(metric_value(found, "rocketraft_retention_deleted_messages_total") or 0.0
                       for found in scraped.values()))
        self.samples.append(s)
        return s

    def transfer(self, rng: random.Random) -> None:
        master = self.cluster.master()
        followers = [r for r in self.cluster.ids if r != master and self.cluster.brokers[r].alive]
        if master is None or not followers:
            self.log("transfer skipped: no master or no live follower")
            return
        target = rng.choice(followers)
        stub = ipb_grpc.BrokerAdminStub(self.cluster.channel(self.cluster.address_of[master]))
        try:
            answer = stub.TransferLeader(ipb.TransferLeaderRequest(to=target), timeout=10)
            self.log(f"transfer {master} -> {target}: {answer.new_master or '-'} {answer.message or 'OK'}")
        except Exception as exc:  # noqa: BLE001 - logged: the soak goes on
            self.log(f"transfer {master} -> {target} failed: {exc}")

    def rolling_restart(self) -> None:
        order = restart_order(self.cluster)
        for replica in order:
            done = restart(self.cluster, replica, settle_s=1.0)
            self.log(f"restarted {replica}{' (master)' if done['was_master'] else ''}: back in {done['back_s']} s")


def scrape(cluster: DevCluster, replica: str) -> list:
    """The replica's metrics now; [] while it is down or restarting."""
    try:
        return scrape_metrics(cluster.metrics_address_of[replica], timeout_s=2.0)
    except OSError:
        return []


def store_mib(cluster: DevCluster, replica: str) -> float:
    """The replica's dledger files on disk (the LMDB store and the snapshot files), in MiB."""
    root = os.path.join(cluster.config_of(replica).data_dir, "dledger")
    total = 0
    for directory, _dirs, files in os.walk(root):
        for name in files:
            try:
                total += os.stat(os.path.join(directory, name)).st_blocks * 512
            except OSError:
                pass  # a snapshot renamed while we walk
    return round(total / 2**20, 2)


def rss_mib(cluster: DevCluster, replica: str) -> float:
    proc = cluster.brokers[replica].process
    try:
        with open(f"/proc/{proc.pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return round(int(line.split()[1]) / 1024, 1)
    except (OSError, AttributeError):
        pass
    return 0.0


def flatness(samples: list[Sample], settled_s: float) -> dict:
    """Store size and memory: the largest in the last third of the run against the largest between settled_s and
    the start of the last third (growth in %), per replica."""
    end = samples[-1].t_s
    early = [s for s in samples if settled_s <= s.t_s < end * 2 / 3]
    late = [s for s in samples if s.t_s >= end * 2 / 3]
    if not early or not late:
        return {"note": f"run too short to compare (needs samples after {settled_s:.0f} s and in the last third)"}
    out = {}
    for what in ("store_mib", "rss_mib"):
        for replica in samples[0].store_mib:
            before = max(getattr(s, what)[replica] for s in early)
            after = max(getattr(s, what)[replica] for s in late)
            out[f"{what}.{replica}"] = {"settled_max": before, "last_third_max": after,
                                        "growth_pct": round(100 * (after - before) / before, 1) if before else None}
    return out


def plot(path: str, samples: list[Sample], events: list[tuple[float, str]]) -> str:
    plt = plots._pyplot()
    fig, (disk, rss, gap) = plt.subplots(3, 1, figsize=(9, 9), sharex=True)
    times = [s.t_s for s in samples]
    for replica in samples[0].store_mib:
        disk.plot(times, [s.store_mib[replica] for s in samples], label=replica)
        rss.plot(times, [s.rss_mib[replica] for s in samples], label=replica)
    gap.plot(times, [s.gap_max_s for s in samples], marker=".")
    for at, text in events:
        for ax in (disk, rss, gap):
            ax.axvline(at, color="red" if text.startswith("restarted") else "grey", alpha=0.3, lw=0.8)
    disk.set(ylabel="store on disk (MiB)", title="soak: store size, memory and ack gaps (red: restarts, grey: "
             "transfers)")
    rss.set(ylabel="broker RSS (MiB)")
    gap.set(ylabel="longest ack gap (s)", xlabel="seconds")
    for ax in (disk, rss, gap):
        ax.grid(alpha=0.3)
    disk.legend()
    return plots._save(fig, plt, path)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench soak", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--minutes", type=float, default=30.0)
    p.add_argument("--retention-s", type=float, default=60.0, help="fileReservedTime, in seconds")
    p.add_argument("--rate", type=float, default=200.0, help="messages per second (sync sends, one at a time)")
    p.add_argument("--transfer-every-s", type=float, default=120.0)
    p.add_argument("--restart-every-s", type=float, default=300.0)
    p.add_argument("--sample-s", type=float, default=5.0)
    p.add_argument("--drain-s", type=float, default=30.0)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--dir", help="cluster data and logs (default: a temp dir)")
    p.add_argument("--out", default=RESULTS_DIR, help="results directory (default bench/results)")
    args = p.parse_args(argv)
    if args.minutes <= 0 or args.retention_s <= 0 or args.rate <= 0 or args.sample_s <= 0:
        print("--minutes, --retention-s, --rate and --sample-s must be positive", file=sys.stderr)
        return 2
    base = scratch_dir(args.dir, "bench-soak-")
    settings = {"fileReservedTime": args.retention_s / 3600, "cleanResourceInterval": 1000,
                "dLegerCompactionMinEntries": 1000, "dLegerCompactionMinIntervalMs": 5000}
    print(f"starting a NameServer and a 3-replica group in {describe(base)} (retention {args.retention_s:g} s) ...",
          flush=True)
    cluster = DevCluster(os.path.join(base, "soak"), broker_settings=settings)
    rng = random.Random(args.seed)
    try:
        cluster.start()
        cluster.wait_master(30)
        cluster.create_topic(TOPIC)
        cluster.create_group(GROUP)
        soak = Soak(cluster, args.rate)
        result = run(soak, args, rng)
    finally:
        cluster.stop()
    report(result, args)
    return 0 if result["lost"] == 0 and result["failed_sends"] == 0 else 1


def run(soak: Soak, args, rng: random.Random) -> dict:
    client = RocketraftClient(soak.cluster.namesrv_address, TOPIC, GROUP)
    stop_producing, stop_consuming = threading.Event(), threading.Event()
    producer = threading.Thread(target=soak.produce, args=(client, stop_producing), daemon=True)
    consumer = threading.Thread(target=_consume, args=(client, soak.record, stop_consuming), daemon=True)
    end = soak.started + args.minutes * 60
    next_transfer = soak.started + args.transfer_every_s
    next_restart = soak.started + args.restart_every_s
    try:
        producer.start()
        consumer.start()
        last = time.monotonic()
        while time.monotonic() < end:
            time.sleep(min(args.sample_s, max(0.0, end - time.monotonic())))
            s = soak.sample(last)
            last = time.monotonic()
            print(f"{s.t_s:8.1f}s  acked {s.acked}, consumed {s.consumed}, gap {s.gap_max_s:.3f} s, store MiB "
                  f"{s.store_mib}, RSS MiB {s.rss_mib}", flush=True)
            if time.monotonic() >= next_restart:
                soak.rolling_restart()
                next_restart = time.monotonic() + args.restart_every_s
            elif time.monotonic() >= next_transfer:
                soak.transfer(rng)
                next_transfer = time.monotonic() + args.transfer_every_s
        stop_producing.set()
        producer.join(30)
        acked = {body for _, body in soak.record.acks}
        deadline = time.monotonic() + args.drain_s
        while time.monotonic() < deadline and not acked <= set(soak.record.consumed):
            time.sleep(0.1)
    finally:
        stop_producing.set()
        stop_consuming.set()
        consumer.join(30)
        client.close()
    lost = acked - set(soak.record.consumed)
    return {"date": date.today().isoformat(), "minutes": args.minutes, "retention_s": args.retention_s,
            "rate": args.rate, "acked": len(acked), "failed_sends": len(soak.record.failures),
            "lost": len(lost), "lost_examples": [b[:24].decode(errors="replace") for b in list(lost)[:5]],
            "duplicates": sum(n - 1 for n in soak.record.consumed.values()),
            "gap_max_s": max((s.gap_max_s for s in soak.samples), default=0.0),
            "retention_deleted": max((s.retention_deleted for s in soak.samples), default=0.0),
            "first_index_end": soak.samples[-1].first_index if soak.samples else {},
            "flatness": flatness(soak.samples, args.retention_s + 60), "events": soak.events,
            "samples": [s.__dict__ for s in soak.samples], "failure_examples": soak.record.failures[:5],
            "load_avg_end": round(os.getloadavg()[0], 1)}


def report(result: dict, args) -> None:
    print(f"\nsoak {result['minutes']:g} min, retention {result['retention_s']:g} s, {result['rate']:g} msg/s: "
          f"acked {result['acked']}, failed sends {result['failed_sends']}, lost {result['lost']}, duplicates "
          f"{result['duplicates']}, longest ack gap {result['gap_max_s']:.3f} s, load average at the end "
          f"{result['load_avg_end']}")
    print(f"  retention deleted {result['retention_deleted']:.0f} messages (counted by the masters that ran it; a "
          f"restarted master's count starts again); lowest stored log index at the end {result['first_index_end']}")
    for key, value in result["flatness"].items():
        print(f"  {key}: {value}")
    os.makedirs(args.out, exist_ok=True)
    stem = os.path.join(args.out, f"soak-{result['date']}-{int(time.time())}")
    with open(stem + ".json", "w") as f:
        json.dump(result, f, indent=1)
    print(f"results: {stem}.json")
    if plots.available() and result["samples"]:
        samples = [Sample(**s) for s in result["samples"]]
        print(f"plot: {plot(stem + '.png', samples, result['events'])}")
