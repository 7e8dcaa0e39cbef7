"""disk-full: a store's filesystem really fills up, and the LMDB map of a store fills up.

RocketMQ users see writes fail with a vague "service not available" when the disk passes its ratio, and no
word at all when the store itself runs out of room. Here:

1. Each replica's store directory is a small tmpfs of its own (mounted by this repro, removed in every case);
   only the master's is filled past diskMaxUsedSpaceRatio with a ballast file. Writes through the route (to the
   master) are refused with the master's path, its real usage and the threshold; reads go on on every replica;
   no acknowledged message is lost; writes resume by themselves once the ballast is gone. A send made straight
   to a follower whose own disk has room is forwarded, and the master's guard refuses it just the same (the
   master checks forwarded writes too), naming the master's disk.
2. A group whose stores have a small LMDB map (storeMapSizeBytes) is written until refused: the map guard
   (storeMapMaxUsedRatio, 90% by default) refuses sends on the first refusal with "LMDB map nearly full", the
   map's size and usage, and "this is not the disk"; no replica reaches MDB_MAP_FULL, every replica keeps
   running and serving reads; after a restart with a larger map every acknowledged message is still there and
   writes go on.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

from broker import config as broker_config
from devkit.devcluster import DevCluster
from devkit.diskfault import MiB, fill, mount_tmpfs, unmount, used_percent
from rocketraft.protocol.errors import RocketraftCode
from rocketraft.protocol.wire import Code, address_of, pb, svc, svc_grpc

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

RATIO_MAX_PERCENT = 75
FILL_TARGET_PERCENT = 92  # well above the threshold: a real, nearly full filesystem
CHECK_INTERVAL_MS = 100
MAP_RATIO_PERCENT = broker_config.BrokerConfig.storeMapMaxUsedRatio  # the default, 90


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_common_arguments(parser)
    parser.add_argument("--fs-mib", type=int, default=128, help="size of the tmpfs holding the stores")
    parser.add_argument("--map-mib", type=int, default=64, help="storeMapSizeBytes of the map-full group, in MiB")
    parser.add_argument("--skip-map-full", action="store_true", help="only the filesystem part")


def run(args: argparse.Namespace) -> int:
    checks = Checklist("repro disk-full")
    with work_dir(args, "disk-full", checks) as work:
        step(f"work directory {work}")
        try:
            filesystem_full(checks, work, args)
            if not args.skip_map_full:
                lmdb_map_full(checks, work, args)
        except Exception as exc:  # noqa: BLE001 - reported as a failed check, cleanup still runs
            checks.check("the repro ran to its end", False, f"{type(exc).__name__}: {exc}")
    return checks.summary()


# -- 1. the filesystem fills up -----------------------------------------------------------------------------------
def filesystem_full(checks: Checklist, work: str, args: argparse.Namespace) -> None:
    if os.geteuid() != 0:
        checks.check("can mount a tmpfs (needs root)", False, f"euid {os.geteuid()}: run as root")
        return
    cluster = DevCluster(os.path.join(work, "cluster-disk"), broker_settings={
        "diskMaxUsedSpaceRatio": RATIO_MAX_PERCENT, "diskCheckIntervalMs": CHECK_INTERVAL_MS,
        "cleanFileForciblyEnable": False})  # the guards alone: retention's forced cleanup would free the space
    mounts = {i: cluster.config_of(i).data_dir for i in cluster.ids}  # <root>/<brokerName>/<selfId>
    mounted = []
    try:
        for replica_id, mount in mounts.items():
            step(f"mounting a {args.fs_mib} MiB tmpfs at {replica_id}'s store directory {mount}")
            mount_tmpfs(mount, args.fs_mib)
            mounted.append(mount)
        cluster.start()
        master = cluster.wait_master()
        cluster.create_topic("disk")
        _fill_and_free(checks, cluster, master, mounts, 50 if args.quick else 500)
    finally:
        step("stopping the cluster and unmounting the tmpfs of every replica")
        cluster.stop()
        for mount in mounted:
            unmount(mount)
        left = [m for m in mounts.values() if os.path.ismount(m)]
        checks.check("every tmpfs is unmounted", not left and len(mounted) == len(mounts),
                     f"{len(mounted)} mounted, still mounted: {left}")


def _send_many(cluster: DevCluster, address: str, topic: str, count: int, body: bytes) -> list[str]:
    acked = []
    for start in range(0, count, 50):
        messages = [raw_message(topic, body) for _ in range(min(50, count - start))]
        acked += acked_ids(send_raw(cluster, address, *messages))
    return acked


def _fill_and_free(checks: Checklist, cluster: DevCluster, master: str, mounts: dict[str, str], count: int) -> None:
    master_address = cluster.address_of[master]
    mount = mounts[master]
    step(f"sending {count} messages to the master {master} ({master_address})")
    acked = _send_many(cluster, master_address, "disk", count, b"m" * 1024)
    checks.check("every message is acknowledged before the disk fills", len(acked) == count,
                 f"{len(acked)}/{count} acknowledged")
    ballast = os.path.join(mount, "ballast")
    step(f"filling only the master's filesystem {mount} with a ballast file to {FILL_TARGET_PERCENT}% "
         f"(threshold {RATIO_MAX_PERCENT}%)")
    size = fill(ballast, FILL_TARGET_PERCENT)
    real = used_percent(mount)
    others = {i: round(used_percent(m), 1) for i, m in mounts.items() if i != master}
    step(f"ballast {size // MiB} MiB: the master's filesystem is {real:.1f}% used; the followers' {others}")
    time.sleep(3 * CHECK_INTERVAL_MS / 1000)
    route = _writable_addresses(cluster, "disk")
    checks.check("the route sends writes to the master only", route == {master_address},
                 f"writable {sorted(route)}; master {master} at {master_address}")
    status = send_raw(cluster, master_address, raw_message("disk", b"while full")).status
    reported = _reported_percent(status.message)
    checks.check("a write through the route (to the master) is refused with code DISK_FULL",
                 status.code == RocketraftCode.DISK_FULL, f"code {status.code}")
    checks.check("the error says disk full and names the threshold and the master's store path",
                 "disk full" in status.message and f"diskMaxUsedSpaceRatio={RATIO_MAX_PERCENT}%" in status.message
                 and f"{mount} is " in status.message, repr(status.message))
    checks.check("the error states the real usage of the master's filesystem (statvfs, within 2 points)",
                 reported is not None and abs(reported - real) <= 2.0,
                 f"reported {reported}%, measured {real:.1f}%")
    follower = followers(cluster)[0]
    step(f"a naive client sends straight to the follower {follower}, whose own filesystem has room")
    forwarded = send_raw(cluster, cluster.address_of[follower], raw_message("disk", b"via follower"))
    acked += acked_ids(forwarded)
    checks.check("the follower forwards the send and the master's guard refuses it, naming the master's disk "
                 "(the follower's own disk has room)",
                 forwarded.status.code == RocketraftCode.DISK_FULL and not acked_ids(forwarded)
                 and "refused the forwarded write" in forwarded.status.message
                 and f"disk full: {mount} is " in forwarded.status.message,
                 f"code {forwarded.status.code}: {short(forwarded.status.message, 300)}")
    step("reading the topic from every replica while the master's disk is full")
    stored = {i: stored_ids(cluster, "disk", i) for i in cluster.ids}
    checks.check("reads go on: every replica serves every acknowledged message",
                 acked and all(set(acked) <= ids for ids in stored.values()),
                 ", ".join(f"{i}: {len(set(acked) & ids)}/{len(acked)}" for i, ids in stored.items()))
    step("removing the ballast")
    os.unlink(ballast)
    freed_at = time.monotonic()
    resumed = wait_for(lambda: send_raw(cluster, master_address, raw_message("disk", b"after")).status.code
                       == Code.OK, 10)
    checks.check("writes to the master resume by themselves once space is freed", bool(resumed),
                 f"after {time.monotonic() - freed_at:.2f} s, filesystem {used_percent(mount):.1f}% used")
    acked += _send_many(cluster, master_address, "disk", count // 5 or 1, b"after")
    stored = wait_for(lambda: _stored_all(cluster, "disk", acked), 10, 0.2) or \
        {i: stored_ids(cluster, "disk", i) for i in cluster.ids}
    lost = {i: len(set(acked) - ids) for i, ids in stored.items()}
    checks.check("no acknowledged message is lost (every replica holds all of them)",
                 acked and not any(lost.values()), f"{len(acked)} acknowledged; missing by replica {lost}")


def _stored_all(cluster: DevCluster, topic: str, acked: list[str]) -> dict[str, set[str]] | None:
    stored = {i: stored_ids(cluster, topic, i) for i in cluster.ids}
    return stored if all(set(acked) <= ids for ids in stored.values()) else None


def _writable_addresses(cluster: DevCluster, topic: str) -> set[str]:
    """Where a route-following client sends writes while the master lives: the first address of brokerId 0's
    endpoints in QueryRoute (the others are the group's other replicas, which forward: docs/architecture.md)."""
    stub = svc_grpc.MessagingServiceStub(cluster.channel(cluster.address_of[cluster.ids[0]]))
    route = stub.QueryRoute(svc.QueryRouteRequest(topic=pb.Resource(name=topic)), timeout=5)
    return {address_of(q.broker.endpoints) for q in route.message_queues if q.broker.id == 0}


def _reported_percent(message: str) -> float | None:
    try:
        return float(message.split(" is ", 1)[1].split("%", 1)[0])
    except (IndexError, ValueError):
        return None


# -- 2. the LMDB map fills up ----------------------------------------------------------------------------------
def lmdb_map_full(checks: Checklist, work: str, args: argparse.Namespace) -> None:
    map_bytes = args.map_mib * MiB
    # the map, not the disk, is what this part fills: the host's own disk usage must not refuse first
    cluster = DevCluster(os.path.join(work, "cluster-map"), broker_settings={
        "storeMapSizeBytes": map_bytes, "diskMaxUsedSpaceRatio": 99,
        "cleanFileForciblyEnable": False})  # the guards alone: retention's forced cleanup would free the map
    step(f"starting a group whose stores have a {args.map_mib} MiB LMDB map (storeMapSizeBytes={map_bytes}, "
         f"storeMapMaxUsedRatio={MAP_RATIO_PERCENT}% and diskCheckIntervalMs=1000 by default; "
         "diskMaxUsedSpaceRatio=99 so the host's disk usage plays no part)")
    try:
        cluster.start()
        master = cluster.wait_master()
        cluster.create_topic("map")
        acked, refusal = _write_until_refused(cluster, master, 2 * map_bytes)
        step(f"{len(acked)} messages acknowledged, then: {short(refusal.message if refusal else 'no refusal')}")
        _check_map_guard_refusal(checks, cluster, refusal, map_bytes)
        _check_replicas_keep_running(checks, cluster, acked)
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


def _check_map_guard_refusal(checks: Checklist, cluster: DevCluster, refusal, map_bytes: int) -> None:
    checks.check("writing towards the map's end is refused with STORE_MAP_FULL",
                 refusal is not None and refusal.code == RocketraftCode.STORE_MAP_FULL,
                 f"first refusal code {refusal.code}" if refusal else "no write was refused")
    first = refusal.message if refusal else ""
    checks.check("the FIRST refusal names the LMDB map, its size and storeMapMaxUsedRatio, and says it is not "
                 "the disk", "LMDB map nearly full" in first and f"of its {map_bytes // MiB} MiB map" in first
                 and f"storeMapMaxUsedRatio={MAP_RATIO_PERCENT}%" in first and "this is not the disk" in first
                 and "disk full" not in first, repr(short(first, 300)))
    step("asking every replica for one more write")
    answers = {i: send_raw(cluster, cluster.address_of[i], raw_message("map", b"x"), timeout_s=15).status
               for i in cluster.ids}
    for replica_id, status in answers.items():
        step(f"{replica_id}: code {status.code}: {short(status.message, 300)}")
    guarded = [i for i, st in answers.items() if st.code == RocketraftCode.STORE_MAP_FULL
               and "LMDB map nearly full" in st.message]
    checks.check("every replica answers with the map guard's refusal (its own, or, for a follower still just "
                 "below the ratio, the master's on the forwarded send); no MDB_MAP_FULL, timeout or no-master answer",
                 set(guarded) == set(cluster.ids),
                 f"refused by a guard: {guarded}; other answers: "
                 f"{ {i: st.code for i, st in answers.items() if i not in guarded} }")


def master_id(cluster: DevCluster) -> str:
    return cluster.wait_master()


def _check_replicas_keep_running(checks: Checklist, cluster: DevCluster, acked: list[str]) -> None:
    logs = {i: open(cluster.brokers[i].log_path, errors="replace").read() for i in cluster.ids}
    stopped = [i for i, text in logs.items() if "MDB_MAP_FULL" in text or "stopped: MapFullError" in text]
    alive = [i for i in cluster.ids if cluster.brokers[i].alive]
    roles = {i: (s.role if s is not None else None) for i, s in cluster.statuses().items()}
    checks.check("no replica reached MDB_MAP_FULL or stopped its Raft engine (logs)", not stopped,
                 f"replicas whose logs name MDB_MAP_FULL: {stopped}")
    checks.check("every broker process is alive, one LEADER and the others FOLLOWER",
                 len(alive) == len(cluster.ids) and sorted(roles.values()) == ["FOLLOWER", "FOLLOWER", "LEADER"],
                 f"alive {alive}; roles {roles}")
    stored = wait_for(lambda: _stored_all(cluster, "map", acked), 10, 0.5)
    counts = {i: len(set(acked) & stored_ids(cluster, "map", i)) for i in cluster.ids}
    checks.check("while refusing sends, every replica serves every acknowledged message",
                 acked and stored, f"{len(acked)} acknowledged; readable by replica {counts}")


def _restart_with_larger_map(checks: Checklist, cluster: DevCluster, acked: list[str], map_bytes: int) -> None:
    step(f"restarting every replica with storeMapSizeBytes={map_bytes}")
    cluster.stop()
    cluster.broker_settings["storeMapSizeBytes"] = map_bytes
    for replica_id in cluster.ids:
        with open(cluster.brokers[replica_id].args[-1], "w") as f:  # the replica's --config file
            f.write(broker_config.to_toml(cluster.config_of(replica_id)))
    cluster.start()
    master = cluster.wait_master(timeout_s=30)
    stored = wait_for(lambda: _stored_all(cluster, "map", acked), 20, 0.5)
    counts = {i: len(set(acked) & stored_ids(cluster, "map", i)) for i in cluster.ids}
    checks.check("after a restart with a larger map every acknowledged message is readable on every replica",
                 acked and stored, f"{len(acked)} acknowledged; readable by replica {counts}")
    response = send_raw(cluster, cluster.address_of[master], raw_message("map", b"after restart"))
    checks.check("writes go on after the restart", response.status.code == Code.OK, response.status.message)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="python -m bench.repro.disk_full", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(parser)
    sys.exit(run(parser.parse_args()))
