"""slave-write: clients that write to a slave (follower).

In RocketMQ a producer with a stale route, or one that ignores roles, sends to a slave and gets "the broker
is a slave" errors or silently lost writes. Here:

1. A naive client (raw gRPC SendMessage, no route at all) writes straight to a follower: the follower forwards
   through Raft and the send succeeds; the message is stored on the group.
2. The official SDK (rocketmq-python-client) caches a route, the master is killed and restarted (it comes
   back as a follower); the SDK, still on its stale route, sends to it: every send succeeds.
3. Routes never list a follower as writable, before and after the failover.
4. With slaveForwardEnable=false a follower refuses the write with HA_NOT_AVAILABLE, and the error names the
   current master's id and address and says to refresh the route.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time

from devkit.devcluster import DevCluster
from rocketraft.protocol.wire import Code, pb, svc, svc_grpc

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

RECONNECT_WAIT_S = 15.0  # the official SDK's channel to a restarted broker: at most this long to reconnect


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_common_arguments(parser)


def run(args: argparse.Namespace) -> int:
    logging.getLogger("rocketmq-python-client").setLevel(logging.CRITICAL)  # it logs every retry at ERROR
    checks = Checklist("repro slave-write")
    with work_dir(args, "slave-write", checks) as work:
        step(f"work directory {work}")
        try:
            forwarding_on(checks, work, 10 if args.quick else 100)
            forwarding_off(checks, work)
        except Exception as exc:  # noqa: BLE001 - reported as a failed check, cleanup still runs
            checks.check("the repro ran to its end", False, f"{type(exc).__name__}: {exc}")
    return checks.summary()


def writable_brokers(cluster: DevCluster, topic: str) -> dict[str, set[int]]:
    """address -> brokerIds of the route's queues that accept writes."""
    stub = svc_grpc.MessagingServiceStub(cluster.channel(cluster.namesrv_address))
    route = stub.QueryRoute(svc.QueryRouteRequest(topic=pb.Resource(name=topic)), timeout=5)
    out: dict[str, set[int]] = {}
    for q in route.message_queues:
        if q.permission in (pb.Permission.WRITE, pb.Permission.READ_WRITE):
            a = q.broker.endpoints.addresses[0]
            out.setdefault(f"{a.host}:{a.port}", set()).add(q.broker.id)
    return out


def check_route(checks: Checklist, cluster: DevCluster, topic: str, when: str) -> None:
    master = cluster.wait_master()
    writable = writable_brokers(cluster, topic)
    checks.check(f"{when}: the route lists only the master as writable (brokerId 0)",
                 writable == {cluster.address_of[master]: {0}},
                 f"writable {writable}; master {master} at {cluster.address_of[master]}")


# -- forwarding on (the default) ----------------------------------------------------------------------------------
def forwarding_on(checks: Checklist, work: str, count: int) -> None:
    cluster = DevCluster(os.path.join(work, "cluster-forwarding"))
    try:
        cluster.start()
        master = cluster.wait_master()
        cluster.create_topic("slave-write")
        check_route(checks, cluster, "slave-write", "before the failover")
        follower = followers(cluster)[0]
        step(f"naive client: raw gRPC SendMessage straight to follower {follower} ({cluster.address_of[follower]})")
        response = send_raw(cluster, cluster.address_of[follower], *(raw_message("slave-write", b"naive %d" % i)
                                                                       for i in range(count)))
        naive = acked_ids(response)
        checks.check("the follower forwards the naive client's sends and they succeed", len(naive) == count,
                     f"{len(naive)}/{count} SEND_OK, status {response.status.code} {response.status.message!r}")
        stored = stored_ids(cluster, "slave-write", master)
        checks.check("the forwarded messages are stored on the master", set(naive) <= stored,
                     f"{len(set(naive) & stored)}/{len(naive)} read back from {master}")
        sdk_stale_route(checks, cluster, master, count)
        check_route(checks, cluster, "slave-write", "after the failover")
    finally:
        step("stopping the cluster")
        cluster.stop()


