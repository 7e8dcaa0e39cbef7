"""The one place where rocketraft touches protocol definitions.

Client traffic is apache.rocketmq.v2 (the generated modules shipped with the official SDK,
`rocketmq-python-client`, are the single source of those wire definitions); broker <-> NameServer
traffic is our own rocketraft/proto/internal.proto, and rocketraft's batched read (FastConsume.PullBatch, for its own
client) rocketraft/proto/consume.proto. Everything else imports from here.
"""

from __future__ import annotations

import argparse
import socket

from rocketmq.grpc_protocol import definition_pb2 as pb  # noqa: F401 - re-exported
from rocketmq.grpc_protocol import service_pb2 as svc  # noqa: F401 - re-exported
from rocketmq.grpc_protocol import service_pb2_grpc as svc_grpc  # noqa: F401 - re-exported

from rocketraft.proto import consume_pb2 as cpb  # noqa: F401 - re-exported
from rocketraft.proto import consume_pb2_grpc as cpb_grpc  # noqa: F401 - re-exported
from rocketraft.proto import internal_pb2 as ipb  # noqa: F401 - re-exported
from rocketraft.proto import internal_pb2_grpc as ipb_grpc  # noqa: F401 - re-exported

from .limits import GRPC_MESSAGE_BYTES_MAX

Code = pb.Code
MessageType = pb.MessageType
Permission = pb.Permission

ALL_MESSAGE_TYPES = (MessageType.NORMAL, MessageType.FIFO, MessageType.DELAY, MessageType.TRANSACTION)

# Options for every gRPC server and channel we make: message size limits are explicit.
GRPC_OPTIONS = (
    ("grpc.max_receive_message_length", GRPC_MESSAGE_BYTES_MAX),
    ("grpc.max_send_message_length", GRPC_MESSAGE_BYTES_MAX),
    ("grpc.so_reuseport", 0),
)


def status(code: int = Code.OK, message: str = "OK") -> pb.Status:
    return pb.Status(code=code, message=message)


def ok() -> pb.Status:
    return pb.Status(code=Code.OK, message="OK")


def split_address(address: str) -> tuple[str, int]:
    host, sep, port = address.rpartition(":")
    if not sep or not host or not (port.isascii() and port.isdigit()):
        raise ValueError(f"address {address!r} is not host:port")
    return host, int(port)


def tcp_listener(host: str, port: int, backlog: int = 1024) -> socket.socket:
    """A bound, listening TCP socket for an asyncio server whose accepted connections get TCP_NODELAY. asyncio sets
    it only on sockets whose `proto` is IPPROTO_TCP, and an accepted socket inherits the listener's: one made by
    socket.create_server has proto 0, so every small reply on it waited for the peer's delayed ACK (Nagle), ~40 ms
    (issue 30: ReceiveMessage took 43-46 ms through the permissive TLS port)."""
    host = host.strip("[]")
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(backlog)
    except BaseException:
        sock.close()
        raise
    return sock


def address_argument(value: str) -> str:
    """An argparse `type` for a host:port option: the value, or argparse's error naming what is wrong."""
    try:
        split_address(value)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return value


def _scheme_of(host: str) -> int:
    return pb.AddressScheme.IPv4 if host.replace(".", "").isdigit() else pb.AddressScheme.DOMAIN_NAME


SCHEME_IN_HOST_PREFIX = "ipv4:"


def endpoints(*addresses: str, scheme_in_host: bool = False) -> pb.Endpoints:
    """Advertised addresses as one Endpoints, in the order given (the first is where a write should go).

    Several addresses are listed only when they are all IPv4 literals: the official SDKs build a gRPC target
    such as "ipv4:a:1,b:2" from the list, and the Python SDK refuses several DOMAIN_NAME addresses; with a
    domain name anywhere only the first address is kept. scheme_in_host writes the first host of a list as
    "ipv4:a", for SDKs that join the list without a scheme (routing.SCHEMELESS_TARGET_LANGUAGES): their
    target then reads "ipv4:a:1,b:2" too.
    """
    if not addresses:
        raise ValueError("endpoints need at least one address")
    split = [split_address(a) for a in addresses]
    if any(_scheme_of(host) != pb.AddressScheme.IPv4 for host, _ in split):
        split = split[:1]
    listed = [pb.Address(host=h, port=p) for h, p in split]
    if scheme_in_host and len(listed) > 1:
        listed[0].host = SCHEME_IN_HOST_PREFIX + listed[0].host
    return pb.Endpoints(scheme=_scheme_of(split[0][0]), addresses=listed)


def _host_port(a: pb.Address) -> str:
    return f"{a.host.removeprefix(SCHEME_IN_HOST_PREFIX)}:{a.port}"


def address_of(eps: pb.Endpoints) -> str:
    """The first address of endpoints: in a route's master entry, the master itself."""
    if not eps.addresses:
        raise ValueError("endpoints without an address")
    return _host_port(eps.addresses[0])


def addresses_of(eps: pb.Endpoints) -> list[str]:
    """Every address of endpoints, in order."""
    return [_host_port(a) for a in eps.addresses]


SHARDING_KEY_PROPERTY = "__SHARDINGKEY"  # RocketMQ's MessageConst names
TRANSACTION_ID_PROPERTY = "__transactionId__"
TRANSACTION_CHECK_TIMES_PROPERTY = "TRANSACTION_CHECK_TIMES"  # on a check-back: the how-many-th time it is asked
# what a delivery adds to the stored properties (as_delivered; broker/reads.py the check count)
DELIVERY_PROPERTIES = frozenset((SHARDING_KEY_PROPERTY, TRANSACTION_ID_PROPERTY, TRANSACTION_CHECK_TIMES_PROPERTY))


def as_delivered(message: pb.Message, topic: str, queue_id: int, offset: int, store_ms: int) -> pb.Message:
    """A stored message (as its producer's request carried it, with the broker's system properties of the send) as a
    consumer of `topic`'s queue receives it: its queue, offset and queue time, delivery attempt 1 if none, and when
    it was read from another topic's queue (a dead letter in %DLQ%<group>) that topic, naming where it came from.
    The one rule for the broker's reads and for rocketraft's client reading the stored form (PullBatch)."""
    props = message.system_properties
    if message.topic.name != topic:
        props.dead_letter_queue.topic = message.topic.name
        props.dead_letter_queue.message_id = props.message_id
        message.topic.name = topic
    props.queue_id = queue_id
    props.queue_offset = offset
    props.store_timestamp.seconds = store_ms // 1000
    props.store_timestamp.nanos = store_ms % 1000 * 1_000_000
    if props.delivery_attempt == 0:
        props.delivery_attempt = 1
    # RocketMQ keeps a message's group and transaction id as the properties __SHARDINGKEY and __transactionId__ and
    # its proxy hands them to consumers among the user properties; the official SDKs show them (their own tests
    # check them)
    if props.HasField("message_group"):
        message.user_properties.setdefault(SHARDING_KEY_PROPERTY, props.message_group)
    if props.message_type == pb.MessageType.TRANSACTION:
        message.user_properties.setdefault(TRANSACTION_ID_PROPERTY, props.message_id)
    return message
