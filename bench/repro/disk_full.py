"""disk-full: a store's filesystem really fills up, and the LMDB map of a store fills up.

RocketMQ users see writes fail with a vague "service not available" when the disk passes its ratio, and no
word at all when the store itself runs out of room. Here:

1. A real tmpfs (mounted by this repro, removed in every case) holds the replicas' stores. A ballast file fills
   it past diskMaxUsedSpaceRatio: writes are refused with the real usage, the threshold and the path; reads go
   on on every replica; no acknowledged message is lost; writes resume by themselves once the ballast is gone.
2. A group whose store has a small LMDB map (storeMapSizeBytes) is written until the map is full: the error says
   "LMDB map full" and names the map size, not the disk. The replicas stop writing; after a restart with a
   larger map every acknowledged message is still there and writes go on.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time

from broker import config as broker_config
from rocketraft.devcluster import DevCluster
from rocketraft.wire import Code

from .common import (
    acked_ids,
    add_common_arguments,
    followers,
    raw_message,
    send_raw,
    short,
    step,
    stored_ids,
    wait_for,
    work_dir,
)
from .report import Checklist

MiB = 1024 * 1024
RATIO_MAX_PERCENT = 75
FILL_TARGET_PERCENT = 92  # well above the threshold: a real, nearly full filesystem
CHECK_INTERVAL_MS = 100


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_common_arguments(parser)
    parser.add_argument("--fs-mib", type=int, default=128, help="size of the tmpfs holding the stores")
    parser.add_argument("--map-mib", type=int, default=64, help="storeMapSizeBytes of the map-full group, in MiB")
    parser.add_argument("--skip-map-full", action="store_true", help="only the filesystem part")


def run(args: argparse.Namespace) -> int:
    checks = Checklist("repro disk-full")
    with work_dir(args, "disk-full") as work:
        step(f"work directory {work}")
        try:
            filesystem_full(checks, work, args)
            if not args.skip_map_full:
                lmdb_map_full(checks, work, args)
        except Exception as exc:  # noqa: BLE001 - reported as a failed check, cleanup still runs
            checks.check("the repro ran to its end", False, f"{type(exc).__name__}: {exc}")
    return checks.summary()


# -- 1. the filesystem fills up -----------------------------------------------------------------------------------
def used_percent(path: str) -> float:
    st = os.statvfs(path)
    used = (st.f_blocks - st.f_bfree) * st.f_frsize
    return 100.0 * used / (used + st.f_bavail * st.f_frsize)


def mount_tmpfs(mount: str, size_mib: int) -> None:
    os.makedirs(mount, exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size_mib}m", "tmpfs", mount], check=True)


def unmount(mount: str) -> None:
    subprocess.run(["umount", "-l", mount], check=False)
    try:
        os.rmdir(mount)
    except OSError:
        pass


def fill(path: str, target_percent: float) -> int:
    """Write a ballast file until the filesystem is target_percent used; returns its size."""
    written = 0
    chunk = b"\0" * MiB
    with open(path, "wb") as f:
        while used_percent(os.path.dirname(path)) < target_percent:
            f.write(chunk)
            f.flush()
            os.fsync(f.fileno())
            written += len(chunk)
    return written


def filesystem_full(checks: Checklist, work: str, args: argparse.Namespace) -> None:
    if os.geteuid() != 0:
        checks.check("can mount a tmpfs (needs root)", False, f"euid {os.geteuid()}: run as root")
        return
    mount = os.path.join(work, "small-fs")
    step(f"mounting a {args.fs_mib} MiB tmpfs at {mount} for the replicas' stores")
    mount_tmpfs(mount, args.fs_mib)
    cluster = DevCluster(os.path.join(work, "cluster-disk"), broker_settings={
        "storePathRootDir": os.path.join(mount, "store"), "diskMaxUsedSpaceRatio": RATIO_MAX_PERCENT,
        "diskCheckIntervalMs": CHECK_INTERVAL_MS})
    try:
        cluster.start()
        master = cluster.wait_master()
        cluster.create_topic("disk")
        _fill_and_free(checks, cluster, master, mount, 50 if args.quick else 500)
    finally:
        step("stopping the cluster and unmounting the tmpfs")
        cluster.stop()
        unmount(mount)
        checks.check("the tmpfs is unmounted", not os.path.ismount(mount), mount)


def _send_many(cluster: DevCluster, address: str, topic: str, count: int, body: bytes) -> list[str]:
    acked = []
    for start in range(0, count, 50):
        messages = [raw_message(topic, body) for _ in range(min(50, count - start))]
        acked += acked_ids(send_raw(cluster, address, *messages))
    return acked


def _fill_and_free(checks: Checklist, cluster: DevCluster, master: str, mount: str, count: int) -> None:
    master_address = cluster.address_of[master]
    step(f"sending {count} messages to the master {master} ({master_address})")
    acked = _send_many(cluster, master_address, "disk", count, b"m" * 1024)
    checks.check("every message is acknowledged before the disk fills", len(acked) == count,
                 f"{len(acked)}/{count} acknowledged")
    ballast = os.path.join(mount, "ballast")
    step(f"filling {mount} with a ballast file to {FILL_TARGET_PERCENT}% (threshold {RATIO_MAX_PERCENT}%)")
    size = fill(ballast, FILL_TARGET_PERCENT)
    real = used_percent(mount)
    step(f"ballast {size // MiB} MiB: the filesystem is {real:.1f}% used")
    time.sleep(3 * CHECK_INTERVAL_MS / 1000)
    refused = {}
    for replica_id in cluster.ids:
        refused[replica_id] = send_raw(cluster, cluster.address_of[replica_id], raw_message("disk", b"while full"))
    status = refused[master].status
    reported = _reported_percent(status.message)
    checks.check("a write to the master is refused with code INTERNAL_SERVER_ERROR",
                 status.code == Code.INTERNAL_SERVER_ERROR, f"code {status.code}")
    checks.check("the error says disk full and names the threshold and the path",
                 "disk full" in status.message and f"diskMaxUsedSpaceRatio={RATIO_MAX_PERCENT}%" in status.message
                 and mount in status.message, repr(status.message))
    checks.check("the error states the real usage (statvfs, within 2 points)",
                 reported is not None and abs(reported - real) <= 2.0,
                 f"reported {reported}%, measured {real:.1f}%")
    codes = {i: r.status.code for i, r in refused.items()}
    checks.check("writes through every replica are refused (none is accepted behind the guard's back)",
                 all(c == Code.INTERNAL_SERVER_ERROR for c in codes.values()), f"codes by replica {codes}")
    step("reading the topic from every replica while the disk is full")
    stored = {i: stored_ids(cluster, "disk", i) for i in cluster.ids}
    checks.check("reads go on: every replica serves every acknowledged message",
                 acked and all(set(acked) <= ids for ids in stored.values()),
                 ", ".join(f"{i}: {len(set(acked) & ids)}/{len(acked)}" for i, ids in stored.items()))
    step("removing the ballast")
    os.unlink(ballast)
    freed_at = time.monotonic()
    resumed = wait_for(lambda: send_raw(cluster, master_address, raw_message("disk", b"after")).status.code
                       == Code.OK, 10)
    checks.check("writes resume by themselves once space is freed", bool(resumed),
                 f"after {time.monotonic() - freed_at:.2f} s, filesystem {used_percent(mount):.1f}% used")
    acked += _send_many(cluster, cluster.address_of[followers(cluster)[0]], "disk", count // 5 or 1, b"after")
    stored = {i: stored_ids(cluster, "disk", i) for i in cluster.ids}
    lost = {i: len(set(acked) - ids) for i, ids in stored.items()}
    checks.check("no acknowledged message is lost (every replica holds all of them)",
                 acked and not any(lost.values()), f"{len(acked)} acknowledged; missing by replica {lost}")


def _reported_percent(message: str) -> float | None:
    try:
        return float(message.split(" is ", 1)[1].split("%", 1)[0])
    except (IndexError, ValueError):
        return None


# -- 2. the LMDB map fills up ----------------------------------------------------------------------------------
def lmdb_map_full(checks: Checklist, work: str, args: argparse.Namespace) -> None:
    map_bytes = args.map_mib * MiB
    cluster = DevCluster(os.path.join(work, "cluster-map"), broker_settings={"storeMapSizeBytes": map_bytes})
    step(f"starting a group whose stores have a {args.map_mib} MiB LMDB map (storeMapSizeBytes={map_bytes})")
    try:
        cluster.start()
        master = cluster.wait_master()
        cluster.create_topic("map")
        acked, refusal = _write_until_refused(cluster, master, 2 * map_bytes)
        step(f"{len(acked)} messages acknowledged, then: {short(refusal.message if refusal else 'no refusal')}")
        _check_map_full_refusal(checks, cluster, refusal, map_bytes)
        _restart_with_larger_map(checks, cluster, acked, 4 * map_bytes)
    finally:
        step("stopping the map-full cluster")
        cluster.stop()


def _write_until_refused(cluster: DevCluster, master: str, bytes_max: int):
    """Batches of 16 x 16 KiB messages to the master until one is refused (or bytes_max were sent)."""
    acked, sent = [], 0
    body = b"L" * (16 * 1024)
    while sent < bytes_max:
        response = send_raw(cluster, cluster.address_of[master], *(raw_message("map", body) for _ in range(16)))
        acked += acked_ids(response)
        sent += 16 * len(body)
        if response.status.code != Code.OK:
            failed = [e.status for e in response.entries if e.status.code != Code.OK]
            return acked, failed[0] if failed else response.status
    return acked, None


def _check_map_full_refusal(checks: Checklist, cluster: DevCluster, refusal, map_bytes: int) -> None:
    checks.check("writing past the map is refused", refusal is not None,
                 f"first refusal code {refusal.code}" if refusal else "no write was refused")
    step("asking every replica for one more write")
    answers = {i: send_raw(cluster, cluster.address_of[i], raw_message("map", b"x"), timeout_s=15).status
               for i in cluster.ids}
    for replica_id, status in answers.items():
        step(f"{replica_id}: code {status.code}: {short(status.message, 300)}")
    texts = [refusal.message if refusal else ""] + [s.message for s in answers.values()]
    full = [t for t in texts if "LMDB map full" in t]
    checks.check("a replica whose map is full says LMDB map full and names storeMapSizeBytes",
                 any(f"storeMapSizeBytes={map_bytes}" in t for t in full), repr(short(full[0] if full else "")))
    checks.check("no error calls it a full disk", not any("disk full" in t for t in texts),
                 f"{len(texts)} errors read")
    logs = "".join(open(cluster.brokers[i].log_path, errors="replace").read() for i in cluster.ids)
    stopped = [i for i in cluster.ids if "stopped: MapFullError" in open(cluster.brokers[i].log_path,
                                                                          errors="replace").read()]
    alive = [i for i in cluster.ids if cluster.brokers[i].alive]
    step(f"replicas whose Raft engine stopped on MDB_MAP_FULL: {stopped}; broker processes alive: {alive}. A "
         "stopped replica writes nothing more (so nothing committed is damaged); without a majority the group "
         "takes no writes until restarted with a larger map")
    checks.check("the replicas' logs say what happened (MDB_MAP_FULL)", "MDB_MAP_FULL" in logs,
                 f"stopped on it: {stopped}")


def _restart_with_larger_map(checks: Checklist, cluster: DevCluster, acked: list[str], map_bytes: int) -> None:
    step(f"restarting every replica with storeMapSizeBytes={map_bytes}")
    cluster.stop()
    cluster.broker_settings["storeMapSizeBytes"] = map_bytes
    for replica_id in cluster.ids:
        with open(cluster.brokers[replica_id].args[-1], "w") as f:  # the replica's --config file
            f.write(broker_config.to_toml(cluster.config_of(replica_id)))
    cluster.start()
    master = cluster.wait_master(timeout_s=30)
    stored = wait_for(lambda: _all_stored(cluster, acked), 20, 0.5)
    counts = {i: len(set(acked) & stored_ids(cluster, "map", i)) for i in cluster.ids}
    checks.check("after a restart with a larger map every acknowledged message is readable on every replica",
                 acked and stored, f"{len(acked)} acknowledged; readable by replica {counts}")
    response = send_raw(cluster, cluster.address_of[master], raw_message("map", b"after restart"))
    checks.check("writes go on after the restart", response.status.code == Code.OK, response.status.message)


def _all_stored(cluster: DevCluster, acked: list[str]) -> bool:
    try:
        return all(set(acked) <= stored_ids(cluster, "map", i) for i in cluster.ids)
    except Exception:  # noqa: BLE001 - a replica still catching up
        return False


if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="python -m bench.repro.disk_full", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(parser)
    sys.exit(run(parser.parse_args()))
