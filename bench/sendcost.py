"""Where a send's CPU goes, process by process and thread by thread, at a given concurrency (issue 34).

    python -m bench sendcost                              # 1, 16 and 256 sends in flight, 5 s each
    python -m bench sendcost --concurrency 1 --seconds 10

A fresh cluster (a NameServer and a 3-replica group, ASYNC_FLUSH unless --flush); one client in this process sends
1 KiB messages from `concurrency` asyncio tasks, each awaiting Producer.send in a loop. For each level it prints
the sends per second, the messages per SendMessage request (the producer's own count), and the CPU each process
and each thread of the master and of one follower spent per acknowledged send over the window (/proc: process
time, so other load on the machine moves it much less than the rate). Threads are named with `py-spy dump` when
py-spy is installed (the dev dependencies have it), else by their ids. At 1 in flight every send is its own
request and its own Raft entry: the figure is the group's fixed cost of one request, which concurrency shares.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import shutil
import subprocess
import sys
import time

from .compare import BODY_BYTES
from .metrics_cost import cpu_s
from .workdir import scratch_dir

TOPIC = "bench-sendcost"


def thread_cpu(pid: int) -> dict[int, float]:
    """CPU seconds of each thread of a process so far."""
    out = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            out[int(tid)] = cpu_s(pid, int(tid))
        except FileNotFoundError:  # a thread that ended
            continue
    return out


def thread_names(pid: int) -> dict[int, str]:
    """Thread names by thread id: Python's, from `py-spy dump` when py-spy is installed, else the kernel's (gRPC's
    own threads name themselves there, such as event_engine; Python's are all "python")."""
    names = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/comm") as f:
                names[int(tid)] = f.read().strip()
        except FileNotFoundError:
            continue
    spy = shutil.which("py-spy") or os.path.join(os.path.dirname(sys.executable), "py-spy")
    if os.access(spy, os.X_OK):
        out = subprocess.run([spy, "dump", "-p", str(pid)], capture_output=True, text=True, timeout=30).stdout
        names.update((int(tid), name) for tid, name in re.findall(r'^Thread (\d+) \([^)]*\): "([^"]*)"', out,
                                                                    re.MULTILINE))
    return names


async def _level(namesrv: str, concurrency: int, seconds: float, pids: dict[str, int], watched: dict[str, int]) -> dict:
    from rocketraft.client.message import Message
    from rocketraft.client.producer import Producer

    body = b"x" * BODY_BYTES
    async with Producer(namesrv, topics=[TOPIC]) as producer:
        for _ in range(200):  # warm up: routes, connections, the brokers' caches
            await producer.send(Message(TOPIC, body))
        before = producer.stats()
        cpu0 = {name: cpu_s(pid) for name, pid in pids.items()}
        threads0 = {name: thread_cpu(pid) for name, pid in watched.items()}
        began = time.perf_counter()
        sent = 0

        async def one_caller() -> None:
            nonlocal sent
            while time.perf_counter() - began < seconds:
                await producer.send(Message(TOPIC, body))
                sent += 1

        await asyncio.gather(*(one_caller() for _ in range(concurrency)))
        elapsed = time.perf_counter() - began
        cpu1 = {name: cpu_s(pid) for name, pid in pids.items()}
        threads1 = {name: thread_cpu(pid) for name, pid in watched.items()}
        after = producer.stats()
    requests = sum(s["requests"] for s in after.values()) - sum(s["requests"] for s in before.values())
    messages = sum(s["messages"] for s in after.values()) - sum(s["messages"] for s in before.values())
    per_send = {name: (cpu1[name] - cpu0[name]) / max(1, sent) * 1e6 for name in pids}
    threads = {name: {tid: (t - threads0[name].get(tid, 0.0)) / max(1, sent) * 1e6
                      for tid, t in threads1[name].items()} for name in watched}
    return {"concurrency": concurrency, "sends_per_s": sent / elapsed, "msgs_per_request": messages / max(1, requests),
            "cpu_us_per_send": per_send, "thread_cpu_us_per_send": threads}


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m bench sendcost", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--concurrency", default="1,16,256", help="comma-separated sends in flight, one level each")
    p.add_argument("--seconds", type=float, default=5.0, help="the measured window of each level")
    p.add_argument("--flush", default="ASYNC_FLUSH", choices=["ASYNC_FLUSH", "SYNC_FLUSH"])
    p.add_argument("--dir", help="where the cluster keeps data and logs (default: a temp dir)")
    opts = p.parse_args(argv)
    try:
        levels = [int(c) for c in opts.concurrency.split(",") if c]
    except ValueError:
        p.error(f"--concurrency {opts.concurrency!r}: comma-separated whole numbers, such as 1,16,256")
    if not levels or min(levels) < 1 or opts.seconds <= 0:
        p.error("--concurrency needs levels of at least 1 and --seconds a positive number")
    from devkit.devcluster import DevCluster

    cluster = DevCluster(os.path.join(scratch_dir(opts.dir, "bench-sendcost-"), "cluster"), flush=opts.flush,
                         log_level="WARNING")
    cluster.start()
    try:
        master = cluster.wait_master()
        cluster.create_topic(TOPIC)
        follower = next(name for name in cluster.brokers if name != master)
        pids = {f"{name} (master)" if name == master else name: proc.process.pid
                for name, proc in cluster.brokers.items()}
        pids["namesrv"] = cluster.namesrv_procs[0].process.pid
        pids["client"] = os.getpid()
        watched = {f"{master} (master)": cluster.brokers[master].process.pid,
                   follower: cluster.brokers[follower].process.pid}
        names = {name: thread_names(pid) for name, pid in watched.items()}
        print(f"sendcost: 1 KiB sends, {opts.flush}, {opts.seconds:g} s per level; master {master}")
        for level in levels:
            r = asyncio.run(_level(cluster.namesrv_address, level, opts.seconds, pids, watched))
            print(f"\n{level} in flight: {r['sends_per_s']:,.0f} sends/s, {r['msgs_per_request']:.1f} messages per "
                  "request; CPU per send (us):")
            print("  processes: " + ", ".join(f"{name} {us:.0f}" for name, us in r["cpu_us_per_send"].items()))
            for name, threads in r["thread_cpu_us_per_send"].items():
                busy = sorted(((us, tid) for tid, us in threads.items() if us >= 1), reverse=True)
                print(f"  {name} threads: " + ", ".join(
                    f"{names[name].get(tid, f'tid {tid}')} {us:.0f}" for us, tid in busy))
    finally:
        cluster.stop()
    return 0
