"""Helpers for the broker tests: waiting, and the official SDK's clients as context managers."""

from __future__ import annotations

import contextlib

from rocketmq import ClientConfiguration, Credentials, Message

from devkit.waiting import wait_until  # noqa: F401 - re-exported for the broker and client tests


def sdk_config(cluster, request_timeout_s: int = 3) -> ClientConfiguration:
    return ClientConfiguration(cluster.namesrv_address, Credentials(), request_timeout=request_timeout_s)


def message(topic: str, body: bytes, tag: str | None = None, keys: tuple[str, ...] = (), group: str | None = None,
            deliver_at_s: int | None = None, properties: dict | None = None) -> Message:
    msg = Message()
    msg.topic = topic
    msg.body = body
    if tag:
        msg.tag = tag
    for key in keys:
        msg.keys = key
    if group:
        msg.message_group = group
    if deliver_at_s is not None:  # the SDK sends this number as epoch seconds
        msg.delivery_timestamp = deliver_at_s
    for key, value in (properties or {}).items():
        msg.add_property(key, value)
    return msg


@contextlib.contextmanager
def started(client):
    client.startup()
    try:
        yield client
    finally:
        with contextlib.suppress(Exception):
            client.shutdown()


def raw_message(topic: str, body: bytes, message_id: str | None = None, **props):
    """An apache.rocketmq.v2.Message as a client would send it (for calls made without the SDK)."""
    import uuid

    from rocketraft.protocol.wire import pb

    message_id = uuid.uuid4().hex if message_id is None else message_id
    system = pb.SystemProperties(message_id=message_id, body_encoding=pb.Encoding.IDENTITY,
                                 **props)
    system.born_timestamp.GetCurrentTime()
    return pb.Message(topic=pb.Resource(name=topic), body=body, system_properties=system)


def messaging_stub(cluster, address: str):
    from rocketraft.protocol.wire import svc_grpc

    return svc_grpc.MessagingServiceStub(cluster.channel(address))


def route(cluster, topic: str):
    from rocketraft.protocol.wire import pb, svc

    response = messaging_stub(cluster, cluster.namesrv_address).QueryRoute(
        svc.QueryRouteRequest(topic=pb.Resource(name=topic)), timeout=3)
    return response


def admin_stub(cluster, address: str):
    """BrokerAdmin of one replica."""
    from rocketraft.protocol.wire import ipb_grpc

    return ipb_grpc.BrokerAdminStub(cluster.channel(address))


def namesrv_stub(cluster, address: str | None = None):
    """The internal NameServer service (admin fan-outs, cluster info) of one NameServer."""
    from rocketraft.protocol.wire import ipb_grpc

    return ipb_grpc.NameServerStub(cluster.channel(address or cluster.namesrv_address))


def client_metadata(client_id: str) -> tuple:
    return (("x-mq-client-id", client_id),)


def replica_metric(cluster, replica_id: str, name: str, **labels: str) -> float:
    """One replica's metric (summed over the samples with those labels; 0 when it has none)."""
    from devkit.devcluster import metric_value, scrape_metrics

    return metric_value(scrape_metrics(cluster.metrics_address_of[replica_id]), name, **labels) or 0


class TelemetryStream:
    """A client's Telemetry stream, open on one replica until close(): while it is open the replica counts the
    client as live (broker/clients.py)."""

    def __init__(self, stub, client_id: str):
        import queue

        from rocketraft.protocol.wire import pb, svc

        self._commands: queue.Queue = queue.Queue()
        self._commands.put(svc.TelemetryCommand(settings=pb.Settings(client_type=pb.ClientType.PUSH_CONSUMER)))
        self._replies = stub.Telemetry(iter(self._commands.get, None), metadata=client_metadata(client_id))
        next(self._replies)  # answered: the stream is open on the replica

    def close(self) -> None:
        self._commands.put(None)
        self._replies.cancel()