def sdk_stale_route(checks: Checklist, cluster: DevCluster, old_master: str, count: int) -> None:
    from rocketmq import ClientConfiguration, Credentials, Message, Producer

    def message(body: bytes) -> Message:
        m = Message()
        m.topic = "slave-write"
        m.body = body
        return m

    config = ClientConfiguration(cluster.namesrv_address, Credentials(), request_timeout=5)
    producer = Producer(config, ("slave-write",))
    producer.startup()
    try:
        step(f"official SDK: one send caches the route (master {old_master})")
        producer.send(message(b"sdk before"))
        step(f"kill -9 the master {old_master}; a supervisor restarts it and it comes back as a follower")
        cluster.kill(old_master)
        cluster.start_replica(old_master)
        new_master = cluster.wait_master(timeout_s=15, not_id=old_master)
        role = wait_for(lambda: getattr(cluster.replica_status(old_master), "role", "") == "FOLLOWER" and "FOLLOWER",
                        10)
        step(f"new master {new_master}; {old_master} is {role or 'not yet a follower'}; the SDK refreshes routes "
             "every 30 s, so its next sends go to the old master's address")
        # The SDK's gRPC channel to that address saw refused connections while the process was down (its
        # heartbeats) and backs off before it connects again (gRPC: 1 s, x1.6 per failure): a send in that window
        # fails at once without reaching the broker. Wait for the channel, not for the route.
        refused, reconnect_deadline = 0, time.monotonic() + RECONNECT_WAIT_S
        while True:
            try:
                producer.send(message(b"sdk reconnect"))
                break
            except Exception as exc:  # noqa: BLE001 - the channel still backs off; anything else shows below
                refused += 1
                if time.monotonic() > reconnect_deadline:
                    step(f"the SDK's channel did not reconnect within {RECONNECT_WAIT_S:.0f} s: {short(str(exc), 200)}")
                    break
                time.sleep(0.2)
        step(f"the SDK's channel to {cluster.address_of[old_master]} is connected again ({refused} sends failed at "
             "once while it backed off)")
        ids, errors = [], []
        for i in range(count):
            try:
                ids.append(producer.send(message(b"sdk stale %d" % i)).message_id)
            except Exception as exc:  # noqa: BLE001 - recorded as evidence
                errors.append(short(str(exc), 200))
        checks.check("the SDK's sends on its stale route (to a follower) succeed", len(ids) == count and not errors,
                     f"{len(ids)}/{count} SEND_OK; the SDK's cached route names {cluster.address_of[old_master]} "
                     f"({old_master}, now {role}) as the only writable broker; "
                     f"errors {errors[:2]}")
        stored = stored_ids(cluster, "slave-write", new_master)
        checks.check("they are stored on the new master", set(ids) <= stored,
                     f"{len(set(ids) & stored)}/{len(ids)} read back from {new_master}")
    finally:
        producer.shutdown()


# -- forwarding off ---------------------------------------------------------------------------------------------
def forwarding_off(checks: Checklist, work: str) -> None:
    cluster = DevCluster(os.path.join(work, "cluster-no-forwarding"), broker_settings={"slaveForwardEnable": False})
    try:
        step("a second group with slaveForwardEnable=false")
        cluster.start()
        master = cluster.wait_master()
        cluster.create_topic("no-forward")
        check_route(checks, cluster, "no-forward", "forwarding off")
        follower = followers(cluster)[0]
        step(f"raw gRPC SendMessage straight to follower {follower}")
        status = send_raw(cluster, cluster.address_of[follower], raw_message("no-forward", b"x")).status
        step(f"answer: code {status.code}: {status.message}")
        checks.check("the follower refuses the write with HA_NOT_AVAILABLE", status.code == Code.HA_NOT_AVAILABLE,
                     f"code {status.code}")
        checks.check("the error names the current master and its address and says to refresh the route",
                     f"the master is {master} at {cluster.address_of[master]}" in status.message
                     and "refresh the topic route" in status.message, repr(status.message))
        response = send_raw(cluster, cluster.address_of[master], raw_message("no-forward", b"to the master"))
        checks.check("the master named in the error accepts the write", response.status.code == Code.OK,
                     response.status.message)
    finally:
        step("stopping the cluster")
        cluster.stop()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="python -m bench.repro.slave_write", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(parser)
    sys.exit(run(parser.parse_args()))
