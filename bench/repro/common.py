"""What every reproduction shares: its arguments, its work directory, step output, raw gRPC sends and reads."""

from __future__ import annotations

import argparse
import contextlib
import os
import time
import uuid
from collections.abc import Callable

from devkit.devcluster import DevCluster
from rocketraft.protocol.wire import Code, pb, svc, svc_grpc

from ..workdir import keep, scratch_dir
from .report import Checklist


def add_common_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--dir", default=None, help="work directory (default: a new temporary directory, removed "
                                                     "at exit after a PASS, kept and named after a FAIL)")
    parser.add_argument("--quick", action="store_true", help="fewer messages: the short form the tests run")


def step(text: str) -> None:
    print(f"- {text}", flush=True)


@contextlib.contextmanager
def work_dir(args: argparse.Namespace, name: str, checks: Checklist):
    """The run's directory: --dir as given (kept), or a temporary one (bench/workdir.py) removed when the process
    exits, also on SIGTERM. After a FAIL, or an error out of the run, it is kept and its path printed: its logs
    are what explains the FAIL."""
    path = os.path.abspath(scratch_dir(args.dir, f"repro-{name}-"))
    try:
        yield path
    except Exception:
        keep(path)
        raise
    if not checks.passed:
        keep(path)


def raw_message(topic: str, body: bytes) -> pb.Message:
    """An apache.rocketmq.v2.Message as any client puts it on the wire (no SDK involved)."""
    system = pb.SystemProperties(message_id=uuid.uuid4().hex, body_encoding=pb.Encoding.IDENTITY)
    system.born_timestamp.GetCurrentTime()
    return pb.Message(topic=pb.Resource(name=topic), body=body, system_properties=system)


def send_raw(cluster: DevCluster, address: str, *messages: pb.Message,
             timeout_s: float = 10) -> svc.SendMessageResponse:
    """One SendMessage straight to `address`, ignoring roles and routes."""
    stub = svc_grpc.MessagingServiceStub(cluster.channel(address))
    return stub.SendMessage(svc.SendMessageRequest(messages=list(messages)), timeout=timeout_s)


def acked_ids(response: svc.SendMessageResponse) -> list[str]:
    return [e.message_id for e in response.entries if e.status.code == Code.OK and e.message_id]


def stored_ids(cluster: DevCluster, topic: str, replica_id: str) -> set[str]:
    """Message ids of `topic` stored on one replica, read with plain PullMessage calls."""
    messages = cluster.read_messages(topic, cluster.address_of[replica_id])
    return {m.system_properties.message_id for m in messages}


def wait_for(predicate: Callable[[], object], timeout_s: float, interval_s: float = 0.1):
    """The predicate's first truthy value within timeout_s, else None."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval_s)
    return None


def followers(cluster: DevCluster) -> list[str]:
    master = cluster.wait_master()
    return [i for i in cluster.ids if i != master]


def short(text: str, limit: int = 400) -> str:
    return text if len(text) <= limit else text[:limit] + "..."
